"""Array layer, searching: argmax/argmin (on CPUs, of float32 along the last axis or a leading
one whose last a strip width divides: one arg reduction, long rows in chunks; else one fused
kernel each: the extreme, then the first index holding it),
nonzero (a scan and a compaction kernel), searchsorted (binary search
kernel), count_nonzero and where."""

from __future__ import annotations

import numpy as np

from ..compiler.lower import arg_reduce_native, arg_row_chunks
from ..graph import dtypes as _dt
from ..graph import ir
from ._ops import OPS
from .creation import asarray, full
from .elementwise import _scalar_dtype, apply, where
from .kernel_ops import flat_nonzero, gather_flat, searchsorted_flat
from .manipulation import normalize_axis, reshape
from .statistics import sum as _sum
from .tensor import Tensor, same_device

__all__ = ["argmax", "argmin", "count_nonzero", "nonzero", "searchsorted", "where"]


def _arg_extreme(op: str, x: Tensor, axis: int | None, keepdims: bool) -> Tensor:
    if x.dtype.kind == "c":
        raise TypeError(f"arg{op} is not defined for complex tensors")
    src_t = x
    if axis is None:
        src_t = reshape(x, (-1,))
        ax = 0
    else:
        ax = normalize_axis(axis, x.ndim)
    if src_t.ndim == 0:
        src_t = reshape(src_t, (1,))
    if src_t.shape[ax] == 0:
        raise ValueError(f"arg{op} of an empty axis")
    src = src_t._node.resolve()
    shape = src.shape
    if arg_reduce_native(x.device, x.dtype, shape, ax):
        # PERF: one pass, the best value and its position per vector lane (CPUs, float32):
        # argmax of 2^24 float32 31 -> 7.0 ms, of 4096x4096 rows 15.3 -> 3.6 (Intel's runtime,
        # alternating rounds; numpy 4-5). Over a leading axis on column strips (two passes
        # before, a work-item per output): argmax of 256^3 over axis 1 110.5 -> 7.5 ms a call
        # on Intel's runtime, 26.2 -> 5.9 on PoCL 3.1 (numpy 34-36), over axis 0 139.4 -> 7.8,
        # 60.2 -> 7.1 (numpy 99-224)
        rows = ir.prod(shape) // shape[ax]
        k = arg_row_chunks(x.device, rows, shape[ax]) if ax == src_t.ndim - 1 and \
            src.op == "load" and src_t.strides == ir.contiguous_strides(shape) else 0
        if k:
            return _arg_shape(_arg_chunked(op, src_t, k), x, axis, ax, keepdims)
        red = Tensor(ir.reduce(f"arg{op}", src, (ax,), _dt.int64), x.device)
        return _arg_shape(red, x, axis, ax, keepdims)
    m = ir.reduce(op, src, (ax,))
    mb = ir.movement(m, lambda v: v.expand(shape))
    cond = ir.ew("equal", [src, mb], _dt.bool_)
    if x.dtype.kind == "f":
        cond = ir.ew("logical_or", [cond, ir.ew("isnan", [src], _dt.bool_)], _dt.bool_)
    idx = ir.iota(ax, shape, _dt.int64)
    sel = ir.ew("where", [cond, idx, ir.const(shape[ax], _dt.int64, shape)], _dt.int64)
    red = Tensor(ir.reduce("min", sel, (ax,), _dt.int64), x.device)
    return _arg_shape(red, x, axis, ax, keepdims)


def _arg_chunked(op: str, x: Tensor, k: int) -> Tensor:
    """``arg{op}`` along the last axis of the realized, contiguous ``x``, each row cut into
    ``k`` chunks (one pass over ``x``; every CPU core takes some): the chunks' positions, the
    values there (a gather), then the first chunk holding the extreme (or a NaN), as the
    two-pass form does. PERF (argmax of 2^24 float32, a row on one core before, ms a call):
    4.95 -> 4.37 on Intel's runtime, 17.5 -> 4.9 on PoCL 3.1 (numpy 3.4-3.6; the machine
    loaded: the argmax kernel alone 2.0-2.2 ms at quiet moments, numpy's call 3.4)."""
    lead, n = x.shape[:-1], x.shape[-1]
    m = n // k
    shape = (*lead, k)
    parts = reshape(x, (*lead, k, m))._node.resolve()
    pos = Tensor(ir.reduce(f"arg{op}", parts, (len(lead) + 1,), _dt.int64), x.device)
    at = apply("add", reshape(pos, shape),
               apply("multiply", Tensor(ir.iota(len(lead), shape, _dt.int64), x.device), m))
    off = at
    for d, st in enumerate(ir.contiguous_strides(lead)):
        off = apply("add", off, apply("multiply", Tensor(ir.iota(d, shape, _dt.int64),
                                                         x.device), st * n))
    vn = gather_flat(x, off)._node.resolve()
    best = ir.movement(ir.reduce(op, vn, (len(lead),)), lambda v: v.expand(shape))
    cond = ir.ew("logical_or", [ir.ew("equal", [vn, best], _dt.bool_),
                                ir.ew("isnan", [vn], _dt.bool_)], _dt.bool_)
    sel = ir.ew("where", [cond, at._node.resolve(), ir.const(n, _dt.int64, shape)], _dt.int64)
    return Tensor(ir.reduce("min", sel, (len(lead),), _dt.int64), x.device)


def _arg_shape(red: Tensor, x: Tensor, axis: int | None, ax: int, keepdims: bool) -> Tensor:
    """The reduction ``red`` of ``x`` over ``axis`` (None: all, flattened; ``ax``: the axis
    reduced) shaped as the result of ``argmax``."""
    if keepdims:
        return reshape(red, (1,) * x.ndim) if axis is None else red
    out_shape = () if axis is None else tuple(n for i, n in enumerate(x.shape) if i != ax)
    return reshape(red, out_shape)


def argmax(x: Tensor, /, *, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Index of the first maximum (NaN counts as the maximum), over the flattened tensor when
    ``axis`` is None.

    >>> clops.argmax(clops.asarray([1, 5, 5])).item()
    1
    """
    return _arg_extreme("max", x, axis, keepdims)


def argmin(x: Tensor, /, *, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Index of the first minimum (NaN counts as the minimum).

    >>> clops.argmin(clops.asarray([3, 1, 1])).item()
    1
    """
    return _arg_extreme("min", x, axis, keepdims)


def count_nonzero(x: Tensor, /, *, axis: int | tuple[int, ...] | None = None,
                  keepdims: bool = False) -> Tensor:
    """Number of nonzero elements over ``axis`` (int64).

    >>> clops.count_nonzero(clops.asarray([0, 1, 2])).item()
    2
    """
    return _sum(apply("not_equal", x, False if x.dtype.kind == "b" else 0), axis=axis,
                keepdims=keepdims, dtype=_dt.int64)


def nonzero(x: Tensor, /) -> tuple[Tensor, ...]:
    """Indices of the nonzero elements, one int64 tensor per axis (the count is read back to
    size them).

    >>> clops.nonzero(clops.asarray([0, 3, 0, 4]))[0]
    Tensor([1, 3], dtype=int64, device=opencl:cpu:0)
    """
    return nonzero_of(x, "nonzero")


def nonzero_of(x: Tensor, what: str) -> tuple[Tensor, ...]:
    """``nonzero(x)`` for ``what`` (named where ``clops.jit`` refuses it)."""
    if x.ndim == 0:
        raise ValueError("nonzero of a 0-d tensor is not defined; use nonzero(x[None])")
    flags = apply("not_equal", x, False if x.dtype.kind == "b" else 0)
    flat = flat_nonzero(flags, what)
    if x.ndim == 1:
        return (flat,)
    out = []
    strides = ir.contiguous_strides(x.shape)
    for n, st in zip(x.shape, strides):
        out.append(apply("remainder", apply("floor_divide", flat, st), n).realize())
    return tuple(out)


def _scalar_operand(x1: Tensor, value: object) -> Tensor | int:
    """A Python scalar ``x2`` of searchsorted as a 0-d tensor, or the answer itself (0 or
    ``len(x1)``) for an int outside the range of ``x1``'s integer dtype."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"searchsorted: x2 must be a Tensor or a Python int or float, not "
                        f"{type(value).__name__}")
    d = _scalar_dtype(value, x1.dtype)
    if d.is_int and isinstance(value, int):
        info = np.iinfo(d.np)
        if value < info.min:
            return 0
        if value > info.max:
            return x1.shape[0]
    return asarray(value, dtype=d, device=x1.device)


def searchsorted(x1: Tensor, x2: Tensor | int | float, /, *, side: str = "left",
                 sorter: Tensor | None = None) -> Tensor:
    """Indices where ``x2``'s elements would be inserted in the sorted 1-d ``x1`` to keep it
    sorted (NaN is the largest value). A Python scalar ``x2`` takes ``x1``'s dtype where its
    kind fits (as in arithmetic) and gives a 0-d result.

    >>> clops.searchsorted(clops.asarray([1.0, 2.0, 3.0]), clops.asarray([2.5]))
    Tensor([2], dtype=int64, device=opencl:cpu:0)
    """
    same_device("searchsorted", x1, x2, sorter)
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', not {side!r}")
    if x1.ndim != 1:
        raise ValueError("searchsorted: x1 must be 1-d")
    if not isinstance(x1, Tensor):
        raise TypeError(f"searchsorted: x1 must be a Tensor, not {type(x1).__name__}")
    if not isinstance(x2, Tensor):
        x2 = _scalar_operand(x1, x2)
        if isinstance(x2, int):  # beyond every value x1's dtype holds
            return full((), x2, dtype=_dt.int64, device=x1.device)
    if x1.dtype.kind == "c" or x2.dtype.kind == "c":
        raise TypeError("searchsorted is not defined for complex tensors")
    if sorter is not None:
        x1 = OPS.take(x1, sorter)
    return searchsorted_flat(x1, x2, side == "right")
