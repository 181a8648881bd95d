"""Runtime, capability probes: questions about a device answered by trying something on it once
(building a kernel, running it). ``per_device`` remembers an answer for as long as the device
lives; ``run_stored`` and ``remembered`` keep theirs on disk per device and driver (fp16,
inline PTX, builds: ``CLDevice.probe``). The answers live here, not on the device object."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyopencl as cl

from . import cachefiles
from .capture import paused
from .program import QUIET_BUILDS

if TYPE_CHECKING:
    from .protocols import Device

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
        with paused():  # a probe is no part of a function clops.jit captures
            result = fn(device, *args)
        with _LOCK:
            answers.setdefault(device, {})[args] = result
        return result

    probe.forget = answers.clear  # type: ignore[attr-defined]
    return probe


# OpenCL C float functions whose n-wide vector form a CPU runtime may compute faster than the
# scalar form it calls per element; each is used on vectors only where ``vector_math_agrees``.
VECTOR_MATH_CANDIDATES = (
    "exp", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
    "atanh", "expm1", "log", "log1p", "log2", "log10", "atan2", "pow", "hypot")
# (the candidates of two operands)
BINARY_MATH = frozenset({"atan2", "pow", "hypot"})


def _sweep() -> Any:
    """float32 inputs across every exponent, both signs, and the special values."""
    rng = np.random.default_rng(0)
    e = rng.uniform(-45, 37.5, 1 << 14)  # (times at most 10: below float32's 3.4e38)
    x = rng.choice([-1.0, 1.0], 1 << 14) * rng.uniform(1, 10, 1 << 14) * 10.0 ** e
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 1e-40, -1e-40, 1.0, -1.0,
               0.5, -0.5, 1e-4, 3.14159265, 1e4, 1e30, -1e30, 88.7, -88.7]
    x = np.concatenate([x, special]).astype(np.float32)
    return np.concatenate([x, np.zeros((-len(x)) % 16, np.float32)])


def _sweep2() -> tuple[Any, Any]:
    """Pairs for the functions of two operands: ``_sweep()`` against itself shuffled, every
    pair of the special values, and exponents a program raises to (small, integral, halves)."""
    rng = np.random.default_rng(1)
    x = _sweep()
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-40, 1.0, -1.0, 0.5, -2.0,
                        3.0, -3.0, 2.5, 1e30, -1e30], np.float32)
    gx, gy = (a.ravel() for a in np.meshgrid(special, special))
    px = (rng.uniform(0, 20, 1 << 12) * rng.choice([-1, 1], 1 << 12)).astype(np.float32)
    py = np.concatenate([rng.integers(-12, 13, 1 << 11) / rng.choice([1.0, 2.0], 1 << 11),
                         rng.uniform(-10, 10, 1 << 11)]).astype(np.float32)
    a = np.concatenate([x, gx, px]).astype(np.float32)
    b = np.concatenate([rng.permutation(x), gy, py]).astype(np.float32)
    pad = (-len(a)) % 16
    return (np.concatenate([a, np.ones(pad, np.float32)]),
            np.concatenate([b, np.ones(pad, np.float32)]))


@per_device
def vector_math_agrees(device: Any, fn: str) -> bool:
    """Whether ``fn`` on float16 vectors gives this device's scalar ``fn`` values (within 2
    units in the last place, NaN for NaN, the same sign of zero) over ``_sweep()`` (pairs of
    ``_sweep2()`` for the functions of two operands); remembered
    on disk per device and driver. PoCL 3.1's vector sin, cos and tan return 0.008-0.014 for
    arguments below about 1e-3 (sin(1e-30) = 0.0099): they fail, the others pass."""
    if fn not in VECTOR_MATH_CANDIDATES:
        return False
    return bool(device.remembered(f"vector_math_{fn}", lambda: _vector_math_check(device, fn)))


def _vector_math_check(device: Any, fn: str) -> bool:
    two = fn in BINARY_MATH
    args, call = (", __global const {T} *b", f"{fn}(a[g], b[g])") if two else ("", f"{fn}(a[g])")
    src = (f"__kernel void v(__global float16 *o, __global const float16 *a"
           f"{args.format(T='float16')}) {{ size_t g = get_global_id(0); o[g] = {call}; }}\n"
           f"__kernel void s(__global float *o, __global const float *a"
           f"{args.format(T='float')}) {{ size_t g = get_global_id(0); o[g] = {call}; }}\n")
    operands = _sweep2() if two else (_sweep(),)
    x = operands[0]
    try:
        prg = device.build(src)
        bufs = []
        for a in operands:
            bufs.append(device.alloc(a.nbytes))
            device.write(bufs[-1], a, blocking=True)
        got = {}
        for name, n in (("v", len(x) // 16), ("s", len(x))):
            out = device.alloc(x.nbytes)
            device.launch(getattr(prg, name), (n,), None, [out, *bufs], reads=bufs,
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


# -- probes remembered on disk, per device and driver ----------------------------------------------
_FP16_PROBE = r"""
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
__kernel void probe(__global const half4 *a, __global half4 *out) {
    size_t i = get_global_id(0);
    half4 x = a[i];
    out[i] = fma(x, x, (half4)(1.0h)) * (half)0.5h;
}
"""

# The PTX forms the NVIDIA paths use outside the tensor-core GEMM (which has its own fallback):
# %laneid, shfl.sync (sm_30, PTX 6.0) and dp4a (sm_61).
_PTX_PROBE = r"""
__kernel void probe(__global uint *out) {
    uint lane, other, one = 1, ones = 0x01010101u, zero = 0;
    int dot;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"
                 : "=r"(other) : "r"(lane), "r"(one));
    asm volatile("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(dot) : "r"(lane), "r"(ones), "r"(zero));
    out[get_global_id(0)] = other * 100 + (uint)dot;
}
"""

_BUILD_PROBE = "__kernel void probe(__global float *a) { a[get_global_id(0)] += 1.0f; }"

# Run in a child process: a driver that crashes on half vectors takes only the child down.
_FP16_CHILD = r"""
import sys, numpy as np, pyopencl as cl
p, d = int(sys.argv[1]), int(sys.argv[2])
dev = cl.get_platforms()[p].get_devices()[d]
ctx = cl.Context([dev]); q = cl.CommandQueue(ctx)
src = sys.stdin.read()
prg = cl.Program(ctx, src).build(cache_dir=False)
a = np.linspace(-2, 2, 64).astype(np.float16)
out = np.empty_like(a)
mf = cl.mem_flags
ba = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
bo = cl.Buffer(ctx, mf.WRITE_ONLY, a.nbytes)
prg.probe(q, (16,), None, ba, bo); cl.enqueue_copy(q, out, bo); q.finish()
ref = ((a.astype(np.float32) ** 2 + 1) * 0.5).astype(np.float16)
print("ok" if np.allclose(out, ref, rtol=1e-2, atol=1e-2) else "wrong")
"""

_STORED_LOCK = threading.Lock()


def _platform_device_index(device: Device) -> tuple[int, int]:
    for pi, p in enumerate(cl.get_platforms()):
        for di, d in enumerate(p.get_devices()):
            if d.int_ptr == device.cl_device.int_ptr:
                return pi, di
    raise LookupError(device.name)


def _probe_fp16(device: Device) -> bool:
    pi, di = _platform_device_index(device)
    try:
        res = subprocess.run([sys.executable, "-c", _FP16_CHILD, str(pi), str(di)],
                             input=_FP16_PROBE, capture_output=True, text=True, timeout=120)
    except (subprocess.TimeoutExpired, OSError):
        return False
    return res.returncode == 0 and res.stdout.strip() == "ok"


def _probe_ptx(device: Device) -> bool:
    if device.backend != "nvidia":
        return False
    try:
        with QUIET_BUILDS:  # (a driver's remarks on the probe are not the user's)
            prg = cl.Program(device.context, _PTX_PROBE).build(cache_dir=False)  # type: ignore
        out = np.full(64, 99, np.uint32)
        buf = cl.Buffer(device.context, cl.mem_flags.WRITE_ONLY, out.nbytes)
        prg.probe(device.queue.cl_queue, (64,), (64,), buf)
        cl.enqueue_copy(device.queue.cl_queue, out, buf)
        lane = np.arange(64) % 32
        return bool((out == (lane ^ 1) * 100 + lane).all())
    except cl.Error:
        return False


def _probe_builds(device: Device) -> bool:
    try:
        with QUIET_BUILDS:  # (a driver's remarks on the probe are not the user's)
            prg = cl.Program(device.context, _BUILD_PROBE).build(cache_dir=False)  # type: ignore
        a = np.zeros(4, np.float32)
        buf = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                        hostbuf=a)
        prg.probe(device.queue.cl_queue, (4,), None, buf)
        cl.enqueue_copy(device.queue.cl_queue, a, buf)
        return bool((a == 1).all())
    except cl.Error:
        return False


# The probes ``run_stored`` runs, by the ``DeviceCaps`` field they answer.
STORED: dict[str, Callable[[Device], bool]] = {
    "fp16": _probe_fp16, "nvidia_ptx": _probe_ptx, "builds": _probe_builds}


def run_stored(device: Device, what: str, update: Callable[[bool], None]) -> bool:
    """Run the probe ``what`` (one of ``STORED``) on ``device`` and remember its answer on disk
    under ``device.key``; ``update(answer)`` is called before the lock is let go (the device
    keeps the answer in its ``caps``)."""
    with _STORED_LOCK, paused():  # (no part of a function clops.jit captures)
        result = STORED[what](device)
        update(result)
        stored = load()
        stored.setdefault(device.key, {})[what] = result
        _save(stored)
    return result


def remembered(device: Device, name: str, compute: Callable[[], bool]) -> bool:
    """A probe remembered on disk with the device's others (per device and driver):
    ``compute()`` runs only where no answer for ``name`` is stored yet."""
    saved = load().get(device.key, {}).get(name)
    if isinstance(saved, bool):
        return saved
    with paused():  # (no part of a function clops.jit captures)
        result = bool(compute())
    with _STORED_LOCK:
        stored = load()
        stored.setdefault(device.key, {})[name] = result
        _save(stored)
    return result


def _path() -> str:
    # v2: the nvidia_ptx probe also checks shfl.sync and dp4a
    return os.path.join(cachefiles.root(), "probes-v2.json")


def load() -> dict[str, dict[str, Any]]:
    """Every stored answer: device key -> probe name -> bool."""
    try:
        data = json.loads(cachefiles.read_file(_path(), 1 << 20))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError):  # CacheEntryError is a ValueError
        data = {}
    # Each device's entry is kept only as a table of probe name -> bool; anything else (a list,
    # "yes", garbage) is dropped, so that the probe runs again, and the file is rewritten.
    clean = {key: {k: v for k, v in entry.items() if isinstance(k, str) and type(v) is bool}
             for key, entry in (data.items() if isinstance(data, dict) else ())
             if isinstance(key, str) and isinstance(entry, dict)}
    if clean != data:
        _save(clean)
    return clean


def _save(data: dict[str, dict[str, Any]]) -> None:
    cachefiles.write_file(_path(), json.dumps(data, indent=1).encode())
