"""The registry of pending tensors (those whose value is still a lazy graph): an entry comes
with each pending tensor and leaves when it is computed or dropped, from any thread."""

from __future__ import annotations

import gc
import threading

import numpy as np

import clops
from clops.array import tensor


def _ids() -> set[int]:
    return {id(t) for t in tensor.pending_tensors()}


def test_entries_come_and_go(device: clops.CLDevice) -> None:
    a = clops.ones(8, device=device).realize()
    assert id(a) not in _ids()
    b = a * 2
    assert id(b) in _ids()
    b.realize()
    assert id(b) not in _ids()
    c = a + 1
    key = id(c)
    del c
    gc.collect()
    assert key not in tensor._PENDING


def test_in_place_writes_compute_pending_readers_first(device: clops.CLDevice) -> None:
    a = clops.asarray(np.arange(4, dtype=np.float32), device=device)
    b = a * 2  # reads a's buffer, still pending
    a[...] = 0
    np.testing.assert_array_equal(np.asarray(b), [0, 2, 4, 6])


def test_threads_make_and_drop_pending_tensors(device: clops.CLDevice) -> None:
    a = clops.ones(16, device=device).realize()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for i in range(200):
                t = a * i
                if i % 3 == 0:
                    t.realize()
                del t
                tensor.pending_tensors()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    gc.collect()
    assert not errors
    assert all(r() is not None for r in tensor._PENDING.values())
