"""Kernels, relayout: on-device strided copies that turn an operand a provider cannot take
into one it can (contiguous, offset 0), convert element types, pad, crop and roll. Nothing
here goes through the host."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..runtime import interop
from .launch import source
from .operand import ITEMSIZE, Operand, contiguous_strides, queue_of

if TYPE_CHECKING:
    from ..runtime import Kernel
    from ..runtime.device import CLDevice, CLQueue
    from ..runtime.events import Event

MAX_DIMS = 8

# dtype name -> (OpenCL C value type, real component type)
CL_TYPES: dict[str, tuple[str, str]] = {
    "bool": ("uchar", "float"), "int8": ("char", "float"), "uint8": ("uchar", "float"),
    "int16": ("short", "float"), "uint16": ("ushort", "float"), "int32": ("int", "float"),
    "uint32": ("uint", "float"), "int64": ("long", "float"), "uint64": ("ulong", "float"),
    "bfloat16": ("ushort", "float"), "float32": ("float", "float"),
    "float64": ("double", "double"), "complex64": ("float2", "float"),
    "complex128": ("double2", "double"),
}
COMPLEX_OF = {"float32": "complex64", "float64": "complex128", "float16": "complex64",
              "complex64": "complex64", "complex128": "complex128"}
REAL_OF = {"complex64": "float32", "complex128": "float64", "float32": "float32",
           "float64": "float64", "float16": "float32"}


def _is_complex(dtype: str) -> bool:
    return dtype.startswith("complex")


def _options(dst: str, src: str, conj: bool, real_part: bool) -> tuple[str, ...]:
    """Build options of the copy kernel from ``src`` to ``dst`` elements."""
    opts: list[str] = []
    if dst == "float16" and src == "float16":
        dst_t = src_t = "ushort"  # a bit copy needs no half support
        real_t = "float"
    else:
        if dst == "float16":
            dst_t, real_t = "half", "float"
            opts.append("-D STORE(p,i,v)=vstore_half((v),(i),(p))")
            opts.append("-D ZERO=0.0f")
        else:
            dst_t, real_t = CL_TYPES[dst]
        if src == "float16":
            src_t = "half"
            opts.append("-D LOAD(p,i)=vload_half((i),(p))")
        else:
            src_t = CL_TYPES[src][0]
        value_dst = "float" if dst == "float16" else dst_t
        value_src = "float" if src == "float16" else src_t
        conv = _convert(value_dst, value_src, dst, src, conj, real_part)
        if conv:
            opts.append(f"-D CONVERT(V)={conv}")
    if dst_t == "half":
        opts.append("-D NO_SCALE")  # half is storage only: no arithmetic on it
    if "double" in (dst_t, src_t, real_t):
        opts.append("-D USE_FP64")
    opts += [f"-D DST_T={dst_t}", f"-D SRC_T={src_t}", f"-D REAL_T={real_t}"]
    return tuple(opts)


def _convert(vdst: str, vsrc: str, dst: str, src: str, conj: bool, real_part: bool) -> str:
    cd, cs = _is_complex(dst), _is_complex(src)
    # NOTE: the macro parameter is V, not x: ".x" would be replaced too.
    if cs and conj:
        x = f"(({vsrc})((V).x,-(V).y))"
    else:
        x = "(V)"
    if cd and cs:
        return x if vdst == vsrc else f"convert_{vdst}({x})"
    if cd and not cs:
        real = vdst[:-1]  # float2 -> float
        return f"(({vdst})(({real})(V),({real})0))"
    if cs and not cd:
        if not real_part:
            raise TypeError(f"cannot copy {src} into {dst} (a real array): ask for the real part")
        return f"(({vdst})({x}.x))"
    return "" if vdst == vsrc else f"(({vdst})(V))"


def _kernel(device: CLDevice, name: str, options: tuple[str, ...]) -> Kernel:
    """The kernel ``name`` of ``layout.cl`` built with ``options`` (cached by the device)."""
    return device.kernel(source("layout"), name, options)


def _collapse(shape: list[int], dst: list[int], src: list[int], rot: list[int],
              valid: list[int]) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """Merge adjacent dims that are contiguous in both operands (and neither rolled nor padded),
    and drop dims of size 1, so that any rank fits the kernel's 8 dims when it can."""
    keep = [i for i, n in enumerate(shape) if n != 1]
    s = [shape[i] for i in keep]
    d = [dst[i] for i in keep]
    r = [src[i] for i in keep]
    ro = [rot[i] for i in keep]
    va = [valid[i] for i in keep]
    i = len(s) - 1
    while i > 0:
        plain = ro[i] == 0 and ro[i - 1] == 0 and va[i] >= s[i] and va[i - 1] >= s[i - 1]
        if plain and d[i - 1] == d[i] * s[i] and r[i - 1] == r[i] * s[i]:
            s[i - 1] *= s[i]
            d[i - 1], r[i - 1] = d[i], r[i]
            va[i - 1] = s[i - 1]
            for lst in (s, d, r, ro, va):
                del lst[i]
        i -= 1
    return s, d, r, ro, va


def copy(device: CLDevice, src: Operand, dst: Operand, *, rot: Sequence[int] | None = None,
         valid: Sequence[int] | None = None, conj: bool = False, real_part: bool = False,
         queue: CLQueue | None = None) -> Event:
    """``dst[i] = convert(src[(i + rot) % shape])`` over ``dst.shape``, zero where the source
    index passes ``valid`` (a per-dim extent of ``src``; padding). ``conj`` conjugates complex
    elements, ``real_part`` takes the real part into a real ``dst``.

    >>> copy(dev, a.with_shape((3, 2), (1, 3)), out)  # a transpose, on the device
    """
    shape = [int(n) for n in dst.shape]
    nd = len(shape)
    if len(src.shape) != nd:
        raise ValueError(f"copy: source rank {len(src.shape)} != destination rank {nd}")
    rot_l = [int(r) for r in rot] if rot is not None else [0] * nd
    valid_l = ([int(v) for v in valid] if valid is not None
               else [min(int(a), int(b)) for a, b in zip(src.shape, shape)])
    for d in range(nd):
        if valid is None and src.shape[d] < shape[d]:
            raise ValueError(f"copy: source shape {src.shape} is smaller than {tuple(shape)}; "
                             "pass valid= to pad")
        valid_l[d] = min(valid_l[d], src.shape[d])
    total = math.prod(shape)
    q = queue_of(device, queue)
    if total == 0:
        return q.marker()
    s, dstr, sstr, ro, va = _collapse(shape, list(dst.strides), list(src.strides), rot_l,
                                      valid_l)
    if len(s) > MAX_DIMS:
        raise ValueError(f"copy: {len(s)} non-mergeable dims; at most {MAX_DIMS} are supported")
    pad = MAX_DIMS - len(s)
    s, dstr, sstr = [1] * pad + s, [0] * pad + dstr, [0] * pad + sstr
    ro, va = [0] * pad + ro, [1] * pad + va

    def l8(v: list[int]) -> np.ndarray:
        return interop.vector_arg("long", v)

    kern = _kernel(device, "strided_copy", _options(dst.dtype, src.dtype, conj, real_part))
    args = [dst.buffer, np.int64(dst.offset), src.buffer, np.int64(src.offset), l8(s), l8(dstr),
            l8(sstr), l8(ro), l8(va), np.int64(total)]
    reads = [src.buffer] if src.buffer is not dst.buffer else []
    return device.launch(kern, (total,), None, args, reads=reads, writes=[dst.buffer],
                         queue=q, name="relayout")


def contiguous(device: CLDevice, src: Operand, dtype: str | None = None,
               queue: CLQueue | None = None) -> Operand:
    """A new contiguous operand (offset 0) with ``src``'s values, converted to ``dtype``."""
    dt = dtype or src.dtype
    buf = device.alloc(max(src.size, 1) * ITEMSIZE[dt])
    out = Operand(buf, src.shape, dt, contiguous_strides(src.shape), 0)
    copy(device, src, out, queue=queue, real_part=_is_complex(src.dtype) and not _is_complex(dt))
    return out


def empty(device: CLDevice, shape: Sequence[int], dtype: str) -> Operand:
    """A new contiguous operand from the pool."""
    shape = tuple(int(n) for n in shape)
    buf = device.alloc(max(math.prod(shape), 1) * ITEMSIZE[dtype])
    return Operand(buf, shape, dtype, contiguous_strides(shape), 0)


def zero(device: CLDevice, op: Operand, queue: CLQueue | None = None) -> Event:
    """Fill the elements of ``op`` (any strides) with zeros."""
    return copy(device, op, op, valid=[0] * op.ndim, queue=queue)


def scale(device: CLDevice, y: Operand, factor: float, queue: CLQueue | None = None) -> Event:
    """``y *= factor`` in place on a contiguous float or complex operand."""
    if not y.is_contiguous:
        raise ValueError("scale: the operand must be contiguous")
    real_t = CL_TYPES[y.dtype][1]
    kern = _kernel(device, "scale", _options(y.dtype, y.dtype, False, False))
    f = np.float64(factor) if real_t == "double" else np.float32(factor)
    total = y.size
    if total == 0:
        return queue_of(device, queue).marker()
    return device.launch(kern, (total,), None, [y.buffer, np.int64(y.offset), f, np.int64(total)],
                         writes=[y.buffer], queue=queue, name="scale")


def fft_scratch(device: CLDevice, op: str, dtype: str,
                shape_key: tuple[int, ...]) -> tuple[Operand, Operand]:
    """Zeroed input and empty output operands of an FFT ``op`` over ``shape_key`` (batch, n),
    for timing a call."""
    batch, n = shape_key
    real = REAL_OF[dtype]
    shapes = {"fft": ((batch, n), dtype, (batch, n), dtype),
              "rfft": ((batch, n), real, (batch, n // 2 + 1), dtype),
              "irfft": ((batch, n // 2 + 1), dtype, (batch, n), real)}[op]
    x = empty(device, shapes[0], shapes[1])
    device.write(x.buffer, np.zeros(x.nbytes, np.uint8))
    return x, empty(device, shapes[2], shapes[3])


def fft_rows(op: Operand) -> tuple[int, int]:
    """(batch, n) of an FFT operand: (n,) or (batch, n)."""
    if op.ndim == 1:
        return 1, op.shape[0]
    if op.ndim != 2:
        raise ValueError(f"FFT operands are (batch, n); got shape {op.shape}")
    return op.shape[0], op.shape[1]
