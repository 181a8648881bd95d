"""Copy/compute overlap: the two-queue pipeline of examples/two_queue_pipeline.py against the
same work on one in-order queue, with pinned staging memory and without. Prints the copy time,
how much of it ran while kernels ran (hidden), and the wall time of each variant; writes JSON.

    python bench/bench_overlap.py [--device SEL] [--chunks 16] [--chunk-mb 32] [--iters 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

import clops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from two_queue_pipeline import WORK, overlap  # noqa: E402


def pipeline(dev: Any, host: list[np.ndarray], iters: int, two_queues: bool, pinned: bool,
             queues: tuple[Any, Any]) -> list[np.ndarray]:
    copy_q, compute_q = queues if two_queues else (dev.queue, dev.queue)
    futures = []
    pending = clops.from_host_async(host[0], queue=copy_q, pinned=pinned)
    for k in range(len(host)):
        x = pending
        if k + 1 < len(host):
            pending = clops.from_host_async(host[k + 1], queue=copy_q, pinned=pinned)
        y = clops.empty(x.shape, device=dev)
        WORK(x, y, np.int32(iters), queue=compute_q)
        futures.append(clops.to_host_future(y, queue=copy_q, pinned=pinned))
    return [f.result() for f in futures]


def measure(dev: Any, host: list[np.ndarray], iters: int, two_queues: bool, pinned: bool,
            queues: tuple[Any, Any], repeat: int) -> dict[str, float]:
    pipeline(dev, host, iters, two_queues, pinned, queues)  # warm up (builds, staging blocks)
    walls, stats = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        with clops.profile() as prof:
            pipeline(dev, host, iters, two_queues, pinned, queues)
        walls.append(time.perf_counter() - t0)
        stats.append(overlap(prof))
    best = int(np.argmin(walls))
    out = dict(stats[best])
    out["host_wall_ms"] = walls[best] * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default=None)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--chunk-mb", type=float, default=32.0)
    ap.add_argument("--iters", type=int, default=64,
                    help="arithmetic per element (sets the compute/copy ratio)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="bench/results/overlap.json")
    args = ap.parse_args(argv)
    dev = clops.device(args.device)
    n = int(args.chunk_mb * (1 << 20)) // 4
    rng = np.random.default_rng(0)
    host = [rng.random(n, dtype=np.float32) for _ in range(args.chunks)]
    queues = (dev.create_queue(), dev.create_queue())
    rows = {}
    for label, two, pinned in (("one queue, pageable", False, False),
                               ("one queue, pinned", False, True),
                               ("two queues, pageable", True, False),
                               ("two queues, pinned", True, True)):
        rows[label] = measure(dev, host, args.iters, two, pinned, queues, args.repeat)
    total_mb = 2 * args.chunks * args.chunk_mb
    print(f"device: {dev}  ({args.chunks} chunks x {args.chunk_mb} MB up and down = "
          f"{total_mb:.0f} MB copied, {args.iters} iterations per element)")
    print(f"{'variant':<22} {'copy ms':>9} {'kernel ms':>10} {'hidden ms':>10} {'hidden':>7} "
          f"{'device wall ms':>15} {'host wall ms':>13} {'copy GB/s':>10}")
    for label, r in rows.items():
        gbs = total_mb / 1024 / (r["copy_ms"] / 1e3) if r["copy_ms"] else 0.0
        print(f"{label:<22} {r['copy_ms']:>9.2f} {r['kernel_ms']:>10.2f} {r['hidden_ms']:>10.2f} "
              f"{100 * r['hidden_fraction']:>6.0f}% {r['wall_ms']:>15.2f} "
              f"{r['host_wall_ms']:>13.2f} {gbs:>10.2f}")
    base, best = rows["one queue, pinned"], rows["two queues, pinned"]
    print(f"two queues + pinned hide {best['hidden_ms']:.2f} ms of {best['copy_ms']:.2f} ms copy "
          f"time; wall {base['wall_ms']:.2f} -> {best['wall_ms']:.2f} ms")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"device": str(dev), "chunks": args.chunks, "chunk_mb": args.chunk_mb,
                       "iters": args.iters, "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
