"""Array layer, reductions: sum, prod, max, min, mean, var, std, all, any over any axes, with
the Array API's accumulation dtypes. Each becomes one fused reduce node."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from ..graph import dtypes as _dt
from ..graph import ir
from ..graph.ir import prod
from ._ops import register
from .elementwise import apply
from .kernel_ops import scan_last
from .manipulation import concat, moveaxis, normalize_axes, normalize_axis
from .tensor import Tensor, same_device

Axis = int | Sequence[int] | None


def _finish(x: Tensor, node: ir.Node, axes: tuple[int, ...], keepdims: bool) -> Tensor:
    if not keepdims:  # the reduced axes dropped: a view of the reduce node (reshape's, unchecked)
        new = tuple(n for i, n in enumerate(x.shape) if i not in axes)
        node = ir.movement(node, lambda v: v.reshape(new))
    return Tensor(node, x.device)


def _sum_dtype(x: Tensor, dtype: Any) -> _dt.DType:
    if dtype is not None:
        return _dt.to_dtype(dtype)
    d = x.dtype
    if d.kind == "b":
        return _dt.int64
    if d.kind == "i" and d.itemsize < 8:
        return _dt.int64
    if d.kind == "u" and d.itemsize < 8:
        return _dt.uint64
    return d


def _reduce(op: str, x: Tensor, axis: Axis, keepdims: bool, dtype: _dt.DType) -> Tensor:
    axes = normalize_axes(axis, x.ndim)
    src = ir.cast(x._node.resolve(), dtype)
    if x.ndim == 0 or not axes:  # axis=(): nothing is reduced
        return Tensor(ir.ew("identity", [src], dtype), x.device)
    return _finish(x, ir.reduce(op, src, axes, dtype), axes, keepdims)


@register
def sum(x: Tensor, /, *, axis: Axis = None, dtype: Any = None, keepdims: bool = False
        ) -> Tensor:
    """Sum over ``axis`` (all axes when None)."""
    return _reduce("sum", x, axis, keepdims, _sum_dtype(x, dtype))


@register
def prod_(x: Tensor, /, *, axis: Axis = None, dtype: Any = None, keepdims: bool = False
          ) -> Tensor:
    """Product over ``axis``."""
    return _reduce("prod", x, axis, keepdims, _sum_dtype(x, dtype))


@register
def max(x: Tensor, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Maximum over ``axis`` (NaN propagates)."""
    if x.dtype.kind == "c":
        raise TypeError("max is not defined for complex tensors")
    if builtins.any(x.shape[a] == 0 for a in normalize_axes(axis, x.ndim)):
        raise ValueError("max of an empty axis has no identity; give a non-empty tensor")
    return _reduce("max", x, axis, keepdims, x.dtype)


@register
def min(x: Tensor, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Minimum over ``axis`` (NaN propagates)."""
    if x.dtype.kind == "c":
        raise TypeError("min is not defined for complex tensors")
    if builtins.any(x.shape[a] == 0 for a in normalize_axes(axis, x.ndim)):
        raise ValueError("min of an empty axis has no identity; give a non-empty tensor")
    return _reduce("min", x, axis, keepdims, x.dtype)


def all(x: Tensor, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    return _reduce("all", x, axis, keepdims, _dt.bool_)


def any(x: Tensor, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    return _reduce("any", x, axis, keepdims, _dt.bool_)


def _float_check(x: Tensor, fn: str) -> None:
    if x.dtype.kind not in "fc":
        raise TypeError(f"{fn} needs a floating-point tensor, not {x.dtype}; convert with "
                        "astype first")


@register
def mean(x: Tensor, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Arithmetic mean over ``axis`` (one fused kernel: sum, then divide)."""
    _float_check(x, "mean")
    axes = normalize_axes(axis, x.ndim)
    n = prod([x.shape[a] for a in axes])
    src = x._node.resolve()
    if x.ndim == 0 or not axes:
        return Tensor(ir.ew("identity", [src], x.dtype), x.device)
    red = ir.reduce("sum", src, axes, x.dtype)
    div = ir.ew("divide", [red, ir.const(float(n) if n else float("nan"), x.dtype, red.shape)],
                x.dtype)
    return _finish(x, div, axes, keepdims)


def var(x: Tensor, /, *, axis: Axis = None, correction: int | float = 0.0,
        keepdims: bool = False) -> Tensor:
    """Variance with ``correction`` (1 for the unbiased estimate); one fused kernel."""
    _float_check(x, "var")
    axes = normalize_axes(axis, x.ndim)
    n = prod([x.shape[a] for a in axes])
    src = x._node.resolve()
    if x.ndim == 0 or not axes:  # each element alone: 0 / (1 - correction)
        shp = src.shape
        src = ir.movement(src, lambda v: v.reshape(shp + (1,)))
        axes = (len(shp),)
        n = 1
    red = ir.reduce("sum", src, axes, x.dtype)
    mu = ir.ew("divide", [red, ir.const(float(n), x.dtype, red.shape)], x.dtype)
    mu_b = ir.movement(mu, lambda v: v.expand(src.shape))
    d = ir.ew("subtract", [src, mu_b], x.dtype)
    if x.dtype.kind == "c":
        sq = ir.ew("multiply", [d, ir.ew("conj", [d], x.dtype)], x.dtype)
        sq = ir.ew("real", [sq], _dt.real_of(x.dtype))
    else:
        sq = ir.ew("multiply", [d, d], x.dtype)
    rd = sq.dtype
    ss = ir.reduce("sum", sq, axes, rd)
    denom = n - correction
    out = ir.ew("divide", [ss, ir.const(float(denom) if denom > 0 else float("nan"), rd,
                                         ss.shape)], rd)
    if x.ndim == 0 or axes == (x.ndim,):
        return Tensor(ir.movement(out, lambda v: v.reshape(x.shape)), x.device)
    return _finish(x, out, axes, keepdims)


def std(x: Tensor, /, *, axis: Axis = None, correction: int | float = 0.0,
        keepdims: bool = False) -> Tensor:
    """Standard deviation (square root of ``var``)."""
    v = var(x, axis=axis, correction=correction, keepdims=keepdims)
    return Tensor(ir.ew("sqrt", [v._node.resolve()], v.dtype), x.device)


def _cumulative(op: str, x: Tensor, axis: int | None, dtype: Any, include_initial: bool
                ) -> Tensor:
    if axis is None:
        if x.ndim > 1:
            raise ValueError(f"cumulative_{op}: axis is required for a tensor of {x.ndim} dims")
        axis = 0
    if x.ndim == 0:
        raise ValueError(f"cumulative_{op} needs at least 1 dim")
    ax = normalize_axis(axis, x.ndim)
    d = _sum_dtype(x, dtype)
    xt = moveaxis(x, ax, -1) if ax != x.ndim - 1 else x
    out = scan_last(xt, op, d, include_initial)
    return moveaxis(out, -1, ax) if ax != x.ndim - 1 else out


def cumulative_sum(x: Tensor, /, *, axis: int | None = None, dtype: Any = None,
                   include_initial: bool = False) -> Tensor:
    """Running sums along ``axis`` (a scan kernel), with the accumulation dtypes of ``sum``.

    >>> clops.cumulative_sum(clops.asarray([1, 2, 3]))
    Tensor([1, 3, 6], dtype=int64, device=opencl:cpu:0)
    """
    return _cumulative("sum", x, axis, dtype, include_initial)


def cumulative_prod(x: Tensor, /, *, axis: int | None = None, dtype: Any = None,
                    include_initial: bool = False) -> Tensor:
    """Running products along ``axis``.

    >>> clops.cumulative_prod(clops.asarray([1, 2, 3]))
    Tensor([1, 2, 6], dtype=int64, device=opencl:cpu:0)
    """
    return _cumulative("prod", x, axis, dtype, include_initial)


def diff(x: Tensor, /, *, axis: int = -1, n: int = 1, prepend: Tensor | None = None,
         append: Tensor | None = None) -> Tensor:
    """``n``-th discrete difference along ``axis`` (``prepend``/``append`` joined first).

    >>> clops.diff(clops.asarray([1, 4, 9]))
    Tensor([3, 5], dtype=int64, device=opencl:cpu:0)
    """
    same_device("diff", x, prepend, append)
    if x.ndim == 0:
        raise ValueError("diff needs at least 1 dim")
    if n < 0:
        raise ValueError("diff: n must be >= 0")
    ax = normalize_axis(axis, x.ndim)
    parts = [p for p in (prepend, x, append) if p is not None]
    out = concat(parts, axis=ax) if len(parts) > 1 else x
    pre = (slice(None),) * ax
    for _ in range(n):
        fn = "not_equal" if out.dtype.kind == "b" else "subtract"
        out = apply(fn, out[pre + (slice(1, None),)], out[pre + (slice(None, -1),)])
    return out
