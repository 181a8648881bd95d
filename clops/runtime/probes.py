"""Runtime, capability probes: questions about a device answered by trying something on it once
(building a kernel, running it), remembered per device for as long as the device lives. The
answers live here, not on the device object; ``CLDevice.probe`` holds the probes that are also
remembered on disk (fp16, inline PTX, builds)."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")

_LOCK = threading.RLock()


def per_device(fn: Callable[..., R]) -> Callable[..., R]:
    """Memoise ``fn(device, *args)`` per device (held weakly) and arguments.

    >>> @per_device
    ... def builds_mma(dev): ...
    """
    answers: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], R]] = \
        weakref.WeakKeyDictionary()

    @functools.wraps(fn)
    def probe(device: Any, *args: Any) -> R:
        with _LOCK:
            known = answers.get(device)
            if known is not None and args in known:
                return known[args]
        result = fn(device, *args)
        with _LOCK:
            answers.setdefault(device, {})[args] = result
        return result

    probe.forget = answers.clear  # type: ignore[attr-defined]
    return probe
