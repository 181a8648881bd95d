"""Native extension interface: raw OpenCL handles of tensors (``cl_mem`` pointer and byte
offset, queue, context, device) for ctypes/pybind11 code, ordering and lifetime of native work
on clops tensors, and pyopencl arrays in and out without copies.

The protocol of ``native_call``: clops enqueues a barrier that waits for everything the
tensors depend on, calls ``fn`` with the handles, which enqueues its work on the given queue
(and may return its last ``cl_event``), then enqueues a barrier after it. The tensors record
that barrier as their last write (or read), and stay alive until it completes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import runtime
from .array.tensor import Tensor, _flush_readers
from .graph import dtypes as _dt
from .graph import ir
from .graph.ir import View
from .runtime import interop, streams
from .runtime.interop import keepalive

__all__ = ["from_pyopencl", "handles", "keepalive", "native_call", "to_pyopencl"]


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
