"""Runtime, profiler: records of kernel launches and copies, the summary table and the Chrome
trace, and no records outside a ``profile()`` block."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pyopencl as cl
import pytest

import clops
from clops.runtime import CLDevice, Profiler, Record, scope

N = 4096
SOURCE = """
__kernel void scale(__global float *x, float a) { x[get_global_id(0)] *= a; }
__kernel void shift(__global float *x, float b) { x[get_global_id(0)] += b; }
"""


@pytest.fixture
def k(device: CLDevice) -> SimpleNamespace:
    prg = device.build(SOURCE)
    return SimpleNamespace(scale=cl.Kernel(prg, "scale"), shift=cl.Kernel(prg, "shift"))


def _workload(device: CLDevice, k: SimpleNamespace, scales: int = 3) -> np.ndarray:
    """One upload, ``scales`` scale launches and a named shift, a device copy, one download."""
    data = np.arange(N, dtype=np.float32)
    x, y = device.alloc(data.nbytes), device.alloc(data.nbytes)
    device.write(x, data)
    for _ in range(scales):
        device.launch(k.scale, (N,), None, [x, np.float32(2)], writes=[x])
    device.launch(k.shift, (N,), None, [x, np.float32(1)], writes=[x], name="shift by one")
    device.copy(y, x, data.nbytes)
    out = np.empty_like(data)
    device.read(out, y)
    np.testing.assert_array_equal(out, data * 2**scales + 1)
    return out


def test_records(device: CLDevice, k: SimpleNamespace) -> None:
    with clops.profile() as prof:
        assert prof in scope.profilers()
        _workload(device, k, scales=3)
    assert prof not in scope.profilers()
    recs = prof.records
    assert all(isinstance(r, Record) for r in recs)
    names = [(r.kind, r.name) for r in recs]
    assert names == [("copy", "host_to_device")] + [("kernel", "scale")] * 3 + [
        ("kernel", "shift by one"), ("copy", "device_to_device"), ("copy", "device_to_host")]
    for r in recs:
        assert r.device == device.name
        assert 0 < r.queued_ns <= r.start_ns <= r.end_ns, r
        assert r.duration_ns == r.end_ns - r.start_ns >= 0
        assert r.queue == 0
    by_name = {r.name: r for r in recs}
    assert by_name["host_to_device"].bytes == N * 4
    assert by_name["device_to_host"].bytes == N * 4
    assert by_name["device_to_device"].bytes == 2 * N * 4  # read and written
    assert by_name["scale"].extra["global_size"] == [N]
    # The device runs them in order on one in-order queue.
    starts = [r.start_ns for r in recs]
    assert starts == sorted(starts)
    assert prof.kernel_count == 4
    assert [r.name for r in prof.kernels()] == ["scale"] * 3 + ["shift by one"]


def test_records_other_queue(device: CLDevice, k: SimpleNamespace) -> None:
    q = device.create_queue()
    x = device.alloc(N * 4)
    with clops.profile() as prof:
        device.launch(k.scale, (N,), None, [x, np.float32(2)], writes=[x], queue=q)
    (rec,) = prof.records
    assert rec.queue == q.index > 0


def test_summary(device: CLDevice, k: SimpleNamespace) -> None:
    with clops.profile() as prof:
        _workload(device, k, scales=5)
    text = prof.summary()
    lines = text.splitlines()
    header = lines[0].split()
    assert header == ["kind", "name", "calls", "total", "ms", "mean", "us", "GB/s"]
    rows = {ln[9:49].strip(): ln for ln in lines[1:]}
    assert set(rows) == {"scale", "shift by one", "host_to_device", "device_to_device",
                         "device_to_host"}
    assert rows["scale"].split()[2] == "5"
    assert rows["scale"].startswith("kernel ")
    assert rows["device_to_host"].startswith("copy ")
    # Copies know their bytes, so they show a bandwidth; kernels without bytes leave it blank.
    assert len(rows["device_to_host"].split()) == 6
    assert len(rows["scale"].split()) == 5
    total_ms = sum(float(ln[49:].split()[1]) for ln in lines[1:])
    assert total_ms == pytest.approx(sum(r.duration_ns for r in prof.records) / 1e6, abs=0.01)


def test_chrome_trace(device: CLDevice, k: SimpleNamespace, tmp_path) -> None:
    with clops.profile() as prof:
        _workload(device, k, scales=2)
    path = tmp_path / "trace.json"
    prof.to_chrome_trace(str(path))
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(prof.records)
    assert [e["name"] for e in spans] == [r.name for r in prof.records]
    for e in spans:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["ts"] >= 0 and e["dur"] >= 0
        assert e["cat"] in ("kernel", "copy")
    meta = {(e["name"], e["args"]["name"]) for e in events if e["ph"] == "M"}
    assert ("process_name", device.name) in meta
    assert ("thread_name", "queue 0") in meta
    # Microseconds from the earliest queued record; the device's order is kept.
    t0 = min(r.queued_ns for r in prof.records)
    for e, r in zip(spans, prof.records):
        assert e["ts"] == pytest.approx((r.start_ns - t0) / 1e3)
        assert e["dur"] == pytest.approx(r.duration_ns / 1e3)
        assert e["args"]["bytes"] == r.bytes
    ts = [e["ts"] for e in spans]
    assert ts == sorted(ts)


def test_no_records_when_not_profiling(device: CLDevice, k: SimpleNamespace) -> None:
    idle = clops.profile()
    assert isinstance(idle, Profiler)
    assert scope.profilers() == ()
    _workload(device, k)
    assert idle.records == [] and idle.kernel_count == 0
    with clops.profile() as prof:
        pass
    _workload(device, k)
    assert prof.records == []
    assert prof.summary().splitlines()[1:] == []


def test_nested_profiles(device: CLDevice, k: SimpleNamespace) -> None:
    with clops.profile() as outer:
        _workload(device, k, scales=1)
        with clops.profile() as inner:
            _workload(device, k, scales=2)
    assert inner.kernel_count == 3
    assert outer.kernel_count == 2 + 3
