"""Kernels, FFT: clops' own FFT kernels (``fft.cl``), used whenever no FFT provider is
chosen. Mixed-radix Stockham passes (4, 2, 3, 5, 7 and any prime up to 32) over contiguous rows,
Bluestein's algorithm for lengths with a larger prime factor. Twiddles are computed once per
length in float64 on the host and kept on the device.

Same operand conventions as the VkFFT provider: ``fft`` (batch, n) complex -> (batch, n)
complex, ``rfft`` (batch, n) real -> (batch, n//2+1) complex, ``irfft`` (batch, n//2+1) complex
-> (batch, n) real; ``scale`` multiplies the result.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import layout
from .launch import source
from .operand import Operand, measure, queue_of

if TYPE_CHECKING:
    from ..runtime import Kernel
    from ..runtime.device import CLDevice, CLQueue
    from ..runtime.events import Event
    from ..runtime.pool import Buffer

MAX_RADIX = 32
_SPECIAL = (2, 3, 4, 5, 7, 8, 16)
_NP_COMPLEX = {"complex64": np.complex64, "complex128": np.complex128}
_LOCK = threading.RLock()


def radices(n: int) -> list[int] | None:
    """The passes for length ``n`` (16s, then an 8 or a 4, first), or ``None`` when a prime
    factor is larger than MAX_RADIX (Bluestein then). Each pass reads and writes every value
    once: fewer, wider passes move less memory.

    >>> radices(48), radices(2 ** 23), radices(37 * 2)
    ([16, 3], [16, 16, 16, 16, 16, 8], None)
    """
    out = []
    for r in (16, 8, 4):
        while n % r == 0 and n > 1:
            out.append(r)
            n //= r
    p = 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
        if p > MAX_RADIX and n > 1:
            return None
    return out


@dataclass
class _Transform:
    """How a length is transformed: radix passes and twiddles, or (Bluestein) a power-of-two
    transform of a padded length with its chirps and filters."""

    n: int
    dtype: str
    passes: list[int] | None
    twiddles: Buffer | None
    # Bluestein: padded length, the transform of that length, chirp and filter per direction
    m: int = 0
    sub: _Transform | None = None
    chirp: tuple[Buffer, Buffer] | None = None
    filt: tuple[Buffer, Buffer] | None = None


_TRANSFORMS: dict[tuple[int, int, str], _Transform] = {}
def _kernel(device: CLDevice, dtype: str, name: str) -> Kernel:
    """The kernel ``name`` of ``fft.cl`` for ``dtype`` (cached by the device)."""
    opts = ("-D CT=float2", "-D RT=float") if dtype == "complex64" else \
        ("-D CT=double2", "-D RT=double", "-D USE_FP64")
    return device.kernel(source("fft"), name, opts)


def _upload(device: CLDevice, values: np.ndarray, dtype: str) -> Buffer:
    host: np.ndarray = np.ascontiguousarray(values.astype(_NP_COMPLEX[dtype]))
    buf = device.alloc(host.nbytes)
    device.write(buf, host, blocking=True)
    return buf


def transform_for(device: CLDevice, n: int, dtype: str) -> _Transform:
    """The passes and device tables for length ``n`` (built once per device, length, dtype)."""
    key = (id(device), n, dtype)
    p = _TRANSFORMS.get(key)
    if p is not None:
        return p
    with _LOCK:
        p = _TRANSFORMS.get(key)
        if p is None:
            p = _TRANSFORMS[key] = _make_transform(device, n, dtype)
    return p


def _twiddle_tables(n: int) -> np.ndarray:
    """The passes' twiddles w^t (w = exp(-2 pi i / n), t < n) as two short tables, w^l for
    l < B then w^(hB) for h < n / B (B = 2^ceil(bits(n - 1) / 2)): ``fft.cl``'s ``root``
    multiplies one of each. PERF (H200, 2^23 points): a table of all n twiddles, 64 MB, was
    read from memory by the late passes (each work-item's twiddles far apart)."""
    lb = ((n - 1).bit_length() + 1) // 2
    b = 1 << lb
    fine = np.exp(-2j * np.pi * np.arange(b) / n)
    coarse = np.exp(-2j * np.pi * (np.arange(-(-n // b)) * b) / n)
    return np.concatenate([fine, coarse])


def _make_transform(device: CLDevice, n: int, dtype: str) -> _Transform:
    if dtype == "complex128" and not device.caps.fp64:
        raise TypeError(f"complex128 FFT needs cl_khr_fp64, which {device.name} lacks; "
                        "use complex64")
    passes = radices(n)
    if passes is not None:
        tw = _upload(device, _twiddle_tables(n), dtype) if n > 1 else None
        return _Transform(n, dtype, passes, tw)
    m = 1 << (2 * n - 2).bit_length()  # a power of two >= 2n - 1
    sub = transform_for(device, m, dtype)
    k = np.arange(n, dtype=np.int64)
    # NOTE: k^2 mod 2n keeps the chirp's phase exact for large n
    phase = np.pi * ((k * k) % (2 * n)) / n
    chirps, filts = [], []
    for sign in (-1.0, 1.0):  # forward, inverse
        w = np.exp(sign * 1j * phase)
        b = np.zeros(m, np.complex128)
        b[:n] = np.conj(w)
        b[m - n + 1:] = np.conj(w[1:])[::-1]
        chirps.append(_upload(device, w, dtype))
        filts.append(_upload(device, np.fft.fft(b) / m, dtype))
    return _Transform(n, dtype, None, None, m, sub, (chirps[0], chirps[1]), (filts[0], filts[1]))


def _check(op: Operand, what: str) -> None:
    if not op.is_contiguous:
        raise ValueError(f"FFT {what} must be contiguous (batch, n); got strides {op.strides}")


def fft(device: CLDevice, x: Operand, y: Operand, *, inverse: bool = False, scale: float = 1.0,
        queue: CLQueue | None = None) -> Event:
    """Complex FFT of each row of ``x`` into ``y`` (both contiguous (batch, n), same dtype);
    ``x`` is left as it was. The inverse is unnormalized: pass ``scale=1/n`` for numpy's."""
    batch, n = layout.fft_rows(x)
    _check(x, "input")
    _check(y, "output")
    if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(f"fft: {x} and {y} differ in shape or dtype")
    if batch == 0 or n == 0:
        return queue_of(device, queue).marker()
    if x.buffer is y.buffer:
        x = layout.contiguous(device, x, queue=queue)
    p = transform_for(device, n, x.dtype)
    return _run(device, p, x, y, batch, inverse, scale, queue)


# GPUs: work-groups of this many along a row, the row's work-items rounded up to them (every
# kernel checks its bounds). PERF (H200, rfft of 2^24 float32): left to the driver, the last
# step's 2^23 + 1 work-items came in groups of 3, 1.7 ms against 0.06 at 64.
GPU_ROW_GROUP = 64


def _sizes(device: CLDevice, count: int, batch: int
           ) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """Global and local sizes of a kernel over ``count`` values of ``batch`` rows."""
    if device.kind == "cpu":
        return (count, batch), None
    g = GPU_ROW_GROUP
    return (-(-count // g) * g, batch), (g, 1)


def _real(dtype: str, value: float) -> np.floating:
    return np.float64(value) if dtype == "complex128" else np.float32(value)


def _run(device: CLDevice, p: _Transform, x: Operand, y: Operand, batch: int, inverse: bool,
         scale: float, queue: CLQueue | None) -> Event:
    n, dt = p.n, p.dtype
    if p.passes is None:
        return _bluestein(device, p, x, y, batch, inverse, scale, queue)
    if not p.passes:  # n == 1
        copied = layout.copy(device, x.with_shape((batch, 1), (1, 1)),
                             y.with_shape((batch, 1), (1, 1)), queue=queue)
        return layout.scale(device, y, scale, queue=queue) if scale != 1 else copied
    tmp = layout.empty(device, (batch, n), dt) if len(p.passes) > 1 else None
    src = x
    ns = 1
    ev: Event | None = None
    last = len(p.passes) - 1
    for i, r in enumerate(p.passes):
        dst = y if (last - i) % 2 == 0 else tmp
        assert dst is not None
        name = f"fft_pass{r}" if r in _SPECIAL else "fft_passn"
        args = [dst.buffer, np.int64(dst.offset), src.buffer, np.int64(src.offset), p.twiddles,
                np.int64(n), np.int64(ns), np.int32(inverse),
                _real(dt, scale if i == last else 1.0)]
        if name == "fft_passn":
            args.append(np.int32(r))
        ev = device.launch(_kernel(device, dt, name), *_sizes(device, n // r, batch), args,
                           reads=[src.buffer, p.twiddles], writes=[dst.buffer],  # type: ignore
                           queue=queue, name=f"fft_radix{r}")
        src = dst
        ns *= r
    assert ev is not None
    return ev


def _bluestein(device: CLDevice, p: _Transform, x: Operand, y: Operand, batch: int, inverse: bool,
               scale: float, queue: CLQueue | None) -> Event:
    assert p.sub is not None and p.chirp is not None and p.filt is not None
    n, m, dt = p.n, p.m, p.dtype
    chirp, filt = p.chirp[int(inverse)], p.filt[int(inverse)]
    a = layout.empty(device, (batch, m), dt)
    spec = layout.empty(device, (batch, m), dt)
    device.launch(_kernel(device, dt, "bluestein_pre"), *_sizes(device, m, batch),
                  [a.buffer, x.buffer, np.int64(x.offset), chirp, np.int64(n), np.int64(m)],
                  reads=[x.buffer, chirp], writes=[a.buffer], queue=queue,
                  name="fft_bluestein_pre")
    _run(device, p.sub, a, spec, batch, False, 1.0, queue)
    device.launch(_kernel(device, dt, "pointwise_mul"), *_sizes(device, m, batch),
                  [spec.buffer, filt, np.int64(m)], reads=[filt], writes=[spec.buffer],
                  queue=queue, name="fft_bluestein_mul")
    _run(device, p.sub, spec, a, batch, True, 1.0, queue)
    return device.launch(_kernel(device, dt, "bluestein_post"), *_sizes(device, n, batch),
                         [y.buffer, np.int64(y.offset), a.buffer, chirp, np.int64(n),
                          np.int64(m), _real(dt, scale)],
                         reads=[a.buffer, chirp], writes=[y.buffer], queue=queue,
                         name="fft_bluestein_post")


_HALF_TWIDDLES: dict[tuple[int, int, str], Buffer] = {}


def _half_twiddles(device: CLDevice, n: int, dtype: str) -> Buffer:
    """w^k for k <= n/2, w = exp(-2 pi i / n) (rfft's last step), once per device and n."""
    key = (id(device), n, dtype)
    tw = _HALF_TWIDDLES.get(key)
    if tw is None:
        with _LOCK:
            tw = _HALF_TWIDDLES.get(key)
            if tw is None:
                tw = _HALF_TWIDDLES[key] = _upload(
                    device, np.exp(-2j * np.pi * np.arange(n // 2 + 1) / n), dtype)
    return tw


def rfft(device: CLDevice, x: Operand, y: Operand, *, scale: float = 1.0,
         queue: CLQueue | None = None) -> Event:
    """Real-to-complex FFT: ``x`` (batch, n) float, ``y`` (batch, n//2+1) complex. An even
    ``n`` takes the transform of n/2 points of the rows' (even, odd) pairs read as complex
    values, and one step that makes the half spectrum from it."""
    batch, n = layout.fft_rows(x)
    _check(x, "input")
    cdt = layout.COMPLEX_OF[x.dtype]
    if n % 2 == 0 and n >= 4 and batch > 0:
        # PERF (H200, 2^24 float32): through the complex transform of n points, 3.3 ms of
        # device time against CuPy's 0.18
        m, rdt = n // 2, layout.REAL_OF[cdt]
        src = x.with_shape((batch, n), (n, 1))
        if src.dtype != rdt or src.offset % 2:
            src = layout.contiguous(device, src, rdt, queue=queue)
        pairs = Operand(src.buffer, (batch, m), cdt, (m, 1), src.offset // 2)
        spec = layout.empty(device, (batch, m), cdt)
        fft(device, pairs, spec, queue=queue)
        tw = _half_twiddles(device, n, cdt)
        return device.launch(_kernel(device, cdt, "rfft_post"), *_sizes(device, m + 1, batch),
                             [y.buffer, np.int64(y.offset), spec.buffer, np.int64(m), tw,
                              _real(cdt, scale)],
                             reads=[spec.buffer, tw], writes=[y.buffer], queue=queue,
                             name="fft_rfft_post")
    full = layout.contiguous(device, x.with_shape((batch, n), (n, 1)), cdt, queue=queue)
    spec = layout.empty(device, (batch, n), cdt)
    fft(device, full, spec, scale=scale, queue=queue)
    half = n // 2 + 1
    return layout.copy(device, spec.with_shape((batch, half), (n, 1)),
                       y.with_shape((batch, half), (half, 1)), queue=queue)


def irfft(device: CLDevice, x: Operand, y: Operand, *, scale: float = 1.0,
          queue: CLQueue | None = None) -> Event:
    """Complex-to-real inverse FFT: ``x`` (batch, n//2+1) complex, ``y`` (batch, n) float.
    Unnormalized like :func:`fft`; the imaginary parts of the DC and Nyquist terms are
    ignored."""
    batch, n = layout.fft_rows(y)
    _check(x, "input")
    _check(y, "output")
    half = n // 2 + 1
    if x.size != batch * half:
        raise ValueError(f"irfft: input {x.shape} should be ({batch}, {half}) for n={n}")
    cdt = x.dtype
    if batch == 0 or n == 0:
        return queue_of(device, queue).marker()
    full = layout.empty(device, (batch, n), cdt)
    device.launch(_kernel(device, cdt, "hermitian_extend"), *_sizes(device, n, batch),
                  [full.buffer, x.buffer, np.int64(x.offset), np.int64(n), np.int64(half)],
                  reads=[x.buffer], writes=[full.buffer], queue=queue, name="fft_hermitian")
    out = layout.empty(device, (batch, n), cdt)
    fft(device, full, out, inverse=True, scale=scale, queue=queue)
    return layout.copy(device, out, y.with_shape((batch, n), (n, 1)), real_part=True,
                       queue=queue)


def hermitian_clean(device: CLDevice, x: Operand, n: int,
                    queue: CLQueue | None = None) -> Event:
    """Zero, in place, the imaginary parts of the DC and Nyquist terms of the half spectra in
    ``x`` (batch, n//2+1), which numpy's ``irfft`` ignores and some libraries do not."""
    batch, half = layout.fft_rows(x)
    return device.launch(_kernel(device, x.dtype, "hermitian_clean"), (batch,), None,
                         [x.buffer, np.int64(x.offset), np.int64(n), np.int64(half)],
                         writes=[x.buffer], queue=queue, name="fft_hermitian_clean")


def run(op: str, device: CLDevice, x: Operand, y: Operand, *, inverse: bool = False,
        scale: float = 1.0, queue: CLQueue | None = None) -> Event:
    """``fft``, ``rfft`` or ``irfft`` by name (``inverse`` applies to ``fft`` only)."""
    if op == "fft":
        return fft(device, x, y, inverse=inverse, scale=scale, queue=queue)
    if op == "rfft":
        return rfft(device, x, y, scale=scale, queue=queue)
    if op == "irfft":
        return irfft(device, x, y, scale=scale, queue=queue)
    raise ValueError(f"unknown FFT op {op!r}")


def scratch_call(op: str, device: CLDevice, dtype: str,
                 shape_key: tuple[int, ...]) -> Callable[[], Event]:
    """A call of ``op`` on zeroed scratch buffers of ``shape_key`` (batch, n), for timing."""
    x, y = layout.fft_scratch(device, op, dtype, shape_key)
    return lambda: run(op, device, x, y)


def cost(op: str, device: CLDevice, dtype: str, shape_key: tuple[int, ...]) -> float:
    """Seconds one call of the fallback takes (see :func:`clops.providers.measure`)."""
    return measure(scratch_call(op, device, dtype, shape_key), device)


def flops(n: int, batch: int = 1) -> float:
    """The conventional FFT flop count, 5 n log2 n per row."""
    return 5.0 * n * math.log2(max(n, 2)) * batch
