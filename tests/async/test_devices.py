"""Several devices: sub-devices (fission) where the driver supports them, explicit
``to_device``, and clear errors for mixed-device ops and unsupported partitions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import clops
from clops.runtime import CLDevice
from clops.runtime.fission import FissionError, create_sub_devices


def _needs_fission(device: CLDevice) -> None:
    if device.partition_support()["max_sub_devices"] < 2:
        pytest.skip(f"{device.name} has no device fission")


def test_split_equally(device: CLDevice) -> None:
    _needs_fission(device)
    subs = device.create_sub_devices(2)
    assert len(subs) == 2
    assert sum(s.caps.compute_units for s in subs) <= device.caps.compute_units
    assert subs[0] is not subs[1] and subs[0].context is not device.context
    assert subs[0].selector == f"{device.selector}.0"
    for s in subs:
        np.testing.assert_allclose((clops.arange(5.0, device=s) * 2).to_numpy(),
                                   np.arange(5.0) * 2)


def test_split_by_counts_and_units(device: CLDevice) -> None:
    _needs_fission(device)
    subs = device.create_sub_devices(counts=[1, 1])
    assert [s.caps.compute_units for s in subs] == [1, 1]
    subs = device.create_sub_devices(units=1)
    assert all(s.caps.compute_units == 1 for s in subs)
    with pytest.raises(ValueError, match="do not fit"):
        device.create_sub_devices(counts=[device.caps.compute_units + 1])
    with pytest.raises(ValueError, match="one of"):
        device.create_sub_devices(2, units=1)
    most = min(device.partition_support()["max_sub_devices"], device.caps.compute_units)
    with pytest.raises(FissionError, match=f"at most {most} sub-devices.*{most + 1} were asked"):
        device.create_sub_devices(most + 1)


def test_affinity(device: CLDevice) -> None:
    _needs_fission(device)
    sup = device.partition_support()
    if sup["affinity_domains"]:
        subs = device.create_sub_devices(affinity="next")
        assert subs
    else:
        with pytest.raises(FissionError, match="affinity"):
            device.create_sub_devices(affinity="numa")


def test_no_fission_is_a_clear_error() -> None:
    # What NVIDIA reports: no sub-devices, no partition types.
    fake_cl = SimpleNamespace(partition_max_sub_devices=0, partition_properties=[],
                              partition_affinity_domain=0)
    fake = SimpleNamespace(cl_device=fake_cl, name="NVIDIA H100",
                           caps=SimpleNamespace(compute_units=132))
    with pytest.raises(FissionError, match="cannot be split.*create_queue"):
        create_sub_devices(fake, 2)  # type: ignore[arg-type]


def test_to_device_and_mixed_error(device: CLDevice) -> None:
    _needs_fission(device)
    d0, d1 = device.create_sub_devices(2)
    a = clops.asarray(np.arange(6, dtype=np.float32), device=d0)
    b = a.to_device(d1)
    assert b.device is d1 and a.device is d0
    np.testing.assert_array_equal((b + 1).to_numpy(), np.arange(6) + 1)
    with pytest.raises(ValueError, match="different devices.*to_device"):
        a + b
    with pytest.raises(ValueError, match="matmul"):
        clops.matmul(a.reshape((2, 3)), b.reshape((3, 2)))
    # Work on both devices at once, joined on the host.
    fa = clops.to_host_future((a * 3).realize())
    fb = clops.to_host_future((b * 4).realize())
    np.testing.assert_array_equal(fa.result(30) + fb.result(30), np.arange(6) * 7)
    clops.synchronize()  # reaches sub-devices too
