"""nn, rotary embedding: the inverse frequencies of a head's rotated dimensions, with llama3,
linear and YaRN scaling as in a Hugging Face config (``nn.functional.rope`` and ``llm``'s
models both take them from here)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

ROPE_TYPES = ("default", "llama3", "linear", "yarn")


class UnsupportedRopeError(ValueError):
    """A rope scaling type clops does not implement."""


def inv_freq(rotary: int, theta: float, scaling: dict[str, Any] | None = None,
             context_length: int = 1, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """The rotary inverse frequencies [rotary/2] of base ``theta``, float32 as the reference
    computes them, with ``scaling`` (``{"rope_type": "llama3", "factor": 8.0, ...}``; YaRN's
    original context defaults to ``context_length``), divided by ``freq_factors`` if given.

    >>> inv_freq(4, 10000.0)
    array([1.  , 0.01], dtype=float32)
    """
    d = rotary
    exps = np.arange(0, d, 2, dtype=np.float32) / np.float32(d)
    inv = (np.float32(1.0) / (np.float32(theta) ** exps)).astype(np.float32)
    sc = scaling or {}
    kind = sc.get("rope_type", sc.get("type"))
    if kind == "yarn":
        inv = _yarn(inv, d, theta, sc, context_length)
    elif kind == "llama3":
        inv = _llama3_scaling(inv, sc)
    elif kind == "linear":
        factor = float(sc.get("factor", 1.0))
        if not factor > 0:
            raise ValueError(f"linear scaling needs a factor > 0, not {factor!r}")
        inv = (inv / np.float32(factor)).astype(np.float32)
    elif kind not in (None, "default"):
        raise UnsupportedRopeError(f"rope scaling {kind!r} is not supported "
                                   f"({', '.join(ROPE_TYPES)})")
    if freq_factors is not None:
        inv = (inv / freq_factors.astype(np.float32)).astype(np.float32)
    return inv


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


def _yarn(inv: np.ndarray, d: int, base: float, sc: dict[str, Any], ctx: int) -> np.ndarray:
    """YaRN: interpolated frequencies below the low-frequency bound, extrapolated above the
    high one, a linear ramp between (as transformers' ``_compute_yarn_parameters``)."""
    factor = float(sc.get("factor", 1.0))
    old = float(sc.get("original_max_position_embeddings") or ctx)
    fast, slow = float(sc.get("beta_fast", 32.0)), float(sc.get("beta_slow", 1.0))
    if not (factor >= 1 and old > 0 and fast > slow > 0):
        raise ValueError(f"yarn scaling needs factor >= 1, original_max_position_embeddings "
                         f"> 0 and beta_fast > beta_slow > 0 (factor {factor}, original {old},"
                         f" beta_fast {fast}, beta_slow {slow})")

    def dim_of(rot: float) -> float:
        return (d * math.log(old / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = dim_of(fast), dim_of(slow)
    if sc.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    interp = inv / np.float32(factor)
    return (interp * (1 - extrapolation) + inv * extrapolation).astype(np.float32)
