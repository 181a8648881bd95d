"""llm, experts: the launches of a mixture of experts in place of a layer's FFN, for the plan
builder (``step.StepBuilder``, with either cache), from the router's scores to the weighted sum
of the chosen experts' outputs, all on the device (the host never reads a routing).

For ``m`` rows of normed activations: the router's product gives each row a score per expert
(the caller's launch, so that it takes the builder's own product geometry); ``route`` picks each
row's k experts and their weights; ``align`` sorts the m * k (row, expert) pairs by expert into
tiles of ``tile`` rows that each meet one expert's weights (padded per expert); ``gather``
copies each pair's row into its place; the gate, up and down products run over the padded rows,
each tile reading only its expert's weights; ``combine`` adds each row's k outputs, weighted, to
the residual stream (or writes them where a post-norm follows). A lone decode row (one row,
tiles of one) needs no sorting: its k products read the row itself, each tile the expert of
its slot, and the sum takes the slots in order. A prompt's rows of one sequence
(``tensor_rows``: NVIDIA GPUs) take the float16 tensor cores (``matmul.matmul_xmma``) in tiles
of 64: the [gate | up] product gathers the rows itself, in float16, and takes the GLU in its
epilogue, the down product reading its float16 rows (no gather or GLU launch).

A row's result depends on that row alone: its experts, its weights and its products' sums do
not change with the other rows of the batch (the products take the row-invariant geometry).
Where every expert weight takes the int8 rows (``matmul.int8_batch``: 4- and 8-bit weights on
NVIDIA GPUs), rows of several take them in tiles of their TM (``matmul.matmul_qrows``): each
product quantizes its padded rows to int8 and reads each expert's weights once a tile of 8."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernels import Launch, activation, matmul, moe
from ..kernels import norm as norm_kernels
from ..nn.quant import upload
from ..runtime import CLDevice
from ..runtime.pool import Buffer
from .config import ModelConfig
from .loaded import Experts

# A launch's changed arguments (position, value) and global size at another row count
Resize = tuple[list[tuple[int, Any]], tuple[int, ...]]


@dataclass(frozen=True)
class ExpertBuffers:
    """Scratch of a mixture-of-experts block for some count of rows: the router's scores,
    each row's chosen experts and weights, the pairs' padded order, each tile's expert and each
    pair's slot, and the padded rows of the products (input, [gate | up], the GLU, output);
    ``slots``: 0 .. k - 1, a lone row's pairs' slots; ``xq``: the int8 rows of the products
    (``matmul.qrows_scratch``) where they take them, else None; ``count``: int32 zeros, the
    down products' counters where they sum a lone row's slots (``matmul``'s ``slot_sum=``)."""

    logits: Buffer
    ids: Buffer
    wts: Buffer
    order: Buffer
    tile_e: Buffer
    pos: Buffer
    xg: Buffer
    gu: Buffer
    h: Buffer
    yd: Buffer
    slots: Buffer
    count: Buffer
    xq: tuple[Buffer, Buffer, Buffer] | None = None


def int8_rows(dev: CLDevice, layers: list[Experts]) -> bool:
    """Whether the experts' products of several rows take the int8 rows (every weight
    ``matmul.int8_batch``)."""
    return all(matmul.int8_batch(dev, w) for ex in layers for w in ex.products())


# The fewest rows of one sequence whose experts' products take the float16 tensor cores
# (``tensor_rows``). NOTE: prompts of 128 and 512 rows measured (RESULTS); fewer not yet
XMMA_ROWS = 32


def tensor_rows(dev: CLDevice, layers: list[Experts], m: int, one: bool) -> bool:
    """Whether the experts' products of ``m`` rows of one sequence's plan (``one``: a
    ``Model``'s, whose products need not be row-invariant) take ``matmul.matmul_xmma``: at
    least ``XMMA_ROWS`` rows, every expert weight ``matmul.xmma_takes``. Rows of the batched
    engine's plans keep the int8 rows, so that a sequence's tokens do not depend on the
    batch."""
    return one and m >= XMMA_ROWS and all(matmul.xmma_takes(dev, w) for ex in layers
                                          for w in ex.products())


def tile(dev: CLDevice, layers: list[Experts], m: int, one: bool = False) -> int:
    """The rows of a tile of the experts' products for ``m`` rows (one for a decode row;
    ``matmul.XMMA_TILE`` where they take the tensor cores, ``tensor_rows``; the int8 rows' TM
    where they take them)."""
    if tensor_rows(dev, layers, m, one):
        return matmul.XMMA_TILE
    if m > 1 and int8_rows(dev, layers):
        return matmul.qrows_tile(dev, layers[0].products()[0])
    fmts = sorted({w.fmt for ex in layers for w in ex.products()})
    return moe.tile_rows(dev, fmts, m, layers[0].k)


def buffers(dev: CLDevice, cfg: ModelConfig, layers: list[Experts], rows: int,
            one: bool = False) -> ExpertBuffers:
    """Scratch for blocks of up to ``rows`` rows (every smaller count pads to fewer rows in
    its tiles; ``one``: one sequence's plans, ``tile``'s)."""
    E, k, F, dim = cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_dim, cfg.dim
    # (the tiles of the most rows, and of fewer where those take the int8 rows)
    t = tile(dev, layers, min(rows, XMMA_ROWS - 1), one)
    p = max(moe.padded_rows(rows, k, E, tile(dev, layers, rows, one)),
            moe.padded_rows(rows, k, E, t))
    f4 = 4
    return ExpertBuffers(
        logits=dev.alloc(rows * E * f4), ids=dev.alloc(rows * k * f4),
        wts=dev.alloc(rows * k * f4), order=dev.alloc(p * f4),
        tile_e=dev.alloc(max(1, p // t) * f4),  # (t: the smaller tile, the more tiles)
        pos=dev.alloc(rows * k * f4), xg=dev.alloc(p * dim * f4), gu=dev.alloc(p * 2 * F * f4),
        h=dev.alloc(p * F * f4), yd=dev.alloc(p * dim * f4),
        slots=upload(dev, np.arange(k, dtype=np.int32)),
        count=upload(dev, np.zeros(dim, np.int32)),
        xq=matmul.qrows_scratch(dev, p, max(dim, F)) if t > 1 and int8_rows(dev, layers)
        else None)


def _follows(make: Callable[[int], Launch], m: int) -> tuple[Launch, Callable[[int], Resize]]:
    """``make(m)``, and how to resize it to another row count: the scalar arguments and the
    global size ``make`` gives for that count (the kernel, its buffers and its local size do
    not depend on it)."""
    ln = make(m)

    def at(rows: int) -> Resize:
        new = make(rows)
        if new.name != ln.name or new.local_size != ln.local_size:
            raise AssertionError(f"{ln.name}: {rows} rows take another kernel geometry")
        return ([(i, a) for i, a in enumerate(new.args) if isinstance(a, np.generic)],
                tuple(new.global_size))

    return ln, at


def folds(dev: CLDevice, ex: Experts, m: int, t: int) -> bool:
    """Whether a lone decode row's experts (``ffn`` with m and t 1) take the pre-norm and the
    GLU inside their products (``matmul``'s ``norm=`` and ``glu=``): GPUs, every expert weight
    and the router in the row layout. Two launches a layer fewer, where a mixture of experts'
    decode step is bound by its enqueues (H200, Qwen3-30B-A3B body: 531 launches a step, 5-6
    ms to enqueue against 4.4 ms of kernels)."""
    return m == 1 and t == 1 and matmul.fused_prologues(dev) and all(
        w.layout == "rows" for w in [ex.router, *ex.products()])


def ffn(dev: CLDevice, cfg: ModelConfig, ex: Experts, xn: Buffer, m: int, b: ExpertBuffers,
        out: Buffer, t: int, *, accum: bool, name: str,
        norm: tuple[Buffer, float] | None = None, invariant: bool = True
        ) -> list[tuple[Launch, Callable[[int], Resize]]]:
    """The launches after the router's product (its scores in ``b.logits``, [m, n_experts])
    for ``m`` rows of normed activations ``xn`` ([m, dim]), in tiles of ``t`` rows: ``out``
    [m, dim] gets (``accum``: += ) each row's weighted sum of its experts' outputs. Each comes
    with how to resize it to another row count that takes the same tile. ``norm`` (where
    ``folds``): xn is the residual stream itself, and the [gate | up] products take the
    pre-norm ``(weight, eps)``; the down products then take the GLU too, where it is the plain
    SiLU one or gpt-oss's clamped one. ``invariant``: a row's sums are added in the same order
    whatever the rows (the batched engine's plans); else (one sequence's plan) a lone decode
    row's products may take the int8 decode path (``matmul``'s experts with tiles of one row,
    on NVIDIA)."""
    E, k, F, dim = ex.n, ex.k, ex.ffn, cfg.dim
    if norm is not None and not folds(dev, ex, m, t):
        raise ValueError("experts: the norm folds into the products of a lone decode row on "
                         "GPUs only (experts.folds)")

    def rows(m: int) -> int:
        p = moe.padded_rows(m, k, E, t)
        if p * 4 > b.order.nbytes:  # (tiles larger than the buffers were sized for)
            raise ValueError(f"experts: {m} rows in tiles of {t} pad to {p} rows, more than "
                             f"the buffers hold ({b.order.nbytes // 4})")
        return p

    lone_row = m == 1 and t == 1

    def product(y: Buffer, y_off: int, ldy: int, x: Buffer, ldx: int, w: Any,
                bias: Buffer | None, what: str, tiles: Buffer = b.tile_e,
                **fold: Any) -> list[Callable[[int], Launch]]:
        xq = b.xq
        if xq is not None and t > 1 and t == matmul.qrows_tile(dev, w):
            # (the rows quantized, then the grouped int8 product: two launches)
            def qrows(m: int) -> list[Launch]:
                return matmul.matmul_qrows(dev, y, y_off, ldy, x, 0, ldx, w, rows(m), xq,
                                           bias=bias, experts=(tiles, E),
                                           name=f"{what}.{name}")
            return [lambda m: qrows(m)[0], lambda m: qrows(m)[1]]
        return [lambda m: matmul.matmul(dev, y, y_off, ldy, x, 0, ldx, w, rows(m), bias=bias,
                                        experts=(tiles, E), tm=t,
                                        row_invariant=invariant or not lone_row,
                                        name=f"{what}.{name}", **fold)]

    def gate_up(x: Buffer, ldx: int, tiles: Buffer = b.tile_e,
                **fold: Any) -> list[Callable[[int], Launch]]:
        """The [gate | up] rows of the padded rows ``x``: one product where the experts' gate
        and up weights are one (``Experts.gate_up``), else two."""
        if ex.gate_up is not None:
            return product(b.gu, 0, 2 * F, x, ldx, ex.gate_up, ex.gate_up_bias, "gate_up_exps",
                           tiles, **fold)
        return product(b.gu, 0, 2 * F, x, ldx, ex.gate, ex.gate_bias, "gate_exps", tiles,
                       **fold) + \
            product(b.gu, F, 2 * F, x, ldx, ex.up, ex.up_bias, "up_exps", tiles, **fold)

    if lone_row:
        # PERF: a lone decode row: its k slots in the router's order, each its own tile (the
        # chosen experts themselves), the gate and up products reading the row itself (ldx
        # 0); no alignment, no gathered copy: two launches fewer a layer. Where the norm folds
        # (``folds``), the plain SiLU GLU (or gpt-oss's clamped one) folds into the down
        # products too
        glu_in = norm is not None and (cfg.act == "silu" or bool(cfg.glu_limit))
        # PERF: where the down products take the int8 decode path, their last work-groups
        # add up the slots' rows into out (the weighted sum without a launch of its own)
        sums = not invariant and matmul.int8_slots(dev, ex.down)
        down_fold: dict[str, Any] = {"glu": True} if glu_in else {}
        if glu_in and cfg.glu_limit:
            down_fold.update(limit=cfg.glu_limit, alpha=cfg.glu_alpha)
        if sums:
            down_fold["slot_sum"] = (out, b.wts, b.count, accum)
        # and where the one [gate | up] product does, its work-groups pick their slots'
        # experts from the router's scores themselves (the top-k without a launch)
        routed = not invariant and ex.gate_up is not None and \
            matmul.int8_slots(dev, ex.gate_up)
        gu_fold: dict[str, Any] = {"norm": norm}
        if routed:
            gu_fold["route"] = (b.logits, b.wts, ex.norm)
        lone: list[Callable[[int], Launch]] = [
            *([] if routed else [
                lambda m: moe.route(dev, b.ids, b.wts, b.logits, m=m, n_experts=E, k=k,
                                    norm=ex.norm)]),
            *gate_up(xn, 0, b.ids, **gu_fold),
            *([] if glu_in else [
                lambda m: activation.glu(dev, b.h, b.gu, m=k, f=F, act=cfg.act,
                                         limit=cfg.glu_limit, alpha=cfg.glu_alpha)]),
            *product(b.yd, 0, dim, b.gu if glu_in else b.h, 2 * F if glu_in else F, ex.down,
                     ex.down_bias, "down_exps", b.ids, **down_fold),
            *([] if sums else [
                lambda m: moe.combine(dev, out, b.yd, b.slots, b.wts, m=m, k=k, dim=dim,
                                      accum=accum)]),
        ]
        return [_follows(make, m) for make in lone]
    routing: list[Callable[[int], Launch]] = [
        lambda m: moe.route(dev, b.ids, b.wts, b.logits, m=m, n_experts=E, k=k, norm=ex.norm),
        lambda m: moe.align(dev, b.order, b.tile_e, b.pos, b.ids, m=m, k=k, n_experts=E,
                            tile=t, p=rows(m))]

    def combine(m: int) -> Launch:
        return moe.combine(dev, out, b.yd, b.pos, b.wts, m=m, k=k, dim=dim, accum=accum)

    if not invariant and t == matmul.XMMA_TILE and tensor_rows(dev, [ex], m, True):
        # PERF: the prompt's rows on the float16 tensor cores; the [gate | up] products read
        # the rows through the slots' order (no gathered copy) and the down products take the
        # plain GLU (no launch of its own)
        glu_in = cfg.act in matmul.GLU_ACTS and not cfg.glu_limit
        clamp = {"limit": cfg.glu_limit, "alpha": cfg.glu_alpha} if cfg.glu_limit else {}

        def xmma(y: Buffer, y_off: int, ldy: int, x: Buffer, ldx: int, w: Any,
                 bias: Buffer | None, what: str, gather: int = 0,
                 **fold: Any) -> Callable[[int], Launch]:
            return lambda m: matmul.matmul_xmma(
                dev, y, y_off, ldy, x, 0, ldx, w, rows(m), b.order, (b.tile_e, E),
                gather=gather, bias=bias, name=f"{what}.{name}",
                act=cfg.act if fold.get("glu") or fold.get("glu_out") else "silu", **fold)

        if ex.gate_up is not None and (glu_in or clamp) and cfg.act in matmul.GLU_ACTS and \
                F % 8 == 0 and dim % 8 == 0:
            # PERF: one [gate | up] product whose epilogue takes the GLU (gpt-oss's clamped
            # one too), its float16 rows the down products' input as they are (4 bytes a
            # value fewer to read than [gate | up] in float32, each GLU made once, not once for
            # each block of down's columns, no GLU launch)
            # (and the rows it gathers in float16 too, made once: half the bytes each block
            # of its columns reads)
            tensor = [*routing,
                      lambda m: norm_kernels.half_rows(dev, b.xg, xn, 0, dim, k=dim, m=m),
                      xmma(b.h, 0, F, b.xg, dim, ex.gate_up, ex.gate_up_bias, "gate_up_exps",
                           k, glu_out=True, half_in=True, **clamp),
                      xmma(b.yd, 0, dim, b.h, F, ex.down, ex.down_bias, "down_exps",
                           half_in=True), combine]
            return [_follows(make, m) for make in tensor]
        if ex.gate_up is not None:
            gu = [xmma(b.gu, 0, 2 * F, xn, dim, ex.gate_up, ex.gate_up_bias, "gate_up_exps", k)]
        else:
            gu = [xmma(b.gu, 0, 2 * F, xn, dim, ex.gate, ex.gate_bias, "gate_exps", k),
                  xmma(b.gu, F, 2 * F, xn, dim, ex.up, ex.up_bias, "up_exps", k)]
        tensor = [*routing, *gu, *([] if glu_in else [
            lambda m: activation.glu(dev, b.h, b.gu, m=rows(m), f=F, act=cfg.act,
                                     limit=cfg.glu_limit, alpha=cfg.glu_alpha)]),
            xmma(b.yd, 0, dim, b.gu if glu_in else b.h, 2 * F if glu_in else F, ex.down,
                 ex.down_bias, "down_exps", glu=glu_in), combine]
        return [_follows(make, m) for make in tensor]
    makers: list[Callable[[int], Launch]] = [
        *routing,
        lambda m: moe.gather(dev, b.xg, xn, b.order, p=rows(m), k=k, dim=dim),
        *gate_up(b.xg, dim),
        lambda m: activation.glu(dev, b.h, b.gu, m=rows(m), f=F, act=cfg.act,
                                 limit=cfg.glu_limit, alpha=cfg.glu_alpha),
        *product(b.yd, 0, dim, b.h, F, ex.down, ex.down_bias, "down_exps"),
        combine,
    ]
    return [_follows(make, m) for make in makers]
