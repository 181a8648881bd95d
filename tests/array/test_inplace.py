"""In-place updates keep Array API semantics against existing views and pending readers."""

from __future__ import annotations

import numpy as np
import pytest

import clops


def test_iadd_through_a_view_is_seen_by_the_base(device):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = clops.asarray(a.copy(), device=device)
    v = t[1:, ::2]
    v += 100
    a[1:, ::2] += 100
    np.testing.assert_array_equal(np.asarray(t), a)
    np.testing.assert_array_equal(np.asarray(v), a[1:, ::2])


def test_pending_readers_see_the_old_values(device):
    t = clops.asarray(np.ones(5, np.float32), device=device)
    lazy = t * 2  # not computed yet
    t += 10
    np.testing.assert_array_equal(np.asarray(lazy), np.full(5, 2.0))
    np.testing.assert_array_equal(np.asarray(t), np.full(5, 11.0))


def test_an_assigned_right_hand_side_keeps_its_values(device):
    # the right-hand side computed into the target's memory must not be read from there later:
    # the target's next write would change it
    x = np.arange(8, dtype=np.float32)
    a = clops.asarray(x, device=device)
    y = clops.zeros((8,), dtype=clops.float32, device=device)
    r = a * 2  # pending
    y[...] = r
    y[...] = 0
    np.testing.assert_array_equal(np.asarray(r), x * 2)
    z = clops.zeros((4, 8), dtype=clops.float32, device=device)
    s = clops.sum(a.reshape((2, 4)) * 3, axis=1)  # pending reduction
    z[2, :2] = s
    z += 1
    np.testing.assert_array_equal(np.asarray(s), (x.reshape(2, 4) * 3).sum(1))
    w = (a + 1).reshape((2, 4))  # a reshape of a pending node
    zz = clops.zeros((2, 4), dtype=clops.float32, device=device)
    zz[...] = w
    zz[...] = -1
    np.testing.assert_array_equal(np.asarray(w), (x + 1).reshape(2, 4))
    np.testing.assert_array_equal(np.asarray(z)[2, :2], (x.reshape(2, 4) * 3).sum(1) + 1)


def test_overlapping_setitem_uses_the_old_right_hand_side(device):
    a = np.arange(10, dtype=np.int32)
    t = clops.asarray(a.copy(), device=device)
    t[1:] = t[:-1]
    a[1:] = a[:-1].copy()
    np.testing.assert_array_equal(np.asarray(t), a)
    t[::-1] = t
    np.testing.assert_array_equal(np.asarray(t), a[::-1])


def test_setitem_scalar_broadcast_and_dtype_cast(device):
    t = clops.zeros((3, 4), dtype=clops.int32, device=device)
    t[0] = 5
    t[:, 1] = clops.asarray([7, 8, 9], device=device)
    t[2, 3] = 1.9  # cast to the tensor's dtype
    ref = np.zeros((3, 4), np.int32)
    ref[0] = 5
    ref[:, 1] = [7, 8, 9]
    ref[2, 3] = 1
    np.testing.assert_array_equal(np.asarray(t), ref)


def test_inplace_dtype_change_is_refused(device):
    t = clops.asarray(np.ones(3, np.int32), device=device)
    with pytest.raises(TypeError, match="dtype"):
        t += 1.5
    np.testing.assert_array_equal(np.asarray(t), np.ones(3))


def test_inplace_every_operator(device):
    a = np.arange(1, 7, dtype=np.int64)
    t = clops.asarray(a.copy(), device=device)
    for op in ["__iadd__", "__isub__", "__imul__", "__ifloordiv__", "__imod__", "__iand__",
               "__ior__", "__ixor__", "__ilshift__", "__irshift__"]:
        getattr(t, op)(3)
        a = getattr(a, op)(3)
        np.testing.assert_array_equal(np.asarray(t), a, op)
