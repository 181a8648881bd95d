"""Array layer, set functions: unique_all, unique_counts, unique_inverse, unique_values. The
flattened input is sorted (stable kernel), run starts are flagged by a fused comparison of
neighbours, compacted (one count read back), and the rest is gathers, scans and scatters. NaNs
are all distinct (they never compare equal), as the standard asks."""

from __future__ import annotations

from typing import NamedTuple

from ..graph import dtypes as _dt
from .elementwise import apply
from .kernel_ops import flat_nonzero, new, scan_last, scatter_flat, sort_last
from .manipulation import concat, reshape
from .tensor import Tensor


class UniqueAllResult(NamedTuple):
    values: Tensor
    indices: Tensor
    inverse_indices: Tensor
    counts: Tensor


class UniqueCountsResult(NamedTuple):
    values: Tensor
    counts: Tensor


class UniqueInverseResult(NamedTuple):
    values: Tensor
    inverse_indices: Tensor


def _sorted_complex(flat: Tensor) -> tuple[Tensor, Tensor]:
    """Complex values in lexicographic (real, imaginary) order, and the permutation: a stable
    sort by the imaginary parts, then a stable sort of those by the real parts."""
    from .advanced_indexing import take

    _, by_imag = sort_last(apply("imag", flat), False)
    _, by_real = sort_last(take(apply("real", flat), by_imag), False)
    perm = take(by_imag, by_real)
    return take(flat, perm), perm


def _runs(x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(sorted values, sort permutation, run-start flags, run starts) of flattened ``x``."""
    flat = reshape(x, (-1,))
    # NOTE: complex values have no natural order; any order that makes equal values neighbours
    # will do (the standard leaves the order of the unique values unspecified)
    vals, perm = _sorted_complex(flat) if x.dtype.kind == "c" else sort_last(flat, False)
    n = flat.size
    flags = new((n,), _dt.bool_, x.device)
    if n:
        flags[0] = True
        if n > 1:
            flags[1:] = apply("not_equal", vals[1:], vals[:-1])
    starts = flat_nonzero(flags, "unique (the number of distinct values)")
    return vals, perm, flags, starts


def _counts(starts: Tensor, n: int) -> Tensor:
    from .creation import asarray

    ends = concat([starts[1:], asarray([n], dtype=_dt.int64, device=starts.device)])
    return apply("subtract", ends, starts)


def _inverse(x: Tensor, perm: Tensor, flags: Tensor) -> Tensor:
    run = apply("subtract", scan_last(flags, "sum", _dt.int64), 1)
    inv = new((x.size,), _dt.int64, x.device)
    scatter_flat(inv, perm, run)
    return reshape(inv, x.shape)


def unique_values(x: Tensor, /) -> Tensor:
    """The distinct values of ``x``, sorted, as a 1-d tensor.

    >>> clops.unique_values(clops.asarray([3, 1, 3]))
    Tensor([1, 3], dtype=int64, device=opencl:cpu:0)
    """
    from .advanced_indexing import take

    vals, _, _, starts = _runs(x)
    return take(vals, starts)


def unique_counts(x: Tensor, /) -> UniqueCountsResult:
    """Distinct values and how often each occurs.

    >>> clops.unique_counts(clops.asarray([3, 1, 3])).counts
    Tensor([1, 2], dtype=int64, device=opencl:cpu:0)
    """
    from .advanced_indexing import take

    vals, _, _, starts = _runs(x)
    return UniqueCountsResult(take(vals, starts), _counts(starts, x.size))


def unique_inverse(x: Tensor, /) -> UniqueInverseResult:
    """Distinct values and, for each element of ``x``, the index of its value among them.

    >>> clops.unique_inverse(clops.asarray([3, 1, 3])).inverse_indices
    Tensor([1, 0, 1], dtype=int64, device=opencl:cpu:0)
    """
    from .advanced_indexing import take

    vals, perm, flags, starts = _runs(x)
    return UniqueInverseResult(take(vals, starts), _inverse(x, perm, flags))


def unique_all(x: Tensor, /) -> UniqueAllResult:
    """Distinct values, the index of each one's first occurrence, the inverse indices and the
    counts.

    >>> clops.unique_all(clops.asarray([3, 1, 3])).indices
    Tensor([1, 0], dtype=int64, device=opencl:cpu:0)
    """
    from .advanced_indexing import take

    vals, perm, flags, starts = _runs(x)
    return UniqueAllResult(take(vals, starts), take(perm, starts), _inverse(x, perm, flags),
                           _counts(starts, x.size))


