"""Generated kernels against their peers, same device, same run: the fused chain
``a*b + c*d - e*0.5``, ``sum`` and row softmax, each beside numpy, a hand-written pyopencl
kernel (the chain) and the device's copy bandwidth (the ceiling).

    python bench/bench_compiler.py [--device SEL] [--n 16777216] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import pyopencl as cl

import clops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    device_ms,
    interleaved_medians,
    same_size_copy_ms,
    torch_cuda,
    torch_ms,
)

HAND_CHAIN = """
__kernel void chain(__global const float *a, __global const float *b, __global const float *c,
                    __global const float *d, __global const float *e, __global float *out) {
    size_t i = get_global_id(0);
    out[i] = a[i] * b[i] + c[i] * d[i] - e[i] * 0.5f;
}
"""
COPY = """
__kernel void copy(__global const float4 *src, __global float4 *dst) {
    size_t i = get_global_id(0);
    dst[i] = src[i];
}
"""


def median_seconds(fn: Callable[[], object], repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paired_ratio(num: list[float], den: list[float]) -> float:
    """Median over rounds of num[i] / den[i]: two contenders timed back to back see the same
    machine, so the ratio of each round's pair drifts far less than either time."""
    return statistics.median(a / b for a, b in zip(num, den))


def _kernels(n: int) -> str:
    return f"{n} kernel" + ("" if n == 1 else "s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default=None)
    p.add_argument("--n", type=int, default=1 << 24)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", default="bench/results/compiler.json")
    args = p.parse_args(argv)
    dev = clops.device(args.device)
    q = dev.queue.cl_queue
    n = args.n
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(n, dtype=np.float32) for _ in range(5)]
    a, b, c, d, e = (clops.asarray(x, device=dev) for x in host)
    clops.synchronize()
    rows = []

    def dev_time(row: dict, fn: Callable[[], object], nbytes: int,
                 torch_peer: float | None) -> None:
        """Device time of the clops kernels alone (profiled), beside PyTorch's on the GPU."""
        dms, _ = device_ms(dev, fn, args.repeat)
        row.update(device_ms=dms, device_GBps=nbytes / dms / 1e6,
                   device_of_copy_bw=nbytes / dms / 1e6 / copy_dev_bw,
                   device_of_same_size_copy=same_size_copy_ms(dev, nbytes, args.repeat) / dms)
        if torch_peer is not None:
            row.update(torch_ms=torch_peer, device_vs_torch=torch_peer / dms)

    def add(name: str, nbytes: int, t: float, peer: str, tpeer: float, ceiling: float) -> None:
        gbs = nbytes / t / 1e9
        rows.append({"bench": name, "ms": t * 1e3, "GB/s": gbs, "peer": peer,
                     "peer_ms": tpeer * 1e3, "speedup_vs_peer": tpeer / t,
                     "fraction_of_copy_bw": gbs / ceiling})

    # Device ceiling: a float4 copy kernel.
    src = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, n * 4)
    dst = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, n * 4)
    copy_k = cl.Program(dev.context, COPY).build().copy

    def copy_run() -> None:
        copy_k(q, (n // 4,), None, src, dst)
        q.finish()

    t_copy = median_seconds(copy_run, args.repeat)
    copy_bw = 2 * n * 4 / t_copy / 1e9
    # the same on device time (kernel start to end, no host round trip), over 4x the bytes
    big = 4 * n * 4
    bsrc, bdst = dev.alloc(big), dev.alloc(big)
    dev.write(bsrc, np.ones(big // 4, np.float32), blocking=True)
    copy_dk = dev.kernel(COPY, "copy")
    cms, _ = device_ms(dev, lambda: dev.launch(copy_dk, (big // 16,), None, [bsrc, bdst],
                                               reads=[bsrc], writes=[bdst]), args.repeat)
    copy_dev_bw = 2 * big / cms / 1e6
    torch = torch_cuda() if dev.kind != "cpu" else None
    tt: dict = {}
    if torch is not None:
        ta, tb, tc, td, te = (torch.from_numpy(x).cuda() for x in host)
        tt["chain"] = torch_ms(torch, lambda: ta * tb + tc * td - te * 0.5, args.repeat)
        tt["sum"] = torch_ms(torch, lambda: ta.sum(), args.repeat)

    # 1. fused chain: clops vs numpy vs a hand-written kernel
    def clops_chain() -> None:
        (a * b + c * d - e * 0.5).realize()
        dev.queue.finish()

    hand = cl.Program(dev.context, HAND_CHAIN).build().chain
    out = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, n * 4)
    bufs = [x.buffer.mem for x in (a, b, c, d, e)]

    def hand_chain() -> None:
        hand(q, (n,), None, *bufs, out)
        q.finish()

    ha, hb, hc, hd, he = host

    def numpy_chain() -> None:
        ha * hb + hc * hd - he * np.float32(0.5)

    got = np.asarray(a * b + c * d - e * 0.5)
    assert np.allclose(got, ha * hb + hc * hd - he * np.float32(0.5), atol=1e-5)
    chain_samples: list[list[float]] = []
    t_clops, t_hand, t_np = interleaved_medians([clops_chain, hand_chain, numpy_chain],
                                                args.repeat, samples=chain_samples)
    add("chain a*b+c*d-e*0.5 (clops)", 6 * n * 4, t_clops, "numpy", t_np, copy_bw)
    rows[-1]["vs_hand_kernel"] = paired_ratio(chain_samples[1], chain_samples[0])
    rows[-1]["vs_numpy_paired"] = paired_ratio(chain_samples[2], chain_samples[0])
    dev_time(rows[-1], lambda: (a * b + c * d - e * 0.5).realize(), 6 * n * 4, tt.get("chain"))
    add("chain (hand pyopencl kernel)", 6 * n * 4, t_hand, "numpy", t_np, copy_bw)

    # 2. sum of n floats
    def clops_sum() -> None:
        a.sum().realize()
        dev.queue.finish()

    # float32 sums in chunks: within 1e-5 of the float64 sum of magnitudes (tens of ulps)
    ref_sum = ha.astype(np.float64)
    assert abs(float(a.sum()) - ref_sum.sum()) < 1e-5 * np.abs(ref_sum).sum()
    t_sum, t_np_sum = interleaved_medians([clops_sum, lambda: ha.sum()], args.repeat)
    add("sum (clops)", n * 4, t_sum, "numpy", t_np_sum, copy_bw)
    dev_time(rows[-1], lambda: a.sum().realize(), n * 4, tt.get("sum"))
    if dev.kind != "cpu":
        # PERF: 2^24 floats are 64 MB, about 25 us on an H100, where the fixed cost of a launch
        # and of the second stage weighs; the same sum over the copy ceiling's 4n floats
        # shows the bandwidth the reduction itself reaches.
        big_h = np.ones(4 * n, np.float32)
        big_a = clops.asarray(big_h, device=dev)
        assert float(big_a.sum()) == 4 * n

        def clops_big_sum() -> None:
            big_a.sum().realize()
            dev.queue.finish()

        t_bsum, t_np_bsum = interleaved_medians([clops_big_sum, lambda: big_h.sum()],
                                                args.repeat)
        add(f"sum of {4 * n} (clops)", 4 * n * 4, t_bsum, "numpy", t_np_bsum, copy_bw)
        tbig = None
        if torch is not None:
            tb = torch.ones(4 * n, device="cuda")
            tbig = torch_ms(torch, lambda: tb.sum(), args.repeat)
        dev_time(rows[-1], lambda: big_a.sum().realize(), 4 * n * 4, tbig)
        del big_a

    # 3. row softmax
    r = args.rows
    xs = rng.standard_normal((r, r), dtype=np.float32)
    x = clops.asarray(xs, device=dev)

    def softmax(t: clops.Tensor) -> clops.Tensor:
        ex = clops.exp(t - clops.max(t, axis=-1, keepdims=True))
        return ex / clops.sum(ex, axis=-1, keepdims=True)

    def np_softmax() -> None:
        ex = np.exp(xs - xs.max(-1, keepdims=True))
        ex / ex.sum(-1, keepdims=True)

    def clops_softmax() -> None:
        softmax(x).realize()
        dev.queue.finish()

    with clops.profile() as prof:
        ref = np.asarray(softmax(x))
    ex = np.exp(xs - xs.max(-1, keepdims=True))
    assert np.allclose(ref, ex / ex.sum(-1, keepdims=True), atol=1e-6)
    t_sm, t_np_sm = interleaved_medians([clops_softmax, np_softmax], max(3, args.repeat // 4))
    add(f"softmax {r}x{r} (clops, {_kernels(prof.kernel_count)})", 2 * r * r * 4, t_sm, "numpy",
        t_np_sm, copy_bw)
    if torch is not None:
        tx = torch.from_numpy(xs).cuda()
        tt["softmax"] = torch_ms(torch, lambda: torch.softmax(tx, -1), args.repeat)
    dev_time(rows[-1], lambda: softmax(x).realize(), 2 * r * r * 4, tt.get("softmax"))

    # 4. column sums (a reduction over the leading axis)
    def clops_colsum() -> None:
        clops.sum(x, axis=0).realize()
        dev.queue.finish()

    with clops.profile() as prof:
        got = np.asarray(clops.sum(x, axis=0))
    assert np.allclose(got, xs.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)
    t_cs, t_np_cs = interleaved_medians([clops_colsum, lambda: xs.sum(0)],
                                        max(3, args.repeat // 4))
    add(f"sum axis 0 {r}x{r} (clops, {_kernels(prof.kernel_count)})", r * r * 4, t_cs, "numpy",
        t_np_cs, copy_bw)
    if torch is not None:
        tt["colsum"] = torch_ms(torch, lambda: tx.sum(0), args.repeat)
    dev_time(rows[-1], lambda: clops.sum(x, axis=0).realize(), r * r * 4, tt.get("colsum"))

    print(f"device: {dev.name} ({dev.platform_version}); copy ceiling {copy_bw:.1f} GB/s "
          f"(median of {args.repeat})")
    print(f"| {'benchmark':<36} | {'ms':>8} | {'GB/s':>7} | {'peer':>6} | {'peer ms':>8} "
          f"| {'x peer':>6} | {'of copy bw':>10} |")
    print("|" + "|".join("-" * w for w in (38, 10, 9, 8, 10, 8, 12)) + "|")
    for row in rows:
        print(f"| {row['bench']:<36} | {row['ms']:>8.2f} | {row['GB/s']:>7.1f} | "
              f"{row['peer']:>6} | {row['peer_ms']:>8.2f} | {row['speedup_vs_peer']:>6.2f} | "
              f"{row['fraction_of_copy_bw']:>10.2f} |")
    print(f"chain vs hand kernel: {rows[0]['vs_hand_kernel']:.2f}x")
    print(f"device time (profiled kernels), copy ceiling {copy_dev_bw:.0f} GB/s:")
    for row in rows:
        if "device_ms" in row:
            peer = (f", PyTorch {row['torch_ms']:.3f} ms ({row['device_vs_torch']:.2f}x)"
                    if "torch_ms" in row else "")
            print(f"  {row['bench']:<36} {row['device_ms']:.3f} ms, {row['device_GBps']:.0f} GB/s,"
                  f" {row['device_of_copy_bw']:.2f} of copy{peer}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"device": dev.name, "platform": dev.platform_version, "copy_GBps": copy_bw,
                   "copy_device_GBps": copy_dev_bw,
                   "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
