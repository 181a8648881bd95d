"""Memory kinds in the pool: device, host (``CL_MEM_ALLOC_HOST_PTR``) and shared (SVM) buffers,
binned apart, usable by kernels and copies alike, and host views without a copy where the
device shares the host's memory, after the device is done with the buffer."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from clops.runtime import BufferPool
from clops.runtime.pool import KINDS

from ..conftest import Gate

INC = "__kernel void inc(__global float *x) { x[get_global_id(0)] += 1.0f; }"


def test_every_kind_runs_kernels_and_copies(device):
    k = device.kernel(INC, "inc")
    for kind in list(device.memory_kinds):
        a, b = device.alloc(64, kind), device.alloc(64, "device")
        assert a.kind == kind
        device.write(a, np.arange(16, dtype=np.float32))
        device.launch(k, (16,), None, [a], writes=[a])
        device.copy(b, a, 64)
        out = np.empty(16, np.float32)
        device.read(out, b, blocking=True)
        np.testing.assert_array_equal(out, np.arange(16) + 1, err_msg=kind)


def test_kinds_are_binned_apart(device):
    pool = device.pool
    pool.empty()
    a = device.alloc(1000, "host")
    mem = a.mem
    del a
    b = device.alloc(1000, "device")
    assert b.mem is not mem and b.kind == "device"
    c = device.alloc(1000, "host")
    assert c.mem is mem and c.kind == "host"  # the cached host buffer, reused as host memory
    with pytest.raises(ValueError, match="memory kind"):
        device.alloc(8, "pinned")
    assert KINDS == ("device", "host", "shared")


def test_host_view_is_the_memory_once_the_device_is_done(device):
    if not device.caps.unified_memory:
        pytest.skip(f"{device.name} has memory of its own: no host views without a copy")
    k = device.kernel(INC, "inc")
    for kind in list(device.memory_kinds)[1:]:
        gate = Gate(device.context)
        a = device.alloc(64, kind)
        device.write(a, np.zeros(16, np.float32), wait_for=[gate.event])  # held back
        device.launch(k, (16,), None, [a], writes=[a])
        timer = threading.Timer(0.3, gate.open)
        timer.start()
        try:
            view = a.host_view()[:64].view(np.float32)  # waits for both
        finally:
            timer.join()
            gate.open()
        np.testing.assert_array_equal(view, np.ones(16), err_msg=kind)
        view[:] = 41  # the host writes in place; the device sees it
        device.launch(k, (16,), None, [a], writes=[a])
        out = np.empty(16, np.float32)
        device.read(out, a, blocking=True)
        np.testing.assert_array_equal(out, np.full(16, 42), err_msg=kind)


def test_device_memory_has_a_host_view_only_where_memory_is_shared(device):
    buf = device.alloc(64)
    device.write(buf, np.arange(16, dtype=np.float32))
    if device.caps.unified_memory:  # PoCL: the device's memory is the host's (DLPack uses it)
        np.testing.assert_array_equal(buf.host_view()[:64].view(np.float32), np.arange(16))
    else:
        with pytest.raises(BufferError, match="usm_type='host' or 'shared'"):
            buf.host_view()


def test_shared_without_svm_is_a_clear_error():
    fake = SimpleNamespace(device=SimpleNamespace(cl_device=SimpleNamespace(svm_capabilities=0),
                                                  name="a GPU without SVM"))
    with pytest.raises(ValueError, match="no shared virtual memory.*'host'"):
        BufferPool._svm_flags(fake)  # type: ignore[arg-type]
