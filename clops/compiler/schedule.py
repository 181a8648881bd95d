"""Compiler, scheduler: splits the pending graph into kernels. Elementwise, cast and movement
nodes fuse into their consumer; a reduction fuses into the kernel that consumes it when it is
over that kernel's row axes, so ``(a*b + c).sum(axis=1)``, softmax and RMSNorm are one kernel
each. Everything else is materialized into a buffer first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..graph import dtypes
from ..graph.ir import Node, Shape, View, load, prod

# Nodes fused into one kernel before an intermediate is forced into a buffer.
MAX_FUSED_NODES = 400


@dataclass
class Output:
    node: Node
    buffer: Any  # runtime Buffer
    view: View  # where in the buffer (elements), shape == node.shape


@dataclass
class KernelItem:
    """One kernel: iterate ``full`` (rows = index over non-``raxes`` axes), compute the fused
    reductions of each row, then write ``outputs`` (all of one shape: ``full``, or ``full``
    with ``raxes`` set to 1)."""

    full: Shape
    raxes: tuple[int, ...]
    outputs: list[Output]
    # Outputs hold one value per row (decided by the graph's structure, not by sizes).
    reduced_out: bool = False
    # Split reduction: the single fused reduction is computed in ``chunks`` parts per row.
    chunks: int = 1
    # Split reduction of one row into this output, finished in the same kernel: the last
    # work-group to store its part (counted in ``counter``) adds up the parts.
    combine: Output | None = None
    counter: Any = None


def is_expand_back(v: View, src: Node, full: Shape, raxes: tuple[int, ...]) -> bool:
    """Is view ``v`` (over ``src``'s row-major space) the broadcast of a row-level value (shape
    ``full`` with ``raxes`` set to 1) back over the rows of a kernel of shape ``full``?"""
    if v.shape != full or v.offset != 0 or len(src.shape) != len(full):
        return False
    cs = View.contiguous(src.shape).strides
    for a, (n, st) in enumerate(zip(v.shape, v.strides)):
        if a in raxes:
            if src.shape[a] != 1 or (st != 0 and n != 1):
                return False
        elif src.shape[a] != n or (n != 1 and st != cs[a]):
            return False
    return True


def _first_reduce(node: Node) -> Node | None:
    """A reduction reachable from ``node`` through elementwise ops and casts only."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop().resolve()
        if n.id in seen:
            continue
        seen.add(n.id)
        if n.op == "reduce":
            return n
        if n.op in ("ew", "cast"):
            stack.extend(n.srcs)
    return None


class _Analysis:
    """Finds the kernel shape of a root and the nodes that must be materialized first."""

    def __init__(self, root: Node, boundaries: set[int] | None = None) -> None:
        self.root = root
        self.boundaries = boundaries or set()
        self.full: Shape | None = None
        self.raxes: tuple[int, ...] = ()
        self.materialize: list[Node] = []
        self.reduced_out = False
        self._seen: set[tuple[int, str]] = set()
        self.count = 0

    def run(self) -> None:
        r = self.root
        if r.op == "reduce":
            self.full, self.raxes = r.srcs[0].shape, r.arg[1]
            self.reduced_out = True
            self.walk(r.srcs[0], "full")
        else:
            self.walk(r, "out")
        if self.full is None:
            self.full, self.raxes = r.shape, ()

    def _mat(self, n: Node) -> None:
        if all(m is not n for m in self.materialize):
            self.materialize.append(n)

    def _claim(self, full: Shape, axes: tuple[int, ...]) -> bool:
        if self.full is None:
            self.full, self.raxes = full, axes
            return True
        return self.full == full and self.raxes == axes

    def row_view(self, v: View, src: Node, ctx: str) -> bool:
        """Can view ``v`` of ``src`` be evaluated per row (a broadcast back over the kernel's
        reduced axes)? Claims the kernel shape from a reduction inside ``src`` if unset."""
        if ctx == "other":
            return False
        if self.full is not None:
            return bool(self.raxes) and (ctx != "out" or self.root.shape == self.full) and \
                is_expand_back(v, src, self.full, self.raxes)
        red = _first_reduce(src)
        if red is None or self.root.shape != v.shape:
            return False
        full, axes = red.srcs[0].shape, red.arg[1]
        if full == v.shape and is_expand_back(v, src, full, axes):
            return self._claim(full, axes)
        return False

    def walk(self, node: Node, ctx: str) -> None:
        node = node.resolve()
        key = (node.id, ctx)
        if key in self._seen or node.op in ("load", "const", "iota"):
            return
        self._seen.add(key)
        self.count += 1
        if node.id in self.boundaries or (self.count > MAX_FUSED_NODES and node is not
                                          self.root):
            self._mat(node)
            return
        if node.op in ("ew", "cast"):
            for s in node.srcs:
                self.walk(s, ctx)
        elif node.op == "view":
            src = node.srcs[0].resolve()
            if self.row_view(node.arg, src, ctx):
                self.walk(src, "row")
            elif src.op == "reduce":
                self._mat(src)
            else:
                self.walk(src, "other")
        elif node.op == "reduce":
            src_shape, axes = node.srcs[0].shape, node.arg[1]
            if ctx == "out" and node.shape == self.root.shape and self._claim(src_shape, axes):
                self.reduced_out = True
                self.walk(node.srcs[0], "full")
            elif ctx == "row" and self.full == src_shape and self.raxes == axes:
                self.walk(node.srcs[0], "full")
            else:
                self._mat(node)
        else:
            raise NotImplementedError(f"cannot schedule node op {node.op!r}")


def storage_dtype(d: dtypes.DType) -> dtypes.DType:
    """The dtype partial results are kept in (the math type of half and bfloat16)."""
    return dtypes.float32 if d.name in ("float16", "bfloat16") else d


Runner = Callable[[KernelItem], None]


def schedule(targets: list[tuple[Node, Any, View | None]], device: Any, run: Runner) -> None:
    """Compute each target node into its buffer: ``run`` is called on each kernel in launch
    order (it lowers and launches it at once, so that later kernels see earlier results as
    loads). A target with no buffer gets a new contiguous one; computed nodes are marked
    realized."""
    _schedule(targets, device, run)


def _new_output(node: Node, device: Any) -> Output:
    buf = device.alloc(prod(node.shape) * node.dtype.itemsize)
    return Output(node, buf, View.contiguous(node.shape))


def _schedule(targets: list[tuple[Node, Any, View | None]], device: Any, run: Runner) -> None:
    todo = [(node.resolve(), buf, v) for node, buf, v in targets]
    todo = [(n, buf, v) for n, buf, v in todo if not (n.op == "load" and buf is None)]
    # A target inside another target's graph is computed first and read, not recomputed.
    ids = {n.id for n, _, _ in todo}
    first: dict[int, _Analysis] = {}
    materialized = False
    for n, _, _ in todo:
        a = _Analysis(n, boundaries=ids - {n.id})
        a.run()
        first[n.id] = a
        if a.materialize:
            materialized = True
            _schedule([(m, None, None) for m in a.materialize], device, run)
    groups: dict[tuple[Shape, tuple[int, ...], Shape, bool], list[Output]] = {}
    for node, buf, v in todo:
        n = node.resolve()
        if n.op == "load" and buf is None:
            continue  # computed above, as a dependency of another target
        if materialized or n.id not in first:
            a = _Analysis(n)  # what was materialized above is a load now
            a.run()
        else:
            a = first[n.id]
        assert not a.materialize and a.full is not None
        out = _new_output(n, device) if buf is None else Output(n, buf, v or View.contiguous(
            n.shape))
        groups.setdefault((a.full, a.raxes, n.shape, a.reduced_out), []).append(out)
    for (full, raxes, _, reduced), outs in groups.items():
        item = KernelItem(full, raxes, outs, reduced_out=reduced)
        if not _maybe_split(item, device, run):
            run(item)
        for o in outs:
            if o.node.op != "load" and o.view == View.contiguous(o.node.shape):
                o.node.realized = load(o.buffer, o.view, o.node.dtype)


def _single_reduce(item: KernelItem) -> Node | None:
    """The one reduction of a reduced-output kernel with one output, if that is what it is."""
    if len(item.outputs) != 1 or not item.reduced_out:
        return None
    found: list[Node] = []
    seen: set[int] = set()

    def walk(n: Node) -> None:
        n = n.resolve()
        if n.id in seen:
            return
        seen.add(n.id)
        if n.op == "reduce":
            found.append(n)
        for s in n.srcs:
            walk(s)

    walk(item.outputs[0].node)
    return found[0] if len(found) == 1 else None


def _maybe_split(item: KernelItem, device: Any, run: Runner) -> bool:
    """Few long rows: compute the reduction in chunks first (stage 1, its own kernel), so that
    every compute unit works; the item then reduces the chunks (stage 2). On GPUs a single
    row whose output is the reduction itself is finished by stage 1's last work-group (one
    kernel): returns True when the item is done."""
    rows = prod([n for i, n in enumerate(item.full) if i not in item.raxes])
    rn = prod([item.full[i] for i in item.raxes])
    from . import lower as L

    cu = device.caps.compute_units
    if L.column_layout(item, device):
        # a work-item per output element: split the reduced axes until the work-items fill
        # every compute unit, and the parts again while they are long (each work-item of a
        # stage reads its part in order: a short part keeps every stage short)
        chunks = min(L.column_items(device) // max(rows, 1), rn // L.GPU_COL_MIN_CHUNK)
        if rn < (8192 if device.kind == "cpu" else L.GPU_COL_MIN_SPLIT):
            return False  # short columns are not worth a second kernel (a CPU needs few groups)
        red = _single_reduce(item)
        if chunks < 2 or red is None or red.arg[0] not in _SPLIT_OPS:
            return False
        return _split(item, red, chunks, device, run) or _maybe_split(item, device, run)
    # Work-groups to launch in all. CPUs: a few per core. GPUs: enough to fill every compute
    # unit with work-items (occupancy, not core count, hides the memory latency).
    want = 4 * cu if device.kind == "cpu" else L.GPU_SPLIT_GROUPS_PER_CU * cu
    if rn < 8192 or rows >= want:
        return False
    red = _single_reduce(item)
    if red is None or red.arg[0] not in _SPLIT_OPS:
        return False
    chunks = min(max(want // max(rows, 1), 2), rn // 2048)
    if chunks < 2:
        return False
    return _split(item, red, chunks, device, run)


_SPLIT_OPS = ("sum", "prod", "max", "min", "any", "all")


def _split(item: KernelItem, red: Node, chunks: int, device: Any, run: Runner) -> bool:
    """Stage 1 of ``item``'s single reduction in ``chunks`` parts per row (run now); the item
    is left to reduce the parts (stage 2), or, for one row finished by stage 1's last
    work-group, done (returns True)."""
    rows = prod([n for i, n in enumerate(item.full) if i not in item.raxes])
    op, axes = red.arg
    # Partials: the reduced shape with the first reduced axis holding the chunks.
    pshape = tuple(chunks if i == axes[0] else n for i, n in enumerate(red.shape))
    pdtype = storage_dtype(red.dtype)
    pbuf = device.alloc(prod(pshape) * pdtype.itemsize)
    pnode = Node("reduce", red.srcs, red.arg, pdtype, red.shape)
    fin = item.outputs[0]
    if device.kind != "cpu" and rows == 1 and len(item.outputs) == 1 and \
            fin.node.resolve() is red:
        # PERF (H100, sum of 2^24 float32, profiled): one kernel took 32-34 us, two took 37-38
        stage1 = KernelItem(item.full, item.raxes,
                            [Output(pnode, pbuf, View.contiguous(pshape))], reduced_out=True,
                            chunks=chunks, combine=fin, counter=_counter(device))
        run(stage1)
        return True
    stage1 = KernelItem(item.full, item.raxes, [Output(pnode, pbuf, View.contiguous(pshape))],
                        reduced_out=True, chunks=chunks)
    run(stage1)
    from ..graph.ir import reduce as mk_reduce

    stage2 = mk_reduce(op, load(pbuf, View.contiguous(pshape), pdtype), axes, red.dtype)
    red.realized = stage2
    # Re-derive the item over the partials.
    item.full = pshape
    return False


_COUNTERS: dict[int, tuple[Any, Any]] = {}


def _counter(device: Any) -> Any:
    """The device's work-group counter of one-kernel split reductions: an int, zero between
    kernels (each kernel's last work-group sets it back). Kernels that use it write it, so the
    runtime orders them."""
    got = _COUNTERS.get(id(device))
    if got is None or got[0] is not device:
        import numpy as np

        buf = device.alloc(4)
        device.write(buf, np.zeros(1, np.int32), blocking=True)
        got = _COUNTERS[id(device)] = (device, buf)
    return got[1]
