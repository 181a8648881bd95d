"""Non-blocking host<->device copies through pinned staging memory; futures and awaitables."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import clops
from clops.runtime import CLDevice
from clops.runtime.staging import staging_pool

from ..conftest import Gate


@pytest.mark.parametrize("pinned", [True, False])
def test_round_trip(device: CLDevice, pinned: bool) -> None:
    h = np.random.default_rng(0).standard_normal((33, 17)).astype(np.float32)
    t = clops.from_host_async(h, device=device, pinned=pinned)
    h_copy = h.copy()
    h[:] = 0  # the caller may reuse its array at once
    assert t.shape == (33, 17) and t.dtype == clops.float32
    out = clops.to_host_future(t * 2, pinned=pinned).result(timeout=30)
    np.testing.assert_array_equal(out, h_copy * 2)


def test_dtypes_views_and_empty(device: CLDevice) -> None:
    b = clops.from_host_async(np.array([True, False, True]), device=device)
    np.testing.assert_array_equal(clops.to_host_future(b).result(30), [True, False, True])
    bf = clops.from_host_async(np.array([1.5, -2.0], np.float32), dtype=clops.bfloat16,
                               device=device)
    np.testing.assert_array_equal(clops.to_host_future(bf).result(30), [1.5, -2.0])
    x = clops.asarray(np.arange(20, dtype=np.int32), device=device)
    np.testing.assert_array_equal(clops.to_host_future(x[3:15:3]).result(30),
                                  np.arange(20)[3:15:3])
    e = clops.from_host_async(np.zeros((0, 4), np.float32), device=device)
    assert clops.to_host_future(e).result(30).shape == (0, 4)


def test_does_not_block(device: CLDevice, gate: Gate) -> None:
    k = clops.kernel("__kernel void inc(__global float *x, long o)"
                     "{ x[o + get_global_id(0)] += 1; }", "inc")
    t = clops.from_host_async(np.zeros(256, np.float32), device=device)
    k(256, None, t, wait_for=[gate.event])
    fut = clops.to_host_future(t)      # returns at once although the kernel is held back
    assert not fut.done()
    gate.open()
    np.testing.assert_array_equal(fut.result(timeout=30), np.ones(256, np.float32))


def test_staging_blocks_are_reused(device: CLDevice) -> None:
    pool = staging_pool(device)
    before = pool.held
    for _ in range(12):
        clops.to_host_future(clops.from_host_async(np.ones(10_000, np.float32),
                                                   device=device)).result(30)
    # At most one block for the upload and one for the download (40960 bytes each), however
    # many round trips: a block is reused once its copy completes.
    assert pool.held - before <= 2 * 40960
    pool.empty()
    assert pool.held == 0


def test_await_tensor_and_future(device: CLDevice) -> None:
    async def main() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = clops.from_host_async(np.arange(8, dtype=np.float32), device=device)
        a = await (x + 1)                                         # Tensor is awaitable
        b = await (x * 2).numpy_async()
        c = await asyncio.wrap_future(clops.to_host_future(x * 3))
        return a, b, c

    a, b, c = asyncio.run(main())
    np.testing.assert_array_equal(a, np.arange(8) + 1)
    np.testing.assert_array_equal(b, np.arange(8) * 2)
    np.testing.assert_array_equal(c, np.arange(8) * 3)


def test_upload_on_copy_queue_orders_compute(device: CLDevice, gate: Gate) -> None:
    copy_q, compute_q = device.create_queue(), device.create_queue()
    copy_q.barrier(wait_for=[clops.Event(gate.event)])   # hold the copy queue back
    x = clops.from_host_async(np.full(64, 2, np.float32), queue=copy_q)
    with clops.stream(compute_q):
        y = (x * x).realize()
    fut = clops.to_host_future(y, queue=compute_q)
    assert not fut.done()
    gate.open()
    np.testing.assert_array_equal(fut.result(30), np.full(64, 4, np.float32))
