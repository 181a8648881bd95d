"""llm, configuration: the shape of a Llama-family model (llama, qwen2) from GGUF metadata or a
Hugging Face ``config.json``, and its rotary frequencies (with Llama-3 scaling)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .gguf_file import ModelFileError

ARCHITECTURES = ("llama", "qwen2")

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
    # where each field came from in the file ("ffn_dim": "llama.feed_forward_length"), for
    # messages
    keys: dict[str, str] = field(default_factory=dict, repr=False)

    def name(self, field_name: str) -> str:
        """``field_name`` with the file's key for it: "ffn_dim ('intermediate_size')"."""
        key = self.keys.get(field_name)
        return f"{field_name} ({key!r})" if key else field_name

    def validate(self, source: str) -> None:
        """Raise ``ModelFileError`` unless every size is in bounds and the rotary frequencies
        are in [0, 1] (``WeightSource.validate`` then checks the tensors against these sizes)."""
        if self.arch not in ARCHITECTURES:
            raise ModelFileError(f"{source}: architecture {self.arch!r} is not supported "
                                 f"({', '.join(ARCHITECTURES)})")
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

    def inv_freq(self) -> np.ndarray:
        """The rotary inverse frequencies [head_dim/2], float32 as the reference computes them."""
        d = self.head_dim
        exps = np.arange(0, d, 2, dtype=np.float32) / np.float32(d)
        inv = (np.float32(1.0) / (np.float32(self.rope_theta) ** exps)).astype(np.float32)
        sc = self.rope_scaling or {}
        kind = sc.get("rope_type", sc.get("type"))
        if kind == "llama3":
            inv = _llama3_scaling(inv, sc)
        elif kind == "linear":
            factor = float(sc.get("factor", 1.0))
            if not factor > 0:
                raise ValueError(f"linear scaling needs a factor > 0, not {factor!r}")
            inv = (inv / np.float32(factor)).astype(np.float32)
        elif kind not in (None, "default"):
            raise ModelFileError(f"rope scaling {kind!r} is not supported (llama3, linear)")
        if self.rope_freq_factors is not None:
            inv = (inv / self.rope_freq_factors.astype(np.float32)).astype(np.float32)
        return inv


def check_rotary(inv: np.ndarray, given: str, source: str) -> None:
    """Raise unless every rotary frequency lies in [0, 1] radians per position, as in every
    real model (rope_theta >= 1, scaling factors >= 1): larger ones turn positions into angles
    that float32 cannot resolve."""
    if not (np.isfinite(inv).all() and (inv >= 0).all() and (inv <= 1).all()):
        raise ModelFileError(
            f"{source}: rotary frequencies span [{float(np.min(inv)):g}, "
            f"{float(np.max(inv)):g}] radians per position, expected [0, 1] ({given})")


def _llama3_scaling(inv: np.ndarray, sc: dict[str, Any]) -> np.ndarray:
    factor = float(sc.get("factor", 8.0))
    low = float(sc.get("low_freq_factor", 1.0))
    high = float(sc.get("high_freq_factor", 4.0))
    old = float(sc.get("original_max_position_embeddings", 8192))
    if not (factor > 0 and 0 < low < high and old > 0):
        raise ValueError(f"llama3 scaling needs factor > 0, 0 < low_freq_factor < "
                         f"high_freq_factor and original_max_position_embeddings > 0 (factor "
                         f"{factor}, low {low}, high {high}, original {old})")
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    out = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, out).astype(np.float32)


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


def from_gguf(meta: dict[str, Any], tensor_names: set[str], source: str) -> ModelConfig:
    arch = _get(meta, "general.architecture", source)
    if arch not in ARCHITECTURES:
        raise ModelFileError(f"{source}: architecture {arch!r} is not supported "
                             f"({', '.join(ARCHITECTURES)})")
    p = f"{arch}."
    n_heads = _int(meta, p + "attention.head_count", source)
    dim = _int(meta, p + "embedding_length", source)
    head_dim = _int(meta, p + "attention.key_length", source, _int(
        meta, p + "rope.dimension_count", source, dim // n_heads if n_heads > 0 else 0))
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = _int(meta, p + "vocab_size", source, len(tokens) if isinstance(tokens, list) else 0)
    keys = {"n_layers": "block_count", "dim": "embedding_length",
            "n_heads": "attention.head_count", "n_kv_heads": "attention.head_count_kv",
            "ffn_dim": "feed_forward_length", "vocab_size": "vocab_size",
            "norm_eps": "attention.layer_norm_rms_epsilon", "rope_theta": "rope.freq_base",
            "context_length": "context_length", "head_dim": "attention.key_length"}
    keys = {k: p + v for k, v in keys.items()}
    if keys["head_dim"] not in meta:
        keys["head_dim"] = (p + "rope.dimension_count" if p + "rope.dimension_count" in meta
                            else f"{p}embedding_length / {p}attention.head_count")
    if keys["vocab_size"] not in meta:
        keys["vocab_size"] = "the length of tokenizer.ggml.tokens"
    scaling = None
    if meta.get(p + "rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear",
                   "factor": _float(meta, p + "rope.scaling.factor", source, 1.0)}
    cfg = ModelConfig(
        arch=arch, n_layers=_int(meta, p + "block_count", source), dim=dim,
        n_heads=n_heads, n_kv_heads=_int(meta, p + "attention.head_count_kv", source, n_heads),
        head_dim=head_dim, ffn_dim=_int(meta, p + "feed_forward_length", source),
        vocab_size=vocab,
        norm_eps=_float(meta, p + "attention.layer_norm_rms_epsilon", source, 1e-5),
        rope_theta=_float(meta, p + "rope.freq_base", source, 10000.0),
        # NOTE: llama.cpp's converter permutes llama Q/K rows for adjacent-pair rotation;
        # qwen2 keeps the split-halves (NEOX) layout.
        rope_neox=arch != "llama",
        context_length=_int(meta, p + "context_length", source, 2048),
        tied_embeddings="output.weight" not in tensor_names,
        qkv_bias="blk.0.attn_q.bias" in tensor_names, rope_scaling=scaling, keys=keys)
    cfg.validate(source)
    check_gguf_tokenizer(meta, cfg.vocab_size, source)
    return cfg


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
            "context_length": "max_position_embeddings"}


def from_hf(config: dict[str, Any], source: str) -> ModelConfig:
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    arch = {"llama": "llama", "qwen2": "qwen2"}.get(str(model_type))
    if arch is None:
        raise ModelFileError(f"{source}: model_type {model_type!r} ({archs}) is not supported "
                             "(llama, qwen2)")
    if config.get("hidden_act", "silu") != "silu":
        raise ModelFileError(f"{source}: activation {config.get('hidden_act')!r} is not silu")
    n_heads = _int(config, "num_attention_heads", source)
    dim = _int(config, "hidden_size", source)
    rope = config.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ModelFileError(f"{source}: 'rope_parameters' is {rope!r}, expected an object")
    scaling = config.get("rope_scaling") or None
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = dict(rope)
    theta = config.get("rope_theta") or rope.get("rope_theta") or 10000.0
    tied = config.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ModelFileError(f"{source}: 'tie_word_embeddings' is {tied!r}, expected true or "
                             "false")
    cfg = ModelConfig(
        arch=arch, n_layers=_int(config, "num_hidden_layers", source), dim=dim,
        n_heads=n_heads, n_kv_heads=_int(config, "num_key_value_heads", source, n_heads),
        head_dim=_int(config, "head_dim", source, dim // n_heads if n_heads > 0 else 0),
        ffn_dim=_int(config, "intermediate_size", source),
        vocab_size=_int(config, "vocab_size", source),
        norm_eps=_float(config, "rms_norm_eps", source, 1e-6),
        rope_theta=_float({"rope_theta": theta}, "rope_theta", source), rope_neox=True,
        context_length=_int(config, "max_position_embeddings", source, 2048),
        tied_embeddings=tied,
        qkv_bias=arch == "qwen2" or bool(config.get("attention_bias", False)),
        rope_scaling=scaling, keys=_HF_KEYS if config.get("head_dim") is not None else {
            **_HF_KEYS, "head_dim": "hidden_size / num_attention_heads"})
    cfg.validate(source)
    return cfg
