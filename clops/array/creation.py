"""Array layer, creation functions: asarray from host data, and arrays made on the device
(empty, zeros, ones, full, arange, linspace, eye, tril/triu, meshgrid, *_like)."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import runtime
from ..graph import dtypes as _dt
from ..graph import ir
from ..graph.dtypes import DType
from ..graph.ir import View, prod
from ._ops import OPS, register
from .elementwise import _check_device_dtype, broadcast_node
from .interop import from_pyopencl, is_pyopencl_array
from .tensor import MAX_SIZE, Tensor, as_shape, same_device, spec_sequence


def _device(device: Any) -> runtime.CLDevice:
    return runtime.device(device)


USM_TYPES = ("device", "host", "shared")


def _usm(usm_type: Any) -> str | None:
    if usm_type is None or usm_type in USM_TYPES:
        return usm_type  # type: ignore[no-any-return]
    raise ValueError(f"usm_type={usm_type!r}: one of {list(USM_TYPES)} (device memory, host "
                     "memory the device reads, or shared virtual memory)")


def _in(t: Tensor, usm_type: str | None) -> Tensor:
    """``t`` in memory of kind ``usm_type`` (None: as it is; new tensors are in device memory):
    its graph is computed straight into a buffer of that kind."""
    if usm_type is None:
        return t
    node = t._node.resolve()
    if node.op == "load" and node.arg[0].kind == usm_type:
        return t
    buf = t.device.alloc(max(prod(t.shape) * t.dtype.itemsize, 1), usm_type)
    out = Tensor(ir.load(buf, View.contiguous(t.shape), t.dtype), t.device)
    out._assign(t)
    return out


def _usm_of(x: Tensor) -> str | None:
    """The memory kind of ``x`` where it is computed (``*_like`` keep it), else None."""
    node = x._node.resolve()
    return node.arg[0].kind if node.op == "load" and node.arg[0].kind != "device" else None


def _shape(shape: int | Sequence[int], what: str) -> tuple[int, ...]:
    return as_shape(shape, what)


def _count(n: Any, what: str, arg: str) -> int:
    """A non-negative integer argument (a number of rows, columns or elements), checked."""
    try:
        v = operator.index(n)
    except TypeError:
        raise TypeError(f"{what}: {arg} must be an integer, not {type(n).__name__}") from None
    if v < 0:
        raise ValueError(f"{what}: {arg} must be >= 0 (negative dimensions are not allowed), "
                         f"got {v}")
    if v > MAX_SIZE:
        raise ValueError(f"{what}: {arg} {v} is too big (more than {MAX_SIZE}, int64)")
    return v


def _host_dtype(arr: np.ndarray, from_python: bool) -> DType:
    if arr.dtype == np.float64 and from_python:
        return _dt.float32
    if arr.dtype == np.complex128 and from_python:
        return _dt.complex64
    if arr.dtype.kind in "OUS":
        raise TypeError(f"cannot make a tensor from {arr.dtype} data; give numbers")
    return _dt.to_dtype(arr.dtype)


def to_host_bits(arr: np.ndarray, d: DType) -> np.ndarray:
    """A private host array in the dtype's storage format (bfloat16 as rounded uint16 bits).
    Never a view of ``arr``: uploads are asynchronous, and the caller may change ``arr`` as soon
    as they return."""
    if d.name == "bfloat16":
        f = np.ascontiguousarray(arr, dtype=np.float32)
        u = f.view(np.uint32).astype(np.uint64)
        bits = ((u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1)))
                >> np.uint64(16)).astype(np.uint16)
        bits[np.isnan(f)] = 0x7FC0
        return bits
    if d.kind == "b":
        return np.array(arr, dtype=np.uint8, order="C", copy=True)
    return np.array(arr, dtype=d.np, order="C", copy=True)


@register
def asarray(obj: Any, /, *, dtype: Any = None, device: Any = None, copy: bool | None = None,
            usm_type: str | None = None) -> Tensor:
    """A tensor from a Tensor, numpy array, Python scalar, nested sequence or buffer, in memory
    of kind ``usm_type``: ``"device"`` (the default for new data), ``"host"`` (host memory the
    device reads; numpy reads it in place where the device shares the host's memory) or
    ``"shared"`` (shared virtual memory, where the device has it).

    >>> clops.asarray([1, 2, 3]).dtype
    clops.int64
    """
    kind = _usm(usm_type)
    if isinstance(obj, Tensor) and kind is not None and (_usm_of(obj) or "device") != kind:
        if copy is False:
            raise ValueError(f"asarray: memory of kind {kind!r} needs a copy, but copy=False")
        return _in(asarray(obj, dtype=dtype, device=device), kind)
    if isinstance(obj, Tensor):
        d = _dt.to_dtype(dtype) if dtype is not None else obj.dtype
        dev = _device(device) if device is not None else obj.device
        out = obj
        if dev is not obj.device:
            out = obj.to_device(dev)
        if d != out.dtype:
            if copy is False:
                raise ValueError("asarray: a dtype change needs a copy, but copy=False")
            return OPS.astype(out, d)
        if copy:
            return Tensor(ir.ew("identity", [out._node.resolve()], out.dtype), out.device)
        return out
    if is_pyopencl_array(obj):
        out = from_pyopencl(obj, device)
        if dtype is not None and _dt.to_dtype(dtype) != out.dtype:
            return OPS.astype(out, dtype)
        return asarray(out, copy=copy) if copy else out
    if copy is False:
        raise ValueError("asarray: host data cannot be used without a copy (copy=False); "
                         "clops.from_host(a, copy=False) uses a numpy array's own memory on a "
                         "device that shares the host's")
    dev = _device(device)
    if hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray):
        obj = np.from_dlpack(obj)
    from_python = not isinstance(obj, np.ndarray | np.generic)
    if from_python and _nested_has_tensor(obj):
        obj = _nested_to_host(obj)
    if isinstance(obj, bool | int) and not isinstance(obj, np.generic) and dtype is None:
        d = _dt.bool_ if isinstance(obj, bool) else _dt.int64
        arr = np.asarray(obj, dtype=d.np)
    else:
        try:
            arr = np.asarray(obj)
        except (ValueError, TypeError) as e:
            raise TypeError(f"cannot make a tensor from {type(obj).__name__}: {e}") from None
        d = _dt.to_dtype(dtype) if dtype is not None else _host_dtype(arr, from_python)
        if from_python and d.kind in "iu" and arr.dtype.kind in "fO":
            # NOTE: Python ints past int64 beside others infer float64 (or object), which loses
            # digits: convert the Python values to the integer dtype directly
            try:
                arr = np.asarray(obj, dtype=d.np)
            except OverflowError:
                raise OverflowError(f"values do not fit {d}") from None
            except (ValueError, TypeError):
                pass
        if from_python and d.is_int and arr.dtype.kind in "iu":
            info = np.iinfo(d.np)
            if arr.size and (arr.min() < info.min or arr.max() > info.max):
                raise OverflowError(f"values do not fit {d}")
    _check_device_dtype(dev, d)
    if d.kind in "iub" and arr.dtype.kind == "c":
        raise TypeError(f"cannot convert complex data to {d}")
    host = to_host_bits(arr, d)
    buf = dev.alloc(host.nbytes, kind or "device")
    if host.nbytes:
        dev.write(buf, host)
    return Tensor(ir.load(buf, View.contiguous(arr.shape), d), dev)


def _nested_has_tensor(obj: Any) -> bool:
    if isinstance(obj, Tensor):
        return True
    if isinstance(obj, list | tuple):
        return any(_nested_has_tensor(o) for o in obj)
    return False


def _nested_to_host(obj: Any) -> Any:
    if isinstance(obj, Tensor):
        return obj.to_numpy()
    if isinstance(obj, list | tuple):
        return [_nested_to_host(o) for o in obj]
    return obj


def _dtype_or(dtype: Any, default: DType) -> DType:
    return _dt.to_dtype(dtype) if dtype is not None else default


def empty(shape: int | Sequence[int], *, dtype: Any = None, device: Any = None,
          usm_type: str | None = None) -> Tensor:
    """An uninitialized tensor (memory from the pool, of kind ``usm_type``: see asarray)."""
    dev = _device(device)
    d = _dtype_or(dtype, _dt.float32)
    _check_device_dtype(dev, d)
    s = _shape(shape, "empty")
    buf = dev.alloc(prod(s) * d.itemsize, _usm(usm_type) or "device")
    return Tensor(ir.load(buf, View.contiguous(s), d), dev)


def full(shape: int | Sequence[int], fill_value: Any, *, dtype: Any = None,
         device: Any = None, usm_type: str | None = None) -> Tensor:
    """A tensor of ``fill_value`` (computed on the device, in memory of kind ``usm_type``)."""
    kind = _usm(usm_type)
    dev = _device(device)
    shp = _shape(shape, "full")
    if dtype is None:
        if isinstance(fill_value, Tensor):
            d = fill_value.dtype
        elif isinstance(fill_value, bool):
            d = _dt.bool_
        elif isinstance(fill_value, int):
            d = _dt.int64
        elif isinstance(fill_value, float):
            d = _dt.float32
        elif isinstance(fill_value, complex):
            d = _dt.complex64
        else:
            d = _dt.to_dtype(np.asarray(fill_value).dtype)
    else:
        d = _dt.to_dtype(dtype)
    _check_device_dtype(dev, d)
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    if d.is_int and not isinstance(fill_value, bool):
        info = np.iinfo(d.np)
        if isinstance(fill_value, int) and not info.min <= fill_value <= info.max:
            raise OverflowError(f"fill value {fill_value} does not fit {d}")
    if prod(shp) == 0:  # nothing to compute (and no kernel over a huge empty extent)
        return empty(shp, dtype=d, device=dev, usm_type=kind)
    out = Tensor(ir.ew("identity", [ir.const(fill_value, d, shp)], d), dev)
    return _in(out, kind).realize()


def zeros(shape: int | Sequence[int], *, dtype: Any = None, device: Any = None,
          usm_type: str | None = None) -> Tensor:
    d = _dtype_or(dtype, _dt.float32)
    return full(_shape(shape, "zeros"), False if d.kind == "b" else 0, dtype=d, device=device,
                usm_type=usm_type)


def ones(shape: int | Sequence[int], *, dtype: Any = None, device: Any = None,
         usm_type: str | None = None) -> Tensor:
    d = _dtype_or(dtype, _dt.float32)
    return full(_shape(shape, "ones"), True if d.kind == "b" else 1, dtype=d, device=device,
                usm_type=usm_type)


# The *_like functions keep x's memory kind unless usm_type says otherwise (as dpctl does).
def empty_like(x: Tensor, /, *, dtype: Any = None, device: Any = None,
               usm_type: str | None = None) -> Tensor:
    return empty(x.shape, dtype=dtype or x.dtype, device=device or x.device,
                 usm_type=usm_type or _usm_of(x))


def zeros_like(x: Tensor, /, *, dtype: Any = None, device: Any = None,
               usm_type: str | None = None) -> Tensor:
    return zeros(x.shape, dtype=dtype or x.dtype, device=device or x.device,
                 usm_type=usm_type or _usm_of(x))


def ones_like(x: Tensor, /, *, dtype: Any = None, device: Any = None,
              usm_type: str | None = None) -> Tensor:
    return ones(x.shape, dtype=dtype or x.dtype, device=device or x.device,
                usm_type=usm_type or _usm_of(x))


def full_like(x: Tensor, /, fill_value: Any, *, dtype: Any = None, device: Any = None,
              usm_type: str | None = None) -> Tensor:
    return full(x.shape, fill_value, dtype=dtype or x.dtype, device=device or x.device,
                usm_type=usm_type or _usm_of(x))


def from_host(a: np.ndarray, /, *, copy: bool = True, device: Any = None) -> Tensor:
    """A tensor of a numpy array's values. ``copy=False`` uses the array's own memory
    (``CL_MEM_USE_HOST_PTR``; the tensor keeps the array alive, and each sees the other's
    writes once pending work is done), where the device shares the host's memory (CPUs,
    integrated GPUs); elsewhere it raises BufferError. ``copy=True`` copies into host memory.

    >>> a = np.zeros(4, np.float32); t = clops.from_host(a, copy=False)
    """
    if not isinstance(a, np.ndarray):
        raise TypeError(f"from_host takes a numpy array, not {type(a).__name__}")
    if copy:
        return asarray(a, device=device, usm_type="host")
    dev = _device(device)
    d = _dt.to_dtype(a.dtype)
    if a.dtype != d.np and not (d.kind == "b" and a.dtype == np.bool_):
        raise TypeError(f"from_host(copy=False): {a.dtype} is stored differently on the device "
                        "(bfloat16 and others): use copy=True")
    _check_device_dtype(dev, d)
    if a.size == 0:
        return empty(a.shape, dtype=d, device=dev, usm_type="host")
    buf = dev.wrap_host(a)
    return Tensor(ir.load(buf, View.contiguous(a.shape), d), dev)


def arange(start: Any, /, stop: Any = None, step: Any = 1, *, dtype: Any = None,
           device: Any = None, usm_type: str | None = None) -> Tensor:
    """``start, start + step, ...`` below ``stop``, computed on the device."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("arange: step must not be 0")
    is_float = any(isinstance(v, float) for v in (start, stop, step))
    d = _dtype_or(dtype, _dt.float32 if is_float else _dt.int64)
    if all(isinstance(v, int) for v in (start, stop, step)):
        n = max(0, -((start - stop) // step))  # exact for Python ints of any size
    else:
        q = (stop - start) / step
        if not math.isfinite(q):
            raise ValueError(f"arange: start={start!r}, stop={stop!r}, step={step!r} give no "
                             "finite number of elements")
        n = max(0, math.ceil(q))
    if n > MAX_SIZE:
        raise ValueError(f"arange: start={start!r}, stop={stop!r}, step={step!r} give {n} "
                         f"elements, more than {MAX_SIZE} (int64)")
    dev = _device(device)
    _check_device_dtype(dev, d)
    md = d if d.kind in "fc" else _dt.int64
    if d == _dt.uint64 and not is_float:
        # NOTE: values past int64 (2**63 and up) are computed in uint64, modulo 2**64, where a
        # negative step is its two's complement; every value must be a uint64
        last = start + (n - 1) * step if n else start
        if min(start, last) < 0 or max(start, last) >= 2**64:
            raise OverflowError(f"arange: start={start!r}, stop={stop!r}, step={step!r} give "
                                "values outside uint64 (0 to 2**64 - 1)")
        md, start, step = _dt.uint64, start % 2**64, step % 2**64
    idx = ir.cast(ir.iota(0, (n,), _dt.int64), md)
    node = ir.ew("add", [ir.ew("multiply", [idx, ir.const(step, md, (n,))], md),
                         ir.const(start, md, (n,))], md)
    return _in(Tensor(ir.cast(node, d), dev), _usm(usm_type)).realize()


def linspace(start: Any, stop: Any, /, num: int, *, dtype: Any = None, device: Any = None,
             endpoint: bool = True, usm_type: str | None = None) -> Tensor:
    """``num`` evenly spaced values from ``start`` to ``stop``."""
    is_c = isinstance(start, complex) or isinstance(stop, complex)
    d = _dtype_or(dtype, _dt.complex64 if is_c else _dt.float32)
    num = _count(num, "linspace", "num")
    dev = _device(device)
    _check_device_dtype(dev, d)
    div = (num - 1) if endpoint else num
    step = (stop - start) / div if div > 0 else 0
    md = d
    if d.kind in "iub":
        # NOTE: integer results: exact integer steps in 64-bit integers (unsigned arithmetic wraps,
        # so a negative uint64 step is its residue); otherwise floats, floored (as numpy 2)
        span = stop - start
        if isinstance(start, int) and isinstance(stop, int) and (div == 0 or span % div == 0):
            md = _dt.uint64 if d.name == "uint64" else _dt.int64
            step = (span // div if div > 0 else 0) % 2**64
            if md is _dt.int64 and step >= 2**63:
                step -= 2**64
        else:
            md = _dt.float64 if dev.caps.fp64 else _dt.float32
    idx = ir.cast(ir.iota(0, (num,), _dt.int64), md)
    node = ir.ew("add", [ir.ew("multiply", [idx, ir.const(step, md, (num,))], md),
                         ir.const(start, md, (num,))], md)
    if d.kind in "iub" and md.kind == "f":
        node = ir.ew("floor", [node], md)
    out = _in(Tensor(ir.cast(node, d), dev), _usm(usm_type)).realize()
    if endpoint and num > 1:
        out[num - 1] = stop  # exact end point
    return out


def eye(n_rows: int, n_cols: int | None = None, /, *, k: int = 0, dtype: Any = None,
        device: Any = None, usm_type: str | None = None) -> Tensor:
    """Ones on the ``k``-th diagonal."""
    rows = _count(n_rows, "eye", "n_rows")
    m = rows if n_cols is None else _count(n_cols, "eye", "n_cols")
    d = _dtype_or(dtype, _dt.float32)
    dev = _device(device)
    _check_device_dtype(dev, d)
    shape = as_shape((rows, m), "eye", "(n_rows, n_cols)")
    if prod(shape) == 0:
        return empty(shape, dtype=d, device=dev, usm_type=usm_type)
    k = _clamp_diagonal(_index(k, "eye", "k"), shape)
    i = ir.iota(0, shape, _dt.int64)
    j = ir.iota(1, shape, _dt.int64)
    cond = ir.ew("equal", [ir.ew("add", [i, ir.const(k, _dt.int64, shape)], _dt.int64), j],
                 _dt.bool_)
    return _in(Tensor(ir.cast(cond, d), dev), _usm(usm_type)).realize()


def _index(k: Any, what: str, arg: str) -> int:
    try:
        return operator.index(k)
    except TypeError:
        raise TypeError(f"{what}: {arg} must be an integer, not {type(k).__name__}") from None


def _clamp_diagonal(k: int, shape: tuple[int, ...]) -> int:
    """A diagonal offset brought into [-rows, cols]: every offset beyond selects what those
    do, and the clamped one fits the int64 kernel argument (k may be any Python int)."""
    return max(-shape[-2], min(int(k), shape[-1]))


def _tri(x: Tensor, k: int, lower: bool) -> Tensor:
    if x.ndim < 2:
        raise ValueError("tril/triu need at least 2 dims")
    shape = x.shape
    k = _clamp_diagonal(_index(k, "tril" if lower else "triu", "k"), shape)
    i = ir.iota(x.ndim - 2, shape, _dt.int64)
    j = ir.iota(x.ndim - 1, shape, _dt.int64)
    ik = ir.ew("add", [i, ir.const(k, _dt.int64, shape)], _dt.int64)
    cond = ir.ew("greater_equal" if lower else "less_equal", [ik, j], _dt.bool_)
    zero = ir.const(0, x.dtype, shape)
    return Tensor(ir.ew("where", [cond, x._node.resolve(), zero], x.dtype), x.device)


def tril(x: Tensor, /, *, k: int = 0) -> Tensor:
    return _tri(x, k, True)


def triu(x: Tensor, /, *, k: int = 0) -> Tensor:
    return _tri(x, k, False)


def meshgrid(*arrays: Tensor, indexing: str = "xy") -> list[Tensor] | tuple[Tensor, ...]:
    """Coordinate grids (views with zero strides; no copies): a list, or a tuple from Array API
    version 2025.12 on."""
    if indexing not in ("xy", "ij"):
        raise ValueError("meshgrid: indexing must be 'xy' or 'ij'")
    if not arrays:
        return spec_sequence([])
    for a in arrays:
        if a.ndim != 1:
            raise ValueError("meshgrid takes 1-d tensors")
    same_device("meshgrid", *arrays)
    dts = {a.dtype for a in arrays}
    if len(dts) > 1:
        raise TypeError("meshgrid: all inputs must have one dtype")
    sizes = [a.shape[0] for a in arrays]
    if indexing == "xy" and len(arrays) >= 2:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    nd = len(arrays)
    for i, a in enumerate(arrays):
        ax = i
        if indexing == "xy" and nd >= 2 and i < 2:
            ax = 1 - i
        shp = [1] * nd
        shp[ax] = a.shape[0]
        node = ir.movement(a._node.resolve(), functools.partial(View.reshape,
                                                                 shape=tuple(shp)))
        out.append(Tensor(broadcast_node(node, tuple(sizes)), a.device))
    return spec_sequence(out)
