"""Runtime, the launch seam's enqueue: every kernel clops runs is enqueued here, once per launch
(``launch``: dependency tracking on buffers, then the record of each capture and profiler that
an open launch scope holds, ``scope.py``) or as a prepared plan (``prepare_launches``,
``enqueue_prepared``: arguments set once, no tracking).
Also the queue work goes to when none is named (``current_queue``: the innermost
``clops.stream`` block's). ``CLDevice.launch`` and its kin are these functions."""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyopencl as cl

from .. import _config
from . import cmdbuf, nativekernel, profiler, rawenqueue
from .capture import record as record_step
from .events import Event
from .nativekernel import NativeKernel
from .plan import Launch
from .pool import Buffer
from .scope import capturing, profiling

if TYPE_CHECKING:
    from .protocols import Device, Queue

LaunchItem = tuple[cl.Kernel, Sequence[int], Sequence[int] | None, str]

# -- the queue work goes to -----------------------------------------------------------------------
# id(device) -> queue chosen for it; a new dict per ``stream`` block (never mutated in place).
_CURRENT: contextvars.ContextVar[dict[int, Queue] | None] = contextvars.ContextVar(
    "clops_current_queue", default=None)


def current_queue(device: Device) -> Queue:
    """The queue work on ``device`` goes to now: the innermost ``stream`` block's queue for that
    device, else the device's default in-order queue.

    >>> dev = clops.device()
    >>> clops.current_queue(dev) is dev.queue
    True
    """
    chosen = _CURRENT.get()
    if chosen:
        q = chosen.get(id(device))
        if q is not None:
            return q
    return device.queue


@contextlib.contextmanager
def routed(device: Device, queue: Queue) -> Iterator[None]:
    """Work on ``device`` goes to ``queue`` inside the block (``clops.stream``'s choice)."""
    chosen = dict(_CURRENT.get() or {})
    chosen[id(device)] = queue
    token = _CURRENT.set(chosen)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def wait_list(wait_for: Sequence[Any]) -> list[cl.Event]:
    """The native events of ``wait_for`` (clops ``Event``s or pyopencl's; empty ones left out)."""
    out: list[cl.Event] = []
    for e in wait_for:
        ev = e.cl_event if isinstance(e, Event) else e
        if ev is not None:
            out.append(ev)
    return out


# -- one tracked launch ---------------------------------------------------------------------------
def launch(dev: Device, lock: threading.Lock, kernel: cl.Kernel, global_size: Sequence[int],
           local_size: Sequence[int] | None, args: Sequence[Any],
           reads: Sequence[Buffer] = (), writes: Sequence[Buffer] = (),
           queue: Queue | None = None, wait_for: Sequence[Any] = (),
           name: str | None = None) -> Event:
    """Enqueue ``kernel`` after the last writes of ``reads`` and the last writes and reads of
    ``writes`` (plus ``wait_for``); record the new event on those buffers. ``lock`` is the
    device's launch lock (arguments set and enqueue, one thread at a time)."""
    if capturing():
        record_step(dev, Launch(kernel, tuple(global_size), None if local_size is None
                           else tuple(local_size), list(args), tuple(reads), tuple(writes),
                           name or "", queue))
    q = queue or current_queue(dev)  # the stream block's queue, if any
    cl_args = [a.mem if type(a) is Buffer else a for a in args]
    gsize = tuple(global_size)
    lsize = tuple(local_size) if local_size is not None else None
    in_order = q.in_order
    # NOTE: the dependencies are read and the new event recorded under the lock too: two
    # threads launching kernels that write one buffer (the compiler's work-group counter
    # of split reductions, a tensor both update) on different queues would otherwise each
    # read the buffer's last write before the other recorded its own, and run at once.
    with lock:
        deps = wait_list(wait_for) if wait_for else []
        # (Buffer.read_deps and write_deps, written out: this runs at every launch)
        for b in reads:
            lw = b.last_write
            if lw is not None and not (lw[1] is q and in_order):
                deps.append(lw[0])
        for b in writes:
            lw = b.last_write
            if lw is not None and not (lw[1] is q and in_order):
                deps.append(lw[0])
            for ev, rq in b.reads:
                if not (in_order and rq is q):
                    deps.append(ev)
        kernel.set_args(*cl_args)
        if isinstance(kernel, NativeKernel):
            ev = kernel.enqueue(q.cl_queue, deps)
        else:
            # PERF: positional (global offset None): keywords cost ~0.3 us a call in
            # pyopencl.
            ev = cl.enqueue_nd_range_kernel(q.cl_queue, kernel, gsize, lsize, None,
                                            deps or None)
        for b in reads:
            b.mark_read(ev, q)
        for b in writes:
            b.mark_write(ev, q)
    if profiling():
        profiler.record(name or kernel.function_name, "kernel", dev.name, ev,
                        queue=q.index, global_size=list(gsize))
    return Event(ev, q)


# -- prepared launches ----------------------------------------------------------------------------
def launch_items(launches: Sequence[LaunchItem]
                 ) -> list[tuple[cl.Kernel, tuple[int, ...], tuple[int, ...] | None, str]]:
    """Launches with their sizes as tuples (what pyopencl's enqueue takes fastest)."""
    return [(k, tuple(g), tuple(loc) if loc is not None else None, name)
            for k, g, loc, name in launches]


@dataclass
class PreparedLaunches:
    """Launches ready for ``CLDevice.enqueue_prepared``: (kernel, global, local, name), where
    the event-free path is used their ctypes form, and where the device records command
    buffers, the recording (on the device's default queue)."""

    items: list[tuple[cl.Kernel, tuple[int, ...], tuple[int, ...] | None, str]]
    raw: rawenqueue.RawLaunches | None
    recorded: cmdbuf.CommandBuffer | None = None
    # where there are native kernels: how the items replay (nativekernel.chain_items)
    chained: list[Any] | None = None

    def resize(self, index: int, global_size: Sequence[int]) -> None:
        """Launch ``index`` with another global size from now on (not in a recording: a
        plan that resizes has none)."""
        kernel, _, local, name = self.items[index]
        self.items[index] = (kernel, tuple(global_size), local, name)
        if self.raw is not None:
            self.raw.resize(index, global_size)


def prepare_launches(dev: Device, launches: Sequence[LaunchItem],
                     record: bool = True) -> PreparedLaunches:
    """Launches (kernel with its arguments set, global size, local size, name) made ready for
    ``enqueue_prepared``: on GPUs they are also converted for the event-free enqueue
    (``rawenqueue``), which halves the host cost of an enqueue on NVIDIA's driver; where the
    device has ``cl_khr_command_buffer`` and ``record`` holds, they are recorded once, so that
    a replay is one enqueue (``cmdbuf``). A recording the driver refuses leaves the other
    paths."""
    items = launch_items(launches)
    # (native kernels, where there are any, are enqueued one by one: neither form takes them)
    native = any(isinstance(k, NativeKernel) for k, _, _, _ in items)
    raw = None
    if (dev.kind != "cpu" and not native and _config.raw_enqueue()
            and rawenqueue.available()):
        raw = rawenqueue.prepare(items)
    recorded = None
    if record and items and not native and cmdbuf.support(dev.queue.cl_queue)[0]:
        try:
            recorded = cmdbuf.CommandBuffer(dev.queue.cl_queue,
                                            [(k, g, loc) for k, g, loc, _ in items])
        except RuntimeError as e:
            if _config.debug_level():
                print(f"clops: launches not recorded ({e})", file=sys.stderr)
    # PERF (Intel's CPU runtime, 2-core EPYC): a 1B decode step's 81 native kernels in a
    # row (products and attention) go to the queue as one
    chained = nativekernel.chain_items(items) if native else None
    return PreparedLaunches(items, raw, recorded, chained)


def enqueue_prepared(dev: Device, lock: threading.Lock,
                     launches: PreparedLaunches | Sequence[LaunchItem],
                     queue: Queue | None = None) -> None:
    """Enqueue kernels whose arguments are already set, in order, with no dependency
    tracking: for launch plans that own their buffers on one in-order queue (a decode step is
    then only its enqueues). No events are kept; while profiling, each launch is enqueued with
    its event and recorded."""
    q = queue or dev.queue
    if not q.in_order:
        raise ValueError("prepared launches need an in-order queue")
    if not isinstance(launches, PreparedLaunches):
        launches = PreparedLaunches(launch_items(launches), None)
    cq = q.cl_queue
    # The plan's kernel objects are its own, but hold the launch lock anyway so that no other
    # thread's launch interleaves with a half-enqueued step.
    with lock:
        if profiling():
            for kernel, g, l, name in launches.items:
                # Sizes are passed as the plan holds them (tuples, for speed); the stubs want
                # tuple types where any sequence works.
                ev = (kernel.enqueue(cq) if isinstance(kernel, NativeKernel) else
                      cl.enqueue_nd_range_kernel(cq, kernel, g, l))  # type: ignore[arg-type]
                profiler.record(name or kernel.function_name, "kernel", dev.name, ev,
                                queue=q.index, global_size=list(g))
            return
        if launches.recorded is not None and launches.recorded.queue is cq:
            try:
                launches.recorded.enqueue()
                return
            except RuntimeError as e:
                # nothing was enqueued: these launches go kernel by kernel from now on
                launches.recorded = None
                warnings.warn(f"clops: a recorded launch plan failed to enqueue ({e}); "
                              "it replays kernel by kernel from now on "
                              "(CLOPS_COMMAND_BUFFERS=0 skips recording)", RuntimeWarning,
                              stacklevel=3)
        if launches.raw is not None:
            rawenqueue.enqueue(cq, launches.raw)
            return
        enqueue = cl.enqueue_nd_range_kernel
        items = launches.items
        # (item indices, and native kernels in a row as one nativekernel.Chain)
        order = launches.chained if launches.chained is not None else range(len(items))
        for entry in order:
            if not isinstance(entry, int):
                entry.enqueue_bare(cq)
                continue
            kernel, g, l, _ = items[entry]
            if isinstance(kernel, NativeKernel):
                kernel.enqueue_bare(cq)
            else:
                enqueue(cq, kernel, g, l)  # type: ignore[arg-type]
