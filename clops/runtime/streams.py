"""Runtime, streams: the queue that work is submitted to when no queue is named. ``with
clops.stream(q):`` sends generated kernels, copies and custom kernels of ``q``'s device to ``q``;
dependency tracking on buffers keeps results correct across queues.

The choice is a ``contextvars`` variable (``launch.py`` holds it, for the enqueues), so each thread
and each asyncio task has its own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

from . import launch
from .device import CLDevice, CLQueue
from .device import device as _device


def current_queue(device: CLDevice) -> CLQueue:
    """The queue work on ``device`` goes to now: the innermost ``stream`` block's queue for that
    device, else the device's default in-order queue.

    >>> dev = clops.device()
    >>> clops.current_queue(dev) is dev.queue
    True
    """
    return cast(CLQueue, launch.current_queue(device))


@contextlib.contextmanager
def stream(queue: CLQueue | None = None, *, device: CLDevice | str | None = None,
           out_of_order: bool = False) -> Iterator[CLQueue]:
    """Submit the work of a block to ``queue`` (or to a new queue of ``device``, out-of-order if
    asked). Blocks nest; each device keeps the innermost choice for it.

    >>> dev = clops.device()
    >>> with clops.stream(device=dev, out_of_order=True) as q:
    ...     c = (clops.ones(1000, device=dev) * 2).realize()   # runs on q
    """
    if queue is not None and not isinstance(queue, CLQueue):
        raise TypeError(
            f"stream: expected a queue of a device (a CLQueue, such as "
            f"clops.device().create_queue()) or None, got {queue!r} ({type(queue).__name__}); "
            "for a new queue of a device, give stream(device=...)")
    if queue is None:
        queue = _device(device).create_queue(out_of_order=out_of_order)
    elif device is not None:
        if _device(device) is not queue.device:
            raise ValueError(f"stream: {queue} belongs to {queue.device}, not to {device}")
    with launch.routed(queue.device, queue):
        yield queue


def use_queue(queue: CLQueue) -> contextlib.AbstractContextManager[Any]:
    """Same as ``stream(queue)``.

    >>> with clops.use_queue(clops.device().create_queue()):
    ...     pass
    """
    return stream(queue)
