"""sum, mean, max and min over the last axis (and axes ending with it) against numpy on every
device: many short rows and few long ones, every dtype they take, and the values that decide a
result: NaN anywhere in a row gives NaN, inf and -inf, -0.0 beside 0.0. On CPUs float32 rows
run on float8 lanes, several rows a work-item: row counts that leave a short last run, rows
shorter than a vector and vector remainders are drawn here too. Sums may reassociate (as
numpy's pairwise sum does); max and min are exact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import clops

SIDES = [1, 2, 3, 7, 8, 9, 16, 31, 32, 33, 64, 65, 100]
OPS = ["max", "min", "sum", "mean"]
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 0.5]


def _zero_signs_agree(a: np.ndarray, axis, got: np.ndarray, want: np.ndarray) -> None:
    """Where the extreme is a zero and the row's zeros all have one sign, that sign (numpy's
    own choice between -0.0 and 0.0 in a row of both depends on its SIMD lanes: either is an
    IEEE maximum, and only the value is compared there)."""
    pos = np.any((a == 0) & ~np.signbit(a), axis=axis)
    neg = np.any((a == 0) & np.signbit(a), axis=axis)
    one_sign = ~(pos & neg) & (np.asarray(want) == 0)
    np.testing.assert_array_equal(np.signbit(np.asarray(got))[one_sign],
                                  np.signbit(np.asarray(want))[one_sign])


def _check(a: np.ndarray, device: clops.CLDevice, axis, ops=OPS) -> None:
    x = clops.asarray(a, device=device)
    for op in ops:
        fn, ref = getattr(clops, op), getattr(np, op)
        got = np.asarray(fn(x, axis=axis))
        with np.errstate(invalid="ignore", over="ignore"):
            want = ref(a, axis=axis)
        assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype, op
        msg = f"{op} {a.dtype} {a.shape} axis={axis}"
        if op in ("max", "min"):
            np.testing.assert_array_equal(got, want, err_msg=msg)
            if a.dtype.kind == "f":
                _zero_signs_agree(a, axis, got, want)
        else:
            n = a.size // max(np.asarray(want).size, 1)
            tol = 1e-2 if a.dtype == np.float16 else 1e-5
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * n, err_msg=msg)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), dtype=st.sampled_from(["float32", "float32", "float32", "float64",
                                              "float16", "int32", "uint8"]),
       shape=st.lists(st.sampled_from(SIDES), min_size=1, max_size=3).map(tuple))
def test_last_axis_matches_numpy(data, dtype, shape, device):
    if dtype == "float64" and not device.caps.fp64:
        dtype = "float32"
    if dtype[0] in "iu":
        elements = st.integers(0, 9) if dtype == "uint8" else st.integers(-9, 9)
    else:
        elements = st.sampled_from(SPECIAL)
    a = data.draw(hnp.arrays(dtype, shape, elements=elements))
    last = len(shape) - 1
    axis = data.draw(st.sampled_from([-1, last, None, tuple(range(max(last - 1, 0), last + 1))]))
    _check(a, device, axis, OPS if dtype[0] == "f" else OPS[:3])  # (mean: floats only)


@pytest.mark.parametrize("shape", [(1000, 64), (8192, 64), (33, 7), (777, 9), (3, 4099),
                                   (64, 128, 64), (5, 1 << 16)])
def test_many_and_few_rows(shape, device):
    # row counts that leave a short last run of rows, rows shorter than a vector, remainders
    rng = np.random.default_rng(shape[0])
    a = (rng.standard_normal(shape) * 100).astype(np.float32)
    flat = a.reshape(-1)
    flat[rng.integers(0, flat.size, max(1, flat.size // 97))] = -0.0
    flat[rng.integers(0, flat.size, 5)] = np.nan
    flat[rng.integers(0, flat.size, 5)] = np.inf
    flat[rng.integers(0, flat.size, 5)] = -np.inf
    _check(a, device, -1)
    _check(np.abs(a), device, -1, ["sum", "mean"])  # no inf - inf: finite sums compared


@pytest.mark.parametrize("n", [1, 7, 8, 31, 32, 64, 100])
def test_signed_zeros(n, device):
    # rows of zeros of one sign keep it; the maximum of -1 and -0.0 is -0.0; a NaN wins
    rows = [np.full(n, -0.0), np.full(n, 0.0), np.where(np.arange(n) % 2, -1.0, -0.0),
            np.where(np.arange(n) % 2, 1.0, 0.0), np.where(np.arange(n) % 3, -0.0, np.nan)]
    a = np.tile(np.stack(rows).astype(np.float32), (40, 1))
    _check(a, device, 1, ["max", "min"])
    got = np.asarray(clops.max(clops.asarray(a, device=device), axis=1))
    assert np.signbit(got[0]) and not np.signbit(got[1]) and np.signbit(got[2])


@pytest.mark.parametrize("op", ["max", "min"])
def test_nan_before_larger_values(op, device):
    # a NaN in any lane of any vector accumulator, then values past it on either side: the
    # row's result is NaN whatever comes after
    n = 96
    a = np.tile(np.linspace(-50, 50, n, dtype=np.float32), (n + 1, 1))
    if op == "min":
        a = a[:, ::-1].copy()
    for k in range(n):
        a[k, k] = np.nan
    _check(a, device, 1, [op])
    assert np.isnan(np.asarray(getattr(clops, op)(clops.asarray(a, device=device), axis=1))
                    [:n]).all()


def test_fused_bodies_and_views(device):
    rng = np.random.default_rng(9)
    a = rng.standard_normal((300, 70)).astype(np.float32)
    b = rng.standard_normal((300, 70)).astype(np.float32)
    x, y = clops.asarray(a, device=device), clops.asarray(b, device=device)
    np.testing.assert_array_equal(np.asarray(clops.max(x * y - 0.5 * x, axis=1)),
                                  (a * b - np.float32(0.5) * a).max(axis=1))
    np.testing.assert_allclose(np.asarray(clops.sum(x * y, axis=1)), (a * b).sum(axis=1),
                               rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(clops.min(x[3:, 1:], axis=1)),
                                  a[3:, 1:].min(axis=1))
    np.testing.assert_array_equal(np.asarray(clops.max(x[:, ::2], axis=1)),
                                  a[:, ::2].max(axis=1))
    np.testing.assert_allclose(np.asarray(clops.var(x, axis=1)), a.var(axis=1), rtol=1e-4,
                               atol=1e-5)
