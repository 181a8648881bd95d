"""Array layer, sorting: sort and argsort along any axis through the stable bitonic kernel
(``kernels/sort.cl``); both orders are stable, NaN sorts last (first when descending)."""

from __future__ import annotations

from .kernel_ops import sort_last
from .manipulation import normalize_axis, permute_dims
from .tensor import Tensor


def _sorted(x: Tensor, axis: int, descending: bool) -> tuple[Tensor, Tensor]:
    if x.dtype.kind == "c":
        raise TypeError("sort/argsort are not defined for complex tensors")
    if x.ndim == 0:
        raise ValueError("sort/argsort need at least 1 dim")
    ax = normalize_axis(axis, x.ndim)
    last = x.ndim - 1
    perm = list(range(x.ndim))
    perm[ax], perm[last] = perm[last], perm[ax]
    xt = permute_dims(x, perm) if ax != last else x
    vals, idx = sort_last(xt, descending)
    if ax != last:
        vals, idx = permute_dims(vals, perm), permute_dims(idx, perm)
    return vals, idx


def sort(x: Tensor, /, *, axis: int = -1, descending: bool = False, stable: bool = True
         ) -> Tensor:
    """``x`` sorted along ``axis`` (always stable).

    >>> clops.sort(clops.asarray([3, 1, 2]))
    Tensor([1, 2, 3], dtype=int64, device=opencl:cpu:0)
    """
    return _sorted(x, axis, descending)[0]


def argsort(x: Tensor, /, *, axis: int = -1, descending: bool = False, stable: bool = True
            ) -> Tensor:
    """Indices (int64) that sort ``x`` along ``axis`` (always stable: equal elements keep
    their order, in both directions).

    >>> clops.argsort(clops.asarray([3, 1, 2]))
    Tensor([1, 2, 0], dtype=int64, device=opencl:cpu:0)
    """
    return _sorted(x, axis, descending)[1]
