"""Array, unique_values and unique_counts against numpy on every test device, through the path
that hashes chunks of the input first on CPUs (``sort.distinct``) and its way back to the sort
(a NaN, too many distinct values): dtypes, sizes, -0.0 and 0.0, infinities and NaNs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops
from clops.array import set_functions
from clops.kernels import sort

DTYPES = ["float32", "float16", "uint64", "bool"]


def _pool(rng: np.random.Generator, dtype: str, k: int, special: bool) -> np.ndarray:
    """``k`` candidate values of ``dtype`` (with -0.0, 0.0, infinities and a NaN if
    ``special``)."""
    if dtype == "bool":
        return np.array([True, False])
    if dtype == "uint64":
        return rng.integers(0, 2**64 - 1, size=k, dtype=np.uint64, endpoint=True)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=k, endpoint=True).astype(dtype)
    p = (rng.standard_normal(k) * 1000).astype(dtype)
    if special:
        p = np.concatenate([p, np.array([-0.0, 0.0, np.inf, -np.inf, np.nan], dtype)])
    return p


def _check(x: clops.Tensor, a: np.ndarray) -> None:
    want, counts = np.unique(a, return_counts=True, equal_nan=False)
    got = clops.unique_values(x).to_numpy()
    np.testing.assert_array_equal(got, want)
    res = clops.unique_counts(x)
    np.testing.assert_array_equal(res.values.to_numpy(), want)
    np.testing.assert_array_equal(res.counts.to_numpy(), counts)
    if a.dtype.kind == "f" and (a == 0).any():
        # of -0.0 and 0.0, the first one in the input stands for both
        first = a.reshape(-1)[np.argmax(a.reshape(-1) == 0)]
        zero = got[got == 0]
        assert zero.size == 1 and np.signbit(zero[0]) == np.signbit(first)


@pytest.fixture
def hash_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hashing path for any size, in chunks of at least 16 elements."""
    monkeypatch.setattr(set_functions, "UNIQUE_HASH_MIN", 1)
    monkeypatch.setattr(sort, "DISTINCT_MIN_CHUNK", 16)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 3000), k=st.integers(1, 3000), dtype=st.sampled_from(DTYPES),
       special=st.booleans(), seed=st.integers(0, 2**16))
def test_unique_hashed_hypothesis(device: clops.CLDevice, hash_small: None, n: int, k: int,
                                  dtype: str, special: bool, seed: int) -> None:
    if dtype == "float64" and not device.caps.fp64:
        dtype = "float32"
    rng = np.random.default_rng(seed)
    pool = _pool(rng, dtype, k, special)
    a = pool[rng.integers(0, pool.size, size=n)]
    _check(clops.asarray(a, device=device), a)


@pytest.mark.parametrize("dtype", ["float32", "uint64", "bool"])
def test_unique_hashed_long(device: clops.CLDevice, dtype: str) -> None:
    """An input long enough for the hashing path at its own sizes; the kernel is seen."""
    rng = np.random.default_rng(1)
    a = _pool(rng, dtype, 1000, False)[rng.integers(0, 1000 if dtype != "bool" else 2,
                                                    size=100_003)]
    x = clops.asarray(a.reshape(7, -1) if a.size % 7 == 0 else a, device=device)
    with clops.profile() as prof:
        _check(x, a.reshape(x.shape))
    if device.kind == "cpu":
        assert "distinct_chunks" in {r.name for r in prof.kernels()}


@pytest.mark.parametrize("case", ["nan", "many", "half-zeros"])
def test_unique_hashed_falls_back(device: clops.CLDevice, hash_small: None, case: str) -> None:
    """A NaN (every NaN a value of its own) or more distinct values than a chunk's table holds
    send the input to the sort; a chunk of only zeros of both signs keeps the first."""
    rng = np.random.default_rng(2)
    n = 40_000
    a = np.round(rng.standard_normal(n) * 10).astype(np.float32)
    if case == "nan":
        a[[5, 17_000, 39_999]] = np.nan
    elif case == "many":
        a = rng.standard_normal(n).astype(np.float32)
    else:
        a = np.where(rng.random(n) < 0.5, np.float32(-0.0), np.float32(0.0))
        a[20_000] = 3.0
    _check(clops.asarray(a, device=device), a)
