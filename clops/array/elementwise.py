"""Array layer, elementwise functions: generated from one table of names, the dtype categories
they take and the dtype they return; broadcasting and promotion (Python scalars included)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as _np

from .. import runtime
from ..graph import dtypes as _dt
from ..graph import ir
from ..graph.dtypes import DType
from ._ops import OPS, register
from .tensor import Tensor, same_device

# Categories (Array API): which dtype kinds a function accepts.
CATEGORIES = {
    "numeric": "iufc", "real numeric": "iuf", "integer": "iu", "integer or boolean": "iub",
    "floating-point": "fc", "real floating-point": "f", "boolean": "b", "any": "biufc",
}

# name: (arity, category, result) with result "same" (the promoted dtype), "bool",
# "real" (the real dtype of a complex input). Float functions given integers compute in the
# default float dtype.
TABLE: dict[str, tuple[int, str, str]] = {
    "abs": (1, "numeric", "real"),
    "acos": (1, "floating-point", "same"), "acosh": (1, "floating-point", "same"),
    "asin": (1, "floating-point", "same"), "asinh": (1, "floating-point", "same"),
    "atan": (1, "floating-point", "same"), "atanh": (1, "floating-point", "same"),
    "bitwise_invert": (1, "integer or boolean", "same"),
    "ceil": (1, "real numeric", "same"), "conj": (1, "numeric", "same"),
    "cos": (1, "floating-point", "same"), "cosh": (1, "floating-point", "same"),
    "exp": (1, "floating-point", "same"), "expm1": (1, "floating-point", "same"),
    "floor": (1, "real numeric", "same"), "imag": (1, "numeric", "real"),
    "isfinite": (1, "numeric", "bool"), "isinf": (1, "numeric", "bool"),
    "isnan": (1, "numeric", "bool"), "log": (1, "floating-point", "same"),
    "log1p": (1, "floating-point", "same"), "log2": (1, "floating-point", "same"),
    "log10": (1, "floating-point", "same"), "logical_not": (1, "boolean", "bool"),
    "negative": (1, "numeric", "same"), "positive": (1, "numeric", "same"),
    "real": (1, "numeric", "real"), "reciprocal": (1, "floating-point", "same"),
    "round": (1, "numeric", "same"), "sign": (1, "numeric", "same"),
    "signbit": (1, "real floating-point", "bool"), "sin": (1, "floating-point", "same"),
    "sinh": (1, "floating-point", "same"), "square": (1, "numeric", "same"),
    "sqrt": (1, "floating-point", "same"), "tan": (1, "floating-point", "same"),
    "tanh": (1, "floating-point", "same"), "trunc": (1, "real numeric", "same"),
    "add": (2, "numeric", "same"), "atan2": (2, "real floating-point", "same"),
    "bitwise_and": (2, "integer or boolean", "same"),
    "bitwise_left_shift": (2, "integer", "same"),
    "bitwise_or": (2, "integer or boolean", "same"),
    "bitwise_right_shift": (2, "integer", "same"),
    "bitwise_xor": (2, "integer or boolean", "same"),
    "copysign": (2, "real floating-point", "same"), "divide": (2, "floating-point", "same"),
    "equal": (2, "any", "bool"), "floor_divide": (2, "real numeric", "same"),
    "greater": (2, "real numeric", "bool"), "greater_equal": (2, "real numeric", "bool"),
    "hypot": (2, "real floating-point", "same"), "less": (2, "real numeric", "bool"),
    "less_equal": (2, "real numeric", "bool"), "logaddexp": (2, "real floating-point", "same"),
    "logical_and": (2, "boolean", "bool"), "logical_or": (2, "boolean", "bool"),
    "logical_xor": (2, "boolean", "bool"), "maximum": (2, "real numeric", "same"),
    "minimum": (2, "real numeric", "same"), "multiply": (2, "numeric", "same"),
    "nextafter": (2, "real floating-point", "same"), "not_equal": (2, "any", "bool"),
    "pow": (2, "numeric", "same"), "remainder": (2, "real numeric", "same"),
    "subtract": (2, "numeric", "same"),
}


_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def default_float(device: runtime.CLDevice | None = None) -> DType:
    """The default floating-point dtype: float32 on every device (``default_dtypes`` of the
    namespace info says the same; a device without float64 needs no other)."""
    return _dt.float32


def _scalar_dtype(value: Any, other: DType) -> DType:
    """The dtype a Python scalar takes next to an array of dtype ``other`` (Array API rules:
    the scalar adopts the array's dtype when its kind fits)."""
    if isinstance(value, bool):  # (next to a numeric array, True is 1 of its dtype)
        return other
    if isinstance(value, int):
        return other if other.kind in "iufc" else _dt.int64
    if isinstance(value, float):
        return other if other.kind in "fc" else _dt.float32
    if isinstance(value, complex):
        return other if other.kind == "c" else _dt.complex_of(other) if other.kind == "f" \
            else _dt.complex64
    raise TypeError(f"unsupported operand type {type(value).__name__}; use a Tensor or a "
                    "Python bool, int, float or complex (clops.asarray(...) makes a Tensor of "
                    "a list)")


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(-ndim, 0):
        n = 1
        for s in shapes:
            if len(s) >= -i:
                m = s[i]
                if m != 1:
                    if n != 1 and n != m:
                        raise ValueError(f"shapes {', '.join(map(str, shapes))} cannot be "
                                         "broadcast together")
                    n = m
        out.append(n)
    return tuple(out)


def broadcast_node(node: ir.Node, shape: tuple[int, ...]) -> ir.Node:
    if node.shape == shape:
        return node
    if len(node.shape) > len(shape):
        raise ValueError(f"cannot broadcast shape {node.shape} to {shape}")
    lead = (1,) * (len(shape) - len(node.shape)) + node.shape
    if lead != node.shape:
        node = ir.movement(node, lambda v: v.reshape(lead))
    for n, m in zip(node.shape, shape):
        if n != m and n != 1:
            raise ValueError(f"cannot broadcast shape {node.shape} to {shape}")
    return ir.movement(node, lambda v: v.expand(shape))


def _check_device_dtype(device: runtime.CLDevice, d: DType) -> None:
    if d.needs_fp64 and not device.caps.fp64:
        raise TypeError(f"{d} needs double precision, which {device.name} does not have "
                        "(no cl_khr_fp64); use float32/complex64 on this device")


# integer dtype name -> (least, greatest) value; filled once per dtype (two threads filling one
# entry store equal values)
_INT_BOUNDS: dict[str, tuple[int, int]] = {}


def _int_bounds(d: DType) -> tuple[int, int]:
    got = _INT_BOUNDS.get(d.name)
    if got is None:
        info = _np.iinfo(d.np)
        got = _INT_BOUNDS[d.name] = (int(info.min), int(info.max))
    return got


def _with_scalar(args: tuple[Any, ...]) -> tuple[list[ir.Node], runtime.CLDevice, DType] | None:
    """``_operands`` of a tensor and a Python int or float that takes the tensor's dtype
    (``x * 2``, ``1.0 - x``); None for any other pair."""
    x, y = args
    t, value = (x, y) if type(x) is Tensor else (y, x)
    kind = type(value)
    if type(t) is not Tensor or not (kind is float or kind is int):
        return None
    node = t._node.resolve()
    dtype = node.dtype
    if dtype.kind not in "fc":
        if kind is float or dtype.kind not in "iu":
            return None
        lo, hi = _int_bounds(dtype)
        if not lo <= value <= hi:
            return None  # (the general path says why)
    c = ir.const(value, dtype, node.shape)
    return ([node, c] if t is x else [c, node]), t.device, dtype


def _operands(args: tuple[Any, ...], fn: str) -> tuple[list[ir.Node], runtime.CLDevice, DType]:
    """The nodes of ``args`` broadcast to one shape, their device and promoted dtype (Python
    and numpy scalars as constant nodes of the dtype they take)."""
    first = args[0]
    if type(first) is Tensor:
        # PERF: tensors of one device, dtype and shape (most calls) need no promotion or
        # broadcast: 4.6 -> 0.7 us of ``a + b``'s 10 us graph building (2-core EPYC)
        node, device = first._node, first.device
        for a in args[1:]:
            if type(a) is not Tensor or a.device is not device or \
                    a._node.dtype is not node.dtype or a._node.shape != node.shape:
                break
        else:
            return [a._node.resolve() for a in args], device, node.dtype
    if len(args) == 2:  # PERF: ``x * 2``: 5.8 -> 1.0 us
        fast = _with_scalar(args)
        if fast is not None:
            return fast
    return _promoted(args, fn)


def _promoted(args: tuple[Any, ...], fn: str
              ) -> tuple[list[ir.Node], runtime.CLDevice, DType]:
    """``_operands`` of any operands: tensors, Python and numpy scalars, host arrays."""
    tensors = [a for a in args if isinstance(a, Tensor)]
    if not tensors:
        raise TypeError(f"{fn} needs at least one clops Tensor operand, got "
                        f"{', '.join(type(a).__name__ for a in args)}; convert one first "
                        "with clops.asarray(...)")
    dev = same_device(fn, *tensors)
    assert dev is not None
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = _dt.promote_types(dtype, t.dtype)
    nodes: list[ir.Node | None] = []
    for a in args:
        if isinstance(a, _np.generic) or (isinstance(a, _np.ndarray) and a.ndim == 0):
            a = a.item()  # numpy scalars combine as the Python scalars they hold
        elif isinstance(a, _np.ndarray):
            # a host array (as libraries built on numpy, such as Dask, hand to a tensor's
            # operators) combines as a scalar of its kind would: a lower kind takes the
            # tensors' dtype, a higher one sets it
            own = _dt.to_dtype(a.dtype)
            if _KIND_RANK[own.kind] > _KIND_RANK[dtype.kind]:
                dtype = own
            a = OPS.asarray(a, dtype=dtype if _KIND_RANK[own.kind] <= _KIND_RANK[dtype.kind]
                            else own, device=dev)
        if isinstance(a, Tensor):
            nodes.append(a._node.resolve())
        else:
            sd = _scalar_dtype(a, dtype)
            if isinstance(a, int) and not isinstance(a, bool) and sd.is_int:
                lo, hi = _int_bounds(sd)
                if not lo <= a <= hi:
                    raise OverflowError(f"{fn}: Python int {a} does not fit {sd}")
            # A scalar of a higher kind (float next to int, say) sets the dtype, as numpy does.
            if _KIND_RANK[sd.kind] > _KIND_RANK[dtype.kind]:
                dtype = sd
            elif sd != dtype:
                dtype = _dt.promote_types(dtype, sd)
            nodes.append(ir.const(a, sd))
    shape = broadcast_shapes(*(n.shape for n in nodes if n is not None))
    out = []
    for n in nodes:
        assert n is not None
        if n.op == "const":
            n = ir.const(n.arg, n.dtype, shape)
        out.append(broadcast_node(n, shape))
    return out, dev, dtype


def _is_squeeze(n: ir.Node) -> bool:
    """A view that only drops or adds size-1 axes of a computed node (as keepdims=False does)."""
    if n.op != "view" or n.srcs[0].resolve().op == "load":
        return False
    v = n.arg
    src = n.srcs[0].shape
    return v.offset == 0 and v.is_contiguous and \
        [d for d in v.shape if d != 1] == [d for d in src if d != 1]


def lifted(nodes: list[ir.Node], make: Any) -> ir.Node:
    """Build ``make(nodes)`` at the unsqueezed shape of a squeezed operand, then squeeze the
    result: reductions keep their reduced axes through elementwise chains, so the chain fuses
    into the reduction's kernel (``tanh(x @ w + b)`` is one kernel)."""
    sq = None
    for n in nodes:
        if n.op == "view" and _is_squeeze(n):
            sq = n
            break
    if sq is None:
        return make(nodes)
    shape, full = sq.shape, sq.srcs[0].shape
    ins = [sq.srcs[0] if n is sq else ir.movement(n, lambda v: v.reshape(full)) for n in nodes]
    out = make(ins)
    return ir.movement(out, lambda v: v.reshape(shape))


@register
def apply(fn: str, *args: Any) -> Tensor:
    """Apply table function ``fn`` with broadcasting and promotion."""
    arity, cat, result = TABLE[fn]
    nodes, dev, dtype = _operands(args, fn)
    kinds = CATEGORIES[cat]
    if dtype.kind not in kinds:
        if cat in ("floating-point", "real floating-point") and dtype.kind in "iu":
            dtype = default_float(dev)
        else:
            raise TypeError(f"{fn} is not defined for {dtype} (it takes {cat} dtypes)")
    _check_device_dtype(dev, dtype)
    nodes = [ir.cast(n, dtype) for n in nodes]
    if result == "same":
        rd = dtype
    elif result == "bool":
        rd = _dt.bool_
    else:
        rd = _dt.real_of(dtype)
    # Integer results of these never differ from their input: skip the kernel op.
    if fn in ("ceil", "floor", "trunc", "round", "positive", "conj") and dtype.kind in "iub":
        return Tensor(nodes[0], dev)
    if fn in ("real",) and dtype.kind != "c":
        return Tensor(nodes[0], dev)
    if fn == "imag" and dtype.kind != "c":  # (the imaginary part of a real number)
        return Tensor(ir.const(0, rd, nodes[0].shape), dev)
    return Tensor(lifted(nodes, lambda ns: ir.ew(fn, ns, rd)), dev)


def where(condition: Tensor, x1: Any, x2: Any, /) -> Tensor:
    """Elements of ``x1`` where ``condition`` is true, else of ``x2``."""
    if not isinstance(condition, Tensor):
        raise TypeError("where: condition must be a Tensor")
    same_device("where", condition, x1, x2)
    if not any(isinstance(a, Tensor) for a in (x1, x2)):
        d = _dt.promote_types(_dt.to_dtype(type(x1)), _dt.to_dtype(type(x2)))
        x1 = Tensor(ir.const(x1, d, condition.shape), condition.device)
    nodes, dev, dtype = _operands((x1, x2), "where")
    if condition.device is not dev:
        raise ValueError(f"where: condition is on {condition.device}, values on {dev}")
    shape = broadcast_shapes(condition.shape, nodes[0].shape)
    c = broadcast_node(ir.cast(condition._node.resolve(), _dt.bool_), shape)
    a = broadcast_node(ir.cast(nodes[0], dtype), shape)
    b = broadcast_node(ir.cast(nodes[1], dtype), shape)
    return Tensor(lifted([c, a, b], lambda ns: ir.ew("where", ns, dtype)), dev)


def _make(fn: str) -> Any:
    arity = TABLE[fn][0]
    f: Callable[..., Tensor]
    if arity == 1:
        def f1(x: Tensor, /) -> Tensor:
            return apply(fn, x)
        f = f1
    else:
        def f2(x1: Any, x2: Any, /) -> Tensor:
            return apply(fn, x1, x2)
        f = f2
    f.__name__ = f.__qualname__ = fn
    f.__doc__ = f"Elementwise ``{fn}`` (Array API), computed lazily on the device."
    return f


for _name in TABLE:
    globals()[_name] = _make(_name)


def clip(x: Tensor, /, min: Any = None, max: Any = None) -> Tensor:
    """Clamp ``x`` to ``[min, max]`` (either may be None); keeps ``x``'s dtype."""
    same_device("clip", x, min, max)
    out = x
    if min is not None:
        out = apply("maximum", out, min)
    if max is not None:
        out = apply("minimum", out, max)
    if out.dtype != x.dtype:
        out = Tensor(ir.cast(out._node.resolve(), x.dtype), x.device)
    if out is x:
        out = Tensor(ir.ew("identity", [x._node.resolve()], x.dtype), x.device)
    return out
