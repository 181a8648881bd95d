"""Tensor basics against numpy: creation, host copies, views, broadcasting, reshape, repr."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import clops


def test_asarray_sources(device):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    t = clops.asarray(a, device=device)
    assert t.shape == (2, 3) and t.dtype == clops.int32 and t.device is device
    np.testing.assert_array_equal(np.asarray(t), a)
    assert clops.asarray(3, device=device).dtype == clops.int64
    assert clops.asarray(2.5, device=device).dtype == clops.float32
    assert clops.asarray(True, device=device).dtype == clops.bool
    assert clops.asarray(1j, device=device).dtype == clops.complex64
    nested = clops.asarray([[1.0, 2.0], [3.0, 4.0]], device=device)
    assert nested.dtype == clops.float32
    np.testing.assert_array_equal(np.asarray(nested), [[1, 2], [3, 4]])
    assert float(clops.asarray(2.5, device=device)) == 2.5
    assert int(clops.asarray(7, device=device)) == 7
    assert bool(clops.asarray([True], device=device))


def test_repr_shows_values_shape_dtype_device(device):
    t = clops.asarray([1.5, 2.0], device=device)
    r = repr(t)
    assert "1.5" in r and "float32" in r and device.selector in r


def test_item_of_many_elements_is_an_error(device):
    with pytest.raises(ValueError, match="one element"):
        float(clops.asarray([1.0, 2.0], device=device))


def test_to_device_same_and_roundtrip(device):
    t = clops.asarray([1, 2, 3], device=device)
    assert t.to_device(device) is t
    for other in clops.devices():
        if other.probe("builds"):
            np.testing.assert_array_equal(np.asarray(t.to_device(other)), [1, 2, 3])


def _slices(n: int) -> st.SearchStrategy[slice]:
    idx = st.one_of(st.none(), st.integers(-n - 2, n + 2))
    step = st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0))
    return st.builds(slice, idx, idx, step)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_slicing_views_match_numpy(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=6))
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    t = clops.asarray(a)
    key = tuple(data.draw(_slices(n)) for n in shape)
    np.testing.assert_array_equal(np.asarray(t[key]), a[key])
    # a view of a view, and an integer index with None
    if a[key].ndim and a[key].shape[0]:
        k2 = (0, None, Ellipsis)
        np.testing.assert_array_equal(np.asarray(t[key][k2]), a[key][k2])


@settings(max_examples=40, deadline=None)
@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=5), data=st.data())
def test_permute_reshape_broadcast(shape, data):
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    t = clops.asarray(a)
    perm = data.draw(st.permutations(range(len(shape))))
    np.testing.assert_array_equal(np.asarray(clops.permute_dims(t, perm)), a.transpose(perm))
    # reshape of a non-contiguous view (needs index math over the view) and of the original
    flat = a.transpose(perm).reshape(-1)
    np.testing.assert_array_equal(np.asarray(clops.reshape(clops.permute_dims(t, perm), (-1,))),
                                  flat)
    target = (1, *shape)
    np.testing.assert_array_equal(np.asarray(clops.broadcast_to(t, (2, *shape))),
                                  np.broadcast_to(a, (2, *shape)))
    np.testing.assert_array_equal(np.asarray(clops.reshape(t, target)), a.reshape(target))


def test_reshape_of_lazy_noncontiguous_chain(device):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = clops.asarray(a, device=device)
    got = clops.reshape((t * 2).mT, (2, 12)) + 1
    np.testing.assert_array_equal(np.asarray(got), (a * 2).transpose(0, 2, 1).reshape(2, 12) + 1)


def test_empty_and_size_one_dims(device):
    for shape in [(0,), (3, 0), (1, 1), (0, 2, 1), ()]:
        a = np.ones(shape, np.float32)
        t = clops.asarray(a, device=device)
        np.testing.assert_array_equal(np.asarray(t * 3 + 1), a * 3 + 1)
        np.testing.assert_array_equal(np.asarray(t.sum(axis=None)), a.sum())


def test_negative_strides_and_flip(device):
    a = np.arange(20, dtype=np.int64).reshape(4, 5)
    t = clops.asarray(a, device=device)
    np.testing.assert_array_equal(np.asarray(clops.flip(t)), a[::-1, ::-1])
    np.testing.assert_array_equal(np.asarray(t[::-2, 1::-1] * 3), a[::-2, 1::-1] * 3)
    np.testing.assert_array_equal(np.asarray(t[::-1].sum(axis=0)), a.sum(axis=0))


def test_mixed_devices_error():
    devs = clops.devices()
    if len(devs) < 2:
        # a second context on one device is a different clops device too
        pytest.skip("one OpenCL device present")
    a = clops.asarray([1.0], device=devs[0])
    b = clops.asarray([1.0], device=devs[1])
    with pytest.raises(ValueError, match="different devices"):
        a + b


def test_asarray_copies_before_returning(device):
    # the upload is asynchronous: changing the source right away must not reach the device
    for _ in range(20):
        h = np.random.default_rng(1).standard_normal(4096).astype(np.float32)
        ref = h.copy()
        t = clops.asarray(h, device=device)
        h[:] = 0
        np.testing.assert_array_equal(np.asarray(t), ref)
