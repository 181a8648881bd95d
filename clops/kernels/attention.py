"""Kernels, attention: launches of ``attention.cl``: rotary embedding and the KV cache store,
split-KV decode attention (with its combine; fused with rotation and the store where the
device allows), the CPU decode kernel, prefill attention."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..runtime import CLDevice
from ..runtime.pool import Buffer
from . import gemm as _gemm
from . import launch
from .launch import Launch, f32, float_define, i32, kernel


def kv_defines(kv_half: bool) -> dict[str, Any]:
    """The defines of a cache of float16 values (``kv_half``; clops/kv.cl), else float32."""
    return {"KV_HALF": 1} if kv_half else {}


def tile_defines(dev: CLDevice) -> dict[str, Any]:
    """attention.cl's TILE_REGS 0 on CPUs (key and value tiles copied straight into local
    memory; Intel's CPU runtime gave other values from run to run with them held in registers
    across a barrier), nothing elsewhere (its default 1: the next tile loading meanwhile)."""
    return {"TILE_REGS": 0} if launch.is_cpu(dev) else {}


def kv_nbytes(n_kv: int, max_seq: int, head_dim: int, kv_half: bool) -> int:
    """The bytes of one layer's key (or value) cache [n_kv][max_seq][head_dim]."""
    return n_kv * max_seq * head_dim * (2 if kv_half else 4)


def rope_store(dev: CLDevice, q_out: Buffer, qkv: Buffer, ld_qkv: int, kc: Buffer, vc: Buffer,
               state: Buffer, inv_freq: Buffer, *, m: int, n_heads: int, n_kv: int,
               head_dim: int, max_seq: int, neox: bool, rot_dim: int = 0,
               kv_half: bool = False, slices: int = 1) -> Launch:
    """Rotate q and k of m QKV rows (the first ``rot_dim`` dimensions of each head; 0: all),
    q to ``q_out``, k and v into the cache at positions state[0] + row (``kv_half``: a cache
    of float16 values, else float32; the same for every function here that takes a cache).
    ``slices`` > 1: ``qkv`` holds the QKV product split over k, [slices][m][ld_qkv] partial
    sums (``matmul.linear(keep_slices=True)``), added up in order as they are read.
    Picked by ``Model._attention`` for a prompt's rows and a decode row ``attn_decode`` takes."""
    rot = {"ROT_DIM": rot_dim} if rot_dim and rot_dim != head_dim else {}
    if slices > 1:
        rot["SLICES"] = slices
    # PERF (CPUs): a work-item takes every head, making each angle's sine and cosine once
    # (2-core EPYC, Intel's runtime, a 1B prompt chunk of 64 rows: 13.8 -> 6.6 ms); GPUs: up
    # to 8 heads (H200, a 1B body's 512 rows: 20 us a layer with one head a work-item, most
    # of it the sines and cosines of large angles)
    heads = n_heads + 2 * n_kv
    per = heads if launch.is_cpu(dev) else max(d for d in range(1, 9) if heads % d == 0)
    knl = kernel(dev, "attention", "rope_store", HEAD_DIM=head_dim, ROPE_NEOX=int(neox),
                 HEADS_PER_ITEM=per, **rot, **kv_defines(kv_half))
    args = [q_out, qkv, i32(ld_qkv), kc, vc, state, inv_freq, i32(n_heads), i32(n_kv),
            i32(max_seq)]
    return Launch(knl, (head_dim // 2, heads // per, m), None, args,
                  [qkv, state, inv_freq], [q_out, kc, vc], "rope_store")


def rope(dev: CLDevice, x: Buffer, x_off: int, ld: int, pos: Buffer, inv_freq: Buffer, *,
         m: int, heads: int, head_dim: int, neox: bool) -> Launch:
    """Rotate, in place, m rows of ``heads`` heads (rows ``ld`` apart) at positions ``pos``.
    Picked by ``nn.functional.rope`` (no model plan)."""
    knl = kernel(dev, "attention", "rope", HEAD_DIM=head_dim, ROPE_NEOX=int(neox))
    return Launch(knl, (head_dim // 2, heads, m), None, [x, i32(x_off), i32(ld), pos, inv_freq],
                  [x, pos, inv_freq], [x], "rope")


def kv_store(dev: CLDevice, kc: Buffer, vc: Buffer, k: Buffer, k_off: int, v: Buffer,
             v_off: int, *, pos: int, m: int, n_kv: int, head_dim: int, max_seq: int,
             kv_half: bool = False) -> Launch:
    """Store m rows of keys and values ``[m, n_kv, head_dim]`` (float32, at element offsets
    ``k_off``, ``v_off``) into the caches ``[n_kv, max_seq, head_dim]`` at positions
    ``pos ..``. Picked by ``nn.functional.KVCache.append`` (no model plan)."""
    knl = kernel(dev, "attention", "kv_store", HEAD_DIM=head_dim, **kv_defines(kv_half))
    args = [kc, vc, k, i32(k_off), v, i32(v_off), i32(pos), i32(max_seq)]
    return Launch(knl, (head_dim, n_kv, m), None, args, [k, v], [kc, vc], "kv_store")


def decode_chunk(dev: CLDevice, max_seq: int, n_heads: int) -> tuple[int, int]:
    """(chunk, splits) of the split-KV decode attention: enough work-items to fill the device
    at full length, chunks no shorter than 32 positions."""
    if not launch.is_cpu(dev):
        # GPUs: work-groups of CHUNK positions (attn_decode_wg); empty ones exit at once.
        # NOTE (H100, 1B body, float16 cache): a row past 16384 positions decoded at 522
        # tok/s with chunks of a span's 32nd (1024 there), against 827 with a 128th when each
        # head's work-items took a share of every row for all heads (a change since taken out;
        # the two were not measured apart). That kernel alone at 16383 positions: 512 30 us,
        # 256 42 us, 128 48 us, 1024 40 us. A 128th stays until measured with these kernels.
        chunk = max(64, 1 << (math.ceil(max_seq / 128) - 1).bit_length())
        return chunk, math.ceil(max_seq / chunk)
    want = max(1, (dev.caps.compute_units * 4) // max(n_heads, 1))
    chunk = max(32, math.ceil(max_seq / want))
    return chunk, math.ceil(max_seq / chunk)


def _attn_combine(dev: CLDevice, out: Buffer, part: Buffer, state: Buffer, head_dim: int,
                  n_heads: int, chunk: int, splits: int) -> Launch:
    """The combine of a split decode attention's partials into out [H][D]. Picked by
    ``attn_decode``, and by ``attn_decode_rope`` where not ``decode_combines``."""
    knl = kernel(dev, "attention", "attn_combine", HEAD_DIM=head_dim)
    return Launch(knl, (head_dim, n_heads), None, [out, part, state, i32(chunk), i32(splits)],
                  [part, state], [out], "attn_combine")


def sink_defines(sinks: Buffer | None) -> dict[str, Any]:
    """The defines of a sink logit a query head (``sinks``, float32 [n_heads]; gpt-oss), whose
    kernels take ``sinks`` as their last argument; none without."""
    return {"SINKS": 1} if sinks is not None else {}


def sink_args(sinks: Buffer | None) -> list[Buffer]:
    """The last argument (and a read) of a kernel built with ``sink_defines(sinks)``."""
    return [sinks] if sinks is not None else []


def _score_defines(softcap: float, window: int) -> dict[str, Any]:
    out: dict[str, Any] = {"SOFTCAP": float_define(softcap)} if softcap else {}
    if window:
        out["WINDOW"] = int(window)
    return out


def attn_decode(dev: CLDevice, out: Buffer, part: Buffer, q: Buffer, kc: Buffer, vc: Buffer,
                state: Buffer, *, n_heads: int, n_kv: int, head_dim: int, max_seq: int,
                scale: float, softcap: float = 0.0, window: int = 0,
                kv_half: bool = False, sinks: Buffer | None = None) -> list[Launch]:
    """Attention of one query row over the cache: split over positions, then combined.
    ``softcap``: scores soft-capped to (-softcap, softcap); ``window``: the last ``window``
    positions only (both take the one-work-item-per-split kernel); ``sinks``: float32
    [n_heads], a sink logit a head (gpt-oss: exp(sinks[h]) one more term of the softmax's
    denominator, with no value), taken by the head's first split that attends to any position,
    so that the combine counts it once (the combine itself is the same). Picked by
    ``Model._attention`` for a decode row that neither ``attn_decode_cpu`` nor
    ``attn_decode_rope`` takes (capped, windowed, sinks, partial rotary, or neither
    ``cpu_decode`` nor ``fused_decode``), and by ``nn.functional.KVCache.attend``."""
    chunk, splits = decode_chunk(dev, max_seq, n_heads)
    a1 = [part, q, kc, vc, state, i32(max_seq), i32(chunk), i32(n_heads // n_kv), f32(scale),
          *sink_args(sinks)]
    if softcap or window or not fused_decode(dev, head_dim):
        # one work-item per split (no work-group of head_dim work-items, or scores capped or
        # windowed, which attn_decode_wg does not do)
        k1 = kernel(dev, "attention", "attn_decode", HEAD_DIM=head_dim,
                    **_score_defines(softcap, window), **kv_defines(kv_half),
                    **sink_defines(sinks))
        g1, l1 = (splits, n_heads), None
    else:
        k1 = kernel(dev, "attention", "attn_decode_wg", HEAD_DIM=head_dim, CHUNK=chunk,
                    **kv_defines(kv_half), **sink_defines(sinks), **tile_defines(dev))
        g1, l1 = (splits * head_dim, n_heads), (head_dim, 1)
    return [Launch(k1, g1, l1, a1, [q, kc, vc, state, *sink_args(sinks)], [part], "attn_decode"),
            _attn_combine(dev, out, part, state, head_dim, n_heads, chunk, splits)]


def fused_decode(dev: CLDevice, head_dim: int) -> bool:
    """Whether decode attention runs as attn_decode_rope (rotation, cache store and attention
    in one launch): GPUs, with a work-group of head_dim work-items."""
    return (not launch.is_cpu(dev) and head_dim <= dev.caps.max_work_group
            and head_dim & (head_dim - 1) == 0)


def decode_combines(dev: CLDevice) -> bool:
    """Whether the last work-group of a head may combine the others' partials in the same
    launch: where a device-wide fence is known to order them (NVIDIA through PTX; PoCL's CPU
    threads share coherent memory). Elsewhere attn_combine runs as its own launch."""
    return launch.is_cpu(dev) or dev.probe("nvidia_ptx")


# attn_decode_rope: a work-group per key-value head (for all its query heads) where it fits
PER_KV_HEAD = True

# Tuning hook for bench sweeps (None: the launcher's choice): the query heads a work-group of
# attn_decode_rope (NREP, dividing the heads a key-value head serves)
DECODE_NREP_OVERRIDE: int | None = None


def _decode_fits(dev: CLDevice, head_dim: int, nrep: int, chunk: int) -> bool:
    """Whether attn_decode_rope's work-group for nrep query heads fits the device: its
    work-items, and its local arrays (qs, kn, p, red and the tile kt)."""
    tile = head_dim if head_dim <= 64 else 4096 // head_dim
    floats = 2 * nrep * head_dim + head_dim + nrep * chunk + tile * (head_dim + 4)
    return head_dim * nrep <= dev.caps.max_work_group and 4 * floats + 64 <= dev.caps.local_mem


def decode_nrep(dev: CLDevice, head_dim: int, n_rep: int, chunk: int, span: int) -> int:
    """The query heads a work-group of ``attn_decode_rope`` (of the ``n_rep`` a key-value head
    serves): the most that divide n_rep and fit the device, in work-groups of 512 work-items
    at most, and of two heads at most where the row attends to 2048 positions or fewer.

    PERF: a work-group for the query heads of a key-value head reads each key and value row
    once for them (H200, 1B Q4_0, 32 query heads over 8: 1217 -> 1372 tok/s at 128 positions,
    751 -> 864 at 1000, 742 -> 992 at 4000, 384 -> 704 at 16000); but at short spans the
    rows are few and cached, and more, smaller work-groups finish sooner (H200, back to back
    over copies of a float16 cache, us a launch at 176 / 1024 / 4096 / 16384 positions,
    ``bench_kernels.py --only decode_rope``, ``bench/results/decode_rope_h200.json``):
    Qwen3-30B-A3B's 32 heads of 128 over 4, all 8 a group 14.3 / 17.5 / 42.3 / 75.5, 4 a group
    11.3 / 16.2 / 35.7 / 69.7, 2 a group 10.5 / 14.1 / 36.4 / 96.3; Llama 3 8B's 32 over 8,
    4 a group 10.0 / 14.9 / 35.4 / 70.3, 2 9.6 / 14.0 / 35.6 / 78.2; Llama 3.2 1B's heads of
    64, 4 a group 7.8 / 8.9 / 17.8 / 38.8, 2 7.7 / 8.8 / 20.7 / 53.6."""
    if not PER_KV_HEAD:
        return 1
    most = min(n_rep, max(1, 512 // head_dim), 2 if span <= 2048 else n_rep)
    return max(r for r in range(1, most + 1)
               if n_rep % r == 0 and (r == 1 or _decode_fits(dev, head_dim, r, chunk)))


def folds_qk_norm(head_dim: int) -> bool:
    """Whether the rotating kernels (``attn_decode_rope``, ``paged.rope_store``) take a
    per-head QK-norm: heads of a power of two dimensions (their sums halve in local
    memory)."""
    return head_dim >= 2 and head_dim & (head_dim - 1) == 0


def attn_decode_rope(dev: CLDevice, out: Buffer, part: Buffer, count: Buffer, qkv: Buffer,
                     kc: Buffer, vc: Buffer, state: Buffer, inv_freq: Buffer, *, n_heads: int,
                     n_kv: int, head_dim: int, max_seq: int, scale: float, neox: bool,
                     chunk: int | None = None, combine: bool | None = None,
                     positions: int | None = None, kv_half: bool = False,
                     qk_norm: tuple[Buffer, Buffer, float] | None = None,
                     softcap: float = 0.0, window: int = 0,
                     paged: Any = None, sinks: Buffer | None = None) -> list[Launch]:
    """Decode attention of one row straight from the QKV projection ``qkv`` ([q | k | v] of
    the row at position state[0], before rotation): rotates q and k, stores k and v in the
    cache and attends, in one launch where ``decode_combines`` (``count``: n_heads int32,
    zero, left zero), else two. ``out`` is [H][D]. ``positions``: the most positions the
    row attends to in any replay (state[0] + 1 at most that; default ``max_seq``): the
    launch has work-groups for those chunks only. ``qk_norm`` (weights wq, wk [head_dim],
    eps; heads of a power of two, ``folds_qk_norm``): q and k are RMS-normed a head before
    the rotation, as ``norm.qk_norm`` does per head (Qwen3), one launch fewer. ``softcap``
    and ``window`` (Gemma's capped scores, a sliding window: the last ``window`` positions)
    as ``attn_decode`` takes them; a window only where the launch combines its partials
    itself. ``paged`` (a ``paged.PagedRows``, which imports this module): kc and vc are a
    paged cache's pools (``paged.cl``), the row the first of ``paged`` (its slot's blocks,
    its position ``paged.positions[0]``, which ``state`` must be), ``max_seq`` the most
    positions it may reach (a batched engine's row alone). ``sinks`` as ``attn_decode``
    takes them (folded into the head's first chunk that takes part). Picked by
    ``Model._attention`` for a decode row of whole-head rotary where ``fused_decode`` holds,
    and by ``BatchEngine``'s plan of a decode row alone."""
    if qk_norm is not None and not folds_qk_norm(head_dim):
        raise ValueError(f"attn_decode_rope: the QK-norm folds into heads of a power of two "
                         f"dimensions, not {head_dim}")
    if paged is not None and state is not paged.positions:
        raise ValueError("attn_decode_rope: a paged row's position is paged.positions[0]: "
                         "pass it as state")
    if chunk is None:
        # PERF: chunks sized by the positions the row attends to, not by the cache (a 1B Q4_0
        # decode on an H200 at 128 positions: 1383 tok/s with a cache of 4096 positions, whose
        # chunks are 64 long, 1185 with a cache of 16512, whose chunks are 256 long), and no
        # work-groups past the last chunk
        chunk, splits = decode_chunk(dev, min(positions or max_seq, max_seq), n_heads)
    else:
        splits = math.ceil(min(positions or max_seq, max_seq) / chunk)
    if combine is None:
        combine = decode_combines(dev)
    if window and not combine:
        raise ValueError("attn_decode_rope: a windowed row's partials are combined in the "
                         "launch only (decode_combines)")
    ptx = combine and not launch.is_cpu(dev) and dev.probe("nvidia_ptx")
    n_rep = n_heads // n_kv
    nrep = DECODE_NREP_OVERRIDE
    if nrep is None:
        nrep = decode_nrep(dev, head_dim, n_rep, chunk, min(positions or max_seq, max_seq))
    elif n_rep % nrep or not _decode_fits(dev, head_dim, nrep, chunk):
        raise ValueError(f"attn_decode_rope: {nrep} query heads a work-group do not divide "
                         f"{n_rep} or do not fit the device")
    k1 = kernel(dev, "attention", "attn_decode_rope", HEAD_DIM=head_dim, CHUNK=chunk,
                ROPE_NEOX=int(neox), COMBINE=int(combine), PTX_FENCE=int(ptx), NREP=nrep,
                **({"QKNORM": 1} if qk_norm is not None else {}),
                **({"PAGED": 1} if paged is not None else {}), **_score_defines(softcap, window),
                **kv_defines(kv_half), **tile_defines(dev), **sink_defines(sinks))
    a1 = [out, part, count, qkv, kc, vc, state, inv_freq, i32(max_seq),
          i32(n_rep), i32(n_heads), i32(n_kv), f32(scale)]
    reads: list[Buffer] = []
    if paged is not None:
        a1 += [paged.table, i32(paged.max_blocks), paged.slots, i32(paged.block_size)]
        reads += [paged.table, paged.slots]
    if qk_norm is not None:
        a1 += [qk_norm[0], qk_norm[1], f32(qk_norm[2])]
        reads += [qk_norm[0], qk_norm[1]]
    a1 += sink_args(sinks)
    reads += sink_args(sinks)
    launches = [Launch(k1, (splits * head_dim * nrep, n_heads // nrep), (head_dim * nrep, 1), a1,
                       [qkv, kc, vc, state, inv_freq, count, *reads],
                       [out, part, kc, vc, count], "attn_decode")]
    if not combine:
        launches.append(_attn_combine(dev, out, part, state, head_dim, n_heads, chunk, splits))
    return launches


def decode_rope_follows(dev: CLDevice, ln: Launch, *, context: int, n_heads: int
                        ) -> Callable[[int, int | None], tuple[list[tuple[int, Any]],
                                                               tuple[int, ...]]]:
    """How a launch of ``attn_decode_rope`` made for ``context`` positions (a paged row's)
    follows a step's span: ``at(rows, span)`` gives its global size for a row that attends
    to at most ``span`` positions (None: ``context``): the chunks the span takes (rounded up
    to a power of two, so that a growing span resizes the launch rarely), not the whole
    context's. The row's values do not change: its chunks, and the combine's count of them,
    are the same."""
    chunk, splits = decode_chunk(dev, context, n_heads)
    g = ln.global_size

    def at(rows: int, span: int | None) -> tuple[list[tuple[int, Any]], tuple[int, ...]]:
        return [], (span_chunks(chunk, splits, span) * g[0] // splits, *g[1:])

    return at


def span_chunks(chunk: int, splits: int, span: int | None) -> int:
    """The chunks (of ``chunk`` positions, ``splits`` of them for the context:
    ``decode_chunk``'s) a launch takes for rows that attend to at most ``span`` positions
    (None: the context): the span rounded up to a power of two (so that a growing span
    resizes a launch rarely), the context's chunks at most."""
    if span is None:
        return splits
    return min(splits, -(-(1 << max(0, span - 1).bit_length()) // chunk))


def cpu_vectors(dev: CLDevice) -> bool:
    """A CPU whose runtime builds and runs 16-wide vector kernels (the CPU product probe):
    the CPU attention kernels and weight layout."""
    return launch.is_cpu(dev) and _gemm.cpu_kernel_works(dev, "float32")


def cpu_decode(dev: CLDevice, head_dim: int) -> bool:
    """Whether decode attention runs as attn_decode_cpu (rotation, cache store and attention
    of a layer in one launch, a work-item per query head): CPUs that pass the product probe,
    heads of a multiple of 16."""
    return head_dim % 16 == 0 and cpu_vectors(dev)


def attn_decode_cpu(dev: CLDevice, out: Buffer, qkv: Buffer, kc: Buffer, vc: Buffer,
                    state: Buffer, inv_freq: Buffer, *, n_heads: int, n_kv: int, head_dim: int,
                    max_seq: int, scale: float, neox: bool, kv_half: bool = False) -> Launch:
    """Decode attention of one row straight from the QKV projection on CPUs: rotation, the
    cache store and attention in one launch (``out`` is [H][D]). Picked by
    ``Model._attention`` for a plain decode row where ``cpu_decode`` holds and the native
    kernel does not (float16 caches, or ``native_cpu.takes_attention`` false)."""
    knl = kernel(dev, "attention", "attn_decode_cpu", HEAD_DIM=head_dim, ROPE_NEOX=int(neox),
                 CPU_VEC=1, **kv_defines(kv_half))
    args = [out, qkv, kc, vc, state, inv_freq, i32(max_seq), i32(n_heads // n_kv),
            i32(n_heads), i32(n_kv), f32(scale)]
    return Launch(knl, (n_heads,), (1,), args, [qkv, kc, vc, state, inv_freq], [out, kc, vc],
                  "attn_decode")


def part_nbytes(dev: CLDevice, max_seq: int, n_heads: int, head_dim: int) -> int:
    """The decode attention's partials for a cache of ``max_seq`` positions, at any of the
    spans ``attn_decode_rope`` may be given (powers of two below it: their chunks are
    shorter)."""
    spans = [max_seq] + [1 << e for e in range(max_seq.bit_length()) if 1 << e < max_seq]
    splits = max(decode_chunk(dev, s, n_heads)[1] for s in spans)
    return n_heads * splits * (head_dim + 2) * 4


def prefill_mma(dev: CLDevice, head_dim: int) -> bool:
    """Whether ``attn_prefill(half=True)`` runs on tensor cores (``attn_prefill_mma``): NVIDIA
    GPUs whose mma.sync the PTX probe found, heads of 16 to 128 dimensions in 16s."""
    return (not launch.is_cpu(dev) and head_dim % 16 == 0 and head_dim <= 128
            and _gemm.use_mma(dev, "float16"))


def prefill_half_out(dev: CLDevice, head_dim: int, half: bool, softcap: float = 0.0,
                     window: int = 0) -> bool:
    """Whether ``attn_prefill(half_out=True)`` takes these rows: the tensor-core kernel."""
    return half and not softcap and not window and prefill_mma(dev, head_dim)


def attn_prefill(dev: CLDevice, out: Buffer, q: Buffer, q_off: int, ld_q: int, kc: Buffer,
                 vc: Buffer, k_off: int, v_off: int, kv_stride: int, state: Buffer, *,
                 pos_add: int, causal: bool, n_keys: int, m: int, n_heads: int, n_kv: int,
                 head_dim: int, scale: float, softcap: float = 0.0, window: int = 0,
                 half: bool = False, kv_half: bool = False, half_out: bool = False,
                 sinks: Buffer | None = None) -> Launch:
    """Attention of m query rows; ``softcap``, ``window`` and ``sinks`` as in attn_decode (a
    causal window: the keys (pos - window, pos] of each row; every kernel here takes sinks).
    ``half``: q, k, v and the softmax weights may be rounded to float16 for tensor cores
    (``prefill_mma``), as an LLM's prompt takes them; else float32 throughout. ``half_out``
    (where ``prefill_half_out`` holds): out takes the rows as float16 values. Picked by
    ``Model._attention`` for a prompt's rows, and by ``nn.functional``'s attention."""
    if half_out and not prefill_half_out(dev, head_dim, half, softcap, window):
        raise ValueError("attn_prefill: float16 output rows come from the tensor-core kernel "
                         "only (half=True, no cap or window, prefill_mma)")
    args = [out, q, i32(q_off), i32(ld_q), kc, vc, i32(k_off), i32(v_off), i32(kv_stride),
            state, i32(pos_add), i32(int(causal)), i32(n_keys), i32(n_heads // n_kv),
            f32(scale)]
    reads = [q, kc, vc, state, *sink_args(sinks)]
    defs = {**kv_defines(kv_half), **sink_defines(sinks)}
    # (the sinks, where given, are every kernel's last argument: after M where it has one)
    sink = sink_args(sinks)
    mma = half and prefill_mma(dev, head_dim) and not softcap and (causal or not window)
    if softcap or window and not mma:
        # PERF: capped scores (and windowed ones off the tensor cores) take the
        # work-item-per-row kernel on GPUs too
        knl = kernel(dev, "attention", "attn_prefill", HEAD_DIM=head_dim,
                     **_score_defines(softcap, window), **defs)
        return Launch(knl, (m, n_heads), None, args + sink, reads, [out], "attn_prefill")
    if mma:
        # PERF (H200, Llama-3.2-1B body, a prompt of 512 rows): 198 -> 32 us a layer; (gpt-oss's
        # windowed layers too: the tiles before a row group's window skipped)
        knl = kernel(dev, "attention", "attn_prefill_mma", HEAD_DIM=head_dim, PREFILL_MMA=1,
                     **({"HALF_OUT": 1} if half_out else {}), **_score_defines(0.0, window),
                     **defs)
        return Launch(knl, (math.ceil(m / 64) * 128, n_heads), (128, 1),
                      args + [i32(m), *sink], reads, [out], "attn_prefill")
    if not launch.is_cpu(dev) and head_dim % 8 == 0:
        # PERF: GPUs: 16 rows per work-group share each tile of keys and values through local
        # memory (a work-item per row and head walked every key alone: 0.5 ms a layer for 128
        # rows of Llama-3.2-1B on an H100)
        knl = kernel(dev, "attention", "attn_prefill_wg", HEAD_DIM=head_dim, PREFILL_WG=1, **defs)
        return Launch(knl, (math.ceil(m / 16) * 128, n_heads), (128, 1),
                      args + [i32(m), *sink], reads, [out], "attn_prefill")
    if head_dim % 16 == 0 and cpu_vectors(dev):
        # PERF (CPUs): 16-wide arithmetic, one exp per key, a work-item per group (rows of
        # different lengths vectorized across work-items ran slower on PoCL)
        knl = kernel(dev, "attention", "attn_prefill", HEAD_DIM=head_dim, CPU_VEC=1, **defs)
        return Launch(knl, (m, n_heads), (1, 1), args + sink, reads, [out], "attn_prefill")
    knl = kernel(dev, "attention", "attn_prefill", HEAD_DIM=head_dim, **defs)
    return Launch(knl, (m, n_heads), None, args + sink, reads, [out], "attn_prefill")
