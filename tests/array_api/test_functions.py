"""Manipulation, statistics, products and creation functions added for the 2024.12 standard,
against numpy; plus complex elementwise functions."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import clops as xp

A = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def test_moveaxis_unstack_roll() -> None:
    x = xp.asarray(A)
    assert xp.moveaxis(x, 0, -1).shape == np.moveaxis(A, 0, -1).shape
    np.testing.assert_array_equal(xp.moveaxis(x, (0, 1), (2, 0)).to_numpy(),
                                  np.moveaxis(A, (0, 1), (2, 0)))
    parts = xp.unstack(x, axis=1)
    assert len(parts) == 3
    np.testing.assert_array_equal(parts[2].to_numpy(), A[:, 2])
    for shift, axis in ((2, None), (-1, 2), ((1, 2), (0, 2)), (7, 1)):
        np.testing.assert_array_equal(xp.roll(x, shift, axis=axis).to_numpy(),
                                      np.roll(A, shift, axis=axis))


def test_repeat_tile() -> None:
    x = xp.asarray(A)
    np.testing.assert_array_equal(xp.repeat(x, 2, axis=1).to_numpy(), np.repeat(A, 2, axis=1))
    np.testing.assert_array_equal(xp.repeat(x, 3).to_numpy(), np.repeat(A, 3))
    r = np.array([0, 2, 1])
    np.testing.assert_array_equal(xp.repeat(x, xp.asarray(r), axis=1).to_numpy(),
                                  np.repeat(A, r, axis=1))
    for reps in ((2,), (2, 1, 3), (1, 2, 1, 1)):
        np.testing.assert_array_equal(xp.tile(x, reps).to_numpy(), np.tile(A, reps))


def test_diff() -> None:
    x = xp.asarray(A)
    np.testing.assert_array_equal(xp.diff(x).to_numpy(), np.diff(A))
    np.testing.assert_array_equal(xp.diff(x, axis=1, n=2).to_numpy(), np.diff(A, axis=1, n=2))
    pre = np.ones((2, 3, 1), np.float32)
    np.testing.assert_array_equal(xp.diff(x, prepend=xp.asarray(pre), append=xp.asarray(pre))
                                  .to_numpy(), np.diff(A, prepend=pre, append=pre))
    b = np.array([True, False, False, True])
    np.testing.assert_array_equal(xp.diff(xp.asarray(b)).to_numpy(), np.diff(b))


def test_products() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(2, 3, 4)).astype(np.float32)
    b = rng.normal(size=(4, 3, 5)).astype(np.float32)
    got = xp.tensordot(xp.asarray(a), xp.asarray(b), axes=([1, 2], [1, 0])).to_numpy()
    np.testing.assert_allclose(got, np.tensordot(a, b, axes=([1, 2], [1, 0])), rtol=1e-5,
                               atol=1e-5)
    c = rng.normal(size=(4, 5)).astype(np.float32)
    np.testing.assert_allclose(xp.tensordot(xp.asarray(a), xp.asarray(c), axes=1).to_numpy(),
                               np.tensordot(a, c, axes=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(xp.tensordot(xp.asarray(a), xp.asarray(c), axes=0).to_numpy(),
                               np.tensordot(a, c, axes=0), rtol=1e-5)
    z = (rng.normal(size=(3, 4)) + 1j * rng.normal(size=(3, 4))).astype(np.complex64)
    np.testing.assert_allclose(xp.vecdot(xp.asarray(z), xp.asarray(z[0])).to_numpy(),
                               np.vecdot(z, z[0]), rtol=1e-5)
    np.testing.assert_allclose(xp.vecdot(xp.asarray(a), xp.asarray(a), axis=-2).to_numpy(),
                               np.sum(a * a, axis=-2), rtol=1e-5)


CPLX = ["sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh",
        "atanh", "expm1", "log1p", "log2", "log10", "exp", "log", "sqrt"]
NP = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
      "acosh": "arccosh", "atanh": "arctanh"}


@pytest.mark.parametrize("name", CPLX)
def test_complex_elementwise(name: str) -> None:
    rng = np.random.default_rng(1)
    z = (rng.normal(size=64) * 2 + 1j * rng.normal(size=64) * 2).astype(np.complex64)
    ref = getattr(np, NP.get(name, name))(z)
    got = getattr(xp, name)(xp.asarray(z)).to_numpy()
    assert got.dtype == np.complex64
    np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-5)


@settings(max_examples=20, deadline=None)
@given(a=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=5),
                    elements=st.floats(-4, 4, width=32)),
       correction=st.sampled_from([0, 1]), keepdims=st.booleans())
def test_statistics_keepdims_correction(a: np.ndarray, correction: int, keepdims: bool) -> None:
    t = xp.asarray(a)
    axis = tuple(range(0, a.ndim, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fn in ("var", "std"):
            ref = getattr(np, fn)(a.astype(np.float64), axis=axis, ddof=correction,
                                  keepdims=keepdims)
            got = getattr(xp, fn)(t, axis=axis, correction=correction, keepdims=keepdims)
            np.testing.assert_allclose(got.to_numpy(), ref, rtol=1e-3, atol=1e-2)
    for fn in ("sum", "prod", "mean", "min", "max"):
        ref = getattr(np, fn)(a.astype(np.float64), axis=axis, keepdims=keepdims)
        got = getattr(xp, fn)(t, axis=axis, keepdims=keepdims)
        assert got.shape == ref.shape
        np.testing.assert_allclose(got.to_numpy(), ref, rtol=1e-3, atol=1e-2)
