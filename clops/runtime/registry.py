"""Runtime, registry: every device object clops has made, by key (a cl_device pointer, or a tuple
for shared-context and adopted devices); ``clops.synchronize()`` and ``empty_cache()`` visit
them, and ``from_pyopencl`` finds a device by its context here."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

DEVICES: dict[Any, Any] = {}  # key -> CLDevice
_LOCK = threading.Lock()


def register(dev: Any, key: Any) -> None:
    """Make ``dev`` one of the devices ``clops.synchronize()`` and ``empty_cache()`` visit (and
    ``from_pyopencl`` finds by context): sub-devices, shared-context and adopted devices."""
    with _LOCK:
        DEVICES[key] = dev


def lookup(key: Any) -> Any | None:
    """The device registered under ``key``, or None."""
    with _LOCK:
        return DEVICES.get(key)


def get_or_add(key: Any, make: Callable[[], Any]) -> Any:
    """The device registered under ``key``; where there is none, ``make()``'s, registered."""
    with _LOCK:
        dev = DEVICES.get(key)
        if dev is None:
            dev = DEVICES[key] = make()
        return dev
