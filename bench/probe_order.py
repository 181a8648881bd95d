"""Probe: does a load of a line held in L2 wait behind the loads a multiprocessor has in
flight? The decode layer kernel (``kernels/layer.cl``) issues a phase's first weight loads while
its work-groups meet at a grid barrier, then polls the barrier's count and reads the phase's
input: this measures what those reads cost behind the weights. NVIDIA only (PTX; the bulk
copies need sm_90a, patched into the PTX as ``bench/probe_wgmma.py`` does):

    python bench/probe_order.py

Every multiprocessor's work-group issues N 16-byte pieces of cold memory a work-item by one of
four kinds of load (or none), then work-item 0 reads a line of L2 by one of three; medians over
the work-groups and 5 runs, in clocks.

H100, 2026-11-27, 8 pieces a work-item (32 KB a multiprocessor): the L2 line alone 400 clocks
(an atomic 600, a bulk copy 580); behind ld.global.nc loads 3100-3200 by any of the three, about
as long as the loads themselves (3450); behind cp.async 3300-4300; behind bulk copies 870-1020
(a bulk copy of the line 2300); behind prefetch.global.L2 870-1010. With 16 a work-item (64 KB):
behind ld.global.nc 5500-5600, behind bulk copies 880-1230 (a bulk copy of the line 4500).
In the layer kernel itself, the barrier-time weights loaded by bulk copies into local memory
(or prefetched into L2) made decode slower, not faster: see the note at ``wload`` in layer.cl.
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
LOADS = {0: "none", 1: "ld.global.nc", 2: "cp.async", 3: "cp.async.bulk", 4: "prefetch.L2"}
READS = {0: "ld.relaxed", 1: "atom.add 0", 2: "cp.async.bulk"}


def sm90a(ptx: bytes) -> bytes:
    """The hidden ("//@@") instructions uncommented, the sm_90a target named."""
    text = re.sub(r"^(\.target\s+)sm_90\b", r"\1sm_90a", ptx.decode(), flags=re.M)
    return text.replace("//@@", "").encode()


def main() -> int:
    import clops  # registers NVIDIA's OpenCL driver where the loader does not list it

    dev = clops.device("gpu").cl_device
    if "nvidia" not in dev.platform.name.lower():
        print(f"{dev.name}: NVIDIA only (PTX)")
        return 0
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    groups = dev.max_compute_units
    nbytes = 1 << 30
    w = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes)
    cl.enqueue_fill_buffer(q, w, np.uint8(1), 0, nbytes).wait()
    hot = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, groups * 256 + 256)
    cl.enqueue_fill_buffer(q, hot, np.uint8(0), 0, groups * 256 + 256).wait()
    out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, groups * 24)
    with open(os.path.join(HERE, "probe_order.cl")) as f:
        src = f.read()
    print(f"{dev.name}, {groups} work-groups of {LS}; clocks (median over work-groups and runs)")
    base = 0
    for n in (8, 16):
        for mode, kind in LOADS.items():
            for how, read in READS.items():
                opts = [f"-DLS={LS}", f"-DN={n}", f"-DMODE={mode}", f"-DHOT={how}"]
                prg = cl.Program(ctx, src).build(options=opts, devices=[dev], cache_dir=False)
                ptx = bytes(prg.get_info(cl.program_info.BINARIES)[0]).replace(b"\0", b"")
                knl = cl.Program(ctx, [dev], [sm90a(ptx)]).build(devices=[dev],
                                                                  cache_dir=False).probe
                got = []
                for rep in range(7):
                    # (fresh cold memory every run)
                    base = (base + groups * LS * n) % (nbytes // 16 - groups * LS * n)
                    knl(q, (groups * LS,), (LS,), w, hot, out, np.int32(base))
                    o = np.empty(3 * groups, np.uint64)
                    cl.enqueue_copy(q, o, out)
                    if rep >= 2:
                        got.append(o.reshape(groups, 3))
                r = np.stack(got)
                print(f"{n * 16 * LS >> 10:3d} KB in flight by {kind:13s}, the L2 line by "
                      f"{read:13s}: {statistics.median(r[:, :, 0].ravel().tolist()):6.0f} "
                      f"(all loads back: {statistics.median(r[:, :, 2].ravel().tolist()):6.0f})",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
