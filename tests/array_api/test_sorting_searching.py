"""Sorting, searching, set and cumulative functions against numpy, with hypothesis for shapes,
dtypes and special values (NaN, signed zeros, infinities, ties)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import clops as xp

SPECIAL = st.sampled_from([0.0, -0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 2.5, 2.5, 7.0])
DTYPES = [np.int8, np.uint16, np.int32, np.int64, np.float32, np.float64]


def arrays(dtype: type, max_dims: int = 3) -> st.SearchStrategy[np.ndarray]:
    shape = hnp.array_shapes(min_dims=1, max_dims=max_dims, min_side=1, max_side=7)
    if np.dtype(dtype).kind == "f":
        return hnp.arrays(dtype, shape, elements=SPECIAL)
    return hnp.arrays(dtype, shape, elements=st.integers(0, 4))


@settings(max_examples=20, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), descending=st.booleans())
def test_sort_argsort_stable(data: st.DataObject, dtype: type, descending: bool) -> None:
    a = data.draw(arrays(dtype))
    axis = data.draw(st.integers(-a.ndim, a.ndim - 1))
    t = xp.asarray(a)
    if descending:
        # stable descending: ties keep their order, NaN first (lexsort is stable; last key
        # is the primary one)
        nan = np.isnan(a) if a.dtype.kind == "f" else np.zeros(a.shape, bool)
        key = np.where(nan, 0.0, -a.astype(np.float64))
        ref_i = np.lexsort((key, ~nan), axis=axis)
    else:
        ref_i = np.argsort(a, axis=axis, kind="stable")
    got_i = xp.argsort(t, axis=axis, descending=descending).to_numpy()
    np.testing.assert_array_equal(got_i, ref_i)
    got_v = xp.sort(t, axis=axis, descending=descending).to_numpy()
    np.testing.assert_array_equal(got_v, np.take_along_axis(a, ref_i, axis=axis))


@settings(max_examples=20, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), keepdims=st.booleans())
def test_argmax_argmin(data: st.DataObject, dtype: type, keepdims: bool) -> None:
    a = data.draw(arrays(dtype))
    axis = data.draw(st.none() | st.integers(-a.ndim, a.ndim - 1))
    t = xp.asarray(a)
    for fn, ref in ((xp.argmax, np.argmax), (xp.argmin, np.argmin)):
        got = fn(t, axis=axis, keepdims=keepdims).to_numpy()
        np.testing.assert_array_equal(got, ref(a, axis=axis, keepdims=keepdims))


@settings(max_examples=15, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_nonzero_count_nonzero(data: st.DataObject, dtype: type) -> None:
    a = data.draw(arrays(dtype))
    t = xp.asarray(a)
    for g, r in zip(xp.nonzero(t), np.nonzero(a)):
        np.testing.assert_array_equal(g.to_numpy(), r)
    assert xp.count_nonzero(t).item() == np.count_nonzero(a)
    np.testing.assert_array_equal(xp.count_nonzero(t, axis=0, keepdims=True).to_numpy(),
                                  np.count_nonzero(a, axis=0, keepdims=True))


@settings(max_examples=15, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), side=st.sampled_from(["left", "right"]))
def test_searchsorted(data: st.DataObject, dtype: type, side: str) -> None:
    a = np.sort(data.draw(arrays(dtype, max_dims=1)))
    v = data.draw(arrays(dtype, max_dims=2))
    got = xp.searchsorted(xp.asarray(a), xp.asarray(v), side=side).to_numpy()
    np.testing.assert_array_equal(got, np.searchsorted(a, v, side=side))
    perm = np.argsort(-np.arange(a.size))
    unsorted = a[np.argsort(perm)]
    got = xp.searchsorted(xp.asarray(unsorted), xp.asarray(v), side=side,
                          sorter=xp.asarray(perm)).to_numpy()
    np.testing.assert_array_equal(got, np.searchsorted(unsorted, v, side=side, sorter=perm))


@settings(max_examples=15, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_unique(data: st.DataObject, dtype: type) -> None:
    a = data.draw(arrays(dtype))
    t = xp.asarray(a)
    vals, idx, inv, counts = np.unique(a, return_index=True, return_inverse=True,
                                       return_counts=True, equal_nan=False)
    res = xp.unique_all(t)
    np.testing.assert_array_equal(res.values.to_numpy(), vals)
    np.testing.assert_array_equal(res.counts.to_numpy(), counts)
    np.testing.assert_array_equal(res.inverse_indices.to_numpy(), inv.reshape(a.shape))
    if not (a.dtype.kind == "f" and np.isnan(a).any()):
        np.testing.assert_array_equal(res.indices.to_numpy(), idx)
    np.testing.assert_array_equal(xp.unique_values(t).to_numpy(), vals)
    np.testing.assert_array_equal(xp.unique_counts(t).counts.to_numpy(), counts)
    np.testing.assert_array_equal(xp.unique_inverse(t).inverse_indices.to_numpy(),
                                  inv.reshape(a.shape))


@pytest.mark.parametrize("n", [1, 7, 300, 5000])
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64, np.complex64])
def test_cumulative(n: int, dtype: type) -> None:
    rng = np.random.default_rng(n)
    a = (rng.integers(-3, 4, size=(3, n)) + (0.5j if np.dtype(dtype).kind == "c" else 0)
         ).astype(dtype)
    t = xp.asarray(a)
    tol = {"rtol": 1e-4, "atol": 1e-3} if np.dtype(dtype).itemsize <= 8 else {"rtol": 1e-12}
    np.testing.assert_allclose(xp.cumulative_sum(t, axis=1).to_numpy(), np.cumsum(a, axis=1),
                               **tol)
    got = xp.cumulative_sum(t, axis=0, include_initial=True).to_numpy()
    np.testing.assert_allclose(got, np.concatenate([np.zeros((1, n), dtype),
                                                    np.cumsum(a, axis=0)]), **tol)
    small = (a[:, :12] % 3 if np.dtype(dtype).kind != "c" else a[:, :12] / 2)
    np.testing.assert_allclose(xp.cumulative_prod(xp.asarray(small), axis=1).to_numpy(),
                               np.cumprod(small, axis=1), **tol)


def test_cumulative_dtypes() -> None:
    b = xp.asarray([True, False, True])
    assert xp.cumulative_sum(b).dtype == xp.int64
    assert xp.cumulative_sum(xp.asarray([1, 2], dtype=xp.uint8)).dtype == xp.uint64
    assert xp.cumulative_sum(xp.asarray([1, 2], dtype=xp.int8), dtype=xp.float32).dtype == \
        xp.float32
    assert xp.cumulative_sum(b, include_initial=True).to_numpy().tolist() == [0, 1, 1, 2]
    with pytest.raises(ValueError):
        xp.cumulative_sum(xp.zeros((2, 2)))


@pytest.mark.parametrize("algorithm", ["radix", "gpu"])
@pytest.mark.parametrize("n", [1, 5, 4096, 5000, 20000])
def test_both_sort_kernels(algorithm: str, n: int, device: xp.CLDevice) -> None:
    from clops.kernels import sort

    rng = np.random.default_rng(n)
    a = rng.integers(0, 9, size=(3, n)).astype(np.float32)
    a[0, ::7] = np.nan
    t = xp.asarray(a, device=device)
    for desc in (False, True):
        keys, idx, P = sort.sort(device, xp.float32, t.buffer, t.offset, 3, n, desc, algorithm)
        got = xp.Tensor._from_buffer(idx, (3, n), xp.int64, device, (P, 1)).to_numpy()
        key = np.where(np.isnan(a), -np.inf if desc else np.inf, -a if desc else a)
        np.testing.assert_array_equal(got, np.argsort(key, axis=1, kind="stable"))


def test_sort_is_captured_and_data_dependent_shapes_are_refused() -> None:
    from clops import JitError

    f = xp.jit(lambda x: xp.sort(x, descending=True))
    rng = np.random.default_rng(5)
    for _ in range(4):  # fresh values each call: a stale replay would give the first call's
        a = rng.standard_normal(33).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(f(xp.asarray(a))), np.sort(a)[::-1])
    for fn, what in [(xp.nonzero, "nonzero"), (xp.unique_values, "unique"),
                     (lambda x: x[x > 0], "boolean mask")]:
        g = xp.jit(fn)
        with pytest.raises(JitError, match=what):
            g(xp.asarray([3.0, 0.0, 1.0]))
