"""Sweep of gemm_mma_async tile shapes on an NVIDIA GPU: float16 size^3 for each config, TFLOP/s,
error against a float64 product, registers (the driver's build log), and PyTorch in the same run.

    python bench/sweep_gemm.py [--size 4096] [--configs "BM=128,BN=128,WM=64,...;WG=1,..."]

``--nt M,N,K;...``: gemm_nt_wgmma instead (a prompt's linear products, B a [N][K] weight) for
each shape, tile shape (``--nt-configs``) and slices of K (``--splits``): device us, the
weight's bytes over that time (TB/s), TFLOP/s and the error of the slices' sum, beside
PyTorch's ``a @ b.T`` of the same shape.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import device_ms, torch_cuda, torch_ms  # noqa: E402

import clops  # noqa: E402
from clops.kernels import gemm  # noqa: E402
from clops.kernels.launch import source  # noqa: E402

DEFAULT = ("BM=128,BN=128,WM=64,WN=64,BK=32,STAGES=3,RASTER=8;"
           "WG=1,BM=128,BN=256,BK=64,STAGES=4,WAITN=1,RASTER=8,SWZ=0;"
           "WG=1,BM=128,BN=256,BK=64,STAGES=4,WAITN=1,RASTER=8,SWZ=1,B_SWAP=0;"
           "WG=1,BM=128,BN=256,BK=64,STAGES=4,WAITN=1,RASTER=8,SWZ=1,B_SWAP=1;"
           "WG=1,BM=128,BN=256,BK=64,STAGES=3,WAITN=0,RASTER=8,SWZ=1,B_SWAP=0;"
           "WG=1,BM=128,BN=256,BK=64,STAGES=4,WAITN=0,RASTER=8,SWZ=1,B_SWAP=0;"
           "WG=1,BM=128,BN=256,BK=64,STAGES=4,WAITN=1,RASTER=16,SWZ=1,B_SWAP=0;"
           "WG=1,BM=128,BN=256,BK=64,STAGES=4,WAITN=1,RASTER=4,SWZ=1,B_SWAP=0;"
           "WG=1,BM=128,BN=128,BK=64,STAGES=4,WAITN=1,RASTER=8,SWZ=1,B_SWAP=0;"
           "WG=1,BM=128,BN=128,BK=64,STAGES=3,WAITN=0,RASTER=8,SWZ=1,B_SWAP=0;"
           "WG=1,BM=128,BN=128,BK=64,STAGES=6,WAITN=1,RASTER=8,SWZ=1,B_SWAP=0;"
           "WG=1,BM=256,BN=128,BK=64,STAGES=4,WAITN=1,RASTER=8,SWZ=1,B_SWAP=0"
           )


def registers(dev, cfg: dict[str, int]) -> str:
    import pyopencl as cl
    if cfg.get("WG"):  # built from patched PTX: say whether it built
        from clops.kernels.launch import program
        from clops.runtime.program import rebuilt_from_binary, sm90a_ptx
        try:
            hidden = program(dev, "gemm", DT=1, USE_MMA=1, USE_WGMMA=1,
                             **{k: v for k, v in cfg.items() if k != "WG"})
            rebuilt_from_binary(dev, hidden, sm90a_ptx)
            return "wgmma built"
        except Exception as e:  # noqa: BLE001
            return "wgmma build failed: " + str(e)[-400:]
    opts = ["-cl-nv-verbose", "-DDT=1", "-DUSE_MMA=1", "-DUSE_MMA_ASYNC=1"]
    opts += [f"-D{k}={v}" for k, v in cfg.items()]
    try:
        prg = cl.Program(dev.context, source("gemm")).build(options=opts, cache_dir=False)
        log = prg.get_build_info(dev.cl_device, cl.program_build_info.LOG)
    except cl.Error as e:
        return "build failed: " + str(e)[-300:]
    name = "gemm_mma_async"
    m = re.search(name + r"'.*?Used (\d+) registers(.*?)\n", log, re.S)
    spill = re.search(r"(\d+) bytes spill stores", log)
    return (f"{m.group(1)} regs" if m else "?") + (f", spill {spill.group(1)}" if spill else "")


NT_DEFAULT = ("BM=128,BN=128,BK=64,STAGES=3,WAITN=0,RASTER=8;"
              "BM=128,BN=128,BK=64,STAGES=5,WAITN=0,RASTER=8;"
              "BM=128,BN=128,BK=64,STAGES=5,WAITN=1,RASTER=8;"
              "BM=64,BN=128,BK=64,STAGES=4,WAITN=0,RASTER=8;"
              "BM=64,BN=128,BK=64,STAGES=8,WAITN=0,RASTER=8;"
              "BM=64,BN=128,BK=64,STAGES=8,WAITN=1,RASTER=8;"
              "BM=128,BN=256,BK=64,STAGES=4,WAITN=0,RASTER=8;"
              "BM=64,BN=256,BK=64,STAGES=5,WAITN=0,RASTER=8")


def sweep_nt(dev, a) -> None:
    torch = torch_cuda()
    for shape in a.nt.split(";"):
        _sweep_nt_shape(dev, a, torch, *(int(v) for v in shape.split(",")))


def _sweep_nt_shape(dev, a, torch, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float16)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    splits = [int(v) for v in a.splits.split(",")]
    bx, bw = dev.alloc(x.nbytes), dev.alloc(w.nbytes)
    bc, bias = dev.alloc(max(splits) * m * n * 4), dev.alloc(n * 4)
    dev.write(bx, x, blocking=True)
    dev.write(bw, w, blocking=True)
    peer = ""
    if torch is not None:
        ta, tb = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
        pt = torch_ms(torch, lambda: ta @ tb.T, a.repeat)
        peer = f"PyTorch {pt * 1e3:.1f} us, {w.nbytes / pt / 1e9:.2f} TB/s"
    print(f"== {m}x{n}x{k} ({w.nbytes / 1e6:.1f} MB of weight) {peer}", flush=True)
    for spec in a.nt_configs.split(";"):
        cfg = {kk: int(v) for kk, v in (kv.split("=") for kv in spec.split(","))}
        for split in splits:
            if n % cfg["BN"] or k % split or (k // split) % cfg["BK"]:
                continue
            try:
                knl = gemm.nt_wgmma_kernel(dev, cfg, split, False, False)
                if knl is None:
                    print(f"{spec:50s} split {split}: does not build", flush=True)
                    continue
                run = functools.partial(gemm.run_nt_wgmma, dev, knl, cfg, split, bc, bx, bw,
                                        bias, m, n, k)
                ms, _ = device_ms(dev, run, a.repeat)
                got = np.empty((split, m, n), np.float32)
                dev.read(got, bc, blocking=True)
                err = float(np.linalg.norm(got.sum(0) - ref) / np.linalg.norm(ref))
                groups = -(-m // cfg["BM"]) * (n // cfg["BN"]) * split
                print(f"{spec:50s} split {split} ({groups:4d} groups): {ms * 1e3:7.1f} us "
                      f"{w.nbytes / ms / 1e9:5.2f} TB/s {2 * m * n * k / ms / 1e9:6.1f} "
                      f"TFLOP/s err {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{spec:50s} split {split}: FAILED {str(e)[-300:]}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--configs", default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--nt", default=None, help="M,N,K;... : sweep gemm_nt_wgmma instead")
    ap.add_argument("--nt-configs", default=NT_DEFAULT)
    ap.add_argument("--splits", default="1,2,4,8")
    a = ap.parse_args()
    dev = clops.device("gpu")
    if a.nt:
        sweep_nt(dev, a)
        return 0
    n = a.size
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n)).astype(np.float16)
    y = rng.standard_normal((n, n)).astype(np.float16)
    tx = clops.asarray(x, device=dev).realize()
    ty = clops.asarray(y, device=dev).realize()
    tc = clops.empty((n, n), dtype=clops.float16, device=dev).realize()
    flops = 2.0 * n ** 3
    torch = torch_cuda()
    ref = None
    if torch is not None:
        xa, xb = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
        pt = torch_ms(torch, lambda: xa @ xb, a.repeat)
        print(f"PyTorch {flops / pt / 1e9:.1f} TFLOP/s ({pt:.4f} ms)", flush=True)
        ref = (xa.double() @ xb.double()).cpu().numpy()
    for spec in a.configs.split(";"):
        cfg = {k: int(v) for k, v in (kv.split("=") for kv in spec.split(","))}
        try:
            def run(cfg=cfg) -> None:
                gemm.gemm(dev, tc.buffer, tc.offset, n, tx.buffer, tx.offset, n, ty.buffer,
                          ty.offset, n, n, n, n, "float16", mma_config=cfg)
            ms, _ = device_ms(dev, run, a.repeat)
            err = float("nan")
            if ref is not None:
                got = np.asarray(tc).astype(np.float64)
                err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            print(f"{spec:60s} {flops / ms / 1e9:7.1f} TFLOP/s  err {err:.1e}  "
                  f"{registers(dev, cfg)}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{spec:60s} FAILED {str(e)[-300:]}", flush=True)
    if torch is not None:
        pt = torch_ms(torch, lambda: xa @ xb, a.repeat)
        print(f"PyTorch again {flops / pt / 1e9:.1f} TFLOP/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
