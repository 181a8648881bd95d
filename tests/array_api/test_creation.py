"""Creation functions against numpy: arange, linspace, eye, full, *_like, meshgrid, tril/triu,
asarray copies, astype and concat/stack with promotion."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clops as xp


@settings(max_examples=25, deadline=None)
@given(start=st.integers(-20, 20), stop=st.integers(-20, 20),
       step=st.integers(-5, 5).filter(lambda s: s != 0))
def test_arange_ints(start: int, stop: int, step: int) -> None:
    got = xp.arange(start, stop, step)
    assert got.dtype == xp.int64
    np.testing.assert_array_equal(got.to_numpy(), np.arange(start, stop, step))


def test_arange_floats_and_dtypes() -> None:
    np.testing.assert_allclose(xp.arange(0.0, 1.0, 0.1).to_numpy(),
                               np.arange(0.0, 1.0, 0.1, dtype=np.float32), rtol=1e-6)
    assert xp.arange(5, dtype=xp.uint8).dtype == xp.uint8
    assert xp.arange(3.0).dtype == xp.float32
    assert xp.arange(10, 0, 2).shape == (0,)


@settings(max_examples=40, deadline=None)
@given(start=st.integers(0, 2**64 - 1), step=st.integers(-(2**62), 2**62).filter(bool),
       n=st.integers(0, 6))
def test_arange_uint64_past_int64(start: int, step: int, n: int) -> None:
    # values of 2**63 and up are computed in uint64 (they overflowed int64 arithmetic before)
    last = start + (n - 1) * step if n else start
    if not 0 <= last < 2**64:
        with pytest.raises(OverflowError, match="outside uint64"):
            xp.arange(start, start + n * step, step, dtype=xp.uint64)
        return
    got = xp.arange(start, start + n * step, step, dtype=xp.uint64)
    want = np.arange(start, start + n * step, step, dtype=np.uint64)
    assert got.dtype == xp.uint64
    np.testing.assert_array_equal(got.to_numpy(), want)


@pytest.mark.parametrize("endpoint", [True, False])
def test_linspace(endpoint: bool) -> None:
    for num in (0, 1, 2, 7):
        got = xp.linspace(-1.0, 3.0, num, endpoint=endpoint).to_numpy()
        np.testing.assert_allclose(got, np.linspace(-1, 3, num, endpoint=endpoint), rtol=1e-6)
    z = xp.linspace(0, 1 + 2j, 4)
    assert z.dtype == xp.complex64
    np.testing.assert_allclose(z.to_numpy(), np.linspace(0, 1 + 2j, 4), rtol=1e-6)


def test_eye_full_like_tri() -> None:
    for n, m, k in ((3, None, 0), (3, 5, 1), (4, 2, -1), (2, 3, 7)):
        np.testing.assert_array_equal(xp.eye(n, m, k=k, dtype=xp.int32).to_numpy(),
                                      np.eye(n, m, k=k, dtype=np.int32))
    x = xp.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    for fn in (xp.zeros_like, xp.ones_like, xp.empty_like):
        y = fn(x, dtype=xp.int16)
        assert y.shape == x.shape and y.dtype == xp.int16
    np.testing.assert_array_equal(xp.full_like(x, 7).to_numpy(), np.full((3, 4), 7.0))
    assert xp.full((2,), True).dtype == xp.bool
    assert xp.full((2,), 3).dtype == xp.int64
    assert xp.full((), 1.5).shape == ()
    for k in (-2, 0, 1, 5):
        np.testing.assert_array_equal(xp.tril(x, k=k).to_numpy(), np.tril(x.to_numpy(), k))
        np.testing.assert_array_equal(xp.triu(x, k=k).to_numpy(), np.triu(x.to_numpy(), k))
    batched = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(xp.tril(xp.asarray(batched)).to_numpy(), np.tril(batched))


@pytest.mark.parametrize("indexing", ["xy", "ij"])
def test_meshgrid(indexing: str) -> None:
    a, b, c = np.arange(2), np.arange(3) + 10, np.arange(4) + 20
    got = xp.meshgrid(xp.asarray(a), xp.asarray(b), xp.asarray(c), indexing=indexing)
    for g, r in zip(got, np.meshgrid(a, b, c, indexing=indexing)):
        np.testing.assert_array_equal(g.to_numpy(), r)


def test_asarray_copy_semantics() -> None:
    x = xp.asarray([1.0, 2.0])
    assert xp.asarray(x) is x
    y = xp.asarray(x, copy=True)
    y[0] = 5.0
    assert x.to_numpy().tolist() == [1.0, 2.0]
    with pytest.raises(ValueError):
        xp.asarray([1, 2], copy=False)
    assert xp.asarray([[True, False]]).dtype == xp.bool
    assert xp.asarray(1.5).dtype == xp.float32
    assert xp.asarray(np.float64(1.5)).dtype == xp.float64


def test_astype_and_joins() -> None:
    x = xp.asarray([-1.7, 2.7, 0.0])
    np.testing.assert_array_equal(xp.astype(x, xp.int32).to_numpy(), [-1, 2, 0])
    np.testing.assert_array_equal(xp.astype(x, xp.bool).to_numpy(), [True, True, False])
    assert xp.astype(x, xp.float32, copy=False) is x
    with pytest.raises(TypeError):
        xp.astype(xp.asarray([1j]), xp.float32)
    c = xp.concat([xp.ones((2,), dtype=xp.int8), xp.zeros((1,), dtype=xp.int16)])
    assert c.dtype == xp.int16 and c.to_numpy().tolist() == [1, 1, 0]
    s = xp.stack([xp.ones((2, 3)), xp.zeros((2, 3))], axis=-1)
    np.testing.assert_array_equal(s.to_numpy(), np.stack([np.ones((2, 3)), np.zeros((2, 3))],
                                                         axis=-1))
