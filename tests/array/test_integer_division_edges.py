"""Array layer, integer floor division and remainder at the edges, against numpy: ``MIN % -1``
is 0 (it gave -1 for int32 and int64: ``%`` by -1 of MIN is undefined in OpenCL C), ``MIN // -1``
wraps to MIN as numpy's does, and division by 0 gives 0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops

SIGNED = ["int8", "int16", "int32", "int64"]
UNSIGNED = ["uint8", "uint16", "uint32", "uint64"]


def _edges(dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    vals = {info.min, info.min + 1, info.max, info.max - 1, 0, 1, 2, 7}
    if info.min < 0:
        vals |= {-1, -2, -7}
    return np.array(sorted(vals), dtype=dtype)


def _numpy(op: str, a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    with np.errstate(all="ignore"):  # numpy warns on MIN // -1 and on x // 0, then gives these
        return np.floor_divide(a, b) if op == "//" else np.remainder(a, b)


@pytest.mark.parametrize("op", ["//", "%"])
@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED)
def test_every_pair_of_edge_values_matches_numpy(op, dtype, device):
    e = _edges(dtype)
    a, b = np.repeat(e, e.size), np.tile(e, e.size)  # every (a, b) pair
    ta, tb = clops.asarray(a, device=device), clops.asarray(b, device=device)
    got = (ta // tb) if op == "//" else (ta % tb)
    np.testing.assert_array_equal(got.to_numpy(), _numpy(op, a, b), err_msg=f"{dtype} {op}")


@pytest.mark.parametrize("dtype", SIGNED)
def test_min_by_minus_one(dtype, device):
    m = np.iinfo(dtype).min
    x = clops.asarray(np.array([m, m + 1, -5], dtype=dtype), device=device)
    want_div = _numpy("//", np.array([m, m + 1, -5], dtype=dtype), -1)
    assert want_div[0] == m  # wraps around
    # with a Python scalar, with a tensor, and in place
    np.testing.assert_array_equal((x % -1).to_numpy(), [0, 0, 0])
    np.testing.assert_array_equal((x // -1).to_numpy(), want_div)
    minus_one = clops.full((3,), -1, dtype=getattr(clops, dtype), device=device)
    np.testing.assert_array_equal(clops.remainder(x, minus_one).to_numpy(), [0, 0, 0])
    np.testing.assert_array_equal(clops.floor_divide(x, minus_one).to_numpy(), want_div)
    y = clops.asarray(np.array([m, m + 1, -5], dtype=dtype), device=device)
    y %= -1
    np.testing.assert_array_equal(y.to_numpy(), [0, 0, 0])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), dtype=st.sampled_from(SIGNED))
def test_random_values_with_negative_divisors_match_numpy(data, dtype, device):
    info = np.iinfo(dtype)
    vals = st.integers(int(info.min), int(info.max))
    a = np.array(data.draw(st.lists(vals, min_size=1, max_size=16)), dtype=dtype)
    b = np.array(data.draw(st.lists(st.integers(int(info.min), 3) | st.just(-1),
                                    min_size=a.size, max_size=a.size)), dtype=dtype)
    ta, tb = clops.asarray(a, device=device), clops.asarray(b, device=device)
    np.testing.assert_array_equal((ta % tb).to_numpy(), _numpy("%", a, b))
    np.testing.assert_array_equal((ta // tb).to_numpy(), _numpy("//", a, b))
