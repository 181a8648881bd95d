"""Runtime: the only layer that touches pyopencl. Devices, queues, events, the buffer pool,
program builds, and the launch seam's scopes (capture, profiler)."""

from __future__ import annotations

from typing import Any

from . import registry
from .capture import Capture
from .device import (
    CLDevice,
    CLQueue,
    DeviceCaps,
    adopt,
    context,
    device,
    devices,
    set_default_device,
)
from .discovery import DeviceNotFoundError, parse_selector
from .events import Event, gather, wait_all, when_done
from .interop import Kernel, NativeEvent
from .pool import Buffer, BufferPool, size_class
from .profiler import Profiler, Record, profile
from .program import STATS as BUILD_STATS
from .program import BuildError
from .scope import LaunchScope

__all__ = [
    "BUILD_STATS", "Buffer", "BufferPool", "BuildError", "CLDevice", "CLQueue", "Capture",
    "DeviceCaps", "DeviceNotFoundError", "Event", "Kernel", "LaunchScope", "NativeEvent",
    "Profiler", "Record", "adopt", "context", "device", "devices", "empty_cache", "gather",
    "launches", "memory_stats", "parse_selector", "profile", "set_default_device", "size_class",
    "synchronize", "wait_all", "when_done",
]


def launches(capture: bool | Capture = False, profile: bool | Profiler = False, *,
             strict: bool = True) -> LaunchScope:
    """A launch scope: what the launch seam does with the commands (kernel launches, copies,
    writes from the host, vendor-library calls) enqueued inside ``with clops.launches(...) as
    scope:``. With ``capture``, ``scope.capture`` (a ``Capture``) records those this thread
    enqueues, as ``clops.jit`` does; one a replay could not repeat (a read to the host) raises
    ``clops.JitError`` where ``strict`` holds, else it empties the capture and sets its
    ``refused``. With ``profile``, ``scope.profiler`` (a ``Profiler``, what ``clops.profile()``
    gives) times those of every thread. Give a ``Capture`` or a ``Profiler`` instead of
    ``True`` to add to one you hold. Dependency tracking is no choice of a scope: the seam
    tracks commands inside one as outside (``scope.tracked`` says why). Scopes nest, and an
    exception in the block leaves the scope closed.

    >>> a = clops.ones(8).realize()
    >>> with clops.launches(capture=True, profile=True) as scope:
    ...     b = (a * 2).realize()
    >>> len(scope.capture.commands), scope.profiler.kernel_count, scope.tracked
    (1, 1, True)
    """
    cap = capture if isinstance(capture, Capture) else Capture(strict) if capture else None
    prof = profile if isinstance(profile, Profiler) else Profiler() if profile else None
    return LaunchScope(capture=cap, profiler=prof)


def memory_stats(device_: CLDevice | str | None = None) -> dict[str, Any]:
    """In-use, cached and peak bytes, hits and misses of a device's buffer pool."""
    return device(device_).memory_stats()


def empty_cache(device_: CLDevice | str | None = None) -> int:
    """Release the pool's cached buffers to the driver (all devices when none is named)."""
    devs = [device(device_)] if device_ is not None else list(registry.DEVICES.values())
    return sum(d.pool.empty() for d in devs)


def synchronize(device_: CLDevice | str | None = None) -> None:
    """Wait for every queue of a device (all devices in use when none is named)."""
    devs = [device(device_)] if device_ is not None else list(registry.DEVICES.values())
    for d in devs:
        d.synchronize()
