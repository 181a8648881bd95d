"""Runtime: the only layer that touches pyopencl. Devices, queues, events, the buffer pool,
program builds and the profiler."""

from __future__ import annotations

from typing import Any

from . import registry
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

__all__ = [
    "BUILD_STATS", "Buffer", "BufferPool", "BuildError", "CLDevice", "CLQueue", "DeviceCaps",
    "DeviceNotFoundError", "Event", "Kernel", "NativeEvent", "Profiler", "Record", "adopt",
    "context", "device",
    "devices", "empty_cache", "gather", "memory_stats", "parse_selector", "profile",
    "set_default_device", "size_class", "synchronize", "wait_all", "when_done",
]


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
