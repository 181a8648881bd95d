"""Runtime, per-key locks: caches filled from many threads (built programs, generated kernels)
fill each key once, while other keys fill at the same time."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator


class KeyedLocks:
    """One lock per key, made when a thread first waits on the key and dropped when no thread
    holds or waits for it any more.

    >>> filling = KeyedLocks()
    >>> with filling.hold(key):
    ...     value = cache.get(key) or cache.setdefault(key, build(key))
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # key -> [its lock, threads holding or waiting for it]
        self._held: dict[Hashable, list] = {}

    @contextlib.contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        """Hold ``key``'s lock for the block (threads holding other keys go on)."""
        with self._lock:
            entry = self._held.get(key)
            if entry is None:
                entry = self._held[key] = [threading.Lock(), 0]
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._held[key]

    def __len__(self) -> int:
        """Keys held or waited for now."""
        with self._lock:
            return len(self._held)
