"""llm, model: a decoder of any family in ``arch.ARCHS`` on one device. Weights stay in their file's
format (quantized ones quantized); activations and the KV cache are preallocated; prefill and
decode are recorded once as launch plans, so a decode step is only its enqueues, and sampling
runs on the device so that only the chosen token id comes back."""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from .. import _config
from ..kernels import Launch, LaunchPlan, attention, layer, matmul
from ..kernels import sample as sample_kernel
from ..nn import quant as _quant
from ..nn.quant import DeviceWeight, PackedWeight, concat, concat_experts, fusable, upload
from ..runtime import CLDevice, CLQueue
from ..runtime.pool import Buffer
from . import batch, experts, placement, step
from .arch import DENSE_FFN, EXPERTS, NORMS
from .batch import SamplingParams, choose, shape_logits
from .completion import (
    Finished,
    Response,
    TextOut,
    chat_messages,
    check_chat_extras,
    stop_list,
)
from .config import ModelConfig
from .loaded import Experts, LayerWeights, ModelWeights, Projection
from .tokenizer import TextTokenizer
from .weights import WeightSource

# Float16 copies of the weights for a prompt's tensor-core products are kept when they take
# at most this fraction of the device's memory (clops.llm.load's float16_copies).
HALF_COPIES_FRACTION = 0.2
# The most sequences Model.generate decodes at once for a list of prompts (more wait for a slot)
BATCH_SLOTS = 32
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "</s>")


def token_queue(dev: CLDevice) -> bool:
    """Whether generation reads each chosen token on a queue of its own (GPUs; not
    ``CLOPS_TOKEN_QUEUE=0``), rather than on the decode queue between steps."""
    return dev.kind != "cpu" and _config.token_queue()


@dataclass
class GenerationStats:
    """Timings of the last ``generate`` call."""

    prompt_tokens: int = 0
    prefill_s: float = 0.0
    new_tokens: int = 0
    decode_s: float = 0.0

    def arrived(self, n: int, t0: float) -> None:
        """The ``n``-th new token is here, ``t0`` the start of the prompt: the first one ends
        the prefill, the rest count as decode."""
        now = time.perf_counter()
        if self.new_tokens == 0:
            self.prefill_s = now - t0
        self.new_tokens = n
        self.decode_s = now - t0 - self.prefill_s

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        # the first new token comes out of the prefill; the rest are decode steps
        steps = max(self.new_tokens - 1, 0)
        return steps / self.decode_s if self.decode_s > 0 else 0.0

    def __str__(self) -> str:
        return (f"prefill {self.prompt_tokens} tokens in {self.prefill_s * 1e3:.0f} ms "
                f"({self.prefill_tps:.1f} tok/s); decode {max(self.new_tokens - 1, 0)} tokens "
                f"in {self.decode_s * 1e3:.0f} ms ({self.decode_tps:.1f} tok/s)")


class _Layer:
    """A layer's weights on the device; norms the family does not have are None."""

    attn_norm: Buffer | None = None
    q_norm: Buffer | None = None
    k_norm: Buffer | None = None
    post_attn_norm: Buffer | None = None
    ffn_norm: Buffer | None = None
    post_ffn_norm: Buffer | None = None
    qkv: Projection
    o: DeviceWeight
    gate_up: Projection | None = None  # (None where a mixture of experts takes the FFN's place)
    down: DeviceWeight | None = None
    experts: Experts | None = None
    o_bias: Buffer | None = None
    sinks: Buffer | None = None  # each head's attention sink (gpt-oss)
    k_cache: Buffer
    v_cache: Buffer
    inv_freq: Buffer  # the rotary frequencies of this layer (zeros: no rotary)


# prompt rows a launch plan takes at once
PROMPT_CHUNK_CPU = 128
PROMPT_CHUNK_GPU = 512


@dataclass(frozen=True)
class _Part:
    """The layers ``first`` .. ``stop - 1`` of a model split over devices, and the buffers of
    token ids and positions that its parts in one OpenCL context share."""

    first: int
    stop: int
    tokens: Buffer | None = None
    state: Buffer | None = None


class Model:
    """A loaded model. Use ``clops.llm.load`` to make one.

    >>> model = clops.llm.load()
    >>> "".join(model.generate("What's Oxygen?", max_new_tokens=8))
    """

    # (the token embedding is loaded on the first part of a split model, the final norm and the
    # output head on the last)
    embed: DeviceWeight
    out_norm: Buffer
    output: DeviceWeight

    def __init__(self, config: ModelConfig, source: WeightSource, tokenizer: TextTokenizer,
                 device: CLDevice | Sequence[CLDevice], max_seq_len: int | None = None,
                 chunk: int | None = None, progress: bool = True,
                 float16_copies: bool | None = None, int8_activations: bool = True,
                 kv_cache: str | None = None, split: Sequence[float] | None = None,
                 _part: _Part | None = None) -> None:
        devs = [device] if isinstance(device, CLDevice) else list(device)
        if not devs:
            raise ValueError("a model needs at least one device")
        self.config = cfg = config
        self.tokenizer = tokenizer
        # (a split model is its last part: the head, the sampler and the tokens read are there)
        self.device = devs[-1]
        self.source_path = source.path
        self.max_seq, self.chunk, self.kv_half = sizes(cfg, devs, max_seq_len, chunk, kv_cache)
        self.stats = GenerationStats()
        # the parts before this one, of a model split over devices
        self._prev: list[Model] = []
        self.stages: list[placement.Stage] = []
        # (a model split over several OpenCL contexts: the token ids and positions the other
        # contexts copy, placement.Chain's ``copies``)
        self._copies: placement.Copies | None = None
        # (a model split over contexts, each part in one of its own: a prompt's tokens and its
        # chunks' positions go from the host to every part, and a part takes the next chunk
        # while the parts after it finish this one; where two parts share a context they share
        # these buffers, and a write for the next chunk could meet the later part's reads of
        # this one, so the chunks go one after another there)
        self._pipelined = len({d.context.int_ptr for d in devs}) == len(devs) > 1
        if _part is None:
            # every device's bytes checked before any upload
            self.stages = placement.place(cfg, source, devs, self.max_seq, self.kv_half,
                                          [self.chunk] * len(devs), split)
            _part = _Part(0, cfg.n_layers)
            if len(devs) > 1:
                if progress:
                    print("clops: " + "; ".join(st.describe(cfg.n_layers) for st in self.stages),
                          file=sys.stderr)
                # token ids and positions: one pair of buffers in each OpenCL context of the
                # parts (the first part's embedding reads the token the last part's sampler
                # chose); the last part's are the ones the host and the sampler write, the
                # others' copies of them (placement.Chain)
                shared: dict[int, dict[str, Buffer]] = {}
                for d in devs:
                    key = d.context.int_ptr
                    if key not in shared:
                        shared[key] = dict(
                            tokens=upload(d, np.zeros(self.max_seq + 2, np.int32)),
                            state=upload(d, np.zeros(4, np.int32)))
                kv = "float16" if self.kv_half else "float32"
                for st in self.stages[:-1]:
                    self._prev.append(Model(
                        cfg, source, tokenizer, st.device, self.max_seq, self.chunk, progress,
                        float16_copies, int8_activations, kv,
                        _part=_Part(st.first, st.stop, **shared[st.device.context.int_ptr])))
                ours = shared.pop(self.device.context.int_ptr)
                _part = _Part(self.stages[-1].first, cfg.n_layers, **ours)
                first = {d.context.int_ptr: d for d in reversed(devs)}
                if shared:
                    self._copies = placement.Copies(
                        ours["tokens"], ours["state"],
                        [(first[key], bufs["tokens"], bufs["state"])
                         for key, bufs in shared.items()])
        self._part = _part
        self._load_weights(source, progress)
        ends = ([self.embed] if self._embeds else []) + ([self.output] if self._heads else [])
        # (the experts' products too: a prompt's grouped products meet int8 rows where every
        # expert weight may, ``experts.int8_rows``)
        for w in ends + self._layer_matrices() + [
                w for ly in self.layers if ly.experts is not None
                for w in [ly.experts.router, *ly.experts.products()]]:
            w.int8 = int8_activations
        self._token_queue: CLQueue | None = None  # (_read_token)
        self._alloc(float16_copies)
        self._plans: dict[tuple[int, str, bool, int | None], LaunchPlan] = {}
        self._sampler: dict[str, Any] = {}
        # NOTE: the buffers above, the KV cache and the plans hold one sequence: a generation
        # or logits call holds the model until it ends (three threads sharing a model without
        # this got wrong text for 8 of 12 generations, and no error)
        self._lock = threading.Lock()
        self._holder: int | None = None
        # generate's BatchEngine for lists of prompts (made at first use), one list at a time
        self._engine: batch.BatchEngine | None = None
        self._engine_lock = threading.Lock()

    @property
    def _embeds(self) -> bool:
        """Whether this part holds the token embedding (the first part, or the whole model)."""
        return self._part.first == 0

    @property
    def _heads(self) -> bool:
        """Whether this part holds the final norm and the output head (the last part)."""
        return self._part.stop == self.config.n_layers

    @property
    def devices(self) -> list[CLDevice]:
        """The devices of the model's parts, in the order of its layers (one, unless split)."""
        return [p.device for p in self._prev] + [self.device]

    @property
    def where(self) -> str:
        """The device's name, or for a split model each device's layers."""
        if not self._prev:
            return self.device.name
        return ", ".join(f"{placement.shown(st.device)} (layers {st.first}-{st.stop - 1})"
                         for st in self.stages)

    # -- loading -----------------------------------------------------------------------------
    def _load_weights(self, src: WeightSource, progress: bool) -> None:
        cfg, dev = self.config, self.device
        # every tensor's type and shape against the config before any weight is uploaded
        # (clops.llm.load has done it already; a Model made directly has not)
        src.validate(cfg)
        for name in ("embed", "out_norm"):
            src.need(name)
        keys = cfg.layer_keys()
        first, stop = self._part.first, self._part.stop
        tied = not src.has("output")
        ends = (["embed"] if self._embeds or (self._heads and tied) else []) + (
            ["out_norm", "output"] if self._heads else [])
        names = ends + [f"blk.{i}.{k}" for i in range(first, stop) for k in keys]
        total = sum(src.nbytes(n) for n in names)
        bar = _progress(total, f"weights -> {dev.name[:40]}", progress)

        # the fused decode layers (kernels.layer) read Q4_K's layers in q4 and MXFP4's,
        # IQ4_NL's and Q5_0's in q8, not in their compact forms: models small enough for them
        # (and without experts) keep those there
        q4_layers = not cfg.n_experts and cfg.dim <= layer.MAX_DIM and \
            cfg.ffn_dim <= layer.MAX_FFN

        # the CPU layout takes the compact formats' expanded forms
        expand = _quant.layout_for(dev) != "rows"

        def packed(name: str) -> PackedWeight:
            p = src.matrix(name)
            small = q4_layers and name.startswith("blk.")
            return p.expanded() if expand or (small and p.fmt in ("k4", "m4", "n4", "h5")) \
                else p

        # the matrices, packed (checked, expanded) on a few threads ahead of their uploads
        ahead = _Ahead(packed, [n for n in names if n.rsplit(".", 1)[-1] in _MATRICES
                                and src.has(n)])

        def mat(name: str) -> PackedWeight:
            p = ahead.get(name)
            bar.update(src.nbytes(name))
            return p

        def vec(name: str) -> Buffer:
            v = src.vector(name).astype(np.float32)
            bar.update(src.nbytes(name))
            return upload(dev, v)

        try:
            self._load_layers(src, cfg, dev, ends, keys, first, stop, tied, mat, vec)
        finally:
            ahead.close()
        bar.close()

    def _load_layers(self, src: WeightSource, cfg: ModelConfig, dev: CLDevice,
                     ends: list[str], keys: tuple[str, ...], first: int, stop: int, tied: bool,
                     mat: Any, vec: Any) -> None:
        if "embed" in ends:
            emb = mat("embed")
            if emb.n != cfg.vocab_size or emb.k != cfg.dim:
                raise ValueError(f"{src.path}: token embedding is [{emb.n}, {emb.k}], expected "
                                 f"[{cfg.vocab_size}, {cfg.dim}]")
            if self._embeds:
                self.embed = DeviceWeight(dev, emb)
        if self._heads:
            self.out_norm = vec("out_norm")
            self.output = (DeviceWeight(dev, mat("output")) if not tied else
                           self.embed if self._embeds else DeviceWeight(dev, emb))
        if src.has("rope_freqs") and cfg.rope_freq_factors is None:
            cfg.rope_freq_factors = src.vector("rope_freqs")
        rotary = {False: upload(dev, cfg.inv_freq()),
                  True: upload(dev, cfg.inv_freq(sliding=True))}
        nope = upload(dev, np.zeros(cfg.rotary // 2, np.float32))  # angle 0: no rotation
        H, KV, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.layers: list[_Layer] = []
        for i in range(first, stop):
            p = f"blk.{i}."
            ly = _Layer()
            for norm_name in NORMS:
                if norm_name in keys:
                    setattr(ly, norm_name, vec(p + norm_name))
            qkv = [mat(p + "qkv")] if "qkv" in keys else [mat(p + "q"), mat(p + "k"),
                                                         mat(p + "v")]
            want = (H + 2 * KV) * D if "qkv" in keys else None
            for w, n, what in zip(qkv, [want] if want else [H * D, KV * D, KV * D],
                                  ["qkv"] if want else ["q", "k", "v"]):
                if (w.n, w.k) != (n, cfg.dim):
                    raise ValueError(f"{src.path}: layer {i} {what} weight is [{w.n}, {w.k}], "
                                     f"expected [{n}, {cfg.dim}]")
            biases = None
            if cfg.qkv_bias and src.has(p + "q_bias"):
                biases = [src.vector(p + s) for s in ("q_bias", "k_bias", "v_bias")]
                if len(qkv) == 1:
                    biases = [np.concatenate(biases)]
            ly.qkv = self._fuse(qkv, biases)
            ly.o = DeviceWeight(dev, mat(p + "o"))
            for name in ("o_bias", "sinks"):
                if name in keys:
                    setattr(ly, name, vec(p + name))
            if cfg.n_experts:
                ly.experts = self._experts_of(src, p, mat, vec, "router_bias" in keys)
            else:
                gu = ([mat(p + "gate_up")] if "gate_up" in keys
                      else [mat(p + "gate"), mat(p + "up")])
                ly.gate_up = self._fuse(gu, None)
                ly.down = DeviceWeight(dev, mat(p + "down"))
            ly.inv_freq = nope if i < len(cfg.nope) and cfg.nope[i] else rotary[cfg.sliding(i)]
            self.layers.append(ly)
        self.inv_freq = rotary[False]

    def _experts_of(self, src: WeightSource, p: str, mat: Any, vec: Any,
                    biases: bool) -> Experts:
        """Layer ``p``'s mixture of experts on the device: gate and up as one [gate | up]
        weight where they share a format (one product a layer instead of two)."""
        cfg, dev, E = self.config, self.device, self.config.n_experts
        ebias = {f"{w}_bias": vec(f"{p}{w}_exps_bias") if w != "router" else
                 vec(p + "router_bias") for w in ("router", "down")} if biases else {}
        gate, up = mat(p + "gate_exps"), mat(p + "up_exps")
        fused = concat_experts(gate, up, E)
        if fused is None:
            if biases:
                ebias.update(gate_bias=vec(p + "gate_exps_bias"), up_bias=vec(p + "up_exps_bias"))
            parts: dict[str, Any] = dict(gate=DeviceWeight(dev, gate), up=DeviceWeight(dev, up))
        else:
            del gate, up  # (the host's copies: the fused one is enough)
            parts = dict(gate=None, up=None, gate_up=DeviceWeight(dev, fused))
            if biases:
                b = [src.vector(f"{p}{w}_exps_bias").astype(np.float32).reshape(E, -1)
                     for w in ("gate", "up")]
                ebias["gate_up_bias"] = upload(dev, np.concatenate(b, axis=1).reshape(-1))
        return Experts(router=DeviceWeight(dev, mat(p + "router")),
                       down=DeviceWeight(dev, mat(p + "down_exps")), n=E,
                       k=cfg.n_experts_used, ffn=cfg.expert_ffn_dim, norm=cfg.experts_norm,
                       **parts, **ebias)

    @property
    def weights(self) -> ModelWeights:
        """The weights on the device (on their devices, for a split model), typed, for a plan
        builder (``llm.step``)."""
        parts = self._prev + [self]
        layers = [w for p in parts for w in p._layer_weights()]
        return ModelWeights(parts[0].embed, self.out_norm, self.output, tuple(layers))

    def _part_weights(self) -> ModelWeights:
        """This part's weights, typed (the embedding if it is the first, the final norm and
        the output if it is the last)."""
        return ModelWeights(self.embed if self._embeds else None,
                            self.out_norm if self._heads else None,
                            self.output if self._heads else None, tuple(self._layer_weights()))

    def _layer_weights(self) -> list[LayerWeights]:
        """This part's layers, typed."""
        cfg = self.config
        layers = []
        for i, ly in enumerate(self.layers, self._part.first):
            layers.append(LayerWeights(
                attn_norm=ly.attn_norm, qkv=ly.qkv, q_norm=ly.q_norm, k_norm=ly.k_norm, o=ly.o,
                post_attn_norm=ly.post_attn_norm, ffn_norm=ly.ffn_norm, gate_up=ly.gate_up,
                down=ly.down, post_ffn_norm=ly.post_ffn_norm, inv_freq=ly.inv_freq,
                rotates=not (i < len(cfg.nope) and cfg.nope[i]), window=self._window(i),
                experts=ly.experts, o_bias=ly.o_bias, sinks=ly.sinks))
        return layers

    def _window(self, i: int) -> int:
        """The positions a query of layer ``i`` attends to (0: all of them)."""
        cfg = self.config
        # a window no shorter than the context changes nothing
        return cfg.sliding_window if cfg.sliding(i) and cfg.sliding_window < self.max_seq else 0

    def _layer_matrices(self) -> list[DeviceWeight]:
        """The weight matrices of the layers (but the experts', which only their own products
        read)."""
        out = []
        for ly in self.layers:
            out += [p[0] for p in ly.qkv.parts] + [ly.o]
            if ly.gate_up is not None and ly.down is not None:
                out += [p[0] for p in ly.gate_up.parts] + [ly.down]
        return out

    def _fuse(self, parts: list[PackedWeight], biases: list[np.ndarray] | None) -> Projection:
        dev = self.device
        n = sum(p.n for p in parts)
        fused = concat(parts)
        if fused is not None:
            b = upload(dev, np.concatenate(biases).astype(np.float32)) if biases else None
            return Projection([(DeviceWeight(dev, fused), 0, b)], n)
        # (parts in two formats, as a mix's Q4_K q and k beside its Q6_K v: each run of
        # neighbours in one format stacked, one launch each)
        out, off, j = [], 0, 0
        while j < len(parts):
            e = j + 1
            while e < len(parts) and fusable(parts[j], parts[e]):
                e += 1
            w = parts[j] if e == j + 1 else concat(parts[j:e])
            assert w is not None
            b = upload(dev, np.concatenate(biases[j:e]).astype(np.float32)) if biases else None
            out.append((DeviceWeight(dev, w), off, b))
            off += w.n
            j = e
        return Projection(out, n)

    def _alloc(self, float16_copies: bool | None = None) -> None:
        cfg, dev, C = self.config, self.device, self.chunk
        H, KV, D, F = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
        f4 = 4
        self.x = dev.alloc(C * cfg.dim * f4)
        self.xn = dev.alloc(C * cfg.dim * f4)
        # a block's output before its post-norm or residual scale (families that have them)
        part_weights = self._part_weights()
        self.t = dev.alloc(C * cfg.dim * f4 if step.branch_out(cfg, part_weights) else 4)
        self.qkv = dev.alloc(C * (H + 2 * KV) * D * f4)
        self.q = dev.alloc(C * H * D * f4)
        self.attn = dev.alloc(C * H * D * f4)
        self.gu = dev.alloc(C * 2 * F * f4)
        self.h = dev.alloc(C * F * f4)
        # (the head's and the sampler's, on the last part)
        V = cfg.vocab_size if self._heads else 1
        self.logits_buf = dev.alloc(C * V * f4)
        self.z = dev.alloc(V * f4)
        # state[0]: the position of the row the next step reads; state[3]: the greedy
        # sampler's ticket (zero between launches)
        self.state = self._part.state if self._part.state is not None else \
            upload(dev, np.zeros(4, np.int32))
        # float16 rows for the tensor-core products of a prompt (kernels.matmul.linear), where the
        # device has them
        mats = self._layer_matrices()
        tc = [w for w in mats if matmul.tensor_core_rows(dev, C, w)]
        rows_tc = tc or (self._heads and matmul.tensor_core_rows(dev, C, self.output))
        # a prompt's attention may round to float16 too where its products do (float32
        # weights keep float32 throughout, and so do chunks of too few rows for tensor cores)
        self.half_prompt = bool(tc)
        self.xh = dev.alloc(matmul.half_scratch_nbytes(C, max(cfg.dim, F, H * D)) if rows_tc else 4)
        # and float16 copies of the layers' weights in other formats: kept (converted once,
        # here), or converted for each prompt chunk into a scratch of the largest one's size
        # (too small for the output projection, which then keeps the matmul kernel)
        convert = [w for w in tc if w.fmt != "f16"]
        total = sum(w.n * w.k * 2 for w in convert)
        keep = float16_copies if float16_copies is not None else \
            total <= HALF_COPIES_FRACTION * dev.caps.global_mem
        big = 0
        for w in convert:
            if keep:
                # PERF: a SmolLM2 prompt chunk of 128 rows spent 2.07 ms converting its
                # weights (H100), about 40% of the chunk
                w.half = dev.alloc(w.n * w.k * 2)
                matmul.dequant_half(dev, w.half, w).run(dev)
            else:
                big = max(big, w.n * w.k * 2)
        self.wh = dev.alloc(max(big, 4))
        # and the partial sums of the products split over k (for full chunks)
        self.ph = dev.alloc(max([matmul.split_nbytes(dev, C, w) for w in mats] + [4]))
        self.tokens = self._part.tokens if self._part.tokens is not None else \
            upload(dev, np.zeros(self.max_seq + 2, np.int32))
        self.seen = upload(dev, np.zeros(V, np.uint8))
        moe = [ly.experts for ly in self.layers if ly.experts is not None]
        self.ex = experts.buffers(dev, cfg, moe, C, one=True) if moe else None
        cache = attention.kv_nbytes(KV, self.max_seq, D, self.kv_half)
        for ly in self.layers:
            ly.k_cache = dev.alloc(cache)
            ly.v_cache = dev.alloc(cache)
        one = step.OneSequence(
            tuple(ly.k_cache for ly in self.layers), tuple(ly.v_cache for ly in self.layers),
            self.state, self.max_seq, dev.alloc(attention.part_nbytes(dev, self.max_seq, H, D)),
            upload(dev, np.zeros(H, np.int32)))  # (attn_decode_rope's count, left zero)
        bufs = step.StepBuffers(
            x=self.x, xn=self.xn, t=self.t, qkv=self.qkv, q=self.q, attn=self.attn, gu=self.gu,
            h=self.h, logits=self.logits_buf, ids=self.tokens, ids_at=self.state,
            experts=self.ex, seen=self.seen, z=self.z, xh=self.xh, wh=self.wh, ph=self.ph)
        # (the one builder of this part's launches; ``_plan`` drives it)
        self._builder = step.StepBuilder(
            dev, cfg, part_weights, bufs, one, first=self._part.first, embeds=self._embeds,
            heads=self._heads, kv_half=self.kv_half, half_prompt=self.half_prompt,
            copies_fraction=HALF_COPIES_FRACTION)

    # -- plans -------------------------------------------------------------------------------
    def _plan(self, m: int, logits: str, sample: bool, span: int | None = None,
              placed: bool = False) -> LaunchPlan | placement.Chain:
        """Launches for m rows at positions state[0].. : logits "last", "all" or "none". The
        family's choices (``config.desc`` and the config's settings) pick the launches.
        ``span`` (a decode row, ``_decode_span``): the row attends to at most that many
        positions. A split model's step is each part's launches in turn (``placement.Chain``);
        ``placed``: the host has written the rows' tokens and position to every part (a
        prompt's chunk), none are brought from the last part."""
        own = self._part_plan(m, logits, sample, span)
        if not self._prev:
            return own
        return placement.Chain([(p.device, p.x, p._part_plan(m, "none", False, span))
                                for p in self._prev] + [(self.device, self.x, own)],
                               m * self.config.dim * 4, None if placed else self._copies, m)

    def _part_plan(self, m: int, logits: str, sample: bool,
                   span: int | None = None) -> LaunchPlan:
        """This part's launches of ``_plan`` (the whole model's, unless it is split): the step
        builder's (``step.StepBuilder.sequence``), made once for each key."""
        key = (m, logits, sample, span)
        plan = self._plans.get(key)
        if plan is None:
            sampler = (self._sampler or _sampler_defaults()) if sample else None
            plan = self._plans[key] = self._builder.sequence(m, logits, sampler, span).plan
        return plan

    def _decode_span(self, positions: int) -> int | None:
        """The span of the decode plan for a row that attends to ``positions`` positions
        (``StepBuilder.span``)."""
        return self._builder.span(positions)

    def _set_sampler(self, **params: Any) -> None:
        if params == self._sampler:
            return
        before = self._sampler or _sampler_defaults()
        # (greedy and sampling are two kernels: a switch builds the sampling plans again)
        switched = sample_kernel.is_greedy(before["temperature"]) != \
            sample_kernel.is_greedy(params["temperature"])
        self._sampler = params
        for key, plan in list(self._plans.items()):
            if not key[2]:
                continue
            if switched:
                del self._plans[key]
            else:
                _apply_sampler(plan.launches[-1], plan, params)

    # -- running ---------------------------------------------------------------------------------
    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the model for one call: other threads wait; this thread, already holding it
        (an unfinished ``generate`` iterator), gets an error rather than waiting forever."""
        me = threading.get_ident()
        if self._holder == me:
            raise RuntimeError(
                "this model is already generating in this thread (an unfinished generate() "
                "iterator): finish or close() that iterator first, or load a second model")
        with self._lock:
            self._holder = me
            try:
                yield
            finally:
                self._holder = None

    def _start(self, ids: Sequence[int], seen: bool = False) -> None:
        """Reset the sequence to ``ids`` (positions 0..n-1 on the device); ``seen``: the
        tokens seen so far (a repetition penalty's) become ``ids`` too."""
        n = len(ids)
        if n == 0:
            raise ValueError("the prompt is empty: give at least one token")
        if n > self.max_seq:
            raise ValueError(f"{n} prompt tokens do not fit the context of {self.max_seq} "
                             "(raise max_seq_len in clops.llm.load)")
        ids_arr = np.asarray(ids, dtype=np.int64)
        if ids_arr.min() < 0 or ids_arr.max() >= self.config.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})")
        # (the copies go ahead of the prompt's launches on the plans' queue, in its order:
        # nothing else waits for them)
        dev = self.device
        ids32 = ids_arr.astype(np.int32)
        dev.write(self.tokens, ids32, queue=dev.queue)
        # (and the other parts' copies, ``_pipelined``: a prompt's chunks then need nothing
        # from the last part)
        for d, tokens, _ in self._host_written():
            d.write(tokens, ids32, queue=d.queue)
        # (only a repetition penalty reads them: without one the copy of a vocabulary's bytes
        # is left out, 1.98-2.03 -> 1.92-1.93 ms to the first token of a 1B F16 body's
        # 128-token prompt on an H100; the sampling kernels' marks of chosen tokens stay
        # harmless until the next generation with a penalty writes them all)
        if seen:
            marks = np.zeros(self.config.vocab_size, np.uint8)
            marks[ids_arr] = 1
            dev.write(self.seen, marks, queue=dev.queue)

    def _set_pos(self, pos: int) -> None:
        """Position ``pos`` for the next launches (a copy queued on the plans' queue; with
        ``_pipelined`` parts, on every part's)."""
        state = np.array([pos, 0, 0, 0], np.int32)
        self.device.write(self.state, state, queue=self.device.queue)
        for d, _, st in self._host_written():
            d.write(st, state, queue=d.queue)

    def _host_written(self) -> Sequence[tuple[CLDevice, Buffer, Buffer]]:
        """The other parts' token and position buffers that the host writes itself
        (``_pipelined``; none otherwise: they are copied from the last part's)."""
        return self._copies.others if self._pipelined and self._copies else ()

    def _prefill(self, n: int, logits: str, sample: bool) -> Iterator[tuple[int, int]]:
        """Run the prompt (already in the tokens buffer) in chunks; yields (start, rows) after
        each chunk has been enqueued."""
        for s in range(0, n, self.chunk):
            m = min(self.chunk, n - s)
            last = s + m == n
            self._set_pos(s)
            self._plan(m, logits if (last or logits == "all") else "none",
                       sample and last, placed=self._pipelined).replay()
            yield s, m

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Next-token logits at every position of ``ids``: float32 ``[len(ids), vocab]``."""
        with self._exclusive():
            self._start(ids)
            V = self.config.vocab_size
            out = np.empty((len(ids), V), np.float32)
            for s, m in self._prefill(len(ids), "all", False):
                self.device.read(out[s:s + m], self.logits_buf, queue=self.device.queue)
            return out

    def generate_ids(self, ids: Sequence[int], max_new_tokens: int = 128,
                     temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                     min_p: float = 0.0, repetition_penalty: float = 1.0,
                     seed: int | None = None,
                     stop_ids: Sequence[int] = (), *, presence_penalty: float = 0.0,
                     frequency_penalty: float = 0.0,
                     logit_bias: dict[int, float] | None = None) -> Iterator[int]:
        """New token ids after ``ids``, one at a time as they are chosen.

        The device chooses each token; with ``presence_penalty``, ``frequency_penalty`` or
        ``logit_bias`` (see ``SamplingParams``) each token's logits come to the host and the
        token is chosen there, as ``BatchEngine`` chooses."""
        with self._exclusive():
            if max_new_tokens <= 0:
                return
            temperature = float(temperature)
            if not math.isfinite(temperature) or temperature < 0:
                raise ValueError(f"temperature must be 0 (greedy) or positive, got {temperature}")
            if temperature < 1e-6:
                temperature = 0.0  # greedy is its limit; 1/temperature overflows float32
            if presence_penalty or frequency_penalty or logit_bias:
                params = SamplingParams(
                    temperature=temperature, top_k=int(top_k), top_p=float(top_p),
                    min_p=float(min_p), repetition_penalty=float(repetition_penalty), seed=seed,
                    presence_penalty=float(presence_penalty),
                    frequency_penalty=float(frequency_penalty),
                    logit_bias={int(t): float(b) for t, b in (logit_bias or {}).items()})
                params.check()
                _check_bias(params, self.config.vocab_size)
                yield from self._host_chosen(ids, max_new_tokens, params, stop_ids)
                return
            if seed is None:
                seed = int.from_bytes(np.random.default_rng().bytes(4), "little")
            self._set_sampler(temperature=temperature, top_k=int(top_k),
                              top_p=float(top_p), min_p=float(min_p),
                              penalty=float(repetition_penalty), seed=int(seed) & 0xFFFFFFFF)
            dev = self.device
            st = self.stats = GenerationStats(prompt_tokens=len(ids))
            t0 = time.perf_counter()
            self._start(ids, seen=self._sampler["penalty"] != 1.0)
            for _ in self._prefill(len(ids), "last", True):
                pass
            budget = min(max_new_tokens, self.max_seq - len(ids))
            if budget <= 0:
                return
            issued = 0  # decode steps enqueued: the k-th one is the row at len(ids) + k

            def step() -> None:
                nonlocal issued
                # PERF (GPUs): the plan whose attention spans the positions this row attends
                self._plan(1, "last", True, self._decode_span(len(ids) + issued + 1)).replay()
                issued += 1

            pos = len(ids)
            produced = 0
            stops = set(stop_ids)
            host, ev = self._read_token(pos, last=produced + 1 >= budget)
            # PERF (CPUs): the first step is enqueued once the prompt's token is in. Enqueued
            # during the prompt, it made the prompt a tenth slower (2-core EPYC, Intel's
            # runtime, 64 tokens: a 1B F16 prompt 174 -> 196 tok/s, Q4_0 389 -> 424), about as
            # much as the decode then gained: the time to the first token is what changes. The
            # later steps go ahead of their token (decode 26.3 -> 27.6 tok/s, F16).
            first_ahead = dev.kind != "cpu"
            while True:
                # PERF: the next step is enqueued before this token is waited for, so the host's
                # work on a token overlaps the device's work on the next one.
                ahead = produced + 1 < budget and (produced > 0 or first_ahead)
                if ahead:
                    step()
                ev.wait()
                if produced + 1 < budget and not ahead:
                    step()
                tok = int(host[0])
                produced += 1
                st.arrived(produced, t0)
                if tok in stops:
                    return
                yield tok
                if produced >= budget:
                    return
                pos += 1
                host, ev = self._read_token(pos, last=produced + 1 >= budget)

    def _host_chosen(self, ids: Sequence[int], max_new_tokens: int, params: SamplingParams,
                     stop_ids: Sequence[int]) -> Iterator[int]:
        """``generate_ids`` with each token chosen on the host from its logits
        (``batch.shape_logits`` and ``batch.choose``; the caller holds the model)."""
        dev, V = self.device, self.config.vocab_size
        st = self.stats = GenerationStats(prompt_tokens=len(ids))
        t0 = time.perf_counter()
        self._start(ids)
        for _ in self._prefill(len(ids), "last", False):
            pass
        budget = min(max_new_tokens, self.max_seq - len(ids))
        rng = np.random.default_rng(params.seed)
        seen = set(int(t) for t in ids)  # (the batch engine's accounts)
        counts: dict[int, int] = {}
        stops = set(stop_ids)
        row = np.empty(V, np.float32)
        for produced in range(1, budget + 1):
            dev.read(row, self.logits_buf, queue=dev.queue)
            tok = choose(shape_logits(row, params, seen, counts), params, rng)
            st.arrived(produced, t0)
            if tok in stops:
                return
            yield tok
            if produced >= budget:
                return
            seen.add(tok)
            counts[tok] = counts.get(tok, 0) + 1
            pos = len(ids) + produced - 1  # the new token's position: the next row's input
            dev.write(self.tokens, np.array([tok], np.int32), pos * 4, queue=dev.queue)
            self._set_pos(pos)
            self._plan(1, "last", False, self._decode_span(pos + 1)).replay()

    def _read_token(self, pos: int, last: bool = False) -> tuple[np.ndarray, Any]:
        """The token at ``pos`` (chosen by the steps enqueued so far) into a host array, and the
        event of its read. GPUs: read on a queue of its own, after a marker on the decode
        queue, so that the next step's kernels do not wait behind the copy to the host; the
        ``last`` token of a generation, which no step follows, on the decode queue itself."""
        dev = self.device
        host = np.empty(1, np.int32)
        # PERF (H100, 1B F16 body, a prompt of 128 tokens and one new token): the read after
        # the marker took 1.996 ms to the token, one on the decode queue 1.937-1.948
        if last or not token_queue(dev):
            return host, dev.read(host, self.tokens, pos * 4, queue=dev.queue, blocking=False)
        if self._token_queue is None:
            self._token_queue = dev.create_queue()
        done = dev.queue.marker()
        dev.queue.flush()  # (the read waits on it: it must reach the device now)
        return host, dev.read(host, self.tokens, pos * 4, queue=self._token_queue,
                              wait_for=[done], blocking=False)

    # -- text ------------------------------------------------------------------------------------
    def generate(self, prompt: str | list[Any], max_new_tokens: int = 128,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, repetition_penalty: float = 1.0, seed: int | None = None,
                 stop: Sequence[str] = (), chat: bool = False, *,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 logit_bias: dict[int, float] | None = None,
                 sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> Iterator[str] | list[str]:
        """The continuation of ``prompt``: for one prompt (a string, or a list of chat
        messages) an iterator of text pieces as they are made; for a list of prompts (strings,
        or lists of messages) the list of their whole continuations, decoded together.

        ``chat=True`` (or messages) renders the model's chat template first. ``temperature=0``
        is greedy; ``seed`` makes sampling repeatable; ``stop`` strings end the text where they
        first appear. ``sampling``: a ``SamplingParams`` (or, for a list of prompts, one per
        prompt) instead of the keyword settings; its ``max_tokens`` and ``stop`` take the place
        of ``max_new_tokens`` and add to ``stop``.

        Many prompts run as one batch (``BatchEngine``: continuous batching, prompts that
        share a beginning share its cache) where ``batch.unsupported`` allows it (every
        family of ``arch.ARCHS``), else one after another. Greedy answers are the same
        either way; sampled ones are drawn on the host in a batch and on the device alone, so
        a seed gives other draws.

        >>> for piece in model.generate("What's Oxygen?", max_new_tokens=32):
        ...     print(piece, end="")
        >>> model.generate(["Hi", "Bye"], max_new_tokens=8)
        ['...', '...']
        """
        settings = SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repetition_penalty=repetition_penalty, seed=seed, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, logit_bias=dict(logit_bias or {}))
        if sampling is not None and settings != _DEFAULT_SAMPLING:
            changed = sorted(f.name for f in fields(SamplingParams)
                             if getattr(settings, f.name) != getattr(_DEFAULT_SAMPLING, f.name))
            raise ValueError(f"give either sampling= or the keyword settings, not both "
                             f"(got sampling and {', '.join(changed)})")
        many = isinstance(prompt, list | tuple) and not (
            prompt and isinstance(prompt[0], dict))
        if not many:
            if sampling is not None and not isinstance(sampling, SamplingParams):
                raise TypeError("one prompt takes one SamplingParams as sampling=, not "
                                f"{type(sampling).__name__}")
            p = sampling if sampling is not None else settings
            _check_sampling(p)
            if p.logit_bias:
                _check_bias(p, self.config.vocab_size)
            ids, stop_ids = _encode(self.tokenizer, prompt, chat)
            run = _run(self, ids, p, _budget(p, max_new_tokens), list(stop) + list(p.stop),
                       stop_ids)
            return (piece for piece, _, _ in run if piece)
        prompts = list(prompt)
        if isinstance(sampling, SamplingParams) or sampling is None:
            params = [sampling if sampling is not None else settings] * len(prompts)
        else:
            params = list(sampling)
            if len(params) != len(prompts) or not all(isinstance(q, SamplingParams)
                                                      for q in params):
                raise ValueError(f"sampling= takes one SamplingParams, or one for each of the "
                                 f"{len(prompts)} prompts (got {len(params)} items)")
        for q in params:
            _check_sampling(q)
            _check_bias(q, self.config.vocab_size)
        for i, one in enumerate(prompts):
            if not isinstance(one, str | list):
                raise TypeError(f"prompts[{i}] is a {type(one).__name__}: give strings or "
                                "lists of chat messages")
        encoded = [_encode(self.tokenizer, one, chat) for one in prompts]
        done = self._many([ids for ids, _ in encoded], params,
                          [_budget(q, max_new_tokens) for q in params],
                          [list(stop) + list(q.stop) for q in params],
                          [stop_ids for _, stop_ids in encoded])
        return [d.text for d in done]

    def _many(self, prompts: list[list[int]], params: list[SamplingParams],
              max_new: list[int], stops: list[list[str]], stop_ids: list[list[int]],
              ) -> list[Finished]:
        """Whole answers to many prompts: batched where ``BatchEngine`` runs this model, else
        one after another."""
        if len(prompts) == 1 or batch.unsupported(self) is not None:
            return [self._collect(ids, _run(self, ids, p, m, s, e))
                    for ids, p, m, s, e in zip(prompts, params, max_new, stops, stop_ids)]
        done: list[Finished | None] = [None] * len(prompts)
        budgets = []
        for i, ids in enumerate(prompts):
            if not ids:
                raise ValueError("the prompt is empty: give at least one token")
            budgets.append(min(max_new[i], self.max_seq - len(ids)))
            if budgets[-1] <= 0:
                done[i] = Finished("", "length", len(ids), 0)
        todo = [i for i in range(len(prompts)) if done[i] is None]
        if not todo:
            return [d for d in done if d is not None]
        with self._engine_lock:
            engine = self._engine_for([len(prompts[i]) + budgets[i] for i in todo])
            outs = {i: TextOut(self.tokenizer, stops[i]) for i in todo}
            texts = {i: "" for i in todo}
            made = dict.fromkeys(todo, 0)
            of: dict[int, int] = {}
            try:
                for i in todo:
                    of[engine.add(prompts[i], params[i], budgets[i])] = i
                while of:
                    for o in engine.step():
                        i = of.get(o.seq, -1)
                        if i < 0:
                            continue
                        if o.error is not None:
                            raise o.error
                        ended = None
                        if o.token in stop_ids[i]:
                            ended = "stop"
                        else:
                            made[i] += 1
                            texts[i] += outs[i].push(o.token)
                            if outs[i].stopped:
                                ended = "stop"
                            elif o.finished:
                                texts[i] += outs[i].finish()
                                ended = "stop" if outs[i].stopped else "length"
                        if ended == "stop" and not outs[i].stopped:
                            texts[i] += outs[i].finish()
                        if ended is not None:
                            del of[o.seq]
                            if not o.finished:
                                engine.cancel(o.seq)
                            done[i] = Finished(texts[i], ended, len(prompts[i]), made[i])
            finally:
                for seq in of:  # (an error: the others are let go)
                    engine.cancel(seq)
        return [d for d in done if d is not None]

    def _collect(self, ids: list[int], run: Iterator[tuple[str, str | None, int]]) -> Finished:
        text, reason, n = "", "length", 0
        for piece, why, count in run:
            text += piece
            reason = why or reason
            n = count
        return Finished(text, reason, len(ids), n)

    def _engine_for(self, lengths: list[int]) -> batch.BatchEngine:
        """A ``BatchEngine`` on this model with room for sequences of ``lengths`` positions
        (prompt and new tokens): the one kept from the last batch where it has that room (its
        cache of prompt prefixes with it), else a larger one."""
        bs = 16
        slots = min(len(lengths), BATCH_SLOTS)
        blocks = sum(sorted((-(-n // bs) for n in lengths), reverse=True)[:slots])
        e = self._engine
        if e is None or e.max_batch < slots or e.num_blocks < blocks:
            if e is not None:
                slots, blocks = max(slots, e.max_batch), max(blocks, e.num_blocks)
                self._engine = e = None  # (its memory goes back to the pool first)
            self._engine = e = batch.BatchEngine(self, max_batch=slots, block_size=bs,
                                                 num_blocks=blocks)
        return e

    # -- OpenAI's shapes (as llama-cpp-python's Llama gives them) ---------------------------------
    def create_chat_completion(
            self, messages: list[dict[str, Any]], max_tokens: int | None = None,
            temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
            stop: str | list[str] | None = None, seed: int | None = None, stream: bool = False,
            presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
            repeat_penalty: float = 1.0, logit_bias: dict[int, float] | None = None,
            tools: list[dict[str, Any]] | None = None, tool_choice: Any = None,
            response_format: dict[str, Any] | None = None) -> dict | Iterator[dict]:
        """An answer to the chat ``messages`` as OpenAI's API gives it: ``{"id", "object":
        "chat.completion", "created", "model", "choices": [{"index": 0, "message": {"role":
        "assistant", "content": ...}, "finish_reason": "stop" | "length"}], "usage":
        {"prompt_tokens", "completion_tokens", "total_tokens"}}``; with ``stream=True`` an
        iterator of ``chat.completion.chunk`` dicts (the first delta names the role, the last
        carries the finish reason). ``max_tokens`` None (or 0): up to the end of the context.
        The defaults are llama-cpp-python's. Tools and constrained ``response_format`` are
        served by ``clops serve`` (refused here).

        >>> r = model.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=8)
        >>> r["choices"][0]["message"]["content"]
        """
        check_chat_extras(tools, tool_choice, response_format)
        p = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                           repetition_penalty=repeat_penalty, seed=seed,
                           presence_penalty=presence_penalty,
                           frequency_penalty=frequency_penalty,
                           logit_bias=_bias(logit_bias))
        _check_sampling(p)
        _check_bias(p, self.config.vocab_size)
        ids, stop_ids = _encode(self.tokenizer, chat_messages(messages), True)
        run = _run(self, ids, p, _max_tokens(max_tokens, self.max_seq), stop_list(stop),
                        stop_ids)
        r = Response(True, self.source_path)
        if stream:
            return self._chunks(r, run)
        return r.whole([self._collect(ids, run)])

    def create_completion(
            self, prompt: str | list[str], max_tokens: int | None = 16,
            temperature: float = 0.8, top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
            stop: str | list[str] | None = None, seed: int | None = None, stream: bool = False,
            echo: bool = False, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
            repeat_penalty: float = 1.0, logit_bias: dict[int, float] | None = None,
            ) -> dict | Iterator[dict]:
        """The continuation of ``prompt`` as OpenAI's API gives it: ``{"id", "object":
        "text_completion", "created", "model", "choices": [{"index", "text", "logprobs":
        None, "finish_reason"}], "usage"}``; a list of prompts gives a choice each (decoded
        together, as ``generate``); ``stream=True`` (one prompt) an iterator of chunks.
        ``echo`` puts the prompt before the text. ``max_tokens`` None (or 0): up to the end of
        the context. The defaults are llama-cpp-python's.

        >>> model.create_completion("Q: What's Oxygen? A:", max_tokens=8)["choices"][0]["text"]
        """
        p = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                           repetition_penalty=repeat_penalty, seed=seed,
                           presence_penalty=presence_penalty,
                           frequency_penalty=frequency_penalty,
                           logit_bias=_bias(logit_bias))
        _check_sampling(p)
        _check_bias(p, self.config.vocab_size)
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not prompts or \
                not all(isinstance(s, str) for s in prompts):
            raise TypeError("prompt must be a string or a non-empty list of strings")
        if stream and len(prompts) > 1:
            raise ValueError("stream=True takes one prompt, not a list")
        stops = stop_list(stop)
        max_new = _max_tokens(max_tokens, self.max_seq)
        r = Response(False, self.source_path)
        encoded = [_encode(self.tokenizer, s, False) for s in prompts]
        if stream:
            ids, stop_ids = encoded[0]
            return self._chunks(r, _run(self, ids, p, max_new, stops, stop_ids),
                                prompts[0] if echo else None)
        done = self._many([ids for ids, _ in encoded], [p] * len(prompts),
                          [max_new] * len(prompts), [stops] * len(prompts),
                          [e for _, e in encoded])
        return r.whole(done, prompts if echo else None)

    def __call__(self, prompt: str | list[str], **kwargs: Any) -> dict | Iterator[dict]:
        """``create_completion`` (as ``llama_cpp.Llama(...)(prompt)``)."""
        return self.create_completion(prompt, **kwargs)

    @staticmethod
    def _chunks(r: Response, run: Iterator[tuple[str, str | None, int]],
                echo: str | None = None) -> Iterator[dict]:
        if r.chat:
            yield r.chunk(None, role=True)
        if echo:
            yield r.chunk(echo)
        for piece, reason, _ in run:
            if piece or reason:
                yield r.chunk(piece, reason)

    def __repr__(self) -> str:
        c = self.config
        experts = f", {c.n_experts} experts ({c.n_experts_used} a token)" if c.n_experts else ""
        return (f"<clops.llm.Model {c.arch} {c.n_layers} layers, dim {c.dim}{experts}, vocab "
                f"{c.vocab_size} on {self.where}>")


KV_CACHE_TYPES = ("float16", "float32")


def sizes(cfg: ModelConfig, devs: Sequence[CLDevice], max_seq_len: int | None,
          chunk: int | None, kv_cache: str | None) -> tuple[int, int, bool]:
    """A model's context, prompt chunk and KV cache type (float16: True) on ``devs``."""
    max_seq = int(min(max_seq_len or 4096, cfg.context_length or 4096))
    if chunk is None:
        # PERF (H200, pp512 in one chunk of 512 rather than four of 128): SmolLM2 31k ->
        # 78k tok/s, a 1B body 31k -> 38k (fewer launches, fuller products)
        chunk = PROMPT_CHUNK_CPU if any(d.kind == "cpu" for d in devs) else PROMPT_CHUNK_GPU
    # (a split model's cache type is its last part's: the one BatchEngine reads)
    return max_seq, int(max(1, min(chunk, max_seq))), _kv_half(kv_cache, devs[-1])


def _kv_half(kv_cache: str | None, dev: CLDevice) -> bool:
    """Whether the KV cache holds float16 values: ``kv_cache`` "float16" or "float32", or
    None for float16 on GPUs (half the bytes attention reads at long contexts, the cache
    llama.cpp keeps by default) and float32 on CPUs."""
    if kv_cache is None:
        return dev.kind != "cpu"
    if kv_cache not in KV_CACHE_TYPES:
        raise ValueError(f"kv_cache must be one of {KV_CACHE_TYPES} (or None: float16 on GPUs, "
                         f"float32 on CPUs), not {kv_cache!r}")
    return kv_cache == "float16"


def _check_sampling(p: SamplingParams) -> None:
    """``p``'s fields in range, and nothing asked that generate does not give. (Token ids in
    ``logit_bias`` are checked against the vocabulary where they are applied.)"""
    p.check()
    if p.logprobs:
        raise ValueError("generate reports no log-probabilities (SamplingParams.logprobs): "
                         "use clops serve, or BatchEngine's outputs")


def _check_bias(p: SamplingParams, vocab: int) -> None:
    if any(not 0 <= int(t) < vocab for t in p.logit_bias):
        raise ValueError(f"logit_bias names tokens outside [0, {vocab})")


def _encode(tok: TextTokenizer, prompt: str | list[dict[str, Any]], chat: bool,
            ) -> tuple[list[int], list[int]]:
    """(the prompt's token ids, the ids that end its answer): a chat (``chat`` or a list of
    messages) through the chat template, ending also at the end of the turn."""
    stop_ids = list(tok.eos_ids)
    if chat or isinstance(prompt, list):
        messages = prompt if isinstance(prompt, list) else [
            {"role": "user", "content": prompt}]
        # the messages' text stays text: a role marker typed in one opens no turn
        ids = tok.encode_chat(messages, add_generation_prompt=True)
        for marker in _END_OF_TURN:
            tid = tok.backend.token_to_id(marker)
            if tid is not None:
                stop_ids.append(tid)
    else:
        ids = tok.encode(str(prompt), add_special_tokens=True)
    return ids, stop_ids


def _run(model: Model, ids: list[int], p: SamplingParams, max_new: int, stops: list[str],
         stop_ids: list[int]) -> Iterator[tuple[str, str | None, int]]:
    """One sequence alone: (new text, finish reason or None, tokens so far) as tokens come;
    the last item has the reason ("stop": a stop token or string; "length")."""
    out = TextOut(model.tokenizer, stops)
    ends = set(stop_ids)
    gen = model.generate_ids(ids, max_new, p.temperature, p.top_k, p.top_p, p.min_p,
                             p.repetition_penalty, p.seed, presence_penalty=p.presence_penalty,
                             frequency_penalty=p.frequency_penalty, logit_bias=p.logit_bias)
    n = 0
    reason = "length"
    try:
        for t in gen:
            if t in ends:
                reason = "stop"
                break
            n += 1
            piece = out.push(t)
            if out.stopped:
                yield piece, "stop", n
                return
            if piece:
                yield piece, None, n
    finally:
        close = getattr(gen, "close", None)  # (a generator: it lets the model go at once)
        if close is not None:
            close()
    piece = out.finish()
    yield piece, "stop" if out.stopped else reason, n


def _budget(p: SamplingParams, max_new_tokens: int) -> int:
    return p.max_tokens if p.max_tokens is not None else int(max_new_tokens)


def _max_tokens(max_tokens: int | None, context: int) -> int:
    """llama-cpp-python's ``max_tokens``: None or 0 and less, up to the end of the context."""
    if max_tokens is None or max_tokens <= 0:
        return context
    return int(max_tokens)


def _bias(logit_bias: dict[Any, float] | None) -> dict[int, float]:
    """``logit_bias`` with its keys as token ids (JSON's are strings of digits)."""
    out = {}
    for k, v in (logit_bias or {}).items():
        if isinstance(k, str) and k.isascii() and k.isdigit():
            k = int(k)
        out[k] = float(v)
    return out


# generate's sampling keywords at their defaults (sampling= replaces them)
_DEFAULT_SAMPLING = SamplingParams()


def _sampler_defaults() -> dict[str, Any]:
    return {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "penalty": 1.0,
            "seed": 0}


def _apply_sampler(launch: Launch, plan: LaunchPlan, params: dict[str, Any]) -> None:
    idx = plan.launches.index(launch)
    conv: dict[str, Any] = {"temperature": np.float32, "top_k": np.int32,
                            "top_p": np.float32, "min_p": np.float32, "penalty": np.float32,
                            "seed": np.uint32}
    for key, pos in sample_kernel.setting_args(launch).items():
        plan.set_scalar(idx, pos, conv[key](params[key]))


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


# the tensors a model's loader reads as matrices (``WeightSource.matrix``)
_MATRICES = frozenset(("embed", "output", "qkv", "q", "k", "v", "o") + DENSE_FFN + EXPERTS)
# PERF (2-core EPYC, Intel's CPU runtime, bench_load.py): an 8-layer Qwen3-30B-A3B Q4_K_M body
# loaded in 12.5 s on two threads against 18.7 on one (numpy's loops run without the
# interpreter's lock); hosts of more cores not measured yet
LOAD_THREADS = max(1, min(8, (os.cpu_count() or 1)))


class _Ahead:
    """``fn(name)`` for the names of ``names``, in that order, on ``LOAD_THREADS`` threads: at
    most ``LOAD_THREADS + 1`` ahead of the one asked for (the packed weights wait in host
    memory for their uploads). ``get`` gives one's result (or raises its error); a name not in
    the list is computed on the spot."""

    def __init__(self, fn: Any, names: list[str]) -> None:
        self._fn, self._names = fn, names
        self._at = {n: i for i, n in enumerate(names)}
        self._pool = ThreadPoolExecutor(LOAD_THREADS, "clops-load") if LOAD_THREADS > 1 \
            else None
        self._futures: dict[str, Future] = {}
        self._next = 0

    def get(self, name: str) -> Any:
        i = self._at.get(name)
        if self._pool is None or i is None:
            return self._fn(name)
        while self._next < len(self._names) and self._next <= i + LOAD_THREADS:
            n = self._names[self._next]
            self._futures[n] = self._pool.submit(self._fn, n)
            self._next += 1
        fut = self._futures.pop(name, None)
        return self._fn(name) if fut is None else fut.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._futures.clear()


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False,
                file=sys.stderr, disable=None)
