"""Runtime, capability probes: questions about a device answered by trying something on it once
(building a kernel, running it), remembered per device for as long as the device lives. The
answers live here, not on the device object; ``CLDevice.probe`` holds the probes that are also
remembered on disk (fp16, inline PTX, builds)."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")

_LOCK = threading.RLock()


def per_device(fn: Callable[..., R]) -> Callable[..., R]:
    """Memoise ``fn(device, *args)`` per device (held weakly) and arguments.

    >>> @per_device
    ... def builds_mma(dev): ...
    """
    answers: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], R]] = \
        weakref.WeakKeyDictionary()

    @functools.wraps(fn)
    def probe(device: Any, *args: Any) -> R:
        with _LOCK:
            known = answers.get(device)
            if known is not None and args in known:
                return known[args]
        from . import plan  # (plan imports the runtime's other modules)

        with plan.paused():  # a probe is no part of a function clops.jit captures
            result = fn(device, *args)
        with _LOCK:
            answers.setdefault(device, {})[args] = result
        return result

    probe.forget = answers.clear  # type: ignore[attr-defined]
    return probe


# OpenCL C float functions whose n-wide vector form a CPU runtime may compute faster than the
# scalar form it calls per element; each is used on vectors only where ``vector_math_agrees``.
VECTOR_MATH_CANDIDATES = (
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
    "atanh", "expm1", "log", "log1p", "log2", "log10")


def _sweep() -> Any:
    """float32 inputs across every exponent, both signs, and the special values."""
    import numpy as np

    rng = np.random.default_rng(0)
    e = rng.uniform(-45, 37.5, 1 << 14)  # (times at most 10: below float32's 3.4e38)
    x = rng.choice([-1.0, 1.0], 1 << 14) * rng.uniform(1, 10, 1 << 14) * 10.0 ** e
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 1e-40, -1e-40, 1.0, -1.0,
               0.5, -0.5, 1e-4, 3.14159265, 1e4, 1e30, -1e30, 88.7, -88.7]
    x = np.concatenate([x, special]).astype(np.float32)
    return np.concatenate([x, np.zeros((-len(x)) % 16, np.float32)])


@per_device
def vector_math_agrees(device: Any, fn: str) -> bool:
    """Whether ``fn`` on float16 vectors gives this device's scalar ``fn`` values (within 2
    units in the last place, NaN for NaN, the same sign of zero) over ``_sweep()``; remembered
    on disk per device and driver. PoCL 3.1's vector sin, cos and tan return 0.008-0.014 for
    arguments below about 1e-3 (sin(1e-30) = 0.0099): they fail, the others pass."""
    if fn not in VECTOR_MATH_CANDIDATES:
        return False
    return bool(device.remembered(f"vector_math_{fn}", lambda: _vector_math_check(device, fn)))


def _vector_math_check(device: Any, fn: str) -> bool:
    import numpy as np

    src = (f"__kernel void v(__global float16 *o, __global const float16 *a) "
           f"{{ size_t g = get_global_id(0); o[g] = {fn}(a[g]); }}\n"
           f"__kernel void s(__global float *o, __global const float *a) "
           f"{{ size_t g = get_global_id(0); o[g] = {fn}(a[g]); }}\n")
    x = _sweep()
    try:
        prg = device.build(src)
        src_buf = device.alloc(x.nbytes)
        device.write(src_buf, x, blocking=True)
        got = {}
        for name, n in (("v", len(x) // 16), ("s", len(x))):
            out = device.alloc(x.nbytes)
            device.launch(getattr(prg, name), (n,), None, [out, src_buf], reads=[src_buf],
                          writes=[out], name=f"vector_math_{fn}")
            got[name] = np.empty_like(x)
            device.read(got[name], out, blocking=True)
    except Exception:  # noqa: BLE001 - a runtime that cannot run the check does not pass it
        return False
    v, s = got["v"], got["s"]
    nan = np.isnan(s)
    if not np.array_equal(np.isnan(v), nan):
        return False
    v, s = v[~nan].astype(np.float64), s[~nan].astype(np.float64)
    if not np.array_equal(np.signbit(v[s == 0]), np.signbit(s[s == 0])):
        return False
    with np.errstate(all="ignore"):  # infinities
        close = (v == s) | (np.abs(v - s) <= 2 * np.spacing(np.abs(s).astype(np.float32)))
    return bool(close.all())
