"""Runtime, meminfo: how much memory a GPU has free, where its driver says (OpenCL itself does
not): NVIDIA's through the CUDA driver (``tma.cuda``), AMD's ``GLOBAL_FREE_MEMORY_AMD``. Both
count every program's allocations."""

from __future__ import annotations

from typing import Any

import pyopencl as cl

from . import tma
from .device import CLDevice


def free_bytes(dev: CLDevice) -> int | None:
    """The bytes ``dev``'s driver says are free, or None where it does not say (CPUs, other
    GPUs)."""
    if dev.kind != "gpu":
        return None
    if dev.backend == "nvidia":
        cuda = tma.cuda(dev)
        got = cuda.memory() if cuda is not None else None
        return got[0] if got is not None else None
    try:  # AMD: the free KiB in all, then the largest free block's
        kib: Any = dev.cl_device.get_info(cl.device_info.GLOBAL_FREE_MEMORY_AMD)
        return int(kib[0] if isinstance(kib, (list, tuple)) else kib) * 1024
    except (cl.Error, AttributeError, ValueError, TypeError):
        return None
