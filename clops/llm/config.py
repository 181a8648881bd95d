"""llm, configuration: the shape and the choices of a decoder (one of ``arch.ARCHS``) from GGUF
metadata or a Hugging Face ``config.json``, read through its family's description, and its
rotary frequencies (with llama3, linear and YaRN scaling, partial rotary)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..nn import rotary
from .arch import ACTIVATIONS, ARCHS, HF_TYPES, Arch, nope_layers, sqrt_dim, supported, swa_layers
from .gguf_file import ModelFileError

ARCHITECTURES = tuple(ARCHS)
# (Qwen3-235B-A22B: 128 experts, 8 a token; DeepSeek-V3: 256, 8)
MAX_EXPERTS = 512
MAX_EXPERTS_USED = 16
ROPE_TYPES = rotary.ROPE_TYPES

# Upper bounds of the integer sizes, far above any real model's (a 405B Llama: 126 layers, dim
# 16384, 128 heads of 128, ffn 53248, vocab 128256); the tensors must then agree with them.
LIMITS: dict[str, int] = {
    "n_layers": 1024, "dim": 1 << 17, "n_heads": 1024, "n_kv_heads": 1024, "head_dim": 512,
    "ffn_dim": 1 << 20, "vocab_size": 1 << 22, "context_length": 1 << 31,
}


@dataclass
class ModelConfig:
    arch: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    rope_neox: bool  # True: rotate split halves (HF layout); False: adjacent pairs (GGUF llama)
    context_length: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    rope_scaling: dict[str, Any] | None = None
    rope_freq_factors: np.ndarray | None = field(default=None, repr=False)
    # the family's choices (arch.py); the defaults are Llama's
    act: str = "silu"
    attn_scale: float = 0.0          # 0: 1 / sqrt(head_dim)
    attn_softcap: float = 0.0        # scores become cap * tanh(score / cap); 0: none
    final_softcap: float = 0.0       # the same on the logits
    embed_scale: float = 1.0         # embeddings are multiplied by it
    residual_scale: float = 1.0      # each block's output is multiplied by it before the add
    logit_scale: float = 1.0         # logits are divided by it
    sliding_window: int = 0          # keys (pos - window, pos] on sliding layers
    swa: tuple[bool, ...] = ()       # per layer: slides (empty: none does)
    rope_dims: int = 0               # rotated dimensions of a head (0: all)
    rope_theta_swa: float = 0.0      # rope base of sliding layers, unscaled (0: rope_theta)
    nope: tuple[bool, ...] = ()      # per layer: no rotary embedding
    # a mixture of experts in place of each layer's FFN (n_experts 0: a dense FFN): the experts
    # a token uses, each expert's FFN size, and whether the chosen experts' weights are
    # renormalised to sum to 1 (else each keeps its softmax over every expert)
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn_dim: int = 0
    experts_norm: bool = False
    glu_limit: float = 0.0           # the GLU's clamp (arch.Arch.glu_limit; 0: none)
    glu_alpha: float = 1.0
    # where each field came from in the file ("ffn_dim": "llama.feed_forward_length"), for
    # messages
    keys: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def desc(self) -> Arch:
        """The family's description (arch.ARCHS)."""
        return ARCHS[self.arch]

    @property
    def rotary(self) -> int:
        """The rotated dimensions of a head."""
        return self.rope_dims or self.head_dim

    @property
    def scale(self) -> float:
        """The attention score scale."""
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    def layer_keys(self) -> tuple[str, ...]:
        """The canonical keys of the tensors each layer reads (``Arch.layer_keys``)."""
        return self.desc.layer_keys(self.qkv_bias, experts=self.n_experts > 0)

    def sliding(self, layer: int) -> bool:
        return bool(self.sliding_window) and layer < len(self.swa) and self.swa[layer]

    def name(self, field_name: str) -> str:
        """``field_name`` with the file's key for it: "ffn_dim ('intermediate_size')"."""
        key = self.keys.get(field_name)
        return f"{field_name} ({key!r})" if key else field_name

    def validate(self, source: str) -> None:
        """Raise ``ModelFileError`` unless every size is in bounds and the rotary frequencies
        are in [0, 1] (``WeightSource.validate`` then checks the tensors against these sizes)."""
        if self.arch not in ARCHITECTURES:
            raise ModelFileError(f"{source}: architecture {self.arch!r} is not supported "
                                 f"({supported()})")
        for name, high in LIMITS.items():
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= high:
                raise ModelFileError(f"{source}: {self.name(name)} = {v!r}, expected an "
                                     f"integer in [1, {high}]")
        if self.n_heads % self.n_kv_heads:
            raise ModelFileError(
                f"{source}: {self.name('n_heads')} = {self.n_heads} heads do not group over "
                f"{self.name('n_kv_heads')} = {self.n_kv_heads} KV heads")
        q_rows = self.n_heads * self.head_dim
        if self.head_dim % 4 or self.dim % 32 or self.ffn_dim % 32 or q_rows % 32:
            raise ModelFileError(
                f"{source}: sizes (dim {self.dim}, heads x head_dim {q_rows}, ffn "
                f"{self.ffn_dim}) must be multiples of 32, head_dim ({self.head_dim}) of 4")
        if not 0.0 < self.norm_eps < 1.0:
            raise ModelFileError(f"{source}: {self.name('norm_eps')} = {self.norm_eps!r}, "
                                 "expected a number in (0, 1)")
        if not 0.0 < self.rope_theta < math.inf:
            raise ModelFileError(f"{source}: {self.name('rope_theta')} = {self.rope_theta!r}, "
                                 "expected a positive finite number")
        r = self.rope_dims
        if r and not (0 < r <= self.head_dim and r % 2 == 0):
            raise ModelFileError(f"{source}: {self.name('rope_dims')} = {r}, expected an even "
                                 f"number in [2, head_dim = {self.head_dim}]")
        if self.act not in ("silu", "gelu_tanh"):
            raise ModelFileError(f"{source}: activation {self.act!r} is not supported ("
                                 f"{', '.join(ACTIVATIONS)})")
        for name in ("attn_softcap", "final_softcap", "attn_scale", "rope_theta_swa",
                     "glu_limit"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ModelFileError(f"{source}: {self.name(name)} = {v!r}, expected a "
                                     "finite number >= 0 (0: none)")
        if self.glu_limit and not (0 < self.glu_alpha < math.inf):
            raise ModelFileError(f"{source}: swiglu_alpha = {self.glu_alpha!r}, expected a "
                                 "positive finite number")
        for name in ("embed_scale", "residual_scale", "logit_scale"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ModelFileError(f"{source}: {self.name(name)} = {v!r}, expected a "
                                     "positive finite number")
        self._validate_experts(source)
        if not 0 <= self.sliding_window < (1 << 31):
            raise ModelFileError(f"{source}: {self.name('sliding_window')} = "
                                 f"{self.sliding_window!r}, expected a window >= 0")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ModelFileError(f"{source}: rope scaling {self.rope_scaling!r} is not a "
                                 "mapping")
        try:
            with np.errstate(all="ignore"):
                inv = self.inv_freq()
        except (TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
            raise ModelFileError(f"{source}: rope scaling {self.rope_scaling!r}: {e}") from None
        check_rotary(inv, f"rope_theta {self.rope_theta}, scaling {self.rope_scaling!r}",
                     source)
        if self.rope_dims and self.rope_dims < self.head_dim and self.rope_mscale() != 1.0:
            raise ModelFileError(
                f"{source}: rope scaling {self.rope_scaling!r} scales the rotated part of "
                "each head; clops runs it on whole heads only (partial rotary with rope_dims "
                f"{self.rope_dims} < head_dim {self.head_dim})")

    def _validate_experts(self, source: str) -> None:
        desc = self.desc
        if self.n_experts == 0:
            if desc.experts_always:
                raise ModelFileError(f"{source}: a {self.arch} model has experts, but the file "
                                     f"gives no {self.name('n_experts')}")
            return
        if desc.experts_norm is None:
            raise ModelFileError(f"{source}: {self.name('n_experts')} = {self.n_experts}, but "
                                 f"clops runs {self.arch} models without experts")
        for name, high in (("n_experts", MAX_EXPERTS), ("n_experts_used", MAX_EXPERTS_USED),
                           ("expert_ffn_dim", LIMITS["ffn_dim"])):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= high:
                raise ModelFileError(f"{source}: {self.name(name)} = {v!r}, expected an "
                                     f"integer in [1, {high}]")
        if self.n_experts_used > self.n_experts:
            raise ModelFileError(
                f"{source}: {self.name('n_experts_used')} = {self.n_experts_used} experts a "
                f"token, more than the {self.name('n_experts')} = {self.n_experts} there are")
        if self.expert_ffn_dim % 32:
            raise ModelFileError(f"{source}: {self.name('expert_ffn_dim')} = "
                                 f"{self.expert_ffn_dim}, expected a multiple of 32")

    def rope_mscale(self) -> float:
        """The factor rope scaling puts on cos and sin (YaRN's attention factor), 1 for others:
        folded into the attention scale, squared (q and k both carry it)."""
        sc = self.rope_scaling or {}
        if sc.get("rope_type", sc.get("type")) != "yarn":
            return 1.0
        factor = float(sc.get("factor", 1.0))
        given = sc.get("attention_factor")
        if given is not None:
            return float(given)

        def m(scale: float, k: float = 1.0) -> float:
            return 0.1 * k * math.log(scale) + 1.0 if scale > 1 else 1.0

        if sc.get("mscale") and sc.get("mscale_all_dim"):
            return m(factor, float(sc["mscale"])) / m(factor, float(sc["mscale_all_dim"]))
        return m(factor)

    def inv_freq(self, sliding: bool = False) -> np.ndarray:
        """The rotary inverse frequencies [rotary/2], float32 as the reference computes them;
        ``sliding``: of the sliding-window layers where they have their own base (unscaled)."""
        if sliding and self.rope_theta_swa:
            return rotary.inv_freq(self.rotary, self.rope_theta_swa)
        try:
            return rotary.inv_freq(self.rotary, self.rope_theta, self.rope_scaling,
                                 self.context_length, self.rope_freq_factors)
        except rotary.UnsupportedRopeError as e:
            raise ModelFileError(str(e)) from None


def check_rotary(inv: np.ndarray, given: str, source: str) -> None:
    """Raise unless every rotary frequency lies in [0, 1] radians per position, as in every
    real model (rope_theta >= 1, scaling factors >= 1): larger ones turn positions into angles
    that float32 cannot resolve."""
    if not (np.isfinite(inv).all() and (inv >= 0).all() and (inv <= 1).all()):
        raise ModelFileError(
            f"{source}: rotary frequencies span [{float(np.min(inv)):g}, "
            f"{float(np.max(inv)):g}] radians per position, expected [0, 1] ({given})")


_MISSING: Any = object()


def _get(meta: dict[str, Any], key: str, source: str, default: Any = _MISSING) -> Any:
    if key in meta and meta[key] is not None:
        return meta[key]
    if default is _MISSING:
        raise ModelFileError(f"{source}: {key!r} is missing")
    return default


def _int(meta: dict[str, Any], key: str, source: str, default: Any = _MISSING) -> int:
    """An integer value (an integral float too: some writers store sizes as floats)."""
    v = _get(meta, key, source, default)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ModelFileError(f"{source}: {key!r} is {v!r} ({type(v).__name__}), expected an "
                             "integer")
    return v


def _float(meta: dict[str, Any], key: str, source: str, default: Any = _MISSING) -> float:
    v = _get(meta, key, source, default)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise ModelFileError(f"{source}: {key!r} is {v!r} ({type(v).__name__}), expected a "
                             "finite number")
    return float(v)


def _n_layers(meta: dict[str, Any], key: str, source: str) -> int:
    """The layer count, bounded before anything is made per layer."""
    n = _int(meta, key, source)
    if not 0 < n <= LIMITS["n_layers"]:
        raise ModelFileError(f"{source}: n_layers ({key!r}) = {n!r}, expected an integer in "
                             f"[1, {LIMITS['n_layers']}]")
    return n


def _arch_gguf(meta: dict[str, Any], source: str) -> Arch:
    name = _get(meta, "general.architecture", source)
    if name not in ARCHS:
        raise ModelFileError(f"{source}: architecture {name!r} is not supported ({supported()})")
    return ARCHS[name]


def from_gguf(meta: dict[str, Any], tensor_names: set[str], source: str) -> ModelConfig:
    a = _arch_gguf(meta, source)
    arch = a.name
    p = f"{arch}."
    n_heads = _int(meta, p + "attention.head_count", source)
    dim = _int(meta, p + "embedding_length", source)
    per_head = dim // n_heads if n_heads > 0 else 0
    rot_key = p + "rope.dimension_count"
    # NOTE: rope.dimension_count is the head size where nothing else gives it (older llama
    # files), except in families whose rotary may cover part of a head (phi3)
    head_dim = _int(meta, p + "attention.key_length", source, per_head if a.partial_rotary
                    else _int(meta, rot_key, source, per_head))
    rope_dims = _int(meta, rot_key, source, head_dim) if a.partial_rotary else 0
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = _int(meta, p + "vocab_size", source, len(tokens) if isinstance(tokens, list) else 0)
    keys = {"n_layers": "block_count", "dim": "embedding_length",
            "n_heads": "attention.head_count", "n_kv_heads": "attention.head_count_kv",
            "ffn_dim": "feed_forward_length", "vocab_size": "vocab_size",
            "norm_eps": "attention.layer_norm_rms_epsilon", "rope_theta": "rope.freq_base",
            "context_length": "context_length", "head_dim": "attention.key_length",
            "rope_dims": "rope.dimension_count", "sliding_window": "attention.sliding_window",
            "rope_theta_swa": "rope.freq_base_swa"}
    keys.update({k: s.gguf for k, s in a.settings.items() if s.gguf})
    keys = {k: p + v for k, v in keys.items()}
    if keys["head_dim"] not in meta:
        keys["head_dim"] = (rot_key if rot_key in meta and not a.partial_rotary
                            else f"{p}embedding_length / {p}attention.head_count")
    if keys["vocab_size"] not in meta:
        keys["vocab_size"] = "the length of tokenizer.ggml.tokens"
    scaling = _gguf_scaling(meta, p, source)
    if scaling is not None and scaling["rope_type"] == "yarn" and not a.yarn_truncate:
        scaling["truncate"] = False
    n_layers = _n_layers(meta, p + "block_count", source)
    window = _int(meta, p + "attention.sliding_window", source, 0)
    pattern = meta.get(p + "attention.sliding_window_pattern")
    if isinstance(pattern, list):
        swa = tuple(bool(v) for v in pattern)
        if len(swa) != n_layers:
            raise ModelFileError(f"{source}: {p}attention.sliding_window_pattern has "
                                 f"{len(swa)} values, expected one per layer ({n_layers})")
    else:
        n = _int(meta, p + "attention.sliding_window_pattern", source, a.swa_pattern)
        swa = swa_layers(n, n_layers)
    cfg = ModelConfig(
        arch=arch, n_layers=n_layers, dim=dim,
        n_heads=n_heads, n_kv_heads=_int(meta, p + "attention.head_count_kv", source, n_heads),
        head_dim=head_dim, ffn_dim=_int(meta, p + "feed_forward_length", source),
        vocab_size=vocab,
        norm_eps=_float(meta, p + "attention.layer_norm_rms_epsilon", source, 1e-5),
        rope_theta=_float(meta, p + "rope.freq_base", source, 10000.0),
        # NOTE: llama.cpp's converter permutes llama-style Q/K rows for adjacent-pair rotation
        rope_neox=a.gguf_neox,
        context_length=_int(meta, p + "context_length", source, 2048),
        tied_embeddings="output.weight" not in tensor_names,
        qkv_bias="blk.0.attn_q.bias" in tensor_names, rope_scaling=scaling, keys=keys,
        act=a.act, embed_scale=sqrt_dim(dim) if a.embed_scale_sqrt_dim else 1.0,
        glu_limit=a.glu_limit, glu_alpha=a.glu_alpha,
        sliding_window=window, swa=swa if window else (), rope_dims=rope_dims,
        rope_theta_swa=_float(meta, p + "rope.freq_base_swa", source, a.swa_theta or 0.0),
        nope=nope_layers(a.nope_interval, n_layers))
    for name, s in a.settings.items():
        if s.gguf:
            setattr(cfg, name, _float(meta, p + s.gguf, source, getattr(cfg, name)))
    if n_layers == a.gguf_width_scale_layers and p + "attention.scale" not in meta and n_heads:
        # (Gemma 2 / 3 27B: query_pre_attn_scalar is dim / heads, which the file does not hold)
        cfg.attn_scale = (dim / n_heads) ** -0.5
        cfg.keys["attn_scale"] = f"{p}embedding_length / {p}attention.head_count (27B)"
    if p + "expert_count" in meta and _int(meta, p + "expert_count", source) > 0:
        cfg.n_experts = _int(meta, p + "expert_count", source)
        cfg.n_experts_used = _int(meta, p + "expert_used_count", source)
        cfg.expert_ffn_dim = _int(meta, p + "expert_feed_forward_length", source, cfg.ffn_dim)
        # (a softmax of the chosen experts' scores is the softmax of all, renormalised)
        norm = meta.get(p + "expert_weights_norm", a.experts_norm)
        cfg.experts_norm = bool(norm) or meta.get(p + "expert_gating_func") == 3
        cfg.keys.update({k: p + v for k, v in (
            ("n_experts", "expert_count"), ("n_experts_used", "expert_used_count"),
            ("expert_ffn_dim", "expert_feed_forward_length"
             if p + "expert_feed_forward_length" in meta else "feed_forward_length"))})
        _gguf_gating(meta, p, source)
    cfg.validate(source)
    check_gguf_tokenizer(meta, cfg.vocab_size, source)
    return cfg


def _gguf_gating(meta: dict[str, Any], p: str, source: str) -> None:
    """Refuse a router that does not take a softmax of its scores (llama.cpp's gating
    function 1; 2 is a sigmoid, DeepSeek-V3's)."""
    gating = meta.get(p + "expert_gating_func", 1)
    if gating not in (1, 3):
        raise ModelFileError(f"{source}: {p}expert_gating_func = {gating!r}: clops' routers "
                             "take the softmax of the router's scores (1), or of the chosen "
                             "experts' (3)")
    scale = meta.get(p + "expert_weights_scale", 1.0)
    if scale not in (0, 0.0, 1, 1.0):
        raise ModelFileError(f"{source}: {p}expert_weights_scale = {scale!r}: clops' routers "
                             "do not scale the experts' weights (1)")
    shared = meta.get(p + "expert_shared_count", 0)
    if shared:
        raise ModelFileError(f"{source}: {p}expert_shared_count = {shared!r}: shared experts "
                             "are not supported yet")


def _gguf_scaling(meta: dict[str, Any], p: str, source: str) -> dict[str, Any] | None:
    kind = meta.get(p + "rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = _float(meta, p + "rope.scaling.factor", source, 1.0)
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        sc: dict[str, Any] = {"rope_type": "yarn", "factor": factor}
        orig = p + "rope.scaling.original_context_length"
        if orig in meta:
            sc["original_max_position_embeddings"] = _int(meta, orig, source)
        for k in ("beta_fast", "beta_slow"):
            if p + f"rope.scaling.yarn_{k}" in meta:
                sc[k] = _float(meta, p + f"rope.scaling.yarn_{k}", source)
        return sc
    raise ModelFileError(f"{source}: {p}rope.scaling.type {kind!r} is not supported "
                         "(none, linear, yarn)")


def check_gguf_tokenizer(meta: dict[str, Any], vocab_size: int, source: str) -> None:
    """The ``tokenizer.ggml.*`` metadata agrees with itself and with the model's vocabulary:
    lists of the right element types and lengths, special ids in range."""
    key = "tokenizer.ggml.tokens"
    tokens = meta.get(key)
    if not isinstance(tokens, list) or not tokens:
        raise ModelFileError(f"{source}: metadata {key!r} (the vocabulary) is missing or empty")
    if not all(isinstance(t, str) for t in tokens):
        raise ModelFileError(f"{source}: metadata {key!r} holds non-strings, expected strings")
    if len(tokens) > vocab_size:
        raise ModelFileError(f"{source}: metadata {key!r} holds {len(tokens)} tokens, more "
                             f"than the model's {vocab_size} embedding rows")
    for name, kinds in (("token_type", (int,)), ("scores", (int, float))):
        k = f"tokenizer.ggml.{name}"
        v = meta.get(k)
        if v is None:
            continue
        if not isinstance(v, list) or len(v) != len(tokens) or not all(
                isinstance(x, kinds) and not isinstance(x, bool) for x in v):
            found = f"{len(v)} values" if isinstance(v, list) else repr(v)[:40]
            raise ModelFileError(f"{source}: metadata {k!r} is {found}, expected one "
                                 f"{'/'.join(t.__name__ for t in kinds)} per token "
                                 f"({len(tokens)})")
    merges = meta.get("tokenizer.ggml.merges")
    if merges is not None and (not isinstance(merges, list) or not all(
            isinstance(m, str) for m in merges)):
        raise ModelFileError(f"{source}: metadata 'tokenizer.ggml.merges' is not a list of "
                             "strings")
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise ModelFileError(f"{source}: metadata 'tokenizer.chat_template' is "
                             f"{type(template).__name__}, expected a string")
    for name in ("bos", "eos", "eot", "unknown", "padding"):
        k = f"tokenizer.ggml.{name}_token_id"
        v = meta.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)
                              or not 0 <= v < len(tokens)):
            raise ModelFileError(f"{source}: metadata {k!r} is {v!r}, expected a token id in "
                                 f"[0, {len(tokens)})")


_HF_KEYS = {"n_layers": "num_hidden_layers", "dim": "hidden_size",
            "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
            "head_dim": "head_dim", "ffn_dim": "intermediate_size", "vocab_size": "vocab_size",
            "norm_eps": "rms_norm_eps", "rope_theta": "rope_theta",
            "context_length": "max_position_embeddings", "sliding_window": "sliding_window",
            "rope_dims": "partial_rotary_factor"}


def from_hf(config: dict[str, Any], source: str) -> ModelConfig:
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    a = HF_TYPES.get(str(model_type))
    if a is None:
        raise ModelFileError(f"{source}: model_type {model_type!r} ({archs}) is not supported "
                             f"({supported()})")
    arch = a.name
    act_key = "hidden_activation" if "hidden_activation" in config else "hidden_act"
    act = ACTIVATIONS.get(str(config.get(act_key, "silu")))
    if act is None or act != a.act:
        raise ModelFileError(f"{source}: {act_key} {config.get(act_key)!r} is not supported "
                             f"for {model_type} ({a.act})")
    n_heads = _int(config, "num_attention_heads", source)
    dim = _int(config, "hidden_size", source)
    n_layers = _n_layers(config, "num_hidden_layers", source)
    rope = config.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ModelFileError(f"{source}: 'rope_parameters' is {rope!r}, expected an object")
    local: dict[str, Any] = {}
    if isinstance(rope.get("full_attention"), dict):  # per layer type (gemma3)
        local = rope.get("sliding_attention") or {}
        rope = rope["full_attention"]
        if local.get("rope_type", "default") != "default":
            raise ModelFileError(f"{source}: rope scaling {local!r} of the sliding layers is "
                                 "not supported (default)")
    scaling = config.get("rope_scaling") or None
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = dict(rope)
    # NOTE: by presence, not truth: a written 0 (or false, or "") must reach the checks
    # below and be refused, as GGUF's rope.freq_base = 0 is, not become the default.
    theta_key, theta_from = "rope_theta", config
    if config.get("rope_theta") is None and rope.get("rope_theta") is not None:
        theta_key, theta_from = "rope_parameters.rope_theta", rope
    theta = _float({theta_key: theta_from.get("rope_theta")}, theta_key, source, 10000.0)
    tied = config.get("tie_word_embeddings", a.name in ("gemma2", "gemma3"))
    if not isinstance(tied, bool):
        raise ModelFileError(f"{source}: 'tie_word_embeddings' is {tied!r}, expected true or "
                             "false")
    head_dim = _int(config, "head_dim", source, dim // n_heads if n_heads > 0 else 0)
    partial = _float(rope, "partial_rotary_factor", source,
                     _float(config, "partial_rotary_factor", source, 1.0))
    if not 0 < partial <= 1:
        raise ModelFileError(f"{source}: 'partial_rotary_factor' is {partial!r}, expected a "
                             "fraction in (0, 1]")
    window = config.get("sliding_window") or 0
    window = _int({"sliding_window": window}, "sliding_window", source)
    types = config.get("layer_types")
    if isinstance(types, list):
        if len(types) != n_layers or not all(t in ("sliding_attention", "full_attention")
                                             for t in types):
            raise ModelFileError(f"{source}: 'layer_types' is {types!r}, expected "
                                 f"'sliding_attention' or 'full_attention' for each of the "
                                 f"{n_layers} layers")
        swa = tuple(t == "sliding_attention" for t in types)
    elif config.get("use_sliding_window") is False:
        window = 0  # qwen2 files name a window they do not use
    elif config.get("use_sliding_window"):
        first = _int(config, "max_window_layers", source, 0)
        swa = tuple(i >= first for i in range(n_layers))
    else:
        swa = swa_layers(_int(config, "sliding_window_pattern", source, a.swa_pattern),
                         n_layers)
    nope = nope_layers(a.nope_interval, n_layers)
    if "no_rope_layers" in config:
        flags = config["no_rope_layers"]
        if not isinstance(flags, list) or len(flags) != n_layers:
            raise ModelFileError(f"{source}: 'no_rope_layers' is {flags!r}, expected a 0 or 1 "
                                 f"for each of the {n_layers} layers")
        nope = tuple(not bool(f) for f in flags)
    keys = _HF_KEYS if config.get("head_dim") is not None else {
        **_HF_KEYS, "head_dim": "hidden_size / num_attention_heads"}
    keys = {**keys, **{k: s.hf for k, s in a.settings.items() if s.hf}, "rope_theta": theta_key}
    cfg = ModelConfig(
        arch=arch, n_layers=n_layers, dim=dim,
        n_heads=n_heads, n_kv_heads=_int(config, "num_key_value_heads", source, n_heads),
        head_dim=head_dim, ffn_dim=_int(config, "intermediate_size", source),
        vocab_size=_int(config, "vocab_size", source),
        norm_eps=_float(config, "rms_norm_eps", source, 1e-6),
        rope_theta=theta, rope_neox=True,
        context_length=_int(config, "max_position_embeddings", source, 2048),
        tied_embeddings=tied,
        qkv_bias=arch == "qwen2" or (a.biases and bool(config.get("attention_bias", False))),
        rope_scaling=scaling, keys=keys, act=act,
        embed_scale=sqrt_dim(dim) if a.embed_scale_sqrt_dim else 1.0,
        glu_limit=_float(config, "swiglu_limit", source, a.glu_limit) if a.glu_limit else 0.0,
        glu_alpha=_float(config, "swiglu_alpha", source, a.glu_alpha),
        sliding_window=window, swa=swa if window else (),
        rope_dims=int(head_dim * partial) if partial < 1 else 0,
        rope_theta_swa=_float(local, "rope_theta", source, _float(
            config, "rope_local_base_freq", source, a.swa_theta or 0.0)), nope=nope)
    for name, s in a.settings.items():
        if s.hf and config.get(s.hf) is not None:
            v = _float(config, s.hf, source)
            setattr(cfg, name, s.convert(v) if s.convert else v)
    _hf_experts(cfg, config, source)
    cfg.validate(source)
    return cfg


def _hf_experts(cfg: ModelConfig, config: dict[str, Any], source: str) -> None:
    """The mixture of experts of a config.json, where it has one (Mixtral's num_local_experts,
    Qwen3-MoE's and OLMoE's num_experts)."""
    key = next((k for k in ("num_local_experts", "num_experts") if config.get(k)), None)
    if key is None:
        return
    cfg.n_experts = _int(config, key, source)
    cfg.n_experts_used = _int(config, "num_experts_per_tok", source)
    ffn_key = "moe_intermediate_size" if "moe_intermediate_size" in config else \
        "intermediate_size"
    cfg.expert_ffn_dim = _int(config, ffn_key, source)
    norm = config.get("norm_topk_prob", cfg.desc.experts_norm)
    if not isinstance(norm, bool):
        raise ModelFileError(f"{source}: 'norm_topk_prob' is {norm!r}, expected true or false")
    cfg.experts_norm = norm
    cfg.keys.update(n_experts=key, n_experts_used="num_experts_per_tok",
                    expert_ffn_dim=ffn_key)
    for k, dense in (("mlp_only_layers", []), ("decoder_sparse_step", 1),
                     ("num_shared_experts", 0), ("shared_expert_intermediate_size", 0)):
        if config.get(k, dense) not in (dense, None):
            raise ModelFileError(f"{source}: {k!r} is {config[k]!r}: clops runs models whose "
                                 f"every layer is a mixture of experts without shared experts "
                                 f"({k} {dense!r})")
