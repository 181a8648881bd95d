"""Array ops beside numpy, op by op: reductions (``sum``, ``mean``, ``max``, ``argmax``, ``var``,
``logsumexp``) over every axis (and all of them) of 1-D, 2-D and 3-D float32 arrays, a few
elementwise ops and fused chains, each at a small (L1-sized), a medium (2 MiB) and a large
(64 MiB) size, and ``sin``, ``cos`` and ``tan`` of 4M float32 (size ``4M``). Each row: clops'
wall time of a call including the read of its result to the host, numpy's time in the same
process, sampled in turns; the median of ``--repeat`` runs and the ratio (numpy / clops: above
1, clops is faster).

    python bench/bench_array_ops.py [--device SEL] [--repeat 7]
                                    [--sizes small,medium,large,4M]
                                    [--only sum,max] [--json OUT]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import clops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import interleaved_medians  # noqa: E402

# elements of each size class, and the 1-D, 2-D and 3-D shapes of that many elements
SHAPES = {
    "small": [(4096,), (64, 64), (16, 16, 16)],  # 16 KiB
    "medium": [(1 << 19,), (1024, 512), (64, 128, 64)],  # 2 MiB
    "large": [(1 << 24,), (4096, 4096), (256, 256, 256)],  # 64 MiB
}
FLAT = {"small": 4096, "medium": 1 << 19, "large": 1 << 24}
# size "4M": the trigonometric functions alone, of 4M float32 uniform in [-10, 10) (vector math
# on CPUs: the runtime's, or clops' own where the runtime's is wrong)
MATH_N = 1 << 22
MATH: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "sin": (clops.sin, np.sin), "cos": (clops.cos, np.cos), "tan": (clops.tan, np.tan)}


def _lse_clops(x: Any, axis: Any) -> Any:
    m = clops.max(x, axis=axis, keepdims=True)
    return clops.log(clops.sum(clops.exp(x - m), axis=axis, keepdims=True)) + m


def _lse_numpy(a: np.ndarray, axis: Any) -> np.ndarray:
    m = a.max(axis=axis, keepdims=True)
    return np.log(np.exp(a - m).sum(axis=axis, keepdims=True)) + m


# name -> (clops function of (x, axis), numpy function of (a, axis))
REDUCTIONS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "sum": (lambda x, ax: clops.sum(x, axis=ax), lambda a, ax: a.sum(axis=ax)),
    "mean": (lambda x, ax: clops.mean(x, axis=ax), lambda a, ax: a.mean(axis=ax)),
    "max": (lambda x, ax: clops.max(x, axis=ax), lambda a, ax: a.max(axis=ax)),
    "argmax": (lambda x, ax: clops.argmax(x, axis=ax), lambda a, ax: a.argmax(axis=ax)),
    "var": (lambda x, ax: clops.var(x, axis=ax), lambda a, ax: a.var(axis=ax)),
    "logsumexp": (_lse_clops, _lse_numpy),
}

# elementwise ops of one to three operands: (operands, clops function, numpy function)
ELEMENTWISE: dict[str, tuple[int, Callable[..., Any], Callable[..., Any]]] = {
    "add": (2, lambda a, b: a + b, lambda a, b: a + b),
    "exp": (1, clops.exp, np.exp),
    "sin": (1, clops.sin, np.sin),
    "clip": (1, lambda a: clops.clip(a, -0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5)),
    "where": (2, lambda a, b: clops.where(a > b, a, b), lambda a, b: np.where(a > b, a, b)),
    "astype float16": (1, lambda a: clops.astype(a, clops.float16),
                       lambda a: a.astype(np.float16)),
    # fused chains: one kernel in clops, a temporary per op in numpy
    "chain a*b+c*d-e*0.5": (
        3, lambda a, b, c: a * b + c * a - b * 0.5,
        lambda a, b, c: a * b + c * a - b * np.float32(0.5)),
    "chain sum((a-b)**2)": (2, lambda a, b: clops.sum((a - b) * (a - b)),
                            lambda a, b: ((a - b) * (a - b)).sum()),
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


def _row(op: str, shape: tuple[int, ...], axis: Any, size: str, t_clops: float,
         t_numpy: float, ok: bool) -> dict:
    r = {"op": op, "shape": list(shape), "axis": axis, "size": size,
         "clops_ms": t_clops * 1e3, "numpy_ms": t_numpy * 1e3,
         "ratio": t_numpy / t_clops, "matches_numpy": ok}
    ax = "all" if axis is None else str(axis)
    print(f"{op:22s} {str(tuple(shape)):18s} axis {ax:4s} {size:6s} "
          f"clops {r['clops_ms']:9.3f} ms  numpy {r['numpy_ms']:9.3f} ms  "
          f"{r['ratio']:6.2f}x{'' if ok else '  MISMATCH'}", flush=True)
    return r


def _math_rows(dev: Any, only: set[str], repeat: int, rng: np.random.Generator) -> list[dict]:
    a = rng.uniform(-10, 10, MATH_N).astype(np.float32)
    x = clops.asarray(a, device=dev).realize()
    rows = []
    for op, (cf, nf) in MATH.items():
        if only and op not in only:
            continue
        def run_m(cf=cf) -> np.ndarray:
            return np.asarray(cf(x))
        got, want = run_m(), nf(a)
        ok = np.allclose(got, want, rtol=1e-5, atol=1e-6)
        tc, tn = interleaved_medians([run_m, lambda nf=nf: nf(a)], repeat)
        rows.append(_row(op, (MATH_N,), None, "4M", tc, tn, ok))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="clops device selector (default: clops')")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--sizes", default="small,medium,large,4M")
    p.add_argument("--only", default="", help="comma-separated op names (default: all)")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args()
    dev = clops.device(args.device) if args.device else clops.device()
    sizes = [s for s in args.sizes.split(",") if s]
    only = {s for s in args.only.split(",") if s}
    rng = np.random.default_rng(0)
    print(f"device {dev.name} ({dev.selector}, {dev.platform_version}); {cpu_line()}; "
          f"numpy {np.__version__}; median of {args.repeat}")
    rows = []
    for size in sizes:
        if size == "4M":
            rows += _math_rows(dev, only, args.repeat, rng)
            continue
        for shape in SHAPES[size]:
            a = rng.standard_normal(shape).astype(np.float32)
            x = clops.asarray(a, device=dev).realize()
            for op, (cf, nf) in REDUCTIONS.items():
                if only and op not in only:
                    continue
                for axis in axes_of(len(shape)):
                    def run_c(cf=cf, axis=axis, x=x) -> np.ndarray:
                        return np.asarray(cf(x, axis))
                    got, want = run_c(), nf(a, axis)
                    ok = np.allclose(got, want, rtol=1e-3, atol=1e-3 * np.sqrt(
                        a.size / max(np.size(want), 1)))
                    tc, tn = interleaved_medians([run_c, lambda nf=nf, axis=axis, a=a: nf(a, axis)],
                                         args.repeat)
                    rows.append(_row(op, shape, axis, size, tc, tn, ok))
        n = FLAT[size]
        arrays = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
        tensors = [clops.asarray(v, device=dev).realize() for v in arrays]
        for op, (k, cf, nf) in ELEMENTWISE.items():
            if only and op not in only:
                continue
            def run_e(cf=cf, k=k, tensors=tensors) -> np.ndarray:
                return np.asarray(cf(*tensors[:k]))
            got, want = run_e(), nf(*arrays[:k])
            ok = np.allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             rtol=1e-3, atol=1e-2 * (np.sqrt(n) if np.ndim(want) == 0
                                                    else 1e-3))
            tc, tn = interleaved_medians([run_e, lambda nf=nf, k=k, arrays=arrays: nf(*arrays[:k])],
                                 args.repeat)
            rows.append(_row(op, (n,), None, size, tc, tn, ok))
    if args.json:
        out = {"benchmark": "array_ops", "device": dev.name, "selector": dev.selector,
               "platform": dev.platform_version, "cpu": cpu_line(), "numpy": np.__version__,
               "repeat": args.repeat, "date": datetime.date.today().isoformat(), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
