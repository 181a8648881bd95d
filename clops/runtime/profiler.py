"""Runtime, profiler: ``with clops.profile() as prof`` records every kernel launch and copy with
device timestamps; a summary table and a Chrome trace come out of it. Costs nothing when off.
A profiler in a ``with`` block is a launch scope with a profiler alone
(``clops.launches(profile=True)``; ``scope.py`` keeps which are open)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import pyopencl as cl

from .scope import LaunchScope, profilers

_LOCK = threading.Lock()


@dataclass
class Record:
    name: str
    kind: str  # "kernel" | "copy" | "marker" | "provider"
    device: str
    queued_ns: int = 0
    start_ns: int = 0
    end_ns: int = 0
    bytes: int = 0
    queue: int = 0  # which queue (index in the device's queue list), for traces
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


class Profiler:
    """Collects records while active. Timestamps are read lazily (events are waited on)."""

    def __init__(self) -> None:
        self._pending: list[tuple[Record, cl.Event]] = []
        self._records: list[Record] = []
        self._scopes: list[LaunchScope] = []  # the scopes its ``with`` blocks opened

    def add(self, name: str, kind: str, device: str, event: cl.Event | None, nbytes: int = 0,
            queue: int = 0, **extra: Any) -> None:
        rec = Record(name, kind, device, bytes=nbytes, queue=queue, extra=extra)
        with _LOCK:
            if event is None:
                self._records.append(rec)
            else:
                self._pending.append((rec, event))

    def _resolve(self) -> None:
        with _LOCK:
            pending, self._pending = self._pending, []
        for rec, ev in pending:
            try:
                ev.wait()
                p = ev.profile
                rec.queued_ns, rec.start_ns, rec.end_ns = p.queued, p.start, p.end
            except cl.Error:
                pass  # a queue without profiling: the record keeps zeros
        with _LOCK:
            self._records.extend(rec for rec, _ in pending)

    @property
    def records(self) -> list[Record]:
        self._resolve()
        return self._records

    @property
    def kernel_count(self) -> int:
        return sum(1 for r in self.records if r.kind == "kernel")

    def kernels(self) -> list[Record]:
        return [r for r in self.records if r.kind == "kernel"]

    def summary(self) -> str:
        """A table by name: calls, total and mean device time."""
        rows: dict[tuple[str, str], list[int]] = {}
        for r in self.records:
            agg = rows.setdefault((r.kind, r.name), [0, 0, 0])
            agg[0] += 1
            agg[1] += r.duration_ns
            agg[2] += r.bytes
        lines = [f"{'kind':<8} {'name':<40} {'calls':>7} {'total ms':>10} {'mean us':>10} "
                 f"{'GB/s':>8}"]
        for (kind, name), (n, tot, nb) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
            gbs = f"{nb / tot:.1f}" if tot and nb else ""
            lines.append(f"{kind:<8} {name[:40]:<40} {n:>7} {tot / 1e6:>10.3f} "
                         f"{tot / n / 1e3:>10.1f} {gbs:>8}")
        return "\n".join(lines)

    def to_chrome_trace(self, path: str) -> None:
        """Write a Chrome trace (opens in Perfetto or chrome://tracing)."""
        recs = self.records
        t0 = min((r.queued_ns or r.start_ns for r in recs if r.start_ns), default=0)
        # Trace viewers want numeric process and thread ids; names go in metadata events.
        pids: dict[str, int] = {}
        threads: set[tuple[int, int]] = set()
        events: list[dict[str, Any]] = []
        for r in recs:
            if r.device not in pids:
                pids[r.device] = len(pids) + 1
                events.append({"name": "process_name", "ph": "M", "pid": pids[r.device],
                               "tid": 0, "args": {"name": r.device}})
            pid = pids[r.device]
            if (pid, r.queue) not in threads:
                threads.add((pid, r.queue))
                events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": r.queue,
                               "args": {"name": f"queue {r.queue}"}})
            events.append({
                "name": r.name, "cat": r.kind, "ph": "X", "pid": pid, "tid": r.queue,
                "ts": max(r.start_ns - t0, 0) / 1e3, "dur": max(r.duration_ns, 0) / 1e3,
                "args": {"bytes": r.bytes, "queued_us": max(r.queued_ns - t0, 0) / 1e3,
                         **r.extra},
            })
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)

    def __enter__(self) -> Profiler:
        opened = LaunchScope(profiler=self)
        opened.__enter__()
        with _LOCK:
            self._scopes.append(opened)
        return self

    def __exit__(self, *exc: Any) -> None:
        with _LOCK:
            opened = self._scopes.pop() if self._scopes else None
        if opened is not None:
            opened.__exit__(*exc)
        self._resolve()


def profile() -> Profiler:
    """Record every kernel launch and copy inside a ``with`` block (on every thread): the
    profiler of ``clops.launches(profile=True)``, which its ``with`` block opens alone.

    >>> with clops.profile() as prof:
    ...     (a * 2).realize()
    >>> prof.kernel_count
    1
    """
    return Profiler()


def record(name: str, kind: str, device: str, event: cl.Event | None, nbytes: int = 0,
           queue: int = 0, **extra: Any) -> None:
    """Add a record to every profiler open now (the seam asks ``profiling()`` first)."""
    for p in profilers():
        p.add(name, kind, device, event, nbytes, queue, **extra)
