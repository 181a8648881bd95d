"""argmax and argmin against numpy on every device: every dtype they take, every axis (and
none), keepdims, and values that decide the order: NaN (the extreme, the first one wins), inf,
-inf, -0.0 beside 0.0, ties, the integer limits. On CPUs, float32 takes one pass (serial rows
along the last axis, long rows cut into chunks, column strips over a leading axis): their
shapes (strip widths, vector remainders, chunk boundaries) are tested here too."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import clops

FLOATS = ["float32", "float64", "float16"]
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
SIDES = [1, 2, 3, 7, 8, 9, 16, 17, 24, 32, 33, 64]
OPS = ["argmax", "argmin"]


def _pool(dtype: str) -> list:
    """Few values, so that ties are common, with the ones that decide the order."""
    if dtype == "bool":
        return [False, True]
    if dtype in INTS:
        info = np.iinfo(dtype)
        return [int(info.min), int(info.max), 0, 1, 2, int(info.min) + 1, int(info.max) - 1]
    return [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, -2.5]


def _check(a: np.ndarray, device: clops.CLDevice, axis: int | None) -> None:
    x = clops.asarray(a, device=device)
    for op in OPS:
        fn, ref = getattr(clops, op), getattr(np, op)
        for keepdims in (False, True):
            got = np.asarray(fn(x, axis=axis, keepdims=keepdims))
            want = ref(a, axis=axis, keepdims=keepdims)
            assert got.shape == want.shape, (op, a.shape, axis, keepdims)
            np.testing.assert_array_equal(got, want, err_msg=f"{op} {a.dtype} axis={axis}")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=st.data(), dtype=st.sampled_from(["float32", "float32", *FLOATS, *INTS, "bool"]),
       shape=st.lists(st.sampled_from(SIDES), min_size=1, max_size=4).map(tuple))
def test_matches_numpy(data, dtype, shape, device):
    if dtype == "float64" and not device.caps.fp64:
        dtype = "float32"
    a = data.draw(hnp.arrays(dtype, shape, elements=st.sampled_from(_pool(dtype))))
    axis = data.draw(st.sampled_from([None, *range(len(shape)), -1]))
    _check(a, device, axis)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "uint8", "bool"])
def test_special_values_every_axis(dtype, device):
    if dtype == "float64" and not device.caps.fp64:
        pytest.skip("no float64 on this device")
    rng = np.random.default_rng(7)
    pool = np.array(_pool(dtype), dtype=dtype)
    a = pool[rng.integers(0, len(pool), (9, 16, 24))]
    for axis in (None, 0, 1, 2):
        _check(a, device, axis)
    x = clops.asarray(a, device=device)
    for op in OPS:  # a view
        np.testing.assert_array_equal(np.asarray(getattr(clops, op)(x[:, ::2, 1:], axis=0)),
                                      getattr(np, op)(a[:, ::2, 1:], axis=0))


@pytest.mark.parametrize("width", [8, 16, 24, 32, 40, 64, 96])
def test_column_strips(width, device):
    """Over a leading axis of float32 whose last axis a strip width divides: each column's
    first extreme, NaN first, in rows far apart; columns all -inf, all NaN, all equal."""
    rng = np.random.default_rng(width)
    a = rng.standard_normal((300, 3, width)).astype(np.float32)
    a[:, 0, 0] = -np.inf
    a[:, 0, 1] = np.nan
    a[:, 0, 2] = 1.0  # all equal: the first
    a[[5, 200], 1, 3] = 50.0  # tie: the first
    a[[7, 280], 2, 4] = np.nan
    a[9, 2, 4] = 60.0
    a[[3, 4], 1, 5] = [0.0, -0.0]
    a[[3, 4], 1, 6] = [-0.0, 0.0]
    a[299, 2, width - 1] = np.inf
    for axis in (0, 1):
        _check(a, device, axis)
    _check(a[:, :, ::-1].copy(), device, 0)


@pytest.mark.parametrize("shape", [(1 << 20,), (3, 1 << 20), ((1 << 20) + 8,), (2, 2, 1 << 19)])
def test_long_rows(shape, device):
    """Rows long enough to be cut into chunks on CPUs: the extreme, its ties and NaNs at chunk
    boundaries and in later chunks."""
    n = shape[-1]
    rng = np.random.default_rng(n)
    a = rng.standard_normal(shape).astype(np.float32)
    rows = a.reshape(-1, n)
    for r, row in enumerate(rows):
        row[n // 8 * (r % 8)] = 9.0  # the start of a chunk
        row[n // 8 * (r % 8) - 1] = 9.0  # the end of the one before: the first
        row[n - 1] = 9.0
    _check(a, device, -1)
    _check(a, device, None)
    rows[0, n // 2] = np.nan
    rows[0, n - 3] = np.nan
    rows[-1, 5 * n // 8 + 1] = np.nan
    rows[-1, 3 * n // 8 + 2] = np.nan
    _check(a, device, -1)
    _check(a, device, None)
    _check(np.full(shape, -np.inf, np.float32), device, -1)
    _check(np.full(shape, np.nan, np.float32), device, None)
    x = clops.asarray(a, device=device)
    # not cut (a view, a fused body): the same answers
    np.testing.assert_array_equal(np.asarray(clops.argmax(x[..., 1:], axis=-1)),
                                  np.argmax(a[..., 1:], axis=-1))
    np.testing.assert_array_equal(np.asarray(clops.argmin(x * 2.0 - 1.0, axis=-1)),
                                  np.argmin(a * np.float32(2.0) - np.float32(1.0), axis=-1))


def test_one_element_and_empty(device):
    for dtype in ("float32", "int64", "bool"):
        _check(np.ones((1,), dtype), device, None)
        _check(np.ones((1, 1, 8), dtype), device, 0)
    x = clops.asarray(np.ones((0, 8), np.float32), device=device)
    with pytest.raises(ValueError):
        clops.argmax(x, axis=0)
    np.testing.assert_array_equal(np.asarray(clops.argmax(x, axis=1)), np.zeros((0,), np.int64))
