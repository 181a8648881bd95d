"""Array layer, hand-written kernel operations on tensors: prepares contiguous operands through
the lazy graph (casts and index arithmetic fuse there), launches the kernels of
``clops.kernels.gather``, ``scan`` and ``sort`` and wraps their buffers as tensors.
Data-dependent sizes read back one count, nothing more."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..graph import dtypes as _dt
from ..graph import ir
from ..graph.dtypes import DType
from ..graph.ir import View, prod
from ..kernels import gather, scan, sort
from ..runtime import plan as _plan
from .tensor import Tensor, _flush_readers, same_device


def data_dependent(what: str) -> None:
    """``what`` sizes its result by values read back from the device: ``clops.jit`` cannot
    replay that (it refuses, naming the op)."""
    _plan.refuse(f"{what}, whose result's shape depends on the data")


def contiguous(x: Tensor, dtype: DType | None = None) -> Tensor:
    """``x`` (cast to ``dtype``) realized into a C-contiguous buffer (no copy if it is one)."""
    node = x._node.resolve()
    if dtype is not None and dtype != x.dtype:
        node = ir.cast(node, dtype)
    elif node.op == "load" and node.arg[1].is_contiguous:
        return x
    elif node.op == "load" or node.op == "view" or node.op == "const":
        node = ir.ew("identity", [node], node.dtype)
    out = Tensor(node, x.device).realize()
    if not out._load.arg[1].is_contiguous:
        out = Tensor(ir.ew("identity", [out._load], out.dtype), x.device).realize()
    return out


def kernel_dtype(d: DType) -> DType:
    """The dtype a kernel works in: half types in float32, bool as uint8."""
    if d.name in ("float16", "bfloat16"):
        return _dt.float32
    if d.kind == "b":
        return _dt.uint8
    return d


def sort_dtype(d: DType) -> DType:
    """The dtype a sort works in: half types as themselves (the radix sorts move an element's
    bits, so a NaN keeps its payload: a round trip through float32 makes NaNs canonical on
    NVIDIA's driver), bool as uint8."""
    return d if d.name in ("float16", "bfloat16") else kernel_dtype(d)


def new(shape: Sequence[int], dtype: DType, device: object) -> Tensor:
    shape = tuple(int(n) for n in shape)
    buf = device.alloc(max(prod(shape), 1) * dtype.itemsize)  # type: ignore[attr-defined]
    return Tensor(ir.load(buf, View.contiguous(shape), dtype), device)  # type: ignore[arg-type]


def wrap(buf: object, shape: Sequence[int], dtype: DType, device: object,
         strides: Sequence[int] | None = None, offset: int = 0) -> Tensor:
    return Tensor._from_buffer(buf, shape, dtype, device, strides, offset)  # type: ignore


def read_int(t: Tensor, index: int, what: str) -> int:
    """One element of a contiguous int64 tensor, read back to the host (the count that sizes
    the result of ``what``)."""
    data_dependent(what)
    host = np.empty(1, dtype=np.int64)
    t.device.read(host, t.buffer, (t.offset + index) * 8)
    return int(host[0])


def gather_flat(x: Tensor, offsets: Tensor) -> Tensor:
    """``x``'s elements at element offsets (relative to ``x``'s first element in its buffer,
    through its strides) given by the int64 tensor ``offsets``; result has its shape."""
    same_device("gather", x, offsets)
    x = x.realize()
    off = contiguous(offsets, _dt.int64)
    out = new(offsets.shape, x.dtype, x.device)
    gather.gather(x.device, x.dtype.itemsize, out.buffer, 0, x.buffer, x.offset, off.buffer,
              off.offset, off.size)
    return out


def scatter_flat(x: Tensor, offsets: Tensor, values: Tensor, unique: bool = True) -> None:
    """Write ``values`` (shape of ``offsets``) into ``x``'s memory at ``offsets`` (in place).
    Offsets that may repeat (``unique`` False) are sorted first, so that the last write wins
    as in numpy, on every device."""
    same_device("scatter", x, offsets, values)
    x = x.realize()
    off = contiguous(offsets, _dt.int64)
    val = contiguous(values, x.dtype)
    n = off.size
    _flush_readers(x.buffer, exclude=x)
    if unique or n < 2:
        gather.scatter(x.device, x.dtype.itemsize, x.buffer, x.offset, val.buffer, val.offset,
                   off.buffer, off.offset, n)
        return
    keys, perm, _ = sort.sort(x.device, _dt.int64, off.buffer, off.offset, 1, n, False)
    gather.scatter_last(x.device, x.dtype.itemsize, x.buffer, x.offset, val.buffer, val.offset,
                    keys, perm, n)


def scan_last(x: Tensor, op: str, dtype: DType, include_initial: bool = False) -> Tensor:
    """Inclusive scan over the last axis of ``x`` in ``dtype`` (a new contiguous tensor)."""
    kd = kernel_dtype(dtype)
    n = x.shape[-1] if x.ndim else 1
    rows = prod(x.shape[:-1]) if x.ndim else 1
    src = contiguous(x, kd)
    shape = tuple(x.shape[:-1]) + (n + (1 if include_initial else 0),)
    out = new(shape, kd, x.device)
    scan.scan(x.device, kd, op, src.buffer, src.offset, out.buffer, 0, rows, n, include_initial)
    if kd != dtype:
        out = Tensor(ir.cast(out._node.resolve(), dtype), x.device)
    return out


def sort_last(x: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
    """Stable sort over the last axis: (sorted values in ``x``'s dtype, int64 indices)."""
    kd = sort_dtype(x.dtype)
    n = x.shape[-1]
    rows = prod(x.shape[:-1])
    src = contiguous(x, kd)
    keys, idx, P = sort.sort(x.device, kd, src.buffer, src.offset, rows, n, descending)
    strides = tuple(st * P for st in ir.contiguous_strides(x.shape[:-1])) + (1,)
    k = wrap(keys, x.shape, kd, x.device, strides)
    i = wrap(idx, x.shape, _dt.int64, x.device, strides)
    if kd != x.dtype:
        k = Tensor(ir.cast(k._node.resolve(), x.dtype), x.device)
    return k, i


def _flag_positions(flags: Tensor, what: str) -> tuple[Tensor, Tensor, int]:
    """(contiguous bool flags, their inclusive prefix sum as int64, the count read back)."""
    f = contiguous(flags, _dt.bool_)
    n = f.size
    pos = new((n,), _dt.int64, flags.device)
    # the flags are read as uchar by the scan itself, with no int64 copy of them first
    scan.scan(f.device, _dt.int64, "sum", f.buffer, f.offset, pos.buffer, 0, 1, n,
              src_type="uchar")
    return f, pos, read_int(pos, n - 1, what)


def flat_nonzero(flags: Tensor, what: str = "nonzero") -> Tensor:
    """Flat (row-major) positions of the true elements of a bool tensor, as int64 (reads the
    count back to size the result)."""
    if flags.size == 0:
        return new((0,), _dt.int64, flags.device)
    f, pos, count = _flag_positions(flags, what)
    out = new((count,), _dt.int64, flags.device)
    gather.compact_index(flags.device, out.buffer, f.buffer, f.offset, pos.buffer, 0, f.size)
    return out


def compress_rows(x: Tensor, mask: Tensor, what: str) -> Tensor:
    """``x[mask]`` for a bool ``mask`` of ``x``'s leading dims and a C-contiguous ``x``: the
    selected rows packed in order, straight from the mask's prefix sum (reads the count)."""
    same_device(what, x, mask)
    inner = prod(x.shape[mask.ndim:])
    f, pos, count = _flag_positions(mask, what)
    out = new((count,) + tuple(x.shape[mask.ndim:]), x.dtype, x.device)
    if count:
        gather.compress(x.device, x.dtype.itemsize, out.buffer, x.buffer, x.offset, f.buffer,
                        f.offset, pos.buffer, 0, f.size, inner)
    return out


def searchsorted_flat(a: Tensor, v: Tensor, right: bool) -> Tensor:
    """Insertion points (int64, shape of ``v``) of ``v`` in the sorted 1-d ``a``."""
    same_device("searchsorted", a, v)
    d = _dt.promote_types(a.dtype, v.dtype) if a.dtype != v.dtype else a.dtype
    kd = kernel_dtype(d)
    aa = a if a.dtype == kd else contiguous(a, kd)
    aa = aa.realize()
    vv = contiguous(v, kd)
    out = new(v.shape, _dt.int64, a.device)
    sort.searchsorted(a.device, kd, aa.buffer, aa.offset, aa.strides[0] if aa.ndim else 1,
                    aa.shape[0], vv.buffer, vv.offset, out.buffer, vv.size, right)
    return out
