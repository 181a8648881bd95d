"""Benchmark: Dask arrays of clops chunks on a ``clops.dask.LocalCluster`` of 1, 2, ... device
workers (sub-devices of the CPU, or one worker per GPU), beside ``dask.array`` on numpy chunks
(threaded scheduler, the same machine) in the same run. Two workloads on an array larger than
one worker's device memory limit (``CLOPS_MEMORY_LIMIT``): a reduction-heavy pipeline (one
pass: sums, maxima and means of columns of elementwise chains) and a blocked matmul
(``x.T @ x``).
Reports seconds (median), the speed-up over one worker, and the time Dask's task stream
records as transfers between workers (summed over workers, in the last run).

    python bench/bench_dask.py [--workers 1,2] [--devices cpu|gpu] [--rows 2000000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import dask.array as da
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def pipeline(x):
    # one pass over the chunks (so that a worker holds only the chunks in flight)
    y = abs(da.sin(x) * x + 1.0)
    return y.sum(axis=0), y.max(axis=0), (x * x).mean(axis=0)


def blocked_matmul(x):
    return x.T @ x


def timed(fn, repeat: int = 3) -> float:
    fn()  # warm: kernels built, workers started
    return statistics.median(_once(fn) for _ in range(repeat))


def _once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--devices", default=None, help="cpu (sub-devices) or gpu (one per GPU)")
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--chunk-rows", type=int, default=125_000)
    ap.add_argument("--memory-limit", default="",
                    help="CLOPS_MEMORY_LIMIT of each worker (none by default)")
    ap.add_argument("--json", default="bench/results/dask.json")
    a = ap.parse_args(argv)
    import dask
    from distributed import Client, get_task_stream

    import clops
    import clops.dask

    shape, chunks = (a.rows, a.cols), (a.chunk_rows, a.cols)
    nbytes = a.rows * a.cols * 4
    rows = []

    def numpy_chunks():
        return da.random.default_rng(0).standard_normal(shape, chunks=chunks,
                                                        dtype=np.float32)

    with dask.config.set(scheduler="threads"):
        for name, fn in (("pipeline", pipeline), ("matmul", blocked_matmul)):
            s = timed(lambda fn=fn: dask.compute(fn(numpy_chunks())))
            rows.append({"workload": name, "engine": "dask.array, numpy chunks (threads)",
                         "workers": os.cpu_count(), "s": s})
            print(rows[-1], flush=True)
    base: dict[str, float] = {}
    for n in [int(v) for v in a.workers.split(",")]:
        kw = {"split": n} if a.devices in (None, "cpu") and n > 1 else {}
        devices = a.devices if a.devices not in (None, "cpu") else None
        env = {"CLOPS_MEMORY_LIMIT": a.memory_limit} if a.memory_limit else {}
        with clops.dask.LocalCluster(devices=devices, env=env, **kw) as cluster, \
                Client(cluster) as client:
            if len(client.scheduler_info()["workers"]) != n:
                print(f"skipping {n} workers: the cluster has "
                      f"{len(client.scheduler_info()['workers'])}")
                continue

            def tensor_chunks():
                return numpy_chunks().map_blocks(lambda b: clops.asarray(b),
                                                 meta=clops.empty((0, 0)))

            for name, fn in (("pipeline", pipeline), ("matmul", blocked_matmul)):
                def run(fn=fn, name=name) -> None:
                    outs = fn(tensor_chunks())
                    outs = list(outs) if name == "pipeline" else [outs]
                    [f.result() for f in client.compute(outs)]

                s = timed(run)
                with get_task_stream(client) as stream:
                    run()
                move = sum(ss["stop"] - ss["start"] for t in stream.data
                           for ss in t.get("startstops", ()) if ss["action"] == "transfer")
                base.setdefault(name, s)
                rows.append({"workload": name, "engine": "clops chunks, clops.dask.LocalCluster",
                             "workers": n, "s": s, "speedup_vs_1": base[name] / s,
                             "transfer_s": move,
                             "device": client.run(lambda: clops.device().name)})
                print(rows[-1], flush=True)
    print(f"array {shape} float32 ({nbytes / 1e9:.2f} GB), chunks {chunks}, "
          f"CLOPS_MEMORY_LIMIT {a.memory_limit or 'none'} per worker")
    print(f"{'workload':<10} {'engine':<42} {'workers':>7} {'s':>8} {'x 1 worker':>10} "
          f"{'transfers s':>18}")
    for r in rows:
        sp = f"{r['speedup_vs_1']:.2f}x" if "speedup_vs_1" in r else ""
        mv = f"{r['transfer_s']:.2f}" if "transfer_s" in r else ""
        print(f"{r['workload']:<10} {r['engine']:<42} {r['workers']:>7} {r['s']:>8.2f} "
              f"{sp:>10} {mv:>18}")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"bench": "dask", "shape": shape, "chunks": chunks, "bytes": nbytes,
                   "memory_limit": a.memory_limit, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
