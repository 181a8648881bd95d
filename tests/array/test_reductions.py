"""Reductions over every axis combination against numpy, with keepdims, dtype rules, empty and
size-1 axes, and long chains fused into them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import clops


def _axes_sets(ndim):
    out = [None]
    for r in range(1, ndim + 1):
        out.extend(itertools.combinations(range(ndim), r))
    return out


@pytest.mark.parametrize("fn", ["sum", "prod", "max", "min", "mean", "var", "std"])
def test_every_axis_combination(fn, device):
    rng = np.random.default_rng(4)
    a = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32)
    t = clops.asarray(a, device=device)
    for axes in _axes_sets(3):
        for keep in (False, True):
            got = np.asarray(getattr(clops, fn)(t, axis=axes, keepdims=keep))
            want = getattr(np, fn)(a, axis=axes, keepdims=keep)
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6, err_msg=f"{axes}")


@settings(max_examples=40, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=7), data=st.data())
def test_sum_of_views(shape, data):
    a = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    t = clops.asarray(a)
    perm = data.draw(st.permutations(range(len(shape))))
    axis = data.draw(st.integers(0, len(shape) - 1))
    v, av = clops.permute_dims(t, perm)[..., ::-1], a.transpose(perm)[..., ::-1]
    np.testing.assert_allclose(np.asarray(v.sum(axis=axis)), av.sum(axis=axis), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(clops.max(v * 2 - 1, axis=axis)),
                               (av * 2 - 1).max(axis=axis), rtol=1e-6)


def test_dtype_rules_and_ints(device):
    a = np.arange(1, 13, dtype=np.int8).reshape(3, 4)
    t = clops.asarray(a, device=device)
    s = t.sum()
    assert s.dtype == clops.int64 and int(s) == a.sum()
    assert clops.prod(t, axis=1).dtype == clops.int64
    np.testing.assert_array_equal(np.asarray(clops.prod(t, axis=1)),
                                  a.astype(np.int64).prod(axis=1))
    assert clops.sum(t, dtype=clops.int8).dtype == clops.int8
    u = clops.asarray(np.array([1, 2], np.uint16), device=device)
    assert u.sum().dtype == clops.uint64
    b = clops.asarray(np.array([[True, False], [True, True]]), device=device)
    np.testing.assert_array_equal(np.asarray(clops.all(b, axis=1)), [False, True])
    np.testing.assert_array_equal(np.asarray(clops.any(b, axis=0)), [True, True])
    assert int(b.sum()) == 3


def test_nan_propagates_through_max_and_min(device):
    a = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, -np.inf]], np.float32)
    t = clops.asarray(a, device=device)
    np.testing.assert_array_equal(np.asarray(clops.max(t, axis=1)), [np.nan, 5.0])
    np.testing.assert_array_equal(np.asarray(clops.min(t, axis=1)), [np.nan, -np.inf])


def test_empty_reductions(device):
    t = clops.asarray(np.ones((3, 0), np.float32), device=device)
    np.testing.assert_array_equal(np.asarray(t.sum(axis=1)), np.zeros(3))
    np.testing.assert_array_equal(np.asarray(clops.prod(t, axis=1)), np.ones(3))
    assert np.asarray(t.sum(axis=0)).shape == (0,)
    with pytest.raises(ValueError):
        clops.max(t, axis=1)


def test_correction_and_large_split_reduction(device):
    rng = np.random.default_rng(6)
    a = rng.standard_normal(300_001).astype(np.float32)  # long enough to be split in chunks
    t = clops.asarray(a, device=device)
    np.testing.assert_allclose(float(t.sum()), a.astype(np.float64).sum(), rtol=1e-4,
                               atol=1e-2)
    np.testing.assert_allclose(float(clops.max(t)), a.max())
    np.testing.assert_allclose(float(clops.var(t, correction=1)), a.var(ddof=1), rtol=1e-4)
    np.testing.assert_allclose(float(clops.mean(t)), a.mean(), atol=1e-5)


def test_long_chain_into_reduction(device):
    a = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    t = clops.asarray(a, device=device)
    x, ref = t, a
    for i in range(60):
        x = x * 0.9 + 0.01 * i
        ref = ref * np.float32(0.9) + np.float32(0.01 * i)
    with clops.profile() as prof:
        got = np.asarray(x.sum(axis=0))
    np.testing.assert_allclose(got, ref.sum(axis=0), rtol=1e-4, atol=1e-4)
    assert prof.kernel_count == 1
