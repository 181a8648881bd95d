"""Array, advanced indexing fast paths against numpy on every test device: one index array on
one axis (``take``, ``x[idx]``, ``x[:, idx]``: the block gather that wraps its own indices),
``x[mask]`` packed straight from the mask's prefix sum, and the scans under them (``nonzero``,
``cumsum`` of bool flags and of long rows)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops

DTYPES = ["float32", "float64", "int8", "uint16", "int64", "complex64", "bool", "float16"]


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    a = rng.standard_normal(shape) * 50
    if dtype == "complex64":
        return (a + 1j * rng.standard_normal(shape)).astype(np.complex64)
    if dtype == "bool":
        return a > 0
    return a.astype(dtype)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data())
def test_take_one_axis_hypothesis(device: clops.CLDevice, shape: list[int],
                                  data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    dtype = data.draw(st.sampled_from(DTYPES))
    a = _values(rng, tuple(shape), dtype)
    view = data.draw(st.sampled_from(["plain", "sliced", "transposed", "flipped"]))
    x = clops.asarray(a, device=device)
    ref_a = a
    if view == "sliced" and shape[-1] > 1:
        x, ref_a = x[..., ::2], a[..., ::2]
    elif view == "transposed":
        x, ref_a = clops.permute_dims(x, tuple(range(a.ndim))[::-1]), a.transpose()
    elif view == "flipped":
        x, ref_a = x[::-1], a[::-1]
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = ref_a.shape[axis]
    ishape = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=2))
    idx = rng.integers(-n, n, size=ishape)
    itype = data.draw(st.sampled_from(["int64", "int32", "int8"]))
    idx = idx.astype(itype)
    key = (slice(None),) * axis + (clops.asarray(idx, device=device),)
    got = x[key].to_numpy()
    want = ref_a[(slice(None),) * axis + (idx,)]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,axis", [((1024, 513), 0), ((37, 700), 1), ((5, 6, 300), 1),
                                        ((3000,), 0), ((2, 3, 4, 5), 3)])
def test_take_rows_and_columns(device: clops.CLDevice, shape: tuple[int, ...], axis: int
                               ) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal(shape).astype(np.float32)
    idx = rng.integers(-shape[axis], shape[axis], size=shape[axis] + 7)
    x = clops.asarray(a, device=device)
    got = clops.take(x, clops.asarray(idx, device=device), axis=axis).to_numpy()
    np.testing.assert_array_equal(got, np.take(a, idx, axis=axis))
    if axis == 0:
        np.testing.assert_array_equal(x[clops.asarray(idx, device=device)].to_numpy(), a[idx])


def test_take_keeps_special_values_bitwise(device: clops.CLDevice) -> None:
    a = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45, -np.nan, 3.0], np.float32)
    idx = np.array([1, 0, 5, 4, 3, 2, 6, -7, -1])
    got = clops.take(clops.asarray(a, device=device), clops.asarray(idx, device=device))
    assert got.to_numpy().view(np.uint32).tolist() == a[idx].view(np.uint32).tolist()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3), data=st.data())
def test_mask_hypothesis(device: clops.CLDevice, shape: list[int], data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    dtype = data.draw(st.sampled_from(DTYPES))
    a = _values(rng, tuple(shape), dtype)
    k = data.draw(st.integers(1, len(shape)))
    p = data.draw(st.sampled_from([0.0, 0.3, 1.0]))
    m = rng.random(shape[:k]) < p
    x = clops.asarray(a, device=device)
    for key in (clops.asarray(m, device=device), (clops.asarray(m, device=device),), m):
        got = x[key].to_numpy()
        assert got.shape == a[m].shape
        np.testing.assert_array_equal(got, a[m])


@pytest.mark.parametrize("n", [1, 255, 256, 257, 70_001, 1 << 19])
def test_mask_long_and_nonzero(device: clops.CLDevice, n: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    a[::97] = np.nan
    a[1::89] = -0.0
    m = (rng.random(n) < 0.5) | np.isnan(a)
    x = clops.asarray(a, device=device)
    cm = clops.asarray(m, device=device)
    got = x[cm].to_numpy()
    assert got.view(np.uint32).tolist() == a[m].view(np.uint32).tolist()
    np.testing.assert_array_equal(clops.nonzero(cm)[0].to_numpy(), np.nonzero(m)[0])
    # a mask of a strided view takes the general path; the same answer
    np.testing.assert_array_equal(x[::-1][cm[::-1]].to_numpy(), a[::-1][m[::-1]])


@pytest.mark.parametrize("n", [1, 255, 257, 4099, 1 << 18])
@pytest.mark.parametrize("dtype", ["int32", "int64", "float32"])
def test_cumsum_long_rows(device: clops.CLDevice, n: int, dtype: str) -> None:
    rng = np.random.default_rng(n)
    a = rng.integers(-9, 10, size=n).astype(dtype)
    got = clops.cumulative_sum(clops.asarray(a, device=device)).to_numpy()
    np.testing.assert_array_equal(got, np.cumsum(a, dtype=a.dtype))  # small ints: exact sums
    b = rng.integers(-9, 10, size=(3, n)).astype(dtype)
    got2 = clops.cumulative_sum(clops.asarray(b, device=device), axis=1).to_numpy()
    np.testing.assert_array_equal(got2, np.cumsum(b, axis=1, dtype=b.dtype))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(0, 5), min_size=1, max_size=4), data=st.data())
def test_concat_and_stack_hypothesis(device: clops.CLDevice, shape: list[int],
                                     data: st.DataObject) -> None:
    # realized C-contiguous inputs of one dtype are row copies; views, pending graphs and mixed
    # dtypes take the generated copy; the answers agree with numpy either way
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    axis = data.draw(st.integers(0, len(shape) - 1))
    dtype = data.draw(st.sampled_from(DTYPES))
    k = data.draw(st.integers(1, 4))
    arrays, tensors = [], []
    for _ in range(k):
        s = list(shape)
        s[axis] = data.draw(st.integers(0, 4))
        alt = {"float32": "float64", "int8": "int64", "float16": "float32"}.get(dtype, dtype)
        a = _values(rng, tuple(s), data.draw(st.sampled_from([dtype, dtype, alt])))
        how = data.draw(st.sampled_from(["plain", "plain", "flipped", "pending"]))
        t = clops.asarray(a, device=device)
        if how == "flipped":
            a = np.ascontiguousarray(a[::-1])
            t = clops.asarray(a[::-1].copy(), device=device)[::-1]
        elif how == "pending":
            t = clops.asarray(a, device=device) * 1 if a.dtype != np.bool_ else t
        arrays.append(a)
        tensors.append(t)
    want = np.concatenate(arrays, axis=axis)
    got = clops.concat(tensors, axis=axis).to_numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want.astype(got.dtype))
    same = [clops.asarray(arrays[0], device=device) for _ in range(k)]
    np.testing.assert_array_equal(clops.stack(same, axis=axis).to_numpy(),
                                  np.stack([arrays[0]] * k, axis=axis))


def test_concat_keeps_bits(device: clops.CLDevice) -> None:
    a = np.array([[np.nan, -0.0], [np.inf, 1e-45]], np.float32)
    b = np.array([[-np.nan, 0.0], [-np.inf, -1e-45]], np.float32)
    ta, tb = clops.asarray(a, device=device), clops.asarray(b, device=device)
    for axis in (0, 1):
        got = clops.concat([ta, tb], axis=axis).to_numpy()
        assert got.view(np.uint32).tolist() == np.concatenate([a, b], axis).view(
            np.uint32).tolist()
