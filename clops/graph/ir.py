"""Graph, IR: immutable lazy nodes (load, const, iota, elementwise, cast, reduce, view) and the
strided views that movement ops produce without copying."""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .dtypes import DType

Shape = tuple[int, ...]


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of ``shape`` in elements (an axis of length 0 counts as 1).

    >>> contiguous_strides((2, 3, 4))
    (12, 4, 1)
    """
    rank = len(shape)
    out = [1] * rank
    acc = 1
    for i in range(rank - 1, 0, -1):
        n = shape[i]
        if n > 1:
            acc *= n
        out[i - 1] = acc
    return tuple(out)


def prod(xs: Sequence[int]) -> int:
    return math.prod(xs)


@dataclass(frozen=True)
class View:
    """Maps an index of ``shape`` to ``offset + sum(i_k * strides_k)`` in a linear space (a
    buffer's elements, or the row-major index space of a lazy node)."""

    shape: Shape
    strides: tuple[int, ...]
    offset: int = 0

    def __init__(self, shape: Shape, strides: tuple[int, ...], offset: int = 0) -> None:
        # PERF: the fields written straight into the instance (a frozen dataclass's own
        # __init__ sets each through object.__setattr__): 1.1 -> 0.6 us a view, and every
        # movement op and realized node makes one
        fields = self.__dict__
        fields["shape"] = shape
        fields["strides"] = strides
        fields["offset"] = offset

    @staticmethod
    def contiguous(shape: Sequence[int], offset: int = 0) -> View:
        return View(tuple(shape), contiguous_strides(shape), offset)

    @property
    def is_contiguous(self) -> bool:
        """Whether the elements lie in row-major order with no gaps (the strides of axes of
        length 1 do not matter)."""
        acc = 1
        for n, st in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and st != acc:
                return False
            if n > 1:
                acc *= n
        return True

    def permute(self, axes: Sequence[int]) -> View:
        return View(tuple(self.shape[a] for a in axes), tuple(self.strides[a] for a in axes),
                    self.offset)

    def expand(self, shape: Sequence[int]) -> View:
        """Broadcast to ``shape`` (same rank; size-1 axes get stride 0)."""
        return View(tuple(shape), tuple(0 if n != m else st for n, m, st in
                                        zip(shape, self.shape, self.strides)), self.offset)

    def slice(self, starts: Sequence[int], stops: Sequence[int], steps: Sequence[int]) -> View:
        """Per-axis python-slice semantics, with already normalized start/stop/step."""
        off = self.offset
        shape, strides = [], []
        for st, start, stop, step in zip(self.strides, starts, stops, steps):
            n = len(range(start, stop, step))
            if n > 0:
                off += start * st
            shape.append(n)
            strides.append(st * step)
        return View(tuple(shape), tuple(strides), off)

    def index(self, axis: int, i: int) -> View:
        """Select one index along ``axis`` (the axis disappears)."""
        return View(self.shape[:axis] + self.shape[axis + 1:],
                    self.strides[:axis] + self.strides[axis + 1:],
                    self.offset + i * self.strides[axis])

    def reshape(self, shape: Sequence[int]) -> View | None:
        """The same elements under a new shape, if expressible with strides (else None)."""
        shape = tuple(shape)
        if prod(shape) != prod(self.shape):
            return None
        if prod(shape) == 0:
            return View.contiguous(shape, self.offset)
        if self.is_contiguous:
            # PERF: the common case without matching axis groups: row-major strides of the new
            # shape, 0 for its axes of length 1 (what ``_regroup`` gives it); 1.8 -> 0.9 us
            strides = [0] * len(shape)
            acc = 1
            for i in range(len(shape) - 1, -1, -1):
                n = shape[i]
                if n != 1:
                    strides[i] = acc
                    acc *= n
            return View(shape, tuple(strides), self.offset)
        return self._regroup(shape)

    def _regroup(self, shape: Shape) -> View | None:
        """``reshape`` of a view with elements (``shape`` has as many, not 0) by matching groups
        of its axes to groups of the new ones; None where a group's strides do not chain."""
        # Drop size-1 axes, then match groups of old axes to groups of new axes.
        old = [(n, st) for n, st in zip(self.shape, self.strides) if n != 1]
        new_strides: list[int] = []
        oi = 0
        new_nz = [n for n in shape if n != 1]
        ni = 0
        out_nz: list[int] = []
        while ni < len(new_nz):
            if oi >= len(old):
                return None
            # take old axes until their product equals the product of the new axes taken
            o_prod, n_prod = old[oi][0], new_nz[ni]
            o_end, n_end = oi + 1, ni + 1
            while o_prod != n_prod:
                if o_prod < n_prod:
                    if o_end >= len(old):
                        return None
                    o_prod *= old[o_end][0]
                    o_end += 1
                else:
                    if n_end >= len(new_nz):
                        return None
                    n_prod *= new_nz[n_end]
                    n_end += 1
            # the old group must be mergeable (row-major chained strides)
            for k in range(oi, o_end - 1):
                if old[k][1] != old[k + 1][1] * old[k + 1][0]:
                    return None
            st = old[o_end - 1][1]
            group: list[int] = []
            for n in reversed(new_nz[ni:n_end]):
                group.append(st)
                st *= n
            out_nz.extend(reversed(group))
            oi, ni = o_end, n_end
        it = iter(out_nz)
        for n in shape:
            new_strides.append(0 if n == 1 else next(it))
        return View(shape, tuple(new_strides), self.offset)

    def extent(self) -> tuple[int, int]:
        """Lowest and highest linear index touched (for bounds and index-width checks)."""
        if prod(self.shape) == 0:
            return self.offset, self.offset
        lo = hi = self.offset
        for n, st in zip(self.shape, self.strides):
            if st > 0:
                hi += (n - 1) * st
            else:
                lo += (n - 1) * st
        return lo, hi


_ids = itertools.count()


class _Scheduling(threading.local):
    # node id -> what a schedule being made on this thread takes the node for (a load of the
    # buffer an earlier entry of the schedule computes it into); None when not scheduling
    binds: dict[int, Node] | None = None


_SCHEDULING = _Scheduling()


@contextlib.contextmanager
def scheduling() -> Iterator[dict[int, Node]]:
    """While a schedule is made on this thread: a dict of node id -> node that ``resolved`` on
    this thread takes the node for. Threads share graph nodes (a tensor several of them
    compute from); what a schedule only assumes computed is seen by the scheduling thread
    alone."""
    before = _SCHEDULING.binds
    binds: dict[int, Node] = {}
    _SCHEDULING.binds = binds
    try:
        yield binds
    finally:
        _SCHEDULING.binds = before


def resolved(node: Node) -> Node:
    """``node.resolve()`` as the schedule being made on this thread sees the graph: also through
    the nodes it takes for computed (``scheduling``). Scheduling resolves nodes with this."""
    binds = _SCHEDULING.binds
    if not binds:
        return node.resolve()
    n = node
    while True:
        r = binds.get(n.id) or n.realized
        if r is None:
            return n
        n = r


class Node:
    """One lazy value. ``op`` is one of:

    - ``load``: a realized buffer; ``arg`` = (Buffer, View in elements of that buffer)
    - ``const``: a scalar broadcast to ``shape``; ``arg`` = the Python value
    - ``iota``: the index along axis ``arg`` (int64)
    - ``ew``: elementwise function ``arg`` (a name of the function table) of ``srcs``
    - ``cast``: ``srcs[0]`` converted to ``dtype``
    - ``reduce``: ``arg`` = (op, axes); ``shape`` keeps the reduced axes as size 1
    - ``view``: ``arg`` = View over the row-major index space of ``srcs[0]``
    """

    __slots__ = ("op", "srcs", "arg", "dtype", "shape", "id", "realized", "depth",
                 "__weakref__")

    def __init__(self, op: str, srcs: tuple[Node, ...], arg: Any, dtype: DType,
                 shape: Shape) -> None:
        self.op = op
        self.srcs = srcs
        self.arg = arg
        self.dtype = dtype
        self.shape = shape
        self.id = next(_ids)
        self.realized: Node | None = None  # a load node once computed
        depth = 0
        for s in srcs:
            if s.depth > depth:
                depth = s.depth
        self.depth: int = 1 + depth

    def resolve(self) -> Node:
        """This node, or the load node it was realized into."""
        n = self
        while n.realized is not None:
            n = n.realized
        return n

    @property
    def is_load(self) -> bool:
        return self.op == "load"

    def __repr__(self) -> str:
        return f"<Node {self.op} {self.arg if self.op != 'load' else ''} {self.dtype.name} " \
               f"{self.shape}>"


def load(buffer: Any, view: View, dtype: DType) -> Node:
    return Node("load", (), (buffer, view), dtype, view.shape)


def const(value: Any, dtype: DType, shape: Shape = ()) -> Node:
    return Node("const", (), value, dtype, tuple(shape))


def iota(axis: int, shape: Shape, dtype: DType) -> Node:
    return Node("iota", (), axis, dtype, tuple(shape))


def ew(fn: str, srcs: Sequence[Node], dtype: DType) -> Node:
    shape = srcs[0].shape
    for s in srcs[1:]:
        if s.shape != shape:
            raise ValueError(f"elementwise {fn}: shapes {[x.shape for x in srcs]} differ "
                             "(broadcast first)")
    return Node("ew", tuple(srcs), fn, dtype, shape)


def cast(src: Node, dtype: DType) -> Node:
    if src.dtype == dtype:
        return src
    return Node("cast", (src,), None, dtype, src.shape)


def reduce(op: str, src: Node, axes: Sequence[int], dtype: DType | None = None) -> Node:
    axes = tuple(sorted(set(axes)))
    shape = tuple(1 if i in axes else n for i, n in enumerate(src.shape))
    return Node("reduce", (src,), (op, axes), dtype or src.dtype, shape)


def movement(src: Node, fn: Callable[[View], View | None]) -> Node:
    """Apply a movement (a function on Views: permute, expand, slice, reshape...) to ``src``.
    On a load or a view it changes the strides in place of a new node; where a reshape is not
    expressible with strides, a new view node indexes ``src``'s row-major space."""
    if src.op in ("load", "view"):
        v = fn(src.arg[1] if src.op == "load" else src.arg)
        if v is not None:
            if src.op == "load":
                return load(src.arg[0], v, src.dtype)
            return Node("view", src.srcs, v, src.dtype, v.shape)
    base = fn(View.contiguous(src.shape))
    if base is None:
        raise ValueError(f"movement of shape {src.shape} is not expressible")
    if src.op == "const":
        return const(src.arg, src.dtype, base.shape)
    return Node("view", (src,), base, src.dtype, base.shape)
