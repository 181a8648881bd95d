"""Launch plans recorded into command buffers (cl_khr_command_buffer): one enqueue a replay."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from clops.kernels.launch import Launch, LaunchPlan
from clops.runtime import cmdbuf

SRC = """
__kernel void bump(__global int *y, int by) { y[get_global_id(0)] += by; }
__kernel void fold(__global int *z, __global const int *y, int a) {
    const size_t i = get_global_id(0);
    z[i] = a * z[i] + y[i];
}
"""


@pytest.fixture
def recordable(device, monkeypatch):
    monkeypatch.setenv("CLOPS_COMMAND_BUFFERS", "1")  # CPUs too
    ok, why = cmdbuf.support(device.queue.cl_queue)
    if not ok:
        pytest.skip(why)
    return device


def _kernels(device, n):
    y, z = device.alloc(n * 4), device.alloc(n * 4)
    zero = np.zeros(n, np.int32)
    device.write(y, zero, blocking=True)
    device.write(z, zero, blocking=True)
    prg = device.kernel(SRC, "bump").program
    k1, k2 = cl.Kernel(prg, "bump"), cl.Kernel(prg, "fold")
    k1.set_args(y.mem, np.int32(1))
    k2.set_args(z.mem, y.mem, np.int32(2))  # reads what bump wrote
    return y, z, k1, k2


def _expected(steps, a=2, by=1):
    z = y = 0
    for _ in range(steps):
        y += by
        z = a * z + y
    return z


def _read(device, buf, n):
    out = np.empty(n, np.int32)
    device.read(out, buf, blocking=True)
    return out


@pytest.mark.parametrize("simultaneous", [True, False])
def test_recorded_launches_run_in_order_every_replay(recordable, simultaneous):
    device, n, steps = recordable, 256, 12
    y, z, k1, k2 = _kernels(device, n)
    rec = cmdbuf.CommandBuffer(device.queue.cl_queue, [(k1, (n,), None), (k2, (n,), (16,))])
    rec._simultaneous = rec._simultaneous and simultaneous  # the copies path on any driver
    for _ in range(steps):  # enqueued back to back, none waited for
        rec.enqueue()
    np.testing.assert_array_equal(_read(device, z, n), _expected(steps))
    assert 1 <= rec.copies <= cmdbuf.CommandBuffer._COPIES
    rec.release()
    assert rec.copies == 0


def test_plan_replays_through_one_recording_and_rerecords_changed_arguments(recordable):
    device, n = recordable, 128
    y, z, *_ = _kernels(device, n)
    prg = device.kernel(SRC, "bump").program
    plan = LaunchPlan(device)
    plan.add(Launch(cl.Kernel(prg, "bump"), (n,), None, [y, np.int32(1)], name="bump"))
    plan.add(Launch(cl.Kernel(prg, "fold"), (n,), None, [z, y, np.int32(2)], name="fold"))
    plan.replay()
    assert not plan.recorded  # a plan replayed once is not worth recording
    for _ in range(2):
        plan.replay()
    assert plan.recorded
    np.testing.assert_array_equal(_read(device, z, n), _expected(3))
    first = plan._prepared.recorded
    plan.set_scalar(0, 1, np.int32(5))  # y += 5 from now on
    plan.replay()
    assert plan.recorded and plan._prepared.recorded is not first  # recorded again
    y3, z3 = 3, _expected(3)
    np.testing.assert_array_equal(_read(device, y, n), y3 + 5)
    np.testing.assert_array_equal(_read(device, z, n), 2 * z3 + y3 + 5)


def test_refused_recording_names_the_launch(recordable):
    device = recordable
    big = 2 * device.caps.max_work_group  # a work-group larger than the device allows
    _, _, k1, k2 = _kernels(device, big)
    with pytest.raises(RuntimeError, match=r"fold \(launch 1\)"):
        cmdbuf.CommandBuffer(device.queue.cl_queue, [(k1, (big,), None), (k2, (big,), (big,))])
    # the plan path keeps going without a recording, and the enqueue reports the error
    prepared = device.prepare_launches([(k1, (big,), None, "bump"),
                                        (k2, (big,), (big,), "fold")])
    assert prepared.recorded is None
    with pytest.raises((cl.Error, RuntimeError)):
        device.enqueue_prepared(prepared)
    device.synchronize()


def test_switched_off_by_the_environment(device, monkeypatch):
    monkeypatch.setenv("CLOPS_COMMAND_BUFFERS", "0")
    ok, why = cmdbuf.support(device.queue.cl_queue)
    assert not ok and "CLOPS_COMMAND_BUFFERS=0" in why
    n = 64
    _, z, k1, k2 = _kernels(device, n)
    prepared = device.prepare_launches([(k1, (n,), None, "bump"), (k2, (n,), None, "fold")])
    assert prepared.recorded is None
    device.enqueue_prepared(prepared)
    np.testing.assert_array_equal(_read(device, z, n), _expected(1))


def test_devices_without_the_extension_say_why(device, monkeypatch):
    monkeypatch.setenv("CLOPS_COMMAND_BUFFERS", "1")
    ok, why = cmdbuf.support(device.queue.cl_queue)
    has = cmdbuf.EXTENSION in device.caps.extensions
    assert ok or why
    if not has:
        assert not ok and cmdbuf.EXTENSION in why


def test_unset_records_on_accelerators_only(device, monkeypatch):
    monkeypatch.delenv("CLOPS_COMMAND_BUFFERS", raising=False)
    ok, why = cmdbuf.support(device.queue.cl_queue)
    if device.kind == "cpu":
        assert not ok and "CLOPS_COMMAND_BUFFERS=1" in why
    monkeypatch.setenv("CLOPS_COMMAND_BUFFERS", "sometimes")
    with pytest.raises(ValueError, match="CLOPS_COMMAND_BUFFERS"):
        cmdbuf.support(device.queue.cl_queue)


def test_a_failed_enqueue_falls_back_to_kernel_by_kernel(recordable, monkeypatch):
    device, n = recordable, 64
    _, z, k1, k2 = _kernels(device, n)
    prepared = device.prepare_launches([(k1, (n,), None, "bump"), (k2, (n,), None, "fold")])
    assert prepared.recorded is not None

    def refuse() -> None:
        raise RuntimeError("clEnqueueCommandBufferKHR failed: OUT_OF_RESOURCES")

    monkeypatch.setattr(prepared.recorded, "enqueue", refuse)
    with pytest.warns(RuntimeWarning, match="kernel by kernel"):
        device.enqueue_prepared(prepared)
    assert prepared.recorded is None
    device.enqueue_prepared(prepared)
    np.testing.assert_array_equal(_read(device, z, n), _expected(2))


def test_resized_plan_runs_its_new_sizes_and_arguments(device):
    # a batched step's plan: the row count changes between replays (arguments and sizes)
    n = 64
    y, z, *_ = _kernels(device, n)
    prg = device.kernel(SRC, "bump").program
    plan = LaunchPlan(device)
    plan.add(Launch(cl.Kernel(prg, "bump"), (n,), None, [y, np.int32(1)], name="bump"))
    plan.replay()
    plan.replay()  # recorded from here on where the device can
    plan.resize([(0, [(1, np.int32(5))], (16,))])
    plan.replay()
    assert not plan.recorded
    want = np.full(n, 2, np.int32)
    want[:16] += 5
    np.testing.assert_array_equal(_read(device, y, n), want)
    plan.resize([(0, [(1, np.int32(-1))], (n,))])
    plan.replay()
    np.testing.assert_array_equal(_read(device, y, n), want - 1)
