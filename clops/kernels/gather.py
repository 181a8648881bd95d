"""Kernels, gather: gather and scatter by element offsets, the last-writer scatter of repeated
offsets, and nonzero compaction (``gather.cl``), on device buffers with element offsets; the
array layer prepares contiguous operands and wraps the results. One program per element size,
so every shape reuses it."""

from __future__ import annotations

import numpy as np

from ..runtime import CLDevice
from ..runtime.pool import Buffer
from .launch import flat_geometry, shared_kernel

_BITS_TYPE = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong", 16: "ulong2"}
I64 = np.int64


def gather(dev: CLDevice, itemsize: int, out: Buffer, out_off: int, src: Buffer, src_off: int,
           idx: Buffer, idx_off: int, n: int) -> None:
    """``out[out_off + i] = src[src_off + idx[idx_off + i]]`` for ``i < n``."""
    if n == 0:
        return
    k = shared_kernel(dev, "gather", "gather", (f"-DT={_BITS_TYPE[itemsize]}",))
    g, loc = flat_geometry(dev, n)
    dev.launch(k, g, loc, [out, I64(out_off), src, I64(src_off), idx, I64(idx_off), I64(n)],
               reads=[src, idx], writes=[out], name="gather")


def scatter(dev: CLDevice, itemsize: int, dst: Buffer, dst_off: int, val: Buffer, val_off: int,
            idx: Buffer, idx_off: int, n: int) -> None:
    """``dst[dst_off + idx[idx_off + i]] = val[val_off + i]`` for ``i < n``."""
    if n == 0:
        return
    k = shared_kernel(dev, "gather", "scatter", (f"-DT={_BITS_TYPE[itemsize]}",))
    g, loc = flat_geometry(dev, n)
    dev.launch(k, g, loc, [dst, I64(dst_off), val, I64(val_off), idx, I64(idx_off), I64(n)],
               reads=[val, idx, dst], writes=[dst], name="scatter")


def scatter_last(dev: CLDevice, itemsize: int, dst: Buffer, dst_off: int, val: Buffer,
                 val_off: int, sorted_idx: Buffer, perm: Buffer, n: int) -> None:
    """Scatter through stably sorted offsets; of repeated offsets the last one in the original
    order writes (``perm`` holds the original positions)."""
    if n == 0:
        return
    k = shared_kernel(dev, "gather", "scatter_last", (f"-DT={_BITS_TYPE[itemsize]}",))
    g, loc = flat_geometry(dev, n)
    dev.launch(k, g, loc, [dst, I64(dst_off), val, I64(val_off), sorted_idx, perm, I64(n)],
               reads=[val, sorted_idx, perm, dst], writes=[dst], name="scatter_last")


def compact_index(dev: CLDevice, out: Buffer, flags: Buffer, f_off: int, pos: Buffer,
                  p_off: int, n: int) -> None:
    """Write the index of every nonzero flag at its place (``pos`` = inclusive prefix sum)."""
    if n == 0:
        return
    k = shared_kernel(dev, "gather", "compact_index", ("-DT=uchar",))
    g, loc = flat_geometry(dev, n)
    dev.launch(k, g, loc, [out, flags, I64(f_off), pos, I64(p_off), I64(n)], reads=[flags, pos],
               writes=[out], name="compact_index")
