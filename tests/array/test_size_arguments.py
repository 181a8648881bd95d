"""Array layer, size arguments checked where they come in: negative, non-integer and absurdly
large shapes and counts give the ValueError or TypeError numpy gives, naming the argument (they
used to abort the process, be accepted and fail later, or read past a buffer); the custom
kernel builders refuse an ``n`` that runs past their tensors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import clops

_SETTINGS = settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
BIG = 2**63  # one past int64


@pytest.mark.parametrize("call,error,words", [
    (lambda d: clops.eye(-3, device=d), ValueError, "n_rows"),
    (lambda d: clops.eye(3, -1, device=d), ValueError, "n_cols"),
    (lambda d: clops.eye(2.5, device=d), TypeError, "n_rows"),
    (lambda d: clops.eye(2, k=1.5, device=d), TypeError, "k"),
    (lambda d: clops.eye(BIG, device=d), ValueError, "n_rows"),
    (lambda d: clops.zeros((-1,), device=d), ValueError, "negative"),
    (lambda d: clops.ones((2, -3), device=d), ValueError, "negative"),
    (lambda d: clops.empty(-2, device=d), ValueError, "negative"),
    (lambda d: clops.full((BIG,), 1.0, device=d), ValueError, "too big"),
    (lambda d: clops.empty((2**40, 2**40), device=d), ValueError, "too big"),
    (lambda d: clops.zeros(2.0, device=d), TypeError, "shape"),
    (lambda d: clops.zeros((2, "3"), device=d), TypeError, "shape"),
    (lambda d: clops.linspace(0, 1, -1, device=d), ValueError, "num"),
    (lambda d: clops.linspace(0, 1, 2.5, device=d), TypeError, "num"),
    (lambda d: clops.arange(float("inf"), device=d), ValueError, "arange"),
    (lambda d: clops.arange(0, 2**70, device=d), ValueError, "arange"),
    (lambda d: clops.reshape(clops.arange(6, device=d), (-2, -3)), ValueError, "shape"),
    (lambda d: clops.reshape(clops.arange(6, device=d), (-1, -1)), ValueError, "-1"),
    (lambda d: clops.reshape(clops.arange(6, device=d), (2.0, 3)), TypeError, "shape"),
    (lambda d: clops.broadcast_to(clops.arange(3, device=d), (-1, 3)), ValueError, "shape"),
    (lambda d: clops.broadcast_to(clops.arange(3, device=d), (BIG, 3)), ValueError, "too big"),
    (lambda d: clops.tile(clops.arange(3, device=d), (-1,)), ValueError, "repetitions"),
    (lambda d: clops.repeat(clops.arange(3, device=d), 2**62), ValueError, "too big"),
    (lambda d: clops.broadcast_shapes((2,), (-1,)), ValueError, "shapes"),
])
def test_bad_size_is_refused_at_the_boundary(call, error, words, device):
    with pytest.raises(error, match=words):
        call(device)


@pytest.mark.parametrize("call", [
    lambda: np.eye(-3), lambda: np.zeros((-1,)), lambda: np.reshape(np.arange(6), (-2, -3)),
    lambda: np.broadcast_to(np.arange(3), (-1, 3)), lambda: np.linspace(0, 1, -1),
])
def test_numpy_refuses_the_same_with_valueerror(call):
    # the reference the errors above follow
    with pytest.raises(ValueError):
        call()


def test_valid_sizes_at_the_edges_still_work(device):
    assert clops.eye(0, device=device).shape == (0, 0)
    assert clops.eye(2, 0, device=device).shape == (2, 0)
    np.testing.assert_array_equal(clops.eye(np.int64(2), device=device).to_numpy(), np.eye(2))
    assert clops.zeros((0, 5), device=device).shape == (0, 5)
    assert clops.reshape(clops.arange(6, device=device), (-1, 2)).shape == (3, 2)
    assert clops.reshape(clops.zeros((0, 3), device=device), (3, 0)).shape == (3, 0)
    # a broadcast view may be far larger than memory: it is never materialized
    assert clops.broadcast_to(clops.ones((1,), device=device), (2**40,)).shape == (2**40,)
    np.testing.assert_array_equal(clops.arange(5, 0, -2, device=device).to_numpy(), [5, 3, 1])
    np.testing.assert_array_equal(clops.arange(0, 1, 0.25, device=device).to_numpy(),
                                  np.arange(0, 1, 0.25, dtype=np.float32))


ONES_64 = (1,) * 64
ONES_65 = (1,) * 65


@pytest.mark.parametrize("call, named", [
    (lambda d: clops.zeros(ONES_65, device=d), "zeros"),
    (lambda d: clops.ones(ONES_65, device=d), "ones"),
    (lambda d: clops.empty(ONES_65, device=d), "empty"),
    (lambda d: clops.full(ONES_65, 2.0, device=d), "full"),
    (lambda d: clops.reshape(clops.ones(1, device=d), ONES_65), "reshape"),
    (lambda d: clops.broadcast_to(clops.ones(1, device=d), ONES_65), "broadcast_to"),
    (lambda d: clops.expand_dims(clops.ones(ONES_64, device=d), axis=0), "expand_dims"),
    (lambda d: clops.expand_dims(clops.ones(ONES_64[2:], device=d), axis=(0, 1, 2)),
     "expand_dims"),
    (lambda d: clops.stack([clops.ones(ONES_64, device=d)] * 2), "stack"),
    (lambda d: clops.ones(ONES_64, device=d)[None], "x[key]"),
    (lambda d: clops.ones((), device=d)[(None,) * 65], "x[key]"),
    (lambda d: clops.broadcast_shapes(ONES_65, (1,)), "broadcast_shapes"),
])
def test_more_dimensions_than_the_limit_are_refused(call, named, device):
    """64 dimensions, numpy's limit and the namespace's 'max dimensions', at most; past it
    a ValueError that names the function and the limit (a 65-d tensor used to be made)."""
    assert clops.__array_namespace_info__().capabilities()["max dimensions"] == 64
    with pytest.raises(ValueError, match=rf"^{re.escape(named)}: .*65 dimensions.*at most 64"):
        call(device)


def test_the_dimension_limit_itself_works(device):
    x = clops.ones(ONES_64, device=device)
    assert x.ndim == 64 and float(clops.sum(x)) == 1.0
    assert clops.reshape(clops.arange(2, device=device), ONES_64[1:] + (2,)).ndim == 64
    assert clops.expand_dims(clops.ones(ONES_64[1:], device=device), axis=0).ndim == 64
    with pytest.raises(ValueError):  # numpy's own limit, the reference
        np.ones(ONES_65)


def test_too_much_memory_is_a_memory_error(device):
    with pytest.raises(MemoryError):
        clops.zeros((2**62,), dtype=clops.int8, device=device)
    # the process goes on
    np.testing.assert_array_equal((clops.arange(3, device=device) + 1).to_numpy(), [1, 2, 3])


# small sizes, negative ones, and sizes past any device's memory (2**40 bytes and up)
_sizes = st.one_of(st.integers(-4, 5), st.integers(-2**70, -5), st.integers(2**40, 2**70))
_shapes = st.lists(_sizes, max_size=3).map(tuple)


def _expected_error(shape: tuple[int, ...]) -> type[Exception] | None:
    """ValueError for a negative entry or a size past int64 (numpy's rules), MemoryError for a
    valid size no buffer can hold, None for one that can be made."""
    if any(n < 0 for n in shape):
        return ValueError
    total = int(np.prod(shape, dtype=object)) if shape else 1
    # numpy counts the nonzero dimensions too: (0, 2**40, 2**40) is "too big" there
    nonzero = int(np.prod([n for n in shape if n], dtype=object)) if shape else 1
    if any(n >= BIG for n in shape) or nonzero >= BIG:
        return ValueError
    return MemoryError if total >= 2**40 else None


@_SETTINGS
@given(shape=_shapes, fn=st.sampled_from(["zeros", "ones", "empty", "full"]))
def test_creation_with_any_size_gives_a_result_or_a_clean_error(shape, fn, device):
    args = (shape, 2) if fn == "full" else (shape,)
    err = _expected_error(shape)
    if err is not None:
        with pytest.raises(err):
            getattr(clops, fn)(*args, dtype=clops.int8, device=device)
        return
    got = getattr(clops, fn)(*args, dtype=clops.int8, device=device)
    assert got.shape == shape
    if fn != "empty":
        np.testing.assert_array_equal(got.to_numpy(), getattr(np, fn)(*args, dtype=np.int8))


@_SETTINGS
@given(rows=_sizes, cols=st.none() | _sizes)
def test_eye_with_any_size_gives_a_result_or_a_clean_error(rows, cols, device):
    shape = (rows, rows if cols is None else cols)
    err = _expected_error(shape)
    if err is not None:
        with pytest.raises(err):
            clops.eye(rows, cols, dtype=clops.int8, device=device)
        return
    np.testing.assert_array_equal(clops.eye(rows, cols, dtype=clops.int8, device=device)
                                  .to_numpy(), np.eye(rows, cols, dtype=np.int8))


@_SETTINGS
@given(src=st.lists(st.integers(0, 3), max_size=3).map(tuple), shape=_shapes)
@example(src=(), shape=(2, 2, 2**59))  # elements fit int64, their bytes do not (numpy refuses)
@example(src=(0,), shape=(0, 2**61))  # no elements, but numpy counts the nonzero dimensions
def test_reshape_and_broadcast_to_with_any_shape_match_numpy(src, shape, device):
    a = np.arange(int(np.prod(src)), dtype=np.int32).reshape(src)
    x = clops.asarray(a, device=device)
    for name, call in (("reshape", np.reshape), ("broadcast_to", np.broadcast_to)):
        if name == "reshape" and any(n < -1 for n in shape):
            # numpy reads any negative entry as the unknown one; the standard allows only -1
            with pytest.raises(ValueError, match="only -1"):
                clops.reshape(x, shape)
            continue
        try:
            want = call(a, shape)
        except (ValueError, TypeError) as e:
            with pytest.raises(type(e)):
                getattr(clops, name)(x, shape)
            continue
        got = getattr(clops, name)(x, shape)
        assert got.shape == want.shape
        if want.size <= 4096:
            np.testing.assert_array_equal(got.to_numpy(), want)
    # the process goes on after any of these errors
    np.testing.assert_array_equal((x + 1).to_numpy(), a + 1)


# -- custom kernel builders: n is checked against the tensors -----------------------------------
def test_elementwise_kernel_refuses_n_past_its_tensors(device):
    k = clops.ElementwiseKernel("__global float *y", "y[i] = 1.0f", "fill_one")
    y = clops.zeros(4, device=device)
    with pytest.raises(ValueError, match=r"n=67108864.*y has 4"):
        k(y, n=1 << 26)
    with pytest.raises(ValueError, match="n must be >= 0"):
        k(y, n=-1)
    with pytest.raises(TypeError, match="n must be an integer"):
        k(y, n=2.5)
    k(y, n=2).wait()  # n below the tensors' size: the first n elements
    np.testing.assert_array_equal(y.to_numpy(), [1, 1, 0, 0])


def test_reduction_kernel_refuses_bad_n(device):
    total = clops.ReductionKernel("float", "0", "a + b", "x[i]", "__global const float *x",
                                  name="sum_checked")
    x = clops.ones(8, device=device)
    with pytest.raises(ValueError, match="n=9"):
        total(x, n=9)
    with pytest.raises(ValueError, match="n must be >= 0"):
        total(x, n=-3)
    with pytest.raises(TypeError, match="n must be an integer"):
        total(x, n=4.0)
    assert total(x, n=5).item() == 5.0
    assert total(x).item() == 8.0


def test_scan_kernel_refuses_n_past_its_tensors(device):
    scan = clops.ScanKernel("float", "__global const float *x, __global float *y", "x[i]",
                            "a + b", "y[i] = item", "0", name="cumsum_checked")
    x, y = clops.ones(4, device=device), clops.zeros(4, device=device)
    with pytest.raises(ValueError, match="n=5"):
        scan(x, y, n=5)
    scan(x, y, n=3).wait()
    np.testing.assert_array_equal(y.to_numpy(), [1, 2, 3, 0])


def test_zero_size_results_with_huge_axes_launch_nothing(device):
    x = clops.zeros((0, 2**40), device=device)
    assert (x + 1).realize().shape == (0, 2**40)
    assert clops.sum(x, axis=1).realize().shape == (0,)
    np.testing.assert_array_equal(np.asarray(clops.sum(clops.ones((3, 0), device=device),
                                                       axis=1)), [0, 0, 0])
