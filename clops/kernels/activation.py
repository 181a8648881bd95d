"""Kernels, activations: launches of ``activation.cl`` (scale and soft cap, the GLU, unary
activations, row and column softmax)."""

from __future__ import annotations

from ..runtime import CLDevice
from ..runtime.pool import Buffer
from .launch import Launch, f32, i32, kernel


def scale_cap(dev: CLDevice, y: Buffer, n: int, mul: float = 1.0, div: float = 1.0,
              cap: float = 0.0) -> Launch:
    """In place over n values: y * mul / div, soft-capped to (-cap, cap) when cap > 0."""
    knl = kernel(dev, "activation", "scale_cap")
    return Launch(knl, (n,), None, [y, f32(mul), f32(div), f32(cap)], [y], [y], "scale_cap")



ACTS = {"silu": 0, "gelu_tanh": 1, "gelu": 2}


def glu(dev: CLDevice, h: Buffer, gu: Buffer, *, m: int, f: int, act: str = "silu",
        limit: float = 0.0, alpha: float = 1.0) -> Launch:
    """h[i, :f] = act(gu[i, :f]) * gu[i, f:2f] for i < m (rows [gate | up]). ``limit`` > 0
    (gpt-oss's clamped SwiGLU, act "silu"): with g = min(gate, limit) and u = up clamped to
    [-limit, limit], h = (u + 1) * g * sigmoid(alpha * g)."""
    if limit > 0:
        if act != "silu":
            raise ValueError(f"glu: the clamped SwiGLU (limit {limit}) takes act 'silu', not "
                             f"{act!r}")
        knl = kernel(dev, "activation", "glu_clamp")
        return Launch(knl, (f, m), None, [h, gu, i32(f), f32(limit), f32(alpha)], [gu], [h],
                      "glu_clamp")
    knl = kernel(dev, "activation", "glu")
    return Launch(knl, (f, m), None, [h, gu, i32(f), i32(ACTS[act])], [gu], [h], "glu")


def unary(dev: CLDevice, y: Buffer, x: Buffer, x_off: int, *, n: int, act: str) -> Launch:
    """y[i] = act(x[x_off + i]) for i < n (``act`` a key of ACTS)."""
    knl = kernel(dev, "activation", "unary")
    return Launch(knl, (n,), None, [y, x, i32(x_off), i32(n), i32(ACTS[act])], [x], [y], act)


def softmax(dev: CLDevice, y: Buffer, x: Buffer, x_off: int, *, m: int, k: int) -> Launch:
    """Softmax of each of m contiguous rows of k values."""
    knl = kernel(dev, "activation", "softmax")
    return Launch(knl, (m,), None, [y, x, i32(x_off), i32(k)], [x], [y], "softmax")


def softmax_cols(dev: CLDevice, y: Buffer, x: Buffer, x_off: int, *, outer: int, k: int,
                 inner: int) -> Launch:
    """Softmax over the middle axis (k long) of contiguous ``(outer, k, inner)`` values."""
    knl = kernel(dev, "activation", "softmax_cols")
    return Launch(knl, (inner, outer), None, [y, x, i32(x_off), i32(k), i32(inner)], [x], [y],
                  "softmax_cols")
