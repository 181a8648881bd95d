"""The examples run as tests (small sizes): CG with depends= chains, the two-queue pipeline
with its Chrome trace, and concurrent asyncio tasks."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

import clops
from clops.runtime import CLDevice

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"clops_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_cg_solve(device: CLDevice) -> None:
    cg = _load("cg_solve")
    dt = np.float64 if device.caps.fp64 else np.float32
    A_h = cg.spd_matrix(48, dtype=dt)
    b_h = np.random.default_rng(3).standard_normal(48).astype(dt)
    x = clops.zeros(48, dtype=dt, device=device)
    x, iters = cg.cg_solve(clops.asarray(A_h, device=device), clops.asarray(b_h, device=device),
                           x, tol=1e-10 if dt == np.float64 else 1e-5, check_every=5)
    assert 0 < iters < 200
    np.testing.assert_allclose(x.to_numpy(), np.linalg.solve(A_h, b_h),
                               rtol=1e-6 if dt == np.float64 else 1e-3, atol=1e-8)
    assert cg.main(["--n", "32", "--device", device.selector]) == 0


def test_two_queue_pipeline(device: CLDevice, tmp_path: Path) -> None:
    pipe = _load("two_queue_pipeline")
    host = [np.random.default_rng(k).random(50_000, dtype=np.float32) for k in range(4)]
    with clops.profile() as prof:
        out = pipe.run_pipeline(host, 8, device)
    for o, h in zip(out, host):
        np.testing.assert_allclose(o, pipe.reference(h, 8), rtol=1e-5, atol=1e-6)
    st = pipe.overlap(prof)
    assert st["copy_ms"] > 0 and st["kernel_ms"] > 0 and 0 <= st["hidden_fraction"] <= 1
    trace = tmp_path / "trace.json"
    prof.to_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    copy_tids = {e["tid"] for e in events if e["cat"] == "copy"}
    kernel_tids = {e["tid"] for e in events if e["cat"] == "kernel"}
    assert copy_tids and kernel_tids and not copy_tids & kernel_tids  # two queues in the trace
    assert pipe.main(["--chunks", "3", "--chunk-mb", "0.25", "--iters", "4",
                      "--device", device.selector, "--trace", str(trace)]) == 0


def test_asyncio_concurrent(device: CLDevice) -> None:
    ex = _load("asyncio_concurrent")
    out = asyncio.run(ex.run(3, 48, device))
    for s, o in enumerate(out):
        np.testing.assert_allclose(o, ex.reference(s, 48, device), rtol=1e-3)
    assert ex.main(["--tasks", "2", "--n", "32", "--device", device.selector]) == 0


def test_bench_overlap_runs(device: CLDevice, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "clops_bench_overlap", EXAMPLES.parent / "bench" / "bench_overlap.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "overlap.json"
    assert mod.main(["--device", device.selector, "--chunks", "2", "--chunk-mb", "0.25",
                     "--iters", "2", "--repeat", "1", "--json", str(out)]) == 0
    assert len(json.loads(out.read_text())["results"]) == 4
