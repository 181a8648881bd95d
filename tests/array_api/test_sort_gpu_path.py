"""The GPUs' radix sort (``kernels/sort_gpu.cl``) behind sort, argsort and unique_*, run on every
test device taken for a GPU, against numpy: a float, a wide and a narrow integer dtype (each
dtype, output and tile is a program of its own, a build of 7-14 s on Intel's CPU runtime; every
dtype runs through this sort on GPUs themselves, in ``test_sort_radix.py`` and
``test_sorting_searching.py``), lengths 0 to ~100k that are not powers of
two (rows sorted whole by a work-group, and rows cut into tiles), rows, both orders, special
values (NaN with payloads of both signs, +-inf, -0.0 beside 0.0), ties, sorted and reversed input.
Values are compared bit for bit, so that the order of -0.0 and 0.0 and of NaNs shows. Also: the
number of launches is a few a pass, not the bitonic network's O(log^2 n)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops as xp
from clops.compiler import realize
from clops.kernels import sort as sort_kernels

from .test_sort_radix import _bits, _reference, _skip_fp64

# (a GPU path run on the CPU device: .ci/run's second pass leaves it out)
pytestmark = pytest.mark.standin

DTYPES = [np.float32, np.int64, np.uint8]
FIXTURE = [HealthCheck.function_scoped_fixture]  # the same GPU-path device for every example
# 0.0, -0.0, 1.0, -1.0, NaN, a negative NaN of payload 1, a NaN of payload 0x123, +-inf, 2.5,
# -2.5, 1e-30, 3e38 (inf in float16), 1.5 twice more (ties)
SPECIAL = np.array([0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x7FC00000, 0xFFC00001,
                    0x7FC00123, 0x7F800000, 0xFF800000, 0x40200000, 0xC0200000, 0x0DA24260,
                    0x7F61B1E6, 0x3FC00000, 0x3FC00000], np.uint32).view(np.float32)


@pytest.fixture
def gpu(device: xp.CLDevice, monkeypatch: pytest.MonkeyPatch) -> Iterator[xp.CLDevice]:
    """The device taken for a GPU: sorts go through sort_gpu.cl."""
    if device.kind == "cpu":
        monkeypatch.setattr(device, "kind", "gpu")
    realize._KERNELS.clear()
    realize.FORMS.clear()
    yield device
    realize._KERNELS.clear()
    realize.FORMS.clear()


def _check(device: xp.CLDevice, a: np.ndarray, descending: bool) -> None:
    t = xp.asarray(a, device=device)
    ref = _reference(a, descending)
    if a.dtype.kind != "b" and not (a.dtype.kind == "f" and np.isnan(a).any()):
        # numpy's own stable sorts agree where nothing is NaN (ascending)
        if not descending:
            np.testing.assert_array_equal(ref, np.argsort(a, axis=-1, kind="stable"))
    np.testing.assert_array_equal(xp.argsort(t, descending=descending).to_numpy(), ref)
    want = np.take_along_axis(a, ref, axis=-1)
    got = xp.sort(t, descending=descending).to_numpy()
    np.testing.assert_array_equal(_bits(got), _bits(want))
    if not descending and a.ndim == 1:
        np.testing.assert_array_equal(_bits(got), _bits(np.sort(a, kind="stable")))


def _values(dtype: type, pool: str, size: int, rng: np.random.Generator) -> np.ndarray:
    d = np.dtype(dtype)
    if d.kind == "b":
        return rng.random(size) < 0.5
    if d.kind == "f":
        if pool == "special":  # NaN payloads carried over by the casts
            with np.errstate(over="ignore", invalid="ignore"):
                return SPECIAL[rng.integers(0, len(SPECIAL), size)].astype(d)
        if pool == "ties":
            return np.asarray(rng.integers(-3, 4, size), d) * np.asarray(0.5, d)
        return np.asarray(rng.standard_normal(size) * 10.0 ** rng.integers(-3, 4, size), d)
    info = np.iinfo(d)
    if pool == "ties":
        return np.asarray(rng.integers(0, 4, size), d)
    if pool == "special":  # the extremes, and small values (high bytes the same: skipped passes)
        extremes = np.array([info.min, info.max, 0, 1, 2, info.max - 1], d)
        return extremes[rng.integers(0, len(extremes), size)]
    return rng.integers(info.min, info.max, size, dtype=d, endpoint=True)


def _array(dtype: type, pool: str, order: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = _values(dtype, pool, int(np.prod(shape)), rng).reshape(shape)
    if order != "random":
        a = np.take_along_axis(a, _reference(a, False), axis=-1)
        a = a[..., ::-1].copy() if order == "reversed" else a
    return a


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE)
@given(dtype=st.sampled_from(DTYPES), n=st.integers(0, 5000), rows=st.integers(1, 4),
       pool=st.sampled_from(["special", "ties", "wide"]),
       order=st.sampled_from(["random", "sorted", "reversed"]), descending=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_sort_argsort(gpu: xp.CLDevice, dtype: type, n: int, rows: int, pool: str, order: str,
                      descending: bool, seed: int) -> None:
    _skip_fp64(gpu, dtype)
    a = _array(dtype, pool, order, (rows, n), seed)
    _check(gpu, a if rows > 1 else a[0], descending)


# rows cut into tiles: up to 25 tiles of 4096, and (tiles of 256) more tiles than a work-group
# scans at once
@settings(max_examples=12, deadline=None, suppress_health_check=FIXTURE)
@given(dtype=st.sampled_from(DTYPES), n=st.integers(4097, 100_003), small_tiles=st.booleans(),
       pool=st.sampled_from(["special", "ties", "wide"]),
       order=st.sampled_from(["random", "sorted", "reversed"]), descending=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_sort_argsort_long(gpu: xp.CLDevice, monkeypatch: pytest.MonkeyPatch, dtype: type,
                           n: int, small_tiles: bool, pool: str, order: str, descending: bool,
                           seed: int) -> None:
    _skip_fp64(gpu, dtype)
    monkeypatch.setattr(sort_kernels, "GPU_ITEMS", 1 if small_tiles else 16)
    _check(gpu, _array(dtype, pool, order, (n,), seed), descending)


@pytest.mark.parametrize("shape", [(3, 5000), (2, 70_001), (64, 1024), (300, 33), (7, 1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows(gpu: xp.CLDevice, shape: tuple[int, ...], dtype: type) -> None:
    _skip_fp64(gpu, dtype)
    for pool in ("special", "wide"):
        a = _array(dtype, pool, "random", shape, sum(shape))
        for descending in (False, True):
            _check(gpu, a, descending)


@pytest.mark.parametrize(("dtype", "n"), [(np.float32, 77), (np.float32, 50_000),
                                         (np.float64, 77)])
def test_one_key_zero_signs_and_nan_payloads(gpu: xp.CLDevice, dtype: type, n: int) -> None:
    """One key (every pass skipped), zeros of both signs only, NaNs of many payloads only: all
    come back in their input order."""
    _skip_fp64(gpu, dtype)
    rng = np.random.default_rng(3)
    u = np.dtype(f"u{np.dtype(dtype).itemsize}")
    sign = np.asarray(1, u) << np.asarray(8 * u.itemsize - 1, u)
    nans = np.asarray(np.nan, dtype).view(u) | np.asarray(rng.integers(0, 1000, n), u)
    nans = np.where(rng.random(n) < 0.5, nans | sign, nans).view(dtype)
    for a in (np.full(n, 7.0, dtype), np.where(rng.random(n) < 0.5, 0.0, -0.0).astype(dtype),
              nans):
        for descending in (False, True):
            _check(gpu, a, descending)


@settings(max_examples=25, deadline=None, suppress_health_check=FIXTURE)
@given(dtype=st.sampled_from(DTYPES), n=st.sampled_from([0, 1, 7, 300, 4097, 20_001]),
       pool=st.sampled_from(["special", "ties", "wide"]), seed=st.integers(0, 2**32 - 1))
def test_unique(gpu: xp.CLDevice, dtype: type, n: int, pool: str, seed: int) -> None:
    _skip_fp64(gpu, dtype)
    a = _array(dtype, pool, "random", (n,), seed)
    t = xp.asarray(a, device=gpu)
    vals, idx, inv, counts = np.unique(a, return_index=True, return_inverse=True,
                                       return_counts=True, equal_nan=False)
    np.testing.assert_array_equal(xp.unique_values(t).to_numpy(), vals)
    got = xp.unique_counts(t)
    np.testing.assert_array_equal(got.values.to_numpy(), vals)
    np.testing.assert_array_equal(got.counts.to_numpy(), counts)
    got_inv = xp.unique_inverse(t)
    np.testing.assert_array_equal(got_inv.inverse_indices.to_numpy(), inv.reshape(a.shape))
    got_all = xp.unique_all(t)
    np.testing.assert_array_equal(got_all.values.to_numpy(), vals)
    np.testing.assert_array_equal(got_all.indices.to_numpy(), idx)
    np.testing.assert_array_equal(got_all.counts.to_numpy(), counts)


@pytest.fixture
def launch_names(gpu: xp.CLDevice, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the kernels ``gpu.launch`` is given during the test, in order."""
    seen: list[str] = []
    launch = gpu.launch

    def spy(knl, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs.get("name") or "?")
        return launch(knl, *args, **kwargs)

    monkeypatch.setattr(gpu, "launch", spy)
    return seen


@pytest.mark.parametrize(("shape", "dtype", "sorts"),
                         [((1 << 18,), np.float32, 3 * 4), ((100_003,), np.int64, 3 * 8),
                          ((3, 9000), np.uint8, 3), ((512, 1024), np.float32, 1),
                          ((4096, 100), np.int64, 1)])
def test_launches_a_few_a_pass(gpu: xp.CLDevice, launch_names: list[str],
                               shape: tuple[int, ...], dtype: type, sorts: int) -> None:
    """Three launches a byte of the key for rows cut into tiles, one for rows a work-group sorts
    whole (the bitonic network took O(log^2 n): 2^18 keys, 171)."""
    _skip_fp64(gpu, dtype)
    a = _array(dtype, "wide", "random", shape, 1)
    t = xp.asarray(a, device=gpu)
    for descending in (False, True):
        for fn in (xp.sort, xp.argsort):
            launch_names.clear()
            out = fn(t, descending=descending)
            assert sum(name.startswith("rs_") for name in launch_names) == sorts, launch_names
            if fn is xp.argsort:
                np.testing.assert_array_equal(out.to_numpy(), _reference(a, descending))
