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

__version__ = "0.1.0"
