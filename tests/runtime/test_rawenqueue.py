"""Event-free replay of prepared launches (the GPU decode path), forced on the test device."""

from __future__ import annotations

import numpy as np
import pytest

from clops.runtime import cbuild, rawenqueue
from clops.runtime.device import PreparedLaunches

SRC = """
__kernel void axpb(__global float *y, __global const float *x, float a, float b) {
    const size_t i = get_global_id(0) + get_global_id(1) * get_global_size(0);
    y[i] = a * x[i] + b;
}
"""

pytestmark = pytest.mark.skipif(not rawenqueue.available(),
                                reason="no OpenCL loader reachable through ctypes")


@pytest.fixture(params=["native", "ctypes"])
def path(request, monkeypatch):
    """The replay from one call into replay.c (built here: the tests' machines have a C
    compiler), or one ctypes call a launch (where it is not built)."""
    if request.param == "native":
        if cbuild.compiler() is None:
            pytest.skip("no C compiler to build replay.c with")
        assert rawenqueue._replay_library() is not None
    else:
        monkeypatch.setattr(rawenqueue, "_replay_library", lambda: None)
    return request.param


def _plan(device, n):
    x, y, z = (device.alloc(n * 4) for _ in range(3))
    host = np.arange(n, dtype=np.float32)
    device.write(x, host, blocking=True)
    k1 = device.kernel(SRC, "axpb")
    import pyopencl as cl

    k1 = cl.Kernel(k1.program, "axpb")  # own argument slots per launch
    k2 = cl.Kernel(k1.program, "axpb")
    k1.set_args(y.mem, x.mem, np.float32(2), np.float32(1))
    k2.set_args(z.mem, y.mem, np.float32(3), np.float32(-1))  # reads what k1 wrote
    items = [(k1, (n,), None, "first"), (k2, (n // 4, 4), (1, 1), "second")]
    return host, z, items


def test_event_free_replay_runs_in_order(device, path):
    n = 1024
    host, z, items = _plan(device, n)
    prepared = PreparedLaunches([(k, g, l, nm) for k, g, l, nm in items],
                                rawenqueue.prepare(items))
    for _ in range(3):  # replays leave the same result
        device.enqueue_prepared(prepared)
    out = np.empty(n, np.float32)
    device.read(out, z, blocking=True)
    np.testing.assert_array_equal(out, 3 * (2 * host + 1) - 1)


def test_event_free_replay_error_names_the_launch(device, path):
    big = 2 * device.caps.max_work_group  # a work-group larger than the device allows
    n = max(1024, big)
    _, _, items = _plan(device, n)
    k2 = items[1][0]
    bad = [items[0], (k2, (big,), (big,), "second")]
    prepared = PreparedLaunches(bad, rawenqueue.prepare(bad))
    with pytest.raises(RuntimeError, match=r"axpb \(launch 1 of the plan\)"):
        device.enqueue_prepared(prepared)
    device.synchronize()


def test_event_free_replay_takes_a_resized_launch(device, path):
    # a plan resized to fewer rows (the second launch over a quarter of them): the rest of y
    # and z keep what the full replay wrote
    n = 1024
    host, z, items = _plan(device, n)
    prepared = PreparedLaunches([(k, g, l, nm) for k, g, l, nm in items],
                                rawenqueue.prepare(items))
    device.enqueue_prepared(prepared)
    device.write(z, np.zeros(n, np.float32), blocking=True)
    prepared.resize(1, (n // 16, 4))
    device.enqueue_prepared(prepared)
    out = np.empty(n, np.float32)
    device.read(out, z, blocking=True)
    want = 3 * (2 * host + 1) - 1
    np.testing.assert_array_equal(out[:n // 4], want[:n // 4])
    assert not out[n // 4:].any()
    with pytest.raises(ValueError, match="2 dimensions"):
        prepared.resize(1, (n,))
