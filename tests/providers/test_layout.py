"""On-device relayout: strided copies with conversion, padding and rolling, against numpy."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clops.kernels import layout


def test_transpose_and_convert(device, up, down):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    src = up(a, (4, 3, 2), (1, 4, 12))  # the transposed view
    np.testing.assert_array_equal(down(src), a.T)
    c = layout.contiguous(device, src, "complex64")
    assert c.is_contiguous and c.offset == 0
    np.testing.assert_array_equal(down(c), a.T.astype(np.complex64))
    back = layout.contiguous(device, c, "float64")  # the real part
    np.testing.assert_array_equal(down(back), a.T)


def test_pad_roll_conj(device, up, down):
    a = (np.arange(12) + 1j * np.arange(12)).reshape(3, 4).astype(np.complex64)
    src = up(a)
    out = layout.empty(device, (3, 6), "complex64")
    layout.copy(device, src, out, valid=(3, 4), conj=True)
    want = np.zeros((3, 6), np.complex64)
    want[:, :4] = a.conj()
    np.testing.assert_array_equal(down(out), want)
    rolled = layout.empty(device, (3, 4), "complex64")
    layout.copy(device, src, rolled, rot=(1, 3))
    np.testing.assert_array_equal(down(rolled), np.roll(a, (-1, -3), axis=(0, 1)))


def test_half_storage(device, up, down):
    h = np.linspace(-2, 2, 10).astype(np.float16)
    f = layout.contiguous(device, up(h), "float32")
    np.testing.assert_array_equal(down(f), h.astype(np.float32))
    back = layout.contiguous(device, f, "float16")
    np.testing.assert_array_equal(down(back), h)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_any_view(device, up, down, shape, data):
    # a random slice with steps (negative ones too), transposed, of a random array
    base = np.arange(np.prod(shape) * 2 ** len(shape), dtype=np.float32)
    base = base.reshape([2 * n for n in shape])
    steps = [data.draw(st.sampled_from([1, 2, -1, -2])) for _ in shape]
    perm = data.draw(st.permutations(range(base.ndim)))
    view = base[tuple(slice(None, None, s) for s in steps)].transpose(perm)
    strides = tuple(s // 4 for s in view.strides)
    offset = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // 4
    got = down(up(base, view.shape, strides, offset))
    np.testing.assert_array_equal(got, view)
