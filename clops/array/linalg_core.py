"""Array layer, matmul: batched matrix products. Generated code computes them as one fused
broadcast-multiply-reduce kernel; a provider (CLBlast) or a hand-written kernel takes over where
it is faster."""

from __future__ import annotations

from typing import Any

from ..graph import dtypes as _dt
from ..graph import ir
from .elementwise import broadcast_node, broadcast_shapes
from .tensor import Tensor


def matmul(x1: Any, x2: Any, /) -> Tensor:
    """Matrix product with broadcasting over leading (batch) dims (Array API ``matmul``)."""
    if not isinstance(x1, Tensor) or not isinstance(x2, Tensor):
        raise TypeError("matmul takes two tensors")
    if x1.ndim == 0 or x2.ndim == 0:
        raise ValueError("matmul does not take 0-d tensors; use multiply")
    if x1.device is not x2.device:
        raise ValueError(f"matmul: operands are on {x1.device} and {x2.device}")
    dtype = _dt.promote_types(x1.dtype, x2.dtype)
    if dtype.kind == "b":
        raise TypeError("matmul is not defined for bool tensors")
    a = ir.cast(x1._node.resolve(), dtype)
    b = ir.cast(x2._node.resolve(), dtype)
    a_vec, b_vec = x1.ndim == 1, x2.ndim == 1
    if a_vec:
        a = ir.movement(a, lambda v: v.reshape((1,) + v.shape))
    if b_vec:
        b = ir.movement(b, lambda v: v.reshape(v.shape + (1,)))
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        raise ValueError(f"matmul: shapes {x1.shape} and {x2.shape} do not align "
                         f"({k} != {k2})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    full = batch + (m, k, n)
    a3 = ir.movement(a, lambda v: v.reshape(v.shape[:-1] + (k, 1)))
    b3 = ir.movement(b, lambda v: v.reshape(v.shape[:-2] + (1, k, n)))
    prod_node = ir.ew("multiply", [broadcast_node(a3, full), broadcast_node(b3, full)], dtype)
    red = ir.reduce("sum", prod_node, (len(full) - 2,), dtype)
    shape = batch + (m, n)
    if a_vec:
        shape = batch + (n,)
    if b_vec:
        shape = shape[:-1]
    out = ir.movement(red, lambda v: v.reshape(shape))
    return Tensor(out, x1.device)
