"""Array layer, matmul: batched matrix products. Generated code computes them as one fused
broadcast-multiply-reduce kernel; a provider (CLBlast) or a hand-written kernel takes over where
it is faster."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..graph import dtypes as _dt
from ..graph import ir
from ._ops import register
from .creation import asarray, empty
from .elementwise import apply, broadcast_node, broadcast_shapes
from .manipulation import normalize_axis, permute_dims, reshape
from .statistics import sum as _sum
from .tensor import Tensor, axis_int, same_device

# Multiply-adds (roughly) from which a vendor library may take a product.
PROVIDER_MIN_WORK = 1 << 21


@register
def matmul(x1: Any, x2: Any, /) -> Tensor:
    """Matrix product with broadcasting over leading (batch) dims (Array API ``matmul``)."""
    if not isinstance(x1, Tensor) or not isinstance(x2, Tensor):
        raise TypeError("matmul takes two tensors")
    if x1.ndim == 0 or x2.ndim == 0:
        raise ValueError("matmul does not take 0-d tensors; use multiply")
    same_device("matmul", x1, x2)
    dtype = _dt.promote_types(x1.dtype, x2.dtype)
    if dtype.kind == "b":
        raise TypeError("matmul is not defined for bool tensors")
    # -- a vendor library that CLOPS_PROVIDERS forces (+NAME) takes every product it can -----
    # NOTE: dispatch (clops.providers with it) and kernels.gemm are imported on the first
    # product, not with clops: `import clops` loads no provider, and importing gemm adds a check
    # to the choice of the default CPU device
    from . import dispatch

    forced = dispatch.forced_matmul(x1, x2)
    if forced is not None:
        return forced
    # -- GPU GEMM (clops/kernels/gemm.py): large float32/float16 products; None otherwise --
    from ..kernels import gemm as _gemm

    fast = _gemm.matmul(x1, x2, dtype, lambda s, d, dev: empty(s, dtype=d, device=dev))
    if fast is not None:
        return fast
    # -- vendor library (clops.providers: CLBlast) for large products, by measured cost -------
    # Small products stay generated: they fuse with their producers and consumers.
    k_dim = x1.shape[-1]
    work = (x1.size // max(k_dim, 1)) * (x2.size // max(k_dim, 1)) * k_dim if k_dim else 0
    if work >= PROVIDER_MIN_WORK:
        provided = dispatch.matmul(x1, x2)
        if provided is not None:
            return provided
    # -- generated kernel ---------------------------------------------------------------------
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


def tensordot(x1: Tensor, x2: Tensor, /, *,
              axes: int | tuple[Sequence[int], Sequence[int]] = 2) -> Tensor:
    """Sum of products over the last ``axes`` dims of ``x1`` and the first of ``x2`` (or the
    given pairs of axes); one fused multiply-reduce.

    >>> clops.tensordot(clops.ones((2, 3)), clops.ones((3, 4)), axes=1).shape
    (2, 4)
    """
    same_device("tensordot", x1, x2)
    if isinstance(axes, int):
        if axes < 0:
            raise ValueError("tensordot: axes must be >= 0")
        a1 = list(range(x1.ndim - axes, x1.ndim))
        a2 = list(range(axes))
    else:
        a1 = [normalize_axis(a, x1.ndim) for a in axes[0]]
        a2 = [normalize_axis(a, x2.ndim) for a in axes[1]]
    if len(a1) != len(a2):
        raise ValueError("tensordot: the two axis lists differ in length")
    for i, j in zip(a1, a2):
        if x1.shape[i] != x2.shape[j] and x1.shape[i] != 1 and x2.shape[j] != 1:
            raise ValueError(f"tensordot: axis {i} of x1 ({x1.shape[i]}) and axis {j} of x2 "
                             f"({x2.shape[j]}) differ")
    dtype = _dt.promote_types(x1.dtype, x2.dtype)
    free1 = [a for a in range(x1.ndim) if a not in a1]
    free2 = [a for a in range(x2.ndim) if a not in a2]
    # x1 -> free1 + contracted + (1,)*len(free2); x2 -> (1,)*len(free1) + contracted + free2
    p1 = permute_dims(x1, free1 + a1)
    p2 = permute_dims(x2, a2 + free2)
    k = len(a1)
    s1 = p1.shape + (1,) * len(free2)
    s2 = (1,) * len(free1) + p2.shape
    n1 = ir.cast(reshape(p1, s1)._node.resolve(), dtype)
    n2 = ir.cast(reshape(p2, s2)._node.resolve(), dtype)
    full = broadcast_shapes(s1, s2)
    prod_node = ir.ew("multiply", [broadcast_node(n1, full), broadcast_node(n2, full)], dtype)
    out_shape = tuple(x1.shape[a] for a in free1) + tuple(x2.shape[a] for a in free2)
    if k == 0:
        return Tensor(prod_node, x1.device)
    raxes = tuple(range(len(free1), len(free1) + k))
    red = ir.reduce("sum", prod_node, raxes, dtype)
    return Tensor(ir.movement(red, lambda v: v.reshape(out_shape)), x1.device)


def vecdot(x1: Tensor, x2: Tensor, /, *, axis: int = -1) -> Tensor:
    """Dot product of vectors along ``axis`` (the first argument conjugated), broadcasting the
    other dims; one fused kernel.

    >>> clops.vecdot(clops.asarray([1.0, 2.0]), clops.asarray([3.0, 4.0])).item()
    11.0
    """
    same_device("vecdot", x1, x2)
    if x1.ndim == 0 or x2.ndim == 0:
        raise ValueError("vecdot needs at least 1-d tensors")
    axis = axis_int(axis)
    if axis >= 0:
        raise ValueError("vecdot: axis must be negative (counted from the end)")
    shape = broadcast_shapes(x1.shape, x2.shape)
    if -axis > len(shape):
        raise ValueError(f"vecdot: axis {axis} out of range")
    if x1.shape[axis] != x2.shape[axis]:
        raise ValueError(f"vecdot: sizes {x1.shape[axis]} and {x2.shape[axis]} along axis "
                         f"{axis} differ")
    a = apply("conj", x1) if x1.dtype.kind == "c" else x1
    prod = apply("multiply", a, x2)
    # NOTE: the promoted input dtype, not sum's widened default (uint8 stays uint8)
    return _sum(prod, axis=axis, dtype=prod.dtype)


def einsum(subscripts: str, /, *operands: Tensor) -> Tensor:
    """Einstein summation as numpy's ``einsum`` writes it (``"ij,jk->ik"``, an implicit output of
    the labels used once, in order, ``...`` for broadcast leading dims), on the device: a
    contraction of two operands that is a batched product runs as ``matmul``; any other as one
    fused multiply-reduce over the labels left out of the output. Labels repeated within one
    operand (a diagonal) are refused.

    >>> clops.einsum("ij,jk->ik", clops.ones((2, 3)), clops.ones((3, 4))).shape
    (2, 4)
    """
    if not operands:
        raise ValueError("einsum: give at least one operand")
    ops = [o if isinstance(o, Tensor) else _as_tensor(o, operands) for o in operands]
    for o in ops[1:]:
        same_device("einsum", ops[0], o)
    ins, out = _einsum_labels(subscripts, [o.ndim for o in ops])
    sizes: dict[str, int] = {}
    for o, labels in zip(ops, ins):
        if len(set(labels)) != len(labels):
            raise NotImplementedError(
                f"einsum: the labels {labels!r} repeat within one operand (a diagonal); take "
                "it first (clops.linalg.diagonal) or compute on the host")
        for lab, n in zip(labels, o.shape):
            if sizes.get(lab, 1) != n and n != 1:
                if sizes.get(lab, 1) != 1:
                    raise ValueError(f"einsum: label {lab!r} has sizes {sizes[lab]} and {n}")
            sizes[lab] = max(sizes.get(lab, 1), n)
    dtype = ops[0].dtype
    for o in ops[1:]:
        dtype = _dt.promote_types(dtype, o.dtype)
    if len(ops) == 2:
        fast = _einsum_matmul(ops, ins, out, sizes)
        if fast is not None:
            return fast
    # every label in one order: the output's, then those summed over
    order = list(out) + [lab for lab in dict.fromkeys("".join(ins)) if lab not in out]
    nodes = []
    for o, labels in zip(ops, ins):
        p = permute_dims(o, sorted(range(len(labels)), key=lambda a: order.index(labels[a])))
        mine = sorted(labels, key=order.index)
        shape = tuple(p.shape[mine.index(lab)] if lab in mine else 1 for lab in order)
        nodes.append(ir.cast(reshape(p, shape)._node.resolve(), dtype))
    full = tuple(sizes[lab] for lab in order)
    prod = broadcast_node(nodes[0], full)
    for node in nodes[1:]:
        prod = ir.ew("multiply", [prod, broadcast_node(node, full)], dtype)
    summed = tuple(range(len(out), len(order)))
    if not summed:
        return Tensor(prod, ops[0].device)
    red = ir.reduce("sum", prod, summed, dtype)
    out_shape = full[:len(out)]
    return Tensor(ir.movement(red, lambda v: v.reshape(out_shape)), ops[0].device)


def _as_tensor(o: Any, operands: Sequence[Any]) -> Tensor:
    dev = next((x.device for x in operands if isinstance(x, Tensor)), None)
    return asarray(o, device=dev)


def _einsum_labels(subscripts: str, ndims: list[int]) -> tuple[list[str], str]:
    """The labels of each operand and of the output, ``...`` replaced by labels of their own
    (right-aligned across operands, as broadcasting aligns dims)."""
    if not isinstance(subscripts, str):
        raise TypeError("einsum: subscripts must be a string such as 'ij,jk->ik'")
    s = subscripts.replace(" ", "")
    lhs, arrow, rhs = s.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ndims):
        raise ValueError(f"einsum: {len(ins)} operand subscripts for {len(ndims)} operands")
    used = set(c for c in s if c.isalpha())
    bad = set(s) - used - set(",->.")
    if bad or (not arrow and "-" in s) or s.count("->") > 1:
        raise ValueError(f"einsum: cannot read subscripts {subscripts!r}")
    free = iter(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                if c not in used)
    n_ell = max([nd - len(i.replace("...", "")) for i, nd in zip(ins, ndims) if "..." in i],
                default=0)
    ell = "".join(next(free) for _ in range(n_ell))
    out_ins = []
    for i, nd in zip(ins, ndims):
        if "..." in i:
            k = nd - len(i.replace("...", ""))
            if k < 0:
                raise ValueError(f"einsum: {i!r} has more labels than its operand's {nd} dims")
            i = i.replace("...", ell[n_ell - k:])
        if len(i) != nd or not i.isalpha() and i:
            raise ValueError(f"einsum: {i!r} does not label the {nd} dims of its operand")
        out_ins.append(i)
    if arrow:
        out = rhs.replace("...", ell)
        if not out.isalpha() and out:
            raise ValueError(f"einsum: cannot read the output {rhs!r}")
        if len(set(out)) != len(out) or any(c not in "".join(out_ins) for c in out):
            raise ValueError(f"einsum: the output {rhs!r} repeats a label or names one no "
                             "operand has")
    else:
        counts: dict[str, int] = {}
        for c in "".join(out_ins):
            counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    return out_ins, out


def _einsum_matmul(ops: list[Tensor], ins: list[str], out: str,
                   sizes: dict[str, int]) -> Tensor | None:
    """Two operands whose contraction is a batched product (labels of both and the output:
    batch; of both only: contracted; of one and the output: its rows or columns), as
    ``matmul``; None where it is not (labels summed within one operand, sizes broadcast)."""
    (a, b), (la, lb) = ops, ins
    if any(c not in out and c not in (lb if c in la else la) for c in la + lb):
        return None  # a label summed within one operand
    if any(o.shape[i] != sizes[c] for o, l_ in ((a, la), (b, lb)) for i, c in enumerate(l_)):
        return None  # broadcast sizes
    batch = [c for c in out if c in la and c in lb]
    rows = [c for c in out if c in la and c not in lb]
    cols = [c for c in out if c in lb and c not in la]
    inner = [c for c in la if c in lb and c not in out]
    if not inner:
        return None

    def size(labels: list[str]) -> int:
        n = 1
        for c in labels:
            n *= sizes[c]
        return n

    pa = permute_dims(a, [la.index(c) for c in batch + rows + inner])
    pb = permute_dims(b, [lb.index(c) for c in batch + inner + cols])
    ma = reshape(pa, (size(batch), size(rows), size(inner)))
    mb = reshape(pb, (size(batch), size(inner), size(cols)))
    prod = matmul(ma, mb)
    res = reshape(prod, tuple(sizes[c] for c in batch + rows + cols))
    have = batch + rows + cols
    return permute_dims(res, [have.index(c) for c in out])
