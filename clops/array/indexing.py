"""Array layer, indexing: basic indexing (integers, slices with any step, ``...``, ``None``) as
views without copies, and ``__setitem__`` that writes into the viewed memory in place."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import ir
from ._ops import OPS, register
from .creation import asarray
from .elementwise import broadcast_node
from .manipulation import astype
from .tensor import Tensor, check_rank, same_device


def _expand_key(key: Any, ndim: int) -> list[Any]:
    """``key`` as one entry per axis of the result's making: ``...`` expanded, missing axes
    as whole slices, ``None`` kept where it stands."""
    if not isinstance(key, tuple):
        if key is not None and key is not Ellipsis and ndim:
            # PERF: one index or slice (x[0], x[::2]): 1.4 -> 0.3 us
            return [key, *[slice(None)] * (ndim - 1)]
        key = (key,)
    n_ell = sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    if consumed > ndim:
        raise IndexError(f"too many indices: {consumed} for a tensor of {ndim} dims")
    out: list[Any] = []
    for k in key:
        if k is Ellipsis:
            out.extend([slice(None)] * (ndim - consumed))
        else:
            out.append(k)
    if not n_ell:
        out.extend([slice(None)] * (ndim - consumed))
    return out


def is_basic(key: Any) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    for k in keys:
        if k is None or k is Ellipsis or isinstance(k, slice):
            continue
        if isinstance(k, bool):
            return False
        if isinstance(k, int) or (isinstance(k, Tensor) and k.ndim == 0 and k.dtype.is_int):
            continue
        # NOTE: every numpy array has __index__, but only a 0-d integer one is an integer
        # (a numpy mask or index array is advanced indexing)
        if isinstance(k, np.ndarray) and (k.ndim or k.dtype.kind not in "iu"):
            return False
        if hasattr(k, "__index__") and not isinstance(k, Tensor):
            continue
        return False
    return True


def basic_view(x: Tensor, key: Any) -> Tensor:
    keys = _expand_key(key, x.ndim)
    node = x._node.resolve()
    # First the integer and slice parts, as one slice plus axis removals; then Nones.
    dim = 0
    starts, stops, steps, drop, newaxes = [], [], [], [], []
    out_pos = 0
    for k in keys:
        if k is None:
            newaxes.append(out_pos)
            out_pos += 1
            continue
        n = x.shape[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            starts.append(start)
            stops.append(stop)
            steps.append(step)
            out_pos += 1
        else:
            i = int(k.__index__()) if not isinstance(k, Tensor) else int(k)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {dim} with size {n}")
            i %= n
            starts.append(i)
            stops.append(i + 1)
            steps.append(1)
            drop.append(dim)
        dim += 1
    node = ir.movement(node, lambda v: v.slice(starts, stops, steps))
    check_rank(x.ndim - len(drop) + len(newaxes), "x[key]")
    if drop or newaxes:
        kept = [n for i, n in enumerate(node.shape) if i not in drop]
        for p in newaxes:
            kept.insert(p, 1)
        shape = tuple(kept)
        node = ir.movement(node, lambda v: v.reshape(shape))
    return Tensor(node, x.device)


def _key_tensors(key: Any) -> list[Tensor]:
    return [k for k in (key if isinstance(key, tuple) else (key,)) if isinstance(k, Tensor)]


@register
def getitem(x: Tensor, key: Any) -> Tensor:
    # Index tensors on another device would reach a kernel of x's device (it never completes)
    same_device("x[key]", x, *_key_tensors(key))
    if is_basic(key):
        return basic_view(x, key)
    return OPS.advanced_getitem(x, key)


@register
def setitem(x: Tensor, key: Any, value: Any) -> None:
    same_device("x[key] = value", x, *_key_tensors(key), value)
    if not is_basic(key):
        OPS.advanced_setitem(x, key, value)
        return
    x.realize()
    target = basic_view(x, key)
    if isinstance(value, bool | int | float | complex):
        target._assign(Tensor(ir.const(value, x.dtype, target.shape), x.device))
        return
    if not isinstance(value, Tensor):
        value = asarray(value, dtype=x.dtype, device=x.device)
    if value.dtype != x.dtype:
        value = astype(value, x.dtype)
    node = broadcast_node(value._node.resolve(), target.shape)
    target._assign(Tensor(node, x.device))
