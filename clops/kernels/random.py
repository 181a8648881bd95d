"""Kernels, random: launches of ``random.cl``, tensor creation from Philox4x32-10 (the generator
is ``clops/kernels/philox.cl``, which user kernels include as ``"clops/philox.cl"``). Element
``i`` of an output is a function of (seed, stream, i) only; ``clops.random`` is the API."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..runtime import CLDevice, Event
from ..runtime.pool import Buffer
from .launch import source


def key(seed: int) -> tuple[np.uint32, np.uint32]:
    """The generator's key: the seed's low and high 32-bit words."""
    s = int(seed)
    if s < 0 or s >= 1 << 64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return np.uint32(s & 0xFFFFFFFF), np.uint32(s >> 32)


def generate(dev: CLDevice, function: str, out: Buffer, n: int, per_block: int, *, seed: int,
             stream: int, extra: Sequence[Any] = ()) -> Event:
    """Fill the first ``n`` elements of ``out`` with ``function`` of ``random.cl`` (one
    work-item per Philox block of ``per_block`` elements); ``extra``: the kernel's arguments
    after the stream (typed numpy scalars: bounds, scale, range)."""
    k0, k1 = key(seed)
    blocks = -(-n // per_block)
    knl = dev.kernel(source("random"), function, ())
    return dev.launch(knl, (blocks,), None,
                      [out, np.int64(0), np.int64(n), k0, k1, np.uint32(stream), *extra],
                      writes=[out], name=function)
