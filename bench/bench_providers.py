"""Benchmark: vendor-library providers against clops' own kernels, same device, same run: GEMM
(float32) by CLBlast beside ``clops.matmul`` with providers off, and complex FFTs by VkFFT beside
clops' Stockham kernels; the peer (numpy, or PyTorch on a CUDA GPU) and the device's copy
ceiling beside them, and what ``clops.providers.choose`` picks for each shape. Prints tables and
writes JSON.

    python bench/bench_providers.py [--device gpu] [--quick] [--json bench/results/providers.json]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from common import copy_ceiling, environment, table, torch_cuda, torch_ms, write_json  # noqa: E402

import clops  # noqa: E402
from clops import providers  # noqa: E402
from clops.array import dispatch  # noqa: E402
from clops.kernels import fft, layout  # noqa: E402
from clops.providers import Operand  # noqa: E402


def wall_ms(dev: clops.CLDevice, run: Callable[[], object], repeat: int = 10,
            budget_s: float = 3.0) -> float:
    """Median wall ms of one call from enqueue to the device's finish, after a warm-up call
    (both sides of each comparison are timed this way: a provider's kernels are not all visible
    to clops' profiler)."""
    run()
    dev.synchronize()
    times: list[float] = []
    spent = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        dev.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt * 1e3)
        spent += dt
        if spent > budget_s and len(times) >= 3:
            break
    return float(np.median(times))


def peer_ms(fn_np: Callable[[], object], fn_torch: Callable[[], object] | None,
            torch: object | None) -> float:
    if torch is not None and fn_torch is not None:
        return torch_ms(torch, fn_torch, repeat=10)
    fn_np()
    t0 = time.perf_counter()
    n = 0
    while n < 3 or time.perf_counter() - t0 < 0.3:
        fn_np()
        n += 1
    return (time.perf_counter() - t0) / n * 1e3


def bench_gemm(dev: clops.CLDevice, sizes: list[int], torch: object | None) -> list[dict]:
    return [_gemm_row(dev, n, torch) for n in sizes]


def _gemm_row(dev: clops.CLDevice, n: int, torch: object | None) -> dict:
    cb = providers.get("clblast")
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)
    x, y = clops.asarray(a, device=dev), clops.asarray(b, device=dev)
    flop = 2.0 * n ** 3
    row: dict = {"op": "gemm", "dtype": "float32", "shape": f"{n}x{n}x{n}"}

    def generated() -> None:
        with dispatch.generated_only():
            clops.matmul(x, y).realize()

    row["generated_ms"] = gen = wall_ms(dev, generated)
    row["generated_gflops"] = flop / gen / 1e6
    if cb.cannot("gemm", dev, "float32") is None:
        ao, bo = dispatch.operand(x), dispatch.operand(y)
        c = layout.empty(dev, (n, n), "float32")
        row["clblast_ms"] = ms = wall_ms(dev, lambda: cb.gemm(dev, ao, bo, c))
        row["clblast_gflops"] = flop / ms / 1e6
        got = np.empty((n, n), np.float32)
        dev.read(got, c.buffer)
        ref = a.astype(np.float64) @ b
        row["clblast_max_rel_err"] = float(np.abs(got - ref).max() / np.abs(ref).max())
    else:
        row["clblast"] = cb.cannot("gemm", dev, "float32")
    choice = providers.choose("gemm", dev, "float32", (n, n, n), lambda: gen / 1e3)
    row["chosen"] = choice.name if choice is not None else "generated"
    if torch is not None:
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()  # type: ignore
        torch.backends.cuda.matmul.allow_tf32 = False  # type: ignore[attr-defined]
        pm = peer_ms(lambda: None, lambda: ta @ tb, torch)
    else:
        pm = peer_ms(lambda: a @ b, None, None)
    row["peer_ms"], row["peer_gflops"] = pm, flop / pm / 1e6
    print(f"  gemm {n}: generated {gen:.3f} ms, clblast {row.get('clblast_ms', math.nan):.3f}"
          f" ms, peer {pm:.3f} ms -> {row['chosen']}", flush=True)
    return row


def bench_fft(dev: clops.CLDevice, cases: list[tuple[int, int]], torch: object | None
              ) -> list[dict]:
    return [_fft_row(dev, batch, n, torch) for batch, n in cases]


def _fft_row(dev: clops.CLDevice, batch: int, n: int, torch: object | None) -> dict:
    vk = providers.get("vkfft")
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((batch, n)) + 1j * rng.standard_normal((batch, n)))
    x = x.astype(np.complex64)
    xb = dev.alloc(x.nbytes)
    dev.write(xb, x, blocking=True)
    xo = Operand.contiguous(xb, (batch, n), "complex64")
    yo = layout.empty(dev, (batch, n), "complex64")
    flop = fft.flops(n, batch)
    nbytes = 2 * x.nbytes  # one read and one write of the rows
    row: dict = {"op": "fft", "dtype": "complex64", "shape": f"{batch}x{n}"}
    row["generated_ms"] = gen = wall_ms(dev, lambda: fft.fft(dev, xo, yo))
    row["generated_gflops"] = flop / gen / 1e6
    row["generated_gbps"] = nbytes / gen / 1e6
    ref = np.fft.fft(x.astype(np.complex128))
    got = np.empty_like(x)
    dev.read(got, yo.buffer)
    row["generated_max_rel_err"] = float(np.abs(got - ref).max() / np.abs(ref).max())
    if vk.cannot("fft", dev, "complex64") is None:
        row["vkfft_ms"] = ms = wall_ms(dev, lambda: vk.fft(dev, xo, yo))
        row["vkfft_gflops"] = flop / ms / 1e6
        row["vkfft_gbps"] = nbytes / ms / 1e6
        dev.read(got, yo.buffer)
        row["vkfft_max_rel_err"] = float(np.abs(got - ref).max() / np.abs(ref).max())
    else:
        row["vkfft"] = vk.cannot("fft", dev, "complex64")
    choice = providers.choose("fft", dev, "complex64", (batch, n), lambda: gen / 1e3)
    row["chosen"] = choice.name if choice is not None else "generated"
    if torch is not None:
        tx = torch.from_numpy(x).cuda()  # type: ignore[attr-defined]
        pm = peer_ms(lambda: None, lambda: torch.fft.fft(tx), torch)  # type: ignore
    else:
        pm = peer_ms(lambda: np.fft.fft(x), None, None)
    row["peer_ms"], row["peer_gflops"] = pm, flop / pm / 1e6
    print(f"  fft {batch}x{n}: generated {gen:.3f} ms, vkfft "
          f"{row.get('vkfft_ms', math.nan):.3f} ms, peer {pm:.3f} ms -> {row['chosen']}",
          flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="clops device selector (default: default)")
    ap.add_argument("--quick", action="store_true", help="fewer and smaller sizes")
    ap.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results",
                                                   "providers.json"))
    args = ap.parse_args()
    dev = clops.device(args.device)
    torch = torch_cuda() if dev.kind == "gpu" else None
    gpu = dev.kind == "gpu"
    if gpu:
        gemm_sizes = [512, 1024, 2048, 4096] + ([] if args.quick else [8192])
        fft_cases = [(4096, 256), (1024, 1024), (256, 4096), (16, 65536), (4, 1 << 20),
                     (64, 1000)]
    else:
        gemm_sizes = [128, 256, 512] + ([] if args.quick else [1024])
        fft_cases = [(256, 256), (64, 1024), (16, 4096), (2, 65536), (16, 1000)]
    if args.quick:
        fft_cases = fft_cases[:3]
    print(f"device: {dev.name} ({dev.platform_version})")
    print(providers.report(dev))
    ceiling = copy_ceiling(dev, nbytes=1 << (28 if gpu else 25), repeat=10)
    print(f"copy ceiling: {ceiling['gbps']:.1f} GB/s")
    gemm_rows = bench_gemm(dev, gemm_sizes, torch)
    fft_rows = bench_fft(dev, fft_cases, torch)
    print()
    print(table(gemm_rows, [("shape", "GEMM float32", ""), ("generated_gflops", "generated GF/s",
                                                          ".1f"),
                            ("clblast_gflops", "CLBlast GF/s", ".1f"),
                            ("peer_gflops", "peer GF/s", ".1f"), ("chosen", "chosen", "")]))
    print()
    print(table(fft_rows, [("shape", "FFT c64 batch x n", ""),
                           ("generated_gflops", "generated GF/s", ".1f"),
                           ("generated_gbps", "generated GB/s", ".1f"),
                           ("vkfft_gflops", "VkFFT GF/s", ".1f"),
                           ("vkfft_gbps", "VkFFT GB/s", ".1f"),
                           ("peer_gflops", "peer GF/s", ".1f"), ("chosen", "chosen", "")]))
    write_json(args.json, {"environment": environment(dev), "copy_ceiling": ceiling,
                           "providers": providers.report(dev), "gemm": gemm_rows,
                           "fft": fft_rows})


if __name__ == "__main__":
    main()
