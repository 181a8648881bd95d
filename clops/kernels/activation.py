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


def softmax(dev: CLDevice, y: Buffer, x: Buffer, x_off: int, *, m: int, k: int,
            vectors: bool = False) -> Launch:
    """Softmax of each of m contiguous rows of k values. ``vectors``: each row in float16
    vectors (``softmax_v16``; CPUs whose vector exp agrees with the scalar one)."""
    name = "softmax_v16" if vectors else "softmax"
    knl = kernel(dev, "activation", name)
    return Launch(knl, (m,), None, [y, x, i32(x_off), i32(k)], [x], [y], name)


def softmax_cols(dev: CLDevice, y: Buffer, x: Buffer, x_off: int, *, outer: int, k: int,
                 inner: int, vectors: bool = False) -> Launch:
    """Softmax over the middle axis (k long) of contiguous ``(outer, k, inner)`` values.
    ``vectors``: adjacent columns a work-item as float16 vectors (``softmax_cols_v16``: 64
    where inner is a multiple of 64, else 16; inner a multiple of 16)."""
    if not vectors:
        knl = kernel(dev, "activation", "softmax_cols")
        return Launch(knl, (inner, outer), None, [y, x, i32(x_off), i32(k), i32(inner)], [x],
                      [y], "softmax_cols")
    if inner % 16:
        raise ValueError(f"softmax_cols: vectors of 16 columns need inner a multiple of 16, "
                         f"not {inner}")
    # PERF (2-core EPYC with AVX-512, 4096x4096 over axis 0, kernel ms): strips of 16 columns
    # 20.9 on Intel's runtime and 19.5 on PoCL 3.1, of 32 10.6 / 10.8, of 64 7.1 / 9.4, of 128
    # 6.7 / 17.0
    nv = 4 if inner % 64 == 0 else 1
    knl = kernel(dev, "activation", "softmax_cols_v16", **({"NV": nv} if nv > 1 else {}))
    return Launch(knl, (inner // (16 * nv), outer), None, [y, x, i32(x_off), i32(k), i32(inner)],
                  [x], [y], "softmax_cols_v16")
