"""Array layer, FFT: the Array API ``fft`` extension. Each transform runs along one axis at a
time over contiguous rows: the rows are gathered on the device (axis moved last, cropped or
zero-padded to ``n``, cast to the transform's dtype), transformed by VkFFT when it is chosen
(:mod:`clops.providers`) or by clops' own Stockham kernels, and returned as a view with the
axis back in place. Nothing goes through the host.

>>> x = clops.asarray([1.0, 2.0, 3.0, 4.0])
>>> clops.fft.fft(x)
Tensor([10.+0.j, -2.+2.j, -2.+0.j, -2.-2.j], dtype=complex64, device=opencl:cpu:0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .array import dispatch
from .array.arguments import check_namespace
from .array.tensor import Tensor, axis_int
from .graph import dtypes as _dt
from .kernels import layout
from .kernels.operand import Operand

__all__ = [
    "fft", "fftfreq", "fftn", "fftshift", "hfft", "ifft", "ifftn", "ifftshift", "ihfft",
    "irfft", "irfftn", "rfft", "rfftfreq", "rfftn",
]

_NORMS = ("backward", "ortho", "forward")
_SWAP = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def _scale(norm: str, n: int, inverse: bool) -> float:
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
    if norm == "ortho":
        return 1.0 / math.sqrt(n)
    if (norm == "backward") == inverse:
        return 1.0 / n
    return 1.0


def _check(x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"clops.fft functions take a clops Tensor, got {type(x).__name__}; "
                        "use clops.asarray first")
    return x


def _complex_dtype(d: _dt.DType) -> str:
    if d.kind == "c":
        return d.name
    if d.name == "float64":
        return "complex128"
    return "complex64"  # float32, float16, bfloat16, integers, bool


def _real_dtype(d: _dt.DType) -> str:
    if d.kind == "c":
        raise TypeError(f"this transform takes a real floating-point input, got {d.name}")
    return "float64" if d.name == "float64" else "float32"


def _axis(axis: int, ndim: int) -> int:
    axis = axis_int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a {ndim}-d tensor")
    return axis % ndim


def _rows(x: Tensor, axis: int, n: int, dtype: str, conj: bool = False
          ) -> tuple[Operand, tuple[int, ...]]:
    """Contiguous rows (batch, n) of ``x`` along ``axis`` in ``dtype``, cropped or zero-padded to
    ``n`` (a view when ``x`` is already laid out so), and the shape of the other dims."""
    src = dispatch.operand(x)
    nd = src.ndim
    order = [d for d in range(nd) if d != axis] + [axis]
    others = tuple(src.shape[d] for d in order[:-1])
    view = src.with_shape(tuple(src.shape[d] for d in order),
                          tuple(src.strides[d] for d in order))
    batch = math.prod(others)
    out_shape = others + (n,)
    if view.shape[-1] == n and view.dtype == dtype and not conj and view.is_contiguous:
        return view.with_shape((batch, n), (n, 1)), others
    dev = x.device
    out = layout.empty(dev, out_shape, dtype)
    valid = others + (min(view.shape[-1], n),)
    if batch and n:
        layout.copy(dev, view, out, valid=valid, conj=conj)
    return out.with_shape((batch, n), (n, 1)), others


def _result(x: Tensor, out: Operand, others: tuple[int, ...], axis: int) -> Tensor:
    """The (batch, n) rows as a Tensor of ``x``'s rank with ``axis`` back in place (a view)."""
    n = out.shape[-1]
    shape = others + (n,)
    strides = layout.contiguous_strides(shape)
    nd = len(shape)
    order = [d for d in range(nd) if d != axis] + [axis]
    final_shape = [0] * nd
    final_strides = [0] * nd
    for pos, d in enumerate(order):
        final_shape[d] = shape[pos]
        final_strides[d] = strides[pos]
    return dispatch.tensor(out.with_shape(tuple(final_shape), tuple(final_strides), 0), x.device)


def _checked_axis(x: Tensor, axis: int) -> tuple[Tensor, int]:
    """The checked tensor and its normalized transform axis."""
    x = _check(x)
    if x.ndim == 0:
        raise ValueError("FFTs need at least a 1-d tensor")
    return x, _axis(axis, x.ndim)


def _c2c(x: Tensor, n: int | None, axis: int, norm: str, inverse: bool) -> Tensor:
    x, ax = _checked_axis(x, axis)
    n = x.shape[ax] if n is None else int(n)
    if n < 1:
        raise ValueError(f"invalid number of FFT points {n}; it must be at least 1")
    cdt = _complex_dtype(x.dtype)
    rows, others = _rows(x, ax, n, cdt)
    dev = x.device
    out = layout.empty(dev, rows.shape, cdt)
    if out.size:
        dispatch.fft_rows("fft", dev, rows, out, inverse=inverse, scale=_scale(norm, n, inverse))
    return _result(x, out, others, ax)


def _r2c(x: Tensor, n: int | None, axis: int, norm: str, conj: bool = False) -> Tensor:
    x, ax = _checked_axis(x, axis)
    n = x.shape[ax] if n is None else int(n)
    if n < 1:
        raise ValueError(f"invalid number of FFT points {n}; it must be at least 1")
    rdt = _real_dtype(x.dtype)
    cdt = layout.COMPLEX_OF[rdt]
    rows, others = _rows(x, ax, n, rdt)
    dev = x.device
    out = layout.empty(dev, (rows.shape[0], n // 2 + 1), cdt)
    if out.size:
        dispatch.fft_rows("rfft", dev, rows, out, scale=_scale(norm, n, False))
        if conj:
            res = layout.empty(dev, out.shape, cdt)
            layout.copy(dev, out, res, conj=True)
            out = res
    return _result(x, out, others, ax)


def _c2r(x: Tensor, n: int | None, axis: int, norm: str, conj: bool = False) -> Tensor:
    x, ax = _checked_axis(x, axis)
    n = 2 * (x.shape[ax] - 1) if n is None else int(n)
    if n < 1:
        raise ValueError(f"invalid number of data points {n} for an inverse real FFT; pass n")
    cdt = _complex_dtype(x.dtype)
    rdt = layout.REAL_OF[cdt]
    rows, others = _rows(x, ax, n // 2 + 1, cdt, conj=conj)
    dev = x.device
    out = layout.empty(dev, (rows.shape[0], n), rdt)
    if out.size:
        dispatch.fft_rows("irfft", dev, rows, out, scale=_scale(norm, n, True))
    return _result(x, out, others, ax)


# -- one dimension ------------------------------------------------------------------------------
def fft(x: Tensor, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Tensor:
    """One-dimensional discrete Fourier transform along ``axis``, cropped or zero-padded to
    ``n`` points.

    >>> clops.fft.fft(clops.asarray([1.0, 0.0, 0.0, 0.0]))
    Tensor([1.+0.j, 1.+0.j, 1.+0.j, 1.+0.j], dtype=complex64, device=opencl:cpu:0)
    """
    return _c2c(x, n, axis, norm, inverse=False)


def ifft(x: Tensor, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Tensor:
    """One-dimensional inverse discrete Fourier transform (``1/n`` scaled by default)."""
    return _c2c(x, n, axis, norm, inverse=True)


def rfft(x: Tensor, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Tensor:
    """Transform of a real signal: the ``n//2 + 1`` non-negative frequency terms."""
    return _r2c(x, n, axis, norm)


def irfft(x: Tensor, /, *, n: int | None = None, axis: int = -1,
          norm: str = "backward") -> Tensor:
    """Inverse of :func:`rfft`: ``n`` real points (default ``2 * (m - 1)``) from ``m`` terms."""
    return _c2r(x, n, axis, norm)


def hfft(x: Tensor, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Tensor:
    """Transform of a signal with Hermitian symmetry (given by its first half): real output."""
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
    return _c2r(x, n, axis, _SWAP[norm], conj=True)


def ihfft(x: Tensor, /, *, n: int | None = None, axis: int = -1,
          norm: str = "backward") -> Tensor:
    """Inverse of :func:`hfft`: the half spectrum of a real signal, conjugated and scaled."""
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
    return _r2c(x, n, axis, _SWAP[norm], conj=True)


# -- n dimensions -------------------------------------------------------------------------------
def _axes_sizes(x: Tensor, s: Sequence[int] | None, axes: Sequence[int] | None
                ) -> tuple[list[int], list[int | None]]:
    x = _check(x)
    if axes is None:
        axes_l = list(range(x.ndim)) if s is None else list(range(x.ndim - len(s), x.ndim))
    else:
        axes_l = [_axis(a, x.ndim) for a in axes]
    if len(set(axes_l)) != len(axes_l):
        raise ValueError(f"axes {tuple(axes_l)} repeat an axis")
    if s is None:
        sizes: list[int | None] = [None] * len(axes_l)
    else:
        if len(s) != len(axes_l):
            raise ValueError(f"s {tuple(s)} and axes {tuple(axes_l)} differ in length")
        sizes = [None if v == -1 else int(v) for v in s]
    return axes_l, sizes


def _c2c_n(x: Tensor, s: Sequence[int] | None, axes: Sequence[int] | None, norm: str,
           inverse: bool) -> Tensor:
    axes_l, sizes = _axes_sizes(x, s, axes)
    out = x
    for ax, n in zip(reversed(axes_l), reversed(sizes)):
        out = _c2c(out, n, ax, norm, inverse=inverse)
    if not axes_l:
        out = out.astype(_complex_dtype(x.dtype))
    return out


def fftn(x: Tensor, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
         norm: str = "backward") -> Tensor:
    """n-dimensional discrete Fourier transform over ``axes`` (all by default)."""
    return _c2c_n(x, s, axes, norm, inverse=False)


def ifftn(x: Tensor, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
          norm: str = "backward") -> Tensor:
    """n-dimensional inverse discrete Fourier transform."""
    return _c2c_n(x, s, axes, norm, inverse=True)


def rfftn(x: Tensor, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
          norm: str = "backward") -> Tensor:
    """n-dimensional transform of a real signal; the last axis keeps ``n//2 + 1`` terms."""
    axes_l, sizes = _axes_sizes(x, s, axes)
    if not axes_l:
        raise ValueError("rfftn needs at least one axis")
    out = _r2c(x, sizes[-1], axes_l[-1], norm)
    for ax, n in zip(reversed(axes_l[:-1]), reversed(sizes[:-1])):
        out = _c2c(out, n, ax, norm, inverse=False)
    return out


def irfftn(x: Tensor, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
           norm: str = "backward") -> Tensor:
    """Inverse of :func:`rfftn`; the last axis has ``s[-1]`` (default ``2 * (m - 1)``) points."""
    axes_l, sizes = _axes_sizes(x, s, axes)
    if not axes_l:
        raise ValueError("irfftn needs at least one axis")
    out = x
    for ax, n in zip(axes_l[:-1], sizes[:-1]):
        out = _c2c(out, n, ax, norm, inverse=True)
    return _c2r(out, sizes[-1], axes_l[-1], norm)


# -- helpers ------------------------------------------------------------------------------------
def _freq_dtype(dtype: Any) -> _dt.DType:
    d = _dt.float32 if dtype is None else _dt.to_dtype(dtype)
    if d.kind != "f":
        raise TypeError(f"fftfreq and rfftfreq return real floating-point values; got {d}")
    return d


def fftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, device: Any = None) -> Tensor:
    """Sample frequencies of :func:`fft`: ``[0, 1, ..., -1] / (d * n)``.

    >>> clops.fft.fftfreq(4)
    Tensor([ 0.  ,  0.25, -0.5 , -0.25], dtype=float32, device=opencl:cpu:0)
    """
    import clops

    if n < 1:
        raise ValueError(f"fftfreq needs n >= 1, got {n}")
    dt = _freq_dtype(dtype)
    return clops.asarray(np.fft.fftfreq(n, d).astype(dt.np), dtype=dt, device=device)


def rfftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, device: Any = None) -> Tensor:
    """Sample frequencies of :func:`rfft`: ``[0, 1, ..., n//2] / (d * n)``."""
    import clops

    if n < 1:
        raise ValueError(f"rfftfreq needs n >= 1, got {n}")
    dt = _freq_dtype(dtype)
    return clops.asarray(np.fft.rfftfreq(n, d).astype(dt.np), dtype=dt, device=device)


def _shift(x: Tensor, axes: int | Sequence[int] | None, inverse: bool) -> Tensor:
    x = _check(x)
    if x.ndim == 0:
        return x
    if axes is None:
        axes_l = list(range(x.ndim))
    elif isinstance(axes, int):
        axes_l = [_axis(axes, x.ndim)]
    else:
        axes_l = [_axis(a, x.ndim) for a in axes]
    src = dispatch.operand(x)
    rot = [0] * x.ndim
    for a in axes_l:
        size = x.shape[a]
        if size:
            rot[a] = (size // 2) % size if inverse else (size - size // 2) % size
    dev = x.device
    out = layout.empty(dev, src.shape, src.dtype)
    if out.size:
        layout.copy(dev, src, out, rot=rot)
    return dispatch.tensor(out, dev)


def fftshift(x: Tensor, /, *, axes: int | Sequence[int] | None = None) -> Tensor:
    """Move the zero-frequency term to the centre (a roll by ``n // 2`` along ``axes``)."""
    return _shift(x, axes, inverse=False)


def ifftshift(x: Tensor, /, *, axes: int | Sequence[int] | None = None) -> Tensor:
    """Inverse of :func:`fftshift`."""
    return _shift(x, axes, inverse=True)


# Every function here that takes arrays refuses anything else by name (see array/arguments.py).
check_namespace(globals(), __all__)
