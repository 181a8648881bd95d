"""Kernels, mixture of experts: launches of ``moe.cl``, the device side of an MoE FFN block
(Mixtral, Qwen3-MoE, OLMoE) whose routing the host never reads. A block of m rows runs:

1. the router product (``matmul.matmul``): logits [m, E];
2. ``route``: each row's top-k experts and weights;
3. ``align``: the m * k (row, slot) pairs grouped by expert into ``padded_rows`` slots, each
   expert's group padded to a whole number of tiles of ``tile_rows`` rows, and the expert of
   each tile (``tile_e``);
4. ``gather``: the grouped rows of x;
5. the grouped products (``matmul.matmul(experts=(tile_e, E), tm=tile)``): gate and up, the
   GLU (``activation.glu``), down; a tile reads its one expert's weights;
6. ``combine``: each row's weighted sum of its k experts' outputs (onto the residual).

Every launch takes its row count as an argument; each function says which, and how its global
size follows it, so that a plan resizes it."""

from __future__ import annotations

from collections.abc import Iterable

from ..runtime import CLDevice
from ..runtime.pool import Buffer
from . import launch, matmul
from .launch import Launch, flat_geometry, i32, kernel, pow2_at_most

# the most experts and choices per row the kernels take (local counts, private top-k lists)
MAX_EXPERTS = 512
MAX_TOPK = 16


def _check(n_experts: int, k: int) -> None:
    if not 1 <= n_experts <= MAX_EXPERTS or not 1 <= k <= min(MAX_TOPK, n_experts):
        raise ValueError(f"moe: {n_experts} experts, {k} a row: the kernels take up to "
                         f"{MAX_EXPERTS} experts and up to {MAX_TOPK} (and E) a row")


def route(dev: CLDevice, ids: Buffer, wts: Buffer, logits: Buffer, *, m: int,
          n_experts: int, k: int, norm: bool) -> Launch:
    """Each of m rows' top ``k`` of its ``n_experts`` float32 logits (``logits`` [m, E]
    row-major): ``ids`` int32 [m * k], row r's at r * k .., by descending logit (an exact tie:
    the lower expert first); ``wts`` float32 [m * k]: ``norm``, the softmax over the k chosen
    logits; else exp(l - max) / the sum over all E of exp(l - max).

    On GPUs a work-group a row (``moe_route_wg``, ``ROUTE_GROUP`` work-items); on CPUs a
    work-item a row.

    Resize: argument 3 is m; the global size is ``route_geometry(dev, m, k)``'s."""
    _check(n_experts, k)
    g, loc = route_geometry(dev, m, k)
    ls = _route_group(dev, k)
    if ls:
        knl = kernel(dev, "moe", "moe_route_wg", TOPK=k, NORM=int(norm), RL=ls)
    else:
        knl = kernel(dev, "moe", "moe_route", TOPK=k, NORM=int(norm))
    return Launch(knl, g, loc, [ids, wts, logits, i32(m), i32(n_experts)], [logits],
                  [ids, wts], "moe_route")


# PERF (H200, Qwen3-30B-A3B body, 128 experts, 8 a row): one work-item a row, serial over the
# experts, took 22.6 us a layer for a decode row (1085 us of a step's 4.4 ms of kernels) and
# 27 us a layer for a prompt chunk of 128 rows. A warp a row takes each round's best of 128 in
# five halvings (not yet measured on a GPU)
ROUTE_GROUP = 32


def route_geometry(dev: CLDevice, m: int,
                   k: int) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(global, local) of ``route`` for m rows of k choices: on GPUs ``ROUTE_GROUP``
    work-items a row (at least k), on CPUs ``launch.flat_geometry``'s work-item a row."""
    ls = _route_group(dev, k)
    return ((m * ls,), (ls,)) if ls else flat_geometry(dev, m)


def _route_group(dev: CLDevice, k: int) -> int:
    """Work-items of ``moe_route_wg``'s work-group (a row's), 0 for the serial kernel: CPUs,
    or a device whose groups hold fewer than k."""
    ls = min(ROUTE_GROUP, pow2_at_most(dev.caps.max_work_group))
    return 0 if launch.is_cpu(dev) or ls < k else ls


def tile_rows(dev: CLDevice, fmts: Iterable[str], m: int, k: int) -> int:
    """The rows of a tile of the grouped products (their ``tm``) of m token rows with k
    experts each, whose three expert weights are in formats ``fmts``: 1 for one row; else on
    CPUs the fewest rows a work-item of ``matmul_cpu.cl`` takes for them
    (``matmul.rb_rows(8, fmt, dev)``), at most the largest power of two not above m * k; on GPUs
    the TM of the geometry several rows take (``matmul.matmul_geometry(dev, 2, ...)``, the one
    geometry of every batch)."""
    if m <= 1:
        return 1
    fmts = list(fmts)
    if launch.is_cpu(dev):
        return min(min(matmul.rb_rows(8, f, dev) for f in fmts), pow2_at_most(m * k))
    return min(matmul.matmul_geometry(dev, 2, 32, f)[0] for f in fmts)


def padded_rows(m: int, k: int, n_experts: int, tile: int) -> int:
    """P, the slots ``align`` may fill: m * k pairs, each expert's group padded to a multiple
    of ``tile`` (at most tile - 1 padding slots for each of at most min(E, m * k) groups),
    rounded up to whole tiles."""
    pairs = m * k
    return -(-(pairs + min(n_experts, pairs) * (tile - 1)) // tile) * tile


def align_group(dev: CLDevice) -> int:
    """Work-items of each of ``align``'s work-groups: 256 on GPUs, 64 on CPUs (where a pair's
    rank in its chunk costs a pass over the chunk)."""
    return min(64 if launch.is_cpu(dev) else 256, pow2_at_most(dev.caps.max_work_group))


def align(dev: CLDevice, order: Buffer, tile_e: Buffer, pos: Buffer, ids: Buffer, *, m: int,
          k: int, n_experts: int, tile: int, p: int) -> Launch:
    """The slots of the grouped rows from ``ids`` [m * k] (``route``'s): experts in ascending
    order, an expert's pairs v = r * k + j in ascending v, each expert's group padded to a
    multiple of ``tile``. ``order`` int32 [p]: the pair of each slot, -1 for padding;
    ``tile_e`` int32 [p / tile]: each tile's expert, -1 past the last group; ``pos`` int32
    [m * k]: the slot of each pair. ``p``: ``padded_rows(m, k, n_experts, tile)``.
    Deterministic (a count per expert, a prefix sum, a scatter in order of v). On GPUs a
    work-group an expert (``moe_align_e``; PERF, H200, 4096 pairs of 128 experts: one
    work-group ranking each pair by a pass over its chunk of 256 took 56 us), on CPUs one
    work-group.

    Resize: argument 4 is m, argument 5 is p; the global size (one or n_experts work-groups
    of ``align_group(dev)``) does not change."""
    _check(n_experts, k)
    if p % tile or p < padded_rows(m, k, n_experts, tile):
        raise ValueError(f"moe.align: {p} slots for {m} rows of {k} experts in tiles of "
                         f"{tile}: padded_rows gives {padded_rows(m, k, n_experts, tile)}")
    ls = align_group(dev)
    each = not launch.is_cpu(dev)
    knl = kernel(dev, "moe", "moe_align_e" if each else "moe_align", NE=n_experts, LS=ls)
    return Launch(knl, ((n_experts if each else 1) * ls,), (ls,),
                  [order, tile_e, pos, ids, i32(m), i32(p), i32(k), i32(tile)], [ids],
                  [order, tile_e, pos], "moe_align")


def gather(dev: CLDevice, xg: Buffer, x: Buffer, order: Buffer, *, p: int, k: int,
           dim: int) -> Launch:
    """xg[s, :] = x[order[s] / k, :] for s < p, zeros where order[s] < 0 (float32 rows of
    ``dim`` values): the grouped rows the experts' products read.

    Resize: argument 3 is p; the global size is (dim, p)."""
    knl = kernel(dev, "moe", "moe_gather")
    return Launch(knl, (dim, p), None, [xg, x, order, i32(p), i32(k), i32(dim)], [x, order],
                  [xg], "moe_gather")


def combine(dev: CLDevice, out: Buffer, yd: Buffer, pos: Buffer, wts: Buffer, *, m: int,
            k: int, dim: int, accum: bool) -> Launch:
    """out[r, :] (``accum``: +=) the sum over j = 0 .. k - 1, in that order, of
    wts[r * k + j] * yd[pos[r * k + j], :] for r < m (float32 rows of ``dim`` values; ``yd``
    the down product's grouped rows, ``pos`` ``align``'s).

    Resize: argument 4 is m; the global size is (dim, m)."""
    knl = kernel(dev, "moe", "moe_combine", ACCUM=int(accum))
    return Launch(knl, (dim, m), None, [out, yd, pos, wts, i32(m), i32(k), i32(dim)],
                  [yd, pos, wts] + ([out] if accum else []), [out], "moe_combine")
