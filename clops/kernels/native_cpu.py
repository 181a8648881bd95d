"""Kernels, native CPU products: ``native_cpu.c`` (products of quantized weights in the CPU
layout with integer dot products, on int8 rows of x; of float16 weights with few rows of x, as
in a decode step; and the attention of a decode row or a prompt's rows) built once with the
system's C compiler for this machine's CPU, and run by the CPU device's queue as a native kernel
(``runtime.nativekernel``) on the same buffers as its OpenCL kernels.

The library is built in the width the CPU runs natively (``isa()``): AVX-512 with VNNI and
VBMI (16-wide vectors, ``vpdpbusd``), else AVX2 with FMA and F16C (8-wide vectors, ``vpmaddubsw``
and ``vpmaddwd``, 4 rows a tile where the first takes 8); ``CLOPS_NATIVE_CPU=avx2`` builds the
second on a CPU that has the first.

Used where ``available(dev)`` holds: a CPU device whose runtime runs native kernels, a C
compiler (``CC``, else ``cc``, ``gcc`` or ``clang``), an x86-64 CPU with one of the two, and
``CLOPS_NATIVE_CPU`` not ``0``; elsewhere ``matmul_cpu.cl`` serves. The library is kept in the
cache folder under a name made of its source, the compiler, its flags and the CPU's model and
flags.

PERF (2-core AMD EPYC Zen 5, 64 rows, 2 threads): q4 2048x8192 about 1100 GOP/s and q8 about
650, where the float kernels of matmul_cpu.cl reach about 400 GFLOP/s (float FMAs)."""

from __future__ import annotations

import ctypes
import functools
import platform
import sys
import threading
import types
import weakref
from importlib import resources
from typing import Any

import numpy as np

from .. import _config
from ..runtime import CLDevice, cbuild, nativekernel, plan
from ..runtime.plan import Launch
from ..runtime.pool import Buffer

FORMATS = ("q4", "q8")
# CPU runtimes asked for native kernels. PoCL 3.1 handed a native kernel's buffer listed after
# one of a higher handle the other's memory, and left a buffer listed twice holding its handle
# in the second place (and crashed writing through it); the check below catches both. With its
# lists in the order of their handles (as nativekernel gives them now) and no chains, PoCL
# passed the check, but ran the products at less than half their speed on Intel's runtime (a
# 1B Q4_0 prompt chunk's gate_up 165 ms against 68): no faster than its OpenCL C kernels, so
# it is not asked.
RUNTIMES = ("intel",)
# runtimes whose native kernels take a buffer listed twice (PoCL 3.1 left the second place
# holding the handle, and crashed writing through it): native kernels in a row go to their
# queues as one command (nativekernel.Chain) there
CHAIN_RUNTIMES = ("intel",)
_VERSION = 5  # CLOPS_NATIVE_VERSION of native_cpu.c
# clops_native_isa() of native_cpu.c
ISAS = {1: "avx2", 2: "avx512-vnni"}


class _Args(ctypes.Structure):
    """``clops_mm_args`` of native_cpu.c."""

    _fields_ = [("y", ctypes.c_void_p), ("x", ctypes.c_void_p), ("w", ctypes.c_void_p),
                ("s", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("nw", ctypes.c_void_p),
                ("y_off", ctypes.c_int64), ("ldy", ctypes.c_int64), ("x_off", ctypes.c_int64),
                ("ldx", ctypes.c_int64), ("m", ctypes.c_int32), ("n", ctypes.c_int32),
                ("k", ctypes.c_int32), ("fmt", ctypes.c_int32), ("scale_half", ctypes.c_int32),
                ("q4_sym", ctypes.c_int32), ("qgroup", ctypes.c_int32),
                ("accum", ctypes.c_int32), ("glu", ctypes.c_int32),
                ("has_bias", ctypes.c_int32), ("norm", ctypes.c_int32),
                ("threads", ctypes.c_int32), ("eps", ctypes.c_float), ("ksplit", ctypes.c_int32)]


class _AttnArgs(ctypes.Structure):
    """``clops_attn_args`` of native_cpu.c."""

    _fields_ = [("out", ctypes.c_void_p), ("qkv", ctypes.c_void_p), ("kc", ctypes.c_void_p),
                ("vc", ctypes.c_void_p), ("state", ctypes.c_void_p),
                ("inv_freq", ctypes.c_void_p), ("max_seq", ctypes.c_int32),
                ("n_rep", ctypes.c_int32), ("H", ctypes.c_int32), ("KV", ctypes.c_int32),
                ("D", ctypes.c_int32), ("neox", ctypes.c_int32), ("threads", ctypes.c_int32),
                ("scale", ctypes.c_float), ("m", ctypes.c_int32)]


class _GemmArgs(ctypes.Structure):
    """``clops_gemm_args`` of native_cpu.c."""

    _fields_ = [("c", ctypes.c_void_p), ("a", ctypes.c_void_p), ("b", ctypes.c_void_p),
                *[(f, ctypes.c_int64) for f in ("c_off", "ldc", "a_off", "lda", "b_off", "ldb",
                                                 "sc", "sa", "sb")],
                *[(f, ctypes.c_int32) for f in ("m", "n", "k", "batch", "a_trans", "threads")]]


def _cpu_identity() -> str:
    """The CPU's model and flags (a library built with -march=native runs on that CPU)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return platform.processor()
    first = text.split("\n\n", 1)[0]
    return "\n".join(line for line in first.splitlines()
                     if line.startswith(("model name", "flags", "vendor_id")))


@functools.cache
def library() -> Any | None:
    """The built library (ctypes), or None where it cannot be had: not x86-64 Linux, no C
    compiler, a failed build, or a CPU with neither AVX2 and FMA nor AVX-512 VNNI."""
    if not _config.native_cpu() or platform.machine() not in ("x86_64", "AMD64"):
        return None
    if not sys.platform.startswith("linux"):
        return None
    try:
        src = resources.files(__package__).joinpath("native_cpu.c").read_text()
    except OSError:  # (an installation without the source)
        return None
    flags = ["-O3", "-march=native", "-fPIC", "-shared", "-pthread", "-std=gnu11"]
    if _config.native_cpu_avx2():
        flags.append("-mno-avx512f")  # (and with it every AVX-512 extension)
    lib = cbuild.build("native_cpu", src, flags, _cpu_identity(), bool(_config.debug_level()))
    if lib is None:
        return None
    if (lib.clops_native_version() != _VERSION or lib.clops_native_isa() not in ISAS
            or lib.clops_native_args_size() != ctypes.sizeof(_Args)
            or lib.clops_native_attn_args_size() != ctypes.sizeof(_AttnArgs)
            or lib.clops_native_gemm_args_size() != ctypes.sizeof(_GemmArgs)):
        return None
    return lib


def isa() -> str | None:
    """The instructions the native kernels were built for (``"avx512-vnni"``, ``"avx2"``), or
    None where they are not built."""
    lib = library()
    return None if lib is None else ISAS[lib.clops_native_isa()]


_CHECKED: weakref.WeakKeyDictionary[CLDevice, bool] = weakref.WeakKeyDictionary()
_CHECK_LOCK = threading.Lock()


def available(dev: CLDevice) -> bool:
    """Whether ``dev`` runs the native products: a CPU device of one of ``RUNTIMES`` that runs
    native kernels, with the library built for this machine, where a small product through
    the device's queue gives the exact sums (checked once per device and process)."""
    if dev.kind != "cpu" or dev.backend not in RUNTIMES or not nativekernel.available():
        return False
    if not nativekernel.supported(dev.cl_device) or library() is None:
        return False
    with _CHECK_LOCK:
        ok = _CHECKED.get(dev)
        if ok is None:
            with plan.paused():  # (not part of a clops.jit function being captured)
                ok = _CHECKED[dev] = _check(dev)
    return ok


def why_not(dev: CLDevice) -> str | None:
    """Why ``dev`` does not run the native products (None: it does), for ``clops info``."""
    if dev.kind != "cpu":
        return "not a CPU"
    if not _config.native_cpu():
        return "CLOPS_NATIVE_CPU=0"
    if dev.backend not in RUNTIMES:
        return f"not asked of the {dev.backend} runtime (only {', '.join(RUNTIMES)})"
    if not nativekernel.available() or not nativekernel.supported(dev.cl_device):
        return "the runtime runs no native kernels"
    if library() is None:
        return ("not built here: needs x86-64 Linux, a C compiler (CC, cc, gcc or clang) and a "
                "CPU with AVX2 and FMA or AVX-512 VNNI")
    return None if available(dev) else "the check product through the queue came out wrong"


def _check(dev: CLDevice) -> bool:
    """A q4 product of 3 rows and 40 columns (an output block cut short), with bias and
    accumulation, through the device's queue, then the same product twice more as one chained
    command (``nativekernel.Chain``: the same buffers twice in its list), against numpy: x holds
    whole numbers of a block's largest magnitude 127, so its int8 rows are exact and so are
    the sums. (PoCL 3.1 left the second place of a buffer listed twice holding the handle, not
    the memory, and handed a buffer listed after one of a higher handle the other's memory.)"""
    rng = np.random.default_rng(7)
    n, k, m = 40, 64, 3
    nb, g = 3, k // 32
    data = rng.integers(0, 256, (nb, g, 16, 16), dtype=np.uint8)  # [b][g][j][r]
    scales = rng.choice(np.array([0.25, 0.5, 1.0, 2.0], np.float16), (nb, g, 16))
    x = rng.integers(-127, 128, (m, k)).astype(np.float32)
    x[:, ::32] = 127.0
    bias = rng.integers(-4, 5, n).astype(np.float32)
    y0 = rng.integers(-4, 5, (m, n)).astype(np.float32)
    q = np.concatenate([data & 15, data >> 4], axis=2).astype(np.float64)  # [b][g][32][r]
    w = ((q - 8.0) * scales[:, :, None, :]).transpose(0, 3, 1, 2).reshape(nb * 16, k)[:n]
    want = x.astype(np.float64) @ w.T + bias + y0
    bufs = {}
    for name, arr in (("data", data), ("scales", scales), ("x", x), ("bias", bias), ("y", y0)):
        bufs[name] = dev.alloc(arr.nbytes)
        dev.write(bufs[name], np.ascontiguousarray(arr), blocking=True)
    wt = types.SimpleNamespace(fmt="q4", scale_half=True, q4_sym=True, group=32, n=n, k=k,
                               data=bufs["data"], scales=bufs["scales"])
    args = [bufs["y"], np.int32(0), np.int32(n), bufs["x"], np.int32(0), np.int32(k),
            wt.data, wt.scales, bufs["bias"], np.int32(m), np.int32(n), np.int32(k),
            wt.scales, np.float32(0)]
    reads = [bufs["x"], wt.data, wt.scales, bufs["bias"], bufs["y"]]
    got = np.empty((m, n), np.float32)
    chained = np.empty((m, n), np.float32)
    try:
        def product() -> Launch:
            return matmul(dev, args, reads, bufs["y"], wt, bias=True, accum=True, norm=False,
                          glu_out=False, name="native_check")

        product().run(dev)
        dev.read(got, bufs["y"])
        kernels = [product().kernel, product().kernel]
        if kernels[0].chain_fn is not None:
            for knl in kernels:
                knl.set_args(*[a.mem if isinstance(a, Buffer) else a for a in args])
            Launch(nativekernel.Chain(kernels), (1,), None, [], reads, [bufs["y"]],
                   "native_check").run(dev)
            dev.read(chained, bufs["y"])
    except RuntimeError:
        return False
    twice = want + 2 * (want - y0)
    ok = bool(np.array_equal(got, want.astype(np.float32))
              and (kernels[0].chain_fn is None
                   or np.array_equal(chained, twice.astype(np.float32))))
    if not ok and _config.debug_level():
        print(f"clops: native CPU products are off on {dev.name}: the check product differs")
    return ok


def takes(dev: CLDevice, w: Any) -> bool:
    """Whether the product with weight ``w`` runs natively on ``dev``: q4 and q8 weights in
    the CPU layout (q8 with a scale per 32 or 16 values) that may meet int8 rows
    (``w.int8``).

    PERF (2-core EPYC, Intel's runtime): float16 weights were tried natively too (two blocks
    of 16 columns and 8 rows a tile, vcvtph2ps and FMAs at 390-440 GFLOP/s alone), but a 1B
    F16 prompt ran at 156-165 tok/s against 170-176 with matmul_cpu.cl, so they keep it."""
    if w.layout != "rb16" or w.fmt not in FORMATS or w.k % 32 or not w.int8:
        return False
    return (w.fmt == "q4" or w.group in (16, 32)) and available(dev)


# float16 weights run natively for at most this many rows where the library is built for
# AVX-512 (for any number on AVX2)
FLOAT_ROWS = 4


def takes_float(dev: CLDevice, w: Any, m: int) -> bool:
    """Whether the product of m rows with float16 weight ``w`` runs natively on ``dev``: the
    CPU layout; on AVX-512, m at most ``FLOAT_ROWS`` (a decode step), on AVX2 any m (more than
    4 rows in tiles of 6).

    PERF (2-core EPYC Zen 5, AVX-512, Intel's runtime): a decode row's products stream the
    weights at about 52 GB/s where matmul_cpu.cl streams about 41; prompts keep matmul_cpu.cl,
    which takes several rows a tile (natively, 8 rows a tile gave a 1B F16 prompt 156-165
    tok/s against 170-176). PERF (2-core EPYC without AVX-512, Intel's runtime, f16
    16384x2048 with 64 rows): natively 6 rows a tile, each run of 256 k made float once,
    144-146 GFLOP/s (of about 195 for FMAs alone), where matmul_cpu.cl's 16-wide vectors made
    64 (4 rows, 3 blocks a work-item) and 89 at best (2 and 2). The weights made float as a
    tile loads them, in runs of 2048 k (where a run of 256 k was made float once into a buffer
    for the tiles), took one core from 80-83 GFLOP/s to 91-94 (of about 97) and two threads
    from 150-163 to 182-184, the same sums; a 1B F16 prompt of 64 tokens 75 -> 82 tok/s, against
    llama.cpp's 77 in turn with it."""
    if not (w.layout == "rb16" and w.fmt == "f16" and w.k % 32 == 0 and m > 0
            and available(dev)):
        return False
    return m <= FLOAT_ROWS or isa() == "avx2"


def _chain_fn(lib: Any, dev: CLDevice) -> int | None:
    """``clops_native_chain`` where ``dev`` takes chains (``CHAIN_RUNTIMES``): products and
    attention in a row as one command."""
    if dev.backend not in CHAIN_RUNTIMES:
        return None
    return ctypes.cast(lib.clops_native_chain, ctypes.c_void_p).value


class MatmulKernel(nativekernel.NativeKernel):
    """``clops_native_matmul`` with matmul_cpu.cl's arguments (``matmul._matmul_args``'s
    list: y, y_off, ldy, x, x_off, ldx, data, scales, bias, m, n, k, nw, eps) and the
    product's fixed choices."""

    def __init__(self, lib: Any, *, fmt: str, scale_half: bool, q4_sym: bool, qgroup: int,
                 accum: bool, glu: bool, has_bias: bool, norm: bool, threads: int,
                 chain_fn: int | None = None, ksplit: bool = False) -> None:
        fn = ctypes.cast(lib.clops_native_matmul, ctypes.c_void_p).value
        assert fn is not None
        super().__init__(fn, "native_matmul", 14)
        self.chain_fn = chain_fn
        self.chain_kind = 1
        self.fixed = dict(fmt={"f16": 1, "q4": 3, "q8": 4}[fmt], scale_half=int(scale_half),
                          q4_sym=int(q4_sym), qgroup=qgroup, accum=int(accum), glu=int(glu),
                          has_bias=int(has_bias), norm=int(norm), threads=threads,
                          ksplit=int(ksplit))

    def block(self) -> tuple[ctypes.Structure, list[tuple[str | int, Any]]]:
        (y, y_off, ldy, x, x_off, ldx, data, scales, bias, m, n, k, nw, eps) = self.args
        f = self.fixed
        mems: list[tuple[str | int, Any]] = [("y", y), ("x", x), ("w", data), ("s", scales)]
        if f["has_bias"]:
            mems.append(("bias", bias))
        if f["norm"]:
            mems.append(("nw", nw))
        blk = _Args(y_off=int(y_off), ldy=int(ldy), x_off=int(x_off), ldx=int(ldx), m=int(m),
                    n=int(n), k=int(k), eps=float(eps), **f)
        for name, mem in mems:
            setattr(blk, str(name), mem.int_ptr)
        return blk, mems


def matmul(dev: CLDevice, args: list[Any], reads: list[Buffer], y: Buffer, w: Any, *,
           bias: bool, accum: bool, norm: bool, glu_out: bool, name: str) -> Launch:
    """The native product (``takes(dev, w)`` or ``takes_float(dev, w, m)``) with
    matmul_cpu.cl's argument list."""
    lib = library()
    assert lib is not None
    # a K-quant's scales as its file holds them, where the weight keeps them (quant.py's
    # interleave_split): fewer bytes a value than the float scales matmul_cpu.cl reads
    ks = getattr(w, "kscales", None) if w.fmt in FORMATS else None
    if ks is not None:
        args = args[:7] + [ks] + args[8:]
        reads = [ks if r is w.scales else r for r in reads]
    knl = MatmulKernel(lib, fmt=w.fmt, scale_half=w.scale_half, q4_sym=w.q4_sym,
                       qgroup=w.group, accum=accum, glu=glu_out, has_bias=bias, norm=norm,
                       threads=dev.caps.compute_units, chain_fn=_chain_fn(lib, dev),
                       ksplit=ks is not None)
    return Launch(knl, (1,), None, args, reads, [y], name)


class GemmKernel(nativekernel.NativeKernel):
    """``clops_native_gemm`` with ``gemm.gemm_cpu``'s arguments (c, c_off, ldc, a, a_off, lda,
    b, b_off, ldb, m, n, k, batch, sc, sa, sb) and whether A is stored transposed."""

    def __init__(self, lib: Any, *, a_trans: bool, threads: int) -> None:
        fn = ctypes.cast(lib.clops_native_gemm, ctypes.c_void_p).value
        assert fn is not None
        super().__init__(fn, "native_gemm", 16)
        self.fixed = dict(a_trans=int(a_trans), threads=threads)

    def block(self) -> tuple[ctypes.Structure, list[tuple[str | int, Any]]]:
        (c, c_off, ldc, a, a_off, lda, b, b_off, ldb, m, n, k, batch, sc, sa, sb) = self.args
        mems: list[tuple[str | int, Any]] = [("c", c), ("a", a), ("b", b)]
        blk = _GemmArgs(c_off=int(c_off), ldc=int(ldc), a_off=int(a_off), lda=int(lda),
                        b_off=int(b_off), ldb=int(ldb), sc=int(sc), sa=int(sa), sb=int(sb),
                        m=int(m), n=int(n), k=int(k), batch=int(batch), **self.fixed)
        for name, mem in mems:
            setattr(blk, str(name), mem.int_ptr)
        return blk, mems


def takes_gemm(dev: CLDevice, dtype: str, n: int) -> bool:
    """Whether a float32 product of arrays on ``dev`` runs natively (``gemm``): float32, n a
    multiple of 16, on a device that runs the native products, built for AVX2 (8-wide
    vectors; where AVX-512 runs, gemm_cpu.cl's kernels stay: 1.5x numpy on a Zen 5, and this
    product's 16-wide form was not measured there).

    PERF (2-core EPYC with AVX2, Intel's runtime, bench_array_ops.py --groups matmul, each
    beside numpy in turns; ranges of 2-3 runs on a noisy VM): (8192, 64) @ (64, 64) 0.40-0.47x
    numpy -> 0.66-1.00x, (262144, 64) 0.87-0.97x -> 1.0-1.4x, batches of (64, 64) x 128
    0.42-0.52x -> 1.0-1.16x and (128, 128) x 1024 0.72-0.89x -> 1.24-1.32x (a product a
    thread); 2048^3 the same (123-128 ms a product through the queue alone, as gemm_cpu.cl's
    packed kernels; 151 GFLOP/s in a C harness, 112 before the pool's workers were kept off
    the calling thread's core); 512^3 3.4 against 3.7-3.9 ms alone, slower beside numpy (whose
    threads spin after each call)."""
    return dtype == "float32" and n % 16 == 0 and available(dev) and isa() == "avx2"


def gemm(dev: CLDevice, c: Buffer, c_off: int, ldc: int, a: Buffer, a_off: int, lda: int,
         b: Buffer, b_off: int, ldb: int, m: int, n: int, k: int, batch: int = 1,
         strides: tuple[int, int, int] = (0, 0, 0), a_trans: bool = False) -> Launch:
    """``gemm.gemm_cpu``'s product of float32 arrays natively (``takes_gemm``): C = A @ B for
    each of ``batch`` products, ``strides`` (C's, A's, B's) elements apart; ``a_trans``: A's
    element (i, k) at a_off + k * lda + i. Sums in steps of 256 k, each step's added to C."""
    lib = library()
    assert lib is not None
    if n % 16 or min(m, n, k, batch) < 1:
        raise ValueError(f"native gemm: m={m}, n={n}, k={k}, batch={batch}: n must be a "
                         "multiple of 16 and every size at least 1")
    knl = GemmKernel(lib, a_trans=a_trans, threads=dev.caps.compute_units)
    i64 = np.int64
    args = [c, i64(c_off), i64(ldc), a, i64(a_off), i64(lda), b, i64(b_off), i64(ldb),
            np.int32(m), np.int32(n), np.int32(k), np.int32(batch), i64(strides[0]),
            i64(strides[1]), i64(strides[2])]
    return Launch(knl, (1,), None, args, [a, b], [c], "gemm_cpu.native")


def takes_attention(dev: CLDevice, head_dim: int) -> bool:
    """Whether attention of a decode row or a prompt's rows on ``dev`` runs natively
    (``attention``): heads of a multiple of 16 values, at most 256.

    PERF (2-core EPYC Zen 5, Intel's runtime, Llama-3.2-1B body at about 100 positions):
    attn_decode_cpu of attention.cl took about 37 us a layer (a work-item per query head, an
    exp per key); the native one reads each key-value head once for its query heads and
    takes the exps 16 at a time."""
    return head_dim % 16 == 0 and 0 < head_dim <= 256 and available(dev)


class AttentionKernel(nativekernel.NativeKernel):
    """``clops_native_attention`` with attn_decode_cpu's arguments (out, qkv, kc, vc, state,
    inv_freq, max_seq, n_rep, H, KV, scale) for ``m`` rows."""

    def __init__(self, lib: Any, *, head_dim: int, neox: bool, threads: int, m: int = 1,
                 chain_fn: int | None = None) -> None:
        fn = ctypes.cast(lib.clops_native_attention, ctypes.c_void_p).value
        assert fn is not None
        super().__init__(fn, "native_attention", 11)
        self.chain_fn = chain_fn
        self.chain_kind = 2
        self.fixed = dict(D=head_dim, neox=int(neox), threads=threads, m=m)

    def block(self) -> tuple[ctypes.Structure, list[tuple[str | int, Any]]]:
        (out, qkv, kc, vc, state, inv_freq, max_seq, n_rep, h, kv, scale) = self.args
        mems: list[tuple[str | int, Any]] = [("out", out), ("qkv", qkv), ("kc", kc),
                                             ("vc", vc), ("state", state),
                                             ("inv_freq", inv_freq)]
        blk = _AttnArgs(max_seq=int(max_seq), n_rep=int(n_rep), H=int(h), KV=int(kv),
                        scale=float(scale), **self.fixed)
        for name, mem in mems:
            setattr(blk, str(name), mem.int_ptr)
        return blk, mems


def attention(dev: CLDevice, out: Buffer, qkv: Buffer, kc: Buffer, vc: Buffer, state: Buffer,
              inv_freq: Buffer, *, n_heads: int, n_kv: int, head_dim: int, max_seq: int,
              scale: float, neox: bool, m: int = 1) -> Launch:
    """Attention of ``m`` rows at positions state[0] + row straight from the QKV projection
    (rows ``(n_heads + 2 n_kv) head_dim`` apart), natively (``takes_attention``): what
    ``attention.attn_decode_cpu`` does for one row, and ``attention.rope_store`` then
    ``attention.attn_prefill`` (causal) for a prompt's rows, each row as a decode row at its
    position; out [m][n_heads][head_dim]."""
    lib = library()
    assert lib is not None
    knl = AttentionKernel(lib, head_dim=head_dim, neox=neox, threads=dev.caps.compute_units,
                          m=m, chain_fn=_chain_fn(lib, dev))
    args = [out, qkv, kc, vc, state, inv_freq, np.int32(max_seq), np.int32(n_heads // n_kv),
            np.int32(n_heads), np.int32(n_kv), np.float32(scale)]
    return Launch(knl, (1,), None, args, [qkv, kc, vc, state, inv_freq], [out, kc, vc],
                  "attn_decode" if m == 1 else "attn_prefill")
