"""Benchmarks, shared: medians of device and wall times, the device's copy ceiling, the peer
(PyTorch on the same GPU when it is importable and sees one, numpy on the CPU otherwise), and
the JSON each benchmark writes for ``run_all.py``."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import clops  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

COPY = """
__kernel void copy(__global const float4 *src, __global float4 *dst) {
    size_t i = get_global_id(0);
    dst[i] = src[i];
}
"""


def stream_args(ap: argparse.ArgumentParser) -> None:
    """The arguments of the one-stream A/B scripts (bench_ahead.py, bench_layer_ab.py): models,
    device, prompt and new tokens, tokens left out, rounds, a JSON file."""
    ap.add_argument("models", nargs="+")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--skip", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", default=None)


def per_token_summary(ms: dict[str, list[float]]) -> str:
    """Each variant's median ms a token, and its tokens a second, on one line."""
    return ", ".join(f"{k} {statistics.median(v):.3f} ms ({1e3 / statistics.median(v):.1f} tok/s)"
                     for k, v in ms.items())


def torch_cuda() -> Any | None:
    """The torch module when it is importable and sees a CUDA GPU, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def device_ms(dev: clops.CLDevice, run: Callable[[], object], repeat: int = 20,
              warmup: int = 3) -> tuple[float, float]:
    """(median device ms of the kernels one call of ``run`` enqueues, median wall ms of a call
    and the wait for its results).

    Device time is the sum of the kernels' own durations: the gaps between kernels while the
    host enqueues the next one are host time, counted in the wall time."""
    for _ in range(warmup):
        run()
    dev.synchronize()
    spans: list[float] = []
    with clops.profile() as prof:
        for _ in range(repeat):
            n0 = len(prof.records)
            run()
            dev.synchronize()
            recs = prof.records[n0:]
            ks = [r for r in recs if r.kind in ("kernel", "provider")]
            if ks:
                spans.append(sum(r.end_ns - r.start_ns for r in ks) / 1e6)
    walls = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        dev.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
    return (statistics.median(spans) if spans else float("nan")), statistics.median(walls)


def torch_ms(torch: Any, fn: Callable[[], object], repeat: int = 20, warmup: int = 3) -> float:
    """Median ms of ``fn`` on the current CUDA stream, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def nvidia_smi_id(dev: clops.CLDevice) -> str | None:
    """The GPU's PCI address as ``nvidia-smi -i`` takes it, or None (not an NVIDIA GPU, or its
    driver does not say)."""
    from clops.runtime import tma

    pci = tma._pci(dev) if dev.backend == "nvidia" else None
    return None if pci is None else f"{pci[0]:08x}:{pci[1]:02x}:{pci[2]:02x}.0"


@contextlib.contextmanager
def gpu_clocks(smi_id: str | None, every_ms: int = 50) -> Iterator[dict]:
    """The GPU's SM and memory clocks (MHz) as ``nvidia-smi`` samples them every ``every_ms``
    while the block runs, filled into the yielded dict when it ends: median and lowest SM clock,
    median memory clock, samples (empty without nvidia-smi or ``smi_id``). A figure beside the
    clock it ran at: machines of one kind can run a latency-bound kernel far apart."""
    out: dict = {}
    exe = shutil.which("nvidia-smi")
    if exe is None or smi_id is None:
        yield out
        return
    proc = subprocess.Popen([exe, "-i", smi_id, "--query-gpu=clocks.sm,clocks.mem",
                             "--format=csv,noheader,nounits", "-lms", str(every_ms)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield out
    finally:
        proc.terminate()
        try:
            text = proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            text = proc.communicate()[0]
        sm, mem = [], []
        for line in text.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and all(p.isdigit() for p in parts):
                sm.append(int(parts[0]))
                mem.append(int(parts[1]))
        if sm:
            out.update(sm_mhz_median=statistics.median(sm), sm_mhz_min=min(sm),
                       mem_mhz_median=statistics.median(mem), samples=len(sm))


def copy_ceiling(dev: clops.CLDevice, nbytes: int = 1 << 28, repeat: int = 20) -> dict:
    """Copy bandwidth (bytes read + written per second) of a float4 copy kernel on ``dev``, and
    of PyTorch's device copy when there is a CUDA GPU."""
    knl = dev.kernel(COPY, "copy")
    a, b = dev.alloc(nbytes), dev.alloc(nbytes)
    dev.write(a, np.ones(nbytes // 4, np.float32), blocking=True)
    n = nbytes // 16

    def run() -> None:
        dev.launch(knl, (n,), None, [a, b], reads=[a], writes=[b], name="copy")

    ms, _ = device_ms(dev, run, repeat)
    b2b = back_to_back_ms(dev, copy_calls(dev, 2 * nbytes, 2), count=8)
    out = {"bytes": nbytes, "ms": ms, "gbps": 2 * nbytes / ms / 1e6, "b2b_ms": b2b,
           "b2b_gbps": 2 * nbytes / b2b / 1e6}
    torch = torch_cuda()
    if torch is not None:
        x = torch.ones(nbytes // 4, device="cuda")
        y = torch.empty_like(x)
        tms = torch_ms(torch, lambda: y.copy_(x), repeat)
        out.update(torch_ms=tms, torch_gbps=2 * nbytes / tms / 1e6)
    return out


def same_size_copy_ms(dev: clops.CLDevice, moved: int, repeat: int = 20) -> float:
    """Device ms of the float4 copy kernel moving ``moved`` bytes in all (half read, half
    written): the ceiling at that size. Small transfers do not reach the large copy's
    bandwidth (a kernel has a fixed cost: ~6 us of profiled time on an H100), so a kernel's
    time over this one is the fraction of copy bandwidth it reaches at its own size."""
    knl = dev.kernel(COPY, "copy")
    half = max(16, moved // 2 // 16 * 16)
    a, b = dev.alloc(half), dev.alloc(half)
    n = half // 16

    def run() -> None:
        dev.launch(knl, (n,), None, [a, b], reads=[a], writes=[b], name="copy")

    ms, _ = device_ms(dev, run, repeat)
    return ms


SPIN = """
__kernel void spin(__global float *a, int n) {
    float x = a[0];
    for (int i = 0; i < n; ++i) x = mad(x, 0.999999f, 1e-7f);
    a[1] = x;
}
"""
_SPINNERS: dict[int, tuple[Any, Any, float]] = {}


def spinner(dev: clops.CLDevice) -> tuple[Any, Any, float]:
    """(kernel, buffer, ns per loop step) of a one-work-item busy loop on ``dev``."""
    got = _SPINNERS.get(id(dev))
    if got is None:
        knl, buf = dev.kernel(SPIN, "spin"), dev.alloc(64)
        dev.write(buf, np.zeros(16, np.float32), blocking=True)
        steps = 1 << 20
        dev.launch(knl, (1,), (1,), [buf, np.int32(steps)], writes=[buf])
        dev.synchronize()
        t0 = time.perf_counter()
        dev.launch(knl, (1,), (1,), [buf, np.int32(steps)], writes=[buf])
        dev.synchronize()
        got = _SPINNERS[id(dev)] = (knl, buf, (time.perf_counter() - t0) * 1e9 / steps)
    return got


def back_to_back_ms(dev: clops.CLDevice, calls: Sequence[Callable[[], object]],
                    count: int = 64, repeat: int = 5) -> float:
    """``back_to_back``'s device ms per call."""
    return back_to_back(dev, calls, count, repeat)[0]


def back_to_back(dev: clops.CLDevice, calls: Sequence[Callable[[], object]],
                 count: int = 64, repeat: int = 5, queue: Any = None) -> tuple[float, float]:
    """(Median device ms, median host ms to enqueue) per call when ``count`` calls (taken in
    turn from ``calls``) run back to back, measured without per-kernel events.

    The device first runs a busy loop long enough for the host to enqueue every call behind
    it; the wall time to the end, less the busy loop's own, is the calls' device time. No
    call waits on the host, and no kernel carries a profiling event: on NVIDIA's driver each
    event adds ~3 us of device time to its kernel (measured on an H100: an empty kernel runs
    back to back in 2.0 us without events, 5.0 us with them). The calls should enqueue
    without events (launch plans do, outside ``clops.profile``). Rotating several copies of
    the operands in ``calls`` keeps them out of the caches, as in a model's layers.

    ``queue`` (a pyopencl queue the calls enqueue on): the busy loop runs there, and the
    device's queues are not waited for."""
    knl, buf, ns_per_step = spinner(dev)
    finish = dev.synchronize if queue is None else queue.finish

    def busy(ms: float) -> None:
        steps = np.int32(int(ms * 1e6 / ns_per_step))
        if queue is None:
            dev.launch(knl, (1,), (1,), [buf, steps], writes=[buf])
        else:
            knl.set_args(buf.mem, steps)
            cl.enqueue_nd_range_kernel(queue, knl, (1,), (1,))

    def spin(ms: float) -> float:
        """Wall seconds of a busy loop of ``ms`` alone."""
        finish()
        t0 = time.perf_counter()
        busy(ms)
        finish()
        return time.perf_counter() - t0

    for c in calls:  # warm: kernels built, plans prepared
        c()
    finish()
    t0 = time.perf_counter()
    for i in range(count):
        calls[i % len(calls)]()
    host_ms = (time.perf_counter() - t0) * 1e3
    finish()
    lead = 2 * host_ms + 1.0  # the busy loop outlasts the enqueues
    out: list[float] = []
    host: list[float] = []
    while len(out) < repeat:
        base = spin(lead)
        finish()
        t0 = time.perf_counter()
        busy(lead)
        for i in range(count):
            calls[i % len(calls)]()
        enqueued = time.perf_counter() - t0
        finish()
        total = time.perf_counter() - t0
        if enqueued > 0.8 * base:  # the host fell behind: a longer busy loop, again
            if lead > 200:
                raise RuntimeError(
                    f"back_to_back: enqueueing {count} calls took {enqueued * 1e3:.0f} ms "
                    "with the device busy; the driver may block when its queue is this deep. "
                    "Use a smaller count.")
            lead *= 2
            continue
        out.append((total - base) / count * 1e3)
        host.append(enqueued / count * 1e3)
    return statistics.median(out), statistics.median(host)


def torch_back_to_back_ms(torch: Any, calls: Sequence[Callable[[], object]], count: int = 64,
                          repeat: int = 5) -> float:
    """``back_to_back_ms`` for PyTorch: a device sleep first, then CUDA events around
    ``count`` calls."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(count):
        calls[i % len(calls)]()
    host_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    out = []
    for _ in range(repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int((2 * host_s + 1e-3) * 2e9))  # cycles: ~2x the enqueue time
        s.record()
        for i in range(count):
            calls[i % len(calls)]()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / count)
    return statistics.median(out)


def copy_calls(dev: clops.CLDevice, moved: int, copies: int = 1) -> list[Callable[[], object]]:
    """Calls of the float4 copy kernel moving ``moved`` bytes in all (half read, half written),
    each on its own pair of buffers, enqueued as prepared launches (no events outside
    ``clops.profile``): the copy ceiling at that size for ``back_to_back_ms``."""
    half = max(16, moved // 2 // 16 * 16)
    calls = []
    for _ in range(copies):
        knl = cl.Kernel(dev.build(COPY, ()), "copy")  # its own argument slots
        a, b = dev.alloc(half), dev.alloc(half)
        dev.write(a, np.ones(half // 4, np.float32), blocking=True)
        knl.set_args(a.mem, b.mem)
        # one launch: kernel by kernel, as the kernels it is the ceiling for are enqueued
        prep = dev.prepare_launches([(knl, (half // 16,), None, "copy")], record=False)
        calls.append(lambda prep=prep, keep=(a, b): dev.enqueue_prepared(prep))
    return calls


def copies_for(nbytes: int, most: int = 16) -> int:
    """Copies of ``nbytes`` of operands to rotate so that they do not stay in a cache (the
    H100's L2 holds 50 MB): at least 256 MB in all, at most ``most``."""
    return max(1, min(most, -(-(256 << 20) // max(nbytes, 1))))


def environment(dev: clops.CLDevice) -> dict:
    env = {"device": dev.name, "driver": getattr(dev, "driver_version", ""),
           "platform": getattr(dev, "platform_name", ""),
           "date": datetime.date.today().isoformat(), "host": platform.node(),
           "python": platform.python_version()}
    try:
        cd = dev.cl_device
        env["driver"] = cd.driver_version
        env["platform"] = cd.platform.version
    except Exception:  # noqa: BLE001 - informational only
        pass
    torch = torch_cuda()
    if torch is not None:
        env["peer"] = f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}"
    else:
        env["peer"] = f"numpy {np.__version__} on the CPU"
    return env


def write_json(path: str, data: dict | list) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=float)
    print(f"wrote {path}")


def table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    """A markdown table: ``cols`` are (key, header, format)."""
    head = "| " + " | ".join(h for _, h, _ in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    lines = [head, sep]
    for r in rows:
        cells = []
        for key, _, fmt in cols:
            v = r.get(key)
            cells.append("" if v is None else (format(v, fmt) if fmt else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def write_result(name: str, payload: dict[str, Any], path: str | None = None) -> str:
    """Write ``payload`` (plus when and where it ran) to ``path``, by default
    ``bench/results/<name>.json``."""
    path = path or os.path.join(RESULTS_DIR, f"{name}.json")
    write_json(path, {"benchmark": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      "host": platform.node(), "python": platform.python_version(), **payload})
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


def interleaved_medians(fns: list[Callable[[], object]], repeat: int,
                        warmup: int = 2, samples: list[list[float]] | None = None
                        ) -> list[float]:
    """Median seconds of each function, sampled in turns (a, b, c, a, b, c, ...) so that all of
    them see the same drifting machine; a shared VM's memory bandwidth moves by tens of percent
    from one second to the next. ``samples`` receives each function's times, round by round."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    if samples is not None:
        samples.extend(times)
    return [statistics.median(ts) for ts in times]
