"""The fixed host cost of a small array call, beside plain pyopencl doing the least equivalent
work (one launch, and the read where the call reads) on the same device, context and a queue of
the same kind, in the same process, sampled in turns.

Calls, on 1024 float32 (64x64 for ``matmul``):

- ``a + b``: realized; the host time of the call alone (the device is waited for after each
  sample, untimed). Peer: an add kernel enqueued.
- ``a * 2 + b``: the same, one fused kernel. Peer: a kernel computing it.
- ``float(sum(a))``: the reduction and its read to the host. Peer: a launch and a 4-byte
  blocking read.
- ``asnumpy(a[::2])``: a strided copy and its read. Peer: a copy kernel and a 2 KiB blocking
  read.
- ``matmul 64``: ``a @ b`` of 64x64, realized (call alone, as ``a + b``). Peer: a naive
  product kernel enqueued.

Each row: the median of ``--repeat`` samples in microseconds (clops, pyopencl, their
difference), the device waited for after each sample (untimed), the samples of all rows in
turns; the medians of the calling thread's CPU time (``time.thread_time``; Intel's runtime spins
in a blocking read, so there it is close to the wall time); and the median time a call of
``BURST`` calls in a row, the device waited for after each burst: the steady host cost, its code
and data warm (on a CPU device the kernels share its cores with the host meanwhile).
``--profile`` prints cProfile's top functions of the clops calls instead.

    python bench/bench_call_cost.py [--device SEL] [--repeat 2000] [--profile] [--json OUT]
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import clops  # noqa: E402
from bench.common import arg_parser, device_info, write_result  # noqa: E402

N = 1024
M = 64
BURST = 20  # calls in a row of the back-to-back samples

PEER_SOURCE = """
__kernel void add(__global const float *a, __global const float *b, __global float *c) {
    size_t i = get_global_id(0); c[i] = a[i] + b[i];
}
__kernel void axpb(__global const float *a, __global const float *b, __global float *c) {
    size_t i = get_global_id(0); c[i] = a[i] * 2.0f + b[i];
}
__kernel void total(__global const float *a, __global float *out, int n) {
    if (get_global_id(0) == 0) { float s = 0.0f; for (int i = 0; i < n; ++i) s += a[i];
                                 out[0] = s; }
}
__kernel void strided(__global const float *a, __global float *c) {
    size_t i = get_global_id(0); c[i] = a[2 * i];
}
__kernel void matmul(__global const float *a, __global const float *b, __global float *c,
                     int n) {
    size_t i = get_global_id(0), j = get_global_id(1); float s = 0.0f;
    for (int k = 0; k < n; ++k) s += a[i * n + k] * b[k * n + j];
    c[i * n + j] = s;
}
"""


def clops_calls(dev: clops.CLDevice) -> dict[str, Callable[[], object]]:
    a = clops.asarray(np.arange(N, dtype=np.float32) / N, device=dev)
    b = clops.asarray(np.ones(N, np.float32), device=dev)
    ma = clops.asarray(np.ones((M, M), np.float32), device=dev)
    mb = clops.asarray(np.ones((M, M), np.float32), device=dev)
    return {
        "a + b": lambda: (a + b).realize(),
        "a * 2 + b": lambda: (a * 2 + b).realize(),
        "float(sum(a))": lambda: float(clops.sum(a)),
        "asnumpy(a[::2])": lambda: clops.asnumpy(a[::2]),
        "matmul 64": lambda: clops.matmul(ma, mb).realize(),
    }


def peer_calls(dev: clops.CLDevice) -> dict[str, Callable[[], object]]:
    ctx = dev.context
    q = cl.CommandQueue(ctx, dev.cl_device,
                        properties=cl.command_queue_properties.PROFILING_ENABLE)
    prg = cl.Program(ctx, PEER_SOURCE).build()
    mf = cl.mem_flags
    host = np.ones(M * M, np.float32)
    a, b, c = (cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host) for _ in range(3))
    out1 = np.empty(1, np.float32)
    out_half = np.empty(N // 2, np.float32)
    add, axpb, total = cl.Kernel(prg, "add"), cl.Kernel(prg, "axpb"), cl.Kernel(prg, "total")
    strided, matmul = cl.Kernel(prg, "strided"), cl.Kernel(prg, "matmul")
    total.set_scalar_arg_dtypes([None, None, np.int32])
    matmul.set_scalar_arg_dtypes([None, None, None, np.int32])
    enq = cl.enqueue_nd_range_kernel

    def launch(k: cl.Kernel, g: tuple[int, ...], *args: object) -> cl.Event:
        k.set_args(*args)
        return enq(q, k, g, None, None)

    def read_sum() -> float:
        launch(total, (1,), a, c, N)
        cl.enqueue_copy(q, out1, c, is_blocking=True)
        return float(out1[0])

    def read_strided() -> np.ndarray:
        launch(strided, (N // 2,), a, c)
        cl.enqueue_copy(q, out_half, c, is_blocking=True)
        return out_half

    return {
        "a + b": lambda: launch(add, (N,), a, b, c),
        "a * 2 + b": lambda: launch(axpb, (N,), a, b, c),
        "float(sum(a))": read_sum,
        "asnumpy(a[::2])": read_strided,
        "matmul 64": lambda: launch(matmul, (M, M), a, b, c, M),
        "_finish": q.finish,
    }


def measure(dev: clops.CLDevice, repeat: int) -> list[dict[str, object]]:
    ours, theirs = clops_calls(dev), peer_calls(dev)
    finish = theirs.pop("_finish")
    names = list(ours)
    fns = [f for n in names for f in (ours[n], theirs[n])]
    for f in fns:  # builds, caches and the pool warm
        for _ in range(20):
            f()
        dev.synchronize()
        finish()
    times: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    wall, thread = time.perf_counter, time.thread_time
    for _ in range(repeat):
        for f, ts, cs in zip(fns, times, cpu):
            c0, t0 = thread(), wall()
            f()
            t1, c1 = wall(), thread()
            ts.append(t1 - t0)
            cs.append(c1 - c0)
            dev.synchronize()  # (untimed: a realize is asynchronous, its host cost is the call)
            finish()
    # back to back: ``BURST`` calls in a row, the device waited for after them (untimed)
    burst: list[list[float]] = [[] for _ in fns]
    for _ in range(max(repeat // BURST, 5)):
        for f, ts in zip(fns, burst):
            t0 = wall()
            for _ in range(BURST):
                f()
            ts.append((wall() - t0) / BURST)
            dev.synchronize()
            finish()
    rows = []
    for i, n in enumerate(names):
        mine, peer = statistics.median(times[2 * i]), statistics.median(times[2 * i + 1])
        rows.append({"call": n, "clops_us": mine * 1e6, "pyopencl_us": peer * 1e6,
                     "over_us": (mine - peer) * 1e6,
                     "clops_cpu_us": statistics.median(cpu[2 * i]) * 1e6,
                     "pyopencl_cpu_us": statistics.median(cpu[2 * i + 1]) * 1e6,
                     "clops_burst_us": statistics.median(burst[2 * i]) * 1e6,
                     "pyopencl_burst_us": statistics.median(burst[2 * i + 1]) * 1e6})
    return rows


def profile(dev: clops.CLDevice, repeat: int) -> None:
    for name, f in clops_calls(dev).items():
        for _ in range(20):
            f()
        dev.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(repeat):
            f()
        prof.disable()
        dev.synchronize()
        print(f"== {name}: {repeat} calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


def main() -> None:
    p = arg_parser(__doc__)
    p.add_argument("--repeat", type=int, default=2000)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dev = clops.device(args.device) if args.device else clops.device()
    repeat = 200 if args.quick else args.repeat
    if args.profile:
        profile(dev, repeat)
        return
    load = os.getloadavg()
    rows = measure(dev, repeat)
    print(f"{dev.name} ({dev.selector}); load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"medians of {repeat}")
    print(f"| {'call':<16} | clops us | pyopencl us | clops - pyopencl us | clops CPU us | "
          "pyopencl CPU us | clops in a row us | pyopencl in a row us |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['call']:<16} | {r['clops_us']:8.1f} | {r['pyopencl_us']:11.1f} | "
              f"{r['over_us']:19.1f} | {r['clops_cpu_us']:12.1f} | "
              f"{r['pyopencl_cpu_us']:15.1f} | {r['clops_burst_us']:17.1f} | "
              f"{r['pyopencl_burst_us']:20.1f} |")
    if args.json:
        write_result("call_cost", {"device": device_info(dev), "repeat": repeat,
                                   "load": load, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
