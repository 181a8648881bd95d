"""Providers, CLBlast: GEMM, batched GEMM and GEMV (float32; float16 where the device has
cl_khr_fp16) through CLBlast's C API, opened with ctypes from the system library (Debian's
``libclblast1``) or the one beside a ``pyclblast`` install. Without the library the provider
reports itself unavailable and nothing else changes.

Operands are row-major or column-major matrices with any leading dimension and offset; other
layouts (negative, zero or two non-unit strides) are copied to contiguous ones on the device
first. A column-major output is computed as the transposed product, without a copy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import itertools
import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..kernels import layout
from ..kernels.operand import Operand, queue_of
from ..runtime import interop
from .base import OpSpec, Provider, ProviderError, guarded_call

if TYPE_CHECKING:
    from ..runtime import NativeEvent
    from ..runtime.device import CLDevice, CLQueue
    from ..runtime.events import Event

_ROW_MAJOR, _COL_MAJOR = 101, 102
_NO_TRANS, _TRANS = 111, 112

# Status codes of CLBlast's C API: the OpenCL ones, the clBLAS ones and CLBlast's own.
STATUS: dict[int, str] = {
    0: "success", -3: "OpenCL compiler not available", -4: "temporary buffer allocation failed",
    -5: "OpenCL out of resources", -6: "OpenCL out of host memory",
    -11: "OpenCL kernel build failed", -30: "invalid value", -36: "invalid command queue",
    -38: "invalid memory object", -42: "invalid binary", -43: "invalid build options",
    -44: "invalid program", -45: "invalid program executable", -46: "invalid kernel name",
    -47: "invalid kernel definition", -48: "invalid kernel", -49: "invalid argument index",
    -50: "invalid argument value", -51: "invalid argument size", -52: "invalid kernel arguments",
    -53: "too many work dimensions", -54: "work-group too large",
    -55: "work-item size too large", -56: "invalid global offset", -57: "invalid wait list",
    -58: "invalid event", -59: "invalid operation", -61: "invalid buffer size",
    -63: "invalid global work size", -1024: "not implemented",
    -1022: "matrix A is not a valid buffer", -1021: "matrix B is not a valid buffer",
    -1020: "matrix C is not a valid buffer", -1019: "vector X is not a valid buffer",
    -1018: "vector Y is not a valid buffer", -1017: "dimensions must be larger than zero",
    -1016: "leading dimension of A too small", -1015: "leading dimension of B too small",
    -1014: "leading dimension of C too small", -1013: "increment of X is zero",
    -1012: "increment of Y is zero", -1011: "buffer of A too small",
    -1010: "buffer of B too small", -1009: "buffer of C too small",
    -1008: "buffer of X too small", -1007: "buffer of Y too small",
    -2050: "temporary buffer too small", -2049: "batch count must be positive",
    -2048: "invalid override kernel", -2047: "missing override parameter",
    -2046: "not enough local memory on this device",
    -2045: "half precision not supported by the device (no cl_khr_fp16)",
    -2044: "double precision not supported by the device", -2041: "device not in the database",
    -2040: "unknown error", -2039: "unexpected error",
}

_S, _P, _I = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
_PP = ctypes.POINTER(ctypes.c_void_p)
_F, _H = ctypes.c_float, ctypes.c_uint16
_SP = ctypes.POINTER(ctypes.c_size_t)

# routine -> argument types after the precision-specific scalars are filled in (T = alpha type)
_GEMM = [_I, _I, _I, _S, _S, _S, "T", _P, _S, _S, _P, _S, _S, "T", _P, _S, _S, _PP, _PP]
_GEMM_STRIDED = [_I, _I, _I, _S, _S, _S, "T", _P, _S, _S, _S, _P, _S, _S, _S, "T", _P, _S, _S,
                 _S, _S, _PP, _PP]
_GEMM_BATCHED = [_I, _I, _I, _S, _S, _S, "TP", _P, _SP, _S, _P, _SP, _S, "TP", _P, _SP, _S, _S,
                 _PP, _PP]
_GEMV = [_I, _I, _S, _S, "T", _P, _S, _S, _P, _S, _S, "T", _P, _S, _S, _PP, _PP]
_ROUTINES = {"gemm": _GEMM, "gemm_strided": _GEMM_STRIDED, "gemm_batched": _GEMM_BATCHED,
             "gemv": _GEMV}
_SYMBOLS = {"gemm": "CLBlast{p}gemm", "gemm_strided": "CLBlast{p}gemmStridedBatched",
            "gemm_batched": "CLBlast{p}gemmBatched", "gemv": "CLBlast{p}gemv"}
_PRECISION: dict[str, tuple[str, Any]] = {"float32": ("S", _F), "float16": ("H", _H)}


def _library_candidates() -> list[str]:
    names = []
    found = ctypes.util.find_library("clblast")
    if found:
        names.append(found)
    names += ["libclblast.so.1", "libclblast.so", "libclblast.dylib", "clblast.dll"]
    spec = importlib.util.find_spec("pyclblast")
    if spec is not None and spec.origin:
        here = os.path.dirname(spec.origin)
        for pattern in ("libclblast*", "../libclblast*", "../pyclblast.libs/libclblast*"):
            names += sorted(glob.glob(os.path.join(here, pattern)))
    return names


def _scalar(dtype: str, value: float) -> Any:
    if dtype == "float16":
        return int(np.float16(value).view(np.uint16))
    return float(value)


def _matrix(op: Operand) -> tuple[bool, int] | None:
    """How CLBlast can read the last two dims of ``op`` in place: ``(transposed, ld)`` for a
    row-major matrix (or a column-major one, read as the transpose of a row-major one), else
    ``None``."""
    rows, cols = op.shape[-2:]
    rs, cs = op.strides[-2:]
    if cols == 1 or cs == 1:
        ld = rs if rows > 1 else max(cols, 1)
        if ld >= max(cols, 1):
            return False, ld
    if rows == 1 or rs == 1:
        ld = cs if cols > 1 else max(rows, 1)
        if ld >= max(rows, 1):
            return True, ld
    return None


def _fits(op: Operand, ld: int, transposed: bool) -> bool:
    """Whether the buffer holds ``ld`` times the stored rows past the offset (CLBlast checks a
    bound of that kind before it runs)."""
    rows, cols = op.shape[-2:]
    stored_rows = cols if transposed else rows
    batch = sum((n - 1) * s for n, s in zip(op.shape[:-2], op.strides[:-2]))
    if batch < 0 or op.offset < 0:
        return False
    end = (op.offset + batch + ld * stored_rows) * op.itemsize
    return end <= interop.buffer_mem_size(op.buffer)


def _t(op: Operand) -> Operand:
    """The transposed view (last two dims swapped)."""
    sh, st = list(op.shape), list(op.strides)
    sh[-1], sh[-2] = sh[-2], sh[-1]
    st[-1], st[-2] = st[-2], st[-1]
    return op.with_shape(sh, st)


class CLBlastProvider(Provider):
    """CLBlast behind ``matmul``: ``gemm``, ``gemm_batched`` and ``gemv``.

    >>> p = clops.providers.get("clblast")
    >>> p.gemm(dev, a, b, c)  # Operands (M, K), (K, N), (M, N); returns an Event
    """

    name = "clblast"
    description = "CLBlast (C API through ctypes): GEMM, batched GEMM, GEMV"
    _needs = {"float16": ("cl_khr_fp16",)}
    # CLBlast adds float16 up in half precision: x.T @ x of 70000 rows of about 0.06 stalled
    # at 1206 of 4334 (Intel's CPU runtime); clops' kernels, like numpy, add up in float32
    _half = {"float16": "CLBlast adds float16 up in half precision"}
    _matrix_layout = "row- or column-major, any leading dimension and offset"
    specs = (
        OpSpec("gemm", frozenset({"float32", "float16"}), _matrix_layout, _needs, _half),
        OpSpec("gemm_batched", frozenset({"float32", "float16"}),
               _matrix_layout + "; any batch strides (0 for broadcast inputs)", _needs, _half),
        OpSpec("gemv", frozenset({"float32", "float16"}),
               _matrix_layout + "; vectors with positive increments", _needs, _half),
    )

    def __init__(self, library: str | None = None) -> None:
        super().__init__()
        self.library = library
        self.path: str | None = None
        self._lib: ctypes.CDLL | None = None
        self._fns: dict[tuple[str, str], Any] = {}

    def load(self) -> None:
        errors = []
        for name in [self.library] if self.library else _library_candidates():
            try:
                lib = ctypes.CDLL(name)
            except OSError as e:
                errors.append(str(e))
                continue
            if not hasattr(lib, "CLBlastSgemm"):
                errors.append(f"{name} has no CLBlastSgemm")
                continue
            self._lib, self.path = lib, name
            return
        raise OSError("the CLBlast library was not found (install libclblast1, or pyclblast; "
                      f"tried: {'; '.join(errors[:3]) or 'nothing'})")

    def _fn(self, routine: str, dtype: str) -> Any:
        fn = self._fns.get((routine, dtype))
        if fn is None:
            why = self.unavailable_reason()
            if why is not None or self._lib is None:
                raise ProviderError(f"clblast is unavailable: {why}")
            letter, scalar = _PRECISION[dtype]
            fn = getattr(self._lib, _SYMBOLS[routine].format(p=letter))
            types: list[Any] = []
            for t in _ROUTINES[routine]:
                types.append(scalar if t == "T" else ctypes.POINTER(scalar) if t == "TP" else t)
            fn.argtypes = types
            fn.restype = ctypes.c_int
            self._fns[(routine, dtype)] = fn
        return fn

    def _call(self, device: CLDevice, routine: str, dtype: str, args: list[Any], *,
              reads: Sequence[Operand], writes: Sequence[Operand], queue: CLQueue | None,
              flops: float) -> Event:
        fn = self._fn(routine, dtype)
        symbol = _SYMBOLS[routine].format(p=_PRECISION[dtype][0])

        def enqueue(q: CLQueue) -> NativeEvent | None:
            qptr = ctypes.c_void_p(interop.queue_handle(q))
            evptr = ctypes.c_void_p(0)
            status = fn(*args, ctypes.byref(qptr), ctypes.byref(evptr))
            if status != 0:
                raise ProviderError(
                    f"CLBlast {symbol} failed on {device.name}: status {status} "
                    f"({STATUS.get(status, 'unknown status')}); arguments "
                    f"{[a for a in args if isinstance(a, int | float)]}")
            if not evptr.value:
                return None
            return interop.event_from_handle(evptr.value, retain=False)

        nbytes = sum(o.nbytes for o in list(reads) + list(writes))
        return guarded_call(device, enqueue, reads=[o.buffer for o in reads],
                            writes=[o.buffer for o in writes], queue=queue, name=symbol,
                            provider=self.name, op=routine, nbytes=nbytes, flops=flops)

    # -- layout checks ------------------------------------------------------------------------
    def accepts(self, op: str, role: str, operand: Operand) -> bool:
        if role in ("x", "y"):
            return operand.ndim == 1 and (operand.strides[0] > 0 or operand.shape[0] <= 1)
        m = _matrix(operand)
        if m is None or not _fits(operand, m[1], m[0]):
            return False
        if role == "c":
            if m[0]:
                return False
            batch_st = operand.strides[:-2]
            return all(s != 0 or n == 1 for s, n in zip(batch_st, operand.shape[:-2]))
        return True

    def _readable(self, op: str, role: str, t: Operand, device: Any, queue: Any) -> Operand:
        """``t``, or a contiguous copy where the library does not take its layout."""
        return t if self.accepts(op, role, t) else layout.contiguous(device, t, queue=queue)

    def _writable(self, op: str, role: str, t: Operand, beta: float, device: Any,
                  queue: Any) -> Operand:
        """``t``, or a contiguous stand-in the library can write (holding t's values where
        ``beta`` reads them); the caller copies it back."""
        if self.accepts(op, role, t):
            return t
        return layout.contiguous(device, t, queue=queue) if beta != 0 else \
            layout.empty(device, t.shape, t.dtype)

    # -- ops ----------------------------------------------------------------------------------
    def gemm(self, device: CLDevice, a: Operand, b: Operand, c: Operand, *, alpha: float = 1.0,
             beta: float = 0.0, queue: CLQueue | None = None) -> Event:
        """``c = alpha * a @ b + beta * c`` for 2-D operands (M, K), (K, N), (M, N)."""
        _check_mm(a, b, c, 2)
        return self.gemm_batched(device, a, b, c, alpha=alpha, beta=beta, queue=queue)

    def gemm_batched(self, device: CLDevice, a: Operand, b: Operand, c: Operand, *,
                     alpha: float = 1.0, beta: float = 0.0,
                     queue: CLQueue | None = None) -> Event:
        """``c[i] = alpha * a[i] @ b[i] + beta * c[i]`` over equal batch dims (..., M, K),
        (..., K, N), (..., M, N); inputs may broadcast over the batch with stride 0."""
        _check_mm(a, b, c, None)
        if not self.accepts("gemm", "c", c) and self.accepts("gemm", "c", _t(c)):
            # c column-major: c^T = b^T a^T is row-major, no copy needed
            return self.gemm_batched(device, _t(b), _t(a), _t(c), alpha=alpha, beta=beta,
                                     queue=queue)
        a = self._readable("gemm", "a", a, device, queue)
        b = self._readable("gemm", "b", b, device, queue)
        target = c
        c = self._writable("gemm", "c", c, beta, device, queue)
        m, k = a.shape[-2:]
        n = b.shape[-1]
        batch_shape = c.shape[:-2]
        count = math.prod(batch_shape)
        flops = 2.0 * m * n * k * count
        if m == 0 or n == 0 or count == 0:
            ev = queue_of(device, queue).marker()
        elif k == 0:
            ev = layout.scale(device, c, beta, queue=queue) if c.is_contiguous else \
                self._gemm_k0(device, c, beta, queue)
        else:
            ev = self._gemm(device, a, b, c, alpha, beta, queue, flops)
        if c is not target:
            ev = layout.copy(device, c, target, queue=queue)
        return ev

    def _gemm_k0(self, device: CLDevice, c: Operand, beta: float,
                 queue: CLQueue | None) -> Event:
        tmp = layout.contiguous(device, c, queue=queue)
        layout.scale(device, tmp, beta, queue=queue)
        return layout.copy(device, tmp, c, queue=queue)

    def _gemm(self, device: CLDevice, a: Operand, b: Operand, c: Operand, alpha: float,
              beta: float, queue: CLQueue | None, flops: float) -> Event:
        dtype = c.dtype
        ta, lda = _matrix(a)  # type: ignore[misc]
        tb, ldb = _matrix(b)  # type: ignore[misc]
        _, ldc = _matrix(c)  # type: ignore[misc]
        m, k = a.shape[-2:]
        n = b.shape[-1]
        head = [_ROW_MAJOR, _TRANS if ta else _NO_TRANS, _TRANS if tb else _NO_TRANS, m, n, k]
        al, be = _scalar(dtype, alpha), _scalar(dtype, beta)
        mems = [ctypes.c_void_p(interop.buffer_handle(o.buffer)) for o in (a, b, c)]
        bshape = c.shape[:-2]
        count = math.prod(bshape)
        strides = [_collapse_batch(bshape, o.strides[:-2]) for o in (a, b, c)]
        kw = {"reads": [a, b], "writes": [c], "queue": queue, "flops": flops}
        if count == 1:
            args = head + [al, mems[0], a.offset, lda, mems[1], b.offset, ldb, be, mems[2],
                           c.offset, ldc]
            return self._call(device, "gemm", dtype, args, **kw)  # type: ignore[arg-type]
        if all(s is not None and s >= 0 for s in strides):
            sa, sb, sc = strides
            args = head + [al, mems[0], a.offset, lda, sa, mems[1], b.offset, ldb, sb, be,
                           mems[2], c.offset, ldc, sc, count]
            return self._call(device, "gemm_strided", dtype, args, **kw)  # type: ignore[arg-type]
        offs = [_batch_offsets(bshape, o) for o in (a, b, c)]
        scalar: Any = _PRECISION[dtype][1]
        alphas = (scalar * count)(*([al] * count))
        betas = (scalar * count)(*([be] * count))
        arrs = [(ctypes.c_size_t * count)(*o) for o in offs]
        args = head + [alphas, mems[0], arrs[0], lda, mems[1], arrs[1], ldb, betas, mems[2],
                       arrs[2], ldc, count]
        return self._call(device, "gemm_batched", dtype, args, **kw)  # type: ignore[arg-type]

    def gemv(self, device: CLDevice, a: Operand, x: Operand, y: Operand, *, alpha: float = 1.0,
             beta: float = 0.0, queue: CLQueue | None = None) -> Event:
        """``y = alpha * a @ x + beta * y`` for ``a`` (M, N), ``x`` (N,), ``y`` (M,)."""
        if a.ndim != 2 or x.ndim != 1 or y.ndim != 1 or a.shape[1] != x.shape[0] \
                or a.shape[0] != y.shape[0]:
            raise ValueError(f"gemv: shapes {a.shape} @ {x.shape} -> {y.shape} do not match")
        if len({a.dtype, x.dtype, y.dtype}) != 1:
            raise TypeError(f"gemv: dtypes {a.dtype}, {x.dtype}, {y.dtype} differ")
        dtype = y.dtype
        a = self._readable("gemv", "a", a, device, queue)
        x = self._readable("gemv", "x", x, device, queue)
        target = y
        y = self._writable("gemv", "y", y, beta, device, queue)
        m, n = a.shape
        if m == 0:
            return queue_of(device, queue).marker()
        if n == 0:
            ev = layout.scale(device, y, beta, queue=queue) if y.is_contiguous else \
                self._gemm_k0(device, y, beta, queue)
        else:
            if beta == 0:
                # NOTE: CLBlast's GEMV reads y even when beta is 0 (0 * nan is nan)
                layout.zero(device, y, queue=queue)
            trans, lda = _matrix(a)  # type: ignore[misc]
            rows, cols = (n, m) if trans else (m, n)
            mem_a, mem_x, mem_y = (ctypes.c_void_p(interop.buffer_handle(o.buffer))
                                   for o in (a, x, y))
            args = [_ROW_MAJOR, _TRANS if trans else _NO_TRANS, rows, cols,
                    _scalar(dtype, alpha), mem_a, a.offset, lda,
                    mem_x, x.offset, max(x.strides[0], 1),
                    _scalar(dtype, beta), mem_y, y.offset, max(y.strides[0], 1)]
            ev = self._call(device, "gemv", dtype, args, reads=[a, x], writes=[y], queue=queue,
                            flops=2.0 * m * n)
        if y is not target:
            ev = layout.copy(device, y, target, queue=queue)
        return ev

    # -- cost ---------------------------------------------------------------------------------
    def estimate(self, op: str, device: CLDevice, dtype: str, shape_key: tuple[int, ...]) -> float:
        """Seconds from a roofline guess: peak FMA rate from compute units and clock, half of
        it reached, plus the launch."""
        lanes = 128 if device.kind == "gpu" else 2 * max(device.caps.preferred_vector_width_float,
                                                         4)
        peak = device.caps.compute_units * max(interop.clock_mhz(device), 100) * 1e6 * 2 * lanes
        if op == "gemv":
            m, n = shape_key[-2:]
            flops = 2.0 * m * n
            mem = 4.0 * m * n / (500e9 if device.kind == "gpu" else 20e9)
            return 20e-6 + max(flops / (0.5 * peak), mem)
        m, n, k = shape_key[-3:]
        count = math.prod(shape_key[:-3]) if len(shape_key) > 3 else 1
        return 20e-6 + 2.0 * m * n * k * count / (0.5 * peak)

    def scratch_call(self, op: str, device: CLDevice, dtype: str,
                     shape_key: tuple[int, ...]) -> Callable[[], Event]:
        def zeros(shape: tuple[int, ...]) -> Operand:
            o = layout.empty(device, shape, dtype)
            device.write(o.buffer, np.zeros(max(o.size, 1), np.float16 if dtype == "float16"
                                            else np.float32))
            return o

        if op == "gemv":
            m, n = shape_key
            a, x, y = zeros((m, n)), zeros((n,)), zeros((m,))
            return lambda: self.gemv(device, a, x, y)
        *batch, m, n, k = shape_key
        a, b, c = zeros((*batch, m, k)), zeros((*batch, k, n)), zeros((*batch, m, n))
        if op == "gemm":
            return lambda: self.gemm(device, a, b, c)
        return lambda: self.gemm_batched(device, a, b, c)


def _check_mm(a: Operand, b: Operand, c: Operand, ndim: int | None) -> None:
    ok = a.ndim >= 2 and a.ndim == b.ndim == c.ndim and (ndim is None or a.ndim == ndim)
    if ok:
        ok = (a.shape[-1] == b.shape[-2] and c.shape[-2:] == (a.shape[-2], b.shape[-1])
              and a.shape[:-2] == b.shape[:-2] == c.shape[:-2])
    if not ok:
        raise ValueError(f"gemm: shapes {a.shape} @ {b.shape} -> {c.shape} do not match "
                         "(expected (..., M, K) @ (..., K, N) -> (..., M, N))")
    if len({a.dtype, b.dtype, c.dtype}) != 1:
        raise TypeError(f"gemm: dtypes {a.dtype}, {b.dtype}, {c.dtype} differ; cast first")


def _collapse_batch(shape: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The one stride that walks all batch dims in order, or ``None``."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if not dims:
        return 0
    for (_, s_outer), (n_inner, s_inner) in itertools.pairwise(dims):
        if s_outer != s_inner * n_inner:
            return None
    return dims[-1][1]


def _batch_offsets(shape: tuple[int, ...], op: Operand) -> list[int]:
    strides = op.strides[:-2]
    idx = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), np.int64)
    offs = op.offset + (np.asarray(strides, np.int64)[:, None] * idx).sum(axis=0)
    return [int(v) for v in offs]
