"""Memory kinds at the Array API: ``usm_type=`` on the creation functions, ``t.usm_type``, numpy
and DLPack views without a copy where the host addresses the memory, ``clops.from_host`` over a
numpy array's own memory, and device-side moves between devices of one context."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops

from ..conftest import Gate


def _unified(device):
    if not device.caps.unified_memory:
        pytest.skip(f"{device.name} has memory of its own: numpy views need copies there")


def test_creation_functions_take_usm_type(device):
    for kind in list(device.memory_kinds):
        made = [clops.asarray([1.0, 2.0], device=device, usm_type=kind),
                clops.empty(3, device=device, usm_type=kind),
                clops.zeros((2, 2), device=device, usm_type=kind),
                clops.ones(2, device=device, usm_type=kind),
                clops.full(2, 7, device=device, usm_type=kind),
                clops.arange(5, device=device, usm_type=kind),
                clops.linspace(0, 1, 5, device=device, usm_type=kind),
                clops.eye(3, device=device, usm_type=kind)]
        assert [t.usm_type for t in made] == [kind] * len(made)
        x = made[2]
        assert clops.zeros_like(x).usm_type == kind  # *_like keep x's kind
        assert clops.ones_like(x, usm_type="device").usm_type == "device"
        assert (x + 1).usm_type == "device"  # results of ops are in device memory
        np.testing.assert_array_equal(np.asarray(made[7]), np.eye(3))
        np.testing.assert_array_equal(np.asarray(made[6]), np.linspace(0, 1, 5))
        moved = clops.asarray(made[5], usm_type="device")
        assert moved.usm_type == "device"
        assert (moved.buffer is made[5].buffer) == (kind == "device")  # a copy only to move
    with pytest.raises(ValueError, match="usm_type='pinned'.*one of"):
        clops.zeros(2, device=device, usm_type="pinned")


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(["device", "host", "shared"]), min_size=2, max_size=2),
       shape=st.sampled_from([(7,), (3, 5), (2, 3, 4)]), seed=st.integers(0, 999))
def test_every_op_takes_every_kind(device, kinds, shape, seed):
    kinds = [k if k in list(device.memory_kinds) else "host" for k in kinds]
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    x = clops.asarray(a, device=device, usm_type=kinds[0])
    y = clops.asarray(b, device=device, usm_type=kinds[1])
    np.testing.assert_allclose(np.asarray(clops.sum(x * y + 1, axis=-1)),
                               (a * b + 1).sum(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(clops.sort(x, axis=-1)), np.sort(a, -1))
    x[..., 0] = 3.0  # in place, in its own memory
    a[..., 0] = 3.0
    assert x.usm_type == kinds[0]
    np.testing.assert_array_equal(np.asarray(x), a)


def test_numpy_reads_host_memory_in_place_after_pending_writes(device):
    _unified(device)
    for kind in list(device.memory_kinds)[1:]:
        t = clops.zeros(4, device=device, usm_type=kind)
        gate = Gate(device.context)
        device.write(t.buffer, np.full(4, 9, np.float32), wait_for=[gate.event])  # held back
        import threading

        timer = threading.Timer(0.3, gate.open)
        timer.start()
        try:
            view = np.asarray(t)  # waits for the held write, then reads the memory in place
        finally:
            timer.join()
            gate.open()
        np.testing.assert_array_equal(view, [9, 9, 9, 9])
        view[0] = -1  # the host writes; the device reads it
        t += 1  # the device writes; the host view sees it
        clops.synchronize()
        np.testing.assert_array_equal(view, [0, 10, 10, 10])
        strided = np.asarray(clops.reshape(clops.arange(12.0, device=device, usm_type=kind),
                                           (3, 4))[::-1, 1::2])
        np.testing.assert_array_equal(strided, np.arange(12.0).reshape(3, 4)[::-1, 1::2])


def test_device_memory_is_copied_for_numpy(device):
    t = clops.arange(3.0, device=device)
    a = np.asarray(t)
    t += 1
    np.testing.assert_array_equal(a, [0, 1, 2])  # a copy: the update is not seen
    with pytest.raises(ValueError, match="usm_type='host' or 'shared'"):
        np.asarray(t, copy=False)


def test_a_host_view_keeps_the_memory_from_the_pool(device):
    _unified(device)
    t = clops.arange(64.0, device=device, usm_type="host")
    view = np.asarray(t)
    del t
    others = [clops.full(64, 5.0, device=device, usm_type="host") for _ in range(4)]
    clops.synchronize()
    np.testing.assert_array_equal(view, np.arange(64.0))  # not handed to another tensor
    assert len(others) == 4


def test_dlpack_without_a_copy(device):
    _unified(device)
    torch = pytest.importorskip("torch")
    for kind in list(device.memory_kinds):
        t = clops.arange(5.0, device=device, usm_type=kind)
        if kind == "device":
            assert t.__dlpack_device__()[0] == 4  # OpenCL; copy=None copies
            y = torch.from_dlpack(t.__dlpack__(copy=False))  # PoCL: the memory itself
        else:
            assert t.__dlpack_device__() == (1, 0)
            y = torch.from_dlpack(t)
        y[0] = 42.0  # torch writes into clops' memory
        assert float(t[0]) == 42.0, kind
    b = clops.astype(clops.arange(3.0, device=device), clops.bfloat16)
    with pytest.raises(BufferError, match="bfloat16"):
        b.__dlpack__(copy=False)


def test_from_host_uses_the_arrays_own_memory(device):
    a = np.arange(6, dtype=np.float32)
    if not device.caps.unified_memory:
        with pytest.raises(BufferError, match="memory of its own"):
            clops.from_host(a, copy=False, device=device)
        return
    t = clops.from_host(a, copy=False, device=device)
    assert t.usm_type == "host"
    t *= 2  # the device writes the array's memory
    clops.synchronize()
    np.testing.assert_array_equal(a, np.arange(6) * 2)
    a[0] = 100  # the host writes; the device reads it
    assert float(clops.sum(t)) == 100 + 30
    c = clops.from_host(np.ones(3, np.float32), device=device)  # copy=True: host memory
    assert c.usm_type == "host"
    with pytest.raises(BufferError, match="C-contiguous"):
        clops.from_host(np.arange(8.0)[::2], copy=False, device=device)
    assert clops.from_host(np.zeros(0, np.float32), copy=False, device=device).shape == (0,)


def test_to_device_in_one_context_is_a_device_copy(device, monkeypatch):
    if device.partition_support()["max_sub_devices"] < 2:
        pytest.skip(f"{device.name} has no device fission")
    d0, d1 = device.create_sub_devices(2)
    x = clops.arange(10.0, device=d0) * 3

    def no_host(*a, **k):
        raise AssertionError("a move within one context went through the host")

    monkeypatch.setattr(clops.Tensor, "to_numpy", no_host)
    y = x.to_device(d1)
    monkeypatch.undo()
    assert y.device is d1
    np.testing.assert_array_equal(np.asarray(y + 1), np.arange(10.0) * 3 + 1)
    with pytest.raises(ValueError, match="share a context.*to_device"):
        x + y
