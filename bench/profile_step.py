"""Profiling a decode step: where a token's time goes, kernel by kernel, on each device of a
model (one device, or a model split over several).

    python bench/profile_step.py MODEL.gguf [--device gpu:0,gpu:1] [--prompt 128] [--new 32]
    python bench/profile_step.py MODEL.gguf --engine batch   # BatchEngine, one stream

Decodes ``--new`` tokens after a prompt of ``--prompt`` random tokens twice: once unprofiled
(the wall time a token), once under ``clops.profile()`` (every launch's device time). For each
device: the kernels' time a token by kernel name, launches a token, the device's busy time a
token (its kernels' time) and its idle time (the span of the profiled steps less the busy
time: enqueues the device waited for, the other device's turn, copies), and the host's time to
enqueue a step. ``--json`` keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import clops  # noqa: E402
import clops.llm  # noqa: E402
from clops.llm.batch import SamplingParams  # noqa: E402
from clops.runtime import Profiler  # noqa: E402


def _model_tokens(model, ids: list[int], new: int, skip: int = -1,
                 prof: Profiler | None = None) -> list[float]:
    """Arrival times of each new token through ``Model.generate_ids`` (greedy); ``prof``
    profiles the steps enqueued after the ``skip``-th token."""
    times = []
    for _ in model.generate_ids(ids, max_new_tokens=new):
        times.append(time.perf_counter())
        if prof is not None and len(times) == skip:
            prof.__enter__()
    return times


class _Timed:
    """A plan whose ``replay`` adds the host's seconds of enqueueing it to ``spent[0]``."""

    def __init__(self, plan, spent: list[float]) -> None:
        self.plan, self.spent = plan, spent

    def replay(self) -> None:
        t = time.perf_counter()
        self.plan.replay()
        self.spent[0] += time.perf_counter() - t


def _enqueue_ms(model, ids: list[int], new: int) -> float:
    """The host's milliseconds of enqueueing a decode step of ``Model.generate_ids`` (the
    mean over a generation of ``new`` tokens)."""
    spent = [0.0]
    plan_of = model._plan
    model._plan = lambda m, *a, **k: (_Timed(plan_of(m, *a, **k), spent) if m == 1
                                      else plan_of(m, *a, **k))
    try:
        n = len(_model_tokens(model, ids, new))
    finally:
        del model._plan
    return spent[0] * 1e3 / max(n - 1, 1)


def _engine_tokens(model, ids: list[int], new: int, skip: int = -1,
                   prof: Profiler | None = None) -> list[float]:
    """Arrival times of each new token of one sequence through the batched engine."""
    engine = model._engine_for([len(ids) + new])
    engine.add(list(ids), SamplingParams(), new)
    times: list[float] = []
    while len(times) < new:
        outs = engine.step()
        for o in outs:
            if o.error is None:
                times.append(time.perf_counter())
                if prof is not None and len(times) == skip:
                    prof.__enter__()
        if any(o.finished for o in outs):
            break
    return times


_LAYER = re.compile(r"[.]\d+$")


def _per_token(times: list[float], skip: int) -> float:
    gaps = np.diff(times[skip:])
    return float(np.median(gaps)) if len(gaps) else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--one-context", action="store_true",
                    help="the devices of a list in one OpenCL context (clops.context), not each "
                         "in its own as a selector list puts them")
    ap.add_argument("--engine", choices=("model", "batch"), default="model")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--skip", type=int, default=4, help="first tokens left out of the figures")
    ap.add_argument("--top", type=int, default=12, help="kernel names shown a device")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    t = time.perf_counter()
    device = clops.context(a.device) if a.one_context else a.device
    model = clops.llm.load(a.model, device=device, max_seq_len=a.prompt + a.new + 64,
                           progress=False)
    print(f"loaded in {time.perf_counter() - t:.1f} s: {model.where}", flush=True)
    ids = np.random.default_rng(0).integers(100, model.config.vocab_size - 1,
                                            a.prompt).tolist()
    run = _model_tokens if a.engine == "model" else _engine_tokens
    run(model, ids, 8)  # (builds)
    runs = [run(model, ids, a.new) for _ in range(3)]
    walls = [_per_token(t, a.skip) for t in runs]
    wall = statistics.median(walls)
    print(f"wall a token, unprofiled: {wall * 1e3:.3f} ms ({1 / wall:.1f} tok/s; runs "
          + ", ".join(f"{w * 1e3:.3f}" for w in walls) + ")", flush=True)
    # every gap between tokens (the first ones included), and the mean rate a generation's
    # statistics give (its tokens after the first over the time after the first)
    gaps = [(np.diff(t) * 1e3).tolist() for t in runs]
    means = [(t[-1] - t[0]) / (len(t) - 1) * 1e3 for t in runs if len(t) > 1]
    print("mean ms a token after the first: " + ", ".join(f"{v:.3f}" for v in means)
          + "; gaps ms of the first run: " + " ".join(f"{v:.2f}" for v in gaps[0]), flush=True)

    enq = None
    if a.engine == "model":
        enq = _enqueue_ms(model, ids, a.new)
        print(f"host enqueue a token: {enq:.3f} ms", flush=True)

    prof = clops.profile()
    times = run(model, ids, a.new, a.skip, prof)
    prof.__exit__(None, None, None)
    prof_wall = _per_token(times, a.skip)
    recs = [r for r in prof.records if r.start_ns and r.end_ns]
    # the steps profiled: one sampling launch each (else the steps enqueued after the
    # skip-th token, one of them enqueued before it)
    steps = sum(1 for r in recs if r.name in ("sample", "greedy", "head_greedy")) or \
        len(times) - a.skip - 1
    out: dict = {"model": os.path.basename(a.model), "device": a.device, "engine": a.engine,
                 "prompt": a.prompt, "new": a.new, "wall_ms": wall * 1e3,
                 "wall_runs_ms": [w * 1e3 for w in walls], "mean_ms": means, "gaps_ms": gaps,
                 "enqueue_ms": enq,
                 "profiled_wall_ms": prof_wall * 1e3,
                 "steps_profiled": steps, "devices": {}}
    print(f"wall a token, profiled: {prof_wall * 1e3:.3f} ms ({steps} steps profiled)",
          flush=True)
    if not recs or steps <= 0:
        print("no profiled records")
        return 1
    by_dev: dict[str, list] = {}
    for r in recs:
        by_dev.setdefault(r.device, []).append(r)
    for dev, rs in by_dev.items():
        rs.sort(key=lambda r: r.start_ns)
        keep = rs
        span = keep[-1].end_ns - keep[0].start_ns
        busy = sum(r.duration_ns for r in keep)
        names: dict[str, list[int]] = {}
        for r in keep:
            # (a layer's launches by their name less the layer: qkv.7 -> qkv)
            agg = names.setdefault(r.kind + ":" + _LAYER.sub("", r.name), [0, 0])
            agg[0] += 1
            agg[1] += r.duration_ns
        top = sorted(names.items(), key=lambda kv: -kv[1][1])
        d = {"launches_a_token": len(keep) / steps, "busy_ms": busy / steps / 1e6,
             "span_ms": span / steps / 1e6, "idle_ms": (span - busy) / steps / 1e6,
             "kernels": {k: {"calls_a_token": c / steps, "ms_a_token": ns / steps / 1e6}
                         for k, (c, ns) in top}}
        # gaps between one launch's end and the next one's start, a token
        gaps = [max(0, b.start_ns - e.end_ns) for e, b in zip(keep, keep[1:])]
        d["median_gap_us"] = float(np.median(gaps)) / 1e3 if gaps else 0.0
        out["devices"][dev] = d
        print(f"\n{dev}: {d['launches_a_token']:.0f} launches a token, busy "
              f"{d['busy_ms']:.3f} ms, idle {d['idle_ms']:.3f} ms of {d['span_ms']:.3f}; "
              f"median gap between launches {d['median_gap_us']:.1f} us")
        for k, (c, ns) in top[:a.top]:
            print(f"  {k[:60]:<60} {c / steps:6.1f} a token {ns / steps / 1e3:9.1f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
