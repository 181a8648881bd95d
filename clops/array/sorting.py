"""Array layer, sorting: sort and argsort along any axis through the stable sort kernels
(``kernels/sort.py``: a radix sort on CPUs, ``sort_gpu.cl``'s radix sort on GPUs); both orders
are stable, NaN sorts last (first when descending)."""

from __future__ import annotations

from ..graph import dtypes as _dt
from ..graph import ir
from ..graph.ir import prod
from ..kernels import sort as _sort
from .kernel_ops import contiguous, sort_dtype, wrap
from .manipulation import normalize_axis, permute_dims
from .tensor import Tensor


def sort_values(x: Tensor, descending: bool) -> Tensor:
    """``x`` stably sorted over its last axis (on CPUs without computing the indices)."""
    kd = sort_dtype(x.dtype)
    src = contiguous(x, kd)
    keys, P = _sort.sort_one(x.device, kd, src.buffer, src.offset, prod(x.shape[:-1]),
                             x.shape[-1], descending, False)
    out = wrap(keys, x.shape, kd, x.device, _row_strides(x.shape, P))
    return out if kd == x.dtype else Tensor(ir.cast(out._node.resolve(), x.dtype), x.device)


def sort_indices(x: Tensor, descending: bool) -> Tensor:
    """The int64 positions that stably sort ``x`` over its last axis (on CPUs without writing
    the sorted values)."""
    kd = sort_dtype(x.dtype)
    src = contiguous(x, kd)
    idx, P = _sort.sort_one(x.device, kd, src.buffer, src.offset, prod(x.shape[:-1]),
                            x.shape[-1], descending, True)
    return wrap(idx, x.shape, _dt.int64, x.device, _row_strides(x.shape, P))


def _row_strides(shape: tuple[int, ...], P: int) -> tuple[int, ...]:
    return tuple(st * P for st in ir.contiguous_strides(shape[:-1])) + (1,)


def _along_last(x: Tensor, axis: int, descending: bool, indices: bool) -> Tensor:
    """The sorted values of ``x`` along ``axis``, or (``indices``) the positions that sort it."""
    if x.dtype.kind == "c":
        raise TypeError("sort/argsort are not defined for complex tensors")
    if x.ndim == 0:
        raise ValueError("sort/argsort need at least 1 dim")
    ax = normalize_axis(axis, x.ndim)
    last = x.ndim - 1
    perm = list(range(x.ndim))
    perm[ax], perm[last] = perm[last], perm[ax]
    xt = permute_dims(x, perm) if ax != last else x
    out = sort_indices(xt, descending) if indices else sort_values(xt, descending)
    return permute_dims(out, perm) if ax != last else out


def sort(x: Tensor, /, *, axis: int = -1, descending: bool = False, stable: bool = True
         ) -> Tensor:
    """``x`` sorted along ``axis`` (always stable).

    >>> clops.sort(clops.asarray([3, 1, 2]))
    Tensor([1, 2, 3], dtype=int64, device=opencl:cpu:0)
    """
    return _along_last(x, axis, descending, False)


def argsort(x: Tensor, /, *, axis: int = -1, descending: bool = False, stable: bool = True
            ) -> Tensor:
    """Indices (int64) that sort ``x`` along ``axis`` (always stable: equal elements keep
    their order, in both directions).

    >>> clops.argsort(clops.asarray([3, 1, 2]))
    Tensor([1, 2, 0], dtype=int64, device=opencl:cpu:0)
    """
    return _along_last(x, axis, descending, True)
