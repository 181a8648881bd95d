"""Compiler, realize: schedule pending nodes and run the schedule: allocate its temporaries,
look each kernel up by its ``KernelKey`` (render and build only on a miss), and launch it through
the device with sizes, strides and offsets as arguments."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _config
from ..graph import ir
from ..graph.ir import Node, View, contiguous_strides
from ..runtime import plan as launch_plan
from ..runtime.keylocks import KeyedLocks
from . import form
from . import schedule as scheduler
from .device import Device
from .geometry import local_size
from .kernel import BUFFER_ROLES, KernelKey, Lowered, Param, Temp
from .lower import scalar_arg
from .render import CLRenderer
from .schedule import Alloc, KernelRun, Schedule

# (device id, renderer class, structural key, local size) -> (built kernel, name, parameters)
_KERNELS: dict[tuple[int, type, KernelKey, int], tuple[Any, str, tuple[Param, ...]]] = {}
_FILLING = KeyedLocks()  # a key of _KERNELS being rendered and built
STATS = {"launches": 0}
_STATS_LOCK = threading.Lock()


# NOTE: a schedule is made from the graph as it is (a node another thread computed meanwhile is
# a load), and a schedule that ran marks its nodes computed; both under this lock, so that no
# node of a graph being scheduled turns computed halfway through (threads share nodes: a tensor
# they all compute from). Rendering, builds and launches run outside it.
_GRAPH_LOCK = threading.RLock()


# schedules that ran, by their graph's form (``form``): a graph of a known form runs again
# without scheduling
FORMS = form.FormCache()


def realize(targets: list[tuple[Node, Any, View | None]], device: Device,
            bind: bool = True) -> None:
    """Compute ``targets`` (node, destination buffer or None, destination view or None): by the
    schedule a graph of their form ran last, where there is one, else by a new schedule (kept
    for the next graph of the form). ``bind`` False: a target written into a destination
    buffer stays pending (its node is not marked computed there): the buffer is the caller's
    alone."""
    keep_out = () if bind else tuple(buf for _, buf, _ in targets if buf is not None)
    if _config.CONFIG.debug >= 1:  # every schedule made and printed anew
        run(schedule_of(targets, device), device, keep_out=keep_out)
        return
    with _GRAPH_LOCK:
        shape = form.form_of(targets)
        rec = FORMS.get(device, shape) if shape is not None else None
        if rec is None:
            sched = scheduler.schedule(targets, device)
    if rec is not None:
        assert shape is not None
        _rerun(rec, shape, device, keep_out)
        return
    kernels = run(sched, device, keep_out=keep_out)
    if shape is not None:
        kept = form.record(sched, shape, device, kernels, _ARG_VALUES)
        if kept is not None:
            FORMS.put(device, shape, kept)


def _rerun(rec: form.Recorded, shape: form.Form, device: Device,
           keep_out: tuple[Any, ...] = ()) -> None:
    """Run the recorded schedule ``rec`` over the values of ``shape`` (nothing is marked
    computed in a buffer of ``keep_out``)."""
    temps = [counter(device) if is_counter else device.alloc(nbytes)
             for nbytes, is_counter in rec.temps]
    launches = form.launch_values(rec, shape, temps)
    with _STATS_LOCK:
        STATS["launches"] += len(launches)
    for ln, args, reads, writes in launches:
        device.launch(ln.kernel, ln.global_size, ln.local_size, args, reads=reads,
                      writes=writes, name=ln.name)
    with _GRAPH_LOCK:
        for node, buf, b in form.bound(rec, shape, temps):
            if any(buf is k for k in keep_out):
                continue
            loaded = ir.load(buf, b.view, b.dtype)
            node.realized = loaded if b.reduce is None else ir.reduce(b.reduce[0], loaded,
                                                                      b.reduce[1], b.reduce[2])


def schedule_of(targets: list[tuple[Node, Any, View | None]], device: Device) -> Schedule:
    """The schedule ``realize`` would run, for inspection: nothing is allocated or launched and
    the graph is left as it was."""
    with _GRAPH_LOCK:
        return scheduler.schedule(targets, device)


def run(p: Schedule, device: Device, renderer: CLRenderer | None = None,
        keep_out: tuple[Any, ...] = ()) -> list[tuple[Any, tuple[Param, ...]]]:
    """Run schedule ``p``: allocate each temporary when its entry comes, launch each kernel (its
    source from ``renderer``, the OpenCL C one by default), then mark the computed nodes
    realized as loads of their buffers (not those in a buffer of ``keep_out``). Returns the
    launched kernels with their parameters."""
    spell = renderer if renderer is not None else CLRenderer()
    buffers: dict[int, Any] = {}
    launched: list[tuple[Any, tuple[Param, ...]]] = []

    def buffer(b: Any) -> Any:
        return buffers[id(b)] if isinstance(b, Temp) else b

    for entry in p.entries:
        if isinstance(entry, Alloc):
            t = entry.temp
            buffers[id(t)] = counter(device) if t.counter else device.alloc(t.nbytes)
        else:
            hit = run_kernel(entry, device, buffer, spell)
            if hit is not None:
                launched.append(hit)
    with _GRAPH_LOCK:
        for b in p.bindings:
            if any(b.buffer is k for k in keep_out):
                continue
            loaded = ir.load(buffer(b.buffer), b.view, b.dtype)
            if b.reduce is not None:
                op, axes, dtype = b.reduce
                b.node.realized = ir.reduce(op, loaded, axes, dtype)
            else:
                b.node.realized = loaded
    return launched


def run_kernel(kr: KernelRun, device: Device, buffer: Callable[[Any], Any],
               renderer: CLRenderer) -> tuple[Any, tuple[Param, ...]] | None:
    """Build (once per device, key and local size) and launch ``kr``; ``buffer`` maps the
    schedule's temporaries to their buffers. Returns the kernel launched with its parameters
    (None: nothing to launch)."""
    item, lw = kr.item, kr.lowered
    if _config.CONFIG.debug >= 2:
        outs = ", ".join(f"{o.node.dtype.name}{list(o.view.shape)}" for o in item.outputs)
        print(f"[clops] schedule: kernel over {list(item.full)} reduce axes {list(item.raxes)}"
              f"{' chunks ' + str(item.chunks) if item.chunks > 1 else ''} -> {outs}",
              file=sys.stderr)
    geo = kr.geometry
    local = geo.local if geo is not None else local_size(device, lw)
    ck = (id(device), type(renderer), lw.key, local)
    hit = _KERNELS.get(ck)
    if hit is None:
        hit = _build(ck, kr, device, renderer, local)
    kernel, name, params = hit
    if geo is None:
        return None  # nothing to write (sizes of other axes may not even fit the index type)
    if _config.CONFIG.debug >= 1:
        print(f"[clops] launch {name} global={geo.global_size} local={geo.local_size}",
              file=sys.stderr)
    with _STATS_LOCK:
        STATS["launches"] += 1
    device.launch(kernel, geo.global_size, geo.local_size, launch_args(lw, buffer, params),
                  reads=[buffer(b) for b in lw.reads], writes=[buffer(b) for b in lw.writes],
                  name=name)
    return kernel, params


def _build(ck: tuple[int, type, KernelKey, int], kr: KernelRun, device: Device,
           renderer: CLRenderer, local: int) -> tuple[Any, str, tuple[Param, ...]]:
    """Render and build ``kr``'s kernel for cache key ``ck`` once: a thread that misses a
    key another thread is building waits for that build; kernels of other keys are built
    meanwhile."""
    with _FILLING.hold(ck):
        hit = _KERNELS.get(ck)
        if hit is None:
            src, arg_types, params = renderer.render_kernel(kr.lowered.key, local, kr.name)
            if _config.CONFIG.debug >= 1:
                print(f"[clops] kernel {kr.name}:\n{src}", file=sys.stderr)
            hit = _KERNELS[ck] = (device.kernel(src, kr.name, arg_types=arg_types),
                                  kr.name, params)
    return hit


def launch_args(lw: Lowered, buffer: Callable[[Any], Any],
                params: tuple[Param, ...] | None = None) -> list[Any]:
    """The kernel arguments of ``lw``: a value for each parameter of its kernel, in order
    (``KernelKey.params``, or ``params``, the rendered kernel's, where the caller has them).
    ``buffer`` maps the schedule's temporaries to their buffers."""
    index = np.int64 if lw.wide else np.int32
    args: list[Any] = []
    for p in params if params is not None else lw.key.params():
        value = _ARG_VALUES[p.role](lw, p, buffer)
        args.append(value if p.role in _AS_IS else index(value))
    return args


def _rows(lw: Lowered) -> int:
    return ir.prod([n for i, n in enumerate(lw.full) if i not in lw.raxes])


def _row_length(lw: Lowered) -> int:
    return ir.prod([lw.full[i] for i in lw.raxes])


def _chunk(lw: Lowered) -> int:
    chunk = -(-_row_length(lw) // lw.chunks)
    if lw.vrow:
        chunk = -(-chunk // lw.vrow) * lw.vrow  # chunks start aligned to the vectors
    return chunk


def _work_items(lw: Lowered) -> int:
    total = ir.prod(lw.full)
    return total // lw.flat if lw.flat > 1 else total  # a work-item per vector of `flat`


def _combine(lw: Lowered) -> tuple[Any, Any, View]:
    assert lw.combine is not None
    return lw.combine


_Value = Callable[[Lowered, Param, Callable[[Any], Any]], Any]
# a parameter's role -> its value at a launch of ``lw`` (``buf``: the schedule's temporaries to
# buffers); buffers and constants are passed as they are, the rest as the kernel's index type
_ARG_VALUES: dict[str, _Value] = {
    "out": lambda lw, p, buf: buf(lw.out_buffers[p.slot]),
    "out_offset": lambda lw, p, buf: lw.out_views[p.slot].offset,
    "out_stride": lambda lw, p, buf: lw.out_views[p.slot].strides[p.axis],
    "leaf": lambda lw, p, buf: buf(lw.leaf_buffers[p.slot]),
    "leaf_offset": lambda lw, p, buf: lw.leaf_views[p.slot].offset,
    "leaf_stride": lambda lw, p, buf: lw.leaf_views[p.slot].strides[p.axis],
    "view_offset": lambda lw, p, buf: lw.view_args[p.slot][0].offset,
    "view_stride": lambda lw, p, buf: lw.view_args[p.slot][0].strides[p.axis],
    "view_shape": lambda lw, p, buf: lw.view_args[p.slot][1][p.axis],
    "view_pitch": lambda lw, p, buf: contiguous_strides(lw.view_args[p.slot][1])[p.axis],
    "const": lambda lw, p, buf: scalar_arg(*lw.const_values[p.slot]),
    "size": lambda lw, p, buf: lw.full[p.axis],
    "total": lambda lw, p, buf: _rows(lw) if lw.raxes else _work_items(lw),
    "rn": lambda lw, p, buf: _row_length(lw),
    "nchunks": lambda lw, p, buf: lw.chunks,
    "chunk": lambda lw, p, buf: _chunk(lw),
    "count": lambda lw, p, buf: buf(_combine(lw)[0]),
    "fin": lambda lw, p, buf: buf(_combine(lw)[1]),
    "fin_offset": lambda lw, p, buf: _combine(lw)[2].offset,
}
_AS_IS = BUFFER_ROLES | {"const"}


_COUNTERS: dict[int, tuple[Any, Any]] = {}
_COUNTERS_LOCK = threading.Lock()


def counter(device: Device) -> Any:
    """The device's work-group counter of one-kernel split reductions: an int, zero between
    kernels (each kernel's last work-group sets it back). Kernels that use it write it, so the
    runtime orders them, also those of threads on different queues (``CLDevice.launch`` reads
    a launch's dependencies and records its event under one lock)."""
    got = _COUNTERS.get(id(device))
    if got is None or got[0] is not device:
        # one buffer per device, whichever thread asks first; (made outside any clops.jit
        # capture: it is the device's, not the captured function's)
        with _COUNTERS_LOCK, launch_plan.paused():
            got = _COUNTERS.get(id(device))
            if got is None or got[0] is not device:
                buf = device.alloc(4)
                device.write(buf, np.zeros(1, np.int32), blocking=True)
                got = _COUNTERS[id(device)] = (device, buf)
    return got[1]


def target(node: Node) -> tuple[Node, tuple[int, ...] | None]:
    """What to compute for a pending ``node``: a pure reshape of a computed node computes the
    node (its buffer is then reshaped: returned with the shape), anything else itself."""
    if node.op == "view" and node.arg.offset == 0 and node.arg.is_contiguous and \
            ir.prod(node.arg.shape) == ir.prod(node.srcs[0].shape) and \
            node.srcs[0].resolve().op != "load":
        return node.srcs[0].resolve(), node.shape
    return node, None
