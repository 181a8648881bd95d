"""Runtime, events: wait/done, futures, await, gather, callbacks, and the ordering that markers,
barriers and tracked buffers give on in-order and out-of-order queues.

Work is held back with a user event (the ``gate`` fixture), so "not done yet" is certain rather
than a matter of timing."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from types import SimpleNamespace

import numpy as np
import pyopencl as cl
import pytest

from clops.runtime import CLDevice, CLQueue, Event, events, gather, wait_all, when_done

from ..conftest import Gate

N = 1024
SOURCE = """
__kernel void add(__global float *x, float v) { x[get_global_id(0)] += v; }
__kernel void affine(__global const float *x, __global float *y, float a, float b) {
    size_t i = get_global_id(0);
    y[i] = a * x[i] + b;
}
"""


@pytest.fixture
def k(device: CLDevice) -> SimpleNamespace:
    # One kernel object per name: each attribute access on a program makes a new one.
    prg = device.build(SOURCE)
    return SimpleNamespace(add=cl.Kernel(prg, "add"), affine=cl.Kernel(prg, "affine"))


def _buffer(device: CLDevice, values: np.ndarray, queue: CLQueue | None = None):
    buf = device.alloc(values.nbytes)
    device.write(buf, values, queue=queue).wait()
    return buf


def _get(device: CLDevice, buf, queue: CLQueue | None = None) -> np.ndarray:
    out = np.empty(buf.nbytes // 4, np.float32)
    device.read(out, buf, queue=queue)
    return out


def out_of_order_queue(device: CLDevice) -> CLQueue:
    """A new out-of-order queue; the test is skipped on a driver without them (PoCL has them:
    there a failure is a bug)."""
    try:
        return device.create_queue(out_of_order=True)
    except RuntimeError as e:
        if device.backend == "pocl":
            raise
        pytest.skip(str(e))


def _queue(device: CLDevice, order: str) -> CLQueue:
    return device.queue if order == "in-order" else out_of_order_queue(device)


def test_out_of_order_queue_supported(device: CLDevice) -> None:
    q = out_of_order_queue(device)
    props = q.cl_queue.properties
    assert props & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    assert props & cl.command_queue_properties.PROFILING_ENABLE
    assert not q.in_order and device.queue.in_order
    assert q in device.queues and len({x.index for x in device.queues}) == len(device.queues)
    assert "out-of-order" in repr(q)


def test_wait_and_done(device: CLDevice, k: SimpleNamespace, gate: Gate) -> None:
    x = _buffer(device, np.zeros(N, np.float32))
    ev = device.launch(k.add, (N,), None, [x, np.float32(2)], writes=[x], wait_for=[gate.event])
    assert isinstance(ev, Event)
    assert not ev.done
    assert "pending" in repr(ev)
    gate.open()
    assert ev.wait() is ev
    assert ev.done and "done" in repr(ev)
    np.testing.assert_array_equal(_get(device, x), np.full(N, 2, np.float32))
    q, s, e = ev.profile_ns()
    assert 0 < q <= s <= e


def test_event_without_work() -> None:
    ev = Event(None)
    assert ev.done
    assert ev.wait() is ev
    assert ev.future(7).result(timeout=0) == 7
    with pytest.raises(ValueError):
        ev.profile_ns()


def test_failed_work_is_reported(device: CLDevice) -> None:
    bad = cl.UserEvent(device.context)
    bad.set_status(-5)  # any negative status means the command failed
    ev = Event(bad, device.queue)
    with pytest.raises(RuntimeError, match="-5"):
        _ = ev.done


def test_future_with_value(device: CLDevice, k: SimpleNamespace, gate: Gate) -> None:
    x = _buffer(device, np.zeros(N, np.float32))
    ev = device.launch(k.add, (N,), None, [x, np.float32(1)], writes=[x], wait_for=[gate.event])
    fut = ev.future(42)
    assert isinstance(fut, concurrent.futures.Future)
    assert not fut.done()
    gate.open()
    assert fut.result(timeout=30) == 42
    assert ev.done


def test_future_with_callable(device: CLDevice, k: SimpleNamespace, gate: Gate) -> None:
    data = np.arange(N, dtype=np.float32)
    x = _buffer(device, data)
    device.launch(k.add, (N,), None, [x, np.float32(0.5)], writes=[x], wait_for=[gate.event])
    host = np.zeros(N, np.float32)
    ev = device.read(host, x, blocking=False)
    calls: list[int] = []

    def value() -> np.ndarray:
        calls.append(1)
        return host.copy()

    fut = ev.future(value)
    assert not fut.done() and not calls
    gate.open()
    np.testing.assert_array_equal(fut.result(timeout=30), data + 0.5)
    assert calls == [1]


def test_future_callable_error_goes_to_future(device: CLDevice) -> None:
    def boom() -> None:
        raise KeyError("from the value callable")

    fut = device.queue.marker().future(boom)
    with pytest.raises(KeyError, match="from the value callable"):
        fut.result(timeout=30)


def test_await_several_events(device: CLDevice, k: SimpleNamespace) -> None:
    bufs = [_buffer(device, np.full(N, i, np.float32)) for i in range(4)]
    gates = [Gate(device.context) for _ in bufs]
    order: list[str] = []

    async def main() -> list[Event]:
        evs = [device.launch(k.add, (N,), None, [b, np.float32(10)], writes=[b],
                             queue=device.create_queue(), wait_for=[g.event])
               for b, g in zip(bufs, gates)]
        task = asyncio.ensure_future(asyncio.gather(*evs))
        await asyncio.sleep(0.05)
        # The loop ran while the device work was held back: awaiting does not block it.
        order.append("loop ran")
        assert not task.done()
        for g in gates:
            g.open()
        done = await asyncio.wait_for(task, timeout=30)
        order.append("awaited")
        return done

    try:
        done = asyncio.run(main())
    finally:
        for g in gates:
            g.open()
    assert order == ["loop ran", "awaited"]
    assert len(done) == 4 and all(isinstance(e, Event) and e.done for e in done)
    for i, b in enumerate(bufs):
        np.testing.assert_array_equal(_get(device, b), np.full(N, i + 10, np.float32))


def test_await_returns_the_event(device: CLDevice) -> None:
    ev = device.queue.marker()

    async def main() -> Event:
        return await ev

    assert asyncio.run(main()) is ev


def test_gather(device: CLDevice, k: SimpleNamespace, gate: Gate) -> None:
    xs = [_buffer(device, np.zeros(N, np.float32)) for _ in range(3)]
    q2 = device.create_queue()
    evs = [device.launch(k.add, (N,), None, [x, np.float32(i + 1)], writes=[x],
                         queue=q2 if i else device.queue, wait_for=[gate.event])
           for i, x in enumerate(xs)]
    fut = gather(*evs)
    assert not fut.done()
    gate.open()
    assert fut.result(timeout=30) == evs
    assert all(e.done for e in evs)
    assert gather().result(timeout=0) == []
    wait_all([*evs, None, Event(None)])


def test_when_done_fires_after_completion(device: CLDevice, gate: Gate) -> None:
    ev = device.queue.marker(wait_for=[Event(gate.event)])
    fired = threading.Event()
    seen_done: list[bool] = []

    def callback() -> None:
        seen_done.append(ev.done)
        fired.set()

    when_done(ev, callback)
    assert not fired.is_set()
    gate.open()
    assert fired.wait(30)
    assert seen_done == [True]


def test_exit_waits_for_pending_driver_callbacks(device: CLDevice, gate: Gate) -> None:
    # A driver callback that fired while the interpreter finalizes aborted the process (Intel's
    # CPU runtime): exit waits, within a limit, for those registered and not yet run.
    ev = device.queue.marker(wait_for=[Event(gate.event)])
    fired = threading.Event()
    when_done(ev, fired.set)
    assert events._drain_callbacks(timeout=0.2) >= 1  # held back by the gate: still pending
    assert not fired.is_set()
    gate.open()
    assert events._drain_callbacks(timeout=30) == 0
    assert fired.is_set()


def test_when_done_many_fire_once_each(device: CLDevice, k: SimpleNamespace) -> None:
    x = _buffer(device, np.zeros(N, np.float32))
    counts = [0] * 200
    lock = threading.Lock()
    all_fired = threading.Event()
    remaining = [len(counts)]

    def make(i: int):
        def callback() -> None:
            with lock:
                counts[i] += 1
                remaining[0] -= 1
                if remaining[0] == 0:
                    all_fired.set()
        return callback

    for i in range(len(counts)):
        ev = device.launch(k.add, (N,), None, [x, np.float32(1)], writes=[x])
        when_done(ev, make(i))
    assert all_fired.wait(30)
    device.synchronize()
    assert counts == [1] * len(counts)
    np.testing.assert_array_equal(_get(device, x), np.full(N, len(counts), np.float32))


def test_when_done_without_work_runs_now() -> None:
    calls: list[int] = []
    when_done(Event(None), lambda: calls.append(1))
    assert calls == [1]


def test_when_done_watcher_path(device: CLDevice, gate: Gate,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Drivers with untrusted callbacks get a watcher thread instead: it must fire too, in order.
    monkeypatch.setattr(events, "CALLBACKS_UNRELIABLE", {device.platform_name})
    q2 = device.create_queue()
    first = device.queue.marker(wait_for=[Event(gate.event)])
    second = q2.marker()
    fired: list[str] = []
    both = threading.Event()

    def note(name: str):
        def callback() -> None:
            fired.append(name)
            if len(fired) == 2:
                both.set()
        return callback

    when_done(first, note("first"))
    when_done(second, note("second"))
    assert fired == []
    gate.open()
    assert both.wait(30)
    assert fired == ["first", "second"]
    assert first.future("v").result(timeout=30) == "v"


@pytest.mark.parametrize("order", ["in-order", "out-of-order"])
def test_tracked_dependencies(device: CLDevice, k: SimpleNamespace, gate: Gate, order: str) -> None:
    q = _queue(device, order)
    x = _buffer(device, np.arange(N, dtype=np.float32))
    y = device.alloc(N * 4)
    # x += 1 (held back), then y = 2x + 3 must see the new x, then x += 100 must wait for the read.
    e1 = device.launch(k.add, (N,), None, [x, np.float32(1)], writes=[x], queue=q,
                       wait_for=[gate.event])
    e2 = device.launch(k.affine, (N,), None, [x, y, np.float32(2), np.float32(3)],
                       reads=[x], writes=[y], queue=q)
    e3 = device.launch(k.add, (N,), None, [x, np.float32(100)], writes=[x], queue=q)
    assert not (e1.done or e2.done or e3.done)
    gate.open()
    wait_all([e1, e2, e3])
    ref = np.arange(N, dtype=np.float32) + 1
    np.testing.assert_array_equal(_get(device, y, q), 2 * ref + 3)
    np.testing.assert_array_equal(_get(device, x, q), ref + 100)


def test_tracked_dependencies_across_queues(device: CLDevice, k: SimpleNamespace,
                                            gate: Gate) -> None:
    q1, q2 = device.create_queue(), out_of_order_queue(device)
    x = _buffer(device, np.ones(N, np.float32))
    y = device.alloc(N * 4)
    e1 = device.launch(k.add, (N,), None, [x, np.float32(4)], writes=[x], queue=q1,
                       wait_for=[gate.event])
    e2 = device.launch(k.affine, (N,), None, [x, y, np.float32(-1), np.float32(0)],
                       reads=[x], writes=[y], queue=q2)
    host = np.zeros(N, np.float32)
    e3 = device.read(host, y, queue=device.queue, blocking=False)
    assert not (e2.done or e3.done)
    gate.open()
    e3.wait()
    assert e1.done and e2.done
    np.testing.assert_array_equal(host, np.full(N, -5, np.float32))


@pytest.mark.parametrize("order", ["in-order", "out-of-order"])
def test_marker(device: CLDevice, k: SimpleNamespace, gate: Gate, order: str) -> None:
    q = _queue(device, order)
    x = _buffer(device, np.zeros(N, np.float32))
    held = device.launch(k.add, (N,), None, [x, np.float32(1)], writes=[x], queue=q,
                         wait_for=[gate.event])
    everything = q.marker()  # no list: waits for all work enqueued before it
    listed = q.marker([held])
    assert not everything.done and not listed.done
    gate.open()
    everything.wait()
    listed.wait()
    assert held.done
    if q.in_order:
        # On an in-order queue even a marker listing finished work waits for what came before.
        other = Gate(device.context)
        try:
            pending = device.launch(k.add, (N,), None, [x, np.float32(1)], queue=q,
                                    wait_for=[other.event])
            late = q.marker([held])
            assert not late.done and not pending.done
        finally:
            other.open()
        late.wait()
        assert pending.done
        np.testing.assert_array_equal(_get(device, x), np.full(N, 2, np.float32))


def test_out_of_order_queue_runs_independent_work(device: CLDevice, k: SimpleNamespace,
                                                  gate: Gate) -> None:
    if device.backend != "pocl":
        pytest.skip("OpenCL allows an out-of-order queue to run in order; PoCL does not")
    q = out_of_order_queue(device)
    a = _buffer(device, np.zeros(N, np.float32))
    b = _buffer(device, np.zeros(N, np.float32))
    held = device.launch(k.add, (N,), None, [a, np.float32(1)], writes=[a], queue=q,
                         wait_for=[gate.event])
    free = device.launch(k.add, (N,), None, [b, np.float32(1)], writes=[b], queue=q)
    free.future().result(timeout=30)  # a timeout: the queue ran in order
    assert not held.done
    gate.open()
    held.wait()
    np.testing.assert_array_equal(_get(device, a), np.ones(N, np.float32))


@pytest.mark.parametrize("order", ["in-order", "out-of-order"])
def test_barrier(device: CLDevice, k: SimpleNamespace, gate: Gate, order: str) -> None:
    q = _queue(device, order)
    x = _buffer(device, np.zeros(N, np.float32))
    y = device.alloc(N * 4)
    device.launch(k.add, (N,), None, [x, np.float32(5)], writes=[x], queue=q,
                  wait_for=[gate.event])
    bar = q.barrier()
    # Untracked on purpose (x is not listed in reads): only the barrier orders this launch.
    after = device.launch(k.affine, (N,), None, [x, y, np.float32(3), np.float32(0)], queue=q)
    assert not bar.done and not after.done
    gate.open()
    after.wait()
    assert bar.done
    np.testing.assert_array_equal(_get(device, y, q), np.full(N, 15, np.float32))


def test_barrier_with_wait_list(device: CLDevice, k: SimpleNamespace, gate: Gate) -> None:
    q_other = device.create_queue()
    q = out_of_order_queue(device)
    x = _buffer(device, np.zeros(N, np.float32))
    y = device.alloc(N * 4)
    held = device.launch(k.add, (N,), None, [x, np.float32(7)], queue=q_other,
                         wait_for=[gate.event])
    q.barrier([held])  # work on q after this waits for the other queue's launch
    after = device.launch(k.affine, (N,), None, [x, y, np.float32(1), np.float32(1)], queue=q)
    assert not after.done
    gate.open()
    after.wait()
    np.testing.assert_array_equal(_get(device, y, q), np.full(N, 8, np.float32))


def test_raw_wait_for_events(device: CLDevice, k: SimpleNamespace, gate: Gate) -> None:
    # wait_for takes clops events and pyopencl events alike, on launches and copies.
    x = _buffer(device, np.zeros(N, np.float32))
    e1 = device.launch(k.add, (N,), None, [x, np.float32(1)], wait_for=[gate.event])
    host = np.zeros(N, np.float32)
    e2 = device.read(host, x, wait_for=[e1], blocking=False)
    assert not e2.done
    gate.open()
    e2.wait()
    np.testing.assert_array_equal(host, np.ones(N, np.float32))


def test_wait_all_across_contexts(device: CLDevice) -> None:
    other = CLDevice(device.entry, device.selector)  # same device, a context of its own
    evs = [device.queue.marker(), other.queue.marker(), Event(None), None]
    wait_all(evs)
    assert all(e is None or e.done for e in evs)


def test_dropped_queues_go(device: CLDevice) -> None:
    import gc

    before = len(device.queues)
    x = _buffer(device, np.zeros(N, np.float32))
    for _ in range(20):
        q = device.create_queue()
        device.write(x, np.full(N, 3, np.float32), queue=q)
        del q
    gc.collect()
    # only the last write's queue lives on: x's buffer holds its event (the pool keeps it too,
    # once x is freed, until the buffer is reused)
    assert len(device.queues) <= before + 1 and device.queue in device.queues
    out = np.empty(N, np.float32)
    device.read(out, x, blocking=True)
    assert (out == 3).all()
