"""Array layer, set functions: unique_all, unique_counts, unique_inverse, unique_values and
isin. For unique_*, the flattened input is sorted (stable kernel), run starts are flagged by a
fused comparison of neighbours, compacted (one count read back), and the rest is gathers, scans
and scatters. NaNs are all distinct (they never compare equal), as the standard asks. On CPU
devices, unique_values and unique_counts of a long input look for its distinct values by
hashing, and sort only those (the whole input where a NaN or too many values stop that)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..graph import dtypes as _dt
from ..graph import ir
from ..kernels import sort as sort_kernels
from .advanced_indexing import take
from .creation import asarray, full, zeros
from .elementwise import _scalar_dtype, apply
from .kernel_ops import (
    contiguous,
    data_dependent,
    flat_nonzero,
    gather_flat,
    kernel_dtype,
    new,
    scan_last,
    scatter_flat,
    searchsorted_flat,
    sort_dtype,
    sort_last,
    wrap,
)
from .manipulation import concat, reshape
from .sorting import sort_values
from .statistics import any as any_
from .tensor import Tensor, same_device


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
    _, by_imag = sort_last(apply("imag", flat), False)
    _, by_real = sort_last(take(apply("real", flat), by_imag), False)
    perm = take(by_imag, by_real)
    return take(flat, perm), perm


def _runs(x: Tensor, perm_too: bool = True) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
    """(sorted values, sort permutation (if ``perm_too``), run-start flags, run starts) of
    flattened ``x``."""
    flat = reshape(x, (-1,))
    # NOTE: complex values have no natural order; any order that makes equal values neighbours
    # will do (the standard leaves the order of the unique values unspecified)
    perm: Tensor | None = None
    if x.dtype.kind == "c":
        vals, perm = _sorted_complex(flat)
    elif perm_too:
        vals, perm = sort_last(flat, False)
    else:
        vals = sort_values(flat, False)
    n = flat.size
    flags = new((n,), _dt.bool_, x.device)
    if n and x.device.kind == "cpu" and x.dtype.kind != "c":
        # PERF: one kernel on the sorted keys (2^19 float32: the fused not_equal of two
        # shifted views took 3.5-10 ms on Intel's runtime)
        kd = kernel_dtype(vals.dtype)
        src = contiguous(vals, kd)
        sort_kernels.run_starts(x.device, kd, src.buffer, src.offset, flags.buffer, n)
    elif n:
        flags[0] = True
        if n > 1:
            flags[1:] = apply("not_equal", vals[1:], vals[:-1])
    starts = flat_nonzero(flags, "unique (the number of distinct values)")
    return vals, perm, flags, starts


# Inputs of at least this many elements look for their distinct values by hashing first (CPUs).
# PERF (2 cores, float32 with about a thousand distinct values, median wall with the read):
# Intel's runtime, 2^22 elements: by hashing 7-8.5 ms, by the stable sort of all of them then
# its runs 100-150 (numpy's unique, which hashes too, 26-45); 2^19: 1.3-3.5 against 17-25 (numpy
# 2.2-7.7). PoCL 3.1 alike. Where the hashing gives up (all distinct) it costs 0.3-0.8 ms more
# than the sort alone at 2^13-2^15, nothing to see past 2^16; a thousand values hash faster at
# every size (2^12: 0.6 against 1.7 ms).
UNIQUE_HASH_MIN = 1 << 15


def _hashed(x: Tensor) -> tuple[Tensor, Tensor] | None:
    """(values, counts) of ``x``'s distinct values found by hashing (``sort.distinct``), in no
    order (of -0.0 and 0.0, the first in ``x``); None where it is not tried or gave up."""
    if x.device.kind != "cpu" or x.dtype.kind == "c" or x.size < max(1, UNIQUE_HASH_MIN):
        return None
    kd = sort_dtype(x.dtype)
    src = contiguous(reshape(x, (-1,)), kd)
    data_dependent("unique (the number of distinct values)")
    got = sort_kernels.distinct(x.device, kd, src.buffer, src.offset, src.size)
    if got is None:
        return None
    vals, counts, m = got
    v = wrap(vals, (m,), kd, x.device)
    if kd != x.dtype:
        v = Tensor(ir.cast(v._node.resolve(), x.dtype), x.device)
    return v, wrap(counts, (m,), _dt.int64, x.device)


def _counts(starts: Tensor, n: int) -> Tensor:
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
    hashed = _hashed(x)
    if hashed is not None:
        return sort_values(hashed[0], False)
    vals, _, _, starts = _runs(x, False)
    return take(vals, starts)


def unique_counts(x: Tensor, /) -> UniqueCountsResult:
    """Distinct values and how often each occurs.

    >>> clops.unique_counts(clops.asarray([3, 1, 3])).counts
    Tensor([1, 2], dtype=int64, device=opencl:cpu:0)
    """
    hashed = _hashed(x)
    if hashed is None:
        vals, _, _, starts = _runs(x, False)
        return UniqueCountsResult(take(vals, starts), _counts(starts, x.size))
    vals, perm = sort_last(hashed[0], False)
    return UniqueCountsResult(vals, take(hashed[1], perm))


def unique_inverse(x: Tensor, /) -> UniqueInverseResult:
    """Distinct values and, for each element of ``x``, the index of its value among them.

    >>> clops.unique_inverse(clops.asarray([3, 1, 3])).inverse_indices
    Tensor([1, 0, 1], dtype=int64, device=opencl:cpu:0)
    """
    vals, perm, flags, starts = _runs(x)
    assert perm is not None
    return UniqueInverseResult(take(vals, starts), _inverse(x, perm, flags))


def unique_all(x: Tensor, /) -> UniqueAllResult:
    """Distinct values, the index of each one's first occurrence, the inverse indices and the
    counts.

    >>> clops.unique_all(clops.asarray([3, 1, 3])).indices
    Tensor([1, 0], dtype=int64, device=opencl:cpu:0)
    """
    vals, perm, flags, starts = _runs(x)
    assert perm is not None
    return UniqueAllResult(take(vals, starts), take(perm, starts), _inverse(x, perm, flags),
                           _counts(starts, x.size))




# Up to this many element pairs, isin compares every element of x1 with every one of x2 in one
# fused broadcast-compare-reduce kernel; past it, x2 is sorted and searched.
ISIN_PAIRWISE_MAX = 1 << 20


def isin(x1: Tensor | int, x2: Tensor | int, /, *, invert: bool = False) -> Tensor:
    """Whether each element of ``x1`` equals some element of ``x2`` (``invert``: equals none),
    compared as ``equal`` compares them (NaN is in nothing); a bool tensor of ``x1``'s shape
    (0-d when ``x1`` is a Python int). int64 and uint64 compare by value.

    >>> clops.isin(clops.asarray([1, 2, 3]), clops.asarray([3, 1]))
    Tensor([ True, False,  True], dtype=bool, device=opencl:cpu:0)
    """
    if not isinstance(x1, Tensor) and not isinstance(x2, Tensor):
        raise TypeError("isin needs at least one clops Tensor operand (x1 or x2)")
    dev = same_device("isin", x1, x2)
    shape = x1.shape if isinstance(x1, Tensor) else ()
    a, b = x1, x2
    for scalar, other in ((x1, x2), (x2, x1)):
        if isinstance(scalar, Tensor):
            continue
        assert isinstance(other, Tensor)
        if isinstance(scalar, bool) or not isinstance(scalar, int | float | complex):
            raise TypeError(f"isin: a scalar operand must be a Python int, float or complex, "
                            f"not {type(scalar).__name__}")
        d = _scalar_dtype(scalar, other.dtype)
        if d.is_int and not np.iinfo(d.np).min <= scalar <= np.iinfo(d.np).max:
            # an int out of the other's range equals none of its values
            return full(shape, bool(invert), dtype=_dt.bool_, device=dev)
        t = asarray(scalar, dtype=d, device=dev)
        a, b = (t, other) if scalar is x1 else (other, t)
    assert isinstance(a, Tensor) and isinstance(b, Tensor)
    found = _isin(a, b)
    return apply("logical_not", found) if invert else found


def _isin(x1: Tensor, x2: Tensor) -> Tensor:
    d1, d2 = x1.dtype, x2.dtype
    valid: Tensor | None = None
    if _dt.can_promote(d1, d2):
        d = _dt.promote_types(d1, d2)
    elif d1.is_int and d2.is_int:
        # NOTE: int64 with uint64 (no common type): compare as uint64, where a negative value
        # of the signed side wraps past 2**63 - 1; no unsigned x1 value that large is counted
        # when x2 is the signed one, and no negative x1 value at all
        d = _dt.uint64
        valid = apply("greater_equal", x1, 0) if d1.kind == "i" else \
            apply("less_equal", x1, int(np.iinfo(np.int64).max))
    else:
        raise TypeError(f"isin: {d1} and {d2} have no common type in the Array API standard; "
                        "convert one with clops.astype first")
    if x2.size == 0 or x1.size == 0:
        return zeros(x1.shape, dtype=_dt.bool_, device=x1.device)
    a = x1 if d1 == d else Tensor(ir.cast(x1._node.resolve(), d), x1.device)
    flat = reshape(x2, (-1,))
    if flat.dtype != d:
        flat = Tensor(ir.cast(flat._node.resolve(), d), x2.device)
    if x1.size * flat.size <= ISIN_PAIRWISE_MAX or d.kind in "cb":
        eq = apply("equal", reshape(a, a.shape + (1,)), flat)
        found = any_(eq, axis=-1)
    else:
        n = flat.size
        keys = sort_values(flat, False)
        pos = searchsorted_flat(keys, a, False)
        at = gather_flat(keys.realize(), apply("minimum", pos, n - 1))
        found = apply("equal", at, a)
    return found if valid is None else apply("logical_and", found, valid)
