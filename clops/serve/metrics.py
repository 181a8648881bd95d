"""serve, metrics: latency histograms and the Prometheus text of ``GET /metrics``."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

# Seconds; a request's time to its first token spans a few milliseconds (a short prompt on a
# GPU) to minutes (a long one queued behind others on a CPU)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5,
                 1.0, 2.5)


def metric(name: str, kind: str, help_: str, value: Any, label: str = "") -> list[str]:
    """The lines of one metric: ``value`` a number, or {``label``'s value: number}."""
    lines = _header(name, kind, help_)
    if isinstance(value, dict):
        lines += [f'{name}{{{label}="{k}"}} {v}' for k, v in sorted(value.items())]
    else:
        lines.append(f"{name} {value}")
    return lines


def _header(name: str, kind: str, help_: str) -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]


@dataclass
class Histogram:
    """A Prometheus histogram: counts by upper bound, their sum and count."""

    name: str
    help: str
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)  # the last: past every bound (+Inf)

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.buckets, value)] += 1
            self.total += value
            self.n += 1

    def text(self) -> list[str]:
        with self._lock:
            counts, total, n = list(self.counts), self.total, self.n
        lines = _header(self.name, "histogram", self.help)
        running = 0
        for bound, c in zip(self.buckets, counts):
            running += c
            lines.append(f'{self.name}_bucket{{le="{bound:g}"}} {running}')
        lines += [f'{self.name}_bucket{{le="+Inf"}} {n}', f"{self.name}_sum {total:.6f}",
                  f"{self.name}_count {n}"]
        return lines


class Latencies:
    """The completion endpoints' latencies, per choice: time to the first token, time per
    token after it, and the whole request."""

    def __init__(self) -> None:
        self.first_token = Histogram("clops_time_to_first_token_seconds",
                                     "Seconds from a request's arrival to its first token.",
                                     LATENCY_BUCKETS)
        self.per_token = Histogram("clops_time_per_output_token_seconds",
                                   "Seconds a token after the first, by request.", TOKEN_BUCKETS)
        self.request = Histogram("clops_request_duration_seconds",
                                 "Seconds from a request's arrival to its last token "
                                 "(requests that ran to their end).", LATENCY_BUCKETS)

    def text(self) -> list[str]:
        return self.first_token.text() + self.per_token.text() + self.request.text()
