"""Advanced indexing against numpy: integer arrays (adjacent and separated, negative,
broadcast), boolean masks, mixtures with slices/None/ellipsis, and __setitem__ with all of them;
take and take_along_axis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clops as xp

A = np.arange(60, dtype=np.float32).reshape(3, 4, 5)


def _idx(a: np.ndarray) -> xp.Tensor:
    return xp.asarray(a)


KEYS = [
    lambda: (np.array([2, 0, -1]),),
    lambda: (slice(None), np.array([[1, 3], [0, -2]])),
    lambda: (np.array([0, 2]), slice(1, 3), np.array([4, 0])),  # separated: dims go first
    lambda: (np.array([0, 2]), np.array([1, 3])),
    lambda: (Ellipsis, np.array([1, 1, 4])),
    lambda: (None, np.array([1]), slice(None, None, -1)),
    lambda: (1, np.array([0, 3]), slice(None)),
    lambda: (A > 30,),
    lambda: (A[:, :, 0] > 20,),
    lambda: (slice(None), A[0] % 3 == 0),
    lambda: (np.array([True, False, True]), 2),
    lambda: (np.array(True),),
    lambda: (np.array(False), 0),
    lambda: (np.array([], dtype=np.int64),),
]


@pytest.mark.parametrize("k", range(len(KEYS)))
def test_getitem_matches_numpy(k: int) -> None:
    key = KEYS[k]()
    ref = A[key]
    ckey = tuple(_idx(i) if isinstance(i, np.ndarray) else i for i in key)
    got = xp.asarray(A)[ckey]
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got.to_numpy(), ref)


@pytest.mark.parametrize("k", range(len(KEYS)))
def test_setitem_matches_numpy(k: int) -> None:
    key = KEYS[k]()
    ref = A.copy()
    shape = ref[key].shape
    vals = (np.arange(int(np.prod(shape)), dtype=np.float32) + 1000).reshape(shape)
    ref[key] = vals
    t = xp.asarray(A)
    ckey = tuple(_idx(i) if isinstance(i, np.ndarray) else i for i in key)
    t[ckey] = xp.asarray(vals)
    np.testing.assert_array_equal(t.to_numpy(), ref)
    ref2 = A.copy()
    ref2[key] = -1.5
    t2 = xp.asarray(A)
    t2[ckey] = -1.5
    np.testing.assert_array_equal(t2.to_numpy(), ref2)


def test_mask_assign_is_lazy_where_and_keeps_views() -> None:
    t = xp.asarray(A.copy())
    view = t[1]
    t[t > 50] = 0.0
    ref = A.copy()
    ref[ref > 50] = 0
    np.testing.assert_array_equal(t.to_numpy(), ref)
    np.testing.assert_array_equal(view.to_numpy(), ref[1])
    t[xp.asarray(A[..., 0] > 10)] = xp.asarray(np.arange(5, dtype=np.float32))
    ref[A[..., 0] > 10] = np.arange(5)
    np.testing.assert_array_equal(t.to_numpy(), ref)


def test_setitem_reads_before_it_writes() -> None:
    t = xp.asarray(np.arange(6, dtype=np.int64))
    pending = t * 2
    t[xp.asarray([0, 5])] = t[xp.asarray([5, 0])]
    assert t.to_numpy().tolist() == [5, 1, 2, 3, 4, 0]
    assert pending.to_numpy().tolist() == [0, 2, 4, 6, 8, 10]


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), data=st.data())
def test_integer_arrays_hypothesis(shape: list[int], data: st.DataObject) -> None:
    a = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    key = []
    for n in shape:
        kind = data.draw(st.sampled_from(["slice", "array", "int"]))
        if kind == "slice":
            key.append(slice(data.draw(st.integers(-n, n)), None, data.draw(st.sampled_from(
                [1, 2, -1]))))
        elif kind == "int":
            key.append(data.draw(st.integers(-n, n - 1)))
        else:
            key.append(np.array(data.draw(st.lists(st.integers(-n, n - 1), min_size=1,
                                                   max_size=4))))
    lens = {len(k) for k in key if isinstance(k, np.ndarray)}
    if len(lens) > 1:
        key = [k[:1] if isinstance(k, np.ndarray) else k for k in key]
    ref = a[tuple(key)]
    got = xp.asarray(a)[tuple(xp.asarray(k) if isinstance(k, np.ndarray) else k for k in key)]
    np.testing.assert_array_equal(got.to_numpy(), ref)


def test_take_and_take_along_axis() -> None:
    x = xp.asarray(A)
    idx = np.array([3, 0, -1])
    np.testing.assert_array_equal(xp.take(x, xp.asarray(idx), axis=1).to_numpy(),
                                  np.take(A, idx, axis=1))
    np.testing.assert_array_equal(xp.take(xp.asarray(A[0, 0]), xp.asarray(idx)).to_numpy(),
                                  np.take(A[0, 0], idx))
    order = np.argsort(-A, axis=2)
    np.testing.assert_array_equal(
        xp.take_along_axis(x, xp.asarray(order), axis=2).to_numpy(),
        np.take_along_axis(A, order, axis=2))
    pick = np.array([[[1]], [[0]], [[2]]])
    np.testing.assert_array_equal(
        xp.take_along_axis(x, xp.asarray(pick), axis=1).to_numpy(),
        np.take_along_axis(A, pick, axis=1))


def test_setitem_repeated_indices_last_write_wins() -> None:
    # On every device, as numpy: the last assignment to a repeated index stays.
    t = xp.zeros(6, dtype=xp.int32)
    idx = np.array([4, 1, 4, 0, 1, 4])
    t[xp.asarray(idx)] = xp.asarray(np.arange(6, dtype=np.int32) + 10)
    ref = np.zeros(6, np.int32)
    ref[idx] = np.arange(6) + 10
    np.testing.assert_array_equal(t.to_numpy(), ref)
    big = np.random.default_rng(0).integers(0, 50, size=3000)
    u = xp.zeros(50, dtype=xp.float32)
    u[xp.asarray(big)] = xp.asarray(np.arange(3000, dtype=np.float32))
    ref = np.zeros(50, np.float32)
    ref[big] = np.arange(3000)
    np.testing.assert_array_equal(u.to_numpy(), ref)


def test_setitem_on_pending_tensor() -> None:
    # the target is still a lazy graph when assigned into (as scikit-learn's StandardScaler does)
    zero = xp.asarray(0.0)
    u = zero / (zero / xp.asarray([80.0, 80.0]))  # pending NaNs
    n = xp.asarray([5.0, 6.0]) * 2
    flag = zero == 0
    u[flag] = n[flag]
    assert u.to_numpy().tolist() == [10.0, 12.0]
    w = xp.arange(6) * 2
    w[xp.asarray([1, 3])] = -1
    assert w.to_numpy().tolist() == [0, -1, 4, -1, 8, 10]
