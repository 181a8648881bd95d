"""Strided views: the quick forms of row-major strides, contiguity and reshape give what the
plain definitions give (no device)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from clops.graph.ir import View, contiguous_strides

dims = st.lists(st.sampled_from([0, 1, 1, 2, 3, 4, 6]), max_size=5)


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The definition: each axis steps over the elements of the axes after it (a length of 0
    counting as 1)."""
    return tuple(math.prod(max(n, 1) for n in shape[i + 1:]) for i in range(len(shape)))


@given(dims)
def test_contiguous_strides_are_row_major(shape: list[int]) -> None:
    assert contiguous_strides(tuple(shape)) == _row_major(tuple(shape))


@given(dims, st.data())
@settings(max_examples=300)
def test_is_contiguous_ignores_axes_of_length_one(shape: list[int], data: st.DataObject
                                                  ) -> None:
    rows = _row_major(tuple(shape))
    strides = tuple(data.draw(st.sampled_from([s, s, 0, 2 * s + 1, -s])) for s in rows)
    want = all(a == b for a, b, n in zip(strides, rows, shape) if n != 1)
    assert View(tuple(shape), strides).is_contiguous is want


@given(st.integers(1, 4), st.data())
@settings(max_examples=300)
def test_reshape_of_contiguous_views_regroups_alike(rank: int, data: st.DataObject) -> None:
    # a contiguous view (axes of length 1 at any stride) reshaped to a shape of as many
    # elements: the quick form and the walk over axis groups agree
    old = tuple(data.draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=rank,
                                   max_size=rank)))
    strides = tuple(data.draw(st.sampled_from([s, 0, 7])) if n == 1 else s
                    for s, n in zip(_row_major(old), old))
    v = View(old, strides, data.draw(st.integers(0, 9)))
    assert v.is_contiguous
    total = math.prod(old)
    new: list[int] = []
    left = total
    while left > 1:
        d = data.draw(st.sampled_from([k for k in range(2, left + 1) if left % k == 0]))
        new.append(d)
        left //= d
    ones = data.draw(st.integers(0, 2))
    shape = tuple(data.draw(st.permutations(new + [1] * ones)))
    got = v.reshape(shape)
    assert got is not None and got == v._regroup(shape)
    assert got.shape == shape and got.offset == v.offset


def test_views_compare_and_hash_by_their_fields() -> None:
    a, b = View((2, 3), (3, 1), 4), View((2, 3), (3, 1), 4)
    assert a == b and hash(a) == hash(b) and a != View((2, 3), (3, 1), 5)
    assert {a: 1}[b] == 1
