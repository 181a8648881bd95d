"""A two-queue pipeline: chunks of a host array are uploaded on a copy queue (through pinned
staging memory), processed on a compute queue and downloaded on the copy queue again, so that
chunk k+1's upload and chunk k-1's download run while chunk k computes. Dependency tracking
orders each chunk's copy -> compute -> copy across the queues; nothing else synchronizes.

``clops.profile()`` records every copy and kernel with device timestamps; the Chrome trace it
writes (open it in Perfetto) shows the two queues side by side.

    python examples/two_queue_pipeline.py [--chunks 8] [--chunk-mb 4] [--trace pipeline.json]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

import clops

# Enough arithmetic per element that compute and copies take comparable time.
WORK = clops.ElementwiseKernel(
    "__global const float *x, __global float *y, int iters",
    "float v = x[i]; for (int k = 0; k < iters; k++) v = v * 0.999f + 0.001f; y[i] = v",
    name="pipeline_work")


def reference(x: np.ndarray, iters: int) -> np.ndarray:
    v = x.astype(np.float32).copy()
    for _ in range(iters):
        v = v * np.float32(0.999) + np.float32(0.001)
    return v


def run_pipeline(host: list[np.ndarray], iters: int, device: Any = None,
                 two_queues: bool = True) -> list[np.ndarray]:
    """Process each chunk of ``host``; with ``two_queues=False`` everything runs on one
    in-order queue (the serial baseline)."""
    dev = clops.device(device)
    copy_q = dev.create_queue() if two_queues else dev.queue
    compute_q = dev.create_queue() if two_queues else dev.queue
    futures = []
    # Upload one chunk ahead: the copy queue sees up(k+1) before down(k).
    pending = clops.from_host_async(host[0], queue=copy_q)
    for k in range(len(host)):
        x = pending
        if k + 1 < len(host):
            pending = clops.from_host_async(host[k + 1], queue=copy_q)
        y = clops.empty(x.shape, device=dev)
        WORK(x, y, np.int32(iters), queue=compute_q)
        futures.append(clops.to_host_future(y, queue=copy_q))
    return [f.result() for f in futures]


def overlap(prof: clops.runtime.Profiler) -> dict[str, float]:
    """Copy time, kernel time, and how much of the copy time ran while a kernel ran (ms)."""
    recs = prof.records
    copies = [(r.start_ns, r.end_ns) for r in recs if r.kind == "copy" and r.end_ns]
    kernels = sorted((r.start_ns, r.end_ns) for r in recs if r.kind == "kernel" and r.end_ns)
    merged: list[list[int]] = []
    for s, e in kernels:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    hidden = 0
    for s, e in copies:
        for ks, ke in merged:
            hidden += max(0, min(e, ke) - max(s, ks))
    copy_ns = sum(e - s for s, e in copies)
    span = [t for r in recs if r.end_ns for t in (r.start_ns, r.end_ns)]
    return {"copy_ms": copy_ns / 1e6, "kernel_ms": sum(e - s for s, e in merged) / 1e6,
            "hidden_ms": hidden / 1e6, "hidden_fraction": hidden / copy_ns if copy_ns else 0.0,
            "wall_ms": (max(span) - min(span)) / 1e6 if span else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default=None)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--chunk-mb", type=float, default=4.0)
    ap.add_argument("--iters", type=int, default=16)
    ap.add_argument("--trace", default=None)
    args = ap.parse_args(argv)
    n = int(args.chunk_mb * (1 << 20)) // 4
    rng = np.random.default_rng(0)
    host = [rng.random(n, dtype=np.float32) for _ in range(args.chunks)]
    run_pipeline(host[:2], args.iters, args.device)  # build and warm up
    with clops.profile() as prof:
        out = run_pipeline(host, args.iters, args.device)
    ok = all(np.allclose(o, reference(h, args.iters), rtol=1e-5, atol=1e-6)
             for o, h in zip(out, host))
    st = overlap(prof)
    if args.trace:
        prof.to_chrome_trace(args.trace)
    print(f"{args.chunks} chunks x {args.chunk_mb} MB: copies {st['copy_ms']:.2f} ms, kernels "
          f"{st['kernel_ms']:.2f} ms, copy time hidden under kernels {st['hidden_ms']:.2f} ms "
          f"({100 * st['hidden_fraction']:.0f}%), wall {st['wall_ms']:.2f} ms; "
          f"{'correct' if ok else 'WRONG'}" + (f"; trace in {args.trace}" if args.trace else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
