"""Host copies as CuPy spells them: ``Tensor.get`` (order, out), ``clops.asnumpy`` and
``Tensor.tolist``, against numpy over dtypes, shapes (0-d, empty) and views (slices,
transposes, steps)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import clops

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128]
DOUBLE = (np.float64, np.complex128)


def _dtypes(device) -> list[type]:
    return [d for d in DTYPES if device.caps.fp64 or d not in DOUBLE]


@st.composite
def _arrays_and_views(draw, dtypes):
    """(a numpy array, a function making the same view of it or of a tensor)."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    a = draw(hnp.arrays(dtype, shape, elements=hnp.from_dtype(np.dtype(dtype),
                                                              allow_nan=False)))
    kind = draw(st.sampled_from(["whole", "transpose", "slice"]))
    if kind == "transpose" or a.ndim == 0:
        return a, (lambda x: x.mT if a.ndim >= 2 else x) if kind == "transpose" else \
            (lambda x: x)
    if kind == "whole":
        return a, lambda x: x
    key = tuple(slice(draw(st.integers(0, 1)), None, draw(st.sampled_from([1, 2, -1])))
                for _ in range(a.ndim))
    return a, lambda x: x[key]


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_get_asnumpy_tolist_equal_numpys(device, data):
    a, view = data.draw(_arrays_and_views(_dtypes(device)))
    want = view(a)
    t = view(clops.asarray(a, device=device))
    _same(t.get(), want)
    _same(clops.asnumpy(t), want)
    got = t.tolist()
    assert got == want.tolist()
    assert type(got) is type(want.tolist())  # a 0-d tensor gives a Python scalar
    for order in ("C", "F", "A"):
        host = t.get(order=order)
        _same(host, want)
        ref = np.array(want, order=order)
        assert host.flags.c_contiguous == ref.flags.c_contiguous
        assert host.flags.f_contiguous == ref.flags.f_contiguous
    out = np.empty(want.shape, want.dtype)
    assert t.get(out=out) is out
    _same(out, want)


def test_tolist_gives_python_scalars(device):
    t = clops.asarray(np.array([[1, -2], [3, 4]], np.int8), device=device)
    got = t.tolist()
    assert got == [[1, -2], [3, 4]] and type(got[0][0]) is int
    assert type(clops.asarray(True, device=device).tolist()) is bool
    assert type(clops.asarray(2.5, device=device).tolist()) is float
    assert clops.asarray(np.zeros((0, 3), np.float32), device=device).tolist() == []


def test_bfloat16_comes_back_as_float32(device):
    t = clops.asarray([1.0, 2.5], dtype=clops.bfloat16, device=device)
    _same(t.get(), np.array([1.0, 2.5], np.float32))
    assert t.tolist() == [1.0, 2.5]
    out = np.empty(2, np.float32)
    assert t.get(out=out) is out and out.tolist() == [1.0, 2.5]


def test_get_into_a_strided_out(device):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    big = np.zeros((3, 8), np.float32)
    out = big[:, ::2]
    clops.asarray(a, device=device).get(out=out)
    np.testing.assert_array_equal(big[:, ::2], a)
    assert not big[:, 1::2].any()


def test_asnumpy_of_host_values():
    _same(clops.asnumpy([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]]))
    _same(clops.asnumpy(3.5), np.asarray(3.5))
    a = np.arange(6).reshape(2, 3)
    assert clops.asnumpy(a) is a  # as numpy.asarray: no copy of a numpy array
    assert clops.asnumpy(a, order="F").flags.f_contiguous
    out = np.empty((2, 3), a.dtype)
    assert clops.asnumpy(a, out=out) is out
    np.testing.assert_array_equal(out, a)


def test_bad_arguments_are_refused_by_name(device):
    t = clops.asarray(np.ones((2, 3), np.float32), device=device)
    with pytest.raises(ValueError, match="shape"):
        t.get(out=np.empty((3, 2), np.float32))
    with pytest.raises(TypeError, match="dtype"):
        t.get(out=np.empty((2, 3), np.float64))
    with pytest.raises(TypeError, match="numpy.ndarray"):
        t.get(out=[[0.0] * 3] * 2)
    ro = np.empty((2, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        t.get(out=ro)
    with pytest.raises(ValueError, match="order"):
        t.get(order="K")
    with pytest.raises(ValueError, match="stream"):
        t.get(stream=device.queue)
    with pytest.raises(ValueError, match="stream"):
        clops.asnumpy([1, 2], stream=object())
    with pytest.raises(ValueError, match="shape"):
        clops.asnumpy([1, 2], out=np.empty(3, np.int64))
