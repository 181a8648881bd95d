"""Runtime, interop: the pyopencl-facing pieces of custom kernels, native extensions and vendor
libraries (providers): raw handles as integers, native events from handles, markers and barriers
with wait lists, foreign events and buffers wrapped for dependency tracking, sub-buffers, vector
and local-memory arguments, and objects kept alive until an event completes."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pyopencl as cl
import pyopencl.cltypes as cltypes

from .events import Event, when_done
from .pool import Buffer

if TYPE_CHECKING:
    from .device import CLDevice, CLQueue

COMPLETE = cl.command_execution_status.COMPLETE

# Names for type annotations outside the runtime (re-exported by ``clops.runtime``).
Kernel: TypeAlias = cl.Kernel
"""A kernel object, as ``CLDevice.kernel`` returns it."""
NativeEvent: TypeAlias = cl.Event
"""A driver event: what ``Event.cl_event`` holds and what buffers record as their dependencies."""


def local_memory(nbytes: int) -> Any:
    """A ``__local`` kernel argument of ``nbytes`` bytes.

    >>> k(256, 64, x, clops.local_memory(64 * 4))
    """
    return cl.LocalMemory(int(nbytes))


def is_local_memory(obj: Any) -> bool:
    return isinstance(obj, cl.LocalMemory)


def is_cl_buffer(obj: Any) -> bool:
    return isinstance(obj, cl.MemoryObjectHolder)


class ForeignQueue:
    """Stands for a queue clops did not create (a pyopencl user's): work on it is never assumed
    ordered with clops' queues, so every dependency on it is an explicit wait."""

    __slots__ = ("cl_queue", "device", "index", "in_order")

    def __init__(self, cl_queue: cl.CommandQueue, device: CLDevice) -> None:
        self.cl_queue = cl_queue
        self.device = device
        self.index = -1
        self.in_order = False  # NOTE: disables the same-in-order-queue shortcut in tracking

    def flush(self) -> None:
        self.cl_queue.flush()

    def finish(self) -> None:
        self.cl_queue.finish()


def as_cl_event(obj: Any) -> cl.Event | None:
    """A pyopencl event from an ``Event``, a pyopencl event or an integer ``cl_event``."""
    if obj is None:
        return None
    if isinstance(obj, Event):
        return obj.cl_event
    if isinstance(obj, cl.Event):
        return obj
    if isinstance(obj, int):
        return cl.Event.from_int_ptr(obj, retain=True)
    raise TypeError(f"expected an event (clops.Event, pyopencl.Event or int), "
                    f"not {type(obj).__name__}")


def wrap_cl_buffer(mem: cl.Buffer, nbytes: int | None = None) -> Buffer:
    """A tracked ``Buffer`` over memory clops did not allocate (never returned to the pool)."""
    n = int(mem.size) if nbytes is None else int(nbytes)
    return Buffer(mem, n, n, None)


def foreign_marker(cl_queue: cl.CommandQueue) -> cl.Event:
    """A marker on a queue clops did not create: completes after its pending work."""
    return cl.enqueue_marker(cl_queue)


def pyopencl_array(cl_queue: cl.CommandQueue, shape: tuple[int, ...], dtype: Any,
                   strides: tuple[int, ...], mem: cl.Buffer, offset: int) -> Any:
    """A ``pyopencl.array.Array`` over existing memory (no copy)."""
    import pyopencl.array as cla

    return cla.Array(cl_queue, shape, dtype, strides=strides, data=mem, offset=offset)


def handles(device: CLDevice, queue: CLQueue | None = None) -> dict[str, int]:
    """Integer handles of a device's context, device, platform and a queue."""
    q = queue or device.queue
    return {
        "context": int(device.context.int_ptr),
        "device": int(device.cl_device.int_ptr),
        "platform": int(device.entry.platform.int_ptr),
        "queue": int(q.cl_queue.int_ptr),
    }


def wait_list(events: Sequence[Any]) -> list[cl.Event]:
    out = []
    for e in events:
        ev = as_cl_event(e)
        if ev is not None:
            out.append(ev)
    return out


# Objects held until their event completes: id(holder) -> holder.
_KEPT: dict[int, tuple[Any, ...]] = {}
_KEPT_LOCK = threading.Lock()


def keepalive(event: Event, *objs: Any) -> Event:
    """Hold references to ``objs`` until ``event`` completes (native code may still be using
    their memory); returns ``event``.

    >>> clops.keepalive(ev, x, y)
    """
    if event.cl_event is None:
        return event
    holder = (event, objs)
    key = id(holder)
    with _KEPT_LOCK:
        _KEPT[key] = holder

    def drop() -> None:
        with _KEPT_LOCK:
            _KEPT.pop(key, None)

    when_done(event, drop)
    return event


def kept_count() -> int:
    """How many keepalive holds are pending (for tests)."""
    with _KEPT_LOCK:
        return len(_KEPT)


# -- providers: native handles, events, markers and barriers --------------------------------------
def buffer_handle(buf: Buffer) -> int:
    """The ``cl_mem`` of a buffer as an integer (for a C library's ``void*`` argument)."""
    return int(buf.mem.int_ptr)


def buffer_mem_size(buf: Buffer) -> int:
    """Bytes of the driver allocation under ``buf`` (may exceed ``buf.nbytes``)."""
    return int(buf.mem.size)


def sub_buffer(buf: Buffer, offset: int, nbytes: int) -> Any:
    """A native sub-buffer of ``nbytes`` bytes at byte ``offset`` of ``buf`` (untracked: the
    caller tracks ``buf``). ``offset`` must be a multiple of :func:`base_addr_align`."""
    return buf.mem.get_sub_region(int(offset), int(nbytes))


def base_addr_align(buf: Buffer) -> int:
    """The alignment in bytes (at least 1) that a sub-buffer's offset in ``buf`` needs: the
    base address alignment of the first device of the buffer's context."""
    dev = buf.mem.context.devices[0]
    return max(int(dev.mem_base_addr_align) // 8, 1)


def queue_handle(queue: CLQueue | ForeignQueue) -> int:
    """The ``cl_command_queue`` of a queue as an integer."""
    return int(queue.cl_queue.int_ptr)


def event_handle(event: Event | cl.Event) -> int:
    """The ``cl_event`` of an event (a clops ``Event`` or a native one) as an integer; 0 for a
    clops ``Event`` with no native event."""
    ev = event.cl_event if isinstance(event, Event) else event
    return 0 if ev is None else int(ev.int_ptr)


def event_from_handle(handle: int, retain: bool = False) -> cl.Event:
    """A native event from an integer ``cl_event``. By default it takes over the reference the
    handle holds (a library's output event, released when the object goes); ``retain=True``
    adds a reference of its own instead (the caller keeps and releases its handle)."""
    return cl.Event.from_int_ptr(int(handle), retain=retain)


def enqueue_marker(queue: CLQueue | ForeignQueue, wait_for: Sequence[Any] = ()) -> cl.Event:
    """A native marker event on ``queue`` that completes when ``wait_for`` (clops events, native
    events or integer handles) has, or, when it is empty, after all work enqueued before it.
    Unlike ``CLQueue.marker`` it returns the native event, as buffers record it."""
    evs = wait_list(wait_for) if wait_for else None
    return cl.enqueue_marker(queue.cl_queue, wait_for=evs or None)


def enqueue_barrier(queue: CLQueue | ForeignQueue, wait_for: Sequence[Any] = ()) -> cl.Event:
    """A native barrier on ``queue``: later commands on it wait for ``wait_for`` (clops events,
    native events or integer handles), or, when it is empty, for all work enqueued before it.
    For libraries that take no wait list: the barrier goes before their call."""
    evs = wait_list(wait_for) if wait_for else None
    return cl.enqueue_barrier(queue.cl_queue, wait_for=evs or None)


# -- providers: kernel arguments and device facts ----------------------------------------------
_VECTOR_WIDTHS = (2, 3, 4, 8, 16)


def vector_arg(ctype: str, values: Sequence[Any]) -> np.ndarray:
    """An OpenCL vector kernel argument (``long8``, ``float4``...) from its components.

    >>> vector_arg("long", [1, 2, 3, 4, 5, 6, 7, 8])  # a long8
    """
    n = len(values)
    if n not in _VECTOR_WIDTHS:
        raise ValueError(f"an OpenCL vector has {_VECTOR_WIDTHS} components, not {n}")
    make = getattr(cltypes, f"make_{ctype}{n}", None)
    if make is None:
        raise ValueError(f"no OpenCL vector type {ctype}{n}")
    out: np.ndarray = make(*values)
    return out


def clock_mhz(device: CLDevice) -> int:
    """The device's maximum clock frequency in MHz, as its driver reports it."""
    return int(device.cl_device.max_clock_frequency)
