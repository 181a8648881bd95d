"""Compiler, scheduler: splits the pending graph into kernels and makes the schedule that
computes it. Elementwise, cast and movement nodes fuse into their consumer; a reduction fuses
into the kernel that consumes it when it is over that kernel's row axes, so
``(a*b + c).sum(axis=1)``, softmax and RMSNorm are one kernel each. Everything else is
materialized into a buffer first.

Scheduling allocates nothing and launches nothing: new buffers are ``Temp`` placeholders, each
kernel is lowered once, and the ``Schedule`` (a list of entries: allocations and kernel
runs) is run by ``realize.run``."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..graph import ir
from ..graph.dtypes import DType
from ..graph.ir import Node, Shape, View, prod
from .device import Device
from .geometry import (
    GPU_COL_MIN_CHUNK,
    MIN_SPLIT_ROW,
    Geometry,
    column_items,
    column_splits,
    geometry,
    serial_rows,
    split_groups,
)
from .kernel import KernelItem, KernelKey, Lowered, Output, Temp, is_expand_back, storage_dtype
from .lower import lower

# Nodes fused into one kernel before an intermediate is forced into a buffer.
MAX_FUSED_NODES = 400


def _first_reduce(node: Node) -> Node | None:
    """A reduction reachable from ``node`` through elementwise ops and casts only."""
    stack, seen = [node], set()
    while stack:
        n = ir.resolved(stack.pop())
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

    def __init__(self, root: Node, boundaries: set[int] | None = None,
                 split_rows: Callable[[Shape, tuple[int, ...]], bool] | None = None) -> None:
        self.root = root
        self.boundaries = boundaries or set()
        # whether a kernel over (full, reduced axes) would split its rows (few, long): then a
        # reduction inside a row is materialized first, so that it splits too
        self.split_rows = split_rows
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
        node = ir.resolved(node)
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
            src = ir.resolved(node.srcs[0])
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
                if self.split_rows is not None and self.split_rows(src_shape, axes):
                    # PERF (H200, 2^24 float32): argmax's max fused into its index pass ran
                    # on one work-group, 13.5 ms; logsumexp 6.1, var 5.2
                    self._mat(node)
                else:
                    self.walk(node.srcs[0], "full")
            else:
                self._mat(node)
        else:
            raise NotImplementedError(f"cannot schedule node op {node.op!r}")




# -- the schedule ---------------------------------------------------------------------------------
@dataclass
class Alloc:
    """Allocate ``temp`` (from the device's pool) before the entries that follow use it."""

    temp: Temp


@dataclass
class KernelRun:
    """Launch one generated kernel: ``lowered`` holds its ``KernelKey`` and launch values
    (buffers may be ``Temp``s), ``geometry`` its sizes (None: nothing to write, no launch)."""

    item: KernelItem
    lowered: Lowered
    name: str
    geometry: Geometry | None

    @property
    def key(self) -> KernelKey:
        return self.lowered.key

    @property
    def inputs(self) -> list[Any]:
        return self.lowered.reads

    @property
    def outputs(self) -> list[Any]:
        return self.lowered.writes


@dataclass
class Binding:
    """After the schedule has run: ``node`` is realized as a load of ``buffer`` at ``view`` (or, a
    split reduction's stage 2, as the reduction ``reduce`` = (op, axes, dtype) of that load)."""

    node: Node
    buffer: Any
    view: View
    dtype: DType
    reduce: tuple[str, tuple[int, ...], DType] | None = None


@dataclass
class Schedule:
    """The entries that compute some targets, in order, and what they leave realized."""

    entries: list[Alloc | KernelRun] = field(default_factory=list)
    bindings: list[Binding] = field(default_factory=list)

    @property
    def kernels(self) -> list[KernelRun]:
        """The kernels realizing would launch (a run without geometry launches nothing)."""
        return [s for s in self.entries if isinstance(s, KernelRun) and s.geometry is not None]

    @property
    def temps(self) -> list[Temp]:
        return [s.temp for s in self.entries if isinstance(s, Alloc)]

    def __str__(self) -> str:
        lines = []
        for s in self.entries:
            if isinstance(s, Alloc):
                lines.append(f"alloc {s.temp.label} ({s.temp.nbytes} bytes)")
            elif s.geometry is not None:
                g = s.geometry
                lines.append(f"kernel {s.name} global={g.global_size} local={g.local_size} "
                             f"over {list(s.item.full)} reduce axes {list(s.item.raxes)}")
        return "\n".join(lines)


def kernel_name(lw: Lowered) -> str:
    base = "_".join(lw.names) or "copy"
    return "k_" + re.sub(r"[^a-zA-Z0-9_]", "", base)[:40]


def schedule(targets: list[tuple[Node, Any, View | None]], device: Device) -> Schedule:
    """The schedule that computes each target node into its buffer (a target with no buffer gets a
    new contiguous one, a ``Temp`` of the schedule). Kernels come in launch order; later kernels
    read earlier results as loads. The graph is left as it was: the schedule's ``bindings`` mark
    the computed nodes realized when it runs."""
    sch = _Scheduler(device)
    with ir.scheduling() as sch.binds:
        sch.schedule(targets)
    return sch.out


class _Scheduler:
    def __init__(self, device: Device) -> None:
        self.device = device
        self.out = Schedule()
        # node id -> the node scheduling takes it for (``ir.scheduling``: this thread's alone)
        self.binds: dict[int, Node] = {}
        self._ntemps = 0

    # -- the graph, as it will be once earlier entries have run ------------------------------------
    def _bind(self, binding: Binding) -> None:
        """Realize ``binding.node`` for the rest of scheduling (in ``binds``, which this thread's
        ``resolve`` reads); the schedule does it for good when it runs."""
        node = binding.node
        loaded = ir.load(binding.buffer, binding.view, binding.dtype)
        if binding.reduce is not None:
            op, axes, dtype = binding.reduce
            self.binds[node.id] = ir.reduce(op, loaded, axes, dtype)
        else:
            self.binds[node.id] = loaded
        self.out.bindings.append(binding)

    def _temp(self, nbytes: int, what: str, counter: bool = False) -> Temp:
        self._ntemps += 1
        t = Temp(nbytes, f"t{self._ntemps}:{what}", counter=counter)
        self.out.entries.append(Alloc(t))
        return t

    def _kernel(self, item: KernelItem, lw: Lowered) -> None:
        self.out.entries.append(KernelRun(item, lw, kernel_name(lw), geometry(self.device, lw)))

    # -- scheduling ------------------------------------------------------------------------------
    def _new_output(self, node: Node) -> Output:
        buf = self._temp(prod(node.shape) * node.dtype.itemsize,
                         f"{node.dtype.name}{list(node.shape)}")
        return Output(node, buf, View.contiguous(node.shape))

    def schedule(self, targets: list[tuple[Node, Any, View | None]]) -> None:
        todo = [(ir.resolved(node), buf, v) for node, buf, v in targets]
        todo = [(n, buf, v) for n, buf, v in todo if not (n.op == "load" and buf is None)]
        # a reshape written into a buffer: its source is written there (the node it stands
        # for is what the buffer then holds)
        stands_for: dict[int, Node] = {}
        for k, (n, buf, v) in enumerate(todo):
            src = _reshaped(n, buf, v)
            if src is not None and src.id not in stands_for and \
                    all(m.id != src.id for m, _, _ in todo):
                assert buf is not None
                todo[k] = (src, buf, View.contiguous(src.shape, v.offset if v else 0))
                stands_for[src.id] = n
        # A target inside another target's graph is computed first and read, not recomputed.
        ids = {n.id for n, _, _ in todo}
        first: dict[int, _Analysis] = {}
        materialized = False
        for n, _, _ in todo:
            a = _Analysis(n, boundaries=ids - {n.id}, split_rows=self._split_rows)
            a.run()
            first[n.id] = a
            if a.materialize:
                materialized = True
                self.schedule([(m, None, None) for m in a.materialize])
        groups: dict[tuple[Shape, tuple[int, ...], Shape, bool], list[Output]] = {}
        for node, buf, v in todo:
            n = ir.resolved(node)
            if n.op == "load" and buf is None:
                continue  # computed above, as a dependency of another target
            if materialized or n.id not in first:
                # what was materialized above is a load now
                a = _Analysis(n, split_rows=self._split_rows)
                a.run()
            else:
                a = first[n.id]
            assert not a.materialize and a.full is not None
            out = self._new_output(n) if buf is None else Output(n, buf, v or View.contiguous(
                n.shape))
            groups.setdefault((a.full, a.raxes, n.shape, a.reduced_out), []).append(out)
        for (full, raxes, _, reduced), outs in groups.items():
            self._item(KernelItem(full, raxes, outs, reduced_out=reduced))
            for o in outs:
                if o.node.op != "load" and o.view == View.contiguous(o.node.shape):
                    node = stands_for.get(o.node.id, o.node)
                    self._bind(Binding(node, o.buffer, View.contiguous(node.shape),
                                       node.dtype))

    def _split_rows(self, full: Shape, raxes: tuple[int, ...]) -> bool:
        """Would a kernel reducing ``raxes`` of ``full`` split its rows into chunks
        (``_split_choice``: rows fewer than the work-groups wanted, each long; or few long
        columns)? On GPUs only, where a row left whole runs on one work-group."""
        # PERF (2-core EPYC, Intel's runtime, 2^24 float32): split, var 14 -> 8 ms, but
        # logsumexp 20 -> 53-109 (stage 1's exp runs on scalars), so CPUs keep the fused row
        if serial_rows(self.device) or not raxes:
            return False
        rows = prod([n for i, n in enumerate(full) if i not in raxes])
        rn = prod([full[i] for i in raxes])
        if (len(full) - 1) not in raxes:  # the column layout, as _split_choice splits it
            chunks = min(column_items(self.device) // max(rows, 1), rn // GPU_COL_MIN_CHUNK)
            return chunks >= 2 and column_splits(self.device, rn, rows * rn)
        return rn >= MIN_SPLIT_ROW and rows < split_groups(self.device) and rn // 2048 >= 2

    def _item(self, item: KernelItem) -> None:
        """Schedule ``item``, split into two stages where its rows are few and long. Each state
        of the item is lowered once."""
        while True:
            # the column layout is decided by lowering (a cheap structural test first)
            lw = lower(item, self.device) if item.raxes and \
                (len(item.full) - 1) not in item.raxes else None
            col = lw is not None and lw.col
            split = self._split_choice(item, col, lw)
            if split is None:
                self._kernel(item, lw if lw is not None else lower(item, self.device))
                return
            red, chunks = split
            if self._split(item, red, chunks):
                return  # stage 1 finished the row
            if not col:
                self._kernel(item, lower(item, self.device))
                return
            # a column layout over the parts: split again while they are long

    def _split_choice(self, item: KernelItem, col: bool, lw: Lowered | None
                      ) -> tuple[Node, int] | None:
        """Few long rows: compute the reduction in chunks first (stage 1, its own kernel), so
        that every compute unit works; the item then reduces the chunks (stage 2). The single
        reduction and the number of chunks, or None to run the item as it is."""
        device = self.device
        rows = prod([n for i, n in enumerate(item.full) if i not in item.raxes])
        rn = prod([item.full[i] for i in item.raxes])
        if col:
            # a work-item per output element: split the reduced axes until the work-items fill
            # every compute unit, and the parts again while they are long (each work-item of a
            # stage reads its part in order: a short part keeps every stage short)
            items = rows // lw.strip if lw is not None and lw.strip else rows
            chunks = min(column_items(device) // max(items, 1), rn // GPU_COL_MIN_CHUNK)
            if not column_splits(device, rn, rows * rn):
                return None  # short columns are not worth a second kernel
            red = _single_reduce(item)
            if chunks < 2 or red is None or red.arg[0] not in _SPLIT_OPS:
                return None
            return red, chunks
        want = split_groups(device)  # work-groups to launch in all
        if rn < MIN_SPLIT_ROW or rows >= want:
            return None
        red = _single_reduce(item)
        if red is None or red.arg[0] not in _SPLIT_OPS:
            return None
        chunks = min(max(want // max(rows, 1), 2), rn // 2048)
        if chunks < 2:
            return None
        return red, chunks

    def _split(self, item: KernelItem, red: Node, chunks: int) -> bool:
        """Stage 1 of ``item``'s single reduction in ``chunks`` parts per row; the item is left
        to reduce the parts (stage 2), or, for one row finished by stage 1's last work-group,
        done (returns True)."""
        device = self.device
        rows = prod([n for i, n in enumerate(item.full) if i not in item.raxes])
        op, axes = red.arg
        # Partials: the reduced shape with the first reduced axis holding the chunks.
        pshape = tuple(chunks if i == axes[0] else n for i, n in enumerate(red.shape))
        pdtype = storage_dtype(red.dtype)
        pbuf = self._temp(prod(pshape) * pdtype.itemsize, f"partials{list(pshape)}")
        pnode = Node("reduce", red.srcs, red.arg, pdtype, red.shape)
        fin = item.outputs[0]
        parts = [Output(pnode, pbuf, View.contiguous(pshape))]
        if not serial_rows(device) and rows == 1 and len(item.outputs) == 1 and \
                ir.resolved(fin.node) is red:
            # PERF (H100, sum of 2^24 float32, profiled): one kernel took 32-34 us, two 37-38
            counter = self._temp(4, "counter", counter=True)
            stage1 = KernelItem(item.full, item.raxes, parts, reduced_out=True, chunks=chunks,
                                combine=fin, counter=counter)
            self._kernel(stage1, lower(stage1, device))
            return True
        stage1 = KernelItem(item.full, item.raxes, parts, reduced_out=True, chunks=chunks)
        self._kernel(stage1, lower(stage1, device))
        self._bind(Binding(red, pbuf, View.contiguous(pshape), pdtype,
                           reduce=(op, axes, red.dtype)))
        # Re-derive the item over the partials.
        item.full = pshape
        return False


def _reshaped(node: Node, buf: Any, view: View | None) -> Node | None:
    """The source of ``node`` where ``node`` is a reshape of a pending node (a contiguous view
    of all of it from its start: the reduced axes of a reduction dropped) written into ``buf``
    at a contiguous ``view``: the source's values lie in the buffer as the reshape's do, so it
    is written there itself. PERF: the reshape as a target of its own was a copy kernel after
    the source's: ``np.asarray(max(x, axis=2))`` of 256^3 float32 launched ``k_max`` then
    ``k_copy``, 0.33 ms of kernel time on Intel's runtime and 0.63 on PoCL 3.1 (argmax alike;
    64x128x64 argmax 0.05 and 0.08 beside the argmax's 0.38; two cores, loaded)."""
    if buf is None or node.op != "view" or (view is not None and not view.is_contiguous):
        return None
    src = ir.resolved(node.srcs[0])
    v: View = node.arg
    if src.op == "load" or v.offset != 0 or not v.is_contiguous or \
            prod(v.shape) != prod(src.shape) or src.dtype != node.dtype:
        return None
    return src


def _single_reduce(item: KernelItem) -> Node | None:
    """The one reduction of a reduced-output kernel with one output, if that is what it is."""
    if len(item.outputs) != 1 or not item.reduced_out:
        return None
    found: list[Node] = []
    seen: set[int] = set()

    def walk(n: Node) -> None:
        n = ir.resolved(n)
        if n.id in seen:
            return
        seen.add(n.id)
        if n.op == "reduce":
            found.append(n)
        for s in n.srcs:
            walk(s)

    walk(item.outputs[0].node)
    return found[0] if len(found) == 1 else None


_SPLIT_OPS = ("sum", "prod", "max", "min", "any", "all")
