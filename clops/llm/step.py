"""llm, step: the launches of one batched step of any family in ``arch.ARCHS`` over a paged KV
cache, for ``BatchEngine`` (which feeds the rows, owns the cache's blocks and chooses tokens).

A step runs a ragged batch of rows (decode rows and prompt chunks of many sequences) through
every layer as the family describes it (``ModelConfig`` and the typed weights of
``Model.weights``): pre-norms, post/sandwich norms and residual multipliers, Q/K biases and
QK-norm, whole, partial or no rotary, sliding-window layers, soft-capped attention scores, the
GLU's activation, the embedding's scale and the logits' scale and soft cap. Each choice takes
the kernels ``Model``'s own plan takes for it; the attention is the paged kernels'.

Every row's values depend on that row and its own sequence alone (the products run with one
kernel geometry for any number of rows, attention is per row), so a sequence gets the same
tokens whether it runs alone or batched with others."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..kernels import Launch, LaunchPlan, activation, launch, matmul, norm, paged, sample
from ..kernels.launch import i32
from ..kernels.paged import PagedRows
from ..nn.quant import DeviceWeight
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
    plan holds now; ``logits`` in a resize: it follows the logits rows)."""

    plan: LaunchPlan
    resizes: list[tuple[int, Callable[[int], Resize], bool]]
    rows: int
    nl: int

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

    def resize(self, rows: int, nl: int) -> None:
        changes = [(i, *at(nl if logits else rows)) for i, at, logits in self.resizes
                   if (nl != self.nl if logits else rows != self.rows)]
        if changes:
            self.plan.resize(changes)
        self.rows, self.nl = rows, nl


@dataclass(frozen=True)
class StepBuffers:
    """The device buffers a step reads and writes, for ``rows`` rows at most (``logits_rows``
    for the rows with logits): the residual stream ``x``, normed rows ``xn``, a block's output
    before its post-norm ``t``, QKV rows, rotated queries ``q``, attention output ``attn``,
    [gate | up] rows ``gu`` and the GLU's ``h``; the gathered logits rows ``xl``, ``logits``
    and their statistics ``rstats`` (argmax, max, log-sum-exp); per row its token ``ids``;
    the logits rows' indices ``sel``; ``zero`` (an int32 0); and the split attention's
    partials and counters (``part``, ``count``; None where it does not run); the mixture of
    experts' scratch (``experts``; None for a dense model)."""

    x: Buffer
    xn: Buffer
    t: Buffer
    qkv: Buffer
    q: Buffer
    attn: Buffer
    gu: Buffer
    h: Buffer
    xl: Buffer
    logits: Buffer
    rstats: Buffer
    ids: Buffer
    sel: Buffer
    zero: Buffer
    part: Buffer | None
    count: Buffer | None
    experts: ExpertBuffers | None = None


def branch_out(cfg: ModelConfig, weights: ModelWeights) -> bool:
    """Whether a block's output goes through a post-norm or a residual scale before the add
    (else the output product adds to the residual stream itself)."""
    return cfg.residual_scale != 1.0 or any(
        ly.post_attn_norm is not None or ly.post_ffn_norm is not None for ly in weights.layers)


class PagedStep:
    """Builds the launches of a step of ``n`` rows of ``cfg``'s family over the paged cache
    (``kpool``/``vpool``: a pool a layer; ``rows``: where each row lives) into ``bufs``.

    >>> builder = PagedStep(dev, model.config, model.weights, bufs, rows, kpool, vpool,
    ...                     context=4096, kv_half=False, split=False)
    >>> builder.build(n=5, nl=2).plan.replay()

    A part of a model split over devices (``weights.layers`` its layers alone, ``kpool`` and
    ``vpool`` theirs) leaves out the embedding (``embeds=False``: its rows arrive in ``x``) or
    the final norm and logits (``heads=False``).
    """

    def __init__(self, dev: CLDevice, cfg: ModelConfig, weights: ModelWeights,
                 bufs: StepBuffers, rows: PagedRows, kpool: list[Buffer], vpool: list[Buffer],
                 *, context: int, kv_half: bool, split: bool, embeds: bool = True,
                 heads: bool = True) -> None:
        self.dev, self.cfg, self.w, self.b = dev, cfg, weights, bufs
        self.rows, self.kpool, self.vpool = rows, kpool, vpool
        self.context, self.kv_half, self.split = context, kv_half, split
        # (a part of a model split over devices: whether it makes the rows from the tokens, and
        # whether it ends them with the final norm and the logits)
        self.embeds, self.heads = embeds, heads
        self.branch = branch_out(cfg, weights)

    def tm(self, m: int) -> int | None:
        """Rows per work-item of the step's matmuls on CPUs (a compile-time constant, so a plan
        serves the row counts of one value); None on GPUs (one geometry for every batch)."""
        return min(8, launch.pow2_at_most(m)) if launch.is_cpu(self.dev) else None

    def _matmul(self, y: Buffer, y_off: int, ldy: int, x: Buffer, x_off: int, ldx: int,
                w: DeviceWeight, m: int, bias: Buffer | None = None, accum: bool = False,
                name: str = "matmul", norm: tuple[Buffer, float] | None = None,
                glu: bool = False) -> tuple[Launch, Callable[[int], Resize]]:
        """The matmul kernel with the geometry it takes for several rows, run on ``m`` rows,
        so that a row's sums are added in the same order whatever the batch: on GPUs one
        geometry for every batch; on CPUs (one work-item a column, no split of k) a row's
        result does not depend on the rows a work-item takes (TM), which follows the batch.
        Also returns how to resize the launch to another row count."""
        dev = self.dev
        tm = self.tm(m)
        if tm is not None and w.layout == "rb16":
            # float weights take fewer rows (and two blocks of columns) a work-item: a function
            # of tm, so the plan's key still holds it
            tm = matmul.rb_rows(tm, w.fmt, dev)
        ln = matmul.matmul(dev, y, y_off, ldy, x, x_off, ldx, w, max(m, 2), bias=bias,
                           accum=accum, name=name, norm=norm, glu=glu, tm=tm,
                           row_invariant=True)
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
        return ln, at

    def build(self, n: int, nl: int, embed: bool = False) -> StepPlan:
        """The launches of a step of ``n`` rows with logits for ``nl`` of them (or, ``embed``,
        the final norm of every row into ``xn`` instead), resizable to other counts of rows
        that take the same rows per work-item (``tm``)."""
        cfg, dev, w, b = self.cfg, self.dev, self.w, self.b
        dim = cfg.dim
        step = StepPlan(LaunchPlan(dev), [], n, nl)
        if self.embeds:
            step.add_rows(matmul.embedding(dev, b.x, b.ids, b.zero, w.embed, n), axis=1)
        if self.embeds and cfg.embed_scale != 1.0:
            step.add_rows(activation.scale_cap(dev, b.x, n * dim, mul=cfg.embed_scale), axis=0,
                          per_row=dim)
        for i, ly in enumerate(w.layers):
            self._layer(step, i, ly, n)
        if not self.heads:
            return step
        if embed:
            self._rmsnorm(step, b.xn, b.x, w.out_norm, n)
        elif nl:  # the logits rows
            V = cfg.vocab_size
            step.add_rows(paged.gather_rows(dev, b.xl, b.x, b.sel, m=nl, k=dim,
                                            head_dim=cfg.head_dim, neox=cfg.rope_neox,
                                            rot_dim=cfg.rotary), axis=1, logits=True)
            self._rmsnorm(step, b.xn, b.xl, w.out_norm, nl, logits=True)
            step.add_resized(*self._matmul(b.logits, 0, V, b.xn, 0, dim, w.output, nl,
                                           name="lm_head"), logits=True)
            if cfg.logit_scale != 1.0 or cfg.final_softcap:
                step.add_rows(activation.scale_cap(dev, b.logits, nl * V, div=cfg.logit_scale,
                                                   cap=cfg.final_softcap),
                              axis=0, per_row=V, logits=True)
            step.add_rows(sample.row_stats(dev, b.rstats, b.logits, rows=nl, vocab=V), axis=1,
                          logits=True)
        return step

    def _rmsnorm(self, step: StepPlan, y: Buffer, x: Buffer, wn: Buffer, m: int,
                 logits: bool = False) -> None:
        ln = norm.rmsnorm(self.dev, y, x, 0, self.cfg.dim, wn, m=m, k=self.cfg.dim,
                          eps=self.cfg.norm_eps)
        step.add_rows(ln, axis=0, per_row=ln.global_size[0] // m, logits=logits)

    def _normed(self, step: StepPlan, wn: Buffer | None, n: int,
                fuse: bool) -> tuple[Buffer, tuple[Buffer, float] | None]:
        """The input of a block's products after its pre-norm ``wn`` (none: the residual
        stream itself), and the norm they fold in (GPUs), if any."""
        b = self.b
        if wn is None:
            return b.x, None
        if fuse:
            # PERF: on GPUs the norms are folded into the matmuls that read them
            return b.x, (wn, self.cfg.norm_eps)
        self._rmsnorm(step, b.xn, b.x, wn, n)
        return b.xn, None

    def _block_out(self, step: StepPlan, wo: DeviceWeight, x: Buffer, k: int,
                   post: Buffer | None, n: int, name: str, glu: bool = False,
                   bias: Buffer | None = None) -> None:
        """A block's output product (with its bias where it has one) added to the residual
        stream (after the block's post-norm and residual scale where the family has them)."""
        cfg, b = self.cfg, self.b
        if not self.branch:
            step.add_resized(*self._matmul(b.x, 0, cfg.dim, x, 0, k, wo, n, accum=True,
                                           name=name, glu=glu, bias=bias))
            return
        step.add_resized(*self._matmul(b.t, 0, cfg.dim, x, 0, k, wo, n, name=name, glu=glu,
                                       bias=bias))
        ln = norm.residual(self.dev, b.x, b.t, post, m=n, k=cfg.dim, eps=cfg.norm_eps,
                           scale=cfg.residual_scale)
        step.add_rows(ln, axis=0, per_row=ln.global_size[0] // n)

    def _layer(self, step: StepPlan, i: int, ly: LayerWeights, n: int) -> None:
        cfg, dev, b = self.cfg, self.dev, self.b
        H, KV, D, F, dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.dim
        n_qkv, eps = (H + 2 * KV) * D, cfg.norm_eps
        fuse = matmul.fused_prologues(dev)
        xin, prologue = self._normed(step, ly.attn_norm, n, fuse)
        for wq, off, bias in ly.qkv.parts:
            step.add_resized(*self._matmul(b.qkv, off, n_qkv, xin, 0, dim, wq, n, bias=bias,
                                           name=f"qkv.{i}", norm=prologue))
        if ly.q_norm is not None and ly.k_norm is not None:
            whole = cfg.desc.qk_norm == "full"
            step.add_rows(norm.qk_norm(dev, b.qkv, n_qkv, m=n, nq=1 if whole else H,
                                       lq=H * D if whole else D, nk=1 if whole else KV,
                                       lk=KV * D if whole else D, wq=ly.q_norm, wk=ly.k_norm,
                                       eps=eps), axis=1)
        kp, vp = self.kpool[i], self.vpool[i]
        step.add_rows(paged.rope_store(dev, b.q, b.qkv, n_qkv, kp, vp, self.rows, ly.inv_freq,
                                       m=n, n_heads=H, n_kv=KV, head_dim=D, neox=cfg.rope_neox,
                                       rot_dim=cfg.rotary, name=f"rope_store.{i}",
                                       kv_half=self.kv_half), axis=2)
        # YaRN's factor on cos and sin, on both q and k: squared on the scores
        scale = cfg.scale * cfg.rope_mscale() ** 2
        scores: dict[str, Any] = dict(softcap=cfg.attn_softcap, window=ly.window,
                                      sinks=ly.sinks)
        if self.split:
            assert b.part is not None and b.count is not None
            for ln in paged.attention_split(dev, b.attn, b.part, b.count, b.q, kp, vp,
                                            self.rows, m=n, n_heads=H, n_kv=KV, head_dim=D,
                                            scale=scale, context=self.context,
                                            name=f"attn.{i}", kv_half=self.kv_half, **scores):
                step.add_rows(ln, axis=2)
        else:
            ls = 1 if launch.is_cpu(dev) else 32
            step.add_rows(paged.attention(dev, b.attn, b.q, kp, vp, self.rows, m=n, n_heads=H,
                                          n_kv=KV, head_dim=D, scale=scale, lsize=ls,
                                          name=f"attn.{i}", kv_half=self.kv_half, **scores),
                          axis=2)
        self._block_out(step, ly.o, b.attn, H * D, ly.post_attn_norm, n, f"o.{i}",
                        bias=ly.o_bias)
        if ly.experts is not None:
            self._experts(step, i, ly, ly.experts, n)
            return
        assert ly.gate_up is not None and ly.down is not None
        xin, prologue = self._normed(step, ly.ffn_norm, n, fuse)
        for wg, off, bias in ly.gate_up.parts:
            step.add_resized(*self._matmul(b.gu, off, 2 * F, xin, 0, dim, wg, n, bias=bias,
                                           name=f"gate_up.{i}", norm=prologue))
        if fuse and cfg.act == "silu":
            # PERF: on GPUs the SiLU GLU is folded into the down product that reads it
            self._block_out(step, ly.down, b.gu, 2 * F, ly.post_ffn_norm, n, f"down.{i}",
                            glu=True)
        else:
            step.add_rows(activation.glu(dev, b.h, b.gu, m=n, f=F, act=cfg.act), axis=1)
            self._block_out(step, ly.down, b.h, F, ly.post_ffn_norm, n, f"down.{i}")

    def _experts(self, step: StepPlan, i: int, ly: LayerWeights, ex: Experts, n: int) -> None:
        """A layer's mixture of experts (``experts.ffn``) after its pre-norm, added to the
        residual stream (after its post-norm and scale where it has them)."""
        cfg, b = self.cfg, self.b
        assert b.experts is not None
        xn = b.x
        if ly.ffn_norm is not None:
            self._rmsnorm(step, b.xn, b.x, ly.ffn_norm, n)
            xn = b.xn
        step.add_resized(*self._matmul(b.experts.logits, 0, ex.n, xn, 0, cfg.dim, ex.router, n,
                                       bias=ex.router_bias, name=f"router.{i}"))
        # (GPUs: one plan serves every row count, so its tile is a batch's, also for one row)
        t = experts.tile(self.dev, [ex], n if launch.is_cpu(self.dev) else max(n, 2))
        out = b.t if self.branch else b.x
        for ln, at in experts.ffn(self.dev, cfg, ex, xn, n, b.experts, out, t,
                                  accum=not self.branch, name=str(i)):
            step.add_resized(ln, at)
        if self.branch:
            ln = norm.residual(self.dev, b.x, b.t, ly.post_ffn_norm, m=n, k=cfg.dim,
                               eps=cfg.norm_eps, scale=cfg.residual_scale)
            step.add_rows(ln, axis=0, per_row=ln.global_size[0] // n)
