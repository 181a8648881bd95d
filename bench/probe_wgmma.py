"""Probe: can Hopper's wgmma (PTX for sm_90a) be reached from NVIDIA's OpenCL compiler through
inline PTX, and how much local memory does a work-group get? Prints what each attempt did.

    python bench/probe_wgmma.py

Attempts: (1) the source as is (the compiler's own .target); (2) the same with build options
that might name sm_90a; (3) the sm_90a instructions hidden in PTX comments, the program's PTX
binary patched (markers removed, .target sm_90a) and built from that binary, then run against
numpy with both readings of the descriptors' byte offsets, for K-major and N-major B.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pyopencl as cl

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = open(os.path.join(HERE, "probe_wgmma.cl")).read()


def nvidia_device() -> cl.Device:
    import clops  # registers NVIDIA's OpenCL driver where the loader does not list it

    return clops.device("gpu").cl_device


def first_lines(text: str, n: int = 4) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[:n])[:600]


def try_build(ctx: cl.Context, dev: cl.Device, src: str, opts: list[str]) -> tuple[bool, str]:
    try:
        prg = cl.Program(ctx, src).build(options=opts, devices=[dev], cache_dir=False)
        return True, first_lines(prg.get_build_info(dev, cl.program_build_info.LOG))
    except cl.Error as e:
        return False, first_lines(str(e), 8)


def patch_ptx(ptx: bytes) -> bytes:
    """Remove the //@@ markers and name the sm_90a target."""
    text = ptx.decode().replace("//@@", "")
    text = re.sub(r"^\.target\s+sm_90\b", ".target sm_90a", text, flags=re.M)
    return text.encode()


def main() -> int:
    dev = nvidia_device()
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    print(f"device {dev.name}, driver {dev.driver_version}, OpenCL {dev.version}")
    print(f"CL_DEVICE_LOCAL_MEM_SIZE {dev.local_mem_size}, "
          f"max work-group {dev.max_work_group_size}")
    # local memory: static arrays of 48, 64, 96 KB, and a dynamic (argument) one
    for kb in (48, 64, 96):
        ok, log = try_build(ctx, dev, SRC, ["-DHIDE=1", f"-DLOCAL_BYTES={kb * 1024 - 64}"])
        print(f"static local {kb} KB: build {'ok' if ok else 'FAILED'} {'' if ok else log}")
        if ok:
            opts = ["-DHIDE=1", f"-DLOCAL_BYTES={kb * 1024 - 64}"]
            prg = cl.Program(ctx, SRC).build(options=opts)
            out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 256)
            try:
                prg.big_local(q, (64,), (64,), out, cl.LocalMemory(16)).wait()
                print("   ran")
            except cl.Error as e:
                print(f"   launch FAILED {first_lines(str(e))}")
    prg = cl.Program(ctx, SRC).build(options=["-DHIDE=1"])
    out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 256)
    for kb in (48, 64, 100):
        try:
            prg.big_local(q, (64,), (64,), out, cl.LocalMemory(kb * 1024 - 64)).wait()
            print(f"dynamic local {kb} KB: ran")
        except cl.Error as e:
            print(f"dynamic local {kb} KB: FAILED {first_lines(str(e))}")

    # (1) plain source
    ok, log = try_build(ctx, dev, SRC, [])
    print(f"(1) wgmma from source: {'built' if ok else 'FAILED'}: {log}")
    # (2) build options
    for opt in (["-cl-nv-arch", "sm_90a"], ["-cl-nv-arch=sm_90a"], ["-arch=sm_90a"],
                ["-cl-nv-cstd=CL3.0", "-cl-nv-arch", "sm_90a"]):
        ok, log = try_build(ctx, dev, SRC, opt)
        print(f"(2) options {' '.join(opt)}: {'built' if ok else 'FAILED'}: {log}")
    # (3) hidden, patched PTX
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 16)).astype(np.float16)
    b = rng.standard_normal((16, 16)).astype(np.float16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    mf = cl.mem_flags
    ba = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    bb = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
    bd = cl.Buffer(ctx, mf.READ_WRITE, 64 * 16 * 4)
    for trans in (0, 1):
        try:
            hidden = cl.Program(ctx, SRC).build(options=["-DHIDE=1", f"-DTRANS_B={trans}"],
                                                cache_dir=False)
        except cl.Error as e:
            print(f"(3) TRANS_B={trans} hidden build FAILED {first_lines(str(e), 8)}")
            continue
        ptx = hidden.get_info(cl.program_info.BINARIES)[0]
        heads = [ln for ln in ptx.decode(errors="replace").splitlines()
                 if ln.startswith((".version", ".target", ".address_size"))]
        if trans == 0:
            print(f"(3) the compiler's PTX header: {heads}")
            print("    wgmma lines:", [ln.strip() for ln in ptx.decode().splitlines()
                                       if "@@" in ln][:4])
        try:
            prg = cl.Program(ctx, [dev], [patch_ptx(ptx)]).build(cache_dir=False)
        except cl.Error as e:
            print(f"(3) TRANS_B={trans} patched binary FAILED: {first_lines(str(e), 8)}")
            continue
        print(f"(3) TRANS_B={trans} patched sm_90a binary built")
        for lbo_b, sbo_b in ((128, 256), (256, 128)):
            for lbo_a, sbo_a in ((128, 256), (256, 128)):
                d = np.full((64, 16), np.nan, np.float32)
                cl.enqueue_copy(q, bd, d)
                try:
                    prg.probe(q, (128,), (128,), bd, ba, bb, np.int32(lbo_a), np.int32(sbo_a),
                              np.int32(lbo_b), np.int32(sbo_b)).wait()
                    cl.enqueue_copy(q, d, bd)
                    err = float(np.nanmax(np.abs(d - want))) if np.isfinite(d).any() else -1
                    print(f"    A lbo/sbo {lbo_a}/{sbo_a}, B {lbo_b}/{sbo_b}: max err {err:.3g}"
                          f" {'CORRECT' if np.allclose(d, want, atol=1e-2) else ''}")
                except cl.Error as e:
                    print(f"    run FAILED {first_lines(str(e))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
