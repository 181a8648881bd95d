"""clops.random: Philox4x32-10 matches its published known-answer vectors, the device matches
the host reference bit for bit, and values depend only on (seed, stream, index)."""

from __future__ import annotations

import numpy as np
import pytest

import clops
from clops import random
from clops.runtime import CLDevice

# Known-answer vectors of Philox4x32-10 (counter, key -> output).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_host_reference_kat(ctr: tuple[int, ...], key: tuple[int, int],
                            want: tuple[int, ...]) -> None:
    got = random.philox4x32_10(np.array(ctr, np.uint32), key)
    assert tuple(int(v) for v in got) == want


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_device_kat(device: CLDevice, ctr: tuple[int, ...], key: tuple[int, int],
                    want: tuple[int, ...]) -> None:
    src = '#include "clops/philox.cl"\n__kernel void kat(__global uint *o, long off, ' \
          'uint4 c, uint2 k) { vstore4(philox4x32_10(c, k), 0, o + off); }'
    k = clops.kernel(src, "kat")
    out = clops.empty(4, dtype=clops.uint32, device=device)
    k(1, None, out, np.array(ctr, np.uint32).view(_vec(4)), np.array(key, np.uint32).view(_vec(2)))
    assert tuple(int(v) for v in out.to_numpy()) == want


def _vec(n: int) -> np.dtype:
    return np.dtype([(f"s{i}", np.uint32) for i in range(n)])


def test_bits_match_host(device: CLDevice) -> None:
    seed = (123 << 32) | 456
    n = 1001
    got = random.random_bits(seed, n, stream=5, device=device).to_numpy()
    blocks = -(-n // 4)
    ctr = np.zeros((blocks, 4), np.uint32)
    ctr[:, 0] = np.arange(blocks)
    ctr[:, 2] = 5
    want = random.philox4x32_10(ctr, (456, 123)).reshape(-1)[:n]
    np.testing.assert_array_equal(got, want)


def test_reproducible_across_shapes_and_streams(device: CLDevice) -> None:
    a = random.uniform(9, (10, 10), device=device).to_numpy().reshape(-1)
    b = random.uniform(9, 37, device=device).to_numpy()
    np.testing.assert_array_equal(a[:37], b)   # element i depends on i only
    c = random.uniform(9, 37, stream=1, device=device).to_numpy()
    assert not np.array_equal(b, c)
    np.testing.assert_array_equal(random.normal(3, 50, device=device).to_numpy(),
                                  random.normal(3, 50, device=device).to_numpy())


def test_reproducible_across_devices(device: CLDevice) -> None:
    if device.partition_support()["max_sub_devices"] < 2:
        pytest.skip("needs a second device")
    d0, d1 = device.create_sub_devices(2)
    for fn in (random.uniform, random.normal):
        np.testing.assert_array_equal(fn(5, 333, device=d0).to_numpy(),
                                      fn(5, 333, device=d1).to_numpy())


def test_distributions(device: CLDevice) -> None:
    u = random.uniform(1, 200_000, low=-2.0, high=3.0, device=device).to_numpy()
    assert u.min() >= -2 and u.max() < 3 and abs(u.mean() - 0.5) < 0.02
    z = random.normal(2, 200_000, mean=1.0, std=2.0, device=device).to_numpy()
    assert abs(z.mean() - 1) < 0.02 and abs(z.std() - 2) < 0.02
    i = random.integers(3, 60_000, 10, 16, device=device).to_numpy()
    assert i.dtype == np.int64 and i.min() == 10 and i.max() == 15
    assert np.bincount(i - 10).min() > 9000
    i32 = random.integers(3, 100, 5, dtype=clops.int32, device=device).to_numpy()
    assert i32.dtype == np.int32 and 0 <= i32.min() and i32.max() < 5
    if device.caps.fp64:
        d = random.uniform(4, 100_000, dtype=clops.float64, device=device).to_numpy()
        assert d.dtype == np.float64 and 0 <= d.min() and d.max() < 1
        assert len(np.unique(d)) == d.size
        zd = random.normal(4, 100_000, dtype=clops.float64, device=device).to_numpy()
        assert abs(zd.std() - 1) < 0.02


def test_errors(device: CLDevice) -> None:
    with pytest.raises(ValueError, match="seed"):
        random.uniform(-1, 4, device=device)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        random.integers(0, 4, 0, 1 << 40, device=device)
    with pytest.raises(TypeError, match="float32 or float64"):
        random.uniform(0, 4, dtype=clops.int32, device=device)
    assert random.uniform(0, (0, 3), device=device).shape == (0, 3)
