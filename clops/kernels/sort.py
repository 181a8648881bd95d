"""Kernels, sort: stable sorts of contiguous rows, merge sort (CPUs) or bitonic (elsewhere), and
binary search (``sort.cl``). One program per element type, so every shape reuses it."""

from __future__ import annotations

import numpy as np

from ..graph.dtypes import DType
from ..runtime import CLDevice
from ..runtime.pool import Buffer
from .launch import flat_geometry, math_options, shared_kernel

I64 = np.int64
# Keys one work-item merge-sorts on a CPU before the parallel merge passes.
SORT_BLOCK = 4096


def sort(dev: CLDevice, dtype: DType, x: Buffer, x_off: int, rows: int, n: int,
         descending: bool, algorithm: str | None = None) -> tuple[Buffer, Buffer, int]:
    """Stable sort of ``rows`` contiguous rows of ``n`` keys. Returns (keys, indices, P): rows
    of ``P`` entries (P >= n) whose first ``n`` are the sorted keys and their original
    positions (int64). ``algorithm``: "merge" (P = n; the default on CPUs) or "bitonic" (P a
    power of two; the default elsewhere)."""
    if (algorithm or ("merge" if dev.kind == "cpu" else "bitonic")) == "merge":
        return _merge_sort(dev, dtype, x, x_off, rows, n, descending)
    P = 1
    while P < n:
        P *= 2
    opts = math_options(dtype)
    keys = dev.alloc(max(rows * P, 1) * dtype.itemsize)
    idx = dev.alloc(max(rows * P, 1) * 8)
    total = rows * P
    if total == 0:
        return keys, idx, P
    g, loc = flat_geometry(dev, total)
    k0 = shared_kernel(dev, "sort", "sort_init", opts)
    dev.launch(k0, g, loc, [x, I64(x_off), keys, idx, I64(n), I64(P), I64(total)], reads=[x],
               writes=[keys, idx], name="sort_init")
    if P < 2:
        return keys, idx, P
    k1 = shared_kernel(dev, "sort", "sort_step", opts)
    half = total // 2
    g1, loc1 = flat_geometry(dev, half)
    desc = np.int32(1 if descending else 0)
    k = 2
    while k <= P:
        j = k // 2
        while j >= 1:
            dev.launch(k1, g1, loc1, [keys, idx, I64(n), I64(P), I64(j), I64(k), desc, I64(half)],
                       reads=[keys, idx], writes=[keys, idx], name="sort_step")
            j //= 2
        k *= 2
    return keys, idx, P


def _merge_sort(dev: CLDevice, dtype: DType, x: Buffer, x_off: int, rows: int, n: int,
                descending: bool) -> tuple[Buffer, Buffer, int]:
    opts = math_options(dtype)
    size = max(rows * n, 1)
    ka, kb = dev.alloc(size * dtype.itemsize), dev.alloc(size * dtype.itemsize)
    ia, ib = dev.alloc(size * 8), dev.alloc(size * 8)
    if rows * n == 0:
        return ka, ia, n
    desc = np.int32(1 if descending else 0)
    B = SORT_BLOCK
    bpr = -(-n // B)
    k0 = shared_kernel(dev, "sort", "msort_block", opts)
    g, loc = flat_geometry(dev, rows * bpr)
    dev.launch(k0, g, loc, [x, I64(x_off), ka, ia, kb, ib, I64(n), I64(B), I64(bpr),
                            I64(rows * bpr), desc], reads=[x], writes=[ka, ia, kb, ib],
                   name="msort_block")
    k1 = shared_kernel(dev, "sort", "msort_merge", opts)
    src, dst = (ka, ia), (kb, ib)
    w = B
    g1, loc1 = flat_geometry(dev, rows * bpr)
    while w < n:
        dev.launch(k1, g1, loc1, [src[0], src[1], dst[0], dst[1], I64(n), I64(w), I64(B), I64(bpr),
                                  I64(rows * bpr), desc], reads=[src[0], src[1]],
                   writes=[dst[0], dst[1]], name="msort_merge")
        src, dst = dst, src
        w *= 2
    return src[0], src[1], n


def searchsorted(dev: CLDevice, dtype: DType, a: Buffer, a_off: int, a_stride: int, n: int,
                 v: Buffer, v_off: int, out: Buffer, m: int, right: bool) -> None:
    """Insertion points of ``m`` contiguous values in the sorted (strided) ``a`` of ``n``."""
    if m == 0:
        return
    k = shared_kernel(dev, "sort", "searchsorted", math_options(dtype))
    g, loc = flat_geometry(dev, m)
    dev.launch(k, g, loc, [a, I64(a_off), I64(a_stride), I64(n), v, I64(v_off), out, I64(m),
                           np.int32(1 if right else 0)], reads=[a, v], writes=[out],
               name="searchsorted")
