"""Array layer, manipulation: views without copies (reshape, permute_dims, broadcast_to,
expand_dims, squeeze, flip, matrix_transpose) and astype."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..graph import dtypes as _dt
from ..graph import ir
from ..graph.ir import prod
from ..kernels.gather import copy_rows
from ._ops import OPS, register
from .creation import arange, empty
from .elementwise import _check_device_dtype, broadcast_node
from .elementwise import broadcast_shapes as _broadcast
from .kernel_ops import read_int, scan_last, searchsorted_flat
from .tensor import (
    AXIS_TYPES,
    MAX_SIZE,
    Tensor,
    as_shape,
    axis_int,
    check_rank,
    same_device,
    spec_sequence,
)


def normalize_axis(axis: int, ndim: int) -> int:
    axis = axis_int(axis)
    if not -ndim <= axis < max(ndim, 1) or (ndim == 0 and axis not in (0, -1)):
        raise IndexError(f"axis {axis} is out of bounds for a tensor of {ndim} dims")
    return axis % ndim if ndim else 0


def axis_tuple(axis: int | Sequence[int]) -> tuple[int, ...]:
    """``axis`` (an int or a sequence of ints) as a tuple of ints, checked as ``axis_int``."""
    if hasattr(axis, "__index__") and not isinstance(axis, bool):
        return (axis_int(axis),)
    if not isinstance(axis, Sequence) or isinstance(axis, str | bytes):
        raise TypeError(f"{AXIS_TYPES}, not {axis!r} ({type(axis).__name__})")
    return tuple(axis_int(a) for a in axis)


def normalize_axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axis = axis_tuple(axis)
    out = tuple(normalize_axis(a, ndim) for a in axis)
    if len(set(out)) != len(out):
        raise ValueError(f"repeated axis in {axis}")
    return out


@register
def reshape(x: Tensor, /, shape: Sequence[int], *, copy: bool | None = None) -> Tensor:
    """The same elements in a new shape (a view when the strides allow it)."""
    shape = list(as_shape(shape, "reshape", unknown=True))
    if -1 in shape:
        known = prod([n for n in shape if n != -1])
        if known == 0 or x.size % known:
            raise ValueError(f"cannot reshape {x.shape} into {tuple(shape)}")
        shape[shape.index(-1)] = x.size // known
    new = tuple(shape)
    if prod(new) != x.size:
        raise ValueError(f"cannot reshape a tensor of shape {x.shape} ({x.size} elements) "
                         f"into {new}")
    _fits_bytes("reshape", new, x)
    node = x._node.resolve()
    if copy is False and node.op == "load" and node.arg[1].reshape(new) is None:
        raise ValueError("reshape with copy=False: these strides need a copy")
    out = Tensor(ir.movement(node, lambda v: v.reshape(new)), x.device)
    if copy:
        out = Tensor(ir.ew("identity", [out._node.resolve()], x.dtype), x.device)
    return out


@register
def permute_dims(x: Tensor, /, axes: Sequence[int]) -> Tensor:
    axes = tuple(normalize_axis(a, x.ndim) for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"permute_dims: {axes} is not a permutation of {x.ndim} axes")
    return x._move(lambda v: v.permute(axes))


def matrix_transpose(x: Tensor, /) -> Tensor:
    return x.mT


def broadcast_to(x: Tensor, /, shape: Sequence[int]) -> Tensor:
    shape = as_shape(shape, "broadcast_to")
    if _broadcast(x.shape, shape) != shape:
        raise ValueError(f"cannot broadcast shape {x.shape} to {shape}")
    _fits_bytes("broadcast_to", shape, x)
    return Tensor(broadcast_node(x._node.resolve(), shape), x.device)


def _fits_bytes(what: str, shape: tuple[int, ...], x: Tensor) -> None:
    """ValueError where the bytes of ``shape``'s nonzero dimensions of x's dtype pass int64:
    numpy's rule (byte offsets must fit), which counts them even where another dimension is
    0, as in (0, 2**61) of int32."""
    if prod(tuple(n for n in shape if n)) * x.dtype.itemsize > MAX_SIZE:
        raise ValueError(f"{what}: shape {shape} of {x.dtype} is too big: the bytes of its "
                         f"nonzero dimensions exceed {MAX_SIZE} (int64)")


def broadcast_arrays(*arrays: Tensor) -> list[Tensor] | tuple[Tensor, ...]:
    """``arrays`` broadcast to their common shape (views): a list, or a tuple from Array API
    version 2025.12 on."""
    same_device("broadcast_arrays", *arrays)
    shape = _broadcast(*(a.shape for a in arrays))
    return spec_sequence([broadcast_to(a, shape) for a in arrays])


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``shapes`` broadcast to (``()`` for none); ValueError where they do not
    broadcast together or an entry is negative.

    >>> clops.broadcast_shapes((2, 1), (3,))
    (2, 3)
    """
    return _broadcast(*(as_shape(s, "broadcast_shapes", f"shapes[{i}]")
                        for i, s in enumerate(shapes)))


def expand_dims(x: Tensor, /, axis: int | Sequence[int] = 0) -> Tensor:
    axes = axis_tuple(axis)
    nd = x.ndim + len(axes)
    check_rank(nd, "expand_dims")
    norm = sorted(normalize_axis(a, nd) for a in axes)
    if len(set(norm)) != len(norm):
        raise ValueError(f"expand_dims: repeated axis in {axis}")
    shape = list(x.shape)
    for a in norm:
        shape.insert(a, 1)
    return reshape(x, shape)


@register
def squeeze(x: Tensor, /, axis: int | Sequence[int]) -> Tensor:
    axes = normalize_axes(axis, x.ndim)
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"squeeze: axis {a} has size {x.shape[a]}, not 1")
    return reshape(x, [n for i, n in enumerate(x.shape) if i not in axes])


def flip(x: Tensor, /, *, axis: int | Sequence[int] | None = None) -> Tensor:
    axes = normalize_axes(axis, x.ndim)

    def fn(v: ir.View) -> ir.View:
        starts = [n - 1 if i in axes else 0 for i, n in enumerate(v.shape)]
        stops = [-1 if i in axes else n for i, n in enumerate(v.shape)]
        steps = [-1 if i in axes else 1 for i in range(len(v.shape))]
        return v.slice(starts, stops, steps)

    return x._move(fn)


@register
def astype(x: Tensor, dtype: Any, /, *, copy: bool = True, device: Any = None) -> Tensor:
    d = _dt.to_dtype(dtype)
    if device is not None:
        x = x.to_device(device)
    _check_device_dtype(x.device, d)
    if d == x.dtype:
        if not copy:
            return x
        return Tensor(ir.ew("identity", [x._node.resolve()], d), x.device)
    if x.dtype.kind == "c" and d.kind != "c" and d.kind != "b":
        raise TypeError(f"astype: {x.dtype} to {d} would drop the imaginary part; take "
                        "clops.real() first")
    return Tensor(ir.cast(x._node.resolve(), d), x.device)


def concat(arrays: Sequence[Tensor] | tuple[Tensor, ...], /, *, axis: int | None = 0
           ) -> Tensor:
    """Join tensors along an existing axis (``axis=None``: flattened). One copy kernel per
    input, each writing its slab of the output."""
    arrays = list(arrays)
    if not arrays:
        raise ValueError("concat needs at least one tensor")
    if axis is None:
        arrays = [reshape(a, (-1,)) for a in arrays]
        axis = 0
    same_device("concat", *arrays)
    nd = arrays[0].ndim
    if nd == 0:
        raise ValueError("concat: 0-d tensors cannot be joined; use stack")
    ax = normalize_axis(axis, nd)
    dtype = arrays[0].dtype
    for a in arrays[1:]:
        if a.ndim != nd:
            raise ValueError("concat: all tensors must have the same number of dims")
        dtype = _dt.promote_types(dtype, a.dtype)
        for i in range(nd):
            if i != ax and a.shape[i] != arrays[0].shape[i]:
                raise ValueError(f"concat: shapes {arrays[0].shape} and {a.shape} differ "
                                 f"outside axis {ax}")
    shape = list(arrays[0].shape)
    shape[ax] = sum(a.shape[ax] for a in arrays)
    out = empty(shape, dtype=dtype, device=arrays[0].device)
    if _concat_rows(out, arrays, ax):
        return out
    pos = 0
    for a in arrays:
        n = a.shape[ax]
        if n:
            key = tuple(slice(pos, pos + n) if i == ax else slice(None) for i in range(nd))
            out[key] = astype(a, dtype, copy=False)
        pos += n
    return out


def _concat_rows(out: Tensor, arrays: list[Tensor], ax: int) -> bool:
    """Fill ``out`` with ``arrays`` joined along ``ax`` as row copies, when every input is
    realized C-contiguous memory of ``out``'s dtype (False, with nothing done, otherwise)."""
    # PERF: a hand copy of whole rows (a 2-d launch, dim 0 along the row) instead of the
    # generated strided copy that divides its flat index per element: Intel's CPU runtime,
    # two 512x512 float32 along axis 1: kernels 2 x 0.44 -> 2 x 0.15 ms (axis 0: the same).
    if any(a.dtype != out.dtype or a._node.resolve().op != "load" or not a.is_contiguous
           for a in arrays):
        return False
    rows = prod(out.shape[:ax])
    row = prod(out.shape[ax:])
    col = 0
    dev = out.device
    for a in arrays:
        inner = prod(a.shape[ax:])
        copy_rows(dev, out.dtype.itemsize, out.buffer, out.offset, row, col, a.buffer,
                  a.offset, rows, inner)
        col += inner
    return True


def stack(arrays: Sequence[Tensor] | tuple[Tensor, ...], /, *, axis: int = 0) -> Tensor:
    """Join tensors of one shape along a new axis."""
    arrays = list(arrays)
    if not arrays:
        raise ValueError("stack needs at least one tensor")
    nd = arrays[0].ndim + 1
    check_rank(nd, "stack")
    ax = normalize_axis(axis, nd)
    for a in arrays[1:]:
        if a.shape != arrays[0].shape:
            raise ValueError(f"stack: shapes {arrays[0].shape} and {a.shape} differ")
    return concat([expand_dims(a, axis=ax) for a in arrays], axis=ax)


def moveaxis(x: Tensor, source: int | Sequence[int], destination: int | Sequence[int], /
             ) -> Tensor:
    """Move axes to new positions (a view).

    >>> clops.moveaxis(clops.zeros((2, 3, 4)), 0, -1).shape
    (3, 4, 2)
    """
    src = normalize_axes(source, x.ndim)
    dst = normalize_axes(destination, x.ndim)
    if len(src) != len(dst):
        raise ValueError("moveaxis: source and destination need the same number of axes")
    order = [a for a in range(x.ndim) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return permute_dims(x, order)


def unstack(x: Tensor, /, *, axis: int = 0) -> tuple[Tensor, ...]:
    """Views of ``x`` split along ``axis``.

    >>> len(clops.unstack(clops.zeros((3, 2))))
    3
    """
    if x.ndim == 0:
        raise ValueError("unstack needs at least 1 dim")
    ax = normalize_axis(axis, x.ndim)
    return tuple(x[(slice(None),) * ax + (i,)] for i in range(x.shape[ax]))


def roll(x: Tensor, /, shift: int | tuple[int, ...], *,
         axis: int | tuple[int, ...] | None = None) -> Tensor:
    """Shift elements along axes, wrapping around (flattened when ``axis`` is None).

    >>> clops.roll(clops.asarray([1, 2, 3]), 1)
    Tensor([3, 1, 2], dtype=int64, device=opencl:cpu:0)
    """
    if axis is None:
        if not isinstance(shift, int):
            shift = sum(shift)
        return reshape(roll(reshape(x, (-1,)), shift, axis=0), x.shape)
    axes = axis_tuple(axis)
    shifts = (shift,) * len(axes) if isinstance(shift, int) else tuple(shift)
    if len(shifts) != len(axes):
        raise ValueError("roll: shift and axis must have the same length")
    out = x
    for a, s in zip(axes, shifts):
        ax = normalize_axis(a, x.ndim)
        n = x.shape[ax]
        if n == 0:
            continue
        s %= n
        if s == 0:
            continue
        pre = (slice(None),) * ax
        out = concat([out[pre + (slice(n - s, None),)], out[pre + (slice(0, n - s),)]],
                     axis=ax)
    if out is x:
        out = Tensor(ir.ew("identity", [x._node.resolve()], x.dtype), x.device)
    return out


def _interleave(x: Tensor, ax: int, r: int, before: bool) -> Tensor:
    """Repeat along ``ax``: each element ``r`` times (``before`` False) or the whole axis
    ``r`` times (``before`` True); a broadcast view reshaped, computed lazily."""
    shape = list(x.shape)
    n = shape[ax]
    ins = ax if before else ax + 1
    s1 = shape[:ins] + [1] + shape[ins:]
    s2 = list(s1)
    s2[ins] = r
    t = broadcast_to(reshape(x, s1), s2)
    shape[ax] = n * r
    return reshape(t, shape)


def repeat(x: Tensor, repeats: int | Tensor, /, *, axis: int | None = None) -> Tensor:
    """Repeat each element ``repeats`` times (an int, or one count per element) along
    ``axis`` (flattened when None).

    >>> clops.repeat(clops.asarray([1, 2]), 2)
    Tensor([1, 1, 2, 2], dtype=int64, device=opencl:cpu:0)
    """
    if axis is None:
        x = reshape(x, (-1,))
        axis = 0
    ax = normalize_axis(axis, x.ndim)
    if isinstance(repeats, int):
        if repeats < 0:
            raise ValueError(f"repeat: repeats must be >= 0, got {repeats}")
        as_shape(x.shape[:ax] + (x.shape[ax] * repeats,) + x.shape[ax + 1:], "repeat",
                 "the result's shape")
        return _interleave(x, ax, repeats, False)
    if not isinstance(repeats, Tensor) or repeats.dtype.kind not in "iu":
        raise TypeError("repeat: repeats must be an int or an integer tensor")
    same_device("repeat", x, repeats)
    n = x.shape[ax]
    if repeats.ndim == 0 or repeats.shape == (1,):
        return _interleave(x, ax, int(reshape(repeats, ()).item()), False)
    if repeats.shape != (n,):
        raise ValueError(f"repeat: {repeats.shape[0]} counts for an axis of size {n}")
    cum = scan_last(repeats, "sum", _dt.int64)
    total = read_int(cum, n - 1, "repeat with a tensor of counts") if n else 0
    pos = searchsorted_flat(cum, arange(total, device=x.device), True)
    return OPS.take(x, pos, axis=ax)


def tile(x: Tensor, repetitions: tuple[int, ...], /) -> Tensor:
    """``x`` repeated ``repetitions[i]`` times along each axis.

    >>> clops.tile(clops.asarray([1, 2]), (2,))
    Tensor([1, 2, 1, 2], dtype=int64, device=opencl:cpu:0)
    """
    reps = as_shape(repetitions, "tile", "repetitions")
    nd = max(len(reps), x.ndim)
    reps = (1,) * (nd - len(reps)) + reps
    out = reshape(x, (1,) * (nd - x.ndim) + x.shape)
    as_shape(tuple(n * r for n, r in zip(out.shape, reps)), "tile", "the result's shape")
    for ax, r in enumerate(reps):
        if r != 1:
            out = _interleave(out, ax, r, True)
    if out is x:
        out = Tensor(ir.ew("identity", [x._node.resolve()], x.dtype), x.device)
    return out
