"""Shared helpers of the benchmarks: median timing, a markdown table and a JSON record in
``bench/results/<name>.json``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def median_seconds(fn: Callable[[], Any], *, number: int | None = None, repeat: int = 7,
                   after: Callable[[], Any] | None = None, warmup: int = 1,
                   sample_s: float = 0.02) -> float:
    """Median over ``repeat`` samples of the time of one ``fn()`` call, each sample timing
    ``number`` calls in a row (by default as many as take about ``sample_s``). ``after`` runs
    after each sample, outside the timing (e.g. to wait for the device)."""
    if number is None:
        t0 = time.perf_counter()
        fn()
        if after is not None:
            after()
        one = max(time.perf_counter() - t0, 1e-7)
        number = max(1, min(100_000, int(sample_s / one)))
    for _ in range(warmup):
        for _ in range(number):
            fn()
        if after is not None:
            after()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
        if after is not None:
            after()
    return statistics.median(samples)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; floats get three significant figures."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return "" if v is None else str(v)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in text)) for i, c in enumerate(columns)]
    # Numbers align right (the markdown says so too), text left.
    numeric = [all(isinstance(row[i], int | float) for row in rows) for i in range(len(columns))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |",
           "|" + "|".join(("-" * (w + 1) + ":") if num else "-" * (w + 2)
                          for w, num in zip(widths, numeric)) + "|"]
    out += ["| " + " | ".join(v.rjust(w) if num else v.ljust(w)
                              for v, w, num in zip(r, widths, numeric)) + " |" for r in text]
    return "\n".join(out)


def write_json(name: str, payload: dict[str, Any]) -> str:
    """Write ``payload`` (plus when and where it ran) to ``bench/results/<name>.json``."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    record = {"benchmark": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "host": platform.node(), "python": platform.python_version(), **payload}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    return path


def device_info(dev: Any) -> dict[str, Any]:
    return {"selector": dev.selector, "name": dev.name, "platform": dev.platform_version,
            "driver": dev.driver_version, "kind": dev.kind, "backend": dev.backend}


def arg_parser(description: str | None) -> argparse.ArgumentParser:
    """The options every benchmark takes: ``--device SEL`` and ``--quick``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default=None,
                   help="device selector, e.g. 'gpu', 'cpu:0', 'pocl' (default: clops' choice)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions, for a smoke run")
    return p
