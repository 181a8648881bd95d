"""Kernels, norms: launches of ``norm.cl`` (RMSNorm, LayerNorm, the per-head q/k norm, the
residual add with its post-norm, and rows to float16 for tensor-core products): a work-group
per row on GPUs, a work-item per row on CPUs."""

from __future__ import annotations

from ..runtime import CLDevice
from ..runtime.pool import Buffer
from . import launch
from .launch import Launch, f32, i32, kernel, pow2_at_most


def _row_lsize(dev: CLDevice, k: int) -> int:
    if launch.is_cpu(dev):
        return 1
    return min(256, pow2_at_most(dev.caps.max_work_group), pow2_at_most(max(k // 4, 1)))


def rmsnorm(dev: CLDevice, y: Buffer, x: Buffer, x_off: int, ldx: int, w: Buffer, *, m: int,
            k: int, eps: float) -> Launch:
    """y[i, :] = RMSNorm(x[i, :k]) * w for i < m (rows of x ``ldx`` apart)."""
    ls = _row_lsize(dev, k)
    knl = kernel(dev, "norm", "rmsnorm", LSIZE=ls)
    return Launch(knl, (m * ls,), (ls,), [y, x, i32(x_off), i32(ldx), w, i32(k), f32(eps)],
                  [x, w], [y], "rmsnorm")


def layernorm(dev: CLDevice, y: Buffer, x: Buffer, x_off: int, ldx: int, w: Buffer, b: Buffer,
              *, m: int, k: int, eps: float) -> Launch:
    """y[i, :] = LayerNorm(x[i, :k]) * w + b for i < m (rows of x ``ldx`` apart)."""
    ls = _row_lsize(dev, k)
    knl = kernel(dev, "norm", "layernorm", LSIZE=ls)
    return Launch(knl, (m * ls,), (ls,),
                  [y, x, i32(x_off), i32(ldx), w, b, i32(k), f32(eps)], [x, w, b], [y],
                  "layernorm")


def qk_norm(dev: CLDevice, x: Buffer, ld: int, *, m: int, nq: int, lq: int, nk: int, lk: int,
            wq: Buffer, wk: Buffer, eps: float) -> Launch:
    """RMSNorm, in place, of nq query groups of lq values and nk key groups of lk values at the
    start of each of m rows ``ld`` apart (per head: lq = lk = head_dim; whole: one group each)."""
    ls = _row_lsize(dev, min(lq, lk))
    knl = kernel(dev, "norm", "qk_norm", LSIZE=ls)
    return Launch(knl, ((nq + nk) * ls, m), (ls, 1),
                  [x, i32(ld), i32(nq), i32(lq), i32(lk), wq, wk, f32(eps)], [x, wq, wk], [x],
                  "qk_norm")


def residual(dev: CLDevice, x: Buffer, t: Buffer, w: Buffer | None, *, m: int, k: int,
             eps: float, scale: float) -> Launch:
    """x += scale * t, or scale * rmsnorm(t) * w (a post-norm) when ``w`` is given."""
    ls = _row_lsize(dev, k)
    knl = kernel(dev, "norm", "residual", LSIZE=ls)
    reads = [t] + ([w] if w is not None else [])
    return Launch(knl, (m * ls,), (ls,), [x, t, w if w is not None else t, i32(k), f32(eps),
                                          f32(scale), i32(w is not None)], reads + [x], [x],
                  "residual")



def half_rows(dev: CLDevice, y: Buffer, x: Buffer, x_off: int, ldx: int, *, k: int, m: int,
              norm: tuple[Buffer, float] | None = None, glu: bool = False) -> Launch:
    """y[i, :k] = float16 of x's row i, or of RMSNorm(row) * weight (``norm=(weight, eps)``),
    or of silu(row[:k]) * row[k:2k] (``glu``)."""
    if norm is not None and glu:
        raise ValueError("half_rows: norm= and glu= do not go together")
    if k % 4:
        raise ValueError(f"half_rows: rows of a multiple of 4 values, not {k}")
    ls = _row_lsize(dev, k)
    # (float4 loads in rounds of NV a work-item, a round's all issued before any is used)
    knl = kernel(dev, "norm", "half_rows", LSIZE=ls, NV=min(8, -(-k // (4 * ls))),
                 MODE=1 if norm is not None else 2 if glu else 0)
    nw = norm[0] if norm is not None else x
    return Launch(knl, (m * ls,), (ls,), [y, x, i32(x_off), i32(ldx), nw, i32(k),
                                          f32(norm[1] if norm is not None else 0.0)],
                  [x] + ([norm[0]] if norm is not None else []), [y], "half_rows")


def split_norm_half(dev: CLDevice, y: Buffer, x: Buffer, x_off: int, ldx: int, parts: Buffer,
                    splits: int, w: Buffer, *, k: int, m: int, eps: float) -> Launch:
    """x[i, :k] += the sum, in order, of a split product's slices parts [splits][m][k], then
    y[i, :] = float16 of RMSNorm(x[i, :k]) * w (half_rows with ``norm=(w, eps)``) for i < m."""
    if k % 4:
        raise ValueError(f"split_norm_half: rows of a multiple of 4 values, not {k}")
    ls = _row_lsize(dev, k)
    knl = kernel(dev, "norm", "split_norm_half", LSIZE=ls)
    return Launch(knl, (m * ls,), (ls,), [x, i32(x_off), i32(ldx), parts, i32(splits), y, w,
                                          i32(k), f32(eps)],
                  [x, parts, w], [x, y], "split_norm_half")
