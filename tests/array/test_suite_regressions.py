"""Array: bugs the array-api-tests suite found, each checked against numpy (complex unique_*,
Python ints past int64 in asarray, huge diagonal offsets, vecdot's dtype, pinv's rtol)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops

_SETTINGS = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
_small = st.integers(-3, 3).map(float)


@_SETTINGS
@given(parts=st.lists(st.tuples(_small, _small), min_size=1, max_size=40))
def test_unique_all_of_complex_matches_numpy(parts, device):
    a = np.array([complex(r, i) for r, i in parts], dtype=np.complex64)
    values, index, inverse, counts = np.unique(a, return_index=True, return_inverse=True,
                                               return_counts=True)
    got = clops.unique_all(clops.asarray(a, device=device))
    # numpy orders complex values lexicographically (real, then imaginary), as clops does
    np.testing.assert_array_equal(np.asarray(got.values), values)
    np.testing.assert_array_equal(np.asarray(got.indices), index)
    np.testing.assert_array_equal(np.asarray(got.inverse_indices), inverse.reshape(a.shape))
    np.testing.assert_array_equal(np.asarray(got.counts), counts)
    np.testing.assert_array_equal(np.asarray(clops.unique_values(clops.asarray(a, device=device))),
                                  values)


def test_unique_of_complex_keeps_nans_distinct(device):
    a = np.array([complex(np.nan, 1), 1 + 2j, complex(np.nan, 1), 1 + 2j], dtype=np.complex64)
    got = clops.unique_counts(clops.asarray(a, device=device))
    vals, counts = np.asarray(got.values), np.asarray(got.counts)
    assert vals.shape == (3,)
    np.testing.assert_array_equal(counts[~np.isnan(vals)], [2])
    np.testing.assert_array_equal(counts[np.isnan(vals)], [1, 1])


@pytest.mark.parametrize("values", [
    [9223372036854775809, 3, 18446744073709551615],
    [[1.0, 9223372036854775809], [2, 0]],
    [True, 18446744073709551615],
])
def test_asarray_keeps_every_digit_of_large_python_ints(values, device):
    got = np.asarray(clops.asarray(values, dtype=clops.uint64, device=device))
    np.testing.assert_array_equal(got, np.array(values, dtype=np.uint64))


def test_asarray_still_refuses_ints_out_of_range(device):
    with pytest.raises(OverflowError):
        clops.asarray([-1, 9223372036854775809], dtype=clops.uint64, device=device)


@pytest.mark.parametrize("k", [2**63, -2**63, 2**70, 5, -4, 3, -3, 0])
def test_diagonal_offsets_beyond_the_matrix(k, device):
    np_k = max(-100, min(k, 100))  # numpy takes any offset that fits an int64
    np.testing.assert_array_equal(np.asarray(clops.eye(3, 4, k=k, device=device)),
                                  np.eye(3, 4, k=np_k, dtype=np.float32))
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = clops.asarray(a, device=device)
    np.testing.assert_array_equal(np.asarray(clops.tril(t, k=k)), np.tril(a, k=np_k))
    np.testing.assert_array_equal(np.asarray(clops.triu(t, k=k)), np.triu(a, k=np_k))


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "uint32", "int64", "float32"])
def test_vecdot_keeps_the_promoted_dtype(dtype, device):
    a = np.array([[200, 100, 3], [7, 1, 2]]).astype(dtype)
    b = np.array([[3, 2, 1], [1, 1, 1]]).astype(dtype)
    got = clops.vecdot(clops.asarray(a, device=device), clops.asarray(b, device=device))
    want = np.vecdot(a, b)  # wraps around in the small integer dtypes, as the standard asks
    assert got.dtype == getattr(clops, dtype)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_pinv_of_complex_with_an_array_rtol(device):
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((2, 3, 4)) + 1j * rng.standard_normal((2, 3, 4))).astype(np.complex64)
    rtol = np.array([0.05, 0.9], dtype=np.float32)
    got = clops.linalg.pinv(clops.asarray(a, device=device),
                            rtol=clops.asarray(rtol, device=device))
    np.testing.assert_allclose(np.asarray(got), np.linalg.pinv(a, rtol=rtol), rtol=1e-4, atol=1e-5)
    got0 = clops.linalg.pinv(clops.asarray(a[0], device=device),
                             rtol=clops.asarray(np.float32(0.05), device=device))
    np.testing.assert_allclose(np.asarray(got0), np.linalg.pinv(a[0], rtol=np.float32(0.05)),
                               rtol=1e-4, atol=1e-5)


@_SETTINGS
@given(start=st.integers(-100, 100), stop=st.integers(-100, 100), num=st.integers(0, 9),
       endpoint=st.booleans(), dtype=st.sampled_from(["int8", "int16", "int32", "int64"]))
def test_linspace_with_an_integer_dtype_matches_numpy(start, stop, num, endpoint, dtype, device):
    # numpy 2 floors the float values for an integer dtype; a negative step used to overflow
    got = clops.linspace(start, stop, num, endpoint=endpoint, dtype=getattr(clops, dtype),
                         device=device)
    want = np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype)
    assert got.dtype == getattr(clops, dtype)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_linspace_with_large_unsigned_values_is_exact(device):
    top = 2**64 - 1
    got = clops.linspace(top, 3, 3, dtype=clops.uint64, device=device)
    np.testing.assert_array_equal(np.asarray(got),
                                  np.array([top, 3 + (top - 3) // 2, 3], dtype=np.uint64))
    got = clops.linspace(10, 0, 3, endpoint=False, dtype=clops.uint8, device=device)
    np.testing.assert_array_equal(np.asarray(got), np.array([10, 6, 3], dtype=np.uint8))


@pytest.mark.parametrize("mask_shape,out_shape", [((0,), (0, 3)), ((2, 0), (0,)), ((0, 3), (0,))])
def test_boolean_mask_with_a_zero_size_dimension_selects_nothing(mask_shape, out_shape, device):
    # the conformance suite takes these masks as valid (numpy raises IndexError)
    x = clops.asarray(np.arange(6.0).reshape(2, 3), device=device)
    out = x[clops.zeros(mask_shape, dtype=clops.bool, device=device)]
    assert out.shape == out_shape
    with pytest.raises(IndexError):
        x[clops.zeros((3,), dtype=clops.bool, device=device)]
