"""Array layer, jit: capture every enqueue a function of tensors makes once per signature (the
runtime's seam records them, ``runtime/plan.py``), then replay them on new tensors of the same
signature with no graph building, scheduling, lookups or Python in between."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import _config
from ..graph import ir
from ..graph.ir import View
from ..runtime import plan as _plan
from ..runtime.plan import Command, JitError, Slot
from .tensor import Tensor, pending_tensors, realize

__all__ = ["JitError", "jit"]


@dataclass
class Trace:
    """A captured call: its commands (buffers of the arguments and of fresh outputs as ``Slot``s),
    the outputs to build, and how they nest."""

    commands: list[tuple[Any, Command]]
    outputs: list[tuple[Any, View, Any, Any]]  # (Slot or kept buffer, view, dtype, device)
    out_allocs: list[tuple[Any, int, str]]  # per "out" slot: (device, bytes, memory kind)
    structure: Any
    # NOTE: buffers a call made besides its outputs (a product's result that a later kernel
    # reads, a split reduction's partials) are the same memory in every replay: replays on
    # two threads enqueued command by command in turn read each other's. One replay's commands
    # are enqueued at a time (dependency tracking then orders their kernels on the device).
    replaying: threading.Lock = field(default_factory=threading.Lock, repr=False)


# NOTE: the lazy work from before a call is every thread's (one set of pending tensors): a
# thread that computed it while another captured would compute that capture's own work outside
# it (its trace then lacks those kernels, and its replays give back stale results). Captures and
# that computing take turns; replays do not wait (re-entrant: a jitted function may call one).
_CAPTURING = threading.RLock()


def jit(fn: Callable[..., Any] | None = None, *, strict: bool = True) -> Any:
    """Capture ``fn``'s enqueues on the first call of each signature and replay them on later
    calls: kernels (generated, hand-written, custom), device copies, constants written from
    the host, and vendor-library calls, each with the new arguments' buffers and fresh output
    buffers.

    The signature is the shapes, dtypes, strides, offsets, devices and aliasing of the tensor
    arguments (also inside tuples, lists and dicts) and the values of the other arguments. A
    call that cannot be replayed is refused with ``JitError`` naming what: a read to the host
    (``float(x)``, ``bool(x)``, printing), a shape that depends on the data (``nonzero``,
    ``unique_*``, ``repeat`` with a tensor of counts). With ``strict=False`` such a signature
    runs eagerly instead (``CLOPS_DEBUG=1`` says so once). Python side effects run only when a
    signature is captured, and tensors the function reads from outside its arguments are read
    from the memory they had then (in-place updates of it are seen; a name rebound to another
    tensor is not): pass what changes as arguments.

    >>> @clops.jit
    ... def step(x, w):
    ...     return clops.tanh(x @ w).sum(axis=-1)
    """
    if fn is None:
        return functools.partial(jit, strict=strict)
    traces: dict[Any, Trace | str] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tensors: list[Tensor] = []
        sig = _signature((args, kwargs), tensors, {})
        # Lazy work from before the call is computed outside the capture (a replay must not
        # compute it again, and in-place writes below must not change what it reads).
        waiting = pending_tensors()
        if waiting:
            with _CAPTURING:
                realize(*waiting)
        got = traces.get(sig)
        if got is None:
            with _CAPTURING:
                return _capture(fn, args, kwargs, tensors, sig, traces, strict)
        if isinstance(got, str):
            return fn(*args, **kwargs)
        return _replay(got, tensors)

    wrapper.traces = traces  # type: ignore[attr-defined]
    return wrapper


def _signature(a: Any, tensors: list[Tensor], seen: dict[int, int]) -> Any:
    """A hashable key of an argument tree; appends its tensors (realized) in order."""
    if isinstance(a, Tensor):
        a.realize()
        buf = a.buffer
        alias = seen.setdefault(id(buf), len(tensors))
        tensors.append(a)
        return ("t", a.shape, a.dtype.name, a.strides, a.offset, id(a.device), alias)
    if isinstance(a, tuple | list):
        return (type(a).__name__, tuple(_signature(x, tensors, seen) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple((k, _signature(a[k], tensors, seen)) for k in sorted(a, key=repr)))
    try:
        hash(a)
    except TypeError:
        raise JitError(f"clops.jit cannot key a call on an argument of type {type(a).__name__} "
                       "(not hashable): pass arrays as clops tensors, and other values as "
                       "hashable ones") from None
    return ("py", type(a), a)


def _flatten(out: Any, outs: list[Tensor]) -> Any:
    if isinstance(out, Tensor):
        outs.append(out)
        return None
    if isinstance(out, tuple | list):
        return (type(out), [_flatten(o, outs) for o in out])
    raise JitError("a clops.jit function must return a Tensor or (nested) tuples or lists of "
                   f"Tensors, not {type(out).__name__}")


def _unflatten(structure: Any, results: list[Tensor], pos: list[int]) -> Any:
    if structure is None:
        pos[0] += 1
        return results[pos[0] - 1]
    kind, items = structure
    return kind(_unflatten(s, results, pos) for s in items)


def _capture(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             tensors: list[Tensor], sig: Any, traces: dict[Any, Trace | str], strict: bool) -> Any:
    with _plan.capture(strict=strict) as cap:
        result = fn(*args, **kwargs)
        outs: list[Tensor] = []
        structure = _flatten(result, outs)
        realize(*outs)
    if cap.refused is not None:
        traces[sig] = cap.refused
        if _config.debug_level():
            print(f"clops.jit: {getattr(fn, '__name__', fn)} runs eagerly for this signature "
                  f"(it {cap.refused})", file=sys.stderr)
        return result
    ins: dict[int, int] = {}
    for i, t in enumerate(tensors):
        ins.setdefault(id(t.buffer), i)
    fresh: dict[int, int] = {}
    out_allocs: list[tuple[Any, int, str]] = []
    outputs: list[tuple[Any, View, Any, Any]] = []
    for t in outs:
        buf = t.buffer
        src: Any = buf
        if id(buf) in ins:
            src = Slot("in", ins[id(buf)])
        elif buf in cap.allocated:
            # made by the call: each replay makes a new one (earlier results stay valid)
            if id(buf) not in fresh:
                fresh[id(buf)] = len(out_allocs)
                out_allocs.append((t.device, buf.nbytes, buf.kind))
            src = Slot("out", fresh[id(buf)])
        outputs.append((src, t._load.arg[1], t.dtype, t.device))

    def slot(b: Any) -> Any:
        if id(b) in ins:
            return Slot("in", ins[id(b)])
        if id(b) in fresh:
            return Slot("out", fresh[id(b)])
        return b  # the same memory on every replay: constants, scratch, outside tensors

    commands = [(dev, _plan.map_buffers(c, slot)) for dev, c in cap.commands]
    traces[sig] = Trace(commands, outputs, out_allocs, structure)
    return result


def _replay(p: Trace, tensors: list[Tensor]) -> Any:
    ins = [t.buffer for t in tensors]
    outs = [dev.alloc(n, kind) for dev, n, kind in p.out_allocs]

    def sub(x: Any) -> Any:
        if type(x) is Slot:
            return ins[x.index] if x.kind == "in" else outs[x.index]
        return x

    with p.replaying:
        for dev, command in p.commands:
            command.replay(dev, sub)
    results = [Tensor(ir.load(sub(src), view, dtype), dev) for src, view, dtype, dev in
               p.outputs]
    return _unflatten(p.structure, results, [0])
