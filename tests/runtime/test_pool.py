"""Runtime, memory: size classes, reuse, thread safety, reuse while the device still works on a
buffer, statistics, emptying, the memory limit and the out-of-memory path."""

from __future__ import annotations

import faulthandler
import sys
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pyopencl as cl
import pytest
from hypothesis import given
from hypothesis import strategies as st

import clops
from clops import _config
from clops._config import parse_bytes
from clops.runtime import Buffer, BufferPool, CLDevice, size_class
from clops.runtime.pool import MIN_BLOCK

from ..conftest import Gate, _real_stderr

KiB = 1 << 10
MiB = 1 << 20


# -- size classes ----------------------------------------------------------------------------------
@given(st.integers(min_value=0, max_value=1 << 44))
def test_size_class_covers_request_with_little_waste(n: int) -> None:
    s = size_class(n)
    assert s >= n
    assert s >= MIN_BLOCK
    if n > MIN_BLOCK:
        assert (s - n) / n < 0.125
    assert size_class(s) == s  # a class is its own class


@given(st.integers(min_value=0, max_value=1 << 40), st.integers(min_value=0, max_value=1 << 40))
def test_size_class_is_monotone(a: int, b: int) -> None:
    a, b = min(a, b), max(a, b)
    assert size_class(a) <= size_class(b)


def test_size_class_examples() -> None:
    assert [size_class(n) for n in (0, 1, 256, 257, 1000, 1024, 1025, 1 << 20)] == [
        256, 256, 256, 288, 1024, 1024, 1152, 1 << 20]


@pytest.mark.parametrize("octave", [8, 9, 10, 12])
def test_eight_classes_per_octave(octave: int) -> None:
    lo = 1 << octave
    classes = {size_class(n) for n in range(lo + 1, 2 * lo + 1)}
    assert len(classes) == 8
    assert max(classes) == 2 * lo


# -- reuse and statistics --------------------------------------------------------------------------
def test_reuse_hits(device: CLDevice) -> None:
    pool = BufferPool(device)
    a = pool.alloc(1000)
    assert isinstance(a, Buffer) and (a.nbytes, a.size) == (1000, 1024)
    assert a.mem.size >= 1000
    ptr = a.mem.int_ptr
    assert pool.stats.as_dict() | {"limit": None} == {
        "in_use": 1024, "cached": 0, "peak": 1024, "hits": 0, "misses": 1, "limit": None}
    del a
    assert (pool.stats.in_use, pool.stats.cached) == (0, 1024)
    b = pool.alloc(1010)  # same class
    assert b.mem.int_ptr == ptr
    assert (pool.stats.hits, pool.stats.misses) == (1, 1)
    c = pool.alloc(1100)  # next class up: a miss
    assert c.mem.int_ptr != ptr and c.size == 1152
    assert (pool.stats.hits, pool.stats.misses) == (1, 2)
    assert pool.stats.in_use == 1024 + 1152
    del b, c
    assert (pool.stats.in_use, pool.stats.cached) == (0, 1024 + 1152)
    assert pool.stats.peak == 1024 + 1152


def test_device_pool_reuse_and_memory_stats(device: CLDevice) -> None:
    device.synchronize()
    clops.empty_cache(device)
    before = clops.memory_stats(device)
    assert {"in_use", "cached", "peak", "hits", "misses"} <= set(before)
    assert all(isinstance(before[k], int) and before[k] >= 0
               for k in ("in_use", "cached", "peak", "hits", "misses"))
    assert before["cached"] == 0
    bufs = [device.alloc(40 * KiB) for _ in range(3)]
    mid = device.memory_stats()
    assert mid["in_use"] - before["in_use"] == 3 * 40 * KiB
    assert mid["misses"] - before["misses"] == 3
    assert mid["peak"] >= mid["in_use"] + mid["cached"]
    del bufs
    after = device.memory_stats()
    assert after["in_use"] == before["in_use"]
    assert after["cached"] == 3 * 40 * KiB
    again = [device.alloc(40 * KiB - 100) for _ in range(3)]
    assert device.memory_stats()["hits"] - after["hits"] == 3
    assert device.memory_stats()["cached"] == 0
    del again
    assert clops.empty_cache(device) == 3 * 40 * KiB
    assert device.memory_stats()["cached"] == 0
    if device is clops.device():
        assert clops.memory_stats() == device.memory_stats()


def test_empty_cache(device: CLDevice) -> None:
    pool = BufferPool(device)
    bufs = [pool.alloc(n) for n in (300, 5000, 5000, 70000)]
    total = sum(b.size for b in bufs)
    del bufs
    assert pool.stats.cached == total
    assert pool.empty() == total
    assert (pool.stats.cached, pool.stats.in_use) == (0, 0)
    assert pool.empty() == 0
    pool.alloc(5000)
    assert (pool.stats.hits, pool.stats.misses) == (0, 5)


def test_device_addresses_kept_while_held(device: CLDevice) -> None:
    """The pool keeps a buffer's device address (runtime/tma.py) while it holds the memory,
    across reuse, and forgets it where it lets the memory go: emptied, or over the limit."""
    pool = BufferPool(device)
    buf = pool.alloc(5000)
    handle = buf.mem.int_ptr
    pool.addresses[handle] = 1 << 40
    del buf
    again = pool.alloc(5000)
    assert again.mem.int_ptr == handle and pool.addresses[handle] == 1 << 40
    del again
    pool.empty()
    assert handle not in pool.addresses
    tight = BufferPool(device, limit=1 * MiB)
    a = tight.alloc(5000)
    tight.addresses[a.mem.int_ptr] = 1 << 40
    tight.limit = 1  # now over the limit: a goes back to the driver, not to the cache
    del a
    assert tight.addresses == {} and tight.stats.cached == 0


def test_device_address_query(device: CLDevice) -> None:
    """runtime/tma.py reads a buffer's device address once (a kernel on a queue of its own,
    not behind the device's queued work) and the pool keeps it; two live buffers differ."""
    from clops.runtime import tma

    a, b = device.alloc(4096), device.alloc(4096)
    addr = tma.address(device, a)
    assert addr != 0 and device.pool.addresses[a.mem.int_ptr] == addr
    assert tma.address(device, a) == addr
    assert tma.address(device, b) not in (0, addr)
    # a buffer the pool does not own: asked each time, kept nowhere
    ext = Buffer(a.mem, 4096, 4096, None)
    assert tma.address(device, ext) == addr
    del ext


def test_alloc_zero_and_negative(device: CLDevice) -> None:
    pool = BufferPool(device)
    z = pool.alloc(0)
    assert (z.nbytes, z.size) == (0, MIN_BLOCK)
    with pytest.raises(ValueError, match="-1"):
        pool.alloc(-1)


def test_roundtrip_and_offsets(device: CLDevice) -> None:
    data = np.arange(4096, dtype=np.float32)
    buf = device.alloc(data.nbytes)
    device.write(buf, data)
    device.write(buf, np.full(16, -1, np.float32), offset=64 * 4)
    out = np.empty_like(data)
    device.read(out, buf)
    ref = data.copy()
    ref[64:80] = -1
    np.testing.assert_array_equal(out, ref)
    part = np.empty(10, np.float32)
    device.read(part, buf, offset=60 * 4)
    np.testing.assert_array_equal(part, ref[60:70])
    other = device.alloc(data.nbytes)
    device.copy(other, buf, 100 * 4, dst_offset=8, src_offset=4 * 4)
    got = np.empty(102, np.float32)
    device.read(got, other)
    np.testing.assert_array_equal(got[2:102], ref[4:104])
    # Zero-byte copies are no-ops rather than driver errors.
    assert device.write(buf, np.empty(0, np.float32)).done
    assert device.read(np.empty(0, np.float32), buf).done
    assert device.copy(other, buf, 0).done


# -- concurrency -----------------------------------------------------------------------------------
ADD_SOURCE = "__kernel void add(__global int *x, int v) { x[get_global_id(0)] += v; }"
# Bounded, so that one global size serves every length: PoCL compiles a kernel once per
# work-group size (~10 ms each, more on a loaded machine), and a global size per random length
# made the test compile ~1900 of them (a minute or more with a cold PoCL cache).
ADD_N_SOURCE = ("__kernel void add_n(__global int *x, int v, int n) "
                "{ int i = (int)get_global_id(0); if (i < n) x[i] += v; }")
MAX_N = 3072

# A deadlock, not a slow machine, is what these deadlines are for: the threads' work takes
# 0.1-3 s on two cores under three busy loops, with a cold PoCL cache too.
JOIN_DEADLINE_S = 300
# Past this, a thread that holds the GIL (pyopencl waits for a pending host copy without
# releasing it when the copy's event goes) keeps the main thread from ever failing the join:
# faulthandler's own thread then writes every stack and ends the run.
HARD_DEADLINE_S = JOIN_DEADLINE_S + 120


def _dump_all_stacks() -> None:
    try:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    except (OSError, ValueError):  # a stderr without a file descriptor (--capture=sys)
        faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)


RunThreads = Callable[[Callable[[int], None], int], None]


@pytest.fixture
def run_threads(request: pytest.FixtureRequest) -> RunThreads:
    """``run_threads(work, n)`` runs ``work(tid)`` on ``n`` threads, switching between them
    often; if they have not all finished by ``JOIN_DEADLINE_S`` the test fails with every
    thread's stack on stderr."""
    terminal = _real_stderr(request.config)  # not the capture file, lost if the run ends

    def run(work: Callable[[int], None], n: int) -> None:
        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads often, between any two driver calls
        faulthandler.dump_traceback_later(HARD_DEADLINE_S, exit=True, file=terminal)
        try:
            threads = [threading.Thread(target=work, args=(t,), name=f"work-{t}", daemon=True)
                       for t in range(n)]
            for t in threads:
                t.start()
            end = time.monotonic() + JOIN_DEADLINE_S
            for t in threads:
                t.join(timeout=max(end - time.monotonic(), 0.0))
            alive = [t.name for t in threads if t.is_alive()]
            if alive:
                _dump_all_stacks()
        finally:
            faulthandler.cancel_dump_traceback_later()
            sys.setswitchinterval(old)
        if alive:
            pytest.fail(f"{', '.join(alive)} still running after {JOIN_DEADLINE_S} s: a "
                        "deadlock? Every thread's stack is in the captured stderr.")

    return run


def test_two_threads_alloc_write_launch_read_free(device: CLDevice,
                                                  run_threads: RunThreads) -> None:
    prg = device.build(ADD_N_SOURCE)
    # One kernel object shared by both threads, as a kernel cache would hand out.
    kernel = cl.Kernel(prg, "add_n")
    cycles = 1500
    errors: list[str] = []

    def work(tid: int) -> None:
        q = device.queue if tid == 0 else device.create_queue()
        rng = np.random.default_rng(tid)
        try:
            for i in range(cycles):
                n = int(rng.integers(1, 3000))
                pattern = np.arange(n, dtype=np.int32) * 3 + (tid << 24) + i
                buf = device.alloc(pattern.nbytes)
                device.write(buf, pattern, queue=q)
                device.launch(kernel, (MAX_N,), None, [buf, np.int32(tid + 1), np.int32(n)],
                              writes=[buf], queue=q)
                out = np.empty_like(pattern)
                device.read(out, buf, queue=q)
                if not np.array_equal(out, pattern + tid + 1):
                    bad = int(np.count_nonzero(out != pattern + tid + 1))
                    errors.append(f"thread {tid} cycle {i}: {bad} of {n} values wrong")
                del buf
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"thread {tid}: {e!r}")

    stats0 = device.memory_stats()
    run_threads(work, 2)
    assert errors == []
    stats = device.memory_stats()
    assert stats["in_use"] == stats0["in_use"]
    assert stats["hits"] - stats0["hits"] > cycles  # most allocations were reuses


def test_two_threads_share_one_kernel_object(device: CLDevice,
                                            run_threads: RunThreads) -> None:
    # Arguments live on the kernel object: a launch must set and enqueue them as one step.
    kernel = cl.Kernel(device.build(ADD_SOURCE), "add")
    n, launches = 256, 2000
    bufs = [device.alloc(n * 4) for _ in range(2)]
    for b in bufs:
        device.write(b, np.zeros(n, np.int32))
    device.synchronize()
    queues = [device.queue, device.create_queue()]

    def work(tid: int) -> None:
        for _ in range(launches):
            device.launch(kernel, (n,), None, [bufs[tid], np.int32(tid + 1)],
                          writes=[bufs[tid]], queue=queues[tid])

    run_threads(work, 2)
    for tid, b in enumerate(bufs):
        out = np.empty(n, np.int32)
        device.read(out, b, queue=queues[tid])
        np.testing.assert_array_equal(out, np.full(n, launches * (tid + 1), np.int32))


def test_reuse_while_previous_owner_still_pending(device: CLDevice, gate: Gate) -> None:
    prg = device.build("__kernel void twice(__global const int *x, __global int *y) "
                       "{ size_t i = get_global_id(0); y[i] = 2 * x[i]; }")
    twice = cl.Kernel(prg, "twice")
    n = 4096
    old = np.arange(n, dtype=np.int32)
    x = device.alloc(old.nbytes)
    device.write(x, old).wait()
    y = device.alloc(old.nbytes)
    # The kernel reads x but cannot start until the gate opens; x's owner lets go of it now.
    ev = device.launch(twice, (n,), None, [x, y], reads=[x], writes=[y], wait_for=[gate.event])
    ptr = x.mem.int_ptr
    del x
    # The pool hands the same memory out again, to a writer on another queue.
    q2 = device.create_queue()
    z = device.alloc(old.nbytes)
    assert z.mem.int_ptr == ptr
    new = np.full(n, -7, np.int32)
    w = device.write(z, new, queue=q2)
    assert not ev.done
    assert not w.done  # the new owner's write waits for the old owner's pending read
    gate.open()
    out = np.empty(n, np.int32)
    device.read(out, y)
    np.testing.assert_array_equal(out, 2 * old)
    device.read(out, z, queue=q2)
    np.testing.assert_array_equal(out, new)


def test_reuse_after_pending_write(device: CLDevice, gate: Gate) -> None:
    # A buffer freed while a write to it is pending: the next owner's read on another queue
    # sees the finished write, its own write lands after it.
    n = 1024
    x = device.alloc(n * 4)
    device.write(x, np.arange(n, dtype=np.int32), wait_for=[gate.event])
    ptr = x.mem.int_ptr
    del x
    y = device.alloc(n * 4)
    assert y.mem.int_ptr == ptr
    q2 = device.create_queue()
    w = device.write(y, np.full(n, 5, np.int32), queue=q2)
    assert not w.done
    gate.open()
    out = np.empty(n, np.int32)
    device.read(out, y, queue=q2)
    np.testing.assert_array_equal(out, np.full(n, 5, np.int32))


# -- limit and out of memory -----------------------------------------------------------------------
def test_memory_limit_from_env(device: CLDevice, clops_env) -> None:
    cfg = clops_env(CLOPS_MEMORY_LIMIT="64KB")
    assert cfg.memory_limit == 64 * KiB
    pool = BufferPool(device, limit=_config.CONFIG.memory_limit)
    assert pool.limit == 64 * KiB and pool.stats.as_dict()["limit"] == 64 * KiB


def test_oom_names_requested_in_use_and_cached(device: CLDevice) -> None:
    pool = BufferPool(device, limit=64 * KiB)
    keep = pool.alloc(32 * KiB)
    spare = pool.alloc(16 * KiB)
    del spare  # 16 KiB cached
    with pytest.raises(MemoryError) as info:
        pool.alloc(40000)  # class 40960: does not fit even with the cache emptied
    msg = str(info.value)
    assert "requested 40000 bytes" in msg
    assert f"{32 * KiB} bytes in use" in msg
    assert f"{16 * KiB} bytes cached" in msg
    assert "CLOPS_MEMORY_LIMIT" in msg and f"limit {64 * KiB}" in msg
    assert "retried" in msg
    # The cache was released on the way; what is in use is untouched and still usable.
    assert (pool.stats.in_use, pool.stats.cached) == (32 * KiB, 0)
    assert keep.mem.size >= 32 * KiB
    small = pool.alloc(16 * KiB)  # fits
    assert pool.stats.in_use == 48 * KiB
    del small


def test_oom_retry_succeeds_when_cache_was_the_problem(device: CLDevice) -> None:
    pool = BufferPool(device, limit=64 * KiB)
    a, b = pool.alloc(32 * KiB), pool.alloc(32 * KiB)
    del a, b
    assert pool.stats.cached == 64 * KiB
    big = pool.alloc(64 * KiB)  # another class: only fits once the cache is released
    assert big.size == 64 * KiB
    assert (pool.stats.in_use, pool.stats.cached) == (64 * KiB, 0)
    assert (pool.stats.hits, pool.stats.misses) == (0, 3)


def test_limit_is_never_passed(device: CLDevice) -> None:
    limit = 256 * KiB
    pool = BufferPool(device, limit=limit)
    rng = np.random.default_rng(1)
    held: list[Buffer] = []
    ooms = 0
    for _ in range(400):
        if held and rng.random() < 0.45:
            held.pop(int(rng.integers(len(held))))
        else:
            try:
                held.append(pool.alloc(int(rng.integers(1, 64 * KiB))))
            except MemoryError:
                ooms += 1
        st_ = pool.stats
        assert st_.in_use + st_.cached <= limit
        assert st_.in_use == sum(b.size for b in held)
        assert st_.peak <= limit
    assert ooms > 0  # the loop did run into the limit


def test_device_memory_limit(device: CLDevice, clops_env) -> None:
    clops_env(CLOPS_MEMORY_LIMIT="1MB")
    fresh = CLDevice(device.entry, device.selector)  # its own context, pool and limit
    assert fresh.memory_stats()["limit"] == MiB
    keep = fresh.alloc(MiB // 2)
    with pytest.raises(MemoryError, match="CLOPS_MEMORY_LIMIT"):
        fresh.alloc(MiB)
    assert fresh.memory_stats()["in_use"] == keep.size


def test_larger_than_device_allows(device: CLDevice) -> None:
    pool = BufferPool(device)
    too_big = device.caps.max_alloc + 1
    with pytest.raises(MemoryError, match=f"{too_big} bytes.*largest single allocation"):
        pool.alloc(too_big)
    assert pool.stats.in_use == 0


def test_request_just_under_device_cap(device: CLDevice) -> None:
    # A device whose allocation cap is not a size class: the request is not rounded past the
    # cap, and that odd-sized buffer must never be handed out for a larger request later.
    fake = SimpleNamespace(context=device.context, name=device.name,
                           caps=SimpleNamespace(max_alloc=10_000))
    pool = BufferPool(fake)  # type: ignore[arg-type]
    a = pool.alloc(9500)  # class 10240 > cap
    assert a.mem.size >= 9500
    assert pool.stats.in_use == a.size
    del a
    b = pool.alloc(9900)
    assert b.mem.size >= 9900
    assert pool.stats.in_use == b.size
    del b
    assert pool.stats.in_use == 0


# -- byte counts -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("512MB", 512 * MiB),
        ("1048576", MiB),
        ("1.5 GiB", 3 * (1 << 29)),
        ("4k", 4 * KiB),
        (" 2 GB ", 2 << 30),
        ("0", 0),
        ("10b", 10),
        ("1T", 1 << 40),
        (".5M", MiB // 2),
    ],
)
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "abc", "12 parsecs", "-5MB", "1.2.3", "MB", "5 M B"])
def test_parse_bytes_errors(text: str) -> None:
    with pytest.raises(ValueError, match="byte count") as info:
        parse_bytes(text)
    assert "512MB" in str(info.value)  # the message shows how to write one


def test_bad_memory_limit_env(clops_env) -> None:
    with pytest.raises(ValueError, match="lots"):
        clops_env(CLOPS_MEMORY_LIMIT="lots")
