"""Benchmark: Dask arrays of clops chunks on a ``clops.dask.LocalCluster`` of 1, 2, ... device
workers (sub-devices of the CPU, or one worker per GPU), beside ``dask.array`` on numpy chunks
(threaded scheduler, the same machine) in the same run. Two workloads on an array larger than
one worker's device memory limit (``CLOPS_MEMORY_LIMIT``): a reduction-heavy pipeline (one
pass: sums, maxima and means of columns of elementwise chains) and a blocked matmul
(``x.T @ x``), each from its random input: numpy's chunks drawn by numpy, clops' on each
worker's device (``clops.random.RandomState``). With ``--devices gpu`` and CuPy installed,
CuPy-on-Dask runs too: a ``distributed`` worker per CUDA GPU, its chunks drawn by CuPy.
Reports seconds (median), the speed-up over one worker, the time Dask's task stream records
as transfers between workers (summed over workers, in the last run) with their number and
bytes, and each worker's peak device memory.

    python bench/bench_dask.py [--workers 1,2,4] [--devices cpu|gpu] [--rows 2000000]
        [--memory-limit 256MB] [--cupy auto|yes|no]

A worker count the host cannot give (4 sub-devices of a 2-core CPU, 4 GPUs on a host with 2)
is reported as skipped.
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


def cluster_for(n: int, devices: str | None) -> dict:
    """``LocalCluster`` arguments for n device workers: the first n GPUs (``--devices gpu``,
    or a selector list), or the CPU split into n sub-devices."""
    import clops.dask

    if devices in (None, "cpu"):  # the CPU (None: the default device, a GPU where there is one)
        return {"devices": devices, "split": n} if n > 1 else {"devices": devices}
    sels = clops.dask.device_selectors(devices)
    if len(sels) < n:
        raise ValueError(f"{devices!r} lists {len(sels)} devices, not {n}")
    return {"devices": sels[:n]}


def cupy_cluster(n: int):
    """A ``dask.distributed`` cluster of n workers, one per CUDA GPU (``CUDA_VISIBLE_DEVICES``),
    one thread each as clops' workers have: CuPy-on-Dask, the peer on NVIDIA GPUs."""
    import cupy
    from distributed import Nanny, Scheduler, SpecCluster

    have = cupy.cuda.runtime.getDeviceCount()
    if have < n:
        raise ValueError(f"CUDA lists {have} GPUs, not {n}")
    workers = {f"cupy-{i}": {"cls": Nanny, "options": {
        "nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": str(i)}, "dashboard_address": None,
        "silence_logs": 40}} for i in range(n)}
    return SpecCluster(workers=workers, silence_logs=40, scheduler={
        "cls": Scheduler, "options": {"dashboard_address": None}})


def device_chunks(engine: str, shape: tuple[int, int], chunks: tuple[int, int]):
    """The random input drawn on each worker's device: clops' ``RandomState`` or CuPy's."""
    if engine == "clops":
        import clops

        return da.random.RandomState(0, RandomState=clops.random.RandomState).standard_normal(
            shape, chunks=chunks)
    import cupy

    return da.random.RandomState(0, RandomState=cupy.random.RandomState).standard_normal(
        shape, chunks=chunks, dtype=np.float32)


def _peak(engine: str):
    if engine == "clops":
        import clops

        return clops.memory_stats()["peak"]
    import cupy  # (no peak is kept: the pool's bytes now)

    return cupy.get_default_memory_pool().total_bytes()


def _name(engine: str) -> str:
    if engine == "clops":
        import clops

        return clops.device().name
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()


def _measure(client, engine: str, name: str, fn, n: int, shape, chunks,
             base: dict[str, float]) -> dict:
    from distributed import get_task_stream

    def run() -> None:
        outs = fn(device_chunks(engine, shape, chunks))
        outs = list(outs) if name == "pipeline" else [outs]
        [f.result() for f in client.compute(outs)]

    s = timed(run)
    with get_task_stream(client) as stream:
        run()
    moves = [(ss["stop"] - ss["start"], t.get("nbytes", 0)) for t in stream.data
             for ss in t.get("startstops", ()) if ss["action"] == "transfer"]
    base.setdefault(name, s)
    label = ("clops chunks, clops.dask.LocalCluster" if engine == "clops"
             else "CuPy chunks, a worker per CUDA GPU")
    return {"workload": name, "engine": label, "workers": n, "s": s,
            "speedup_vs_1": base[name] / s, "transfer_s": sum(m[0] for m in moves),
            "transfers": len(moves), "transfer_bytes": sum(m[1] for m in moves),
            "peak_bytes": client.run(_peak, engine), "device": client.run(_name, engine)}


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
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--devices", default=None, help="cpu (sub-devices) or gpu (one per GPU)")
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--chunk-rows", type=int, default=62_500)
    ap.add_argument("--memory-limit", default="256MB",
                    help="CLOPS_MEMORY_LIMIT of each worker (below the array's size)")
    ap.add_argument("--cupy", default="auto", choices=("auto", "yes", "no"),
                    help="CuPy-on-Dask beside clops (auto: with --devices gpu)")
    ap.add_argument("--json", default="bench/results/dask.json")
    a = ap.parse_args(argv)
    import dask
    from dask.utils import parse_bytes
    from distributed import Client

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
    skipped: list[dict] = []
    env = {"CLOPS_MEMORY_LIMIT": a.memory_limit} if a.memory_limit else {}
    if a.memory_limit and parse_bytes(a.memory_limit) >= nbytes:
        print(f"note: the array ({nbytes} bytes) fits in one worker's limit "
              f"({a.memory_limit}); raise --rows or lower --memory-limit", flush=True)
    counts = [int(v) for v in a.workers.split(",")]
    for engine in ("clops", "cupy"):
        base: dict[str, float] = {}
        for n in counts:
            try:
                if engine == "clops":
                    kw = cluster_for(n, a.devices)
                    clops.dask.worker_specs(**kw)  # (a count this host cannot give: skipped)
                    cm = clops.dask.LocalCluster(env=env, **kw)
                else:
                    if a.cupy == "no" or (a.cupy == "auto" and a.devices != "gpu"):
                        break
                    cm = cupy_cluster(n)
            except (ValueError, LookupError, ImportError) as e:
                print(f"skipping {engine} at {n} workers: {e}", flush=True)
                skipped.append({"engine": engine, "workers": n, "why": str(e)})
                continue
            with cm as cluster, Client(cluster) as client:
                got = len(client.scheduler_info()["workers"])
                if got != n:
                    print(f"skipping {engine} at {n} workers: the cluster has {got}")
                    continue
                for name, fn in (("pipeline", pipeline), ("matmul", blocked_matmul)):
                    rows.append(_measure(client, engine, name, fn, n, shape, chunks, base))
                    print(rows[-1], flush=True)
    print(f"array {shape} float32 ({nbytes / 1e9:.2f} GB), chunks {chunks}, "
          f"CLOPS_MEMORY_LIMIT {a.memory_limit or 'none'} per worker")
    print(f"{'workload':<10} {'engine':<42} {'workers':>7} {'s':>8} {'x 1 worker':>10} "
          f"{'transfers s':>12} {'(n, bytes)':>14} {'peak MB/worker':>15}")
    for r in rows:
        sp = f"{r['speedup_vs_1']:.2f}x" if "speedup_vs_1" in r else ""
        mv = f"{r['transfer_s']:.2f}" if "transfer_s" in r else ""
        mn = f"{r['transfers']}, {r['transfer_bytes']}" if "transfers" in r else ""
        pk = f"{max(r['peak_bytes'].values()) / 1e6:.0f}" if "peak_bytes" in r else ""
        print(f"{r['workload']:<10} {r['engine']:<42} {r['workers']:>7} {r['s']:>8.2f} "
              f"{sp:>10} {mv:>12} {mn:>14} {pk:>15}")
    for sk in skipped:
        print(f"skipped {sk['engine']} at {sk['workers']} workers: {sk['why']}")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"bench": "dask", "shape": shape, "chunks": chunks, "bytes": nbytes,
                   "memory_limit": a.memory_limit, "rows": rows, "skipped": skipped}, f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
