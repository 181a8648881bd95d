"""Fuzz tests, reference: the logits of a Llama-family model computed with numpy in float64 from
the tensors of a model file, so that a mutated file clops accepted can be checked against what
its tensors say (a weight read from the wrong place, or a size that disagrees with a tensor,
shows as a mismatch or a shape error here)."""

from __future__ import annotations

import numpy as np

from clops.llm.config import ModelConfig
from clops.llm.weights import WeightSource


def _rms_norm(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def _rotate(x: np.ndarray, angles: np.ndarray, neox: bool) -> np.ndarray:
    """Rotary embedding of x [T, heads, D] by angles [T, D/2]: value pairs (i, i + D/2) when
    ``neox``, else adjacent pairs (2i, 2i + 1)."""
    c, s = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    half = x.shape[-1] // 2
    a, b = (x[..., :half], x[..., half:]) if neox else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * c - b * s, a * s + b * c
    out = np.empty_like(x)
    if neox:
        out[..., :half], out[..., half:] = ra, rb
    else:
        out[..., 0::2], out[..., 1::2] = ra, rb
    return out


def reference_logits(source: WeightSource, cfg: ModelConfig, ids: list[int]) -> np.ndarray:
    """Logits [len(ids), vocab] of the model in ``source`` as ``cfg`` describes it (with the
    rotary factors the loaded model put in ``cfg``)."""

    def mat(name: str) -> np.ndarray:
        return source.matrix(name).dequantize().astype(np.float64)

    def vec(name: str) -> np.ndarray:
        return source.vector(name).astype(np.float64)

    H, KV, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    T = len(ids)
    x = mat("embed")[ids]
    angles = np.arange(T, dtype=np.float64)[:, None] * cfg.inv_freq().astype(np.float64)
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        h = _rms_norm(x, vec(p + "attn_norm"), cfg.norm_eps)
        q, k, v = (h @ mat(p + s).T for s in "qkv")
        if cfg.qkv_bias and source.has(p + "q_bias"):
            q, k, v = (t + vec(p + s + "_bias") for t, s in zip((q, k, v), "qkv"))
        q = _rotate(q.reshape(T, H, D), angles, cfg.rope_neox)
        k = _rotate(k.reshape(T, KV, D), angles, cfg.rope_neox)
        v = v.reshape(T, KV, D)
        group = H // KV
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(D) + causal
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", scores, v).reshape(T, H * D)
        x = x + attn @ mat(p + "o").T
        h = _rms_norm(x, vec(p + "ffn_norm"), cfg.norm_eps)
        gate, up = h @ mat(p + "gate").T, h @ mat(p + "up").T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ mat(p + "down").T
    x = _rms_norm(x, vec("out_norm"), cfg.norm_eps)
    out = mat("output") if source.has("output") else mat("embed")
    return x @ out.T
