"""llm, step: the one builder of a decoder's launches, for any family in ``arch.ARCHS`` and any
number of rows. ``Model`` (one sequence, a contiguous KV cache) and ``BatchEngine`` (a ragged
batch of decode rows and prompt chunks over a paged cache) are its two drivers: they feed the
rows and take the tokens back; every launch of a layer is chosen here.

A step runs its rows through every layer as the family describes it (``ModelConfig`` and the
typed weights of ``Model.weights``): pre-norms, post/sandwich norms and residual multipliers,
Q/K biases and QK-norm, whole, partial or no rotary, sliding-window layers, soft-capped
attention scores, the GLU's activation, mixtures of experts, the embedding's scale and the
logits' scale and soft cap. The cache (``OneSequence`` or ``Paged``) decides how keys and
values are stored and read; the rest of a layer is written once.

The two caches differ in what a plan may assume of its rows:

- ``OneSequence`` (``sequence``): a plan for exactly m rows of one sequence, so the products
  take the fastest route for that count (float16 rows for tensor cores, splits of k, the
  GLU or the next norm in a product's epilogue) and a decode row may run its layers as
  ``layer.decode_layers`` launches; the sampler's launch makes the next token on the device.
- ``Paged`` (``rows``): one plan serves many row counts (it is resized), so the products take
  one geometry for every count, and every row's values depend on that row and its own
  sequence alone: a sequence gets the same tokens alone as batched. The logits rows are
  gathered and their statistics (argmax, max, log-sum-exp) made for the host to choose. A
  step of one decode row alone may take a plan of its own (``lone_row``): its layers as
  ``decode_layers`` launches over the paged cache, as ``OneSequence`` runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..kernels import (
    Launch,
    LaunchPlan,
    activation,
    attention,
    launch,
    layer,
    matmul,
    native_cpu,
    norm,
    paged,
    sample,
)
from ..kernels.launch import i32
from ..kernels.paged import PagedRows
from ..nn.quant import DeviceWeight, upload
from ..runtime import CLDevice
from ..runtime.pool import Buffer
from . import experts
from .config import ModelConfig
from .experts import ExpertBuffers, Resize
from .loaded import Experts, LayerWeights, ModelWeights


@dataclass
class StepPlan:
    """A step's launches, made for some row count and count of logits rows, with how each
    launch whose arguments or sizes follow either is resized (``rows``, ``nl``: the counts the
    plan holds now; ``logits`` in a resize: it follows the logits rows), and the launches that
    follow the rows and the span too (``spanned``: the most positions a row of the step attends
    to, ``span``; None: the whole context). A ``OneSequence`` plan is never resized: it holds
    no resizes."""

    plan: LaunchPlan
    resizes: list[tuple[int, Callable[[int], Resize], bool]]
    rows: int
    nl: int
    spanned: list[tuple[int, Callable[[int, int | None], Resize]]] = field(default_factory=list)
    span: int | None = None

    def add(self, ln: Launch) -> None:
        """``ln``, which no row count changes."""
        self.plan.add(ln)

    def add_rows(self, ln: Launch, axis: int, per_row: int = 1, logits: bool = False) -> None:
        """``ln`` with ``per_row`` work-items of global axis ``axis`` per row (per logits row
        with ``logits``)."""
        g = ln.global_size

        def at(rows: int) -> Resize:
            return [], tuple(rows * per_row if a == axis else s for a, s in enumerate(g))

        self.add_resized(ln, at, logits)

    def add_resized(self, ln: Launch, at: Callable[[int], Resize],
                    logits: bool = False) -> None:
        self.resizes.append((len(self.plan.launches), at, logits))
        self.plan.add(ln)

    def add_spanned(self, ln: Launch, at: Callable[[int, int | None], Resize]) -> None:
        """``ln``, resized by ``at(rows, span)``."""
        self.spanned.append((len(self.plan.launches), at))
        self.plan.add(ln)

    def resize(self, rows: int, nl: int, span: int | None = None) -> None:
        changes = [(i, *at(nl if logits else rows)) for i, at, logits in self.resizes
                   if (nl != self.nl if logits else rows != self.rows)]
        if rows != self.rows or span != self.span:
            changes += [(i, *at(rows, span)) for i, at in self.spanned]
        if changes:
            self.plan.resize(changes)
        self.rows, self.nl, self.span = rows, nl, span


@dataclass(frozen=True)
class StepBuffers:
    """The device buffers a step reads and writes, for its most rows: the residual stream
    ``x``, normed rows ``xn``, a block's output before its post-norm ``t``, QKV rows, rotated
    queries ``q``, attention output ``attn``, [gate | up] rows ``gu``, the GLU's ``h`` and the
    ``logits``; the rows' token ids, ``ids`` from index ``ids_at[0]`` on (``Model``: the
    sequence's tokens and its position; ``BatchEngine``: each row's token and a zero); the
    mixture of experts' scratch (``experts``; None for a dense model).

    ``BatchEngine``'s logits rows: the gathered rows ``xl``, their statistics ``rstats``
    (argmax, max, log-sum-exp) and indices ``sel``. ``Model``'s sampler: the tokens seen
    ``seen`` (a repetition penalty's) and its scratch ``z``; its prompt products' float16
    rows ``xh``, converted weights ``wh`` and partial sums ``ph`` (``matmul.linear``'s
    scratch). ``BatchEngine``'s int8 rows on GPUs ``xq`` (``matmul.qrows_scratch``; None:
    its products keep the matmul kernel)."""

    x: Buffer
    xn: Buffer
    t: Buffer
    qkv: Buffer
    q: Buffer
    attn: Buffer
    gu: Buffer
    h: Buffer
    logits: Buffer
    ids: Buffer
    ids_at: Buffer
    experts: ExpertBuffers | None = None
    xl: Buffer | None = None
    rstats: Buffer | None = None
    sel: Buffer | None = None
    seen: Buffer | None = None
    z: Buffer | None = None
    xh: Buffer | None = None
    wh: Buffer | None = None
    ph: Buffer | None = None
    xq: tuple[Buffer, Buffer, Buffer] | None = None


@dataclass(frozen=True)
class OneSequence:
    """The KV cache of one sequence (``Model``'s): per layer ``k`` and ``v`` [n_kv][max_seq]
    [head_dim], the step's first row at position ``state[0]``; the split decode attention's
    partials and counters (``part``, ``count``: n_heads int32, zero, left zero)."""

    k: tuple[Buffer, ...]
    v: tuple[Buffer, ...]
    state: Buffer
    max_seq: int
    part: Buffer
    count: Buffer


@dataclass(frozen=True)
class Paged:
    """A paged KV cache (``BatchEngine``'s): a pool of blocks a layer (``kpool``, ``vpool``),
    ``rows`` (where each row of a step lives), the context a sequence may reach, and whether
    attention is split over positions (``split``: GPUs, with its partials ``part`` and
    counters ``count``)."""

    kpool: tuple[Buffer, ...]
    vpool: tuple[Buffer, ...]
    rows: PagedRows
    context: int
    split: bool
    part: Buffer | None = None
    count: Buffer | None = None


def branch_out(cfg: ModelConfig, weights: ModelWeights) -> bool:
    """Whether a block's output goes through a post-norm or a residual scale before the add
    (else the output product adds to the residual stream itself)."""
    return cfg.residual_scale != 1.0 or any(
        ly.post_attn_norm is not None or ly.post_ffn_norm is not None for ly in weights.layers)


@dataclass
class _Walk:
    """One build's state: the plan, its rows, the decode span, where a product left the next
    pre-norm's float16 rows (``ready``: that norm's weights, read from ``xh``), and whether the
    plan is one row's (``single``)."""

    step: StepPlan
    m: int
    span: int | None = None
    ready: dict[str, Buffer] = field(default_factory=dict)
    single: bool = False  # (``rows``' ``single``: products of one row, never resized)


class StepBuilder:
    """Builds the launches of a step of ``cfg``'s family over ``cache`` into ``bufs``.

    >>> b = StepBuilder(dev, model.config, model.weights, bufs, Paged(...))
    >>> b.rows(n=5, nl=2).plan.replay()          # BatchEngine: 5 rows, logits for 2
    >>> b.sequence(1, "last", sampler).plan.replay()   # Model: a decode row and its token

    A part of a model split over devices (``weights.layers`` its layers alone, the first of
    them layer ``first`` of the model, the cache theirs) leaves out the embedding
    (``embeds=False``: its rows arrive in ``x``) or the final norm and logits
    (``heads=False``). ``kv_half``: the cache holds float16 values. ``half_prompt``
    (``OneSequence``): a prompt's attention may round to float16, where its products take
    tensor cores. ``copies_fraction``: the fraction of the device's memory the decode layers'
    float16 copies of the down weights' columns may take (``Model``'s
    ``HALF_COPIES_FRACTION``)."""

    def __init__(self, dev: CLDevice, cfg: ModelConfig, weights: ModelWeights,
                 bufs: StepBuffers, cache: OneSequence | Paged, *, first: int = 0,
                 embeds: bool = True, heads: bool = True, kv_half: bool = False,
                 half_prompt: bool = False, copies_fraction: float = 0.0) -> None:
        self.dev, self.cfg, self.w, self.b, self.cache = dev, cfg, weights, bufs, cache
        self.first, self.embeds, self.heads, self.kv_half = first, embeds, heads, kv_half
        self.one = isinstance(cache, OneSequence)
        self.branch = branch_out(cfg, weights)
        # (OneSequence) whether a prompt's attention may round to float16: where its products
        # take tensor cores (float32 weights keep float32 throughout)
        self.half_prompt = half_prompt
        self.copies_fraction = copies_fraction
        # (OneSequence) whether a decode row's layers run as ``decode_layers`` launches (None:
        # not decided yet), their partials and grid barriers' counters, and the copies of each
        # layer's down weights' columns (made at the first decode step)
        self.whole: bool | None = None
        self.lpart: Buffer | None = None
        self.bar: Buffer | None = None
        self.lcount: Buffer | None = None
        self.down_cols: dict[int, Buffer | None] = {}

    # -- the two drivers' entries -------------------------------------------------------------
    def rows(self, n: int, nl: int, embed: bool = False, lone: bool = False,
             single: bool = False) -> StepPlan:
        """(``Paged``) The launches of a step of ``n`` rows with logits for ``nl`` of them
        (or, ``embed``, the final norm of every row into ``xn`` instead), resizable to other
        counts of rows that take the same rows per work-item (``tm``). ``lone``
        (``lone_row``): a plan for one decode row alone (one new position of its own
        sequence), never resized, whose layers run as ``decode_layers`` launches over the paged
        cache. ``single`` (``single_row``): a plan for one decode row alone, never resized,
        whose products are one row's."""
        assert isinstance(self.cache, Paged)
        if lone and not (n == 1 and self.lone_row()):
            raise ValueError("a lone-row plan is one decode row where lone_row() holds")
        if single and not (n == 1 and nl <= 1 and self.single_row()):
            raise ValueError("a single-row plan is one decode row where single_row() holds")
        cfg, dev, w, b = self.cfg, self.dev, self.w, self.b
        dim = cfg.dim
        walk = self._body(n, None, lone, single)
        step = walk.step
        step.nl = nl
        if not self.heads:
            return step
        assert w.out_norm is not None and w.output is not None
        if embed:
            self._rmsnorm(step, b.xn, b.x, w.out_norm, n)
        elif nl:  # the logits rows
            assert b.xl is not None and b.sel is not None and b.rstats is not None
            V = cfg.vocab_size
            step.add_rows(paged.gather_rows(dev, b.xl, b.x, b.sel, m=nl, k=dim,
                                            head_dim=cfg.head_dim, neox=cfg.rope_neox,
                                            rot_dim=cfg.rotary), axis=1, logits=True)
            self._rmsnorm(step, b.xn, b.xl, w.out_norm, nl, logits=True)
            for ln, at in self._matmul(b.logits, 0, V, b.xn, 0, dim, w.output, nl,
                                       name="lm_head", single=single):
                step.add_resized(ln, at, logits=True)
            if cfg.logit_scale != 1.0 or cfg.final_softcap:
                step.add_rows(activation.scale_cap(dev, b.logits, nl * V, div=cfg.logit_scale,
                                                   cap=cfg.final_softcap),
                              axis=0, per_row=V, logits=True)
            step.add_rows(sample.row_stats(dev, b.rstats, b.logits, rows=nl, vocab=V), axis=1,
                          logits=True)
        return step

    def sequence(self, m: int, logits: str, sampler: dict[str, Any] | None,
                 span: int | None = None) -> StepPlan:
        """(``OneSequence``) The launches of m rows at positions state[0].. : logits "last",
        "all" or "none"; ``sampler`` (the sampling kernel's settings, or None): the last row's
        token chosen on the device, written after the rows' tokens, and the position
        advanced. ``span`` (a decode row, ``span()``): the row attends to at most that many
        positions."""
        assert isinstance(self.cache, OneSequence)
        cfg, dev, b = self.cfg, self.dev, self.b
        state = self.cache.state
        walk = self._body(m, span)
        step, dim, V = walk.step, cfg.dim, cfg.vocab_size
        if not self.heads and (logits != "none" or sampler is not None):
            raise ValueError("only the last part of a split model makes logits")
        rows = {"last": 1, "all": m}.get(logits, 0)
        chosen = False  # (the token made with the logits)
        out_norm, output = self.w.out_norm, self.w.output
        if rows:
            assert out_norm is not None and output is not None
            src = self._normed(walk, out_norm, [output], rows,
                               (m - 1) * dim if logits == "last" else 0)
            chosen = (sampler is not None and rows == 1
                      and sample.is_greedy(sampler["temperature"])
                      and cfg.logit_scale == 1.0 and not cfg.final_softcap
                      and not src.get("half_in") and sample.takes_head(dev, output))
            if chosen:
                assert sampler is not None and b.seen is not None and b.z is not None
                # PERF (NVIDIA): the LM head makes the greedy token too, one launch (the note at
                # argmax.cl's head_greedy)
                step.add(sample.head_greedy(
                    dev, b.ids, state, b.seen, b.logits, 0, b.z, src["x"], src["x_off"],
                    output, src.get("norm"), advance=m, penalty=sampler["penalty"]))
            else:
                self._product(walk, b.logits, 0, V, src, dim, output, rows, name="lm_head")
                if cfg.logit_scale != 1.0 or cfg.final_softcap:
                    step.add(activation.scale_cap(dev, b.logits, rows * V,
                                                  div=cfg.logit_scale, cap=cfg.final_softcap))
        if sampler is not None and not chosen:
            assert b.seen is not None and b.z is not None
            step.add(sample.sample(dev, b.ids, state, b.seen, b.logits, 0, b.z, vocab=V,
                                   advance=m, **sampler))
        return step

    # -- choices a driver asks about ----------------------------------------------------------
    def tm(self, m: int) -> int | None:
        """(``Paged``) Rows per work-item of the step's products on CPUs (a compile-time
        constant, so a plan serves the row counts of one value); None on GPUs (one geometry
        for every batch)."""
        return min(8, launch.pow2_at_most(m)) if launch.is_cpu(self.dev) else None

    def span(self, positions: int) -> int | None:
        """(``OneSequence``) The span of the decode plan for a row that attends to
        ``positions`` positions: the power of two at or above it (64 at least), where the
        decode attention is split in chunks (GPUs: ``attention.attn_decode_rope``); None (the
        whole cache) elsewhere or at the cache's length."""
        assert isinstance(self.cache, OneSequence)
        D = self.cfg.head_dim
        if attention.cpu_decode(self.dev, D) or not attention.fused_decode(self.dev, D):
            return None
        span = 1 << max(6, (positions - 1).bit_length())
        return span if span < self.cache.max_seq else None

    def lone_row(self) -> bool:
        """(``Paged``) Whether a step of one decode row alone has a plan of its own whose
        layers run as ``decode_layers`` launches over the paged cache (``whole_layers``), as
        ``Model``'s decode does: a handful of launches a step in place of five or six a layer,
        whose enqueues bound a lone sequence's step on GPUs. A whole model on one device only.
        Its sums are the single-sequence kernel's, not the batched products': a sequence's
        values then depend on whether it ran alone (``BatchEngine``'s ``row_invariant`` keeps
        every step batched)."""
        return isinstance(self.cache, Paged) and self.embeds and self.heads and \
            self.whole_layers()

    def single_row(self) -> bool:
        """(``Paged``) Whether a step of one decode row alone, where ``lone_row`` does not hold,
        has a plan of its own whose products are a single row's (``matmul`` of one row: on
        NVIDIA GPUs the int8 decode path, one launch a product) in place of the batched
        products (``matmul.matmul_qrows``: two launches a product, each for any row count):
        GPUs (each part of a model split over them). Like ``lone_row``'s, its sums are not the
        batched plan's (``BatchEngine``'s ``row_invariant`` keeps every step batched)."""
        return isinstance(self.cache, Paged) and not launch.is_cpu(self.dev)

    def whole_layers(self) -> bool:
        """Whether a decode row's layers run as ``decode_layers`` launches: a plain decoder
        (pre-norms only, SiLU GLU, rotation of whole heads, no window, cap or bias; q/k norm
        a head only, Qwen3's) with one fused QKV and one [gate | up] weight that the kernel
        takes (``OneSequence``: every decode row; ``Paged``: a lone decode row's plan,
        ``lone_row``)."""
        if self.whole is not None:
            return self.whole
        cfg, dev, cache = self.cfg, self.dev, self.cache
        ok = (not self.branch and not cfg.n_experts
              and cfg.act == "silu" and cfg.rotary == cfg.head_dim
              and not cfg.attn_softcap and not cfg.qkv_bias
              and all(ly.attn_norm is not None and ly.ffn_norm is not None and not ly.window
                      and (ly.q_norm is None) == (ly.k_norm is None)
                      and (ly.q_norm is None or cfg.desc.qk_norm == "head")
                      and ly.sinks is None
                      and ly.gate_up is not None and ly.down is not None
                      and len(ly.qkv.parts) == 1 and len(ly.gate_up.parts) == 1
                      and ly.qkv.parts[0][2] is None and ly.gate_up.parts[0][2] is None
                      and layer.takes(dev, [ly.qkv.parts[0][0], ly.o,
                                            ly.gate_up.parts[0][0], ly.down], cfg.head_dim)
                      for ly in self.w.layers))
        if ok:
            self.lpart = dev.alloc(layer.part_nbytes(dev, self._max_seq(), cfg.n_heads,
                                                     cfg.n_kv_heads, cfg.head_dim))
            self.bar = upload(dev, np.zeros(layer.bar_nbytes(layer.TRACE) // 4, np.int32))
            # (the paged cache's own counters are its split attention's, a row's each)
            self.lcount = cache.count if isinstance(cache, OneSequence) else \
                upload(dev, np.zeros(cfg.n_heads, np.int32))
        self.whole = ok
        return ok

    def _max_seq(self) -> int:
        cache = self.cache
        return cache.max_seq if isinstance(cache, OneSequence) else cache.context

    def decoder_layers(self) -> list[layer.DecoderLayer]:
        """Every layer of this part as ``decode_layers`` reads it."""
        return [self.decoder_layer(j) for j in range(len(self.w.layers))]

    def decoder_layer(self, j: int) -> layer.DecoderLayer:
        """Layer ``j`` (of this part) as ``decode_layers`` reads it."""
        cache = self.cache
        k, v = (cache.k[j], cache.v[j]) if isinstance(cache, OneSequence) else \
            (cache.kpool[j], cache.vpool[j])
        ly = self.w.layers[j]
        assert ly.attn_norm is not None and ly.ffn_norm is not None
        assert ly.gate_up is not None and ly.down is not None
        gate_up = ly.gate_up.parts[0][0]
        if self.down_cols.get(j) is None:
            # (the copies of the down weights' columns, where they take at most the fraction
            # of the device's memory that float16 copies may)
            fits = sum(o.down.n * o.down.k * 2 for o in self.w.layers if o.down is not None) <= \
                self.copies_fraction * self.dev.caps.global_mem
            self.down_cols[j] = layer.down_columns(self.dev, ly.down) if (
                fits and layer.fuses_down(self.dev, gate_up, ly.down)) else None
        return layer.DecoderLayer(
            attn_norm=ly.attn_norm, qkv=ly.qkv.parts[0][0], k_cache=k, v_cache=v,
            inv_freq=ly.inv_freq, o=ly.o, ffn_norm=ly.ffn_norm,
            gate_up=gate_up, down=ly.down, down_cols=self.down_cols[j],
            q_norm=ly.q_norm, k_norm=ly.k_norm)

    # -- the layers, written once -------------------------------------------------------------
    def _body(self, m: int, span: int | None, lone: bool = False,
              single: bool = False) -> _Walk:
        """A step's embedding and layers for m rows (``lone``, ``single``: ``rows``')."""
        cfg, dev, w, b = self.cfg, self.dev, self.w, self.b
        walk = _Walk(StepPlan(LaunchPlan(dev), [], m, 0), m, span, single=single)
        step = walk.step
        # (at every span: H100, 1B Q4_0 after 1024 / 4096 / 16384 positions, 1404 / 1260 / 924
        # tok/s against the per-layer plan's 906 / 894 / 797 in the same run)
        whole = (self.one or lone) and m == 1 and self.whole_layers()
        # The first layer launch reads a float16 embedding row itself: one launch fewer to
        # enqueue (H100, 1B F16 decode after 128 positions, same runs: 1048-1054 tok/s against
        # 1049-1050 with the embedding launch, whose 7.5 us a step overlapped the launches')
        fold = whole and self.embeds and cfg.embed_scale == 1.0 and \
            w.embed is not None and layer.takes_embedding(w.embed)
        if self.embeds and not fold:
            assert w.embed is not None
            step.add_rows(matmul.embedding(dev, b.x, b.ids, b.ids_at, w.embed, m), axis=1)
        if self.embeds and cfg.embed_scale != 1.0:
            step.add_rows(activation.scale_cap(dev, b.x, m * cfg.dim, mul=cfg.embed_scale),
                          axis=0, per_row=cfg.dim)
        if whole:
            # PERF: up to 16 layers (9 where a device takes only 1024 bytes of arguments) in
            # one launch of work-groups that meet at grid barriers, where the launches below
            # are five a layer. The last launch making the logits and the greedy token too (a
            # phase of the float16 LM head's rows and a last grid barrier for the argmax: one
            # launch a step instead of three) was slower, H100, 1B F16 body: 1066-1068 against
            # 1081-1082 tok/s after 128 positions, 950-960 against 981-982 after 1024
            layers = self.decoder_layers()
            groups = layer.launch_groups(
                layers, layer.max_layers(dev, any(ly.q_norm is not None for ly in layers)))
            for g, group in enumerate(groups):
                step.add(self._whole_launch(group, span, fold and g == 0))
            return walk
        for j, ly in enumerate(w.layers):
            self._layer(walk, j, ly)
        return walk

    def _whole_launch(self, group: list[layer.DecoderLayer], span: int | None,
                      embed: bool) -> Launch:
        cfg, b, cache = self.cfg, self.b, self.cache
        assert self.lpart is not None and self.bar is not None and self.lcount is not None
        rows = None if isinstance(cache, OneSequence) else cache.rows
        state = cache.state if isinstance(cache, OneSequence) else cache.rows.positions
        return layer.decode_layers(
            self.dev, group, x=b.x, qkv_out=b.qkv, state=state, attn=b.attn,
            part=self.lpart, count=self.lcount, h=b.h, bar=self.bar, n_heads=cfg.n_heads,
            n_kv=cfg.n_kv_heads, head_dim=cfg.head_dim, max_seq=self._max_seq(),
            eps=cfg.norm_eps, scale=self._scale(), neox=cfg.rope_neox,
            kv_half=self.kv_half, positions=span, embed=self.w.embed if embed else None,
            tokens=b.ids if embed else None, paged=rows)

    def _layer(self, walk: _Walk, j: int, ly: LayerWeights) -> None:
        cfg, dev, b, m = self.cfg, self.dev, self.b, walk.m
        H, KV, D, F, dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.dim
        n_qkv, eps = (H + 2 * KV) * D, cfg.norm_eps
        i = self.first + j  # (the layer's index in the model)
        # PERF: on GPUs the norms and the GLU are folded into the products that read them; on
        # CPUs (weights in the CPU layout) a sequence's norms into the products that read them
        # and the GLU into the product that makes its input (fewer launches per token)
        fuse = matmul.fused_prologues(dev)
        src = self._normed(walk, ly.attn_norm, [p[0] for p in ly.qkv.parts])
        # PERF (GPUs): a prompt's QKV product split over k leaves its slices for the rotation
        # to add up as it reads them (no launch to sum them into QKV rows)
        w0, off0, b0 = ly.qkv.parts[0]
        slices = matmul.product_slices(dev, m, w0, b.wh) if (
            self.one and fuse and m > 1 and len(ly.qkv.parts) == 1 and off0 == 0
            and b0 is None and ly.q_norm is None and ly.k_norm is None
            and b.ph is not None and matmul.split_nbytes(dev, m, w0) <= b.ph.nbytes) else 1
        for wq, off, bias in ly.qkv.parts:
            self._product(walk, b.qkv, off, n_qkv, src, dim, wq, m, bias=bias,
                          name=f"qkv.{i}", **({"keep_slices": True} if slices > 1 else {}))
        if ly.q_norm is not None and ly.k_norm is not None and \
                self._qk_norm_in(walk, ly) is None:
            whole = cfg.desc.qk_norm == "full"
            walk.step.add_rows(norm.qk_norm(dev, b.qkv, n_qkv, m=m, nq=1 if whole else H,
                                            lq=H * D if whole else D, nk=1 if whole else KV,
                                            lk=KV * D if whole else D, wq=ly.q_norm,
                                            wk=ly.k_norm, eps=eps), axis=1)
        # PERF (NVIDIA): a prompt's attention writes the float16 rows the output product
        # reads, where that product takes tensor cores (H100, 1B F16 body, runs of the same
        # day: pp128 56.2k -> 58.4k tok/s, pp512 131k -> 134k)
        half_to = b.xh if self.one and fuse and matmul.tensor_core_route(dev, m, ly.o, b.wh) \
            else None
        if isinstance(self.cache, OneSequence):
            o_half = self._attend_one(walk, j, ly, half_to, slices)
        else:
            self._attend_paged(walk, j, ly)
            o_half = False
        o_in = {"x": b.xh if o_half else b.attn, "x_off": 0, "half_in": o_half}
        if ly.experts is not None:
            self._block_out(walk, ly.o, o_in, H * D, ly.post_attn_norm, f"o.{i}",
                            bias=ly.o_bias)
            self._experts(walk, i, ly, ly.experts)
            return
        assert ly.gate_up is not None and ly.down is not None
        gu = ly.gate_up.parts
        self._block_out(walk, ly.o, o_in, H * D, ly.post_attn_norm, f"o.{i}", bias=ly.o_bias,
                        **self._then_norm(walk, ly.o, ly.ffn_norm, [p[0] for p in gu]))
        src = self._normed(walk, ly.ffn_norm, [p[0] for p in gu])
        nxt = self.w.layers[j + 1] if j + 1 < len(self.w.layers) else None
        after_down = self._then_norm(walk, ly.down, nxt.attn_norm,
                                     [p[0] for p in nxt.qkv.parts]) if nxt is not None else {}
        one_gu = len(gu) == 1 and gu[0][1] == 0 and cfg.act == "silu"
        if self.one and not fuse and one_gu and matmul.glu_output(gu[0][0]):
            # (CPUs) the product gives silu(gate) * up itself
            self._product(walk, b.h, 0, F, src, dim, gu[0][0], m, bias=gu[0][2],
                          name=f"gate_up.{i}", glu_out=True)
            self._block_out(walk, ly.down, {"x": b.h, "x_off": 0}, F, ly.post_ffn_norm,
                            f"down.{i}")
            return
        if (self.one and fuse and one_gu and gu[0][2] is None
                and matmul.glu_half_rows(dev, m, gu[0][0])
                and matmul.tensor_core_route(dev, m, gu[0][0], b.wh)
                and matmul.tensor_core_route(dev, m, ly.down, b.wh)):
            # PERF (Hopper): the gate and up product's epilogue gives the GLU's float16 rows
            # (into h), which the down product reads as they are: no float32 [gate | up] rows
            # written and read back, no launch to make float16 rows of the GLU (H100, 1B body,
            # prompt tok/s, same run: F16 pp128 50.7k -> 53.4k, pp512 114k -> 125k; Q4_0
            # 51.2k -> 55.5k, 116k -> 129k)
            self._product(walk, b.h, 0, F, src, dim, gu[0][0], m, name=f"gate_up.{i}",
                          glu_half=True)
            self._block_out(walk, ly.down, {"x": b.h, "x_off": 0, "half_in": True}, F,
                            ly.post_ffn_norm, f"down.{i}", **after_down)
            return
        for wg, off, bias in gu:
            self._product(walk, b.gu, off, 2 * F, src, dim, wg, m, bias=bias,
                          name=f"gate_up.{i}")
        if fuse and (cfg.act == "silu" or cfg.act in matmul.GLU_ACTS and
                     not (self.one and m > 1)):
            # PERF: on GPUs the GLU is folded into the down product that reads it (GELU's
            # where a row's product is no tensor-core one: decode rows, the paged plans)
            self._block_out(walk, ly.down, {"x": b.gu, "x_off": 0}, 2 * F, ly.post_ffn_norm,
                            f"down.{i}", glu=True, act=cfg.act, **after_down)
        else:
            walk.step.add_rows(activation.glu(dev, b.h, b.gu, m=m, f=F, act=cfg.act), axis=1)
            self._block_out(walk, ly.down, {"x": b.h, "x_off": 0}, F, ly.post_ffn_norm,
                            f"down.{i}", **after_down)

    def _experts(self, walk: _Walk, i: int, ly: LayerWeights, ex: Experts) -> None:
        """A layer's mixture of experts (``experts.ffn``) after its pre-norm, added to the
        residual stream (after its post-norm and scale where it has them)."""
        cfg, b, m, step = self.cfg, self.b, walk.m, walk.step
        assert b.experts is not None
        # (a paged plan on GPUs serves every row count, so its tile is a batch's, also for one
        # row)
        rows = m if self.one or launch.is_cpu(self.dev) else max(m, 2)
        # (over every layer's experts, as the buffers were sized: one tile for all of them)
        t = experts.tile(self.dev, [ly.experts for ly in self.w.layers
                                    if ly.experts is not None], rows, self.one)
        xn, pre = b.x, None
        if ly.ffn_norm is not None and experts.folds(self.dev, ex, m, t):
            # PERF: a lone decode row's router and [gate | up] products take the pre-norm
            pre = (ly.ffn_norm, cfg.norm_eps)
        elif ly.ffn_norm is not None:
            self._rmsnorm(step, b.xn, b.x, ly.ffn_norm, m)
            xn = b.xn
        for ln, at in self._matmul(b.experts.logits, 0, ex.n, xn, 0, cfg.dim, ex.router, m,
                                   bias=ex.router_bias, name=f"router.{i}", norm=pre,
                                   single=walk.single):
            step.add_resized(ln, at)
        out = b.t if self.branch else b.x
        for ln, at in experts.ffn(self.dev, cfg, ex, xn, m, b.experts, out, t,
                                  accum=not self.branch, name=str(i), norm=pre,
                                  invariant=not self.one):
            step.add_resized(ln, at)
        if self.branch:
            ln = norm.residual(self.dev, b.x, b.t, ly.post_ffn_norm, m=m, k=cfg.dim,
                               eps=cfg.norm_eps, scale=cfg.residual_scale)
            step.add_rows(ln, axis=0, per_row=ln.global_size[0] // m)

    # -- attention, per cache -----------------------------------------------------------------
    def _scale(self) -> float:
        # YaRN's factor on cos and sin, on both q and k: squared on the scores
        return self.cfg.scale * self.cfg.rope_mscale() ** 2

    def _decode_rope(self, ly: LayerWeights) -> bool:
        """Whether a decode row of layer ``ly`` takes ``attn_decode_rope`` (rotation, the
        cache's stores and attention in one launch): GPUs (``OneSequence``: where the CPU
        kernel does not run; ``Paged``: a single-row plan's row, where attention is split
        over positions), whole-head rotary; a window where the launch combines its
        partials."""
        cfg, dev, D, cache = self.cfg, self.dev, self.cfg.head_dim, self.cache
        if cfg.rotary != D or not attention.fused_decode(dev, D) or \
                ly.window and not attention.decode_combines(dev):
            return False
        if isinstance(cache, Paged):
            return cache.split and cache.part is not None and attention.decode_combines(dev)
        return not attention.cpu_decode(dev, D)

    def _qk_norm_in(self, walk: _Walk, ly: LayerWeights) -> tuple[Buffer, Buffer, float] | None:
        """The QK-norm of layer ``ly`` as the launch that rotates q and k takes it (its
        weights and eps), or None where it is a launch of its own: a per-head norm (Qwen3's, not
        OLMo2's whole q and k) of heads ``attention.folds_qk_norm`` takes, rotated by
        ``attn_decode_rope`` (one sequence's decode row) or ``paged.rope_store`` (the paged
        cache's rows). PERF: one launch a layer fewer where a decode step is bound by its
        enqueues (Qwen3, Qwen3-MoE)."""
        cfg = self.cfg
        if ly.q_norm is None or ly.k_norm is None or cfg.desc.qk_norm == "full" or \
                not attention.folds_qk_norm(cfg.head_dim):
            return None
        batched = isinstance(self.cache, Paged) and not walk.single  # (paged.rope_store's rows)
        ok = batched or walk.m == 1 and self._decode_rope(ly)
        return (ly.q_norm, ly.k_norm, cfg.norm_eps) if ok else None

    def _attend_one(self, walk: _Walk, j: int, ly: LayerWeights, half_to: Buffer | None,
                    qkv_slices: int) -> bool:
        """Rotary, the cache store and attention of layer ``j`` for the rows of one sequence
        (qkv -> attn, or where a prompt's attention can, and ``half_to`` is given, into
        half_to as float16 rows: then True). ``qkv_slices`` > 1 (m > 1): the QKV rows are that
        many slices of partial sums in ph instead (``linear(keep_slices=True)``)."""
        cfg, dev, b, step, m = self.cfg, self.dev, self.b, walk.step, walk.m
        cache = self.cache
        assert isinstance(cache, OneSequence)
        H, KV, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        kc, vc, max_seq, kv_half, scale = cache.k[j], cache.v[j], cache.max_seq, \
            self.kv_half, self._scale()
        plain = cfg.rotary == D and not cfg.attn_softcap and not ly.window and ly.sinks is None
        common: dict[str, Any] = dict(state=cache.state, n_heads=H, n_kv=KV, head_dim=D,
                                      scale=scale, kv_half=kv_half)
        if m == 1 and plain and attention.cpu_decode(dev, D):
            # PERF (CPUs): one launch a layer, a work-item per query head, or natively a task
            # per key-value head (float32 caches)
            if not kv_half and native_cpu.takes_attention(dev, D):
                step.add(native_cpu.attention(dev, b.attn, b.qkv, kc, vc, cache.state,
                                              ly.inv_freq, n_heads=H, n_kv=KV, head_dim=D,
                                              max_seq=max_seq, scale=scale,
                                              neox=cfg.rope_neox))
            else:
                step.add(attention.attn_decode_cpu(dev, b.attn, b.qkv, kc, vc, cache.state,
                                                   ly.inv_freq, n_heads=H, n_kv=KV,
                                                   head_dim=D, max_seq=max_seq, scale=scale,
                                                   neox=cfg.rope_neox, kv_half=kv_half))
            return False
        if m == 1 and self._decode_rope(ly):
            # PERF: rotation, cache store, attention and (where the device allows) the split
            # combine in one launch instead of four
            for ln in attention.attn_decode_rope(dev, b.attn, cache.part, cache.count, b.qkv,
                                                 kc, vc, inv_freq=ly.inv_freq, max_seq=max_seq,
                                                 neox=cfg.rope_neox, positions=walk.span,
                                                 qk_norm=self._qk_norm_in(walk, ly),
                                                 softcap=cfg.attn_softcap, window=ly.window,
                                                 sinks=ly.sinks, **common):
                step.add(ln)
            return False
        if m > 1 and plain and qkv_slices == 1 and not kv_half and \
                native_cpu.takes_attention(dev, D):
            # PERF (CPUs): a prompt's rows as decode rows, natively: rotation, the cache's
            # stores and attention in one launch, chained with the native products (a 1B
            # layer's launches all native). 2-core EPYC (AVX2), Intel's runtime, 64 rows at
            # positions 0-63 of the 1B shape, the least of 40 through the queue: rope_store and
            # attn_prefill 718-734 us a layer, natively 469-470 (295 called directly)
            step.add(native_cpu.attention(dev, b.attn, b.qkv, kc, vc, cache.state, ly.inv_freq,
                                          n_heads=H, n_kv=KV, head_dim=D, max_seq=max_seq,
                                          scale=scale, neox=cfg.rope_neox, m=m))
            return False
        # PERF (H100, 1B F16 body, a 128-token prompt, alternately in one process, 2026-11-27):
        # the rotation and the cache's stores inside the tensor-core prompt attention instead
        # (each work-group rotating q and every key of the chunk it reads, a sine and cosine
        # an element; the logits and tokens the same) 50.4-51.4k tok/s against 63.2-66.9k
        # with this launch, which takes 4.0 us a layer (the chunk replayed without it)
        qkv_in = b.qkv
        if qkv_slices > 1:
            assert b.ph is not None
            qkv_in = b.ph
        step.add(attention.rope_store(dev, b.q, qkv_in, (H + 2 * KV) * D, kc, vc, cache.state,
                                      ly.inv_freq, m=m, n_heads=H, n_kv=KV, head_dim=D,
                                      max_seq=max_seq, neox=cfg.rope_neox, rot_dim=cfg.rotary,
                                      kv_half=kv_half, slices=qkv_slices))
        capped: dict[str, Any] = dict(softcap=cfg.attn_softcap, window=ly.window)
        if m == 1:
            for ln in attention.attn_decode(dev, b.attn, cache.part, b.q, kc, vc,
                                            max_seq=max_seq, **common, **capped,
                                            sinks=ly.sinks):
                step.add(ln)
            return False
        half = self.half_prompt and m >= matmul.TENSOR_CORE_ROWS
        out = b.attn
        if half_to is not None and attention.prefill_half_out(dev, D, half, **capped):
            out = half_to
        step.add(attention.attn_prefill(dev, out, b.q, q_off=0, ld_q=H * D, kc=kc, vc=vc,
                                        k_off=0, v_off=0, kv_stride=max_seq * D, pos_add=0,
                                        causal=True, n_keys=max_seq, m=m, half=half,
                                        half_out=out is not b.attn, **common, **capped,
                                        sinks=ly.sinks))
        return out is not b.attn

    def _attend_paged(self, walk: _Walk, j: int, ly: LayerWeights) -> None:
        """Rotary, the stores into the pools and attention of layer ``j`` for rows of many
        sequences (qkv -> attn)."""
        cfg, dev, b, step, m = self.cfg, self.dev, self.b, walk.step, walk.m
        cache = self.cache
        assert isinstance(cache, Paged)
        H, KV, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        n_qkv = (H + 2 * KV) * D
        kp, vp = cache.kpool[j], cache.vpool[j]
        i = self.first + j
        scores: dict[str, Any] = dict(softcap=cfg.attn_softcap, window=ly.window,
                                      sinks=ly.sinks)
        if walk.single and self._decode_rope(ly):
            assert cache.part is not None and cache.count is not None
            # PERF (H200, Qwen3-0.6B body Q8_0, one stream): the single-sequence decode
            # kernel over the row's blocks, one launch in place of rope_store and attention
            # (28.7 + 7.3 us a layer against 15.5 for Model's)
            ctx = cache.context
            for ln in attention.attn_decode_rope(
                    dev, b.attn, cache.part, cache.count, b.qkv, kp, vp, cache.rows.positions,
                    ly.inv_freq, n_heads=H, n_kv=KV, head_dim=D, max_seq=ctx,
                    scale=self._scale(), neox=cfg.rope_neox, kv_half=self.kv_half,
                    qk_norm=self._qk_norm_in(walk, ly), softcap=cfg.attn_softcap,
                    window=ly.window, paged=cache.rows, sinks=ly.sinks):
                step.add_spanned(ln, attention.decode_rope_follows(dev, ln, context=ctx,
                                                                   n_heads=H))
            return
        step.add_rows(paged.rope_store(dev, b.q, b.qkv, n_qkv, kp, vp, cache.rows, ly.inv_freq,
                                       m=m, n_heads=H, n_kv=KV, head_dim=D, neox=cfg.rope_neox,
                                       rot_dim=cfg.rotary, name=f"rope_store.{i}",
                                       kv_half=self.kv_half,
                                       qk_norm=self._qk_norm_in(walk, ly)), axis=2)
        if cache.split:
            assert cache.part is not None and cache.count is not None
            # PERF: the chunks of positions follow the step's span (work-groups past every
            # row's positions exit at once, but each still costs its start. H200, SmolLM2, 64
            # rows of about 100 positions in a context of 1024: attention 2.39 -> 1.76 ms, a
            # step 10.50 -> 10.15 ms)
            for ln in paged.attention_split(dev, b.attn, cache.part, cache.count, b.q, kp, vp,
                                            cache.rows, m=m, n_heads=H, n_kv=KV, head_dim=D,
                                            scale=self._scale(), context=cache.context,
                                            name=f"attn.{i}", kv_half=self.kv_half, **scores):
                step.add_spanned(ln, paged.split_follows(dev, ln, context=cache.context,
                                                         n_heads=H))
        else:
            ls = 1 if launch.is_cpu(dev) else 32
            step.add_rows(paged.attention(dev, b.attn, b.q, kp, vp, cache.rows, m=m,
                                          n_heads=H, n_kv=KV, head_dim=D, scale=self._scale(),
                                          lsize=ls, name=f"attn.{i}", kv_half=self.kv_half,
                                          **scores), axis=2)

    # -- products and norms -------------------------------------------------------------------
    def _product(self, walk: _Walk, y: Buffer, y_off: int, ldy: int, src: dict[str, Any],
                 ldx: int, w: DeviceWeight, rows: int, **kw: Any) -> None:
        """A product y = src's rows @ w.T (``src``: ``x``, ``x_off``, and ``norm`` or
        ``half_in`` where the rows are folded-norm or float16 ones). One sequence: the route
        ``matmul.linear`` takes for ``rows`` (with the fusions ``kw`` asks); paged: the
        row-invariant product, resizable."""
        b = self.b
        if self.one:
            kw.update(scratch=b.xh, wscratch=b.wh, pscratch=b.ph)
            for ln in matmul.linear(self.dev, y, y_off, ldy, src["x"], src["x_off"], ldx, w,
                                    rows, norm=src.get("norm"),
                                    half_in=src.get("half_in", False), **kw):
                walk.step.add(ln)
            return
        assert src["x_off"] == 0 and not src.get("half_in")
        for ln, at in self._matmul(y, y_off, ldy, src["x"], 0, ldx, w, rows,
                                   norm=src.get("norm"), single=walk.single, **kw):
            walk.step.add_resized(ln, at)

    def _matmul(self, y: Buffer, y_off: int, ldy: int, x: Buffer, x_off: int, ldx: int,
                w: DeviceWeight, m: int, bias: Buffer | None = None, accum: bool = False,
                name: str = "matmul", norm: tuple[Buffer, float] | None = None,
                glu: bool = False, act: str = "silu",
                single: bool = False) -> list[tuple[Launch, Callable[[int], Resize]]]:
        """The launches of a product whose row's sums are added in the same order whatever the
        batch, run on ``m`` rows, each with how to resize it to another row count: on GPUs the
        int8 rows (``matmul.matmul_qrows``, q4/q8 weights where the buffers hold their
        scratch) or the matmul kernel with one geometry for every batch; on CPUs (one
        work-item a column, no split of k) the matmul kernel, whose row's result does not
        depend on the rows a work-item takes (TM), which follows the batch (one sequence: the
        count's own). ``single``: one row's product (a single-row plan), never resized."""
        dev = self.dev
        kw: dict[str, Any] = dict(bias=bias, accum=accum, name=name, norm=norm, glu=glu,
                                  act=act)
        if single:
            ln = matmul.matmul(dev, y, y_off, ldy, x, x_off, ldx, w, m, **kw)
            return [(ln, lambda rows: ([], tuple(ln.global_size)))]
        if not self.one and self.b.xq is not None and matmul.int8_batch(dev, w):
            quant, prod = matmul.matmul_qrows(dev, y, y_off, ldy, x, x_off, ldx, w, m,
                                              self.b.xq, **kw)
            gq, gp = quant.global_size, prod.global_size
            qtm = matmul.qrows_rows(dev, w)
            return [(quant, lambda rows: ([(3, i32(rows))], (gq[0], rows))),
                    (prod, lambda rows: ([(9, i32(rows))], (gp[0], -(-rows // qtm))))]
        tm = self.tm(m) if not self.one else None
        if tm is not None and w.layout == "rb16":
            # float weights take fewer rows (and two blocks of columns) a work-item: a function
            # of tm, so the plan's key still holds it
            tm = matmul.rb_rows(tm, w.fmt, dev)
        if self.one:
            # PERF: a lone row of float weights (a decode row's router) takes the one-row
            # geometry, a work-group a column, not teams of a warp walking the whole row (H200,
            # float32 routers 2048x128 and 2880x32: ~10 and ~13 us a layer, latency-bound);
            # quantized weights keep float rows (not the int8 decode path: a router's choice)
            inv = m > 1 or w.int8
            ln = matmul.matmul(dev, y, y_off, ldy, x, x_off, ldx, w, m, row_invariant=inv, **kw)
            return [(ln, lambda rows: ([], tuple(ln.global_size)))]
        ln = matmul.matmul(dev, y, y_off, ldy, x, x_off, ldx, w, max(m, 2), tm=tm,
                           row_invariant=True, **kw)
        if tm is None:
            tm, _ = matmul.matmul_geometry(dev, 2, w.k, w.fmt)
        axis = 0 if w.layout == "rb16" else 1  # rb16: (row tiles, column blocks)
        g = ln.global_size

        def at(rows: int) -> Resize:
            size = list(g)
            size[axis] = -(-rows // tm)
            return [(9, i32(rows))], tuple(size)

        ((_, rows_arg),), ln.global_size = at(m)
        ln.args[9] = rows_arg
        return [(ln, at)]

    def _rmsnorm(self, step: StepPlan, y: Buffer, x: Buffer, wn: Buffer, m: int,
                 logits: bool = False, off: int = 0) -> None:
        ln = norm.rmsnorm(self.dev, y, x, off, self.cfg.dim, wn, m=m, k=self.cfg.dim,
                          eps=self.cfg.norm_eps)
        step.add_rows(ln, axis=0, per_row=ln.global_size[0] // m, logits=logits)

    def _normed(self, walk: _Walk, wn: Buffer | None, readers: list[DeviceWeight],
                rows: int | None = None, off: int = 0) -> dict[str, Any]:
        """The input of the products with ``readers`` after the pre-norm ``wn`` (none: the
        residual stream), of ``rows`` rows (the step's) from offset ``off`` of x: ``x``,
        ``x_off``, and ``norm`` where the products fold it in or ``half_in`` where a product
        left its float16 rows in xh (``_then_norm``)."""
        b, m = self.b, walk.m
        rows = m if rows is None else rows
        if wn is None:
            return {"x": b.x, "x_off": off}
        if wn is walk.ready.pop("norm", None) and rows == m and off == 0:
            return {"x": b.xh, "x_off": 0, "half_in": True}
        if self.one:
            folds = all(matmul.fused_norm(self.dev, r, rows) for r in readers)
        else:  # (on GPUs the norms are folded into the products that read them)
            folds = matmul.fused_prologues(self.dev)
        if folds:
            return {"x": b.x, "x_off": off, "norm": (wn, self.cfg.norm_eps)}
        self._rmsnorm(walk.step, b.xn, b.x, wn, rows, off=off)
        return {"x": b.xn, "x_off": 0}

    def _then_norm(self, walk: _Walk, out: DeviceWeight, wn: Buffer | None,
                   readers: list[DeviceWeight]) -> dict[str, Any]:
        """(One sequence, GPUs) ``_block_out``'s arguments for the product ``out`` to leave the
        float16 rows of the next pre-norm ``wn`` (read by ``readers``) in xh, which _normed
        then hands on.

        PERF (GPUs): where those products are tensor-core ones of these m rows (for a split
        product: in the pass that adds up its slices) (H100, 1B body, two runs each way: Q4_0
        pp128 53.0-56.2k -> 58.0-58.5k tok/s, pp512 130-132k -> 133-136k; F16 within the
        runs' spread, pp512 125-128k -> 128-131k)"""
        dev, m, b = self.dev, walk.m, self.b
        if (not self.one or not matmul.fused_prologues(dev) or self.branch or wn is None
                or not all(matmul.tensor_core_route(dev, m, r, b.wh)
                           and matmul.fused_norm(dev, r, m) for r in [out] + readers)):
            return {}
        walk.ready["norm"] = wn
        return {"norm_after": (wn, self.cfg.norm_eps, b.xh)}

    def _block_out(self, walk: _Walk, wo: DeviceWeight, src: dict[str, Any], k: int,
                   post: Buffer | None, name: str, **kw: Any) -> None:
        """A block's output product (and its bias, ``bias=``, where it has one) added to the
        residual stream (after the block's post-norm and residual scale where the family has
        them)."""
        cfg, b, m = self.cfg, self.b, walk.m
        if not self.branch:
            self._product(walk, b.x, 0, cfg.dim, src, k, wo, m, accum=True, name=name, **kw)
            return
        self._product(walk, b.t, 0, cfg.dim, src, k, wo, m, name=name, **kw)
        ln = norm.residual(self.dev, b.x, b.t, post, m=m, k=cfg.dim, eps=cfg.norm_eps,
                           scale=cfg.residual_scale)
        walk.step.add_rows(ln, axis=0, per_row=ln.global_size[0] // m)
