"""The streaming ceiling of a phase of the decode layer kernel (``kernels/layer.cl``): a
persistent grid (a work-group of 256 a multiprocessor) reads P phases of weights, each phase's
parts dealt to the grid's warps, with a grid barrier between phases, and nothing else to do.
NVIDIA only (PTX):

    python bench/stream_phases.py

Two ways of streaming (``stream_phases.cl``): register stages, the next phase's first parts
loaded while the work-groups meet (as the kernel's pipelined phases), and a ring of local memory
a warp filled by ``cp.async.bulk`` (sm_90a: the PTX patched as ``bench/probe_wgmma.py`` does)
that runs on across the barriers. Beside the device's copy (read + write), medians of 9.

H100, 2026-11-27 (copy 2953 GB/s): a 33.5 MB phase (the 1B body's down projection) 11.1-11.3 us
with register stages, barriers or not; 12.2-12.6 us with the ring (11.4-11.7 without barriers);
a 58 MB phase 19.0-19.3 us against 19.96-20.35; a 12.6 MB phase 5.1 against 5.6; one 500 MB
phase 3030 against 3048 GB/s.
"""

from __future__ import annotations

import os
import re
import statistics
import sys

import numpy as np
import pyopencl as cl

HERE = os.path.dirname(os.path.abspath(__file__))
LS = 256


def nvidia_device() -> cl.Device:
    import clops  # registers NVIDIA's OpenCL driver where the loader does not list it

    return clops.device("gpu").cl_device


def sm90a(ptx: bytes) -> bytes:
    """The hidden ("//@@") copies uncommented, the sm_90a target named."""
    text = re.sub(r"^(\.target\s+)sm_90\b", r"\1sm_90a", ptx.decode(), flags=re.M)
    return text.replace("//@@", "").encode()


class Bench:
    def __init__(self, nbytes: int = 1 << 30) -> None:
        self.dev = nvidia_device()
        self.ctx = cl.Context([self.dev])
        self.q = cl.CommandQueue(self.ctx,
                                 properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.groups = self.dev.max_compute_units
        self.nbytes = nbytes
        mf = cl.mem_flags
        self.w = cl.Buffer(self.ctx, mf.READ_WRITE, nbytes)
        cl.enqueue_fill_buffer(self.q, self.w, np.uint8(1), 0, nbytes).wait()
        self.out = cl.Buffer(self.ctx, mf.READ_WRITE, self.groups * LS * 4)
        self.bar = cl.Buffer(self.ctx, mf.READ_WRITE, 64)
        cl.enqueue_fill_buffer(self.q, self.bar, np.uint8(0), 0, 64).wait()
        with open(os.path.join(HERE, "stream_phases.cl")) as f:
            self.src = f.read()

    def timed(self, run, reps: int = 9) -> float:
        ts = []
        for _ in range(reps + 2):
            ev = run()
            ev.wait()
            ts.append((ev.profile.end - ev.profile.start) * 1e-9)
        return statistics.median(ts[2:])

    def copy_gbs(self) -> float:
        dst = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, self.nbytes // 2)
        t = self.timed(lambda: cl.enqueue_copy(self.q, dst, self.w,
                                               byte_count=self.nbytes // 2))
        return self.nbytes / t / 1e9

    def build(self, opts: list[str], patch: bool) -> cl.Program:
        prg = cl.Program(self.ctx, self.src).build(options=opts, devices=[self.dev],
                                                   cache_dir=False)
        if patch:
            ptx = bytes(prg.get_info(cl.program_info.BINARIES)[0]).replace(b"\0", b"")
            prg = cl.Program(self.ctx, [self.dev], [sm90a(ptx)]).build(devices=[self.dev],
                                                                       cache_dir=False)
        return prg

    def phase(self, name: str, opts: list[str], part: int, phase_mb: float, phases: int = 16,
              barriers: int = 1) -> str:
        npp = int(phase_mb * 1e6) // part
        label = (f"{name} {' '.join(opts)} part {part} B, phase {npp * part / 1e6:.1f} MB "
                 f"x{phases}, barriers {barriers}")
        if npp * part * phases > self.nbytes:
            return f"{label}: more than the buffer's {self.nbytes >> 20} MiB"
        try:
            prg = self.build(opts + [f"-DPART={part}", f"-DLS={LS}", f"-DBARRIERS={barriers}"],
                             name == "phases_tma")
        except cl.Error as e:
            return f"{label}: does not build here ({str(e).strip().splitlines()[0][:200]})"
        k = getattr(prg, name)
        k.set_args(self.w, np.int32(npp), np.int32(phases), self.bar, self.out)
        t = self.timed(lambda: cl.enqueue_nd_range_kernel(self.q, k, (self.groups * LS,),
                                                          (LS,)))
        return (f"{label}: {t / phases * 1e6:.2f} us a phase, "
                f"{npp * part * phases / t / 1e9:.0f} GB/s")


def main() -> int:
    b = Bench()
    print(f"{b.dev.name}, {b.groups} compute units; copy {b.copy_gbs():.0f} GB/s "
          "(read + write)", flush=True)
    for mb in (33.5, 58.0, 12.6):
        for bars in (1, 0):
            print(b.phase("phases_regs", ["-DSTAGES=2", "-DPRE=1"], 8192, mb, barriers=bars),
                  flush=True)
        print(b.phase("phases_regs", ["-DSTAGES=2", "-DPRE=2"], 8192, mb), flush=True)
        print(b.phase("phases_regs", ["-DSTAGES=3", "-DPRE=2"], 4096, mb), flush=True)
        for s, part in ((4, 4096), (6, 4096), (3, 8192), (8, 2048)):
            for bars in (1, 0):
                print(b.phase("phases_tma", [f"-DS={s}", "-DSTAGES=2"], part, mb,
                              barriers=bars), flush=True)
    print(b.phase("phases_regs", ["-DSTAGES=2", "-DPRE=1"], 8192, 500, phases=1, barriers=0))
    print(b.phase("phases_tma", ["-DS=6", "-DSTAGES=2"], 4096, 500, phases=1, barriers=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
