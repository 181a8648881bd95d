"""Native interop: raw handles drive real OpenCL C API calls (through ctypes) on clops tensors,
ordered with clops' own work and with the tensors kept alive; pyopencl arrays in and out with
no copies."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clops
from clops.runtime import CLDevice
from clops.runtime.interop import kept_count

from ..conftest import Gate


def _libopencl() -> ctypes.CDLL:
    name = ctypes.util.find_library("OpenCL")
    if name is None:
        pytest.skip("no libOpenCL for ctypes")
    lib = ctypes.CDLL(name)
    f = lib.clEnqueueCopyBuffer
    f.restype = ctypes.c_int32
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                  ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_void_p,
                  ctypes.c_void_p]
    return lib


def test_handles(device: CLDevice) -> None:
    x = clops.asarray(np.arange(12, dtype=np.float32).reshape(3, 4), device=device)
    h = clops.native.handles(x[1:, 1:])
    assert h["offset"] == 5 * 4 and h["strides"] == (16, 4) and h["shape"] == (2, 3)
    assert h["cl_mem"] == x.buffer.mem.int_ptr
    assert h["context"] == device.context.int_ptr
    assert h["device"] == device.cl_device.int_ptr
    assert h["queue"] == device.queue.cl_queue.int_ptr
    q = device.create_queue()
    with clops.stream(q):
        assert clops.native.handles(x)["queue"] == q.cl_queue.int_ptr


def test_native_call_ctypes_copy(device: CLDevice, gate: Gate) -> None:
    lib = _libopencl()
    src = clops.zeros(256, device=device).realize()
    k = clops.kernel("__kernel void fill(__global float *x, long o, float v)"
                     "{ x[o + get_global_id(0)] = v; }", "fill")
    k(256, None, src, 7.0, wait_for=[gate.event])        # held back: the copy must wait
    dst = clops.zeros(256, device=device).realize()

    def native_copy(s: dict, d: dict) -> int:
        ev = ctypes.c_void_p()
        err = lib.clEnqueueCopyBuffer(s["queue"], s["cl_mem"], d["cl_mem"], s["offset"],
                                      d["offset"], s["nbytes"], 0, None, ctypes.byref(ev))
        assert err == 0, err
        return int(ev.value or 0)

    ev = clops.native_call(native_copy, reads=[src], writes=[dst])
    after = (dst + 1).realize()                           # clops work after the native work
    assert not ev.done
    gate.open()
    np.testing.assert_array_equal(after.to_numpy(), np.full(256, 8, np.float32))


def _settled_kept_count(device: CLDevice) -> int:
    """kept_count() once the holds of earlier work are let go (their callbacks run on the
    driver's thread, a little after the work completes)."""
    import time

    device.synchronize()
    for _ in range(200):
        if kept_count() == 0:
            break
        time.sleep(0.01)
    return kept_count()


def test_keepalive(device: CLDevice, gate: Gate) -> None:
    base = _settled_kept_count(device)
    t = clops.ones(16, device=device).realize()
    ev = device.queue.marker(wait_for=[clops.Event(gate.event)])
    clops.keepalive(ev, t)
    del t
    gc.collect()
    assert kept_count() == base + 1
    gate.open()
    ev.wait()
    for _ in range(200):
        if kept_count() == base:
            break
        import time

        time.sleep(0.01)
    assert kept_count() == base


def test_to_pyopencl_no_copy(device: CLDevice) -> None:
    x = clops.asarray(np.arange(10, dtype=np.float32), device=device)
    view = x[2:8]
    a = clops.to_pyopencl(view)
    assert isinstance(a, cla.Array) and a.shape == (6,) and a.base_data == x.buffer.mem
    np.testing.assert_array_equal(a.get(), np.arange(2, 8))
    a.fill(5.0)                                           # pyopencl writes clops memory
    ev = clops.Event(cl.enqueue_marker(a.queue))
    clops.native.track_pyopencl(view, ev)
    np.testing.assert_array_equal((x * 1).to_numpy(),
                                  [0, 1, 5, 5, 5, 5, 5, 5, 8, 9])


def test_from_pyopencl_no_copy(device: CLDevice) -> None:
    q = cl.CommandQueue(device.context)
    a = cla.to_device(q, np.arange(12, dtype=np.float32).reshape(3, 4))
    t = clops.from_pyopencl(a)
    assert t.device is device and t.buffer.mem == a.base_data
    np.testing.assert_array_equal((t.sum(axis=1)).to_numpy(), [6, 22, 38])
    tt = clops.from_pyopencl(a[1:])
    assert tt.offset == 4
    np.testing.assert_array_equal(tt.to_numpy(), np.arange(4, 12).reshape(2, 4))
    other = cl.Context([device.cl_device])
    b = cla.zeros(cl.CommandQueue(other), 4, np.float32)
    with pytest.raises(ValueError, match="context"):
        clops.from_pyopencl(b)


def test_pyopencl_events_in_wait_lists(device: CLDevice, gate: Gate) -> None:
    x = clops.zeros(8, device=device).realize()
    k = clops.kernel("__kernel void inc(__global float *x, long o)"
                     "{ x[o + get_global_id(0)] += 1; }", "inc")
    ev = k(8, None, x, wait_for=[gate.event])          # a raw pyopencl UserEvent
    assert not ev.done
    gate.open()
    ev.wait()
    np.testing.assert_array_equal(x.to_numpy(), np.ones(8, np.float32))
