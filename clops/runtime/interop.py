"""Runtime, interop: the pyopencl-facing pieces of custom kernels and native extensions: raw
handles as integers, foreign events and buffers wrapped for dependency tracking, local-memory
arguments, and objects kept alive until an event completes."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyopencl as cl

from .events import Event, when_done
from .pool import Buffer

if TYPE_CHECKING:
    from .device import CLDevice, CLQueue

COMPLETE = cl.command_execution_status.COMPLETE


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
