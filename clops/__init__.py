"""clops: arrays, neural networks and LLM inference on any OpenCL device."""

from __future__ import annotations

from .runtime import (
    BuildError,
    CLDevice,
    CLQueue,
    DeviceNotFoundError,
    Event,
    device,
    devices,
    empty_cache,
    memory_stats,
    profile,
    set_default_device,
    synchronize,
)

from .array.api import *  # noqa: F403  (the Array API namespace)
from .array.api import __all__ as _array_all
from .compiler.jit import jit

__version__ = "0.1.0"
__array_api_version__ = "2024.12"
