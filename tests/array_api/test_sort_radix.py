"""The CPU radix sort (``kernels/sort_cpu.cl``) behind sort, argsort and unique_* against numpy on
every test device: every dtype, lengths that are not powers of two (0, 1, rows, whole rows in one
work-item and long rows cut into chunks), special values (NaN, +-inf, -0.0 beside 0.0, NaN
payloads), many ties, sorted and reversed input, both orders. Values are compared bit for bit,
so that the order of -0.0 and 0.0 (equal, so kept as they came) and of NaNs shows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops as xp
from clops.kernels import sort as sort_kernels

INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
FLOATS = [np.float16, np.float32, np.float64]
DTYPES = [np.bool_, *INTS, *FLOATS]
NEG_NAN32 = np.array([0xFFC00001], np.uint32).view(np.float32)[0]  # a negative NaN, payload 1
FIXTURE = [HealthCheck.function_scoped_fixture]  # the device fixture is the same for every example
SPECIAL = [0.0, -0.0, 1.0, -1.0, np.nan, NEG_NAN32, np.inf, -np.inf, 2.5, -2.5, 1e-30, 3e38]


def _skip_fp64(device: xp.CLDevice, dtype: type) -> None:
    if np.dtype(dtype) == np.float64 and not device.caps.fp64:
        pytest.skip("the device has no float64")


def _reference(a: np.ndarray, descending: bool) -> np.ndarray:
    """Stable argsort along the last axis: NaN last (first when descending), -0.0 == 0.0."""
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        key = np.where(nan, 0.0, a.astype(np.float64))
        key = -key if descending else key
        return np.lexsort((key, ~nan if descending else nan), axis=-1)
    if descending:  # stable descending: ties keep their order (ranks, negated)
        inv = np.unique(a, return_inverse=True)[1].reshape(a.shape)
        return np.argsort(-inv, axis=-1, kind="stable")
    return np.argsort(a, axis=-1, kind="stable")


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind != "b" else a


def _check(device: xp.CLDevice, a: np.ndarray, descending: bool) -> None:
    t = xp.asarray(a, device=device)
    ref = _reference(a, descending)
    got_i = xp.argsort(t, descending=descending).to_numpy()
    np.testing.assert_array_equal(got_i, ref)
    got_v = xp.sort(t, descending=descending).to_numpy()
    want = np.take_along_axis(a, ref, axis=-1)
    np.testing.assert_array_equal(_bits(got_v), _bits(want))


def _values(dtype: type, pool: str, size: int, rng: np.random.Generator) -> np.ndarray:
    d = np.dtype(dtype)
    if d.kind == "b":
        return rng.random(size) < 0.5
    if d.kind == "f":
        if pool == "special":
            with np.errstate(over="ignore"):  # 3e38 is inf in float16
                return np.asarray(rng.choice(np.asarray(SPECIAL, np.float64), size), d)
        if pool == "ties":
            return np.asarray(rng.integers(-3, 4, size), d) * np.asarray(0.5, d)
        return np.asarray(rng.standard_normal(size) * 10.0 ** rng.integers(-3, 4, size), d)
    info = np.iinfo(d)
    if pool == "ties":
        return np.asarray(rng.integers(0, 4, size), d)
    return rng.integers(info.min, info.max, size, dtype=d, endpoint=True)


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURE)
@given(dtype=st.sampled_from(DTYPES), n=st.integers(0, 300), rows=st.integers(1, 5),
       pool=st.sampled_from(["special", "ties", "wide"]),
       order=st.sampled_from(["random", "sorted", "reversed"]), descending=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_sort_argsort_rows(device: xp.CLDevice, dtype: type, n: int, rows: int, pool: str,
                           order: str, descending: bool, seed: int) -> None:
    _skip_fp64(device, dtype)
    rng = np.random.default_rng(seed)
    a = _values(dtype, pool, rows * n, rng).reshape(rows, n)
    if order != "random":
        a = np.sort(a, axis=-1, kind="stable")
        a = a[:, ::-1].copy() if order == "reversed" else a
    _check(device, a if rows > 1 else a[0], descending)


# lengths past sort_kernels.RADIX_MIN_CHUNK * 2: one row's passes spread over chunks
@pytest.mark.parametrize("shape", [(40_000,), (100_003,), (2, 70_001), (5, 3_001)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8, np.int16])
@pytest.mark.parametrize("pool", ["special", "ties", "wide"])
def test_sort_argsort_long_rows(device: xp.CLDevice, shape: tuple[int, ...], dtype: type,
                                pool: str) -> None:
    _skip_fp64(device, dtype)
    rng = np.random.default_rng(sum(shape))
    a = _values(dtype, pool, int(np.prod(shape)), rng).reshape(shape)
    for descending in (False, True):
        _check(device, a, descending)


# many short rows: sorted values by a bitonic network (rows with a NaN or a -0.0, where the order
# of equal keys shows, by the radix sort)
@pytest.mark.parametrize("shape", [(8, 33), (9, 100), (16, 1000), (300, 64), (20, 4096)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint64, np.int8])
@pytest.mark.parametrize("pool", ["special", "ties", "wide"])
def test_sort_many_short_rows(device: xp.CLDevice, shape: tuple[int, ...], dtype: type,
                              pool: str) -> None:
    _skip_fp64(device, dtype)
    rng = np.random.default_rng(sum(shape))
    a = _values(dtype, pool, int(np.prod(shape)), rng).reshape(shape)
    if pool == "special":  # most rows plain, some with a NaN or a -0.0
        a = np.where(rng.random(shape) < 0.999, _values(dtype, "wide", a.size, rng).reshape(shape),
                     a)
    for descending in (False, True):
        _check(device, a, descending)


# the network's two forms on every CPU device: explicit vectors (0) and the lanes form in groups
# of 8, 16 and 32 rows (Intel's runtime takes its native vector width, 16 on AVX-512)
@pytest.mark.parametrize("form", [0, 8, 16, 32])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint64])
def test_bitonic_forms(device: xp.CLDevice, monkeypatch: pytest.MonkeyPatch, form: int,
                       dtype: type) -> None:
    from clops import profile

    if device.kind != "cpu":
        pytest.skip("the CPU devices' sort (GPUs sort in sort_gpu.cl)")
    _skip_fp64(device, dtype)
    monkeypatch.setattr(sort_kernels, "bitonic_lanes", lambda dev: form)
    rng = np.random.default_rng(form)
    for shape in ((37, 100), (16, 1000), (9, 4096)):
        a = _values(dtype, "wide", int(np.prod(shape)), rng).reshape(shape)
        if dtype != np.uint64:  # a row with a NaN and one with a -0.0 (the radix sort takes them)
            a[3, 7], a[5, 1] = np.nan, -0.0
        t = xp.asarray(a, device=device)
        for descending in (False, True):
            with profile() as prof:
                got = xp.sort(t, descending=descending).to_numpy()
            assert "bsort_rows" in [r.name for r in prof.kernels()]
            want = np.take_along_axis(a, _reference(a, descending), axis=-1)
            np.testing.assert_array_equal(_bits(got), _bits(want))


def test_long_rows_are_cut_into_chunks(device: xp.CLDevice) -> None:
    assert sort_kernels.radix_chunks(device, 1, 100_003)[0] > 1
    assert sort_kernels.radix_chunks(device, 512, 1024)[0] == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_key_zero_signs_and_nan_payloads(device: xp.CLDevice, dtype: type) -> None:
    """Rows of one key (every pass skipped), of zeros of both signs only, of NaNs of several
    payloads only: all come back in their input order."""
    _skip_fp64(device, dtype)
    rng = np.random.default_rng(3)
    u = np.dtype(f"u{np.dtype(dtype).itemsize}")
    sign = np.asarray(1, u) << np.asarray(8 * u.itemsize - 1, u)
    nans = (np.asarray(np.nan, dtype).view(u) | np.asarray(rng.integers(0, 1000, 60_000), u))
    nans = np.where(rng.random(60_000) < 0.5, nans | sign, nans).view(dtype)
    for a in (np.full(50_000, 7.0, dtype), np.full(77, -0.0, dtype),
              np.where(rng.random(60_000) < 0.5, 0.0, -0.0).astype(dtype), nans, nans[:45]):
        for descending in (False, True):
            _check(device, a, descending)


@settings(max_examples=30, deadline=None, suppress_health_check=FIXTURE)
@given(dtype=st.sampled_from(DTYPES), n=st.integers(0, 400),
       pool=st.sampled_from(["special", "ties", "wide"]), seed=st.integers(0, 2**32 - 1))
def test_unique_variants(device: xp.CLDevice, dtype: type, n: int, pool: str,
                         seed: int) -> None:
    _skip_fp64(device, dtype)
    a = _values(dtype, pool, n, np.random.default_rng(seed))
    _check_unique(device, a)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
def test_unique_variants_long(device: xp.CLDevice, dtype: type) -> None:
    rng = np.random.default_rng(1)
    a = _values(dtype, "ties", 100_003, rng)
    if a.dtype.kind == "f":
        a[::97] = np.nan
        a[::89] = -0.0
    _check_unique(device, a.reshape(-1, 1) if dtype == np.int32 else a)


def _check_unique(device: xp.CLDevice, a: np.ndarray) -> None:
    t = xp.asarray(a, device=device)
    vals, idx, inv, counts = np.unique(a, return_index=True, return_inverse=True,
                                       return_counts=True, equal_nan=False)
    res = xp.unique_all(t)
    np.testing.assert_array_equal(res.values.to_numpy(), vals)
    np.testing.assert_array_equal(res.counts.to_numpy(), counts)
    np.testing.assert_array_equal(res.inverse_indices.to_numpy(), inv.reshape(a.shape))
    # the first occurrence of each value (numpy's, where NaNs are distinct, is the same)
    np.testing.assert_array_equal(res.indices.to_numpy(), idx)
    np.testing.assert_array_equal(xp.unique_values(t).to_numpy(), vals)
    uc = xp.unique_counts(t)
    np.testing.assert_array_equal(uc.values.to_numpy(), vals)
    np.testing.assert_array_equal(uc.counts.to_numpy(), counts)
    ui = xp.unique_inverse(t)
    np.testing.assert_array_equal(ui.values.to_numpy(), vals)
    np.testing.assert_array_equal(ui.inverse_indices.to_numpy(), inv.reshape(a.shape))


def test_half_nan_payloads_keep_their_bits(device: xp.CLDevice) -> None:
    """float16 keys sort as their own bits: NaNs of any sign and payload come back as they went
    in (a round trip through float32 made them canonical on NVIDIA's driver)."""
    bits = np.array([0xFE00, 0x3C00, 0x7E01, 0x8000, 0x0000, 0xFC00, 0x7C00, 0xFD55, 0xBC00],
                    np.uint16)
    a = bits.view(np.float16)
    for rows in (a, np.stack([a, a[::-1]])):
        _check(device, rows, False)
        _check(device, rows, True)
