"""Benchmark: what a step of a model split over two devices of one OpenCL context pays to move
from one device to the other, by way of handing over.

A step here is ``--launches`` memory-bound kernels on the first device, a hand-over, as many on
the second, and a hand-over back (the next step's first kernel waits for the last one), with
the host enqueueing each step before it waits for the one before (as ``Model.generate_ids``
does). Each way of handing over is timed against the same launches all on one device:

- ``solo``: every launch on the first device in a context of its own (no hand-over, and no
  second device in the context).
- ``one``: every launch on the first device of the two-device context.
- ``barrier``: the second queue waits on a marker of the first (``enqueue_barrier``), then
  copies the rows (``--rows-bytes``) device to device; the first queue waits on the second
  the same way at the next step (``placement.Chain``).
- ``shared``: as ``barrier``, with one small buffer (the positions and token ids) that every
  kernel on both devices reads and the last kernel of a step writes: the driver must make the
  second device's write visible to the first, however it does so.
- ``own``: as ``shared``, but each device reads its own copy of that buffer, brought over by
  an explicit device-to-device copy after each hand-over.
- ``relay``: as ``own``, but each queue waits on a user event that a host thread completes
  once the other device's marker has (the driver's cross-device wait left out).

    python bench/bench_handoff.py --device gpu:0,gpu:1 --json bench/results/handoff.json

On two H200s none of these cost a step more than a few tenths of a millisecond, though a model
split over the two GPUs of one context ran twice as slow as in two contexts: this bench's own
launches (pyopencl's, about 32 us each) hide what the driver adds to each. ``profile_step.py
--device gpu:0,gpu:1`` with and without ``--one-context`` measures that on a model.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import threading
import time

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import clops  # noqa: E402
from bench.common import write_json  # noqa: E402

SRC = """
__kernel void work(__global const float4* a, __global float4* b, __global const int* st,
                   int last, __global int* st_out) {
    size_t i = get_global_id(0);
    b[i] = a[i] * 1.0001f + (float)st[0];
    if (last && i == 0) st_out[0] = st[0] + 1;
}
"""


class Side:
    """One device's queue, its work buffers and its copy of the small state buffer."""

    def __init__(self, dev, n: int, rows_bytes: int) -> None:
        self.dev = dev
        self.q = dev.queue.cl_queue
        ctx = dev.context
        mf = cl.mem_flags
        self.a = cl.Buffer(ctx, mf.READ_WRITE, n * 16)
        self.b = cl.Buffer(ctx, mf.READ_WRITE, n * 16)
        self.x = cl.Buffer(ctx, mf.READ_WRITE, max(rows_bytes, 16))
        self.st = cl.Buffer(ctx, mf.READ_WRITE, 4096)
        prog = cl.Program(ctx, SRC).build(devices=[dev.cl_device])
        self.k = cl.Kernel(prog, "work")
        cl.enqueue_fill_buffer(self.q, self.a, np.float32(1), 0, n * 16)
        cl.enqueue_fill_buffer(self.q, self.st, np.int32(0), 0, 4096)
        self.q.finish()

    def launches(self, count: int, n: int, st: cl.Buffer, write_last: bool) -> None:
        for j in range(count):
            last = int(write_last and j == count - 1)
            self.k.set_args(self.a if j % 2 == 0 else self.b, self.b if j % 2 == 0 else self.a,
                            st, np.int32(last), st)
            cl.enqueue_nd_range_kernel(self.q, self.k, (n,), (256,))


class Relay:
    """A host thread that completes a user event once an event of the other device has."""

    def __init__(self, ctx: cl.Context) -> None:
        self.ctx = ctx
        self.todo: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            ev, user = self.todo.get()
            ev.wait()
            user.set_status(cl.command_execution_status.COMPLETE)

    def after(self, ev: cl.Event) -> cl.UserEvent:
        user = cl.UserEvent(self.ctx)
        self.todo.put((ev, user))
        return user


def run(way: str, s0: Side, s1: Side, steps: int, count: int, n: int,
        rows: int) -> tuple[float, float]:
    """Seconds a step and the host's seconds of enqueueing a step, medians over 3 runs of
    ``steps`` steps after 3 warm-up steps."""
    token = np.empty(1, np.int32)
    times, enq = [], []
    relay = Relay(s0.dev.context) if way == "relay" else None
    for todo in (3, steps, steps, steps):  # (the first run warms up)
        before = None
        t0 = time.perf_counter()
        spent = 0.0
        for _s in range(todo):
            t1 = time.perf_counter()
            if way in ("one", "solo"):
                s0.launches(2 * count, n, s0.st, True)
                ev = cl.enqueue_copy(s0.q, token, s0.st, is_blocking=False)
            else:
                # the first device waits for the second's step before (the token it chose)
                done1 = cl.enqueue_marker(s1.q)
                s1.q.flush()
                cl.enqueue_barrier(s0.q, wait_for=[relay.after(done1) if relay else done1])
                st0 = s1.st if way == "shared" else s0.st
                if way in ("own", "relay"):
                    cl.enqueue_copy(s0.q, s0.st, s1.st, byte_count=16)
                s0.launches(count, n, st0, False)
                done0 = cl.enqueue_marker(s0.q)
                s0.q.flush()
                cl.enqueue_barrier(s1.q, wait_for=[relay.after(done0) if relay else done0])
                cl.enqueue_copy(s1.q, s1.x, s0.x, byte_count=rows)
                s1.launches(count, n, s1.st, True)
                ev = cl.enqueue_copy(s1.q, token, s1.st, is_blocking=False)
                s1.q.flush()
            spent += time.perf_counter() - t1
            if before is not None:
                before.wait()
            before = ev
        before.wait()
        times.append((time.perf_counter() - t0) / todo)
        enq.append(spent / todo)
    s0.q.finish()
    s1.q.finish()
    return statistics.median(times[1:]), statistics.median(enq[1:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="gpu:0,gpu:1",
                    help="two devices of one platform, or DEVICE:halves (two sub-devices)")
    ap.add_argument("--launches", type=int, default=200, help="kernels a device a step")
    ap.add_argument("--floats", type=int, default=1 << 22,
                    help="float4s each kernel reads and writes (default: %(default)s)")
    ap.add_argument("--rows-bytes", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", default="bench/results/handoff.json")
    args = ap.parse_args(argv)
    devs = (clops.device(args.device[:-len(":halves")]).create_sub_devices(2)
            if args.device.endswith(":halves") else clops.context(args.device))
    if len(devs) != 2:
        raise SystemExit("--device names two devices of one platform")
    alone = devs[0].parent if args.device.endswith(":halves") else \
        clops.device(args.device.split(",")[0])
    s0, s1, solo = (Side(d, args.floats, args.rows_bytes) for d in (*devs, alone))
    out: dict = {"devices": [d.name for d in devs], "launches": args.launches,
                 "floats4": args.floats, "rows_bytes": args.rows_bytes, "ms_a_step": {},
                 "enqueue_ms_a_step": {}}
    for rnd in range(2):
        for way in ("solo", "one", "barrier", "shared", "own", "relay"):
            first = solo if way == "solo" else s0
            ms, enq = (v * 1e3 for v in run(way, first, s1, args.steps, args.launches,
                                             args.floats, args.rows_bytes))
            out["ms_a_step"].setdefault(way, []).append(ms)
            out["enqueue_ms_a_step"].setdefault(way, []).append(enq)
            print(f"round {rnd} {way:8s} {ms:8.3f} ms a step, enqueued in {enq:8.3f}", flush=True)
    base = statistics.median(out["ms_a_step"]["solo"])
    for way, v in out["ms_a_step"].items():
        m = statistics.median(v)
        e = statistics.median(out["enqueue_ms_a_step"][way])
        print(f"{way:8s} median {m:8.3f} ms a step ({m - base:+7.3f} against solo), "
              f"enqueued in {e:8.3f} ms", flush=True)
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
