"""Helpers of the tests that use clops from many threads at once."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator

THREADS = 8
JOIN_S = 300


@contextlib.contextmanager
def eager_switches() -> Iterator[None]:
    """Threads take turns every few microseconds (not every 5 ms): a window between two steps
    of one thread where another may run then shows in a short test."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def run_threads(work: Callable[[int], None], n: int = THREADS) -> None:
    """Run ``work(t)`` for t in range(n) on n threads that start together (a barrier), with
    ``eager_switches``; re-raise the first failure, with the count of threads that failed."""
    start = threading.Barrier(n)
    failures: list[tuple[int, BaseException]] = []

    def body(t: int) -> None:
        try:
            start.wait()
            work(t)
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append((t, e))

    threads = [threading.Thread(target=body, args=(t,)) for t in range(n)]
    with eager_switches():
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=JOIN_S)
    assert not any(th.is_alive() for th in threads), "a thread is still running"
    if failures:
        t, e = failures[0]
        raise AssertionError(f"{len(failures)} of {n} threads failed; thread {t}: {e!r}") from e
