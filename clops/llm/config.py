"""llm, configuration: the shape of a Llama-family model (llama, qwen2) from GGUF metadata or a
Hugging Face ``config.json``, and its rotary frequencies (with Llama-3 scaling)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .gguf_file import ModelFileError

ARCHITECTURES = ("llama", "qwen2")


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

    def validate(self, source: str) -> None:
        if self.arch not in ARCHITECTURES:
            raise ModelFileError(f"{source}: architecture {self.arch!r} is not supported "
                                 f"({', '.join(ARCHITECTURES)})")
        for name in ("n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                     "vocab_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ModelFileError(f"{source}: {name} = {v!r} is not a positive integer")
        if self.n_heads % self.n_kv_heads:
            raise ModelFileError(f"{source}: {self.n_heads} heads do not group over "
                                 f"{self.n_kv_heads} KV heads")
        if self.head_dim % 4 or self.dim % 32 or self.ffn_dim % 32:
            raise ModelFileError(f"{source}: sizes (dim {self.dim}, head_dim {self.head_dim}, "
                                 f"ffn {self.ffn_dim}) must be multiples of 32 (head_dim of 4)")

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
            inv = (inv / np.float32(sc.get("factor", 1.0))).astype(np.float32)
        elif kind not in (None, "default"):
            raise ModelFileError(f"rope scaling {kind!r} is not supported (llama3, linear)")
        if self.rope_freq_factors is not None:
            inv = (inv / self.rope_freq_factors.astype(np.float32)).astype(np.float32)
        return inv


def _llama3_scaling(inv: np.ndarray, sc: dict[str, Any]) -> np.ndarray:
    factor = float(sc.get("factor", 8.0))
    low = float(sc.get("low_freq_factor", 1.0))
    high = float(sc.get("high_freq_factor", 4.0))
    old = float(sc.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    out = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, out).astype(np.float32)


def _get(meta: dict[str, Any], key: str, source: str, default: Any = ...) -> Any:
    if key in meta:
        return meta[key]
    if default is ...:
        raise ModelFileError(f"{source}: metadata {key!r} is missing")
    return default


def from_gguf(meta: dict[str, Any], tensor_names: set[str], source: str) -> ModelConfig:
    arch = _get(meta, "general.architecture", source)
    if arch not in ARCHITECTURES:
        raise ModelFileError(f"{source}: architecture {arch!r} is not supported "
                             f"({', '.join(ARCHITECTURES)})")
    p = f"{arch}."
    n_heads = int(_get(meta, p + "attention.head_count", source))
    dim = int(_get(meta, p + "embedding_length", source))
    head_dim = int(meta.get(p + "attention.key_length", meta.get(p + "rope.dimension_count",
                                                                  dim // max(n_heads, 1))))
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = int(meta.get(p + "vocab_size", len(tokens) if isinstance(tokens, list) else 0))
    scaling = None
    if meta.get(p + "rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": meta.get(p + "rope.scaling.factor", 1.0)}
    cfg = ModelConfig(
        arch=arch, n_layers=int(_get(meta, p + "block_count", source)), dim=dim,
        n_heads=n_heads, n_kv_heads=int(meta.get(p + "attention.head_count_kv", n_heads)),
        head_dim=head_dim, ffn_dim=int(_get(meta, p + "feed_forward_length", source)),
        vocab_size=vocab,
        norm_eps=float(meta.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta.get(p + "rope.freq_base", 10000.0)),
        # NOTE: llama.cpp's converter permutes llama Q/K rows for adjacent-pair rotation;
        # qwen2 keeps the split-halves (NEOX) layout.
        rope_neox=arch != "llama",
        context_length=int(meta.get(p + "context_length", 2048)),
        tied_embeddings="output.weight" not in tensor_names,
        qkv_bias="blk.0.attn_q.bias" in tensor_names, rope_scaling=scaling)
    cfg.validate(source)
    return cfg


def from_hf(config: dict[str, Any], source: str) -> ModelConfig:
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    arch = {"llama": "llama", "qwen2": "qwen2"}.get(str(model_type))
    if arch is None:
        raise ModelFileError(f"{source}: model_type {model_type!r} ({archs}) is not supported "
                             "(llama, qwen2)")
    if config.get("hidden_act", "silu") != "silu":
        raise ModelFileError(f"{source}: activation {config.get('hidden_act')!r} is not silu")
    n_heads = int(_get(config, "num_attention_heads", source))
    dim = int(_get(config, "hidden_size", source))
    rope = dict(config.get("rope_parameters") or {})
    scaling = config.get("rope_scaling") or None
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = rope
    theta = config.get("rope_theta") or rope.get("rope_theta") or 10000.0
    cfg = ModelConfig(
        arch=arch, n_layers=int(_get(config, "num_hidden_layers", source)), dim=dim,
        n_heads=n_heads, n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
        head_dim=int(config.get("head_dim") or dim // n_heads),
        ffn_dim=int(_get(config, "intermediate_size", source)),
        vocab_size=int(_get(config, "vocab_size", source)),
        norm_eps=float(config.get("rms_norm_eps") or 1e-6), rope_theta=float(theta),
        rope_neox=True, context_length=int(config.get("max_position_embeddings", 2048)),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2" or bool(config.get("attention_bias", False)),
        rope_scaling=scaling)
    cfg.validate(source)
    return cfg
