"""Kernels, decoder layers: ``layer.cl``'s ``decode_layers``, a decode step's decoder layers
(QKV projection, rotation, the cache store, attention, the output projection, the GLU and the
down projection, each added to the residual stream), up to ``max_layers`` of them in one
launch of work-groups that all run at once and meet at grid barriers, where the per-layer plan
takes five launches a layer. Used where ``resident_groups`` finds the device runs that many
work-groups together (the probe launches them and checks every barrier) and the layers'
weights are 4- or 8-bit with a scale per 32, or float16."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _config
from ..runtime import CLDevice, probes
from ..runtime.pool import Buffer
from . import launch, layout
from .attention import kv_defines
from .launch import Launch, f32, i32, kernel
from .matmul import Weight
from .operand import Operand
from .paged import PagedRows

LS = 256  # work-items a group (layer.cl)
FORMATS = {"q4": 3, "q8": 4, "f16": 5}
# Spins of a grid barrier before a work-group gives up on the others (and says so in bar[2]):
# the probe's short, so that a device that cannot hold every group at once fails it quickly
PROBE_SPINS = 1 << 18
RUN_SPINS = 1 << 24
PROBE_ROUNDS = 16
# Attention's splits of a key-value head's positions in decode_layers, a work-group each: at
# most SPLITS (None: the launch's work-groups over the key-value heads), of SPLIT_MIN positions
# at least (rounded up to the kernel's tiles of 32); one split while a round of the
# work-group's warps covers the positions (256)
SPLITS: int | None = None
SPLIT_MIN = 64
# Profiling: launches built while TRACE is on write the GPU's clock as each work-group arrives
# at a grid barrier and leaves it (NVIDIA only), into a barrier buffer of ``bar_nbytes(True)``
# bytes; ``read_trace`` reads them back
TRACE = False
TRACE_RING = 256  # the barriers a trace keeps, the latest (layer.cl)
MAX_GROUPS = 1024  # work-groups a traced launch may have (bar_nbytes)
ATT_POINTS = 4  # the clock points inside attention a traced launch keeps, a layer (layer.cl)
# Measurement (bench/profile_layers.py): more -D defines for decode_layers' builds, such as
# PHASES (the phases that run) or a switch of a kernel variant under test; none of the defines
# the launch computes (sizes, formats, splits)
EXTRA_DEFINES: dict[str, int] = {}


def enabled() -> bool:
    """Whether ``decode_layers`` serves where it runs: on unless ``CLOPS_LAYER_KERNEL=0``. On
    H100s (2026-11-26) against the per-layer plan: SmolLM2 1.6-2.2x (the plan's 153 launches a
    token are bound by the driver's enqueues); the 1B Q4_0 body after 128 / 1024 / 4096 / 16384
    positions 1480 / 1404 / 1260 / 924 tok/s against 928 / 906 / 894 / 797 in one run."""
    return _config.layer_kernel()


def float16_weights() -> bool:
    """Whether ``decode_layers`` takes float16 weights: on unless ``CLOPS_LAYER_KERNEL_F16=0``.
    PERF (H100, 1B F16 body, decode tok/s, one machine whose host enqueues fast, 2026-11-26):
    after 128 positions 853-861 through the kernel against 866-877 through the per-layer plan,
    after 4096 764-769 against 687-765, after 16384 659-661 against 610; on a host that enqueued
    half as fast the plan's 83 launches a token fell to 743 after 128 positions (1.15 ms of
    enqueues a token), where the kernel's 5 are bound by the device. Its rows are summed by
    tensor cores (the float conversions of a float32 sum took as long). With its [gate | up]
    and down phases pipelined (layer.cl's PIPE, 2026-11-27) the kernel gives 976-981 after 128
    positions and 852-855 after 4096 (``bench/profile_layers.py trace`` after 128 positions, the
    slowest work-group and the release after: gate/up 24.5 + 0.8 us for 67 MB a layer, 2.7
    TB/s; down 14.6 + 1.0 for 34 MB; attention 6.6 + 1.0)."""
    return _config.layer_kernel_f16()


def fused_down() -> bool:
    """Whether ``decode_layers`` may run the down projection inside the [gate | up] phase
    (layer.cl's DFUSE; ``fuses_down``): on unless ``CLOPS_FUSE_DOWN=0``."""
    return _config.fuse_down()


@probes.per_device
def resident_groups(dev: CLDevice) -> int:
    """Work-groups of ``LS`` work-items the device runs all at once, found by launching that
    many at grid barriers (one a compute unit); 0 where the probe fails or the device is a
    CPU (whose runtimes give no such promise; the native and CPU kernels serve them)."""
    if not _ptx(dev):
        return 0
    n = dev.caps.compute_units
    return n if grid_barriers_work(dev, n) else 0


def grid_barriers_work(dev: CLDevice, groups: int) -> bool:
    """Whether ``groups`` work-groups of ``grid_probe`` pass PROBE_ROUNDS grid barriers, each
    seeing every group's write of the round before it."""
    knl = kernel(dev, "layer", "grid_probe", **_probe_defines(_ptx(dev)))
    bar = dev.alloc(16)
    sums = dev.alloc(4 * PROBE_ROUNDS)
    dev.write(bar, np.zeros(4, np.int32), blocking=True)
    dev.write(sums, np.zeros(PROBE_ROUNDS, np.int32), blocking=True)
    dev.launch(knl, (groups * LS,), (LS,), [bar, sums, i32(PROBE_ROUNDS)], reads=[bar, sums],
               writes=[bar, sums], name="grid_probe")
    out = np.empty(4, np.int32)
    dev.read(out, bar, blocking=True)
    return bool(out[2] == 0 and arrivals(out) == groups * PROBE_ROUNDS)


def bar_nbytes(trace: bool = False) -> int:
    """The bytes of a barrier buffer (``decode_layers``' ``bar``): 4 int32, and with ``trace``
    the ring of barrier times and attention's points of up to 16 layers, a launch's most
    (``TRACE``)."""
    return 16 + ((2 * TRACE_RING + 16 * ATT_POINTS) * MAX_GROUPS * 8 if trace else 0)


def read_trace(dev: CLDevice, bar: Buffer, groups: int) -> tuple[int, np.ndarray]:
    """A traced barrier buffer read back: the barriers met since the count began, and the
    work-groups' times (ns) at the latest of them, [barrier, arrive or leave, group], the
    oldest first (TRACE_RING of them at most)."""
    raw = np.empty(bar_nbytes(True) // 4, np.int32)
    dev.read(raw, bar, blocking=True)
    met = arrivals(raw[:4]) // groups
    ring = raw[4:].view(np.uint64)[:2 * TRACE_RING * groups].reshape(TRACE_RING, 2, groups)
    keep = min(met, TRACE_RING)
    order = [(met - keep + i) % TRACE_RING for i in range(keep)]
    return met, ring[order].astype(np.int64)


def read_attention_trace(dev: CLDevice, bar: Buffer, groups: int, layers: int) -> np.ndarray:
    """A traced barrier buffer's attention points (ns) of the latest launch's layers, [layer,
    point, group]: work-item 0 of each work-group's first attention unit at ATT_POINTS points
    (inputs read, tiles used, warps' results in local memory, results stored); work-groups
    without a unit keep older values."""
    raw = np.empty(bar_nbytes(True) // 8 - 2, np.uint64)
    dev.read(raw, bar, blocking=True, offset=16)
    at = 2 * TRACE_RING * groups
    pts = raw[at:at + layers * ATT_POINTS * groups].reshape(layers, ATT_POINTS, groups)
    return pts.astype(np.int64)


def arrivals(bar: np.ndarray) -> int:
    """The grid barriers' count of arrivals in a barrier buffer read back (4 int32: a count
    that only grows, 64 bits on NVIDIA, 32 elsewhere; the timed-out flag): every barrier met
    leaves it a multiple of the launches' work-groups."""
    return int(bar[:2].view(np.uint64)[0])


def _ptx(dev: CLDevice) -> int:
    """layer.cl's PTX: NVIDIA's dp4a, shfl.sync, fences and atomics (a GPU passing the PTX
    probe)."""
    return int(not launch.is_cpu(dev) and dev.probe("nvidia_ptx"))


def _probe_defines(ptx: int) -> dict[str, Any]:
    # the probe needs none of the layer's sizes; any that compile
    return dict(NL=1, DIM=256, HEADS=4, KV_HEADS=2, HEAD_DIM=64, FFN=256, QKMAX=256, WF_QKV=3,
                WF_O=3, WF_GU=3, WF_D=3, SH_QKV=1, SH_O=1, SH_GU=1, SH_D=1, R_QKV=1, R_O=1,
                R_GU=1, R_D=1, ROPE_NEOX=1, PTX=ptx, SPIN_LIMIT=PROBE_SPINS)


def takes(dev: CLDevice, weights: list[Weight], head_dim: int) -> bool:
    """Whether ``decode_layers`` takes a layer of these weights ([qkv, o, gate_up, down]) on
    ``dev``: enabled, work-groups found resident, layers no larger than MAX_DIM and MAX_FFN,
    heads that divide 64 (multiples of 4) or of 128, MAX_REP_DIMS dimensions of query heads a
    key-value head at most, 4- and 8-bit row-major weights with a half or float scale per 32
    values (Q4_0, Q4_1, Q8_0, Q4_K; not Q6_K's 16) whose products may quantize their input to
    int8 (``Weight.int8``), and, where ``float16_weights`` holds, row-major float16 weights
    (whose inputs it keeps as float16 values); all within the device's local memory
    (``local_nbytes``)."""
    if not enabled() or not resident_groups(dev):
        return False
    if (64 % head_dim or head_dim % 4) and head_dim != 128:
        return False
    qkv, o, _, down = weights
    heads = o.k // head_dim
    kv = (qkv.n // head_dim - heads) // 2
    if qkv.k > MAX_DIM or down.k > MAX_FFN or heads < 1 or kv < 1 or heads % kv or \
            heads // kv * head_dim > MAX_REP_DIMS or \
            local_nbytes(qkv.k, heads, kv, head_dim, down.k,
                         any(w.fmt == "f16" for w in weights)) > dev.caps.local_mem:
        return False
    return all(w.layout == "rows" and w.k % 32 == 0 and (
        w.fmt == "f16" and float16_weights()
        or w.fmt in ("q4", "q8") and w.int8 and w.defines.get("SCALE_HALF") in (0, 1)
        and w.defines.get("QGROUP") == 32) for w in weights)


# The largest layers the kernel takes: its phases' rows are dealt for small layers, and the
# heads a work-group's attention unit serves are held in registers. PERF (H200, 2026-11-30,
# bench/bench_layer_ab.py and profile_layers.py trace after 128 positions): a Llama-3.1-8B body
# in Q4_0 (hidden 4096, FFN 14336, 4 query heads of 128 a key-value head) decoded at 223 tok/s
# through the kernel against 473 through the per-layer plan, every phase slower than its
# bytes (a layer: QKV 17.9 us for 14 MB, attention 30.7 at 128 positions, output 10.5, gate/up
# 44.5 for 66 MB, down 35.7 for 33 MB); the Qwen3-0.6B body (hidden 1024, FFN 3072, 2 query
# heads of 128 a key-value head) 1650 against 772, and the 1B bodies (hidden 2048, FFN 8192, 4
# heads of 64) 1.5-2x (kernels/layer.cl's notes)
MAX_DIM, MAX_FFN = 2048, 8192
MAX_REP_DIMS = 256  # query heads a key-value head times their dimensions


def local_nbytes(dim: int, heads: int, kv: int, head_dim: int, ffn: int, f16: bool) -> int:
    """The local memory of a ``decode_layers`` work-group (layer.cl's __local arrays; ``f16``:
    a phase of float16 weights), with 1 KiB for the fused down projection's values (DF_T * NW
    floats: 448 bytes for an FFN of 14336 over 132 work-groups)."""
    qkmax, rep = max(dim, heads * head_dim, ffn), heads // kv
    words = (qkmax // 2 if f16 else qkmax // 4) + 2 * (qkmax // 32) + LS \
        + rep * head_dim + 2 * head_dim + NW * rep * (32 + head_dim + 2) + rep + 2 + NW
    return 4 * words + 1024


# (row, block) pairs a work-item holds in registers (layer.cl). PERF (H100, 1B F16 decode after
# 128 positions, one run, 2026-11-27): 20 slots 973 tok/s, 24 887 (3 stages of the pipelined
# phases 958), against 1047-1055 with 16
SLOTS = 16
# and on NVIDIA for a row that attends to SLOTS_LONG_FROM positions or more (the decode plan's
# span), where every phase's rows fit them: attention takes the registers the weights' leave.
# PERF (H100, decode tok/s, runs of one machine, 2026-11-27, 8 slots against 16): 1B F16 after
# 128 / 200 / 300 positions 1067-1074 / 1062-1065 / 1022-1028 against 1085-1089 / 1081-1088 /
# 1033-1041, after 512 / 1024 / 4096 / 16384 1016-1019 / 993-1000 / 928-929 / 796 against
# 1000-1007 / 979-984 / 890-902 / 745-746; 1B Q4_0 after 128 1872-1880 against 1986-2002, after
# 1024 / 4096 / 16384 1654 / 1465-1466 / 1148-1150 against 1657-1667 / 1454 / 1041-1046. As
# chosen here (8 from spans of 1024), against 16 everywhere: F16 after 4096 / 16384 927 / 795-796
# against 889 / 744, Q4_K 1344-1363 / 1081-1082 against 1304-1315 / 1001-1006, Q4_0 1452-1456 /
# 1136 against 1450-1457 / 1047-1050; Q8_0 (its down rows do not fit 8) and SmolLM2 the same, and
# every model the same after 128 positions
SLOTS_LONG = 8
SLOTS_LONG_FROM = 1024
# The float16 layers' kernel (DFUSE) for spans shorter than SLOTS_LONG_FROM: attention's score
# loop unrolled twice, and the [gate | up] phase's last pairs to the early loaders alone (the
# PERF notes at layer.cl's tile_use and GU_DEAL); EXTRA_DEFINES override them
SHORT_FUSED = {"SCORE_UNROLL": 2, "GU_DEAL": 0}
NW = LS // 32


def rows_per_task(fmt: str, k: int, n: int, groups: int, rows_an_item: int = 1,
                  slots: int | None = None) -> int:
    """Items (rows; [gate | up] pairs: ``rows_an_item`` 2) a warp takes at once in a phase of
    ``n`` items over ``k`` inputs: enough for one round of every warp of ``groups``
    work-groups, no more than a lane's registers hold (SLOTS blocks of q4 (32 values, 16
    bytes), half as many of q8, whose blocks are twice the bytes; SLOTS of f16 (16 values, 32
    bytes): the rows of 8192 that the down projection of a 1B model has); ``slots``: SLOTS
    unless given."""
    slots = SLOTS if slots is None else slots
    lane_blocks = -(-(k // (16 if fmt == "f16" else 32)) // 32)
    cap = (slots // 2 if fmt == "q8" else slots) // (lane_blocks * rows_an_item)
    if cap < 1:
        raise ValueError(f"decode_layers: rows of {k} inputs do not fit a lane's registers")
    return max(1, min(cap, -(-n // (groups * NW))))


def _half(w: Weight) -> int:
    """layer.cl's SH_*: 1 half scales, 0 float; 2 a q4 weight's half scales alone (Q4_SYM)."""
    d = w.defines
    return 2 if d.get("Q4_SYM") else int(d.get("SCALE_HALF") == 1)


def splits_max(dev: CLDevice, n_kv: int) -> int:
    """Attention's splits of a key-value head's positions at most (SPLITS)."""
    return max(1, resident_groups(dev) // n_kv if SPLITS is None else SPLITS)


def units(dev: CLDevice, n_kv: int, positions: int) -> int:
    """Attention's units (work-groups busy in phase B) for a row that attends to ``positions``
    positions: n_kv times the splits of layer.cl's split_len (one while a round of a
    work-group's warps covers them, 256 positions)."""
    if positions <= NW * 32:
        return n_kv
    most = min(splits_max(dev, n_kv), -(-positions // SPLIT_MIN))
    per = (-(-positions // most) + 31) // 32 * 32
    return n_kv * -(-positions // per)


def part_nbytes(dev: CLDevice, max_seq: int, n_heads: int, n_kv: int, head_dim: int) -> int:
    """The attention partials' scratch: a (query head, split) partial each."""
    splits = min(splits_max(dev, n_kv), -(-max_seq // SPLIT_MIN))
    return n_heads * splits * (head_dim + 2) * 4


@dataclass(frozen=True)
class DecoderLayer:
    """A decoder layer's weights and caches as ``decode_layers`` reads them."""

    attn_norm: Buffer
    qkv: Weight
    k_cache: Buffer
    v_cache: Buffer
    inv_freq: Buffer
    o: Weight
    ffn_norm: Buffer
    gate_up: Weight
    down: Weight
    # the down weights' columns as rows ([ffn, dim] float16: ``down_columns``), where the
    # launch fuses the down projection into the [gate | up] phase (``fuses_down``)
    down_cols: Buffer | None = None
    # QK-norm's weights ([head_dim] each: q's heads and k's RMS-normed a head before the
    # rotation, Qwen3), both or neither
    q_norm: Buffer | None = None
    k_norm: Buffer | None = None

    def formats(self) -> tuple[tuple[str, int], ...]:
        """The compile-time formats of its weights (and whether it norms q and k): layers
        alike may share a launch."""
        return tuple((w.fmt, _half(w)) for w in (self.qkv, self.o, self.gate_up, self.down)) \
            + ((("qk_norm", 1),) if self.q_norm is not None else ())


# layers a launch at most (layer.cl's NL): 13 pointer arguments a layer (15 with QK-norm's
# weights) and 11 shared ones (and EMB's and PAGED's three each), within the bytes of arguments
# the device takes (1024 on every OpenCL device: 8 layers)
MAX_LAYERS = 16
_SHARED_ARG_BYTES, _LAYER_ARG_BYTES = 8 * 8 + 3 * 4 + 2 * (2 * 8 + 4), 13 * 8


# bytes of a layer's [gate | up] values from which the output rows are packed (decode_layers)
PACK_MIN_BYTES = 8 << 20


def max_layers(dev: CLDevice, qk_norm: bool = False) -> int:
    """Layers a ``decode_layers`` launch may take on ``dev`` (at most MAX_LAYERS; ``qk_norm``:
    layers with QK-norm's two weights more)."""
    room = max(1024, dev.caps.max_parameter_size) - _SHARED_ARG_BYTES
    return max(1, min(MAX_LAYERS, room // (_LAYER_ARG_BYTES + (16 if qk_norm else 0))))


def takes_embedding(embed: Weight) -> bool:
    """Whether ``decode_layers`` reads the step's embedding row from ``embed`` itself (float16
    rows), so that no embedding launch goes before it."""
    return embed.fmt == "f16" and embed.layout == "rows"


def launch_groups(layers: list[DecoderLayer], most: int) -> list[list[DecoderLayer]]:
    """Consecutive layers of the same formats, ``most`` at most a group (``max_layers``): a
    launch each."""
    groups: list[list[DecoderLayer]] = []
    for ly in layers:
        if groups and len(groups[-1]) < most and \
                groups[-1][0].formats() == ly.formats():
            groups[-1].append(ly)
        else:
            groups.append([ly])
    return groups


_GU_STAGES = 2  # (layer.cl's GU_STAGES)


def fuses_down(dev: CLDevice, gate_up: Weight, down: Weight) -> bool:
    """Whether ``decode_layers`` fuses these layers' down projection into the [gate | up] phase
    (layer.cl's DFUSE), given their down weights' columns (``down_cols``): NVIDIA, float16
    [gate | up] and down weights (pipelined phases), rows of at most 2048 values (a lane's 16
    bytes of each down column in a work-group)."""
    return bool(fused_down() and _ptx(dev) and EXTRA_DEFINES.get("PIPE", 1) != 0
                and EXTRA_DEFINES.get("GU_STAGES", _GU_STAGES) == _GU_STAGES
                and "PHASES" not in EXTRA_DEFINES and gate_up.fmt == "f16"
                and down.fmt == "f16" and down.layout == "rows" and down.n <= 8 * LS)


def down_columns(dev: CLDevice, down: Weight) -> Buffer:
    """The float16 down weights' columns as rows ([k, n]: ``DecoderLayer.down_cols``), a copy
    made on the device."""
    cols = Operand(down.data, (down.k, down.n), "float16", (1, down.k), 0)
    return layout.contiguous(dev, cols).buffer


def decode_layers(dev: CLDevice, layers: list[DecoderLayer], *, x: Buffer, qkv_out: Buffer,
                  state: Buffer, attn: Buffer, part: Buffer, count: Buffer, h: Buffer,
                  bar: Buffer, n_heads: int, n_kv: int, head_dim: int, max_seq: int,
                  eps: float, scale: float, neox: bool, kv_half: bool = False,
                  positions: int | None = None, embed: Weight | None = None,
                  tokens: Buffer | None = None, paged: PagedRows | None = None) -> Launch:
    """Consecutive decoder layers (one to ``max_layers(dev)``, the same ``formats``) of the
    decode row at position state[0] in one launch: x (the residual stream, [dim]) in and out;
    ``qkv_out`` [(H + 2 KV) D], ``attn`` [H*D], ``h`` [ffn] scratch; ``part`` (``part_nbytes``),
    ``count`` (n_heads int32, zero, left zero) and ``bar`` (``bar_nbytes(TRACE)`` bytes, zero at
    first; ``arrivals``) shared by every launch; as many work-groups as the probe found
    resident. ``kv_half``: the layers' caches hold float16 values, else float32. ``positions``:
    the most positions the row attends to (None: ``max_seq``). ``embed`` (``takes_embedding``)
    and ``tokens``: x is first the row of ``embed`` at tokens[state[0]] (the launch reads it;
    x is written). ``paged``: the layers' caches are pools of blocks (``paged.cl``'s), the row
    is the first of ``paged`` (its position ``paged.positions[0]``, which ``state`` must be,
    its token tokens[0]), ``max_seq`` the most positions a sequence has (the batched engine's
    lone decode row)."""
    if TRACE and (bar.nbytes < bar_nbytes(True) or resident_groups(dev) > MAX_GROUPS):
        raise ValueError(f"decode_layers: a traced launch needs a barrier buffer of "
                         f"bar_nbytes(True) = {bar_nbytes(True)} bytes and at most "
                         f"{MAX_GROUPS} work-groups")
    qk_norm = layers[0].q_norm is not None
    if any((ly.q_norm is None) != (ly.k_norm is None) for ly in layers):
        raise ValueError("decode_layers: QK-norm takes both weights, q_norm and k_norm")
    most = max_layers(dev, qk_norm)
    if not 1 <= len(layers) <= most or len({ly.formats() for ly in layers}) != 1:
        raise ValueError(f"decode_layers: 1 to {most} layers of the same formats, not "
                         f"{[ly.formats() for ly in layers]}")
    if embed is not None and (tokens is None or not takes_embedding(embed)):
        raise ValueError("decode_layers: an embedding read in the launch needs float16 rows "
                         "(takes_embedding) and the tokens buffer")
    if paged is not None and state is not paged.positions:
        raise ValueError("decode_layers: a paged row's position is paged.positions[0]: pass "
                         "it as state")
    if part.nbytes < part_nbytes(dev, max_seq, n_heads, n_kv, head_dim):
        raise ValueError(f"decode_layers: the partials' buffer holds {part.nbytes} bytes, "
                         f"attention's splits need part_nbytes(...) = "
                         f"{part_nbytes(dev, max_seq, n_heads, n_kv, head_dim)}")
    first = layers[0]
    qkv, o, gate_up, down = first.qkv, first.o, first.gate_up, first.down
    dim, ffn = o.n, down.k
    groups = resident_groups(dev)
    n_qkv = (n_heads + 2 * n_kv) * head_dim
    # PERF: the output rows in as few work-groups as the registers allow, where those are not
    # attention's: the others load their first [gate | up] weights while attention runs
    # (GUEARLY; H100 decode tok/s after 128 positions, one run: 1B F16 981 -> 1043-1046, Q8_0
    # 1422 -> 1480-1481); where attention's units take most work-groups (long spans) the rows
    # go to every work-group (1B Q4_0 after 4096 positions 1408 with them, 1333-1335 packed),
    # and where the [gate | up] weights are few (SmolLM2's 1 MB a layer: 2190 -> 2011 packed).
    # PACK=0 in EXTRA_DEFINES: never packed.
    # (NVIDIA's float16 [gate | up] and down phases are pipelined, a pair or a row a task)
    pipe = bool(_ptx(dev)) and EXTRA_DEFINES.get("PIPE", 1) != 0

    def rows(slots: int) -> tuple[bool, dict[str, int]]:
        """Whether the output rows are packed, and each phase's rows a task, in ``slots``."""
        r_o = rows_per_task(o.fmt, n_heads * head_dim, dim, 1, slots=slots)
        packed = bool(EXTRA_DEFINES.get("PACK", 1)) and \
            gate_up.data.nbytes >= PACK_MIN_BYTES and \
            units(dev, n_kv, positions or max_seq) + -(-dim // (NW * r_o)) <= groups
        if not packed:
            r_o = rows_per_task(o.fmt, n_heads * head_dim, dim, groups, slots=slots)
        return packed, dict(
            R_QKV=rows_per_task(qkv.fmt, dim, n_qkv, groups, slots=slots), R_O=r_o,
            R_GU=1 if pipe and gate_up.fmt == "f16" else rows_per_task(
                gate_up.fmt, dim, ffn, groups, 2, slots=slots),
            R_D=1 if pipe and down.fmt == "f16" else rows_per_task(down.fmt, ffn, dim, groups,
                                                                   slots=slots),
            SLOTS=slots)

    long = pipe and (positions or max_seq) >= SLOTS_LONG_FROM
    try:
        packed, per = rows(SLOTS_LONG if long else SLOTS)
    except ValueError:
        if not long:
            raise
        packed, per = rows(SLOTS)  # (rows that do not fit SLOTS_LONG's registers)
    # PERF: the down projection inside the [gate | up] phase (DFUSE)
    fuse = all(ly.down_cols is not None for ly in layers) and fuses_down(dev, gate_up, down)
    defines = dict(
        NL=len(layers), DIM=dim, HEADS=n_heads, KV_HEADS=n_kv, HEAD_DIM=head_dim, FFN=ffn,
        QKMAX=max(dim, n_heads * head_dim, ffn),
        WF_QKV=FORMATS[qkv.fmt], WF_O=FORMATS[o.fmt], WF_GU=FORMATS[gate_up.fmt],
        WF_D=FORMATS[down.fmt], SH_QKV=_half(qkv), SH_O=_half(o), SH_GU=_half(gate_up),
        SH_D=_half(down), **per, ROPE_NEOX=int(neox), PTX=_ptx(dev), SPIN_LIMIT=RUN_SPINS,
        SPLITS_MAX=splits_max(dev, n_kv), SPLIT_MIN=SPLIT_MIN, TRACE=int(TRACE),
        EMB=int(embed is not None), DFUSE=int(fuse), QKNORM=int(qk_norm),
        **(dict(PAGED=1, BS=paged.block_size) if paged is not None else {}),
        **(dict(DF_T=-(-ffn // (groups * NW)) + 1) if fuse else {}),
        **({k: v for k, v in SHORT_FUSED.items() if k not in EXTRA_DEFINES}
           if fuse and not long else {}),
        **kv_defines(kv_half))
    if _ptx(dev):
        # (elsewhere the kernel's default, 1: Intel's CPU compiler aborted building the float16
        # layers' portable kernel with 0 after other builds in the same process)
        defines["GUEARLY"] = int(packed)
    fixed = set(defines) & set(EXTRA_DEFINES)
    if fixed:
        raise ValueError(f"decode_layers: EXTRA_DEFINES may not set {sorted(fixed)}: the launch "
                         "computes them (sizes, formats, splits; TRACE is layer.TRACE)")
    knl = kernel(dev, "layer", "decode_layers", **{**defines, **EXTRA_DEFINES})
    args: list[Any] = [x, qkv_out, state, attn, part, count, h, bar, i32(max_seq), f32(eps),
                       f32(scale)]
    reads: list[Buffer] = [x, state, count, bar]
    if embed is not None:
        assert tokens is not None
        if embed.k != dim:
            raise ValueError(f"decode_layers: embedding rows of {embed.k}, the layers' are {dim}")
        args += [tokens, embed.data, i32(embed.n)]
        reads += [tokens, embed.data]
    if paged is not None:
        args += [paged.table, i32(paged.max_blocks), paged.slots]
        reads += [paged.table, paged.slots]
    writes: list[Buffer] = [x, qkv_out, attn, part, count, h, bar]
    for ly in layers:
        down_data = ly.down_cols if fuse and ly.down_cols is not None else ly.down.data
        own = [ly.attn_norm, ly.qkv.data, ly.qkv.scales, ly.k_cache, ly.v_cache, ly.inv_freq,
               ly.o.data, ly.o.scales, ly.ffn_norm, ly.gate_up.data, ly.gate_up.scales,
               down_data, ly.down.scales]
        if ly.q_norm is not None and ly.k_norm is not None:
            own += [ly.q_norm, ly.k_norm]
        args += own
        reads += own
        writes += [ly.k_cache, ly.v_cache]
    return Launch(knl, (groups * LS,), (LS,), args, reads, writes, "decode_layers")
