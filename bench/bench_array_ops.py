"""Array ops beside a peer, op by op, each at a small (L1-sized, 16 KiB), a medium (2 MiB) and a
large (64 MiB) size of float32 input. Groups (``--groups``):

- ``reductions``: ``sum``, ``mean``, ``max``, ``argmax``, ``var``, ``logsumexp`` over every axis
  (and all of them) of 1-D, 2-D and 3-D arrays: (4096,), (64, 64), (16, 16, 16); (2^19,),
  (1024, 512), (64, 128, 64); (2^24,), (4096, 4096), (256, 256, 256).
- ``elementwise``: ``add``, ``sub``, ``mul``, ``div``, ``clip``, ``where``, casts of float32 to
  float16, int32 and float64 (where the device has float64), of n = 4096, 2^19, 2^24 elements.
- ``math``: every transcendental (``exp`` ... ``atanh``, ``atan2``, ``pow``, ``hypot``,
  ``logaddexp``) of n elements in its domain; size ``4M``: ``sin``, ``cos``, ``tan`` of 4M
  float32 uniform in [-10, 10).
- ``scan``: ``cumsum`` of the 1-D array and over each axis of the 2-D one.
- ``sort``: ``sort``, ``argsort`` (1-D, and rows of 1024), ``unique`` (1-D, about 1000 distinct
  values) of 4096, 2^19, 2^22 elements (n log n: the large one is 16 MiB).
- ``index``: ``take`` of n indices, rows of the 2-D array by an index array, a boolean mask.
- ``shape``: ``concat`` (axis 0 and 1) and ``stack`` of two halves of the 2-D array, a 2-D
  transpose and a 3-D ``permute_dims`` made contiguous, a reshape of a transpose.
- ``matmul``: square 64, 512, 2048; tall-skinny (256, 16) @ (16, 16), (8192, 64) @ (64, 64),
  (262144, 64) @ (64, 64); batched (4, 32, 32), (128, 64, 64), (1024, 128, 128) @ the same.
- ``softmax``: over the last axis of the 2-D and 3-D arrays and axis 0 of the 2-D one (numpy:
  max, subtract, exp, sum, divide).
- ``fft``: ``fft`` of complex64 (2048, 2^18, 2^23: 16 KiB, 2 MiB, 64 MiB), ``rfft`` of float32
  of twice as many, ``fft`` of rows of 512 complex64.
- ``chains``: fused chains of elementwise ops (one kernel in clops; numpy and CuPy run a pass
  per op).

Each row: clops' wall time of a call including the read of its result to the host, the peer's
time in the same process (numpy; or with ``--peer cupy``/``torch``, the peer's arrays on the GPU
and its wall time including the read of its result with ``cupy.asnumpy``/``.cpu()``), sampled
in turns; the median of ``--repeat`` runs and the ratio (peer / clops: above 1, clops is
faster). Each result is checked against numpy's on the host (``matches_numpy``). With a GPU
peer (or ``--device-time``) a row also gives device times: clops' kernels from
``clops.profile`` (the read left out) and the peer's from CUDA events around the op. Where
CuPy has no such op (``softmax``) the row's peer is PyTorch when it sees the GPU. Small sizes
show the fixed cost of a call (launch, read); the summary gives its median per group.

    python bench/bench_array_ops.py [--device SEL] [--repeat 7] [--peer numpy|cupy|torch]
                                    [--sizes small,medium,large,4M] [--groups matmul,fft]
                                    [--only sum,max] [--device-time] [--json OUT]
    python bench/bench_array_ops.py --table A.json B.json[+B2.json] [--summary]

``--table``: markdown of result files side by side, a column each (``+`` joins the parts of one
run, a later part's row replacing an earlier one's): every row at the medium and large sizes, or
with ``--summary`` each group's median ratio.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import clops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import interleaved_medians  # noqa: E402

GROUPS = ("reductions", "elementwise", "math", "scan", "sort", "index", "shape", "matmul",
          "softmax", "fft", "chains")
SIZES = ("small", "medium", "large")

# elements of each size class, and the 1-D, 2-D and 3-D shapes of that many elements
SHAPES = {
    "small": [(4096,), (64, 64), (16, 16, 16)],  # 16 KiB
    "medium": [(1 << 19,), (1024, 512), (64, 128, 64)],  # 2 MiB
    "large": [(1 << 24,), (4096, 4096), (256, 256, 256)],  # 64 MiB
}
FLAT = {"small": 4096, "medium": 1 << 19, "large": 1 << 24}
SORT_N = {"small": 4096, "medium": 1 << 19, "large": 1 << 22}
FFT_N = {"small": 2048, "medium": 1 << 18, "large": 1 << 23}  # complex64
# (name, shape of a, shape of b) for a @ b
MATMULS = {
    "small": [("square", (64, 64), (64, 64)), ("tall-skinny", (256, 16), (16, 16)),
              ("batched", (4, 32, 32), (4, 32, 32))],
    "medium": [("square", (512, 512), (512, 512)), ("tall-skinny", (8192, 64), (64, 64)),
               ("batched", (128, 64, 64), (128, 64, 64))],
    "large": [("square", (2048, 2048), (2048, 2048)), ("tall-skinny", (262144, 64), (64, 64)),
              ("batched", (1024, 128, 128), (1024, 128, 128))],
}
# size "4M": the trigonometric functions alone, of 4M float32 uniform in [-10, 10) (vector math
# on CPUs: the runtime's, or clops' own where the runtime's is wrong)
MATH_N = 1 << 22

Check = Callable[[np.ndarray, np.ndarray, list[np.ndarray]], bool]


@dataclass
class Case:
    """One row: clops' function of tensors, the peer's of (array module, arrays) written
    against numpy's API (numpy and CuPy alike), PyTorch's where that API differs, and the check
    of clops' result against numpy's."""
    group: str
    op: str
    size: str
    inputs: list[np.ndarray]
    clops_fn: Callable[..., Any]
    peer_fn: Callable[..., Any]
    check: Check
    axis: Any = None
    torch_fn: Callable[..., Any] | None = None
    reference: Callable[..., Any] | None = None  # numpy's result to check against, if not peer_fn's
    cupy_lacks: bool = False  # with --peer cupy, time PyTorch instead where it sees the GPU
    extra: dict[str, Any] = field(default_factory=dict)


def close(rtol: float, atol: float) -> Check:
    return lambda got, want, _: bool(np.allclose(np.asarray(got, want.dtype), want, rtol=rtol,
                                                 atol=atol))


def equal(got: np.ndarray, want: np.ndarray, _: list[np.ndarray]) -> bool:
    return got.shape == want.shape and bool(np.array_equal(got, want))


def sorts(got: np.ndarray, want: np.ndarray, inputs: list[np.ndarray]) -> bool:
    """``got`` is an argsort of the input (ties may come in any order)."""
    a = inputs[0]
    return got.shape == a.shape and bool(np.array_equal(
        np.take_along_axis(a, got.astype(np.int64), axis=-1), np.sort(a, axis=-1)))


def _dims(a: Any, ax: Any) -> Any:
    """PyTorch's ``dim`` for numpy's ``axis`` (None: every axis)."""
    return tuple(range(a.ndim)) if ax is None else ax


def _lse_clops(x: Any, axis: Any) -> Any:
    m = clops.max(x, axis=axis, keepdims=True)
    return clops.log(clops.sum(clops.exp(x - m), axis=axis, keepdims=True)) + m


def _lse(xp: Any, a: Any, axis: Any) -> Any:
    m = a.max(axis=axis, keepdims=True)
    return xp.log(xp.exp(a - m).sum(axis=axis, keepdims=True)) + m


# name -> (clops function of (x, axis), peer function of (xp, a, axis), PyTorch's of (t, a, axis))
REDUCTIONS: dict[str, tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]] = {
    "sum": (lambda x, ax: clops.sum(x, axis=ax), lambda xp, a, ax: a.sum(axis=ax),
            lambda t, a, ax: a.sum(dim=_dims(a, ax))),
    "mean": (lambda x, ax: clops.mean(x, axis=ax), lambda xp, a, ax: a.mean(axis=ax),
             lambda t, a, ax: a.mean(dim=_dims(a, ax))),
    "max": (lambda x, ax: clops.max(x, axis=ax), lambda xp, a, ax: a.max(axis=ax),
            lambda t, a, ax: a.amax(dim=_dims(a, ax))),
    "argmax": (lambda x, ax: clops.argmax(x, axis=ax), lambda xp, a, ax: a.argmax(axis=ax),
               lambda t, a, ax: a.argmax(dim=ax)),
    "var": (lambda x, ax: clops.var(x, axis=ax), lambda xp, a, ax: a.var(axis=ax),
            lambda t, a, ax: a.var(dim=_dims(a, ax), correction=0)),
    "logsumexp": (_lse_clops, _lse, lambda t, a, ax: t.logsumexp(a, dim=_dims(a, ax))),
}

# (operands, clops function, peer function of (xp, *arrays), PyTorch's or None)
ELEMENTWISE: dict[str, tuple[int, Callable[..., Any], Callable[..., Any], Any]] = {
    "add": (2, lambda a, b: a + b, lambda xp, a, b: a + b, None),
    "sub": (2, lambda a, b: a - b, lambda xp, a, b: a - b, None),
    "mul": (2, lambda a, b: a * b, lambda xp, a, b: a * b, None),
    "div": (2, lambda a, b: a / b, lambda xp, a, b: a / b, None),
    "clip": (1, lambda a: clops.clip(a, -0.5, 0.5), lambda xp, a: xp.clip(a, -0.5, 0.5), None),
    "where": (2, lambda a, b: clops.where(a > b, a, b), lambda xp, a, b: xp.where(a > b, a, b),
              None),
}
CASTS = ("float16", "int32", "float64")

# math: clops name -> (numpy's name, domain of the operands); PyTorch's names are numpy's but pow
MATH: dict[str, tuple[str, str]] = {
    "exp": ("exp", "normal"), "expm1": ("expm1", "normal"), "log": ("log", "positive"),
    "log1p": ("log1p", "positive"), "log2": ("log2", "positive"), "log10": ("log10", "positive"),
    "sqrt": ("sqrt", "positive"), "tanh": ("tanh", "normal"), "sinh": ("sinh", "normal"),
    "cosh": ("cosh", "normal"), "sin": ("sin", "normal"), "cos": ("cos", "normal"),
    "tan": ("tan", "normal"), "asin": ("arcsin", "unit"), "acos": ("arccos", "unit"),
    "atan": ("arctan", "wide"), "asinh": ("arcsinh", "wide"), "acosh": ("arccosh", "above1"),
    "atanh": ("arctanh", "unit"),
}
MATH2: dict[str, tuple[str, str, str]] = {
    "atan2": ("arctan2", "normal", "normal"), "pow": ("power", "positive", "normal"),
    "hypot": ("hypot", "normal", "normal"), "logaddexp": ("logaddexp", "normal", "normal"),
}
TORCH_NAMES = {"power": "pow"}
TRIG_4M = ("sin", "cos", "tan")


def domain(rng: np.random.Generator, kind: str, n: int) -> np.ndarray:
    if kind == "positive":
        a = rng.uniform(1e-3, 10, n)
    elif kind == "unit":
        a = rng.uniform(-0.999, 0.999, n)
    elif kind == "above1":
        a = rng.uniform(1, 10, n)
    elif kind == "wide":
        a = rng.uniform(-10, 10, n)
    else:
        a = rng.standard_normal(n)
    return a.astype(np.float32)


def _gelu(tanh: Any, a: Any) -> Any:
    return 0.5 * a * (1 + tanh(0.7978846 * (a + 0.044715 * a * a * a)))


# fused chains: one kernel in clops, a temporary per op in numpy and CuPy
CHAINS: dict[str, tuple[int, Callable[..., Any], Callable[..., Any], Any]] = {
    "chain a*b+c*d-e*0.5": (3, lambda a, b, c: a * b + c * a - b * 0.5,
                            lambda xp, a, b, c: a * b + c * a - b * np.float32(0.5), None),
    "chain sum((a-b)**2)": (2, lambda a, b: clops.sum((a - b) * (a - b)),
                            lambda xp, a, b: ((a - b) * (a - b)).sum(), None),
    "chain relu(a*b+c)": (3, lambda a, b, c: clops.maximum(a * b + c, 0.0),
                          lambda xp, a, b, c: xp.maximum(a * b + c, 0),
                          lambda t, a, b, c: (a * b + c).clamp_min(0)),
    "chain gelu tanh": (1, lambda a: _gelu(clops.tanh, a), lambda xp, a: _gelu(xp.tanh, a), None),
}


def _softmax(xp: Any, a: Any, axis: int) -> Any:
    e = xp.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# -- the cases of each group at one size ----------------------------------------------------------
def reduction_cases(size: str, rng: np.random.Generator, caps: Any) -> Iterator[Case]:
    for shape in SHAPES[size]:
        a = rng.standard_normal(shape).astype(np.float32)
        for op, (cf, pf, tf) in REDUCTIONS.items():
            for axis in axes_of(len(shape)):
                out = a.size if axis is None else a.shape[axis]
                yield Case("reductions", op, size, [a], lambda x, cf=cf, ax=axis: cf(x, ax),
                           lambda xp, a, pf=pf, ax=axis: pf(xp, a, ax),
                           close(1e-3, 1e-3 * np.sqrt(out)), axis=axis,
                           torch_fn=lambda t, a, tf=tf, ax=axis: tf(t, a, ax))


def _flat(rng: np.random.Generator, n: int, k: int) -> list[np.ndarray]:
    return [rng.standard_normal(n).astype(np.float32) for _ in range(k)]


def elementwise_cases(size: str, rng: np.random.Generator, caps: Any) -> Iterator[Case]:
    n = FLAT[size]
    arrays = _flat(rng, n, 2)
    for op, (k, cf, pf, tf) in ELEMENTWISE.items():
        yield Case("elementwise", op, size, arrays[:k], cf, pf, close(1e-5, 1e-6), torch_fn=tf)
    scaled = [arrays[0] * np.float32(100)]
    for to in CASTS:
        if to == "float64" and not caps.fp64:
            continue
        yield Case("elementwise", f"astype {to}", size, scaled,
                   lambda x, to=to: clops.astype(x, getattr(clops, to)),
                   lambda xp, a, to=to: a.astype(getattr(xp, to)), equal,
                   torch_fn=lambda t, a, to=to: a.to(getattr(t, to)))


def math_cases(size: str, rng: np.random.Generator, caps: Any) -> Iterator[Case]:
    if size == "4M":
        a = rng.uniform(-10, 10, MATH_N).astype(np.float32)
        for op in TRIG_4M:
            yield Case("math", op, size, [a], getattr(clops, op),
                       lambda xp, a, op=op: getattr(xp, op)(a), close(1e-5, 1e-6))
        return
    n = FLAT[size]
    inputs = {kind: domain(rng, kind, n) for kind in ("normal", "positive", "unit", "above1",
                                                      "wide")}
    second = rng.standard_normal(n).astype(np.float32)
    for op, (name, kind) in MATH.items():
        yield Case("math", op, size, [inputs[kind]], getattr(clops, op),
                   lambda xp, a, name=name: getattr(xp, name)(a), close(1e-5, 1e-6),
                   torch_fn=lambda t, a, name=name: getattr(t, name)(a))
    for op, (name, k1, _) in MATH2.items():
        tname = TORCH_NAMES.get(name, name)
        yield Case("math", op, size, [inputs[k1], second], getattr(clops, op),
                   lambda xp, a, b, name=name: getattr(xp, name)(a, b), close(1e-5, 1e-6),
                   torch_fn=lambda t, a, b, tname=tname: getattr(t, tname)(a, b))


def scan_cases(size: str, rng: np.random.Generator, caps: Any) -> Iterator[Case]:
    for shape in SHAPES[size][:2]:
        a = rng.standard_normal(shape).astype(np.float32)
        for axis in range(len(shape)):
            # checked against a float64 sum: float32 ones drift by ~1e-7 per element summed
            yield Case("scan", "cumsum", size, [a],
                       lambda x, ax=axis: clops.cumulative_sum(x, axis=ax),
                       lambda xp, a, ax=axis: xp.cumsum(a, axis=ax),
                       close(1e-4, 1e-6 * shape[axis]), axis=axis,
                       torch_fn=lambda t, a, ax=axis: t.cumsum(a, dim=ax),
                       reference=lambda a, ax=axis: np.cumsum(a.astype(np.float64), axis=ax))


def sort_cases(size: str, rng: np.random.Generator, caps: Any) -> Iterator[Case]:
    n = SORT_N[size]
    flat = rng.standard_normal(n).astype(np.float32)
    rows = flat.reshape(-1, 1024)
    for a in (flat, rows):
        yield Case("sort", "sort", size, [a], lambda x: clops.sort(x, axis=-1),
                   lambda xp, a: xp.sort(a, axis=-1), equal, axis=-1,
                   torch_fn=lambda t, a: t.sort(a, dim=-1).values)
        yield Case("sort", "argsort", size, [a], lambda x: clops.argsort(x, axis=-1),
                   lambda xp, a: xp.argsort(a, axis=-1), sorts, axis=-1,
                   torch_fn=lambda t, a: t.argsort(a, dim=-1))
    rounded = np.round(flat * 100).astype(np.float32)  # about a thousand distinct values
    yield Case("sort", "unique", size, [rounded], clops.unique_values, lambda xp, a: xp.unique(a),
               equal, torch_fn=lambda t, a: t.unique(a))


def index_cases(size: str, rng: np.random.Generator, caps: Any) -> Iterator[Case]:
    n = FLAT[size]
    flat = rng.standard_normal(n).astype(np.float32)
    idx = np.asarray(rng.integers(0, n, size=n), np.int64)
    yield Case("index", "take", size, [flat, idx], lambda x, i: clops.take(x, i, axis=0),
               lambda xp, a, i: xp.take(a, i), equal, torch_fn=lambda t, a, i: t.take(a, i))
    a2 = rng.standard_normal(SHAPES[size][1]).astype(np.float32)
    rows = np.asarray(rng.integers(0, a2.shape[0], size=a2.shape[0]), np.int64)
    yield Case("index", "index rows", size, [a2, rows], lambda x, i: x[i],
               lambda xp, a, i: a[i], equal)
    yield Case("index", "mask", size, [flat, flat > 0], lambda x, m: x[m],
               lambda xp, a, m: a[m], equal)


def shape_cases(size: str, rng: np.random.Generator, caps: Any) -> Iterator[Case]:
    r, c = SHAPES[size][1]
    halves = [rng.standard_normal((r // 2, c)).astype(np.float32) for _ in range(2)]
    for axis in (0, 1):
        yield Case("shape", "concat", size, halves,
                   lambda x, y, ax=axis: clops.concat([x, y], axis=ax),
                   lambda xp, a, b, ax=axis: xp.concatenate([a, b], axis=ax), equal, axis=axis,
                   torch_fn=lambda t, a, b, ax=axis: t.cat([a, b], dim=ax))
    yield Case("shape", "stack", size, halves, lambda x, y: clops.stack([x, y], axis=0),
               lambda xp, a, b: xp.stack([a, b], axis=0), equal, axis=0,
               torch_fn=lambda t, a, b: t.stack([a, b], dim=0))
    a2 = rng.standard_normal((r, c)).astype(np.float32)
    a3 = rng.standard_normal(SHAPES[size][2]).astype(np.float32)
    yield Case("shape", "transpose", size, [a2],
               lambda x: clops.permute_dims(x, (1, 0)).contiguous(),
               lambda xp, a: xp.ascontiguousarray(a.T), equal,
               torch_fn=lambda t, a: a.T.contiguous())
    yield Case("shape", "permute (2,0,1)", size, [a3],
               lambda x: clops.permute_dims(x, (2, 0, 1)).contiguous(),
               lambda xp, a: xp.ascontiguousarray(a.transpose(2, 0, 1)), equal,
               torch_fn=lambda t, a: a.permute(2, 0, 1).contiguous())
    yield Case("shape", "reshape of transpose", size, [a2],
               lambda x: clops.reshape(clops.permute_dims(x, (1, 0)), (-1,)),
               lambda xp, a: a.T.reshape(-1), equal)


def matmul_cases(size: str, rng: np.random.Generator, caps: Any) -> Iterator[Case]:
    for name, sa, sb in MATMULS[size]:
        a = rng.standard_normal(sa).astype(np.float32)
        b = rng.standard_normal(sb).astype(np.float32)
        k = sa[-1]
        yield Case("matmul", f"matmul {name}", size, [a, b], clops.matmul,
                   lambda xp, a, b: xp.matmul(a, b), close(1e-3, 1e-3 * np.sqrt(k)),
                   extra={"shapes": [list(sa), list(sb)]})


def softmax_cases(size: str, rng: np.random.Generator, caps: Any) -> Iterator[Case]:
    from clops.nn import softmax

    for shape, axis in ((SHAPES[size][1], -1), (SHAPES[size][1], 0), (SHAPES[size][2], -1)):
        a = rng.standard_normal(shape).astype(np.float32)
        yield Case("softmax", "softmax", size, [a], lambda x, ax=axis: softmax(x, axis=ax),
                   lambda xp, a, ax=axis: _softmax(xp, a, ax), close(1e-4, 1e-6), axis=axis,
                   torch_fn=lambda t, a, ax=axis: t.softmax(a, dim=ax), cupy_lacks=True)


def fft_cases(size: str, rng: np.random.Generator, caps: Any) -> Iterator[Case]:
    from clops import fft

    n = FFT_N[size]
    c = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    r = rng.standard_normal(2 * n).astype(np.float32)

    def tol(m: int) -> Check:
        return close(1e-3, 1e-5 * np.sqrt(m) * np.log2(m))

    yield Case("fft", "fft", size, [c], lambda x: fft.fft(x),
               lambda xp, a: xp.fft.fft(a), tol(n))
    yield Case("fft", "rfft", size, [r], lambda x: fft.rfft(x),
               lambda xp, a: xp.fft.rfft(a), tol(2 * n))
    yield Case("fft", "fft rows", size, [c.reshape(-1, 512)], lambda x: fft.fft(x),
               lambda xp, a: xp.fft.fft(a), tol(512), axis=-1)


def chain_cases(size: str, rng: np.random.Generator, caps: Any) -> Iterator[Case]:
    n = FLAT[size]
    arrays = _flat(rng, n, 3)
    for op, (k, cf, pf, tf) in CHAINS.items():
        atol = 1e-2 * np.sqrt(n) if op.startswith("chain sum") else 1e-5
        yield Case("chains", op, size, arrays[:k], cf, pf, close(1e-3, atol), torch_fn=tf)


CASES: dict[str, Callable[[str, np.random.Generator, Any], Iterator[Case]]] = {
    "reductions": reduction_cases, "elementwise": elementwise_cases, "math": math_cases,
    "scan": scan_cases, "sort": sort_cases, "index": index_cases, "shape": shape_cases,
    "matmul": matmul_cases, "softmax": softmax_cases, "fft": fft_cases, "chains": chain_cases,
}


def axes_of(ndim: int) -> list[Any]:
    """None (every axis) and each single axis (a 1-D array: None alone)."""
    return [None] + (list(range(ndim)) if ndim > 1 else [])


def cpu_line() -> str:
    """The processor and its widest vector instructions (CPU figures depend on them)."""
    name, flags = platform.processor() or "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not name:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    isa = [x for x in ("avx512f", "avx512_vnni", "avx2", "fma") if x in flags]
    return f"{name}, {os.cpu_count()} cores, {'/'.join(isa) or 'no AVX'}"


# -- the peer -------------------------------------------------------------------------------------
class Peer:
    """The library each row is timed beside: numpy on the host, or CuPy or PyTorch (on the GPU
    where PyTorch sees one), imported only when asked for."""

    def __init__(self, name: str) -> None:
        self.name, self.gpu, self.where = name, False, "host"
        self.xp: Any = np
        if name == "cupy":
            import cupy

            self.xp, self.gpu = cupy, True
            self.where = cupy.cuda.runtime.getDeviceProperties(
                cupy.cuda.Device().id)["name"].decode()
        elif name == "torch":
            import torch

            self.xp, self.gpu = torch, torch.cuda.is_available()
            self.where = torch.cuda.get_device_name() if self.gpu else "host"
        self.version = self.xp.__version__
        self._fallback: Peer | None | bool = False  # PyTorch for what CuPy lacks; False: unasked

    def fallback(self) -> Peer | None:
        """PyTorch on the GPU, for the ops CuPy has no kernel of its own for (None: no such)."""
        if self._fallback is False:
            try:
                t = Peer("torch")
                self._fallback = t if t.gpu else None
            except ImportError:
                self._fallback = None
        return self._fallback  # type: ignore[return-value]

    def put(self, a: np.ndarray) -> Any:
        if self.name == "cupy":
            return self.xp.asarray(a)
        if self.name == "torch":
            return self.xp.from_numpy(np.ascontiguousarray(a)).to("cuda" if self.gpu else "cpu")
        return a

    def get(self, r: Any) -> np.ndarray:
        if self.name == "cupy":
            return self.xp.asnumpy(r)
        if self.name == "torch":
            return r.cpu().numpy()
        return np.asarray(r)

    def call(self, case: Case, arrays: list[Any]) -> Any:
        if self.name == "torch" and case.torch_fn is not None:
            return case.torch_fn(self.xp, *arrays)
        return case.peer_fn(self.xp, *arrays)

    def device_ms(self, fn: Callable[[], object], repeat: int) -> float | None:
        """Median ms of ``fn`` on the GPU's current stream by CUDA events (None: no GPU)."""
        if not self.gpu:
            return None
        cuda = self.xp.cuda
        times = []
        for _ in range(repeat):
            if self.name == "cupy":
                s, e = cuda.Event(), cuda.Event()
            else:
                s, e = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(cuda.get_elapsed_time(s, e) if self.name == "cupy"
                         else s.elapsed_time(e))
        return statistics.median(times)


def clops_device_ms(fn: Callable[[], object], repeat: int) -> tuple[float | None, int]:
    """(Median ms of the kernels one call of ``fn`` runs, by ``clops.profile``; kernels per
    call). Copies (the read of the result) are left out."""
    spans, counts = [], []
    with clops.profile() as prof:
        for _ in range(repeat):
            n0 = len(prof.records)
            fn()
            ks = [r for r in prof.records[n0:] if r.kind in ("kernel", "provider")]
            spans.append(sum(r.duration_ns for r in ks) / 1e6)
            counts.append(len(ks))
    return (statistics.median(spans) if spans else None), int(statistics.median(counts))


# -- measuring ------------------------------------------------------------------------------------
def _ms(t: float | None) -> float | None:
    return None if t is None else t * 1e3


def measure(case: Case, dev: Any, peer: Peer, repeat: int, device_time: bool,
            uploads: dict[tuple[str, int], tuple[np.ndarray, Any]]) -> dict:
    if case.cupy_lacks and peer.name == "cupy":
        peer = peer.fallback() or peer
    xs: list[Any] = []
    ps: list[Any] = []
    for a in case.inputs:  # each array goes to the devices once, kept (with it) in uploads
        for who, out, put in (("clops", xs, lambda a: clops.asarray(a, device=dev).realize()),
                              (peer.name, ps, peer.put)):
            if (who, id(a)) not in uploads:
                uploads[(who, id(a))] = (a, put(a))
            out.append(uploads[(who, id(a))][1])

    def run_c() -> np.ndarray:
        return np.asarray(case.clops_fn(*xs))

    def run_p() -> np.ndarray:
        return peer.get(peer.call(case, ps))

    error = peer_error = None
    ok: bool | None = None
    want = (case.reference or (lambda *a: case.peer_fn(np, *a)))(*case.inputs)
    try:
        got = run_c()
        ok = case.check(got, np.asarray(want), case.inputs)
    except Exception as e:  # noqa: BLE001 - an op clops refuses is a row, not the end of the run
        error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    try:
        run_p()
    except Exception as e:  # noqa: BLE001
        peer_error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    fns: list[Callable[[], object]] = [run_c] if error is None else []
    fns += [run_p] if peer_error is None else []
    times = iter(interleaved_medians(fns, repeat) if fns else [])
    tc = next(times) if error is None else None
    tp = next(times) if peer_error is None else None
    r: dict[str, Any] = {
        "op": case.op, "shape": list(case.inputs[0].shape), "axis": case.axis,
        "size": case.size, "clops_ms": _ms(tc)}
    if peer.name == "numpy":
        r["numpy_ms"] = _ms(tp)
    r.update(ratio=tp / tc if tc and tp else None, matches_numpy=ok, group=case.group,
             dtype=str(case.inputs[0].dtype), peer=peer.name, peer_ms=_ms(tp), **case.extra)
    if device_time:
        if error is None:
            r["clops_device_ms"], r["clops_kernels"] = clops_device_ms(run_c, repeat)
        if peer_error is None:
            d = peer.device_ms(lambda: peer.call(case, ps), repeat)
            if d is not None:
                r["peer_device_ms"] = d
    if error:
        r["error"] = error
    if peer_error:
        r["peer_error"] = peer_error
    print_row(r)
    return r


def print_row(r: dict) -> None:
    ax = "-" if r["axis"] is None and r["group"] not in ("reductions",) else \
        "all" if r["axis"] is None else str(r["axis"])

    def ms(v: float | None) -> str:
        return f"{v:9.3f} ms" if v is not None else "    error   "

    line = (f"{r['op']:22s} {str(tuple(r['shape'])):18s} axis {ax:4s} {r['size']:6s} "
            f"clops {ms(r['clops_ms'])}  {r['peer']} {ms(r['peer_ms'])}  ")
    line += f"{r['ratio']:6.2f}x" if r["ratio"] is not None else "     -"
    if "clops_device_ms" in r or "peer_device_ms" in r:
        dc, dp = r.get("clops_device_ms"), r.get("peer_device_ms")
        line += (f"  device {'-' if dc is None else f'{dc:.3f}'} / "
                 f"{'-' if dp is None else f'{dp:.3f}'} ms ({r.get('clops_kernels', '-')} k)")
    if r["matches_numpy"] is False:
        line += "  MISMATCH"
    if "error" in r:
        line += f"  ERROR {r['error']}"
    if "peer_error" in r:
        line += f"  PEER ERROR {r['peer_error']}"
    print(line, flush=True)


def summary(rows: list[dict]) -> None:
    """Rows under 1.0x at medium and large sizes, per group; the fixed cost per call (median wall
    ms at the small size); errors and mismatches."""
    print("\nunder 1.0x at medium and large sizes, by group:")
    for g in GROUPS:
        mine = [r for r in rows if r["group"] == g and r["size"] in ("medium", "large", "4M")]
        if not mine:
            continue
        slow = [r for r in mine if r["ratio"] is not None and r["ratio"] < 1.0]
        print(f"  {g:12s} {len(slow):3d} of {len(mine):3d}" + (": " if slow else ""), end="")
        print(", ".join(f"{r['op']} {tuple(r['shape'])}"
                        + (f" ax {r['axis']}" if r["axis"] is not None else "")
                        + f" {r['size']} {r['ratio']:.2f}x" for r in slow))
    small = [r for r in rows if r["size"] == "small"]
    if small:
        print("fixed cost per call (median wall ms at the small size), clops / peer:")
        for g in GROUPS:
            c = [r["clops_ms"] for r in small if r["group"] == g and r["clops_ms"] is not None]
            p = [r["peer_ms"] for r in small if r["group"] == g and r["peer_ms"] is not None]
            if c or p:
                print(f"  {g:12s} {statistics.median(c) if c else float('nan'):8.3f} / "
                      f"{statistics.median(p) if p else float('nan'):8.3f} ms")
    bad = [r for r in rows if r["matches_numpy"] is False or "error" in r or "peer_error" in r]
    if bad:
        print("errors and mismatches:")
        for r in bad:
            what = r.get("error") or r.get("peer_error") or "MISMATCH"
            print(f"  {r['op']} {tuple(r['shape'])} {r['dtype']} axis {r['axis']} {r['size']}: "
                  f"{what}")


def _key(r: dict) -> tuple[Any, ...]:
    return (r.get("group", ""), r["op"], tuple(r["shape"]), str(r["axis"]), r["size"])


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if r.get("error"):
        return "error"
    ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
    peer = r.get("peer_ms")
    return f"{r['clops_ms']:.3g} / {'-' if peer is None else f'{peer:.3g}'} ms ({ratio})"


def tables(paths: list[str], summary_only: bool) -> None:
    """Markdown tables of result files side by side (a column each): every row at the medium
    and large sizes (clops / peer wall ms, ratio), or, ``summary_only``, each group's median
    ratio and rows at 1.0x or better, and the fixed cost per call at the small size."""
    runs = []
    for column in paths:  # "a.json+b.json": parts of one run, one column
        parts = []
        for path in column.split("+"):
            with open(path) as f:
                parts.append(json.load(f))
        rows = {_key(r): r for d in parts for r in d["rows"]}  # a later part's row wins
        runs.append({**parts[0], "rows": list(rows.values())})
    heads = [f"{d['device']} ({' '.join(d['platform'].split()[:4])}), "
             f"{d.get('peer', 'numpy').split()[0]} beside" for d in runs]
    by = [{_key(r): r for r in d["rows"]} for d in runs]
    if summary_only:
        print("| group | " + " | ".join(f"{h}: median ratio (rows >= 1.0x), medium; large"
                                         for h in heads) + " |")
        print("|---|" + "---|" * len(runs))
        for g in GROUPS:
            cells = []
            for d in runs:
                parts = []
                for size in ("medium", "large"):
                    mine = [r for r in d["rows"] if r.get("group") == g and r["size"] == size]
                    rs = [r["ratio"] for r in mine if r["ratio"] is not None]
                    part = f"{statistics.median(rs):.2f}x ({sum(x >= 1 for x in rs)}/" \
                        f"{len(rs)})" if rs else "-"
                    dev = [r["peer_device_ms"] / r["clops_device_ms"] for r in mine
                           if r.get("clops_device_ms") and r.get("peer_device_ms")]
                    if dev:  # kernels alone (the peer's device time over clops')
                        part += f", device {statistics.median(dev):.2f}x"
                    parts.append(part)
                cells.append("; ".join(parts))
            if any(c != "-; -" for c in cells):
                print(f"| {g} | " + " | ".join(cells) + " |")
        cells = []
        for d in runs:
            small = [r for r in d["rows"] if r["size"] == "small" and r["clops_ms"] is not None
                     and r.get("peer_ms") is not None]
            cells.append(f"{statistics.median(r['clops_ms'] for r in small):.3f} / "
                         f"{statistics.median(r['peer_ms'] for r in small):.3f} ms"
                         if small else "-")
        print("| fixed cost a call (small size, median) | " + " | ".join(cells) + " |")
        return
    keys = []
    for b in by:
        keys += [k for k in b if k not in keys and k[4] in ("medium", "large")]
    print("| op | shape | axis | size | " + " | ".join(heads) + " |")
    print("|---|---|---|---|" + "---|" * len(runs))
    for k in keys:
        _, op, shape, axis, size = k
        print(f"| {op} | {'x'.join(map(str, shape))} | {'all' if axis == 'None' else axis} | "
              f"{size} | " + " | ".join(_cell(b.get(k)) for b in by) + " |")


def main() -> None:
    if sys.argv[1:2] == ["--table"]:
        args = sys.argv[2:]
        tables([a for a in args if a != "--summary"], "--summary" in args)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="clops device selector (default: clops')")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--sizes", default="small,medium,large,4M")
    p.add_argument("--groups", default=",".join(GROUPS),
                   help=f"comma-separated groups (default: all): {','.join(GROUPS)}")
    p.add_argument("--only", default="",
                   help="comma-separated op names, or their first word (default: all)")
    p.add_argument("--peer", default="numpy", choices=("numpy", "cupy", "torch"))
    p.add_argument("--device-time", action="store_true",
                   help="device times too (on by default with a peer on the GPU)")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args()
    dev = clops.device(args.device) if args.device else clops.device()
    sizes = [s for s in args.sizes.split(",") if s]
    groups = [g for g in args.groups.split(",") if g]
    for g in groups:
        if g not in CASES:
            p.error(f"unknown group {g!r}; groups: {','.join(GROUPS)}")
    for s in sizes:
        if s not in (*SIZES, "4M"):
            p.error(f"unknown size {s!r}; sizes: small,medium,large,4M")
    only = {s for s in args.only.split(",") if s}
    peer = Peer(args.peer)
    device_time = args.device_time or peer.gpu
    rng = np.random.default_rng(0)
    print(f"device {dev.name} ({dev.selector}, {dev.platform_version}); {cpu_line()}; "
          f"numpy {np.__version__}; peer {peer.name} {peer.version} on {peer.where}; "
          f"median of {args.repeat}")
    load_before = os.getloadavg()
    rows = []
    for size in sizes:
        for g in groups:
            if size == "4M" and g != "math":
                continue
            uploads: dict[tuple[str, int], tuple[np.ndarray, Any]] = {}
            for case in CASES[g](size, rng, dev.caps):
                if only and case.op not in only and case.op.split()[0] not in only:
                    continue
                rows.append(measure(case, dev, peer, args.repeat, device_time, uploads))
    summary(rows)
    if args.json:
        out = {"benchmark": "array_ops", "device": dev.name, "selector": dev.selector,
               "platform": dev.platform_version, "cpu": cpu_line(), "numpy": np.__version__,
               "peer": f"{peer.name} {peer.version}", "peer_device": peer.where,
               "repeat": args.repeat, "date": datetime.date.today().isoformat(),
               # the machine's load averages (1, 5, 15 min) at the start and the end: others'
               # work on a shared CPU slows clops' threads and numpy's one unequally
               "load": [list(load_before), list(os.getloadavg())], "rows": rows}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
