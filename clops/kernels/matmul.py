"""Kernels, matmul: launches of ``matmul.cl`` (row tiles of x times weight rows, float and
block-quantized, the int8 decode path) and ``matmul_cpu.cl`` (the CPU weight layout ``rb16``),
and the route of a prompt's products through ``gemm.cl``'s tensor cores (``linear``). Each
launcher describes one launch on runtime Buffers (element offsets and row strides as
arguments) and picks its geometry from the device's capabilities; ``nn.functional`` runs them
at once, ``llm`` records them into plans."""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from ..runtime import CLDevice
from ..runtime.pool import Buffer
from . import gemm as _gemm
from . import launch, native_cpu
from .launch import Launch, f32, float_define, i32, kernel, pow2_at_most
from .norm import half_rows, split_norm_half


class Weight(Protocol):
    """What the matmul kernels read of a weight on the device (``nn.quant.DeviceWeight``):
    its format, ``[n, k]`` shape, layout (``rows`` or the CPU layout ``rb16``), value and scale
    buffers, the float16 copy it may keep, whether its products may quantize their input rows
    to int8 (``int8``: where the device runs that faster), and the kernels' compile-time
    parameters."""

    fmt: str
    n: int
    k: int
    layout: str
    data: Buffer
    scales: Buffer
    half: Buffer | None
    int8: bool

    @property
    def defines(self) -> dict[str, Any]: ...


# the compact formats of the row layout (matmul.cl WFMT 5; nn/quant.py's KQ_FORMATS gives each
# one's bits): a group of 32 values a 16-byte chunk, as q4
COMPACT_FORMATS = ("k4", "k5", "k6", "i4", "m4", "n4", "h5")
# values per 16-byte chunk of a weight row, by format (matmul.cl CHUNKED)
CHUNK_VALUES = {"f32": 4, "f16": 8, "bf16": 8, "q4": 32, "q8": 16, "q8m": 16,
                **{f: 32 for f in COMPACT_FORMATS}}
# the formats whose rows the int8 paths take (QX, QROWS)
INT8_FORMATS = ("q4", "q8", *COMPACT_FORMATS)
# the format whose int8 geometry each takes (the compact formats: q4's, but for qx_geometry's
# branch of their own)
GEOMETRY_FORMAT = {f: "q4" for f in COMPACT_FORMATS}


def matmul_geometry(dev: CLDevice, m: int, k: int, fmt: str = "q4") -> tuple[int, int]:
    """(TM, LSIZE): rows of x per work-item and work-items per output column."""
    if launch.is_cpu(dev):
        # PERF: on CPUs one work-item walks a whole row; TM rows of x reuse each dequantized
        # group from registers (prefill).
        return (1 if m == 1 else 8), 1
    # PERF: a team of work-items per output column, one 16-byte chunk of the row per
    # work-item and step (coalesced); several teams share a work-group (matmul_columns).
    # Prefill tiles and quantized rows: teams of at most a warp. One decode row of float
    # weights: a whole work-group per column (DECODE_FLOAT_TEAM), so that enough chunks are in
    # flight when the layer has few, long rows (H100, f16, event-free: 2048x8192 took 19.7 us
    # with warps, 14.7 us with teams of 256 = 0.99 of a copy of its bytes; 8192x2048 16.0 ->
    # 14.1 us; 2048x2048 7.7 -> 6.1 us; 128256x2048 172.7 -> 168.4 us).
    chunks = max(1, k // CHUNK_VALUES[fmt])
    team = DECODE_FLOAT_TEAM if m == 1 and fmt in FLOAT_FORMATS else 32
    lsize = min(team, pow2_at_most(dev.caps.max_work_group), 1 << (chunks - 1).bit_length())
    return (1 if m == 1 else 4), max(lsize, 1)


FLOAT_FORMATS = ("f32", "f16", "bf16")
DECODE_FLOAT_TEAM = 256


GPU_GROUP = 256


def matmul_columns(dev: CLDevice, lsize: int, n: int = 1 << 30, cpt: int = 1) -> int:
    """Teams (of ``lsize`` work-items, ``cpt`` output columns each) per work-group on GPUs:
    up to GPU_GROUP work-items, while leaving two work-groups per compute unit."""
    if launch.is_cpu(dev) or lsize == 1:
        return 1
    most = max(1, min(GPU_GROUP, dev.caps.max_work_group) // lsize)
    fill = max(1, n // (cpt * 2 * dev.caps.compute_units))
    return min(most, pow2_at_most(fill))


def matmul_cpt(dev: CLDevice, m: int, n: int, fmt: str) -> int:
    """Output columns per team on GPUs: each x chunk serves them all."""
    if launch.is_cpu(dev):
        return 1
    if m != 1 or fmt in FLOAT_FORMATS:
        # PERF (H100): 4 columns a team, fewer where that leaves under two work-groups per
        # compute unit. One row of float weights (teams of a work-group): best or within 5% of
        # best from 2048 to 128256 columns. Several rows (SmolLM2's Q4_1/Q8_0 products of
        # 2..64 rows, TM 4), where a team of one column read every x row again for each
        # column: 3072x576 at 16 rows 39.6 -> 22.2 us, at 64 rows 132 -> 66 us; 576x1536 at
        # 16 rows 26.5 -> 19.5 us; the 49152-column head 300 -> 231 us. A column's sums are
        # added in the same order whatever CPT.
        return min(4, pow2_at_most(max(1, n // (2 * dev.caps.compute_units))))
    # PERF: but at least ~2048 teams (warps), enough loads in flight for the memory system
    return min(4, pow2_at_most(max(1, n // 2048)))


def use_shfl(dev: CLDevice, lsize: int) -> bool:
    """Reduce teams with NVIDIA's warp shuffle (inline PTX) where the probe finds it: teams
    of up to a warp, or of whole warps (whose sums then meet in local memory)."""
    return 1 < lsize and (lsize <= 32 or lsize % 32 == 0) and not launch.is_cpu(dev) and \
        dev.probe("nvidia_ptx")


def matmul_rows(dev: CLDevice, n: int) -> int:
    """Output columns per work-item: on CPUs enough to make work-items long, while leaving
    several per core."""
    if not launch.is_cpu(dev):
        return 1
    target = max(1, n // (dev.caps.compute_units * 16))
    return min(ROWS_MAX, pow2_at_most(target))


ROWS_MAX = 2


def int8_activations(dev: CLDevice, m: int, fmt: str, k: int) -> bool:
    """Whether one decode row meets q4/q8 weights as int8 (matmul.cl QX): x quantized per 32
    values in the kernel's prologue, int8 dot products (NVIDIA's dp4a).

    PERF: the float path's dequantization (a few integer ops and an FMA per weight) held the
    H100 to 0.14..0.64 of its copy bandwidth; dp4a does 4 weights per instruction. Other GPUs
    keep the float path until measured (the kernel's plain-C dot4 runs anywhere), CPUs too
    (PoCL's float path is vectorized; the int8 path is not faster there)."""
    # (q8m, values with mins, keeps the float path: not written for int8 activations)
    if m != 1 or fmt not in INT8_FORMATS or launch.is_cpu(dev):
        return False
    # int8 x, (dx, dx * sum q) per 32 and the reduction scratch in local memory (qx_geometry's
    # groups of 2 * GPU_GROUP; its wider ones check for themselves)
    if _qx_local_bytes(k, 1, 2 * GPU_GROUP, 1) > dev.caps.local_mem:
        return False
    return dev.probe("nvidia_ptx")


def int8_rows(dev: CLDevice, m: int, w: Weight) -> bool:
    """Whether ``matmul`` of m rows with ``w`` quantizes the rows to int8 (a scale per 32
    values): the GPU decode row's int8 path, or the native CPU products."""
    return w.int8 and (int8_activations(dev, m, w.fmt, w.k) or native_cpu.takes(dev, w))


# Tuning hook for bench sweeps (None: the launcher's choice): (LSIZE, NCOL, CPT, UNR, CB, PIPE)
# of the int8 path.
QX_OVERRIDE: tuple[int, int, int, int, int, int] | None = None


def _qx_local_bytes(k: int, ls: int, ncol: int, cpt: int) -> int:
    """Local memory of the int8 path: int8 x, (dx, dx * sum q) per 32, the reduction scratch
    (with the sums of squares of XMODE 1) and the per-work-item sums of squares."""
    return k + k // 4 + 4 * (cpt + 2) * ls * ncol


def qx_geometry(dev: CLDevice, n: int, k: int,
                fmt: str) -> tuple[int, int, int, int, int, int]:
    """(LSIZE, NCOL, CPT, UNR, CB, PIPE) of the int8 decode path (matmul.cl QX)."""
    if QX_OVERRIDE is not None:
        return QX_OVERRIDE
    compact, fmt = fmt in GEOMETRY_FORMAT, GEOMETRY_FORMAT.get(fmt, fmt)
    nch = max(1, k // CHUNK_VALUES[fmt])
    most = pow2_at_most(min(1024, dev.caps.max_work_group))
    if 16 * dev.caps.compute_units < n < 32 * dev.caps.compute_units and most >= 1024 and \
            _qx_local_bytes(k, 32, 32, 1) <= dev.caps.local_mem and \
            nch >= 64 * (2 if fmt == "q4" else 4):
        # PERF (H200, back to back over weight copies, of the copy bandwidth): an 8B body's
        # 4096 columns (about one group of 32 warp teams a compute unit): q4 4096x14336 0.33 ->
        # 0.67, 4096x4096 0.36 -> 0.43; q8 0.65 -> 0.78, 0.47 -> 0.57 against the groups of 16
        # columns below (bench_kernels.py --qx; bench/results/qx_h200_1b_8b_shapes.json). At
        # 2048 columns (half the compute units would idle) those stay ahead.
        # (rows of two steps or more, as measured: K >= 4096)
        unr = 2 if fmt == "q4" else 4
        return 32, 32, 1, unr, 1, int(nch > 32 * unr)
    # PERF (H100): few output columns of long rows (2048x8192: 128 groups of 256 left the SMs
    # a group each, 8 warps, with 8..16 chunks per work-item one after another): groups of
    # 1024, 16 columns each (~ one per SM), the rows split over 64 (q8) or 128 (q4, 2 columns
    # per team) work-items; their warps' sums meet in local memory. 0.55 -> 0.69 of copy
    # (q8), 0.37 -> 0.42 (q4) against 28 other geometries.
    if n < 32 * dev.caps.compute_units and most >= 1024:
        cpt = 2 if fmt == "q4" else 1
        ls = 1024 * cpt // 16
        unr = min(4, nch // ls)
        # (at least 4 chunks per work-item, as measured: K >= 4096 (q8), 8192 (q4))
        if nch * cpt >= 4 * ls and _qx_local_bytes(k, ls, 1024 // ls, cpt) <= dev.caps.local_mem:
            return ls, 1024 // ls, cpt, unr, 1, int(nch > ls * unr)
    # PERF (H200, a 70B body's decode products as the step launches them, back to back, of the
    # copy bandwidth; bench_kernels.py --gemv-x; bench/results/qx_h200_70b_decode.json): every
    # group quantizes the whole x (with the GLU or the norm folded in) before its weights, so
    # long rows want fewer, larger groups. q8 down 8192x28672 with the GLU 0.46 -> 0.86 (128.5
    # -> 68.8 us) with 64 half-warp teams a group against the 16 below; [gate | up] 57344x8192
    # with the norm 0.87 -> 1.01, QKV 10240x8192 0.72 -> 0.83, o 8192x8192 0.77 -> 0.85 with 16
    # warp teams
    if fmt == "q8" and k >= 8192 and most >= 1024:
        ls, ncol = (16, 64) if k >= 16384 else (32, 16)
        if _qx_local_bytes(k, ls, ncol, 1) <= dev.caps.local_mem:
            return ls, ncol, 1, 4, 1, int(nch > ls * 4)
    # PERF (H100, N 8192..32768, K 2048): half-warp teams, one column each, 4 chunks per
    # work-item in flight and (several steps) the next 4 loading meanwhile. q8: 16 teams per
    # group. q4: 32 teams per group and for large N consecutive column blocks per group (x
    # quantized once for them, ~256 groups): 32768x2048 0.97 -> 1.12 of copy against 16 teams
    # with 4 blocks (0.80 with one); q8 measured best with one block of 16 teams.
    _, ls = matmul_geometry(dev, 1, k, fmt)
    ls = min(ls, 16)
    if compact and ls == 16:
        # PERF (H200, 8B shapes, back to back over weight copies, of the copy bandwidth;
        # bench/results/qx_kquants_h200_1201.json): the compact K-quants (four loads a chunk,
        # their bits unpacked) want no column blocks and no loads a step ahead: Q6_K
        # 28672x4096 0.70 -> 0.86 and 6144x4096 0.46 -> 0.57 with 32 teams of 16 a group, one
        # block, 4 chunks in flight (Q5_K 0.66 -> 0.83, 0.49 -> 0.53) against q4's choice
        # below, best of 7
        return ls, max(1, min(2 * GPU_GROUP, dev.caps.max_work_group) // ls), 1, 4, 1, 0
    group = 2 * GPU_GROUP if fmt == "q4" and n >= 8192 else GPU_GROUP
    ncol = max(1, min(group, dev.caps.max_work_group) // ls)
    cb = min(4, pow2_at_most(max(1, n // 8192))) if fmt == "q4" else 1
    unr = 4
    steps = -(-nch // (ls * unr)) * cb
    return ls, ncol, 1, unr, cb, int(steps > 1)


def qx_slot_geometry(dev: CLDevice, n: int, k: int,
                     fmt: str) -> tuple[int, int, int, int, int, int]:
    """``qx_geometry`` for the expert products of a lone decode row's slots (each slot a
    product of ``n`` columns with its own expert's weights, ``matmul``'s experts with tiles of
    one row): experts of fewer than 8192 columns take two columns a team of 16 where their
    rows hold 2048 values or more, else 64 teams of 8 a work-group.

    PERF (H200, a Qwen3-30B-A3B layer's 8 slots of 128 experts, back to back over router
    logits that pick others each call; ``bench_kernels.py --only experts``,
    ``bench/results/experts_h200.json``, ``experts_q8_h200.json``), against qx_geometry's 16
    teams of 16: [gate | up] 1536x2048 with the pre-norm and the top-k folded in, Q4_0 11.8 ->
    8.8 us (two blocks of columns a group 9.2, 32 teams 9.4, teams of 8 9.3), Q8_0 12.6 ->
    10.9; down 2048x768 with the GLU and the weighted sum folded in, Q4_0 7.6 -> 6.7 us
    (two columns a team 7.1), Q8_0 8.0 -> 7.1 (two columns a team, two chunks in flight:
    6.5). Rows past 2048 values load a step ahead, as qx_geometry's do (not measured here)."""
    g = qx_geometry(dev, n, k, fmt)
    if QX_OVERRIDE is not None or n >= 8192 or \
            pow2_at_most(min(1024, dev.caps.max_work_group)) < 512:
        return g
    nch = max(1, k // CHUNK_VALUES[GEOMETRY_FORMAT.get(fmt, fmt)])
    ls, ncol, cpt = (16, 16, 2) if k >= 2048 else (8, 64, 1)
    if _qx_local_bytes(k, ls, ncol, cpt) > dev.caps.local_mem:
        return g
    return ls, ncol, cpt, 4, 1, int(k > 2048 and nch > ls * 4)


# Tuning hook for bench sweeps (None: the launcher's choice): (LSIZE, NCOL, CPT, TM, UNR) of
# matmul_qrows
QROWS_OVERRIDE: tuple[int, int, int, int, int] | None = None


def int8_batch(dev: CLDevice, w: Weight) -> bool:
    """Whether the batched engine's products of w meet the rows as int8 (``matmul_qrows``):
    q4/q8 weights (no mins) in the row layout that may meet int8 rows (``w.int8``: the model's
    ``int8_activations``), on a GPU with NVIDIA's dp4a.

    PERF (H200, a 70B body's products of 16 rows, Q8_0): the row-invariant float path
    (``matmul`` with 4 rows a work-item, a weight made float for each tile of rows) ran at 7-8
    TFLOP/s, ten times one row's time for 16 rows: the arithmetic, not the weights' bytes,
    bounded it."""
    return w.int8 and w.layout == "rows" and w.fmt in INT8_FORMATS and \
        not w.defines.get("QMIN") and not launch.is_cpu(dev) and dev.probe("nvidia_ptx")


def qrows_geometry(dev: CLDevice, w: Weight) -> tuple[int, int, int, int, int]:
    """(LSIZE, NCOL, CPT, TM, UNR) of ``matmul_qrows``: one for every row count (a row's sums
    then add in one order whatever the batch)."""
    if QROWS_OVERRIDE is not None:
        return QROWS_OVERRIDE
    # PERF (H200, a 70B body's products of 16 and 64 rows, bench_kernels.py --qrows, against 6
    # others): teams of a warp, 4 columns each, 2 teams a group, 8 rows a work-item, one chunk
    # in flight. Q8_0 16 rows: 57344x8192 1.76 -> 0.43 ms, 8192x28672 1.00 -> 0.26 against the
    # float rows; Q4_0 2.40 -> 0.28, 1.23 -> 0.19 (32,4,2,8,2: 0.62/0.59, 0.32/0.32)
    return 32, 2, 4, 8, 1


# matmul_qmma's (KS, RT) in place of the choice below (tests force the path on any device)
QMMA_OVERRIDE: tuple[int, int] | None = None


def qmma_geometry(dev: CLDevice, w: Weight) -> tuple[int, int] | None:
    """(KS, RT) of ``matmul_qmma`` (warps a work-group splitting k, tiles of 8 rows a warp)
    where ``matmul_qrows``' product of ``w`` takes NVIDIA's int8 tensor cores (8-bit weights
    with a scale per 32), else None (its dp4a kernel)."""
    if w.fmt in GEOMETRY_FORMAT:  # (qmma.cl does not read the compact K-quants)
        return None
    if QMMA_OVERRIDE is not None:
        return QMMA_OVERRIDE
    # PERF (H200, 8B shapes, bench_kernels.py --only rows --qmma; the product of M rows with
    # their quantization, ms, dp4a -> qmma 8,2): Q8_0 6144x4096 M=2 0.025 -> 0.026, 8 0.034 ->
    # 0.027, 16 0.036 -> 0.031, 64 0.096 -> 0.079; 14336x4096 2 0.036 -> 0.046, 8 0.044 ->
    # 0.049, 16 0.073 -> 0.055, 64 0.214 -> 0.163; 4096x14336 2 0.062 -> 0.063, 8 0.102 ->
    # 0.064, 16 0.106 -> 0.067, 64 0.330 -> 0.160. A layer's products (qkv, gate and up, down)
    # of 2 rows 13% slower, of 4 4% slower, of 8 15% faster, of 16 27%, of 64 34%; one geometry
    # for every M keeps a row's sums in one order whatever the batch. 4-bit rows stay on dp4a
    # (qmma up to 1.5x slower: each block's nibbles unpacked for the instruction), so do Q6_K's
    # scales per 16 (not measured).
    if launch.is_cpu(dev) or not dev.probe("nvidia_ptx"):
        return None
    return qmma_takes(w)


def qmma_takes(w: Weight) -> tuple[int, int] | None:
    """``qmma_geometry``'s choice for ``w`` on a GPU with NVIDIA's PTX (tests run it on any)."""
    if w.fmt == "q8" and int(w.defines.get("QGROUP", 32)) == 32 and not w.defines.get("QMIN"):
        return (8, 2)
    return None


def qrows_rows(dev: CLDevice, w: Weight) -> int:
    """The rows a work-group of ``matmul_qrows``' product takes (axis 1 of its global size is
    the row count over it)."""
    g = qmma_geometry(dev, w)
    return 8 * g[1] if g is not None else qrows_geometry(dev, w)[3]


def qrows_tile(dev: CLDevice, w: Weight) -> int:
    """The rows of a grouped product's tile where ``matmul_qrows`` takes it (its TM)."""
    return qrows_geometry(dev, w)[3]


def qrows_scratch(dev: CLDevice, rows: int, k: int) -> tuple[Buffer, Buffer, Buffer]:
    """The int8 rows ``matmul_qrows`` reads, for up to ``rows`` rows of up to k values: the
    values (k bytes a row), their (dx, dx * sum q) per 32, and the rows' sums of squares."""
    return dev.alloc(rows * k), dev.alloc(rows * (k // 32) * 8), dev.alloc(rows * 4)


def matmul_qrows(dev: CLDevice, y: Buffer, y_off: int, ldy: int, x: Buffer, x_off: int,
                 ldx: int, w: Weight, m: int, scratch: tuple[Buffer, Buffer, Buffer], *,
                 bias: Buffer | None = None, accum: bool = False, name: str = "matmul",
                 norm: tuple[Buffer, float] | None = None, glu: bool = False,
                 experts: tuple[Buffer, int] | None = None, act: str = "silu") -> list[Launch]:
    """``matmul``'s product (``norm=``, ``glu=``, ``act=``, ``experts=`` as there) for
    ``int8_batch`` weights as two launches: the rows quantized to int8 (a scale per 32
    values, as the decode row's int8 path quantizes one) into ``scratch``
    (``qrows_scratch``), then every weight chunk read once for TM rows, int8 dot products
    (dp4a; or, where ``qmma_geometry`` gives a geometry, ``matmul_qmma`` of ``qmma.cl`` on the
    int8 tensor cores, ``qrows_rows(dev, w)`` rows a work-group). Both take the row count as
    argument 3 (quantize_rows) and 9 (the product) and on axis 1 of their global size, so a
    plan resizes them. ``experts``: row tiles of
    ``qrows_tile(dev, w)`` rows (m a multiple of it), the product's arguments 13 .. 15 tile_e
    and the strides."""
    if not int8_batch(dev, w):
        raise ValueError(f"matmul_qrows takes {', '.join(INT8_FORMATS)} row-layout weights "
                         f"on an NVIDIA GPU, not {w.fmt} ({w.layout})")
    if norm is not None and glu:
        raise ValueError("matmul: norm= and glu= do not go together")
    xq, xs, ss = scratch
    k = w.k
    if xq.nbytes < m * k or xs.nbytes < m * (k // 32) * 8 or ss.nbytes < m * 4:
        raise ValueError(f"matmul_qrows: the scratch holds fewer than {m} rows of {k} values")
    ls, ncol, cpt, tm, unr = qrows_geometry(dev, w)
    n_out, extra = w.n, list[Any]()
    if experts is not None:
        _, extra = _experts_args(w, m, tm, experts, {"norm=": norm is not None, "glu=": glu})
        n_out = w.n // experts[1]
    xmode = 1 if norm is not None else 2 if glu else 0
    # (one program holds both kernels)
    defines = dict(QROWS=1, QK=k, CHUNKED=1, XMODE=xmode, **_glu_act(glu, act), TM=tm,
                   LSIZE=ls, NCOL=ncol, CPT=cpt,
                   UNR=unr, USE_SHFL=int(use_shfl(dev, ls)), HAS_BIAS=int(bias is not None),
                   ACCUM=int(accum), DP4A=int(dev.probe("nvidia_ptx")), **w.defines,
                   **({"EXPERTS": 1} if experts is not None else {}))
    # (the tensor cores' kernel where it takes the product, qmma.cl: its program holds
    # quantize_rows too)
    mma = qmma_geometry(dev, w) if experts is None else None
    if mma is not None:
        defines.update(QMMA=1, KS=mma[0], RT=mma[1], MMA_PTX=int(dev.probe("nvidia_ptx")))
    qk = kernel(dev, "matmul" if mma is None else "qmma", "quantize_rows", **defines)
    nw = norm[0] if norm is not None else ss
    quant = Launch(qk, (QROWS_LOCAL, m), (QROWS_LOCAL, 1),
                   [x, i32(x_off), i32(ldx), i32(m), nw, xq, xs, ss],
                   [x] + ([norm[0]] if norm is not None else []), [xq, xs, ss],
                   "quantize_rows." + name)
    if mma is not None:
        pk = kernel(dev, "qmma", "matmul_qmma", **defines)
        grid = (math.ceil(n_out / 16) * 32 * mma[0], math.ceil(m / (8 * mma[1])))
        local = (32 * mma[0], 1)
    else:
        pk = kernel(dev, "matmul", "matmul_qrows", **defines)
        cols = math.ceil(n_out / (ncol * cpt)) * ncol
        grid, local = (cols * ls, math.ceil(m / tm)), (ls * ncol, 1)
    prod = Launch(pk, grid, local,
                  [y, i32(y_off), i32(ldy), xq, xs, ss, w.data, w.scales,
                   bias if bias is not None else w.scales, i32(m), i32(n_out), i32(k),
                   f32(norm[1] if norm is not None else 0.0)] + extra,
                  [xq, xs, ss, w.data, w.scales] + ([bias] if bias is not None else [])
                  + ([y] if accum else []) + extra[:1], [y], name)
    return [quant, prod]


# matmul_xmma (xmma.cl): the rows of a tile (its XT) and the columns of a work-group (XN)
XMMA_TILE = 64
XMMA_COLS = 128
# Tests force xmma_takes' answer on any device (the instruction emulated where it has no PTX)
XMMA_OVERRIDE: bool | None = None
# Tuning hook for bench A/B runs: more defines of xmma.cl (XMMA_M4 0: MXFP4 by XQ 4's path)
XMMA_DEFINES: dict[str, int] = {}


def xmma_takes(dev: CLDevice, w: Weight) -> bool:
    """Whether a mixture of experts' grouped products of many rows of one sequence (a
    prompt's) take ``matmul_xmma``: weights in the row layout of any format but float32 (which
    keeps its precision, as in ``tensor_core_rows``) on a GPU with NVIDIA's PTX (its float16
    tensor cores). ``XMMA_OVERRIDE`` (tests): the row layout, any format, any device."""
    if XMMA_OVERRIDE is not None:
        return XMMA_OVERRIDE and w.layout == "rows"
    return w.layout == "rows" and w.fmt != "f32" and not launch.is_cpu(dev) and \
        dev.probe("nvidia_ptx")


def matmul_xmma(dev: CLDevice, y: Buffer, y_off: int, ldy: int, x: Buffer, x_off: int,
                ldx: int, w: Weight, m: int, order: Buffer, experts: tuple[Buffer, int], *,
                gather: int = 0, bias: Buffer | None = None, glu: bool = False,
                act: str = "silu", half_in: bool = False, glu_out: bool = False,
                limit: float = 0.0, alpha: float = 0.0, name: str = "matmul") -> Launch:
    """A mixture of experts' grouped product of m rows (``moe.align``'s slots, m a multiple
    of ``XMMA_TILE``, tile t meeting expert ``experts[0][t]`` of the ``experts[1]`` stacked in
    w, -1: not stored) on the float16 tensor cores (``xmma.cl``): y[s, :N] = a[s, :] . w_e
    (+ bias_e), the rows and the weights rounded to float16 on the way (as the dense prompt's
    tensor-core products round them), float32 sums. ``order``: align's pair of each slot (-1:
    padding, read as zeros); ``gather`` k > 0: row s is row order[s] // k of x (the gathered
    rows without moe.gather), 0: row s of x. ``glu``: act(x[s, :K]) * x[s, K:2K] in place of
    x (``act`` a key of ``GLU_ACTS``). ``half_in``: x holds float16 rows (x_off, ldx in
    halves, multiples of 8), without ``glu``. ``glu_out``: w_e holds [gate | up] rows (N = 2F)
    and y gets float16 rows act(gate) * up [m][F] (y_off, ldy in halves): the GLU in the
    product's epilogue; ``limit`` > 0 with it: gpt-oss's clamped GLU of that limit and
    ``alpha`` (as ``activation.glu`` takes them) in place of act. The row count is argument 9,
    the tiles axis 1 of the global size."""
    if w.layout != "rows":
        raise ValueError(f"matmul_xmma takes row-layout weights, not {w.layout}")
    if half_in and (glu or x_off % 8 or ldx % 8):
        raise ValueError("matmul_xmma: half_in= takes rows of float16 at multiples of 8 "
                         "values, without glu=")
    if limit and not glu_out:
        raise ValueError("matmul_xmma: limit= (a clamped GLU) goes with glu_out= only")
    clamp = _glu_clamp(limit, alpha)
    tm, extra = _experts_args(w, m, XMMA_TILE, experts, {})
    n_out = w.n // experts[1]
    knl = kernel(dev, "xmma", "matmul_xmma", XMMA=1, EXPERTS=1, CHUNKED=1, XG=int(gather > 0),
                 KP=max(gather, 1), XMODE=2 if glu else 0, XH=int(half_in),
                 XGLU=int(glu_out), **_glu_act(glu or glu_out, act), **clamp,
                 HAS_BIAS=int(bias is not None), MMA_PTX=int(dev.probe("nvidia_ptx")),
                 # (DP4A: NVIDIA's byte permutes for IQ4's table in XQ 4, as dequant_half)
                 **({"DP4A": int(dev.probe("nvidia_ptx"))} if w.defines.get("KQT") else {}),
                 **w.defines, **XMMA_DEFINES)
    args = [y, i32(y_off), i32(ldy), x, i32(x_off), i32(ldx), w.data, w.scales,
            bias if bias is not None else w.scales, i32(m), i32(n_out), i32(w.k), order] + extra
    reads = [x, w.data, w.scales, order, extra[0]] + ([bias] if bias is not None else [])
    return Launch(knl, (math.ceil(n_out / XMMA_COLS) * 256, m // tm), (256, 1), args, reads,
                  [y], name)


QROWS_LOCAL = 128  # quantize_rows' work-group (matmul.cl QR_LOCAL)

GLU_ACTS = {"silu": 0, "gelu_tanh": 1}  # the gates' activations ``glu=`` takes (GLU_ACT)


def _glu_act(glu: bool, act: str) -> dict[str, int]:
    """The define of a folded GLU's activation (none for SiLU, the kernels' default)."""
    if act not in GLU_ACTS:
        raise ValueError(f"matmul: glu= takes the activations {sorted(GLU_ACTS)}, not {act!r}")
    return {"GLU_ACT": GLU_ACTS[act]} if glu and act != "silu" else {}


def _glu_clamp(limit: float, alpha: float) -> dict[str, str]:
    """The defines of gpt-oss's clamped GLU (none where ``limit`` is 0)."""
    return {"GLU_LIMIT": float_define(limit), "GLU_ALPHA": float_define(alpha)} if limit \
        else {}


def fused_prologues(dev: CLDevice) -> bool:
    """Whether ``matmul`` takes ``norm=`` and ``glu=`` on this device (GPU kernels only)."""
    return not launch.is_cpu(dev)


def expert_strides(w: Weight, n_experts: int) -> tuple[int, int]:
    """(values, scales): the elements of ``w.data`` and of ``w.scales`` (in the kernels'
    element types) between one expert's weights and the next's, for a weight holding
    ``n_experts`` experts' rows stacked (expert e's rows e * N .. e * N + N - 1, N = w.n /
    n_experts a multiple of 16, so that the CPU layout's blocks of 16 rows never straddle two
    experts): N * k values (q4: N * k / 2 bytes) and N * k / group scales (q4: a (scale, min)
    pair per 32, Q4_SYM the scale alone; q8m a pair per group; float formats and the compact
    K-quants, whose rows hold their scales, none)."""
    if n_experts < 1 or w.n % n_experts or (w.n // n_experts) % 16:
        raise ValueError(f"matmul: {w.n} rows do not split into {n_experts} experts of a "
                         "multiple of 16 rows")
    d = w.defines
    n = w.n // n_experts
    if w.fmt in GEOMETRY_FORMAT:  # (the compact K-quants: whole rows, their scales inside)
        return n * (w.data.nbytes // w.n), 0
    if w.fmt in FLOAT_FORMATS:
        return n * w.k, 0
    if w.fmt == "q4":
        return n * w.k // 2, n * (w.k // 32) * (1 if d.get("Q4_SYM") else 2)
    group = int(d.get("QGROUP", 32))
    return n * w.k, n * (w.k // group) * (2 if d.get("QMIN") else 1)


def _experts_args(w: Weight, m: int, tm: int | None, experts: tuple[Buffer, int],
                  refused: dict[str, bool]) -> tuple[int, list[Any]]:
    """The row tile, and the trailing arguments (tile_e, strides) of an ``experts`` product;
    what it does not take refused."""
    for what, given in refused.items():
        if given:
            raise ValueError(f"matmul: {what} does not go with experts= (a grouped product of "
                             "a mixture of experts)")
    if tm is None or tm < 1 or m % tm:
        raise ValueError(f"matmul: experts= needs tm= (the rows of a tile of tile_e), dividing "
                         f"the {m} rows")
    tile_e, n_experts = experts
    ws, ss = expert_strides(w, n_experts)
    if max(ws, ss) >= 1 << 31:
        raise ValueError(f"matmul: experts of {ws} values do not fit the kernels' int strides")
    return tm, [tile_e, i32(ws), i32(ss)]


def matmul(dev: CLDevice, y: Buffer, y_off: int, ldy: int, x: Buffer, x_off: int, ldx: int,
           w: Weight, m: int, *, bias: Buffer | None = None, accum: bool = False,
           name: str = "matmul", norm: tuple[Buffer, float] | None = None,
           glu: bool = False, tm: int | None = None, row_invariant: bool = False,
           glu_out: bool = False, experts: tuple[Buffer, int] | None = None,
           slot_sum: tuple[Buffer, Buffer, Buffer, bool] | None = None,
           route: tuple[Buffer, Buffer, bool] | None = None, act: str = "silu",
           limit: float = 0.0, alpha: float = 0.0) -> Launch:
    """y[i, j] (+)= x[i, :] . w[j, :] (+ bias[j]) for i < m, j < w.n.

    ``tm`` (rows of x per work-item) overrides the geometry's choice for m > 1.
    ``row_invariant``: a row's sums are added in the same order whatever ``tm`` and m (the
    batch engine: a sequence's tokens do not depend on the others in its batch); on GPUs one
    row then takes the geometry of several and never the int8 rows.
    ``glu_out`` (CPU layout, ``glu_output``): w is [gate | up] and y gets w.n / 2 columns,
    silu(gate) * up (the GLU folded into the product that makes its input).

    Where ``fused_prologues(dev)``: ``norm=(weight, eps)`` puts RMSNorm(x) * weight in place
    of x, and ``glu=True`` puts act(x[i, :k]) * x[i, k:2k] (rows [gate | up]; ``act`` a key
    of ``GLU_ACTS``, SiLU by default) in place of x, saving the launch (and the round trip
    through memory) of the norm or the GLU; ``limit`` > 0 with ``glu``: gpt-oss's clamped
    GLU of that limit and ``alpha`` (as ``activation.glu`` takes them) in place of act's.

    ``experts=(tile_e, E)``: a mixture of experts' grouped product. w holds E experts' weights
    stacked (w.n = E * N rows, N a multiple of 16; ``bias``, where given, E * N values), y gets
    N columns, and row tile t (rows t * tm .. t * tm + tm - 1; ``tm`` required, dividing m)
    meets expert ``tile_e[t]`` (int32, m / tm of them; -1: a padding tile, not stored).
    ``norm=`` and ``glu=`` where the weights are in the GPUs' row layout (each tile's rows
    normed or their GLU taken in the product's prologue), never ``glu_out=``; never the native
    CPU products; the int8 rows of the GPU decode path (``int8_activations``) with tiles of
    one row (``tm=1``: row t meets expert tile_e[t], a lone decode row's slots) where the sums
    need not be ``row_invariant``. The kernel's arguments 14 .. 16
    are then tile_e and the per-expert strides (``expert_strides``); argument 9 stays m, and
    the row tiles' axis of the global size (1; ``matmul_rb``: 0) holds m / tm.

    ``slot_sum=(out, wts, count, accum)`` (``int8_slots``: experts on the int8 decode
    path): out[:N] (``accum``: +=) also gets the sum over the m rows of y, in row order, each
    weighed by wts[row] (``moe.combine`` of a lone row's slots) from the last work-group of
    each column block to finish; ``count``: int32 zeros, one a work-group (N of them are
    enough), left zero.

    ``route=(logits, wts, norm)`` (the same path): the m rows are a lone row's slots, and
    each work-group picks its slot's expert from the row's E router logits itself (the top m,
    as ``moe.route`` of k = m picks them) instead of reading tile_e, into which the first
    work-group of each slot writes it (and its weight into wts, ``moe.route``'s ``norm``) for
    the launches after it: the top-k without a launch of its own."""
    if norm is not None and glu:
        raise ValueError("matmul: norm= and glu= do not go together")
    if limit and not glu:
        raise ValueError("matmul: limit= (a clamped GLU) goes with glu= only")
    if experts is not None:
        _experts_args(w, m, tm, experts, {
            "glu_out=": glu_out, "norm= (the CPU layout)": norm is not None and
            w.layout == "rb16", "glu= (the CPU layout)": glu and w.layout == "rb16"})
    if w.layout == "rb16":
        if glu:
            raise ValueError("matmul: glu= (the GLU of x) needs a GPU; on CPUs the product "
                             "that makes the GLU's input takes glu_out=")
        return matmul_rb(dev, y, y_off, ldy, x, x_off, ldx, w, m, bias=bias, accum=accum,
                         name=name, tm=tm, row_invariant=row_invariant, norm=norm,
                         glu_out=glu_out, experts=experts)
    if glu_out:
        raise ValueError("matmul: glu_out= needs weights in the CPU layout (glu_output)")
    if (norm is not None or glu) and not fused_prologues(dev):
        raise ValueError("matmul: norm= and glu= need a GPU or the CPU layout (see "
                         "fused_prologues)")
    n_out = w.n
    extra: list[Any] = []
    # (row_invariant: the geometry of several rows for one row too, whose teams would add in
    # another order)
    tm0, ls = matmul_geometry(dev, max(m, 2) if row_invariant else m, w.k, w.fmt)
    if experts is not None:
        tm, extra = _experts_args(w, m, tm, experts, {})
        n_out = w.n // experts[1]
    else:
        tm = tm if tm is not None and m > 1 else tm0 if m > 1 else 1
    rows = matmul_rows(dev, n_out) if ls == 1 and m == 1 else 1
    cpt = matmul_cpt(dev, m, n_out, w.fmt)
    ncol = matmul_columns(dev, ls, n_out, cpt)
    qx: dict[str, int] = {}
    cb = 1
    if w.int8 and not row_invariant and (experts is None or tm == 1) and \
            int8_activations(dev, 1 if experts is not None else m, w.fmt, w.k):
        # (experts: a tile a row, each its expert's one-row product: a lone decode row's k
        # slots)
        ls, ncol, cpt, unr, cb, pipe = (qx_geometry if experts is None else
                                        qx_slot_geometry)(dev, n_out, w.k, w.fmt)
        qx = {"QX": 1, "QK": w.k, "UNR": unr, "CB": cb, "PIPE": pipe,
              "DP4A": int(dev.probe("nvidia_ptx"))}
    sums: dict[str, int] = {}
    if route is not None:
        if not qx or experts is None:
            raise ValueError("matmul: route= takes experts= on the int8 decode path "
                             "(int8_slots)")
        sums.update(ROUTE=1, ROUTE_E=experts[1], TOPK=m, ROUTE_NORM=int(route[2]))
    if slot_sum is not None:
        if not qx or experts is None:
            raise ValueError("matmul: slot_sum= takes experts= on the int8 decode path "
                             "(int8_slots)")
        if slot_sum[2].nbytes < 4 * n_out:
            raise ValueError(f"matmul: slot_sum='s counters hold {slot_sum[2].nbytes // 4} "
                             f"int32, a product of {n_out} columns needs {n_out}")
        sums.update(SLOTSUM=2 if slot_sum[3] else 1, PTX_FENCE=int(dev.probe("nvidia_ptx")))
    # (teams of several warps add up their warps' shuffled sums in local memory)
    shfl = use_shfl(dev, ls)
    knl = kernel(dev, "matmul", "matmul", TM=tm, LSIZE=ls, ROWS=rows, NCOL=ncol, **qx, **sums,
                 USE_SHFL=int(shfl), CHUNKED=int(not launch.is_cpu(dev)),
                 X_ALIGNED=int(not launch.is_cpu(dev) and x_off % 4 == 0 and ldx % 4 == 0),
                 CPT=cpt, XMODE=1 if norm is not None else 2 if glu else 0,
                 **_glu_act(glu and not limit, act), **_glu_clamp(limit, alpha),
                 HAS_BIAS=int(bias is not None), ACCUM=int(accum),
                 **w.defines,
                 **({"EXPERTS": 1} if experts is not None else {}))
    args, reads = _matmul_args(y, y_off, ldy, x, x_off, ldx, w, m, bias, accum, norm, n_out)
    args += extra
    reads += extra[:1]
    writes = [y]
    if slot_sum is not None:
        out, wts, count, add = slot_sum
        args += [out, wts, count]
        reads += [wts, count] + ([out] if add else [])
        writes += [out, count]
    if route is not None:
        args += [route[0], route[1]]
        reads += [route[0]]
        writes += [experts[0], route[1]] if experts is not None else []
    tiles = math.ceil(m / tm)
    # PERF: on CPUs one work-item per group: PoCL would otherwise vectorize across
    # work-items, turning each one's contiguous row loads into gathers.
    # (prefill tiles measured faster with the driver's choice)
    # (QX: the kernel's required group, also for a lone row's k slots)
    local = (ls * ncol, 1) if ls > 1 or m == 1 or qx else None
    cols = math.ceil(n_out / rows) if ncol == 1 else math.ceil(n_out / ncol) * ncol
    if cpt > 1 or cb > 1:
        cols = math.ceil(n_out / (ncol * cpt * cb)) * ncol
    return Launch(knl, (cols * ls, tiles), local, args, reads, writes, name)


def int8_slots(dev: CLDevice, w: Weight) -> bool:
    """Whether ``matmul``'s experts product of a lone row's slots (tiles of one row, sums
    not row-invariant) of ``w`` takes the int8 decode path, and with it ``slot_sum=`` and
    ``route=``."""
    return w.int8 and w.layout == "rows" and int8_activations(dev, 1, w.fmt, w.k)


def _matmul_args(y: Buffer, y_off: int, ldy: int, x: Buffer, x_off: int, ldx: int,
                 w: Weight, m: int, bias: Buffer | None, accum: bool,
                 norm: tuple[Buffer, float] | None,
                 n: int | None = None) -> tuple[list[Any], list[Buffer]]:
    """The arguments of matmul.cl's and matmul_cpu.cl's kernels (the same list; ``n`` the
    output columns, w.n unless given) and the buffers they read."""
    args = [y, i32(y_off), i32(ldy), x, i32(x_off), i32(ldx), w.data, w.scales,
            bias if bias is not None else w.scales, i32(m), i32(w.n if n is None else n),
            i32(w.k), norm[0] if norm is not None else w.scales,
            f32(norm[1] if norm is not None else 0)]
    reads = [x, w.data, w.scales] + ([bias] if bias is not None else []) + ([y] if accum else [])
    if norm is not None:
        reads.append(norm[0])
    return args, reads


def rb_rows(m: int, fmt: str = "q4", dev: CLDevice | None = None) -> int:
    """Rows of x per work-item of ``matmul_cpu.cl`` (TM): one for a decode row, else up to 8
    (each dequantized weight vector meets them all from registers), float weights up to 4
    (with ``rb_columns`` blocks at once; 2 on a CPU of 8-wide vectors, ``launch.narrow_cpu``),
    never more than m."""
    if fmt in FLOAT_FORMATS:
        most = RB_FLOAT_ROWS_NARROW if launch.narrow_cpu(dev) else RB_FLOAT_ROWS
    else:
        most = RB_ROWS_MAX
    return min(most, pow2_at_most(m))


def rb_columns(fmt: str, tm: int, dev: CLDevice | None = None) -> int:
    """Blocks of 16 output columns a work-item of ``matmul_cpu.cl`` computes at once (NBC):
    for float weights and 2..RB_FLOAT_ROWS rows per work-item (registers for their sums), 3 on
    Intel's CPU runtime, else 2 (2 on a CPU of 8-wide vectors); 1 otherwise.

    PERF (2-core EPYC Zen 5, a 1B F16 prompt of 64 tokens, 4 rows a work-item): 3 blocks on
    Intel's runtime 190-195 -> 203-207 tok/s (the products 411 -> 440 GFLOP/s); on PoCL 3.1
    185-191 -> 170-172; 4 blocks spill (162 on Intel's). PERF (2-core EPYC with AVX2, no
    AVX-512, f16 16384x2048 with 64 rows, GFLOP/s): Intel's runtime (4 rows, 3 blocks) 63,
    (4, 2) 67, (4, 1) 57, (2, 2) 83-89, (8, 1) 68; PoCL 3.1 (4, 2) 64, (4, 1) 98, (2, 2)
    88-91, (8, 1) 71."""
    if fmt not in FLOAT_FORMATS or not 1 < tm <= RB_FLOAT_ROWS:
        return 1
    if launch.narrow_cpu(dev):
        return 2
    return 3 if dev is not None and dev.backend == "intel" else 2


# PERF (2-core EPYC, PoCL 3.1, q4 3072x576 with 64 rows): 8 rows per work-item 1.77 ms,
# 16 rows 1.76 ms but slower at other shapes (registers), 4 rows 2.26 ms
RB_ROWS_MAX = 8
# PERF (2-core EPYC, Intel's runtime, f16 16384x2048 with 64 rows): 4 rows and 2 blocks of
# columns per work-item 401 GFLOP/s, 8 rows and one block 329, 8 and 2 (spilled) 306
RB_FLOAT_ROWS = 4
# the same on a CPU of 8-wide vectors (launch.narrow_cpu; rb_columns)
RB_FLOAT_ROWS_NARROW = 2
# PERF (same machine): from this many rows the weights are dequantized once for all of them;
# for one row (decode) the integer sums scaled per group are 10-15% faster (q4 and q8)
RB_DEQ_ROWS = 4


def matmul_rb(dev: CLDevice, y: Buffer, y_off: int, ldy: int, x: Buffer, x_off: int, ldx: int,
              w: Weight, m: int, *, bias: Buffer | None = None, accum: bool = False,
              name: str = "matmul", tm: int | None = None, row_invariant: bool = False,
              norm: tuple[Buffer, float] | None = None, glu_out: bool = False,
              experts: tuple[Buffer, int] | None = None) -> Launch:
    """``matmul`` for a weight in the CPU layout (``w.layout == "rb16"``): a work-item per
    block of 16 output columns and ``tm`` rows of x (``matmul_cpu.cl``). Quantized weights
    meet one row of x as integers scaled once per group, several rows dequantized (each row's
    sums in another order); ``row_invariant`` takes the second way for every ``tm``.
    ``norm=(weight, eps)``: RMSNorm(x) * weight in place of x; ``glu_out``, ``experts``: see
    ``matmul`` (an experts product always takes matmul_cpu.cl, never the native kernels)."""
    n_out = w.n // 2 if glu_out else w.n
    extra: list[Any] = []
    if experts is not None:
        tm, extra = _experts_args(w, m, tm, experts, {"norm=": norm is not None,
                                                      "glu_out=": glu_out})
        n_out = w.n // experts[1]
    if glu_out and not glu_output(w):
        raise ValueError(f"matmul: glu_out= needs [gate | up] weights of 2 x a multiple of 16 "
                         f"rows, not {w.n}")
    if glu_out and accum:
        raise ValueError("matmul: glu_out= and accum= do not go together")
    if experts is None and (native_cpu.takes(dev, w) or
                            (not row_invariant and native_cpu.takes_float(dev, w, m))):
        # PERF: integer dot products (AVX-512 VNNI, AVX2) on int8 rows of x, a row's sums in one
        # order whatever the rows (row_invariant holds); float16 weights natively for a
        # decode step's few rows, or on AVX2 for any rows (the batch engine's plans,
        # row_invariant, keep matmul_cpu.cl for every row count)
        args, reads = _matmul_args(y, y_off, ldy, x, x_off, ldx, w, m, bias, accum, norm)
        return native_cpu.matmul(dev, args, reads, y, w, bias=bias is not None, accum=accum,
                                 norm=norm is not None, glu_out=glu_out, name=name)
    tm = tm if tm is not None and m > 1 else rb_rows(m, w.fmt, dev)
    if tm > m:
        raise ValueError(f"matmul_rb: {tm} rows per work-item for {m} rows (at most m)")
    nbc = rb_columns(w.fmt, tm, dev)
    # (the row stride as a constant where several rows are read: immediate offsets; fma()
    # where the device reports fused multiply-add: PoCL compiles mad() to a multiply and an
    # add)
    nbw = rb_blocks(dev, n_out) if tm == 1 else 1
    knl = kernel(dev, "matmul_cpu", "matmul_rb", TM=tm, LDX=ldx if tm > 1 else 0, NBW=nbw,
                 NBC=nbc, NORM=int(norm is not None), GLU=int(glu_out),
                 HAS_BIAS=int(bias is not None),
                 ACCUM=int(accum), TM_DEQ=1 if row_invariant else RB_DEQ_ROWS,
                 HW_FMA=int(dev.caps.fma), **w.defines,
                 **({"EXPERTS": 1} if experts is not None else {}))
    args, reads = _matmul_args(y, y_off, ldy, x, x_off, ldx, w, m, bias, accum, norm,
                               None if experts is None else n_out)
    args += extra
    reads += extra[:1]
    # PERF: one work-item per group (PoCL would otherwise vectorize across work-items, turning
    # the 16-wide loads into gathers); the row tiles of one block next to each other, so that
    # its weights are read from cache by all but the first
    return Launch(knl, (math.ceil(m / tm), math.ceil(n_out / (16 * nbw * nbc))), (1, 1), args,
                  reads, [y], name)


def glu_output(w: Weight) -> bool:
    """Whether the product with ``w`` ([gate | up] rows) can give the GLU itself
    (``matmul(glu_out=True)``): the CPU layout, halves of a multiple of 16 rows."""
    return w.layout == "rb16" and w.n % 32 == 0


def fused_norm(dev: CLDevice, w: Weight, m: int = 1) -> bool:
    """Whether ``matmul`` should take ``norm=`` for this weight and m rows: GPU kernels, or
    the CPU layout for one row.

    PERF (2-core EPYC, PoCL 3.1, SmolLM2): folded into a decode row's products the norm saves
    its launch; a 64-row chunk's qkv and gate_up products took 11.7 -> 18.2 and 37 -> 55 ms
    with it folded in (the normalized values of 8 rows per work-item staged through the
    stack), against 1.5 ms for the norms' own launches. The native products (``native_cpu``)
    take it for any rows: their threads normalize the rows as they make them int8 or copy
    them, so a prompt's norms cost no launches of their own there."""
    if fused_prologues(dev):
        return True
    return w.layout == "rb16" and (m == 1 or native_cpu.takes(dev, w)
                                   or native_cpu.takes_float(dev, w, m))


def rb_blocks(dev: CLDevice, n: int) -> int:
    """Blocks of 16 columns per work-item of ``matmul_cpu.cl`` for one row (NBW): fewer
    work-groups to schedule, while leaving RB_ITEMS_PER_UNIT work-items per compute unit."""
    if RB_BLOCKS is not None:
        return RB_BLOCKS
    blocks = -(-n // 16)
    return max(1, min(RB_BLOCKS_MAX, pow2_at_most(blocks // (RB_ITEMS_PER_UNIT *
                                                             dev.caps.compute_units))))


RB_BLOCKS: int | None = None  # tuning hook for bench sweeps
RB_BLOCKS_MAX = 8
RB_ITEMS_PER_UNIT = 8


# PERF: from this many rows a product runs on tensor cores (float16 copies of the rows and,
# unless float16 already, of the weight, then gemm_nt_mma) instead of the matmul kernel's row
# tiles: a prompt's projections.
TENSOR_CORE_ROWS = 16


def tensor_core_rows(dev: CLDevice, m: int, w: Weight) -> bool:
    """Whether ``linear`` can run these m rows through ``gemm.cl``'s ``gemm_nt_mma``: float16,
    bfloat16 or block-quantized weights (float32 ones keep their precision on the matmul
    kernel) with n % 64 == 0 and k % 32 == 0, on a GPU whose tensor cores the PTX probe found."""
    return (m >= TENSOR_CORE_ROWS and w.fmt != "f32" and w.n % 64 == 0 and w.k % 32 == 0
            and not launch.is_cpu(dev) and _gemm.use_mma(dev, "float16"))


def dequant_half(dev: CLDevice, out: Buffer, w: Weight) -> Launch:
    """out [n][k] = w as float16 (any format, row-major layout)."""
    if w.layout != "rows":
        raise ValueError(f"dequant_half reads row-major weights, not {w.layout!r}")
    # (DP4A: NVIDIA's PTX, for IQ4's table)
    knl = kernel(dev, "matmul", "dequant_half", **w.defines,
                 **({"DP4A": int(dev.probe("nvidia_ptx"))} if w.defines.get("KQT") else {}))
    return Launch(knl, (w.k // 8, w.n), None, [out, w.data, w.scales, i32(w.k)],
                  [w.data, w.scales], [out], "dequant_half")


def half_scratch_nbytes(m: int, k: int) -> int:
    """Bytes of the float16 rows ``linear`` stages for m rows of k features."""
    return m * k * 2


# tensor-core products of few tiles split k until they make this many work-groups a compute
# unit: gemm_nt_mma's, gemm_nt_wgmma's (PERF, H200, a 1B body's products of 128 and 512 rows:
# one a compute unit, not two, 0-36% faster, the split's sums included)
SPLIT_GROUPS_PER_CU = 2
SPLIT_GROUPS_PER_CU_WGMMA = 1


def tensor_core_split(dev: CLDevice, m: int, n: int, k: int) -> int:
    """Slices of k for the tensor-core product (a power of two): enough work-groups for two
    (wgmma: one) per compute unit (wgmma products of up to ``gemm.NT_SMALL_M`` rows: as many
    as one wave holds), slices of at least 512 (and a whole number of the kernel's depth)."""
    cfg = _gemm.nt_config(dev, m, n, k)
    bm, bn, depth = (cfg["BM"], cfg["BN"], cfg["BK"]) if cfg else (64, 64, 32)
    fill = SPLIT_GROUPS_PER_CU_WGMMA if cfg else SPLIT_GROUPS_PER_CU
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    # (small prompts on wgmma: at most one wave, gemm.NT_SMALL_M)
    wave = cfg is not None and m <= _gemm.NT_SMALL_M
    split = 1
    while ((tiles * split * 2 <= dev.caps.compute_units if wave
            else tiles * split < fill * dev.caps.compute_units)
           and k % (2 * depth * split) == 0
           and k // (2 * split) >= 512):
        split *= 2
    return split


def _half_copy_nbytes(w: Weight) -> int:
    """Bytes of the float16 copy a tensor-core product of w converts it into (0: w is float16
    or keeps a copy, ``w.half``)."""
    return w.n * w.k * 2 if w.fmt != "f16" and w.half is None else 0


def tensor_core_route(dev: CLDevice, m: int, w: Weight, wscratch: Buffer | None) -> bool:
    """Whether ``linear`` runs m rows of w as a tensor-core product: ``tensor_core_rows``, and a
    float16 copy of w kept (``w.half``, float16 weights) or ``wscratch`` large enough for
    one (or none given: allocated)."""
    return tensor_core_rows(dev, m, w) and (wscratch is None
                                            or wscratch.nbytes >= _half_copy_nbytes(w))


def glu_half_rows(dev: CLDevice, m: int, w: Weight) -> bool:
    """Whether ``linear(glu_half=True)`` takes m rows of w ([gate | up] rows): a tensor-core
    product on ``gemm_nt_wgmma`` in one slice of k, whose epilogue gives the GLU's float16
    rows itself."""
    if not tensor_core_rows(dev, m, w):
        return False
    cfg = _gemm.nt_config(dev, m, w.n, w.k)
    return (cfg is not None and not cfg.get("WS") and w.n % cfg["BN"] == 0
            and tensor_core_split(dev, m, w.n, w.k) == 1)


def product_slices(dev: CLDevice, m: int, w: Weight, wscratch: Buffer | None) -> int:
    """Slices of k ``linear`` splits m rows of w into (1: none), as it decides."""
    return tensor_core_split(dev, m, w.n, w.k) if tensor_core_route(dev, m, w, wscratch) else 1


def split_nbytes(dev: CLDevice, m: int, w: Weight) -> int:
    """Bytes of the partial sums ``linear`` keeps for m rows of w's product (0: no split)."""
    if not tensor_core_rows(dev, m, w):
        return 0
    split = tensor_core_split(dev, m, w.n, w.k)
    return split * m * w.n * 4 if split > 1 else 0


def linear(dev: CLDevice, y: Buffer, y_off: int, ldy: int, x: Buffer, x_off: int, ldx: int,
           w: Weight, m: int, *, bias: Buffer | None = None, accum: bool = False,
           name: str = "matmul", norm: tuple[Buffer, float] | None = None, glu: bool = False,
           scratch: Buffer | None = None, wscratch: Buffer | None = None,
           pscratch: Buffer | None = None, glu_out: bool = False, glu_half: bool = False,
           half_in: bool = False,
           norm_after: tuple[Buffer, float, Buffer] | None = None,
           keep_slices: bool = False, act: str = "silu") -> list[Launch]:
    """The launches of ``matmul``'s product (same arguments): that one kernel, or where
    ``tensor_core_rows`` holds, the rows to float16 (norm or GLU applied on the way) into
    ``scratch``, a weight not in float16 to float16 into ``wscratch`` (too small: the matmul
    kernel runs instead) unless it keeps a float16 copy (``w.half``), a tensor-core product,
    and for a product split over k the sum of its slices' partial sums (kept in
    ``pscratch``). Scratch buffers missing or too small (but ``wscratch``) are allocated
    here. Tensor-core products only: ``glu_half`` (where ``glu_half_rows`` holds) makes y
    the float16 rows silu(gate) * up [m][n / 2] of w's [gate | up] rows (y_off, ldy in
    halves); ``half_in``: x holds float16 rows [m][k] already (ldx apart from its start),
    which the product reads as they are; ``norm_after`` (weight, eps, out), with ``accum``:
    then out [m][n] = float16 rows of RMSNorm(y's rows) * weight, the next product's input
    (``half_in``), made by the sum of a split product's slices in the same pass.
    ``keep_slices``: a product split over k (``product_slices`` > 1) leaves its partial sums
    [split][m][n] in ``pscratch`` for the next launch to add up as it reads them (y is not
    written); without bias, accumulation or norm_after."""
    k = w.k
    wneed = _half_copy_nbytes(w)
    tc = tensor_core_route(dev, m, w, wscratch)
    if glu_half and (bias is not None or accum or glu or glu_out or not tc
                     or not glu_half_rows(dev, m, w)):
        raise ValueError(f"linear {name}: glu_half takes a tensor-core product in one slice "
                         "of k (glu_half_rows) without bias, accumulation or GLU prologue")
    if half_in and (norm is not None or glu or glu_out or x_off or not tc):
        raise ValueError(f"linear {name}: half_in takes a tensor-core product of float16 rows "
                         "from their buffer's start, with no norm or GLU prologue")
    if norm_after is not None and (not accum or bias is not None or glu_half or w.n % 4
                                   or not tc):
        raise ValueError(f"linear {name}: norm_after takes a tensor-core product accumulated "
                         "into y, without bias, of a multiple of 4 outputs")
    if keep_slices and (bias is not None or accum or norm_after is not None):
        raise ValueError(f"linear {name}: keep_slices takes a product without bias, "
                         "accumulation or norm_after")
    if not tc:
        return [matmul(dev, y, y_off, ldy, x, x_off, ldx, w, m, bias=bias, accum=accum,
                       name=name, norm=norm, glu=glu, glu_out=glu_out, act=act)]
    if glu and act != "silu":
        raise ValueError(f"linear {name}: a tensor-core product's GLU prologue is SiLU's, "
                         f"not {act!r}")
    out: list[Launch] = []
    b_half = w.half if w.half is not None else w.data
    if wneed:
        if wscratch is None:
            wscratch = dev.alloc(wneed)
        out.append(dequant_half(dev, wscratch, w))
        out[-1].name = "dequant_half." + name
        b_half = wscratch
    lda = k
    if half_in:
        scratch, lda = x, ldx
    else:
        if scratch is None or scratch.nbytes < half_scratch_nbytes(m, k):
            scratch = dev.alloc(half_scratch_nbytes(m, k))
        out.append(half_rows(dev, scratch, x, x_off, ldx, k=k, m=m, norm=norm, glu=glu))
        out[-1].name = "half_rows." + name
    # PERF: few tiles of C over a long k (Llama-3.2-1B's o and down projections of a prompt
    # chunk: 64 tiles, k 2048 and 8192) split k; the slices' sums are added up in order by
    # split_sum (no atomics: the same prompt gives the same logits every time)
    split = tensor_core_split(dev, m, w.n, k)
    flags = {"HAS_BIAS": int(bias is not None), "ACCUM": int(accum)}
    bias_arg = bias if bias is not None else b_half
    if split > 1:
        need = split_nbytes(dev, m, w)
        if keep_slices and (pscratch is None or pscratch.nbytes < need):
            raise ValueError(f"linear {name}: keep_slices needs pscratch of {need} bytes for "
                             "the partial sums")
        if pscratch is None or pscratch.nbytes < need:
            pscratch = dev.alloc(need)
        c, c_off, ldc = pscratch, 0, w.n
    else:
        c, c_off, ldc = y, y_off, ldy
    # PERF (Hopper): wgmma tiles of 128 (or 64) x 128, where they divide the product or leave
    # little past its columns (gemm.nt_config)
    cfg = _gemm.nt_config(dev, m, w.n, k)
    knl = _gemm.nt_wgmma_kernel(dev, cfg, split, bias is not None, accum,
                                glu_half) if cfg else None
    if knl is not None and cfg is not None:
        bm, bn, group = cfg["BM"], cfg["BN"], _gemm.wg_threads(cfg)
    elif glu_half:
        raise RuntimeError(f"linear {name}: gemm_nt_wgmma with the GLU epilogue did not build")
    else:
        knl = kernel(dev, "gemm", "gemm_nt_mma", USE_MMA=1, SPLIT=split, **flags)
        bm, bn, group = 64, 64, 128
    reads = [scratch, b_half] + ([bias] if bias is not None else []) + (
        [y] if accum and split == 1 else [])
    out.append(Launch(knl, (math.ceil(w.n / bn) * group, math.ceil(m / bm), split),
                      (group, 1, 1),
                      [c, i32(c_off), i32(ldc), scratch, i32(lda), b_half, i32(k), bias_arg,
                       i32(m), i32(w.n), i32(k), np.int64(m * w.n)], reads, [c], name))
    if split > 1 and norm_after is not None:
        assert pscratch is not None
        nw, eps, hout = norm_after
        out.append(split_norm_half(dev, hout, y, y_off, ldy, pscratch, split, nw, k=w.n, m=m,
                                   eps=eps))
        out[-1].name = "split_norm_half." + name
    elif split > 1 and not keep_slices:
        assert pscratch is not None
        knl = kernel(dev, "norm", "split_sum", **flags)
        out.append(Launch(knl, (w.n // 4, m), None, [y, i32(y_off), i32(ldy), pscratch,
                                                     i32(split), bias_arg],
                          [pscratch] + ([bias] if bias is not None else []) +
                          ([y] if accum else []), [y], "split_sum." + name))
    if split == 1 and norm_after is not None:
        nw, eps, hout = norm_after
        out.append(half_rows(dev, hout, y, y_off, ldy, k=w.n, m=m, norm=(nw, eps)))
        out[-1].name = "half_rows.after." + name
    return out


def embedding(dev: CLDevice, out: Buffer, tokens: Buffer, state: Buffer, w: Weight,
              m: int) -> Launch:
    """out[i, :] = w[tokens[state[0] + i], :] for i < m."""
    if w.layout == "rb16":
        knl = kernel(dev, "matmul_cpu", "embedding_rb", **w.defines)
    else:
        knl = kernel(dev, "matmul", "embedding", **w.defines)
    args = [out, tokens, state, w.data, w.scales, i32(w.k), i32(w.n)]
    return Launch(knl, (w.k // 32, m), None, args, [tokens, state, w.data, w.scales], [out],
                  "embedding")
