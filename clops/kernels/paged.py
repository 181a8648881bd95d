"""Kernels, paged KV cache: launches of ``paged.cl`` for batched decoding (``llm.step``):
rotation (whole or partial) with the store of k and v into pool blocks, attention over a
sequence's blocks (with a sliding window and soft-capped scores where a layer has them), and
the gather of chosen rows. Every row's result depends on that row and its sequence's cache
alone, whatever else the step holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..runtime import CLDevice
from ..runtime.pool import Buffer
from . import attention as _attention
from . import launch
from .launch import Launch, f32, float_define, i32, kernel


@dataclass(frozen=True)
class PagedRows:
    """Where the rows of a step live: ``table`` [slots][max_blocks] (the pool block of each
    run of ``block_size`` positions of the sequence in a slot), and per row its slot
    (``slots``) and position (``positions``)."""

    table: Buffer
    max_blocks: int
    slots: Buffer
    positions: Buffer
    block_size: int

    @property
    def args(self) -> list[object]:
        return [self.table, i32(self.max_blocks), self.slots, self.positions]

    @property
    def reads(self) -> list[Buffer]:
        return [self.table, self.slots, self.positions]


def _rot(head_dim: int, rot_dim: int) -> dict[str, int]:
    return {"ROT_DIM": rot_dim} if rot_dim and rot_dim != head_dim else {}


def _scores(softcap: float, window: int) -> dict[str, object]:
    """The defines of soft-capped (``softcap`` > 0) or windowed (``window`` > 0) scores."""
    out: dict[str, object] = {"SOFTCAP": float_define(softcap)} if softcap else {}
    if window:
        out["WINDOW"] = int(window)
    return out


def rope_store(dev: CLDevice, q_out: Buffer, qkv: Buffer, ld_qkv: int, kp: Buffer, vp: Buffer,
               rows: PagedRows, inv_freq: Buffer, *, m: int, n_heads: int, n_kv: int,
               head_dim: int, neox: bool, rot_dim: int = 0, name: str = "rope_store",
               kv_half: bool = False,
               qk_norm: tuple[Buffer, Buffer, float] | None = None) -> Launch:
    """Rotate the first ``rot_dim`` dimensions (0: all) of each head of q and k of m QKV rows
    (``inv_freq``: rot_dim / 2 frequencies; zeros for a layer without rotary), q to ``q_out``,
    k and v into the pools ``kp``, ``vp`` (``kv_half``: pools of float16 values, else
    float32; the same for every function here that takes them). ``qk_norm`` (weights wq, wk
    [head_dim], eps; where ``attention.folds_qk_norm``): each head of q and k RMS-normed
    first, as ``norm.qk_norm`` does per head, one launch fewer."""
    if qk_norm is not None and not _attention.folds_qk_norm(head_dim):
        raise ValueError(f"paged.rope_store: the QK-norm folds into heads of a power of two "
                         f"dimensions, not {head_dim}")
    # (a kernel object per launch: a plan sets each one's arguments once)
    knl = kernel(dev, "paged", "paged_rope_store", HEAD_DIM=head_dim, ROPE_NEOX=int(neox),
                 **({"QKNORM": 1} if qk_norm is not None else {}),
                 **_rot(head_dim, rot_dim), **_attention.kv_defines(kv_half))
    args = [q_out, qkv, i32(ld_qkv), kp, vp, *rows.args, inv_freq, i32(n_heads), i32(n_kv),
            i32(rows.block_size)]
    reads = [qkv, *rows.reads, inv_freq]
    if qk_norm is not None:
        args += [qk_norm[0], qk_norm[1], f32(qk_norm[2])]
        reads += [qk_norm[0], qk_norm[1]]
    return Launch(knl, (head_dim // 2, n_heads + 2 * n_kv, m),
                  (head_dim // 2, 1, 1) if qk_norm is not None else None, args, reads,
                  [q_out, kp, vp], name)


def attention(dev: CLDevice, out: Buffer, q: Buffer, kp: Buffer, vp: Buffer, rows: PagedRows,
              *, m: int, n_heads: int, n_kv: int, head_dim: int, scale: float, lsize: int,
              softcap: float = 0.0, window: int = 0, name: str = "attn",
              kv_half: bool = False, sinks: Buffer | None = None) -> Launch:
    """Causal attention of m query rows over their sequences' blocks (``lsize`` work-items
    per row and head, splitting the positions): scores ``scale`` q.k, soft-capped to
    (-softcap, softcap) where ``softcap`` > 0, over the last ``window`` positions of each row
    where ``window`` > 0; ``sinks`` (float32 [n_heads]): a sink logit a head, one more term
    exp(sinks[h]) of each softmax's denominator, with no value (gpt-oss), the launch's last
    argument where given (both kernels take it). CPUs that pass the product probe, with heads
    of a multiple of 16, take ``attention.cl``'s ``paged_attn_cpu`` where scores are not
    capped (16-wide, one exp per key, a work-item per row and head; ``lsize`` unused; the same
    axes).

    PERF (2-core EPYC, Intel's runtime, SmolLM2, 8 rows at about 80 positions): the scalar
    kernel took 264 us a layer, 7.9 of a step's 18 ms."""
    sink = _attention.sink_args(sinks)
    defs = {**_attention.kv_defines(kv_half), **_attention.sink_defines(sinks)}
    args = [out, q, kp, vp, *rows.args, i32(n_heads), i32(n_kv), i32(rows.block_size),
            f32(scale), *sink]
    if _attention.cpu_decode(dev, head_dim) and not softcap:
        knl = kernel(dev, "attention", "paged_attn_cpu", HEAD_DIM=head_dim, CPU_VEC=1,
                     **_scores(0.0, window), **defs)
        return Launch(knl, (1, n_heads, m), (1, 1, 1), args, [q, kp, vp, *rows.reads, *sink],
                      [out], name)
    knl = kernel(dev, "paged", "paged_attn", HEAD_DIM=head_dim, LS=lsize,
                 **_scores(softcap, window), **defs)
    return Launch(knl, (lsize, n_heads, m), (lsize, 1, 1), args,
                  [q, kp, vp, *rows.reads, *sink], [out], name)


def split_attention(dev: CLDevice, head_dim: int) -> bool:
    """Whether ``attention_split`` runs here: GPUs with a work-group a head (``attention``'s
    conditions for attn_decode_rope)."""
    return _attention.fused_decode(dev, head_dim)


def attention_split(dev: CLDevice, out: Buffer, part: Buffer, count: Buffer, q: Buffer,
                    kp: Buffer, vp: Buffer, rows: PagedRows, *, m: int, n_heads: int, n_kv: int,
                    head_dim: int, scale: float, context: int, softcap: float = 0.0,
                    window: int = 0, combine: bool | None = None, name: str = "attn",
                    kv_half: bool = False, sinks: Buffer | None = None) -> list[Launch]:
    """``attention`` on GPUs split over each row's positions (``attention.cl``'s
    paged_attn_wg): work-groups of head_dim work-items take a chunk of a row's positions each
    (``attention.decode_chunk`` of ``context``); ``softcap``, ``window`` and ``sinks`` as in
    ``attention`` (a head's sink taken by its row's first chunk that takes part, so that the
    combine, the same as without, counts it once). Where ``combine`` (default: where
    ``attention.decode_combines``) the last of a (row, head) combines their partials in the
    same launch, else paged_attn_combine does in a second. ``part``: ``part_floats`` floats;
    ``count``: m * n_heads int32, zero, left zero. Both launches have the rows on axis 2.

    PERF (H100, SmolLM2, 16 rows): paged_attn, a work-group of 32 work-items a (row, head)
    walking its positions, took 38 us a layer at 100 positions and 220 us at 900; this, 31
    and 77 us."""
    chunk, splits = _attention.decode_chunk(dev, context, n_heads)
    if combine is None:
        combine = _attention.decode_combines(dev)
    ptx = combine and not launch.is_cpu(dev) and dev.probe("nvidia_ptx")
    knl = kernel(dev, "attention", "paged_attn_wg", HEAD_DIM=head_dim, CHUNK=chunk,
                 COMBINE=int(combine), PTX_FENCE=int(ptx), **_scores(softcap, window),
                 **_attention.kv_defines(kv_half), **_attention.sink_defines(sinks),
                 **_attention.tile_defines(dev))
    out_ = [out, part, count] if combine else [part]
    launches = [Launch(knl, (splits * head_dim, n_heads, m), (head_dim, 1, 1),
                       [out, part, count, q, kp, vp, *rows.args, i32(n_heads), i32(n_kv),
                        i32(rows.block_size), f32(scale), *_attention.sink_args(sinks)],
                       [q, kp, vp, count, *rows.reads, *_attention.sink_args(sinks)], out_,
                       name)]
    if not combine:
        launches.append(_combine(dev, out, part, rows, m=m, n_heads=n_heads,
                                 head_dim=head_dim, chunk=chunk, splits=splits, window=window,
                                 name=name))
    return launches


def split_follows(dev: CLDevice, ln: Launch, *, context: int, n_heads: int
                  ) -> Callable[[int, int | None], tuple[list[tuple[int, Any]], tuple[int, ...]]]:
    """How a launch of ``attention_split`` (of ``context``) follows a step's rows and span:
    ``at(rows, span)`` gives its new arguments and global size for ``rows`` rows that attend
    to at most ``span`` positions (None: ``context``): as many chunks as the span takes
    (rounded up to a power of two, so that a growing span resizes the launch rarely), not the
    whole context's; the work-groups of chunks past a row's positions would exit at once, but
    each still costs its start. A row's values do not change: its chunks, and the combine's
    count of them (the partials' layout follows the launch's chunks), are the same."""
    chunk, splits = _attention.decode_chunk(dev, context, n_heads)
    g = ln.global_size
    combine = ln.kernel.function_name == "paged_attn_combine"

    def chunks(span: int | None) -> int:
        return _attention.span_chunks(chunk, splits, span)

    def at(rows: int, span: int | None) -> tuple[list[tuple[int, Any]], tuple[int, ...]]:
        if combine:  # (arguments: out, part, rpos, S)
            return [(3, i32(chunks(span)))], (g[0], g[1], rows)
        return [], (chunks(span) * g[0] // splits, g[1], rows)

    return at


def _combine(dev: CLDevice, out: Buffer, part: Buffer, rows: PagedRows, *, m: int,
             n_heads: int, head_dim: int, chunk: int, splits: int, window: int,
             name: str) -> Launch:
    """The combine of split attention's partials (part [m][n_heads][splits][head_dim + 2],
    numbered from each row's first chunk that takes part) into out, a launch of its own
    (``attention.cl``'s paged_attn_combine; rows on axis 2)."""
    knl = kernel(dev, "attention", "paged_attn_combine", HEAD_DIM=head_dim, CHUNK=chunk,
                 **_scores(0.0, window))
    return Launch(knl, (head_dim, n_heads, m), None, [out, part, rows.positions, i32(splits)],
                  [part, rows.positions], [out], name + ".combine")


def part_floats(dev: CLDevice, rows: int, n_heads: int, head_dim: int, context: int) -> int:
    """Floats of ``attention_split``'s partials for ``rows`` rows."""
    _, splits = _attention.decode_chunk(dev, context, n_heads)
    return rows * n_heads * splits * (head_dim + 2)


def gather_rows(dev: CLDevice, out: Buffer, x: Buffer, sel: Buffer, *, m: int, k: int,
                head_dim: int, neox: bool, rot_dim: int = 0) -> Launch:
    """out[i, :k] = x[sel[i], :k] for i < m (``head_dim``, ``neox`` and ``rot_dim``: the
    program the step's rope_store was built in)."""
    knl = kernel(dev, "paged", "gather_rows", HEAD_DIM=head_dim, ROPE_NEOX=int(neox),
                 **_rot(head_dim, rot_dim))
    return Launch(knl, (k, m), None, [out, x, sel, i32(k)], [x, sel], [out], "gather_rows")
