"""llm, batch: continuous batching of many sequences on one loaded model, for ``clops serve``.

A ``BatchEngine`` keeps up to ``max_batch`` sequences in flight, on a model of any family
of ``arch.ARCHS``. Each ``step()`` runs one launch plan (built by ``step.StepBuilder``) over a
ragged batch of rows: one row for every sequence that is decoding, and the
next chunk of the prompt of sequences still being prefilled (at most ``prefill_chunk`` prompt
rows a step, so that a long prompt does not stall the others). The KV cache is paged: every
layer has one pool of blocks of ``block_size`` positions, each sequence a table of its blocks,
taken from a free list when it is admitted (its prompt and ``max_new_tokens`` reserved at once,
so that a running sequence never waits for memory) and given back when it finishes or is
cancelled. Full blocks of a prompt are kept, by a hash of the tokens up to their end, after
their sequence ends and until their memory is needed: a later prompt that begins with the
same tokens (a system prompt) reuses them and skips their prefill.

Every row's values depend on that row and its own sequence alone (the products run with one
kernel geometry for any number of rows, attention is per row), so a sequence gets the same
tokens whether it runs batched with few others or many. One exception, for speed: where the
single-sequence decode kernel runs (``StepBuilder.lone_row``: NVIDIA GPUs, plain decoders), a
step of one decode row alone runs its layers in a few launches of that kernel, whose sums
differ from the batched products' in the last bits (``row_invariant=True`` keeps every step on
the batched plan). A greedy row with nothing else asked of it takes its token and
log-probability from the device (``sample.row_stats``: argmax, max and log-sum-exp of each
row); the others are chosen on the host from their logits, each sequence with its own
settings, random generator and optional mask of allowed tokens (constrained decoding).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..kernels import LaunchPlan, matmul, paged
from ..kernels.paged import PagedRows
from ..runtime import CLDevice
from . import experts
from .arch import ARCHS
from .loaded import LoadedModel, ModelWeights
from .placement import Chain
from .step import Paged, StepBuffers, StepBuilder, StepPlan, branch_out


@dataclass
class SamplingParams:
    """How one sequence's tokens are chosen (for ``Model.generate``, ``BatchEngine.add`` and
    ``clops serve``'s requests).

    - ``temperature``: 0 is greedy (the most likely token); above 0, tokens are drawn from
      softmax(logits / temperature) after the filters below.
    - ``top_k`` (0: off), ``top_p`` (1: off), ``min_p`` (0: off): keep the k most likely
      tokens; the most likely ones whose probabilities add up to p; the ones at least
      min_p times as likely as the most likely one.
    - ``repetition_penalty`` (1: off): the logits of tokens of the prompt or generated so
      far divided by it where positive, multiplied where negative.
    - ``presence_penalty``, ``frequency_penalty`` (OpenAI's, in [-2, 2]): each token's logit
      less presence_penalty if it was generated before, and frequency_penalty times how
      often; ``logit_bias``: {token id: bias in [-100, 100]} added to those tokens' logits.
    - ``seed``: makes the draws repeatable (None: a random one).
    - ``max_tokens``: the most new tokens (None: the caller's own limit); ``stop``: strings
      that end the text where they first appear (not included in it). ``Model.generate``
      reads these two; ``BatchEngine.add`` takes its limit as an argument and leaves stop
      strings to its caller.
    - ``logprobs``: how many of the most likely tokens to report with each token (the chosen
      one always is; ``BatchEngine``'s outputs).

    >>> SamplingParams(temperature=0.7, top_p=0.9, seed=1, max_tokens=64, stop=["\\n\\n"])
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    logprobs: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)

    @property
    def shapes_logits(self) -> bool:
        """Whether a token's choice needs the row's logits on the host (not the device's
        argmax alone)."""
        return (self.temperature != 0.0 or self.repetition_penalty != 1.0
                or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or bool(self.logit_bias) or bool(self.logprobs))

    def check(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be 0 (greedy) or positive, not {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (off) or positive, not {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], not {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must lie in [0, 1], not {self.min_p}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError("repetition_penalty must be positive, not "
                             f"{self.repetition_penalty}")
        if not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must lie in [0, 20], not {self.logprobs}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (math.isfinite(v) and -2.0 <= v <= 2.0):
                raise ValueError(f"{name} must lie in [-2, 2], not {v}")
        if not isinstance(self.logit_bias, dict):
            raise TypeError("logit_bias must be a dict of token id to bias, not "
                            f"{type(self.logit_bias).__name__}")
        for t, b in self.logit_bias.items():
            if isinstance(t, bool) or not isinstance(t, int | np.integer):
                raise TypeError(f"logit_bias keys are token ids (int), not {t!r}")
            if not (math.isfinite(b) and -100.0 <= b <= 100.0):
                raise ValueError(f"logit_bias of token {t} must lie in [-100, 100], not {b}")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or
                                            not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be None or at least 1, not {self.max_tokens!r}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) for s in self.stop):
            raise TypeError(f"stop must be a list of strings, not {self.stop!r}")


def unsupported(model: LoadedModel) -> str | None:
    """Why ``BatchEngine`` cannot run ``model`` (None: it can)."""
    cfg = model.config
    if cfg.arch not in ARCHS:
        return (f"batched decoding runs the {', '.join(sorted(ARCHS))} architectures, not "
                f"{cfg.arch!r} (clops.llm.Model runs it one sequence at a time)")
    if cfg.head_dim % 4:
        return (f"batched decoding needs heads of a multiple of 4 dimensions, not "
                f"{cfg.head_dim}")
    return None


def shape_logits(row: np.ndarray, p: SamplingParams, seen: set[int] | Any,
                 counts: dict[int, int]) -> np.ndarray:
    """``row``'s logits after ``p``'s repetition penalty (over the tokens ``seen``: the prompt's
    and the generated), presence and frequency penalties (over the generated tokens'
    ``counts``) and logit bias; ``row`` itself where none applies."""
    z = row
    if p.repetition_penalty != 1.0 and seen:
        z = z.astype(np.float64)
        idx = np.fromiter(seen, np.int64)
        v = z[idx]
        z[idx] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and counts:
        z = z.astype(np.float64)
        idx = np.fromiter(counts, np.int64, len(counts))
        n = np.fromiter(counts.values(), np.float64, len(counts))
        z[idx] -= p.presence_penalty + p.frequency_penalty * n
    if p.logit_bias:
        z = z.astype(np.float64)
        idx = np.fromiter(p.logit_bias, np.int64, len(p.logit_bias))
        z[idx] += np.fromiter(p.logit_bias.values(), np.float64, len(p.logit_bias))
    return z


def choose(z: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """The token ``p`` chooses from the shaped logits ``z`` (disallowed tokens at -inf):
    the argmax when greedy, else a draw after temperature, top-k, top-p and min-p."""
    if p.temperature == 0.0:
        return int(np.argmax(z))
    return _sample(z.astype(np.float64) / p.temperature, p, rng)


@dataclass
class StepOutput:
    """A token chosen for sequence ``seq`` in one step."""

    seq: int
    token: int
    logprob: float
    top: list[tuple[int, float]]
    finished: bool
    reason: str | None
    # set when this sequence failed alone (its token mask, its sampling): it is let go, and
    # ``token`` means nothing
    error: Exception | None = None


@dataclass
class _Seq:
    id: int
    ids: list[int]
    params: SamplingParams
    max_new: int
    mask: Callable[[int], np.ndarray | None] | None
    rng: np.random.Generator
    slot: int = -1
    blocks: list[int] = field(default_factory=list)
    done: int = 0  # prompt positions whose KV is in the cache
    produced: int = 0
    last: int = -1  # the last token chosen (the next decode row's input)
    seen: set[int] = field(default_factory=set)  # the prompt's tokens and the generated
    counts: dict[int, int] = field(default_factory=dict)  # generated tokens, how often each

    @property
    def length(self) -> int:
        return len(self.ids) + self.produced


@dataclass
class _Ahead:
    """A lone greedy row's next step, enqueued before its previous step's token was read
    (``BatchEngine._enqueue_ahead``): sequence ``seq``'s decode row at ``pos``, whose token is
    the previous step's argmax on the device; ``stats`` fills when ``event`` completes."""

    seq: _Seq
    pos: int
    stats: np.ndarray
    event: Any


LONE = "lone"  # (the key of the lone decode row's plan: BatchEngine._plan)
SINGLE = "single"  # (the single decode row's plan's)


class _EnginePart:
    """The engine's buffers, cache pools and step builder on one device: the whole model's, or
    for a model split over devices, one part's (``weights.layers`` its layers alone, the
    embedding where it ``embeds``, the final norm and logits where it ``heads``)."""

    def __init__(self, engine: BatchEngine, dev: CLDevice, weights: ModelWeights, *,
                 first: int, embeds: bool, heads: bool) -> None:
        cfg, R, e = engine.model.config, engine.rows, engine
        H, KV, D, F, dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.dim
        f4 = 4
        self.device = dev
        self.x = dev.alloc(R * dim * f4)
        self.xn = dev.alloc(R * dim * f4)
        # (the logits rows, on the part with the head)
        B, V = (e.max_batch, cfg.vocab_size) if heads else (1, 1)
        self.xl = dev.alloc(B * dim * f4)
        # a block's output before its post-norm or residual scale (families that have them)
        self.t = dev.alloc(R * dim * f4 if branch_out(cfg, weights) else 4)
        self.qkv = dev.alloc(R * (H + 2 * KV) * D * f4)
        self.q = dev.alloc(R * H * D * f4)
        self.attn = dev.alloc(R * H * D * f4)
        self.gu = dev.alloc(R * 2 * F * f4)
        self.h = dev.alloc(R * F * f4)
        self.logits = dev.alloc(B * V * f4)
        self.rstats = dev.alloc(B * 3 * f4)  # (argmax, max, lse) a row
        self.ids = dev.alloc(R * 4)
        self.rslot = dev.alloc(R * 4)
        self.rpos = dev.alloc(R * 4)
        self.sel = dev.alloc(B * 4)
        self.zero = dev.alloc(16)
        dev.write(self.zero, np.zeros(4, np.int32), blocking=True, queue=dev.queue)
        self.table = dev.alloc(e.table_host.nbytes)
        dev.write(self.table, e.table_host, blocking=True, queue=dev.queue)
        self.split = paged.split_attention(dev, D)
        part = count = None
        if self.split:  # the partials of the attention split over positions, and its counters
            part = dev.alloc(paged.part_floats(dev, R, H, D, e.context) * f4)
            count = dev.alloc(R * H * 4)
            dev.write(count, np.zeros(R * H, np.int32), blocking=True, queue=dev.queue)
        pool = e.num_blocks * KV * e.block_size * D * (2 if e.kv_half else 4)
        self.kpool = [dev.alloc(pool) for _ in weights.layers]
        self.vpool = [dev.alloc(pool) for _ in weights.layers]
        moe = [ly.experts for ly in weights.layers if ly.experts is not None]
        # the int8 rows of the step's products where its weights take them (GPUs: q4/q8), for
        # its most rows of the longest k
        mats = [w for ly in weights.layers for w in (ly.o, ly.down) if w is not None]
        xq = matmul.qrows_scratch(dev, R, max(dim, F, H * D)) \
            if any(matmul.int8_batch(dev, w) for w in mats) else None
        bufs = StepBuffers(x=self.x, xn=self.xn, t=self.t, qkv=self.qkv, q=self.q,
                           attn=self.attn, gu=self.gu, h=self.h, logits=self.logits,
                           ids=self.ids, ids_at=self.zero,
                           experts=experts.buffers(dev, cfg, moe, R) if moe else None,
                           xl=self.xl, rstats=self.rstats, sel=self.sel, xq=xq)
        rows = PagedRows(self.table, e.maxb, self.rslot, self.rpos, e.block_size)
        cache = Paged(tuple(self.kpool), tuple(self.vpool), rows, e.context, self.split, part,
                      count)
        self.builder = StepBuilder(dev, cfg, weights, bufs, cache, first=first,
                                   embeds=embeds, heads=heads, kv_half=e.kv_half)
        self.plans: dict[int | None | str, StepPlan] = {}

    def plan(self, n: int, span: int | None = None, single: bool = False) -> LaunchPlan:
        """The launches of this part (not the last) for a step of ``n`` rows (``span``: the
        most positions a row attends to, None: the context; ``single``: the single decode row's
        plan, ``BatchEngine._single``)."""
        key: int | None | str = SINGLE if single else self.builder.tm(n)
        got = self.plans.get(key)
        if got is None:
            got = self.plans[key] = self.builder.rows(n, 0, single=single)
        got.resize(n, 0, span)
        return got.plan


class BatchEngine:
    """Continuous batching over ``model`` (see the module's text).

    >>> engine = BatchEngine(clops.llm.load(), max_batch=8)
    >>> a = engine.add(ids, SamplingParams(), max_new_tokens=32)
    >>> while engine.has_work():
    ...     for out in engine.step():
    ...         print(out.seq, out.token)
    """

    def __init__(self, model: LoadedModel, max_batch: int = 8, block_size: int = 16,
                 num_blocks: int | None = None, prefill_chunk: int = 64,
                 row_invariant: bool = False) -> None:
        cfg = model.config
        why = unsupported(model)
        if why is not None:
            raise ValueError(why)
        if max_batch < 1 or block_size < 1 or prefill_chunk < 1:
            raise ValueError("max_batch, block_size and prefill_chunk must be positive")
        self.model, self.device = model, model.device
        self.max_batch, self.block_size, self.prefill_chunk = max_batch, block_size, prefill_chunk
        self.row_invariant = row_invariant
        self.context = int(model.max_seq)
        self.maxb = -(-self.context // block_size)
        # (the model's cache type: float16 values on GPUs by default, so that a sequence gets
        # the same tokens batched as from the model alone)
        self.kv_half = bool(model.kv_half)
        per_block = 2 * cfg.n_layers * cfg.n_kv_heads * block_size * cfg.head_dim * (
            2 if self.kv_half else 4)
        if num_blocks is None:
            # every slot at full context, within a quarter of the device's memory
            num_blocks = min(max_batch * self.maxb,
                             max(self.maxb, self.device.caps.global_mem // 4 // per_block))
        if num_blocks < 1:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = int(num_blocks)
        self.rows = max_batch + prefill_chunk  # the most rows one step runs
        self.weights = model.weights
        # slot max_batch is the embedding's scratch sequence
        self.table_host = np.zeros((self.max_batch + 1, self.maxb), np.int32)
        self._alloc()
        # one plan per (rows per work-item of the products and of the logits, embed), resized
        # to each step's rows (see _plan), and the lone and single decode rows' own
        self._plans: dict[tuple[int | None, int | None, bool] | str, StepPlan] = {}
        self._lock = threading.RLock()
        self._waiting: deque[_Seq] = deque()
        self._running: dict[int, _Seq] = {}  # by slot
        self._by_id: dict[int, _Seq] = {}
        self._next_id = 0
        self._free = list(range(self.num_blocks - 1, -1, -1))
        self._ref = [0] * self.num_blocks
        self._cached: OrderedDict[bytes, int] = OrderedDict()  # prompt-prefix hash -> block
        self._hash_of: dict[int, bytes] = {}
        self._in_step = False
        # (a lone greedy sequence's next step, already enqueued: _step_ahead reads it)
        self._ahead: _Ahead | None = None
        self._cancel_later: set[int] = set()
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.reused_tokens = 0

    # -- device memory and plans ------------------------------------------------------------
    def _alloc(self) -> None:
        # a model split over devices: a part of the engine on each (its layers, their cache
        # pools and the step's buffers), the last one's the engine's own
        stages = list(self.model.stages)
        w = self.weights
        spans = [(st.device, st.first, st.stop) for st in stages] if len(stages) > 1 else \
            [(self.device, 0, len(w.layers))]
        parts = [_EnginePart(self, dev, replace(w, layers=w.layers[first:stop]),
                             first=first, embeds=first == 0, heads=stop == len(w.layers))
                 for dev, first, stop in spans]
        self._before = parts[:-1]
        last = parts[-1]
        self._last = last
        self.x, self.xn, self.logits, self.rstats = last.x, last.xn, last.logits, last.rstats
        self.sel, self.split, self.builder = last.sel, last.split, last.builder

    def _tm(self, m: int) -> int | None:
        """Rows per work-item of the step's products for ``m`` rows (``StepBuilder.tm``)."""
        return self.builder.tm(m)

    def _plan(self, n: int, nl: int, embed: bool = False, decode: bool = False,
              span: int | None = None) -> LaunchPlan:
        """The launches of a step of ``n`` rows with logits for ``nl`` of them (or, ``embed``,
        the final norm of every row instead; ``decode``: every row is a decode row of its own
        sequence: one such row alone may take a plan of its own, ``_lone`` and ``_single``). A
        plan is made once per rows per work-item of the step's products and of the logits' (a
        compile-time constant on CPUs; one value on GPUs), whether there are logits rows and
        ``embed``; it is resized to ``n`` and ``nl`` rows.
        Making one costs a kernel object per launch (about 0.06 ms each with pyopencl; PERF,
        H100, SmolLM2, 16 streams: a plan per logits-row count made a step of 50-80 ms for
        each count met first, and halved a wave's tokens a second), resizing sets a few
        arguments and sizes."""
        if self._lone(n, nl, embed, decode):
            # PERF (H200, SmolLM2, one stream): a lone decode row's layers in two launches of
            # the single-sequence kernel, not 185 launches (2.15 ms of enqueues a step)
            got = self._plans.get(LONE)
            if got is None:
                got = self._plans[LONE] = self.builder.rows(1, 1, lone=True)
            return got.plan
        if self._single(n, nl, embed, decode):
            # PERF (H200, Qwen3-0.6B body Q8_0, one stream): one row's products, a launch each,
            # in place of the batched int8 rows' two
            got = self._plans.get(SINGLE)
            if got is None:
                got = self._plans[SINGLE] = self.builder.rows(1, 1, single=True)
            got.resize(1, 1, span)
            return got.plan
        key = (self._tm(n), self._tm(nl) if nl else 0, embed)
        got = self._plans.get(key)
        if got is None:
            got = self._plans[key] = self.builder.rows(n, nl, embed)
        got.resize(n, nl, span)
        return got.plan

    def _single(self, n: int, nl: int, embed: bool, decode: bool) -> bool:
        """Whether a step takes the single decode row's plan (``StepBuilder.single_row``)."""
        return (n == 1 and nl == 1 and decode and not embed and not self.row_invariant
                and all(p.builder.single_row() for p in self._parts()))

    def _lone(self, n: int, nl: int, embed: bool, decode: bool) -> bool:
        """Whether a step takes the lone decode row's plan (``StepBuilder.lone_row``)."""
        return (n == 1 and nl == 1 and decode and not embed and not self.row_invariant
                and not self._before and self.builder.lone_row())

    def _run(self, n: int, nl: int, embed: bool = False, decode: bool = False,
             span: int | None = None) -> None:
        """Run a step of ``n`` rows (``_plan``'s; ``span``: the most positions a row attends
        to, None: the context), through every part of a split model."""
        plan = self._plan(n, nl, embed, decode, span)
        if not self._before:
            plan.replay()
            return
        single = self._single(n, nl, embed, decode)
        chain = [(p.device, p.x, p.plan(n, span, single)) for p in self._before]
        Chain(chain + [(self.device, self.x, plan)], n * self.model.config.dim * 4).replay()

    def _write_rows(self, slots: np.ndarray, positions: np.ndarray, ids: np.ndarray) -> None:
        """The step's rows (each one's slot, position and token) to every part's buffers."""
        for p in self._parts():
            q = p.device.queue
            p.device.write(p.rslot, np.ascontiguousarray(slots), queue=q)
            p.device.write(p.rpos, np.ascontiguousarray(positions), queue=q)
            p.device.write(p.ids, np.ascontiguousarray(ids), queue=q)

    def _write_table(self) -> None:
        """The block tables to every part's device."""
        for p in self._parts():
            p.device.write(p.table, self.table_host, blocking=True, queue=p.device.queue)

    def _parts(self) -> list[_EnginePart]:
        return self._before + [self._last]

    # -- sequences -----------------------------------------------------------------------------
    def add(self, ids: list[int], params: SamplingParams, max_new_tokens: int,
            mask: Callable[[int], np.ndarray | None] | None = None) -> int:
        """Queue a sequence (its prompt ``ids``); returns its id for ``step``'s outputs."""
        ids = [int(t) for t in ids]
        V = self.model.config.vocab_size
        if not ids:
            raise ValueError("the prompt is empty: give at least one token")
        if min(ids) < 0 or max(ids) >= V:
            raise ValueError(f"token ids must lie in [0, {V})")
        if any(not 0 <= t < V for t in params.logit_bias):
            raise ValueError(f"logit_bias names tokens outside [0, {V})")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, not {max_new_tokens}")
        if len(ids) + max_new_tokens > self.context:
            raise ValueError(
                f"{len(ids)} prompt tokens + {max_new_tokens} new tokens exceed the context of "
                f"{self.context} tokens")
        if -(-(len(ids) + max_new_tokens) // self.block_size) > self.num_blocks:
            raise ValueError(f"{len(ids) + max_new_tokens} tokens need more cache blocks than "
                             f"the engine has ({self.num_blocks} of {self.block_size})")
        params.check()
        with self._lock:
            sid = self._next_id
            self._next_id += 1
            seed = params.seed if params.seed is not None else \
                int.from_bytes(np.random.default_rng().bytes(4), "little")
            s = _Seq(sid, ids, params, int(max_new_tokens), mask, np.random.default_rng(seed),
                     seen=set(ids))
            self._waiting.append(s)
            self._by_id[sid] = s
            return sid

    def cancel(self, seq: int) -> None:
        """Drop sequence ``seq``: its slot and cache blocks are free for others at once (or,
        called while a step runs in another thread, as that step ends)."""
        with self._lock:
            if self._in_step:
                self._cancel_later.add(seq)
                return
            self._drop(seq)

    def _drop(self, seq: int) -> None:
        s = self._by_id.pop(seq, None)
        if s is None:
            return
        if s.slot >= 0:
            self._running.pop(s.slot, None)
            self._release(s)
        else:
            try:
                self._waiting.remove(s)
            except ValueError:
                pass

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._waiting or self._running)

    def waiting(self) -> int:
        """Sequences waiting for a slot, read without the engine's lock (which a step holds
        throughout): a count for admission control that may be a step old."""
        return len(self._waiting)

    def stats(self) -> dict[str, int]:
        with self._lock:
            evictable = sum(1 for b in self._cached.values() if self._ref[b] == 0)
            return {"running": len(self._running), "waiting": len(self._waiting),
                    "free_blocks": len(self._free) + evictable, "total_blocks": self.num_blocks,
                    "cached_blocks": len(self._cached), "prompt_tokens": self.prompt_tokens,
                    "generated_tokens": self.generated_tokens,
                    "reused_prompt_tokens": self.reused_tokens}

    # -- blocks ----------------------------------------------------------------------------------
    def _prefix_hashes(self, ids: list[int]) -> list[bytes]:
        """A hash of the tokens up to the end of each full block of ``ids``."""
        out, h = [], hashlib.blake2b(digest_size=16)
        bs = self.block_size
        for j in range(len(ids) // bs):
            h.update(np.asarray(ids[j * bs:(j + 1) * bs], np.int32).tobytes())
            out.append(h.copy().digest())
        return out

    def _take_block(self) -> int | None:
        if self._free:
            return self._free.pop()
        for hsh, b in self._cached.items():  # least recently used first
            if self._ref[b] == 0:
                del self._cached[hsh]
                del self._hash_of[b]
                return b
        return None

    def _admit(self, s: _Seq, slot: int) -> bool:
        """Give ``s`` its blocks (reusing cached prompt prefixes) and ``slot``; False if there
        are not enough free blocks."""
        need = -(-(len(s.ids) + s.max_new) // self.block_size)
        # the last prompt token is always run (its logits choose the first new token)
        hashes = self._prefix_hashes(s.ids)[: (len(s.ids) - 1) // self.block_size]
        reuse = []
        for hsh in hashes:
            b = self._cached.get(hsh)
            if b is None:
                break
            reuse.append(b)
        evictable = sum(1 for b in self._cached.values() if self._ref[b] == 0 and b not in reuse)
        if need - len(reuse) > len(self._free) + evictable:
            return False
        for b in reuse:
            self._ref[b] += 1
            self._cached.move_to_end(self._hash_of[b])
        fresh = []
        for _ in range(need - len(reuse)):
            b = self._take_block()
            assert b is not None
            self._ref[b] += 1
            fresh.append(b)
        s.blocks = reuse + fresh
        s.done = len(reuse) * self.block_size
        self.reused_tokens += s.done
        s.slot = slot
        self.table_host[slot, : len(s.blocks)] = s.blocks
        self._write_table()
        return True

    def _release(self, s: _Seq) -> None:
        for b in s.blocks:
            self._ref[b] -= 1
            if self._ref[b] == 0 and b not in self._hash_of:
                self._free.append(b)
        s.blocks = []
        s.slot = -1

    def _register_prompt(self, s: _Seq) -> None:
        """After ``s``'s prompt is in the cache: keep its full blocks for later prompts."""
        for j, hsh in enumerate(self._prefix_hashes(s.ids)):
            b = s.blocks[j]
            if hsh in self._cached or b in self._hash_of:
                continue
            self._cached[hsh] = b
            self._hash_of[b] = hsh

    # -- a step ----------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """Admit waiting sequences while slots and blocks allow, run one batch of rows (a
        decode row for each decoding sequence, prompt chunks for the others) and return the
        tokens chosen in it."""
        with self._lock:
            self._in_step = True
            try:
                return self._step()
            finally:
                self._in_step = False
                for sid in self._cancel_later:
                    self._drop(sid)
                self._cancel_later.clear()

    def _step(self) -> list[StepOutput]:
        if self._ahead is not None:
            return self._step_ahead()
        free_slots = [i for i in range(self.max_batch) if i not in self._running]
        while self._waiting and free_slots:
            s = self._waiting[0]
            if not self._admit(s, free_slots[0]):
                break
            self._waiting.popleft()
            self._running[free_slots.pop(0)] = s
        if not self._running:
            return []
        rows: list[tuple[int, int, int]] = []  # (slot, position, token)
        want: list[_Seq] = []  # sequences choosing a token, in logits-row order
        sel: list[int] = []
        for slot in sorted(self._running):
            s = self._running[slot]
            if s.done >= len(s.ids):
                sel.append(len(rows))
                rows.append((slot, s.length - 1, s.last))
                want.append(s)
        decoding = len(rows)  # (the decode rows: one a sequence, first)
        budget = self.prefill_chunk
        for slot in sorted(self._running):
            s = self._running[slot]
            if s.done >= len(s.ids) or budget == 0:
                continue
            take = min(budget, len(s.ids) - s.done)
            rows += [(slot, s.done + j, s.ids[s.done + j]) for j in range(take)]
            budget -= take
            s.done += take
            self.prompt_tokens += take
            if s.done == len(s.ids):
                sel.append(len(rows) - 1)
                want.append(s)
                self._register_prompt(s)
        arr = np.asarray(rows, np.int32)
        dev = self.device
        self._write_rows(arr[:, 0], arr[:, 1], arr[:, 2])
        if sel:
            dev.write(self.sel, np.asarray(sel, np.int32), queue=dev.queue)
        self._run(len(rows), len(sel), decode=len(rows) == decoding,
                  span=int(arr[:, 1].max()) + 1)
        if not want:
            dev.synchronize()
            return []
        V = self.model.config.vocab_size
        # PERF (H100, SmolLM2, 16 rows): reading every row and its log-sum-exp on the host
        # took 2.5 ms of an 8 ms step, the device idle meanwhile; the device's row statistics
        # (argmax, max, lse) serve greedy rows, and only the rows that need their logits
        # (sampling, a penalty, a mask, top log-probabilities) are read
        stats = np.empty((len(want), 3), np.float32)
        read = dev.read(stats, self.rstats, queue=dev.queue, blocking=False)
        if len(rows) == 1 and decoding == 1 and self._may_run_ahead(want[0], 1):
            # PERF: the row's next step on its way while this one's token is read back
            self._ahead = self._enqueue_ahead(want[0], rows[0][1] + 1)
        read.wait()
        args = stats[:, 0].copy().view(np.int32)
        greedy = [self._greedy(s, stats[i], V) for i, s in enumerate(want)]
        if self._ahead is not None and not greedy[0]:
            # (a row the device's argmax does not serve after all: its logits are the next
            # step's by now; that step is dropped and this one, which writes the same cache
            # entries again, runs once more)
            self._drop_ahead()
            self._lone_row_again(*rows[0])
        need = [i for i, g in enumerate(greedy) if not g]
        if need:  # the rows from the first to the last that need theirs, in one read
            lo, hi = need[0], need[-1] + 1
            logits = np.empty((hi - lo, V), np.float32)
            dev.read(logits, self.logits, offset=lo * V * 4, queue=dev.queue)
        out = []
        for i, s in enumerate(want):
            if greedy[i]:
                out.append(self._chosen(s, int(args[i]), float(stats[i, 1] - stats[i, 2]), []))
                continue
            out.append(self._from_logits(s, logits[i - lo]))
        return out

    def _from_logits(self, s: _Seq, row: np.ndarray) -> StepOutput:
        """``s``'s token chosen on the host from its logits ``row``; where that fails (its
        mask, its sampling), ``s`` fails alone and is let go."""
        top = row.max()
        z = float(top) + float(np.log(np.exp(row - top).sum(dtype=np.float64)))
        try:
            return self._choose(s, row, z)
        except Exception as e:  # noqa: BLE001 - this sequence fails, the others go on
            self._running.pop(s.slot, None)
            self._by_id.pop(s.id, None)
            self._release(s)
            return StepOutput(s.id, -1, 0.0, [], True, "error", error=e)

    @staticmethod
    def _argmax(stats: np.ndarray) -> int:
        """The argmax of a row's statistics (argmax, max, log-sum-exp): int32 bits."""
        return int(stats[:1].copy().view(np.int32)[0])

    @staticmethod
    def _greedy(s: _Seq, stats: np.ndarray, vocab: int) -> bool:
        """Whether the device's row statistics give ``s``'s token (argmax, max, log-sum-exp)."""
        return not s.params.shapes_logits and s.mask is None and \
            0 <= BatchEngine._argmax(stats) < vocab and bool(np.isfinite(stats[2]))

    def _lone_row_again(self, slot: int, pos: int, token: int) -> None:
        """Run a lone decode row's step once more (its token from the host): where a step
        enqueued ahead wrote the logits over, this one's are wanted. It writes the same cache
        entries again."""
        self._write_rows(np.array([slot], np.int32), np.array([pos], np.int32),
                         np.array([token], np.int32))
        self._run(1, 1, decode=True, span=pos + 1)

    # -- a lone greedy row's steps, one ahead --------------------------------------------------
    def _may_run_ahead(self, s: _Seq, pending: int) -> bool:
        """Whether sequence ``s`` (``pending`` steps of it enqueued whose tokens are not read
        yet) may have its next step enqueued before those tokens are known: it runs alone
        (nothing waiting), greedy (its token the device's argmax), on a lone decode row's own
        plan on one device, and its tokens so far leave it more to make. PERF (H200, Qwen3-0.6B
        body, one stream): the host's enqueues of a step overlap the device's work on the one
        before, and the token's read-back no longer leaves the device idle."""
        return (len(self._running) == 1 and not self._waiting and not self._before
                and not s.params.shapes_logits and s.mask is None
                and s.produced + pending < s.max_new
                and (self._lone(1, 1, False, True) or self._single(1, 1, False, True)))

    def _enqueue_ahead(self, s: _Seq, pos: int) -> _Ahead:
        """Enqueue ``s``'s decode row at ``pos`` whose token is the argmax of the step before
        (copied on the device from its row statistics), and the read of its statistics."""
        dev, q, part = self.device, self.device.queue, self._last
        dev.copy(part.ids, self.rstats, 4, queue=q)  # (the argmax: int32 bits, row 0)
        dev.write(part.rpos, np.array([pos], np.int32), queue=q)
        self._run(1, 1, decode=True, span=pos + 1)
        stats = np.empty(3, np.float32)
        return _Ahead(s, pos, stats, dev.read(stats, self.rstats, queue=q, blocking=False))

    def _drop_ahead(self) -> None:
        """Let the step enqueued ahead finish and forget it (its cache entries are written
        again by the step that takes its place, or belong to a sequence gone)."""
        a, self._ahead = self._ahead, None
        if a is not None:
            a.event.wait()

    def _step_ahead(self) -> list[StepOutput]:
        """The step enqueued ahead: the next one enqueued behind it where the sequence may
        still run ahead, then its token; dropped where its sequence is gone (cancelled)."""
        a = self._ahead
        assert a is not None
        s = a.seq
        if self._running.get(s.slot) is not s:
            self._drop_ahead()
            return self._step()
        self._ahead = self._enqueue_ahead(s, a.pos + 1) if self._may_run_ahead(s, 1) else None
        a.event.wait()
        V = self.model.config.vocab_size
        if self._greedy(s, a.stats, V):
            return [self._chosen(s, self._argmax(a.stats), float(a.stats[1] - a.stats[2]), [])]
        # (not served by the argmax: this row again, its logits read as in _step; its logits
        # row stays the first, as the step that began the run ahead set it)
        self._drop_ahead()
        assert s.last >= 0
        self._lone_row_again(s.slot, a.pos, s.last)
        row = np.empty(V, np.float32)
        self.device.read(row, self.logits, queue=self.device.queue)
        return [self._from_logits(s, row)]

    def _choose(self, s: _Seq, row: np.ndarray, lse: float) -> StepOutput:
        p = s.params
        z = shape_logits(row, p, s.seen, s.counts)
        allowed = s.mask(s.id) if s.mask is not None else None
        if allowed is not None:
            allowed = np.asarray(allowed, bool)
            if allowed.shape != z.shape:
                raise ValueError(f"a token mask has {allowed.shape} entries, the vocabulary "
                                 f"{z.shape}")
            if not allowed.any():
                raise ValueError("the token mask allows no token")
            z = np.where(allowed, z, -np.inf)
        tok = choose(z, p, s.rng)
        top: list[tuple[int, float]] = []
        if p.logprobs:  # the model's log-probabilities (before penalty, mask, temperature)
            best = np.argpartition(-row, p.logprobs - 1)[: p.logprobs]
            best = best[np.lexsort((best, -row[best]))]
            top = [(int(t), float(row[t]) - lse) for t in best]
        return self._chosen(s, tok, float(row[tok]) - lse, top)

    def _chosen(self, s: _Seq, tok: int, logprob: float,
                top: list[tuple[int, float]]) -> StepOutput:
        """Account for token ``tok`` of ``s`` (its log-probability under the model ``logprob``,
        the top ones ``top``)."""
        s.produced += 1
        s.last = tok
        s.seen.add(tok)
        s.counts[tok] = s.counts.get(tok, 0) + 1
        self.generated_tokens += 1
        finished = s.produced >= s.max_new
        if finished:
            self._running.pop(s.slot, None)
            self._by_id.pop(s.id, None)
            self._release(s)
        return StepOutput(s.id, tok, logprob, top, finished, "length" if finished else None)

    # -- embeddings --------------------------------------------------------------------------------
    def embed(self, ids: list[int]) -> np.ndarray:
        """The mean over ``ids``' positions of the model's last hidden state (after the final
        norm), float32 [dim]; runs between steps, in a scratch slot of its own."""
        ids = [int(t) for t in ids]
        cfg, dev = self.model.config, self.device
        if not ids:
            raise ValueError("the input is empty: give at least one token")
        if min(ids) < 0 or max(ids) >= cfg.vocab_size:
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size})")
        if len(ids) > self.context:
            raise ValueError(f"{len(ids)} tokens exceed the context of {self.context} tokens")
        with self._lock:
            # (a step enqueued ahead reads rows this writes: dropped, the next step makes it
            # again)
            self._drop_ahead()
            need = -(-len(ids) // self.block_size)
            blocks = []
            try:
                for _ in range(need):
                    b = self._take_block()
                    if b is None:
                        raise RuntimeError("no free cache blocks for an embedding now: retry "
                                           "when fewer sequences are running")
                    self._ref[b] += 1
                    blocks.append(b)
                slot = self.max_batch
                self.table_host[slot, :need] = blocks
                self._write_table()
                total = np.zeros(cfg.dim, np.float64)
                for s in range(0, len(ids), self.rows):
                    n = min(self.rows, len(ids) - s)
                    self._write_rows(np.full(n, slot, np.int32),
                                     np.arange(s, s + n, dtype=np.int32),
                                     np.asarray(ids[s:s + n], np.int32))
                    self._run(n, 0, embed=True)
                    hidden = np.empty((n, cfg.dim), np.float32)
                    dev.read(hidden, self.xn, queue=dev.queue)
                    total += hidden.sum(axis=0, dtype=np.float64)
                return (total / len(ids)).astype(np.float32)
            finally:
                for b in blocks:
                    self._ref[b] -= 1
                    self._free.append(b)


def _sample(z: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """A token drawn from softmax(z) after top-k, top-p and min-p (z: float64 logits /
    temperature, disallowed tokens at -inf).

    The filters keep a prefix of the tokens in descending order (ties by index), so only that
    prefix is ever sorted: the candidates above a partition's threshold, more of them until
    top-p's mass is inside. Unfiltered, the draw needs no order at all.
    PERF: a whole sort of a 49,152-token vocabulary took 5-15 ms a row: 64 sampled rows made a
    step of the server's last several hundred milliseconds."""
    finite = np.isfinite(z)
    n = int(finite.sum())
    e = np.exp(z - z.max())  # disallowed tokens: 0
    k = min(p.top_k, n) if p.top_k > 0 else n
    if p.top_k <= 0 and p.top_p >= 1.0 and p.min_p <= 0.0:
        c = np.cumsum(e)
        return int(np.searchsorted(c, rng.random() * c[-1], side="right"))
    want = k if p.top_k > 0 else min(n, 256)
    if p.min_p > 0.0 and p.top_k <= 0:  # every token min-p may keep (and a few more)
        want = max(want, min(n, int((e >= 0.999 * p.min_p).sum()) + 1))
    while True:
        if want >= n:
            cand = np.flatnonzero(finite)
        else:  # every token at or above the want-th largest value (ties at it too)
            cand = np.flatnonzero(z >= np.partition(z, len(z) - want)[len(z) - want])
        order = cand[np.argsort(-z[cand], kind="stable")][:k]
        # normalised over what top-k keeps (everything allowed, without it)
        probs = e[order] / (e[order].sum() if p.top_k > 0 else e.sum())
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            if keep > len(probs) and want < n and p.top_k <= 0:
                want = min(n, want * 4)  # top-p's mass lies past these candidates
                continue
            probs = probs[:keep]
        break
    if p.min_p > 0.0:
        probs = probs[probs >= p.min_p * probs[0]]
    probs = probs / probs.sum()
    return int(order[rng.choice(len(probs), p=probs)])
