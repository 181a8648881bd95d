"""Kernels, array launchers: gather/scatter by offsets, nonzero compaction, scans, bitonic sort
and binary search (``gather.cl``, ``scan.cl``, ``sort.cl``). They take device buffers with
element offsets and sizes; the array layer prepares contiguous operands and wraps the results.
One program per (file, element type), so every shape reuses it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph.dtypes import DType
from ..runtime import CLDevice, cltypes
from ..runtime.pool import Buffer
from .launch import source

_BITS_TYPE = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong", 16: "ulong2"}
L = np.int64
I64 = np.int64
# Keys one work-item merge-sorts on a CPU before the parallel merge passes.
SORT_BLOCK = 4096


def _kernel(dev: CLDevice, name: str, function: str, options: tuple[str, ...]) -> Any:
    return dev.kernel(source(name), function, options)


def _math_options(dtype: DType) -> tuple[str, ...]:
    opts = [f"-DT={cltypes.math(dtype) if dtype.kind != 'b' else 'uchar'}"]
    if dtype.kind == "f":
        opts.append("-DIS_FLOAT")
    if dtype.kind == "c":
        opts.append("-DCOMPLEX")
    if dtype.needs_fp64:
        opts.append("-DFP64")
    return tuple(opts)


def _gsize(dev: CLDevice, n: int) -> tuple[tuple[int], tuple[int] | None]:
    if dev.kind == "cpu":
        return (n,), None
    wg = min(256, dev.caps.max_work_group)
    return (-(-n // wg) * wg,), (wg,)


def gather(dev: CLDevice, itemsize: int, out: Buffer, out_off: int, src: Buffer, src_off: int,
           idx: Buffer, idx_off: int, n: int) -> None:
    """``out[out_off + i] = src[src_off + idx[idx_off + i]]`` for ``i < n``."""
    if n == 0:
        return
    k = _kernel(dev, "gather", "gather", (f"-DT={_BITS_TYPE[itemsize]}",))
    g, loc = _gsize(dev, n)
    dev.launch(k, g, loc, [out, L(out_off), src, L(src_off), idx, L(idx_off), L(n)],
               reads=[src, idx], writes=[out], name="gather")


def scatter(dev: CLDevice, itemsize: int, dst: Buffer, dst_off: int, val: Buffer, val_off: int,
            idx: Buffer, idx_off: int, n: int) -> None:
    """``dst[dst_off + idx[idx_off + i]] = val[val_off + i]`` for ``i < n``."""
    if n == 0:
        return
    k = _kernel(dev, "gather", "scatter", (f"-DT={_BITS_TYPE[itemsize]}",))
    g, loc = _gsize(dev, n)
    dev.launch(k, g, loc, [dst, L(dst_off), val, L(val_off), idx, L(idx_off), L(n)],
               reads=[val, idx, dst], writes=[dst], name="scatter")


def scatter_last(dev: CLDevice, itemsize: int, dst: Buffer, dst_off: int, val: Buffer,
                 val_off: int, sorted_idx: Buffer, perm: Buffer, n: int) -> None:
    """Scatter through stably sorted offsets; of repeated offsets the last one in the original
    order writes (``perm`` holds the original positions)."""
    if n == 0:
        return
    k = _kernel(dev, "gather", "scatter_last", (f"-DT={_BITS_TYPE[itemsize]}",))
    g, loc = _gsize(dev, n)
    dev.launch(k, g, loc, [dst, L(dst_off), val, L(val_off), sorted_idx, perm, L(n)],
               reads=[val, sorted_idx, perm, dst], writes=[dst], name="scatter_last")


def compact_index(dev: CLDevice, out: Buffer, flags: Buffer, f_off: int, pos: Buffer,
                  p_off: int, n: int) -> None:
    """Write the index of every nonzero flag at its place (``pos`` = inclusive prefix sum)."""
    if n == 0:
        return
    k = _kernel(dev, "gather", "compact_index", ("-DT=uchar",))
    g, loc = _gsize(dev, n)
    dev.launch(k, g, loc, [out, flags, L(f_off), pos, L(p_off), L(n)], reads=[flags, pos],
               writes=[out], name="compact_index")


def scan(dev: CLDevice, dtype: DType, op: str, x: Buffer, x_off: int, out: Buffer, o_off: int,
         rows: int, n: int, include_initial: bool = False) -> None:
    """Inclusive scan (``op`` "sum" or "prod") of ``rows`` contiguous rows of ``n`` elements;
    output rows hold ``n + 1`` elements (identity first) with ``include_initial``."""
    shift = 1 if include_initial else 0
    if rows == 0 or (n == 0 and not shift):
        return
    opts = _math_options(dtype) + (("-DOP_MUL",) if op == "prod" else ())
    # PERF: enough chunks to occupy every compute unit; chunks of at least 256 elements.
    want = 4 * dev.caps.compute_units if dev.kind == "cpu" else 8 * dev.caps.compute_units * 32
    nchunks = max(1, min(-(-n // 256), -(-want // rows))) if n else 1
    chunk = max(1, -(-n // nchunks))
    nchunks = max(1, -(-n // chunk)) if n else 1
    items = rows * nchunks
    totals = dev.alloc(items * dtype.itemsize)
    g, loc = _gsize(dev, items)
    k1 = _kernel(dev, "scan", "scan_chunks", opts)
    dev.launch(k1, g, loc, [x, L(x_off), out, L(o_off), totals, L(n), L(shift), L(chunk),
                            L(nchunks), L(items)], reads=[x], writes=[out, totals],
               name="scan_chunks")
    if nchunks > 1:
        k2 = _kernel(dev, "scan", "scan_totals", opts)
        g2, loc2 = _gsize(dev, rows)
        dev.launch(k2, g2, loc2, [totals, L(nchunks), L(rows)], reads=[totals],
                   writes=[totals], name="scan_totals")
        k3 = _kernel(dev, "scan", "scan_fix", opts)
        dev.launch(k3, g, loc, [out, L(o_off), totals, L(n), L(shift), L(chunk), L(nchunks),
                                L(items)], reads=[totals, out], writes=[out], name="scan_fix")


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
    opts = _math_options(dtype)
    keys = dev.alloc(max(rows * P, 1) * dtype.itemsize)
    idx = dev.alloc(max(rows * P, 1) * 8)
    total = rows * P
    if total == 0:
        return keys, idx, P
    g, loc = _gsize(dev, total)
    k0 = _kernel(dev, "sort", "sort_init", opts)
    dev.launch(k0, g, loc, [x, L(x_off), keys, idx, L(n), L(P), L(total)], reads=[x],
               writes=[keys, idx], name="sort_init")
    if P < 2:
        return keys, idx, P
    k1 = _kernel(dev, "sort", "sort_step", opts)
    half = total // 2
    g1, loc1 = _gsize(dev, half)
    desc = np.int32(1 if descending else 0)
    k = 2
    while k <= P:
        j = k // 2
        while j >= 1:
            dev.launch(k1, g1, loc1, [keys, idx, L(n), L(P), L(j), L(k), desc, L(half)],
                       reads=[keys, idx], writes=[keys, idx], name="sort_step")
            j //= 2
        k *= 2
    return keys, idx, P


def _merge_sort(dev: CLDevice, dtype: DType, x: Buffer, x_off: int, rows: int, n: int,
                descending: bool) -> tuple[Buffer, Buffer, int]:
    opts = _math_options(dtype)
    size = max(rows * n, 1)
    ka, kb = dev.alloc(size * dtype.itemsize), dev.alloc(size * dtype.itemsize)
    ia, ib = dev.alloc(size * 8), dev.alloc(size * 8)
    if rows * n == 0:
        return ka, ia, n
    desc = np.int32(1 if descending else 0)
    B = SORT_BLOCK
    bpr = -(-n // B)
    k0 = _kernel(dev, "sort", "msort_block", opts)
    g, loc = _gsize(dev, rows * bpr)
    dev.launch(k0, g, loc, [x, L(x_off), ka, ia, kb, ib, L(n), L(B), L(bpr), L(rows * bpr),
                            desc], reads=[x], writes=[ka, ia, kb, ib], name="msort_block")
    k1 = _kernel(dev, "sort", "msort_merge", opts)
    src, dst = (ka, ia), (kb, ib)
    w = B
    g1, loc1 = _gsize(dev, rows * bpr)
    while w < n:
        dev.launch(k1, g1, loc1, [src[0], src[1], dst[0], dst[1], L(n), L(w), L(B), L(bpr),
                                  L(rows * bpr), desc], reads=[src[0], src[1]],
                   writes=[dst[0], dst[1]], name="msort_merge")
        src, dst = dst, src
        w *= 2
    return src[0], src[1], n


def searchsorted(dev: CLDevice, dtype: DType, a: Buffer, a_off: int, a_stride: int, n: int,
                 v: Buffer, v_off: int, out: Buffer, m: int, right: bool) -> None:
    """Insertion points of ``m`` contiguous values in the sorted (strided) ``a`` of ``n``."""
    if m == 0:
        return
    k = _kernel(dev, "sort", "searchsorted", _math_options(dtype))
    g, loc = _gsize(dev, m)
    dev.launch(k, g, loc, [a, L(a_off), L(a_stride), L(n), v, L(v_off), out, L(m),
                           np.int32(1 if right else 0)], reads=[a, v], writes=[out],
               name="searchsorted")


def _group(dev: CLDevice, n: int) -> int:
    """Work-group size of the per-matrix linear algebra kernels."""
    if dev.kind == "cpu":
        return 1  # PERF: on CPUs one work-item per matrix; batches spread over the cores
    L = 32
    while L < min(n * n, 256):
        L *= 2
    return min(L, dev.caps.max_work_group)


def lu_factor(dev: CLDevice, dtype: DType, a: Buffer, a_off: int, batch: int, n: int
              ) -> tuple[Buffer, Buffer]:
    """LU with partial pivoting of ``batch`` contiguous n x n matrices, in place. Returns the
    pivots (int64, batch x n) and the number of row swaps per matrix (int32)."""
    piv = dev.alloc(max(batch * n, 1) * 8)
    swaps = dev.alloc(max(batch, 1) * 4)
    if batch and n:
        L = _group(dev, n)
        k = _kernel(dev, "linalg", "lu_factor", _math_options(dtype))
        dev.launch(k, (batch * L,), (L,), [a, I64(a_off), piv, swaps, np.int32(n)],
                   reads=[a], writes=[a, piv, swaps], name="lu_factor")
    return piv, swaps


def lu_solve(dev: CLDevice, dtype: DType, lu: Buffer, lu_off: int, piv: Buffer, b: Buffer,
             b_off: int, batch: int, n: int, r: int) -> None:
    """Overwrite ``batch`` contiguous n x r right-hand sides with the solutions."""
    if batch and n and r:
        L = 1 if dev.kind == "cpu" else min(max(32, 1 << (r - 1).bit_length()), 256,
                                            dev.caps.max_work_group)
        k = _kernel(dev, "linalg", "lu_solve", _math_options(dtype))
        dev.launch(k, (batch * L,), (L,), [lu, I64(lu_off), piv, b, I64(b_off), np.int32(n),
                                           np.int32(r)], reads=[lu, piv, b], writes=[b],
                   name="lu_solve")


def cholesky(dev: CLDevice, dtype: DType, a: Buffer, a_off: int, out: Buffer, batch: int,
             n: int) -> None:
    """Lower Cholesky factors of ``batch`` contiguous n x n matrices into ``out``."""
    if batch and n:
        L = _group(dev, n)
        k = _kernel(dev, "linalg", "cholesky", _math_options(dtype))
        dev.launch(k, (batch * L,), (L,), [a, I64(a_off), out, np.int32(n)], reads=[a],
                   writes=[out], name="cholesky")



def qr(dev: CLDevice, dtype: DType, a: Buffer, a_off: int, batch: int, m: int, n: int,
       q: Buffer, qc: int) -> None:
    """Householder QR of ``batch`` contiguous m x n matrices in place (R and reflectors), and
    the first ``qc`` columns of Q into ``q`` (batch x m x qc)."""
    kmax = min(m, n)
    if not batch or not m or not n:
        return
    tau = dev.alloc(max(batch * kmax, 1) * dtype.itemsize)
    opts = _math_options(dtype)
    L = 1 if dev.kind == "cpu" else min(max(32, 1 << (max(n, qc) - 1).bit_length()), 256,
                                        dev.caps.max_work_group)
    k1 = _kernel(dev, "linalg", "qr_factor", opts)
    dev.launch(k1, (batch * L,), (L,), [a, I64(a_off), tau, np.int32(m), np.int32(n)],
               reads=[a], writes=[a, tau], name="qr_factor")
    if qc:
        k2 = _kernel(dev, "linalg", "qr_form_q", opts)
        dev.launch(k2, (batch * L,), (L,), [a, I64(a_off), tau, q, np.int32(m), np.int32(n),
                                            np.int32(qc)], reads=[a, tau], writes=[q],
                   name="qr_form_q")


def _pair_group(dev: CLDevice, n: int) -> int:
    if dev.kind == "cpu":
        return 1
    return min(max(32, 1 << max((n + 1) // 2 - 1, 0).bit_length()), 256, dev.caps.max_work_group)


def eigh_jacobi(dev: CLDevice, dtype: DType, a: Buffer, a_off: int, batch: int, n: int,
                w: Buffer, v: Buffer, tol: float, max_sweeps: int = 40) -> None:
    """Cyclic Jacobi on ``batch`` symmetric n x n matrices (lower triangles of ``a``): ``w``
    becomes diagonal (the eigenvalues), ``v`` the eigenvectors (columns)."""
    if not batch or not n:
        return
    N = n + (n & 1)
    rot = dev.alloc(batch * N * dtype.itemsize)
    L = _pair_group(dev, n)
    k = _kernel(dev, "linalg", "eigh_jacobi", _math_options(dtype))
    dev.launch(k, (batch * L,), (L,), [a, I64(a_off), w, v, rot, np.int32(n),
                                       dtype.np.type(tol), np.int32(max_sweeps)],
               reads=[a], writes=[w, v, rot], name="eigh_jacobi")


def svd_jacobi(dev: CLDevice, dtype: DType, a: Buffer, a_off: int, rs: int, cs: int,
               batch: int, m: int, n: int, u: Buffer, v: Buffer, tol: float,
               max_sweeps: int = 40) -> None:
    """One-sided Jacobi on ``batch`` m x n matrices (m >= n; element (i, j) at
    ``i * rs + j * cs``, matrices m * n apart): ``u`` gets orthogonal columns (singular
    values times left vectors), ``v`` the right vectors (columns)."""
    if not batch or not n or not m:
        return
    L = _pair_group(dev, n)
    k = _kernel(dev, "linalg", "svd_jacobi", _math_options(dtype))
    dev.launch(k, (batch * L,), (L,), [a, I64(a_off), I64(rs), I64(cs), u, v, np.int32(m),
                                       np.int32(n), dtype.np.type(tol),
                                       np.int32(max_sweeps)],
               reads=[a], writes=[u, v], name="svd_jacobi")
