"""Array, native interface: raw OpenCL handles of tensors (``cl_mem`` pointer and byte offset,
queue, context, device) for ctypes/pybind11 code, the C tensor view of ``clops/clops.h`` handed
to compiled extensions in a capsule, ordering and lifetime of native work on clops tensors, and
pyopencl arrays in and out without copies.

The protocol of ``native_call``: clops enqueues a barrier that waits for everything the
tensors depend on, calls ``fn`` with the handles, which enqueues its work on the given queue
(and may return its last ``cl_event``), then enqueues a barrier after it. The tensors record
that barrier as their last write (or read), and stay alive until it completes.

The protocol of ``tensor_view``: the capsule carries the event the extension's first command
waits for; the extension reports its last command with ``report_write`` (or ``report_read``),
which the tensor records as its last write (or a read) and which keeps it alive."""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import runtime
from .array.tensor import Tensor, _flush_readers
from .graph import dtypes as _dt
from .graph import ir
from .graph.ir import View
from .runtime import interop, streams
from .runtime.interop import keepalive

__all__ = ["TENSOR_VIEW_CAPSULE", "TENSOR_VIEW_VERSION", "TensorView", "from_pyopencl",
           "get_include", "handles", "keepalive", "native_call", "report_read", "report_write",
           "tensor_view", "to_pyopencl", "track_pyopencl"]


def handles(t: Tensor, queue: runtime.CLQueue | None = None) -> dict[str, Any]:
    """Integer handles of a (computed) tensor: ``cl_mem``, ``offset`` (bytes), ``nbytes`` (of
    the elements from offset on), ``shape``, ``strides`` (bytes), ``dtype`` (numpy), and the
    ``queue``, ``context``, ``device`` and ``platform`` it lives on.

    >>> h = clops.native.handles(clops.ones(4))
    >>> h["offset"], h["nbytes"]
    (0, 16)
    """
    buf = t.buffer
    dev = t.device
    q = queue or streams.current_queue(dev)
    isz = t.dtype.itemsize
    return {
        "cl_mem": int(buf.mem.int_ptr), "offset": t.offset * isz,
        "nbytes": t.size * isz, "shape": t.shape, "strides": tuple(s * isz for s in t.strides),
        "dtype": t.dtype.np, **interop.handles(dev, q),
    }


def native_call(fn: Callable[..., Any], reads: Sequence[Tensor] = (),
                writes: Sequence[Tensor] = (), *, queue: runtime.CLQueue | None = None,
                wait_for: Sequence[Any] = (), depends: Sequence[Any] = ()) -> runtime.Event:
    """Run native code on tensors in order with clops' own work: ``fn(*handles)`` gets one
    ``handles`` dict per tensor (``reads`` then ``writes``) and enqueues its work on
    ``handles["queue"]``; it may return the ``cl_event`` (int or pyopencl event) of its last
    command. Returns the event after which the native work is complete.

    >>> ev = clops.native_call(lambda x, y: mylib.scale(x["cl_mem"], y["cl_mem"], x["queue"]),
    ...                        reads=[x], writes=[y])
    """
    ts = [*reads, *writes]
    if not ts and queue is None:
        raise ValueError("native_call needs tensors or a queue")
    dev = ts[0].device if ts else queue.device  # type: ignore[union-attr]
    for t in ts:
        if t.device is not dev:
            raise ValueError(f"native_call: tensors are on {dev} and {t.device}")
    q = queue or streams.current_queue(dev)
    rbufs = [t.buffer for t in reads]
    wbufs = [t.buffer for t in writes]
    for b in wbufs:
        _flush_readers(b)
    deps = interop.wait_list([*wait_for, *depends])
    for b in rbufs:
        deps += b.read_deps(q)
    for b in wbufs:
        deps += b.write_deps(q)
    # The barrier orders the native commands after ``deps`` on in-order and out-of-order queues.
    q.barrier(wait_for=[runtime.Event(e, q) for e in deps])
    result = fn(*(handles(t, q) for t in ts))
    ev_in = interop.as_cl_event(result) if result is not None else None
    done = q.barrier(wait_for=[runtime.Event(ev_in, q)] if ev_in is not None else [])
    ev = done.cl_event
    assert ev is not None  # a barrier is always a real command
    for b in rbufs:
        b.mark_read(ev, q)
    for b in wbufs:
        b.mark_write(ev, q)
    keepalive(done, *ts)
    return done


def to_pyopencl(t: Tensor, queue: runtime.CLQueue | None = None) -> Any:
    """A ``pyopencl.array.Array`` on the tensor's memory (no copy) and queue. A barrier first
    orders that queue after the tensor's pending work. Work enqueued through the array is not
    tracked: call ``track_pyopencl(t, event)`` with its event, or ``queue.finish()``.

    >>> a = clops.native.to_pyopencl(clops.arange(4.0))
    >>> (a * 2).get()
    array([0., 2., 4., 6.], dtype=float32)
    """
    if t.dtype.name == "bfloat16":
        raise TypeError("pyopencl has no bfloat16; convert with astype first")
    dev = t.device
    q = queue or streams.current_queue(dev)
    buf = t.buffer
    q.barrier(wait_for=[runtime.Event(e, q) for e in buf.write_deps(q)])
    isz = t.dtype.itemsize
    np_dtype = t.dtype.np
    return interop.pyopencl_array(q.cl_queue, t.shape, np_dtype,
                                  tuple(s * isz for s in t.strides), buf.mem, t.offset * isz)


def track_pyopencl(t: Tensor, event: Any, *, write: bool = True) -> None:
    """Record pyopencl work on ``t``'s memory (its event) so that clops orders later work
    after it.

    >>> ev = cl.enqueue_fill_buffer(q, a.base_data, np.float32(1), 0, a.nbytes)
    >>> clops.native.track_pyopencl(t, ev)
    """
    ev = interop.as_cl_event(event)
    if ev is None:
        return
    fq = interop.ForeignQueue(ev.command_queue, t.device)
    buf = t.buffer
    if write:
        buf.mark_write(ev, fq)  # type: ignore[arg-type]
    else:
        buf.mark_read(ev, fq)  # type: ignore[arg-type]


def from_pyopencl(arr: Any, device: Any = None) -> Tensor:
    """A tensor on a ``pyopencl.array.Array``'s memory (no copy). The array must live in the
    context of a clops device (make it with ``clops.device().context``); pending pyopencl
    work on its queue is waited for by the tensor's consumers.

    >>> import pyopencl.array as cla
    >>> dev = clops.device()
    >>> a = cla.to_device(pyopencl.CommandQueue(dev.context), np.arange(4.0))
    >>> clops.native.from_pyopencl(a).sum()
    """
    dev = runtime.device(device) if device is not None else _device_of_context(arr.context)
    if arr.context.int_ptr != dev.context.int_ptr:
        raise ValueError("from_pyopencl: the array is not in the context of "
                         f"{dev}; create it on clops.device(...).context or copy it")
    d = _dt.to_dtype(arr.dtype)
    isz = d.itemsize
    if arr.offset % isz or any(s % isz for s in arr.strides):
        raise ValueError("from_pyopencl: offset and strides must be multiples of the item size")
    buf = interop.wrap_cl_buffer(arr.base_data)
    # Pending pyopencl work on the array's queue becomes the buffer's last write.
    if arr.queue is not None:
        fq = interop.ForeignQueue(arr.queue, dev)
        buf.mark_write(interop.foreign_marker(arr.queue), fq)  # type: ignore[arg-type]
    strides = tuple(s // isz for s in arr.strides)
    v = View(tuple(arr.shape), strides, arr.offset // isz)
    return Tensor(ir.load(buf, v, d), dev)


def _device_of_context(ctx: Any) -> runtime.CLDevice:
    from .runtime.device import _DEVICES

    for dev in list(_DEVICES.values()):
        if dev.context.int_ptr == ctx.int_ptr:
            return dev
    raise ValueError("from_pyopencl: the array's context belongs to no clops device; create "
                     "the array on clops.device(...).context (or copy it with .get())")


# -- the C tensor view of clops/clops.h, in a capsule ---------------------------------------------
TENSOR_VIEW_CAPSULE = "clops.tensor_view"
"""The name of the capsules ``tensor_view`` returns (``CLOPS_TENSOR_VIEW_CAPSULE``)."""
TENSOR_VIEW_VERSION = 1
"""The version of ``clops_tensor_view`` this clops fills in (``CLOPS_TENSOR_VIEW_VERSION``)."""

# CLOPS_DTYPE_* of clops.h. NOTE: the numbers are ABI: never renumber, only add.
DTYPE_CODES: dict[str, int] = {
    "bool": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "uint8": 5, "uint16": 6,
    "uint32": 7, "uint64": 8, "float16": 9, "bfloat16": 10, "float32": 11, "float64": 12,
    "complex64": 13, "complex128": 14,
}


class TensorView(ctypes.Structure):
    """``clops_tensor_view`` of ``clops/clops.h`` (version 1), for ctypes users: the fields
    there, in that order. Fields are only ever appended."""

    _fields_ = [
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("mem", ctypes.c_void_p),
        ("offset", ctypes.c_int64),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("itemsize", ctypes.c_int64),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("queue", ctypes.c_void_p),
        ("context", ctypes.c_void_p),
        ("device", ctypes.c_void_p),
        ("wait_event", ctypes.c_void_p),
    ]


@dataclass(frozen=True, eq=False)
class _ViewEntry:
    """What a capsule holds alive: its struct and arrays, the tensor, the queue, the event."""

    view: TensorView
    shape: Any
    strides: Any
    tensor: Tensor
    queue: runtime.CLQueue
    wait_event: Any


# id(capsule) -> (capsule, entry). NOTE: no capsule destructor: from Python it would be a ctypes
# callback, and the interpreter frees capsules while an exception is pending (the arguments of a
# call that raised), which no Python code survives. Entries are swept instead: one whose capsule
# nothing but this table references is dropped, on every gc run and every view or report.
_VIEWS: dict[int, tuple[object, _ViewEntry]] = {}


def _table_refs(obj: object) -> int:
    return sys.getrefcount(obj)


def _sweep() -> None:
    for key, (capsule, _) in list(_VIEWS.items()):
        # NOTE: ``_table_refs`` here counts the table's tuple, this loop's name and its argument.
        if _table_refs(capsule) <= _UNUSED_REFS:
            _VIEWS.pop(key, None)


def _unused_refs() -> int:
    """What ``_sweep`` counts for a capsule only the table holds (measured on a stand-in)."""
    probe = object()
    table = {0: (probe, None)}
    del probe
    for _, (obj, _entry) in list(table.items()):
        return _table_refs(obj)
    raise AssertionError("unreachable")


_UNUSED_REFS = _unused_refs()


def _on_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "stop" and _VIEWS:
        _sweep()


gc.callbacks.append(_on_gc)


def _capsule_name() -> int:
    # A capsule keeps a pointer to its name: the bytes must outlive every capsule, so this one
    # buffer is never freed (a reference the interpreter never drops).
    buf = ctypes.create_string_buffer(TENSOR_VIEW_CAPSULE.encode())
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(buf))
    return ctypes.addressof(buf)


_CAPSULE_NAME = _capsule_name()
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]


class _NoQueue(interop.ForeignQueue):
    """Stands for the queue of an event that has none (a user event): nothing to flush."""

    __slots__ = ()

    def __init__(self, device: runtime.CLDevice) -> None:
        super().__init__(None, device)  # type: ignore[arg-type]

    def flush(self) -> None:
        pass

    def finish(self) -> None:
        pass


def get_include() -> str:
    """The folder that holds ``clops/clops.h``, for a native extension's include path.

    >>> Extension("myext", ["myext.c"], include_dirs=[clops.get_include()], libraries=["OpenCL"])
    """
    return str(Path(__file__).resolve().parent / "include")


def tensor_view(t: Tensor, queue: runtime.CLQueue | None = None, *, write: bool = True) -> Any:
    """A capsule named ``"clops.tensor_view"`` holding a ``clops_tensor_view`` (see
    ``clops/clops.h``) of the (computed) tensor on ``queue`` (default: the current queue of
    its device). Its ``wait_event`` covers the tensor's pending write and, for a ``write``
    view, its pending reads. The capsule keeps the tensor alive; report the extension's last
    command with ``report_write`` or ``report_read``.

    >>> myext.scale(clops.native.tensor_view(x), 2.0)  # C: clops_tensor_view_from_capsule
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"tensor_view takes a clops tensor, not {type(t).__name__}")
    dev = t.device
    q = queue or streams.current_queue(dev)
    if q.device is not dev:
        raise ValueError(f"tensor_view: the tensor is on {dev} but the queue on {q.device}; "
                         "pass a queue of the tensor's device (or copy the tensor with .to())")
    code = DTYPE_CODES.get(t.dtype.name)
    if code is None:
        raise TypeError(f"tensor_view: {t.dtype} has no CLOPS_DTYPE_* code in clops.h")
    buf = t.buffer
    if write:
        _flush_readers(buf)
    deps = buf.write_deps(q) if write else buf.read_deps(q)
    for ev in deps:
        # NOTE: the extension may wait from another queue, which does not flush this one.
        cq = ev.command_queue
        if cq is not None:
            cq.flush()
    wait = deps[0] if len(deps) == 1 else interop.enqueue_marker(q, deps) if deps else None
    nd = t.ndim
    shape = (ctypes.c_int64 * nd)(*t.shape)
    strides = (ctypes.c_int64 * nd)(*t.strides)
    isz = t.dtype.itemsize
    h = interop.handles(dev, q)
    view = TensorView(
        version=TENSOR_VIEW_VERSION, size=ctypes.sizeof(TensorView), mem=int(buf.mem.int_ptr),
        offset=t.offset * isz, ndim=nd, dtype=code, itemsize=isz,
        shape=ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
        strides=ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)),
        queue=h["queue"], context=h["context"], device=h["device"],
        wait_event=None if wait is None else int(wait.int_ptr),
    )
    _sweep()
    capsule = _capsule_new(ctypes.addressof(view), _CAPSULE_NAME, None)
    _VIEWS[id(capsule)] = (capsule, _ViewEntry(view, shape, strides, t, q, wait))
    return capsule


def report_write(target: Any, event: Any) -> None:
    """Record the event of a native extension's last command that wrote a tensor: later clops
    work on it waits for that event, and the tensor stays alive until it completes. ``target``
    is the capsule from ``tensor_view`` or the tensor; ``event`` a ``cl_event`` as an integer
    (clops retains its own reference), a pyopencl event or a ``clops.Event``.

    >>> clops.native.report_write(view, ev_handle)  # C: clops_report_write(view, ev)
    """
    _report(target, event, write=True, what="report_write")


def report_read(target: Any, event: Any) -> None:
    """Like ``report_write`` for a command that only read the tensor: later writes wait for it.

    >>> clops.native.report_read(view, ev_handle)  # C: clops_report_read(view, ev)
    """
    _report(target, event, write=False, what="report_read")


def _report(target: Any, event: Any, *, write: bool, what: str) -> None:
    _sweep()
    if isinstance(target, Tensor):
        t, q = target, streams.current_queue(target.device)
    else:
        held = _VIEWS.get(id(target))
        entry = held[1] if held is not None and held[0] is target else None
        if entry is None:
            raise TypeError(f"{what} takes a capsule from clops.native.tensor_view or a clops "
                            f"tensor, not {type(target).__name__}")
        t, q = entry.tensor, entry.queue
    if event is None or event == 0:
        raise ValueError(f"{what}: the event is NULL; pass the cl_event of the extension's last "
                         "command on the tensor (after clFinish there is nothing to report)")
    ev = interop.as_cl_event(event)
    assert ev is not None
    dev = t.device
    if ev.context.int_ptr != dev.context.int_ptr:  # type: ignore[attr-defined]
        raise ValueError(f"{what}: the event belongs to another OpenCL context than {dev}'s; "
                         "enqueue the work in the view's context (view->context)")
    cq = ev.command_queue
    rq: runtime.CLQueue | interop.ForeignQueue  # the queue the buffer records with the event
    if cq is None:
        # NOTE: not a marker on the view's queue: on an in-order queue, that would hold back
        # all later work there, not only the work on this tensor.
        rq = _NoQueue(dev)
    elif cq.int_ptr == q.cl_queue.int_ptr:
        rq = q  # on clops' own in-order queue, later work there is ordered without a wait
    else:
        rq = interop.ForeignQueue(cq, dev)
    buf = t.buffer
    if write:
        buf.mark_write(ev, rq)  # type: ignore[arg-type]
    else:
        buf.mark_read(ev, rq)  # type: ignore[arg-type]
    keepalive(runtime.Event(ev, rq), t)
