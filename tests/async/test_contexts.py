"""Contexts: devices of one platform in one shared context (``clops.context``, sub-devices),
the application's own context and queue adopted (``clops.device(from_pyopencl=)``), selector
lists, ``clops.devices`` filters and ``CLOPS_VISIBLE_DEVICES``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clops
from clops.runtime import CLDevice


def _two_in_one_context(device: CLDevice) -> list[CLDevice]:
    if device.partition_support()["max_sub_devices"] < 2:
        pytest.skip(f"{device.name} has no device fission (and one device is all there is)")
    return device.create_sub_devices(2)


def test_devices_filters_and_selector_lists(device: CLDevice) -> None:
    every = clops.devices()
    assert every and all(isinstance(d, CLDevice) for d in every)
    assert clops.devices(kind=device.kind) == [d for d in every if d.kind == device.kind]
    assert clops.devices(backend=device.backend) == [d for d in every
                                                     if d.backend == device.backend]
    assert clops.devices(backend="opencl") == every
    listed = clops.devices(f"{device.selector},{every[0].selector}")
    assert listed[0] is device and every[0] in listed
    for bad, msg in [({"kind": "tpu"}, "kind"), ({"backend": "cuda"}, "backend")]:
        with pytest.raises(ValueError, match=msg):
            clops.devices(**bad)
    with pytest.raises(ValueError, match="comma-separated"):
        clops.devices("cpu,,gpu")


def test_visible_devices_limits_what_is_listed(device: CLDevice) -> None:
    code = ("import json, clops; print(json.dumps([[d.selector, d.name] for d in "
            "clops.devices()]))")
    env = {**os.environ, "CLOPS_VISIBLE_DEVICES": device.selector}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout)
    # the one device named, renumbered among the visible ones (as CUDA_VISIBLE_DEVICES does)
    assert seen == [[f"opencl:{device.kind}:0", device.name]]
    env["CLOPS_VISIBLE_DEVICES"] = "cpu,,"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode != 0 and "CLOPS_VISIBLE_DEVICES" in res.stderr


def test_sub_devices_share_a_context(device: CLDevice) -> None:
    d0, d1 = _two_in_one_context(device)
    assert d0.shares_context(d1) and not d0.shares_context(device)


def test_context_of_devices_of_one_platform(device: CLDevice) -> None:
    d0, d1 = _two_in_one_context(device)
    a, b = clops.context([d0, d1])
    assert a.shares_context(b) and a.cl_device.int_ptr == d0.cl_device.int_ptr
    assert not a.shares_context(d0)
    x = clops.asarray(np.arange(8, dtype=np.float32), device=a)
    np.testing.assert_array_equal(np.asarray(x * 2), np.arange(8) * 2)
    with pytest.raises(ValueError, match="twice"):
        clops.context([d0, d0])


def test_devices_of_two_platforms_do_not_share_a_context() -> None:
    devs = clops.devices()
    plats = {d.entry.platform.int_ptr: d for d in devs}
    if len(plats) < 2:
        pytest.skip("one OpenCL platform here")
    a, b = list(plats.values())[:2]
    with pytest.raises(ValueError, match="several platforms"):
        clops.context([a, b])


@pytest.mark.parametrize("profiling", [True, False])
def test_the_applications_queue_is_adopted(device: CLDevice, profiling: bool) -> None:
    ctx = cl.Context([device.cl_device])
    props = cl.command_queue_properties.PROFILING_ENABLE if profiling else 0
    q = cl.CommandQueue(ctx, properties=props)
    dev = clops.device(from_pyopencl=q)
    assert dev.queue.cl_queue is q and dev.context.int_ptr == ctx.int_ptr
    assert dev.kind == device.kind
    assert clops.device(from_pyopencl=q) is dev
    arr = cla.to_device(q, np.arange(6, dtype=np.float32))
    t = clops.from_pyopencl(arr)  # no copy: the same memory
    assert t.device is dev
    with clops.profile() as prof:
        (t * 0 + 7).realize()
    assert prof.kernel_count == 1  # a queue without profiling gives zeros, not an error
    y = clops.native.to_pyopencl(t * 2)
    np.testing.assert_array_equal(y.get(), np.arange(6) * 2)
    t[0] = 42.0  # written through clops, seen by the application's array
    np.testing.assert_array_equal(arr.get(queue=q)[:1], [42.0])
    other = clops.device(from_pyopencl=ctx)
    assert other.context.int_ptr == ctx.int_ptr and other.queue.cl_queue is not q
    with pytest.raises(TypeError, match="CommandQueue or Context"):
        clops.device(from_pyopencl=object())


def test_a_device_and_its_sub_devices_in_one_context(device: CLDevice, monkeypatch) -> None:
    subs = _two_in_one_context(device)
    parent, s0, s1 = clops.context([device, *subs])
    assert parent.shares_context(s0) and s0.shares_context(s1)
    x = clops.arange(6.0, device=parent) * 2

    def no_host(*a, **k):
        raise AssertionError("a move within one context went through the host")

    monkeypatch.setattr(clops.Tensor, "to_numpy", no_host)
    z = x.to_device(s0).to_device(s1) + 1
    monkeypatch.undo()
    np.testing.assert_array_equal(np.asarray(z), np.arange(6.0) * 2 + 1)
