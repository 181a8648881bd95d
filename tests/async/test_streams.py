"""Streams and concurrency: work submitted to an out-of-order queue or spread over several
in-order queues gives the same results as numpy, whatever the interleaving; reads overlap,
writes are ordered (dependency tracking on every buffer)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import clops
from clops.runtime import CLDevice

from ..conftest import Gate

N = 2048


def test_current_queue_default_and_nested(device: CLDevice) -> None:
    assert clops.current_queue(device) is device.queue
    q1, q2 = device.create_queue(), device.create_queue(out_of_order=True)
    with clops.stream(q1) as got:
        assert got is q1 and clops.current_queue(device) is q1
        with clops.use_queue(q2):
            assert clops.current_queue(device) is q2
        assert clops.current_queue(device) is q1
    assert clops.current_queue(device) is device.queue


def test_stream_is_per_thread_and_per_task(device: CLDevice) -> None:
    q = device.create_queue()
    seen: list[object] = []
    with clops.stream(q):
        t = threading.Thread(target=lambda: seen.append(clops.current_queue(device)))
        t.start()
        t.join()
    assert seen == [device.queue]

    async def task(qq: object) -> bool:
        with clops.stream(qq):  # type: ignore[arg-type]
            await asyncio.sleep(0.001)
            return clops.current_queue(device) is qq

    async def main() -> list[bool]:
        qs = [device.create_queue() for _ in range(3)]
        return list(await asyncio.gather(*(task(x) for x in qs)))

    assert all(asyncio.run(main()))


def test_stream_routes_generated_kernels(device: CLDevice) -> None:
    q = device.create_queue(out_of_order=True)
    a = clops.asarray(np.arange(N, dtype=np.float32), device=device)
    with clops.profile() as prof, clops.stream(q):
        b = (a * 2 + 1).realize()
    assert {r.queue for r in prof.kernels()} == {q.index}
    np.testing.assert_allclose(b.to_numpy(), np.arange(N) * 2 + 1)


def test_stream_wrong_device(device: CLDevice) -> None:
    sub = device.create_sub_devices(2)[0] if device.partition_support()["max_sub_devices"] > 1 \
        else None
    if sub is None:
        pytest.skip("needs a second device")
    with pytest.raises(ValueError, match="belongs to"):
        with clops.stream(device.queue, device=sub):
            pass


@pytest.mark.parametrize("not_a_queue", ["x", 0, object()])
def test_stream_of_something_else_is_a_type_error(device: CLDevice, not_a_queue: object) -> None:
    with pytest.raises(TypeError, match=r"stream: expected a queue of a device \(a CLQueue"):
        with clops.stream(not_a_queue):  # type: ignore[arg-type]
            pass
    with pytest.raises(TypeError, match="device=") as info:
        with clops.stream(device):  # type: ignore[arg-type]  # a device, not its queue
            pass
    assert "CLDevice" in str(info.value)
    assert clops.current_queue(device) is device.queue


def _program(rng: np.random.Generator, steps: int) -> list[tuple[str, int, int, float]]:
    return [(str(rng.choice(["axpy", "scale_inplace", "copy", "mul", "custom_add"])),
             int(rng.integers(0, 4)), int(rng.integers(0, 4)), float(rng.choice([0.25, 0.5, 1.0])))
            for _ in range(steps)]


ADD = clops.kernel("__kernel void add_into(__global const float *x, long xo, __global float *y,"
                   " long yo, float c) { size_t i = get_global_id(0);"
                   " y[yo + i] = y[yo + i] + c * x[xo + i]; }", "add_into")


def _run(program: list[tuple[str, int, int, float]], device: CLDevice,
         queues: list[clops.CLQueue], seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    host = [rng.standard_normal(N).astype(np.float32) for _ in range(4)]
    dev_t = [clops.asarray(h, device=device) for h in host]
    ref = [h.copy() for h in host]
    for step, (op, i, j, c) in enumerate(program):
        with clops.stream(queues[step % len(queues)]):
            if op == "axpy":          # x_j = x_j + c * x_i (reads i, writes j)
                dev_t[j] = (dev_t[j] + c * dev_t[i]).realize()
                ref[j] = ref[j] + np.float32(c) * ref[i]
            elif op == "scale_inplace":
                dev_t[i] *= c
                ref[i] = ref[i] * np.float32(c)
            elif op == "copy":
                dev_t[j] = clops.asarray(dev_t[i], copy=True).realize()
                ref[j] = ref[i].copy()
            elif op == "mul":
                dev_t[i] = (dev_t[i] * dev_t[j] * 0.5).realize()
                ref[i] = ref[i] * ref[j] * np.float32(0.5)
            else:                     # custom kernel: y += c x in place
                if i == j:
                    continue
                ADD(N, None, dev_t[i], dev_t[j], c)
                ref[j] = ref[j] + np.float32(c) * ref[i]
    return [t.to_numpy() for t in dev_t], ref


@pytest.mark.parametrize("layout", ["out_of_order", "three_in_order", "mixed"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_interleaved_ops_match_numpy(device: CLDevice, layout: str, seed: int) -> None:
    if layout == "out_of_order":
        queues = [device.create_queue(out_of_order=True)]
    elif layout == "three_in_order":
        queues = [device.create_queue() for _ in range(3)]
    else:
        queues = [device.queue, device.create_queue(out_of_order=True), device.create_queue()]
    program = _program(np.random.default_rng(100 + seed), 60)
    got, ref = _run(program, device, queues, seed)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-3)


def test_cross_queue_write_then_read_waits(device: CLDevice, gate: Gate) -> None:
    """A write held back on one queue: readers on other queues must wait for it."""
    qa, qb = device.create_queue(), device.create_queue(out_of_order=True)
    x = clops.zeros(N, device=device).realize()
    with clops.stream(qa):
        ev = ADD(N, None, clops.ones(N, device=device), x, 5.0, wait_for=[gate.event])
    with clops.stream(qb):
        y = (x * 2).realize()
        fut = clops.to_host_future(y)
    assert not ev.done and not fut.done()
    gate.open()
    np.testing.assert_array_equal(fut.result(timeout=30), np.full(N, 10, np.float32))


@pytest.mark.parametrize("where", ["out_of_order", "two_queues"])
def test_reads_overlap_writes_ordered(device: CLDevice, gate: Gate, where: str) -> None:
    """Two reads of one buffer do not wait for each other; a write waits for both."""
    q = device.create_queue(out_of_order=True)
    q2 = q if where == "out_of_order" else device.create_queue()
    x = clops.ones(N, device=device).realize()
    y1, y2 = clops.zeros(N, device=device).realize(), clops.zeros(N, device=device).realize()
    with clops.stream(q):
        e1 = ADD(N, None, x, y1, 1.0, wait_for=[gate.event])  # held back
    with clops.stream(q2):
        e2 = ADD(N, None, x, y2, 2.0)                          # reads x too: free to run
    # NOTE: poll rather than wait: NVIDIA's driver takes out-of-order queues but runs their
    # commands in submission order, so there e2 stays behind the gated e1 whatever clops does.
    deadline = time.monotonic() + 10
    while not e2.done and time.monotonic() < deadline:
        time.sleep(0.01)
    serialized = not e2.done
    if not serialized:
        assert not e1.done
    with clops.stream(q):
        e3 = ADD(N, None, y2, x, 1.0)                          # writes x: waits for e1
        assert not e3.done
    gate.open()
    e3.wait()
    np.testing.assert_array_equal(y1.to_numpy(), np.full(N, 1, np.float32))  # read old x
    np.testing.assert_array_equal(x.to_numpy(), np.full(N, 3, np.float32))
    if serialized:
        assert where == "out_of_order", "a read on another queue waited for an unrelated read"
        pytest.skip(f"{device.name} runs out-of-order queues in submission order: the overlap "
                    "of two reads on one queue cannot be seen (the ordering was checked)")
