"""Array layer, reductions: sum, prod, max, min, mean, var, std, all, any over any axes, with
the Array API's accumulation dtypes. Each becomes one fused reduce node."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from ..graph import dtypes as _dt
from ..graph import ir
from ..graph.ir import prod
from .manipulation import normalize_axes, reshape
from .tensor import Tensor

Axis = int | Sequence[int] | None


def _finish(x: Tensor, node: ir.Node, axes: tuple[int, ...], keepdims: bool) -> Tensor:
    out = Tensor(node, x.device)
    if not keepdims:
        out = reshape(out, [n for i, n in enumerate(x.shape) if i not in axes])
    return out


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
    if x.ndim == 0:
        return Tensor(ir.ew("identity", [src], dtype), x.device)
    return _finish(x, ir.reduce(op, src, axes, dtype), axes, keepdims)


def sum(x: Tensor, /, *, axis: Axis = None, dtype: Any = None, keepdims: bool = False
        ) -> Tensor:
    """Sum over ``axis`` (all axes when None)."""
    return _reduce("sum", x, axis, keepdims, _sum_dtype(x, dtype))


def prod_(x: Tensor, /, *, axis: Axis = None, dtype: Any = None, keepdims: bool = False
          ) -> Tensor:
    """Product over ``axis``."""
    return _reduce("prod", x, axis, keepdims, _sum_dtype(x, dtype))


def max(x: Tensor, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Maximum over ``axis`` (NaN propagates)."""
    if x.dtype.kind == "c":
        raise TypeError("max is not defined for complex tensors")
    if x.size == 0 or builtins.any(x.shape[a] == 0 for a in normalize_axes(axis, x.ndim)):
        raise ValueError("max of an empty axis has no identity; give a non-empty tensor")
    return _reduce("max", x, axis, keepdims, x.dtype)


def min(x: Tensor, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Minimum over ``axis`` (NaN propagates)."""
    if x.dtype.kind == "c":
        raise TypeError("min is not defined for complex tensors")
    if x.size == 0 or builtins.any(x.shape[a] == 0 for a in normalize_axes(axis, x.ndim)):
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


def mean(x: Tensor, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Arithmetic mean over ``axis`` (one fused kernel: sum, then divide)."""
    _float_check(x, "mean")
    axes = normalize_axes(axis, x.ndim)
    n = prod([x.shape[a] for a in axes])
    src = x._node.resolve()
    if x.ndim == 0:
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
    if x.ndim == 0:
        src = ir.movement(src, lambda v: v.reshape((1,)))
        axes = (0,)
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
    if x.ndim == 0:
        return Tensor(ir.movement(out, lambda v: v.reshape(())), x.device)
    return _finish(x, out, axes, keepdims)


def std(x: Tensor, /, *, axis: Axis = None, correction: int | float = 0.0,
        keepdims: bool = False) -> Tensor:
    """Standard deviation (square root of ``var``)."""
    v = var(x, axis=axis, correction=correction, keepdims=keepdims)
    return Tensor(ir.ew("sqrt", [v._node.resolve()], v.dtype), x.device)
