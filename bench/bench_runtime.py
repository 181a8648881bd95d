"""Runtime overheads: the host cost of a kernel launch through ``CLDevice.launch`` beside raw
pyopencl enqueues of the same kernel, of replaying a launch plan (kernel by kernel, event-free,
or as one command buffer), and buffer-pool alloc/free beside creating ``cl.Buffer``s,
measured in the same run. Medians; a markdown table on stdout and bench/results/runtime.json.

    python bench/bench_runtime.py [--device SEL] [--quick]
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import pyopencl as cl
from common import (
    arg_parser,
    back_to_back,
    device_info,
    markdown_table,
    median_seconds,
    write_result,
)

import clops

TINY = "__kernel void tiny(__global float *x) { x[get_global_id(0)] += 1.0f; }"
GLOBAL = (64,)
SIZES = [("4 KiB", 4 << 10), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]


def bench_launch(dev: clops.CLDevice, number: int, repeat: int) -> list[dict[str, Any]]:
    prg = dev.build(TINY)
    k_clops, k_raw = cl.Kernel(prg, "tiny"), cl.Kernel(prg, "tiny")
    buf = dev.alloc(4096)
    dev.write(buf, np.zeros(1024, np.float32), blocking=True)
    q = dev.queue
    cq = q.cl_queue
    finish = q.finish
    enqueue = cl.enqueue_nd_range_kernel

    def clops_tracked() -> None:
        dev.launch(k_clops, GLOBAL, None, [buf], writes=[buf])

    def clops_untracked() -> None:
        dev.launch(k_clops, GLOBAL, None, [buf])

    def raw_preset() -> None:
        enqueue(cq, k_raw, GLOBAL, None)

    def raw_call() -> None:
        k_raw(cq, GLOBAL, None, buf.mem)

    k_raw.set_args(buf.mem)

    def time_it(fn: Any, n: int = number) -> float:
        return median_seconds(fn, number=n, repeat=repeat, after=finish)

    t_tracked = time_it(clops_tracked)
    t_untracked = time_it(clops_untracked)
    k_raw.set_args(buf.mem)
    t_preset = time_it(raw_preset)
    t_call = time_it(raw_call)
    k_raw.set_args(buf.mem)
    n_wait = max(10, number // 20)
    t_clops_wait = time_it(lambda: dev.launch(k_clops, GLOBAL, None, [buf], writes=[buf]).wait(),
                           n_wait)
    t_raw_wait = time_it(lambda: enqueue(cq, k_raw, GLOBAL, None).wait(), n_wait)
    finish()
    return [
        _row("enqueue tiny kernel (tracked: reads/writes)", t_tracked,
             "enqueue_nd_range_kernel, args preset", t_preset),
        _row("enqueue tiny kernel (untracked)", t_untracked,
             "enqueue_nd_range_kernel, args preset", t_preset),
        _row("enqueue tiny kernel, setting args", t_tracked,
             "kernel(queue, size, None, buf)", t_call),
        _row("enqueue tiny kernel + wait", t_clops_wait,
             "enqueue_nd_range_kernel + wait", t_raw_wait),
    ]


def bench_plan_replay(dev: clops.CLDevice, repeat: int, launches: int = 100
                      ) -> list[dict[str, Any]]:
    """Host cost of replaying a plan of ``launches`` tiny kernels (arguments preset, three
    buffers each, as a decode step's kernels have): kernel by kernel through pyopencl, through
    the event-free ctypes path, and as one command buffer where the device records them; on
    the device's queue (profiling-capable, as every clops queue) and on one without
    profiling, to see what profiling costs an enqueue."""
    from clops.runtime import cmdbuf, rawenqueue

    src = ("__kernel void tiny3(__global float *x, __global const float *a, "
           "__global const float *b) { x[get_global_id(0)] += a[0] * b[0]; }")
    prg = dev.build(src)
    bufs = [dev.alloc(4096) for _ in range(3)]
    for b in bufs:
        dev.write(b, np.ones(1024, np.float32), blocking=True)
    kernels = []
    for _ in range(launches):
        k = cl.Kernel(prg, "tiny3")
        k.set_args(*[b.mem for b in bufs])
        kernels.append(k)
    plain = cl.CommandQueue(dev.context, dev.cl_device)
    queues = {"profiling queue": dev.queue.cl_queue, "queue without profiling": plain}
    items = [(k, GLOBAL, None, "tiny3") for k in kernels]
    enqueue = cl.enqueue_nd_range_kernel
    rows: list[dict[str, Any]] = []
    per = {}
    for qname, cq in queues.items():
        def per_kernel(cq: Any = cq) -> None:
            for k in kernels:
                enqueue(cq, k, GLOBAL, None)

        per[qname] = median_seconds(per_kernel, number=20, repeat=repeat, after=cq.finish)
        if rawenqueue.available():
            raw = rawenqueue.prepare(items)
            t = median_seconds(lambda cq=cq, raw=raw: rawenqueue.enqueue(cq, raw), number=20,
                               repeat=repeat, after=cq.finish)
            rows.append(_row(f"replay {launches} launches, event-free ctypes ({qname})", t,
                             f"enqueue_nd_range_kernel x{launches}", per[qname]))
        if cmdbuf.support(cq)[0]:
            rec = cmdbuf.CommandBuffer(cq, [(k, GLOBAL, None) for k in kernels])
            t = median_seconds(rec.enqueue, number=20, repeat=repeat, after=cq.finish)
            rows.append(_row(f"replay {launches} launches, one command buffer ({qname})", t,
                             f"enqueue_nd_range_kernel x{launches}", per[qname]))
            rec.release()
    # the device's side: a launch's time back to back, with and without an event, per queue
    dev_s = {(qname, ev): _device_s_per_launch(dev, cq, kernels, ev)
              for qname, cq in queues.items() for ev in (True, False)}
    for qname in queues:
        rows.append(_row(f"device time of a launch back to back, no event ({qname})",
                         dev_s[qname, False], "enqueue_nd_range_kernel (an event per launch)",
                         dev_s[qname, True]))
    rows.append(_row(f"replay {launches} launches kernel by kernel, queue without profiling",
                     per["queue without profiling"],
                     f"enqueue_nd_range_kernel x{launches}, profiling queue",
                     per["profiling queue"]))
    plain.finish()
    return rows


def _device_s_per_launch(dev: clops.CLDevice, cq: Any, kernels: list[Any], events: bool
                         ) -> float:
    """Device seconds per launch of ``kernels`` enqueued back to back on ``cq`` (``back_to_back``
    on that queue); with pyopencl's event per launch, or through the event-free path."""
    from clops.runtime import rawenqueue

    if not events and not rawenqueue.available():
        return float("nan")
    raw = rawenqueue.prepare([(k, GLOBAL, None, "") for k in kernels]) if not events else None
    enqueue = cl.enqueue_nd_range_kernel

    def launches() -> None:
        if raw is not None:
            rawenqueue.enqueue(cq, raw)
        else:
            for k in kernels:
                enqueue(cq, k, GLOBAL, None)

    ms, _ = back_to_back(dev, [launches], count=1, queue=cq)
    return ms / 1e3 / len(kernels)


def bench_pool(dev: clops.CLDevice, repeat: int, quick: bool) -> list[dict[str, Any]]:
    ctx = dev.context
    rw = cl.mem_flags.READ_WRITE
    cq = dev.queue.cl_queue
    one = np.zeros(1, np.float32)
    rows = []
    for label, n in SIZES[:2] if quick else SIZES:
        if n > dev.caps.max_alloc:
            continue
        dev.alloc(n)  # put one buffer of this class in the cache: the loop measures reuse

        def pool_alloc_free(n: int = n) -> None:
            dev.alloc(n)  # dropped at once: back to the pool

        def raw_create_release(n: int = n) -> None:
            cl.Buffer(ctx, rw, n).release()

        def pool_touch(n: int = n) -> None:
            b = dev.alloc(n)
            dev.write(b, one, blocking=True)

        def raw_touch(n: int = n) -> None:
            # Some drivers allocate on first use: a one-element write makes the cost show.
            b = cl.Buffer(ctx, rw, n)
            cl.enqueue_copy(cq, b, one, is_blocking=True)
            b.release()

        rows.append(_row(f"alloc + free {label}", median_seconds(pool_alloc_free, repeat=repeat),
                         "cl.Buffer + release", median_seconds(raw_create_release,
                                                               repeat=repeat)))
        rows.append(_row(f"alloc + 4-byte write + free {label}",
                         median_seconds(pool_touch, repeat=repeat),
                         "cl.Buffer + 4-byte write + release",
                         median_seconds(raw_touch, repeat=repeat)))
    return rows


def _row(case: str, clops_s: float, peer: str, peer_s: float) -> dict[str, Any]:
    return {"case": case, "clops_us": clops_s * 1e6, "peer": f"pyopencl {peer}",
            "peer_us": peer_s * 1e6, "clops_over_peer": clops_s / peer_s}


def main(argv: list[str] | None = None) -> int:
    ap = arg_parser(__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--json", default=None, help="where to write (bench/results/runtime.json)")
    args = ap.parse_args(argv)
    dev = clops.device(args.device)
    repeat = 5 if args.quick else 15
    number = 300 if args.quick else 2000
    print(f"device: {dev.selector} ({dev.name}, {dev.platform_version.split('  ')[0]})")
    rows = (bench_launch(dev, number, repeat) + bench_plan_replay(dev, repeat)
            + bench_pool(dev, repeat, args.quick))
    print(markdown_table(
        ["case", "clops µs", "peer", "peer µs", "clops / peer"],
        [[r["case"], r["clops_us"], r["peer"], r["peer_us"], r["clops_over_peer"]]
         for r in rows]))
    path = write_result("runtime", {"device": device_info(dev), "repeat": repeat,
                                  "launches_per_sample": number, "statistic": "median",
                                  "results": rows}, args.json)
    print(f"\nwritten to {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
