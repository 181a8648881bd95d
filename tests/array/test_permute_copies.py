"""Array, copies of permuted views against numpy on every test device: ``permute_dims(...)``
made contiguous, where a view that moves the unit-stride axis takes the tiled copy
(``gather.permute_tiles``) on CPUs, and the plan that decides it (no device)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops
from clops.kernels import gather

DTYPES = ["float32", "float64", "int8", "uint64", "bool", "float16", "complex128"]


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    a = rng.standard_normal(shape) * 50
    if dtype == "complex128":
        return a + 1j * rng.standard_normal(shape)
    if dtype == "bool":
        return a > 0
    if dtype == "uint64":
        return rng.integers(0, 2**64 - 1, size=shape, dtype=np.uint64, endpoint=True)
    return a.astype(dtype)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 40), min_size=2, max_size=4), data=st.data())
def test_permute_contiguous_hypothesis(device: clops.CLDevice, shape: list[int],
                                       data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    dtype = data.draw(st.sampled_from(DTYPES))
    if dtype == "complex128" and not device.caps.fp64:
        dtype = "float32"
    a = _values(rng, tuple(shape), dtype)
    axes = data.draw(st.permutations(range(len(shape))))
    x = clops.asarray(a, device=device)
    view = data.draw(st.sampled_from(["plain", "sliced", "offset"]))
    ref = a
    if view == "sliced":
        x, ref = x[..., 1:], a[..., 1:]
    elif view == "offset":
        x, ref = x[1:], a[1:]
    got = clops.permute_dims(x, tuple(axes)).contiguous().to_numpy()
    want = np.ascontiguousarray(ref.transpose(axes))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,axes", [((64, 128, 64), (2, 0, 1)), ((33, 70, 19), (2, 0, 1)),
                                        ((300, 17), (1, 0)), ((9, 8, 7, 65), (3, 1, 0, 2)),
                                        ((5, 40, 3, 50), (0, 3, 2, 1)), ((1, 4096, 1), (2, 1, 0))])
def test_permute_tiles_sizes(device: clops.CLDevice, shape: tuple[int, ...],
                             axes: tuple[int, ...]) -> None:
    a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    x = clops.asarray(a, device=device)
    np.testing.assert_array_equal(np.asarray(clops.permute_dims(x, axes).contiguous()),
                                  np.ascontiguousarray(a.transpose(axes)))


def test_permute_takes_the_tiles_on_cpus(device: clops.CLDevice) -> None:
    a = np.arange(64 * 32 * 16, dtype=np.float32).reshape(64, 32, 16)
    x = clops.asarray(a, device=device)
    with clops.profile() as prof:
        got = clops.permute_dims(x, (2, 0, 1)).contiguous().to_numpy()
    np.testing.assert_array_equal(got, np.ascontiguousarray(a.transpose(2, 0, 1)))
    names = {r.name for r in prof.kernels()}
    if device.kind == "cpu":
        assert names & {"permute_lines", "permute_tiles"}, names


def test_permute_plan_matches_the_view() -> None:
    """Every plan, replayed in Python on a permuted view of a dense block, is the copy numpy
    makes; views that are not a moved unit-stride axis get no plan."""
    for shape in [(8, 16, 32), (20, 9, 33), (4, 5, 6, 70)]:
        a = np.arange(np.prod(shape)).reshape(shape)
        for axes in itertools.permutations(range(len(shape))):
            v = a.transpose(axes)
            plan = gather.permute_plan(v.shape, tuple(s // a.itemsize for s in v.strides))
            if axes[-1] == len(shape) - 1 or v.size < gather.PERMUTE_TILES_MIN:
                assert plan is None
            if plan is None:
                continue
            nq, osq, nj, sj, na, sa, osa, nb, sb, osb = plan
            out = np.empty(v.size, a.dtype)
            flat = a.reshape(-1)
            for ia, ib, iq, j in itertools.product(range(na), range(nb), range(nq), range(nj)):
                out[ia * osa + ib * osb + iq * osq + j] = flat[ia * sa + ib * sb + iq + j * sj]
            np.testing.assert_array_equal(out.reshape(v.shape), v)
    assert gather.permute_plan((64, 64), (0, 1)) is None  # a broadcast axis
    assert gather.permute_plan((64, 64), (-64, 1)) is None  # a flip
    assert gather.permute_plan((64, 64), (2, 128)) is None  # not dense
