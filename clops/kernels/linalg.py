"""Kernels, linear algebra: LU with partial pivoting and its solve, Cholesky, Householder QR,
and Jacobi eigen- and singular value decompositions of batches of small matrices
(``linalg.cl``), a work-group (GPUs) or a work-item (CPUs) per matrix."""

from __future__ import annotations

import numpy as np

from ..graph.dtypes import DType
from ..runtime import CLDevice
from ..runtime.pool import Buffer
from .launch import math_options, shared_kernel

I64 = np.int64


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
        k = shared_kernel(dev, "linalg", "lu_factor", math_options(dtype))
        dev.launch(k, (batch * L,), (L,), [a, I64(a_off), piv, swaps, np.int32(n)],
                   reads=[a], writes=[a, piv, swaps], name="lu_factor")
    return piv, swaps


def lu_solve(dev: CLDevice, dtype: DType, lu: Buffer, lu_off: int, piv: Buffer, b: Buffer,
             b_off: int, batch: int, n: int, r: int) -> None:
    """Overwrite ``batch`` contiguous n x r right-hand sides with the solutions."""
    if batch and n and r:
        L = 1 if dev.kind == "cpu" else min(max(32, 1 << (r - 1).bit_length()), 256,
                                            dev.caps.max_work_group)
        k = shared_kernel(dev, "linalg", "lu_solve", math_options(dtype))
        dev.launch(k, (batch * L,), (L,), [lu, I64(lu_off), piv, b, I64(b_off), np.int32(n),
                                           np.int32(r)], reads=[lu, piv, b], writes=[b],
                   name="lu_solve")


def cholesky(dev: CLDevice, dtype: DType, a: Buffer, a_off: int, out: Buffer, batch: int,
             n: int) -> None:
    """Lower Cholesky factors of ``batch`` contiguous n x n matrices into ``out``."""
    if batch and n:
        L = _group(dev, n)
        k = shared_kernel(dev, "linalg", "cholesky", math_options(dtype))
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
    opts = math_options(dtype)
    L = 1 if dev.kind == "cpu" else min(max(32, 1 << (max(n, qc) - 1).bit_length()), 256,
                                        dev.caps.max_work_group)
    k1 = shared_kernel(dev, "linalg", "qr_factor", opts)
    dev.launch(k1, (batch * L,), (L,), [a, I64(a_off), tau, np.int32(m), np.int32(n)],
               reads=[a], writes=[a, tau], name="qr_factor")
    if qc:
        k2 = shared_kernel(dev, "linalg", "qr_form_q", opts)
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
    k = shared_kernel(dev, "linalg", "eigh_jacobi", math_options(dtype))
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
    k = shared_kernel(dev, "linalg", "svd_jacobi", math_options(dtype))
    dev.launch(k, (batch * L,), (L,), [a, I64(a_off), I64(rs), I64(cs), u, v, np.int32(m),
                                       np.int32(n), dtype.np.type(tol),
                                       np.int32(max_sweeps)],
               reads=[a], writes=[u, v], name="svd_jacobi")
