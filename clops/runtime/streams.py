"""Runtime, streams: the queue that work is submitted to when no queue is named. ``with
clops.stream(q):`` sends generated kernels, copies and custom kernels of ``q``'s device to ``q``;
dependency tracking on buffers keeps results correct across queues.

The choice is a ``contextvars`` variable, so each thread and each asyncio task has its own."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .device import CLDevice, CLQueue

# id(device) -> queue chosen for it; a new dict per ``stream`` block (never mutated in place).
_CURRENT: contextvars.ContextVar[dict[int, CLQueue] | None] = contextvars.ContextVar(
    "clops_current_queue", default=None)


def current_queue(device: CLDevice) -> CLQueue:
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
def stream(queue: CLQueue | None = None, *, device: CLDevice | str | None = None,
           out_of_order: bool = False) -> Iterator[CLQueue]:
    """Submit the work of a block to ``queue`` (or to a new queue of ``device``, out-of-order if
    asked). Blocks nest; each device keeps the innermost choice for it.

    >>> dev = clops.device()
    >>> with clops.stream(device=dev, out_of_order=True) as q:
    ...     c = (clops.ones(1000, device=dev) * 2).realize()   # runs on q
    """
    from .device import CLQueue

    if queue is not None and not isinstance(queue, CLQueue):
        raise TypeError(
            f"stream: expected a queue of a device (a CLQueue, such as "
            f"clops.device().create_queue()) or None, got {queue!r} ({type(queue).__name__}); "
            "for a new queue of a device, give stream(device=...)")
    if queue is None:
        from .device import device as _device

        queue = _device(device).create_queue(out_of_order=out_of_order)
    elif device is not None:
        from .device import device as _device

        if _device(device) is not queue.device:
            raise ValueError(f"stream: {queue} belongs to {queue.device}, not to {device}")
    chosen = dict(_CURRENT.get() or {})
    chosen[id(queue.device)] = queue
    token = _CURRENT.set(chosen)
    try:
        yield queue
    finally:
        _CURRENT.reset(token)


def use_queue(queue: CLQueue) -> contextlib.AbstractContextManager[Any]:
    """Same as ``stream(queue)``.

    >>> with clops.use_queue(clops.device().create_queue()):
    ...     pass
    """
    return stream(queue)
