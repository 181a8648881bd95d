"""Conjugate gradients in the event-chained style: every step is a kernel that returns an
event, and the next step names the events it depends on (``depends=[...]``), on an
out-of-order queue where only those lists order the work. Scalars (alpha, beta) stay on the
device; the host looks at the residual only every ``check_every`` iterations.

    python examples/cg_solve.py [--n 256] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

import clops
from clops.runtime import cltypes

GEMV = """
__kernel void gemv(__global const REAL *A, long a_off, __global const REAL *x, long x_off,
                   __global REAL *y, long y_off, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    A += a_off + i * n; x += x_off;
    REAL acc = 0;
    for (long j = 0; j < n; j++) acc += A[j] * x[j];
    y[y_off + i] = acc;
}
"""


class CGKernels:
    """gemv, dot and the two axpby updates of CG for one real type."""

    def __init__(self, ctype: str) -> None:
        self.ctype = ctype
        self.gemv = clops.kernel(GEMV, "gemv", options=[f"-DREAL={ctype}"])
        self.dot = clops.ReductionKernel(ctype, "0", "a + b", "x[i] * y[i]",
                                         f"__global const {ctype} *x, __global const {ctype} *y",
                                         name="dot")
        # x += alpha p; r -= alpha Ap with alpha = rr / pAp read on the device.
        self.update_xr = clops.ElementwiseKernel(
            f"__global const {ctype} *rr, __global const {ctype} *pAp, __global {ctype} *x, "
            f"__global {ctype} *r, __global const {ctype} *p, __global const {ctype} *Ap",
            f"{ctype} alpha = rr[0] / pAp[0]; x[i] += alpha * p[i]; r[i] -= alpha * Ap[i]",
            name="update_xr")
        # p = r + beta p with beta = rr_new / rr.
        self.update_p = clops.ElementwiseKernel(
            f"__global const {ctype} *rr_new, __global const {ctype} *rr, __global {ctype} *p, "
            f"__global const {ctype} *r",
            "p[i] = r[i] + (rr_new[0] / rr[0]) * p[i]", name="update_p")


def cg_solve(A: Any, b: Any, x: Any, *, tol: float = 1e-6, max_iter: int = 1000,
             check_every: int = 10) -> tuple[Any, int]:
    """Solve A x = b (A symmetric positive definite, tensors on one device) starting from
    ``x`` (updated in place); returns (x, iterations)."""
    dev = A.device
    n = b.shape[0]
    ctype = cltypes.storage(b.dtype)
    k = CGKernels(ctype)
    q = dev.create_queue(out_of_order=True)
    with clops.stream(q):
        r = clops.empty(n, dtype=b.dtype, device=dev)
        p = clops.empty(n, dtype=b.dtype, device=dev)
        Ap = clops.empty(n, dtype=b.dtype, device=dev)
        e_ax = k.gemv(n, None, A, x, Ap, np.int64(n))                      # Ap = A x
        sub = clops.ElementwiseKernel(
            f"__global const {ctype} *b, __global const {ctype} *Ax, __global {ctype} *r, "
            f"__global {ctype} *p", "r[i] = b[i] - Ax[i]; p[i] = r[i]", name="residual")
        e_r = sub(b, Ap, r, p, depends=[e_ax])                             # r = p = b - A x
        rr, e_rr = k.dot(r, r, depends=[e_r], return_event=True)
        bnorm = float(np.linalg.norm(b.to_numpy()))
        it = 0
        while it < max_iter:
            e_ap = k.gemv(n, None, A, p, Ap, np.int64(n), depends=[e_r])     # Ap = A p
            pAp, e_pap = k.dot(p, Ap, depends=[e_ap], return_event=True)
            e_r = k.update_xr(rr, pAp, x, r, p, Ap, depends=[e_pap, e_rr])
            rr_new, e_new = k.dot(r, r, depends=[e_r], return_event=True)
            e_r = k.update_p(rr_new, rr, p, r, depends=[e_new])
            rr, e_rr = rr_new, e_new
            it += 1
            if it % check_every == 0:
                res = clops.to_host_future(rr, wait_for=[e_rr]).result()
                if float(np.sqrt(res)) <= tol * bnorm:
                    break
    return x, it


def spd_matrix(n: int, seed: int = 0, dtype: Any = np.float64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    return (m @ m.T / n + np.eye(n)).astype(dtype)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    dev = clops.device(args.device)
    dt = np.float64 if dev.caps.fp64 else np.float32
    A_h = spd_matrix(args.n, dtype=dt)
    b_h = np.random.default_rng(1).standard_normal(args.n).astype(dt)
    A = clops.asarray(A_h, device=dev)
    b = clops.asarray(b_h, device=dev)
    x = clops.zeros(args.n, dtype=dt, device=dev)
    tol = 1e-10 if dt == np.float64 else 1e-5
    x, iters = cg_solve(A, b, x, tol=tol)
    ref = np.linalg.solve(A_h, b_h)
    err = float(np.abs(x.to_numpy() - ref).max())
    print(f"cg_solve n={args.n} {np.dtype(dt).name} on {dev}: {iters} iterations, "
          f"max error vs numpy {err:.2e}")
    return 0 if err < (1e-8 if dt == np.float64 else 1e-3) else 1


if __name__ == "__main__":
    sys.exit(main())
