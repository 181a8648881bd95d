"""Compiler, lowering: turns a scheduled kernel into a structural program (SSA instructions with
numbered leaves) plus its launch arguments. The instructions are the cache key: values, sizes,
strides and offsets are arguments, so a new shape or constant reuses the built program."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..graph.dtypes import DType
from ..graph.ir import Node, View, prod
from .schedule import KernelItem, is_expand_back, storage_dtype

INT32_LIMIT = 2**31 - 1
# Elements per work-item of contiguous elementwise kernels, by device kind. PERF: PoCL already
# vectorizes across work-items; explicit vectors measured 15-20% slower there.
VECTOR_WIDTH = {"cpu": 1, "gpu": 4}

# Reductions on GPUs: work-items per row (a row kernel's local size). One size for every shape,
# so that a new shape never needs a new program.
GPU_ROW_LOCAL = 256
# Split reductions (stage 1): local size, and work-groups per compute unit to launch in all.
# PERF (H100): 4 x 512 = 2048 work-items per unit, the most it holds: occupancy, not the unit
# count, hides the memory latency; fewer partials keep stage 2 short (~5 us of 35 at 2^24).
GPU_SPLIT_LOCAL = 512
GPU_SPLIT_GROUPS_PER_CU = 4
# Row values a work-item keeps in registers between the passes over a row (softmax: max, sum,
# write). PERF (H100, 256 work-items, float4): 16 covers rows up to 4096; 32 made rows of 1024
# slower (0.65 vs 0.89 of copy bandwidth: the unused steps still cost registers).
ROW_CACHE_ELEMS = 16
# Reductions over leading axes (column sums: x.sum(axis=0) of a row-major matrix): one
# work-item per output element, adjacent work-items on adjacent elements, so that every step of
# the loop over the reduced axes reads a contiguous run. (On GPUs a work-group per output
# element reads one element of each row: a 32-byte sector for 4 bytes. On PoCL a work-item per
# group walked a column alone: a 4096x4096 column sum in 68 ms, numpy 3.6; now 4.3, and
# 100000x64 in 71 ms, now 1.7, numpy 1.9.)
# Work-items per group, per GPU compute unit to launch in all (the reduced axes are split into
# chunks until there are that many), and the fewest reduced elements per chunk.
GPU_COL_LOCAL = 128
CPU_COL_LOCAL = 16  # PERF (PoCL, 4096x4096 column sum): 16 work-items 5.3 ms, 64 22, 256 16
GPU_COL_ITEMS_PER_CU = 2048
GPU_COL_MIN_CHUNK = 32
# Columns shorter than this are never split on GPUs: a second kernel (and its build, the first
# time a shape needs one) costs more than a work-item reading the column alone.
# PERF (H100, (rows, 3) float32 column sum, first kernel start to last end, median of 30):
# whole / split 64 rows 7 / 90 us, 1024 27 / 93, 4096 90 / 193, 16384 338 / 197.
GPU_COL_MIN_SPLIT = 8192


@dataclass
class Lowered:
    """What rendering and launching need. ``key`` is everything that shapes the source."""

    key: tuple[Any, ...]
    # runtime values, in argument order
    leaf_buffers: list[Any] = field(default_factory=list)
    leaf_views: list[View] = field(default_factory=list)
    view_args: list[tuple[View, tuple[int, ...]]] = field(default_factory=list)
    const_values: list[tuple[Any, DType]] = field(default_factory=list)
    out_buffers: list[Any] = field(default_factory=list)
    out_views: list[View] = field(default_factory=list)
    full: tuple[int, ...] = ()
    raxes: tuple[int, ...] = ()
    chunks: int = 1
    flat: int = 0  # 0: index math; 1: one element per work-item; n: n-wide vectors
    vrow: int = 0  # row kernels: n-wide vector loads along contiguous, aligned rows
    wide: bool = False
    names: list[str] = field(default_factory=list)
    # one-kernel split reductions: (counter, final buffer, final view)
    combine: tuple[Any, Any, View] | None = None
    col: bool = False  # a reduction over leading axes, a work-item per output


class _Lowerer:
    def __init__(self, item: KernelItem) -> None:
        self.item = item
        self.rank = len(item.full)
        self.leaves: dict[tuple[int, View, str], int] = {}
        self.leaf_list: list[tuple[Any, View, DType]] = []
        self.views: list[tuple[View, tuple[int, ...]]] = []
        self.consts: list[tuple[Any, DType]] = []
        self.nval = 0
        self.nctx = 1  # ctx 0: the kernel index (rank = len(full))
        self.ctx_rank = {0: self.rank}
        # regions: list of (kind, instrs); reduce regions first (dependency order), then outputs
        self.reduce_regions: list[tuple[Any, ...]] = []
        self.red_of: dict[int, int] = {}  # reduce node id -> reduce slot
        self.memo: dict[tuple[int, int, int], int] = {}
        self.region = 0
        self.nregions = 0
        self.cur: list[tuple[Any, ...]] = []
        self.names: list[str] = []

    def val(self) -> int:
        self.nval += 1
        return self.nval - 1

    def emit(self, ins: tuple[Any, ...]) -> int:
        v = self.val()
        self.cur.append((v, *ins))
        return v

    def leaf(self, buf: Any, v: View, dtype: DType) -> int:
        key = (id(buf), v, dtype.name)
        slot = self.leaves.get(key)
        if slot is None:
            slot = self.leaves[key] = len(self.leaf_list)
            self.leaf_list.append((buf, v, dtype))
        return slot

    def expr(self, node: Node, ctx: int) -> int:
        node = node.resolve()
        mk = (self.region, node.id, ctx)
        got = self.memo.get(mk)
        if got is not None:
            return got
        op = node.op
        if op == "load":
            buf, v = node.arg
            out = self.emit(("load", self.leaf(buf, v, node.dtype), ctx, node.dtype.name))
        elif op == "const":
            self.consts.append((node.arg, node.dtype))
            out = self.emit(("const", len(self.consts) - 1, node.dtype.name))
        elif op == "iota":
            out = self.emit(("iota", node.arg, ctx, node.dtype.name))
        elif op == "ew":
            srcs = tuple(self.expr(s, ctx) for s in node.srcs)
            kinds = tuple(s.resolve().dtype.name for s in node.srcs)
            out = self.emit(("ew", node.arg, srcs, kinds, node.dtype.name))
            if len(self.names) < 4 and node.arg not in self.names:
                self.names.append(node.arg)
        elif op == "cast":
            src = self.expr(node.srcs[0], ctx)
            out = self.emit(("cast", src, node.srcs[0].resolve().dtype.name, node.dtype.name))
        elif op == "view":
            vsrc = node.srcs[0].resolve()
            vw: View = node.arg
            item = self.item
            if item.raxes and is_expand_back(vw, vsrc, item.full, item.raxes):
                # per-row value broadcast back: evaluate src with the reduced axes at 0
                nctx = self.nctx
                self.nctx += 1
                self.ctx_rank[nctx] = self.rank
                self.cur.append((-1, "rowctx", nctx))
                out = self.expr(vsrc, nctx)
            elif vsrc.op == "reduce" and vsrc.id in self.red_of:
                raise AssertionError("a fused reduction is read through a non-broadcast view")
            else:
                self.views.append((vw, vsrc.shape))
                nctx = self.nctx
                self.nctx += 1
                self.ctx_rank[nctx] = len(vsrc.shape)
                self.cur.append((-1, "ctx", nctx, len(self.views) - 1, ctx, len(vw.shape),
                                 len(vsrc.shape)))
                out = self.expr(vsrc, nctx)
        elif op == "reduce":
            out = self.emit(("red", self.reduction(node)))
        else:
            raise NotImplementedError(op)
        self.memo[mk] = out
        return out

    def reduction(self, node: Node) -> int:
        slot = self.red_of.get(node.id)
        if slot is not None:
            return slot
        # Lower the body into its own region (nested reductions first, by recursion).
        saved_cur, saved_region = self.cur, self.region
        self.cur = []
        self.nregions += 1
        self.region = self.nregions
        body = self.expr(node.srcs[0], 0)
        instrs = tuple(self.cur)
        self.cur, self.region = saved_cur, saved_region
        slot = len(self.reduce_regions)
        op = node.arg[0]
        acc = storage_dtype(node.dtype).name
        self.reduce_regions.append((op, acc, node.srcs[0].resolve().dtype.name, body, instrs))
        self.red_of[node.id] = slot
        if op not in self.names:
            self.names.append(op)
        return slot


def lower(item: KernelItem, device: Any) -> Lowered:
    lw = _Lowerer(item)
    outs = []
    for o in item.outputs:
        root = o.node.resolve()
        if item.chunks > 1:
            # stage 1 of a split reduction: the root is the reduction itself
            v = lw.val()
            lw.cur.append((v, "red", lw.reduction(root)))
            outs.append((v, o.node.dtype.name))
            continue
        if root.op == "reduce" and item.reduced_out:
            val = lw.emit(("red", lw.reduction(root)))
        else:
            val = lw.expr(root, 0)
        outs.append((val, o.node.dtype.name))
    out_instrs = tuple(lw.cur)

    full = item.full
    total = prod(full)
    leaf_views = [v for _, v, _ in lw.leaf_list]
    wide = total > INT32_LIMIT
    for lv in leaf_views:
        lo, hi = lv.extent()
        if hi > INT32_LIMIT or lo < -INT32_LIMIT:
            wide = True
    for o in item.outputs:
        if o.view.extent()[1] > INT32_LIMIT:
            wide = True
    # Flat layout: every leaf and output is contiguous over the kernel shape, no index math.
    flat = int(not item.raxes and lw.nctx == 1 and
               all(v.shape == full and v.is_contiguous for v in leaf_views) and
               all(o.view.is_contiguous for o in item.outputs) and
               not any(ins[1] == "iota" for ins in out_instrs if len(ins) > 1))
    if flat:
        # Vector loads and stores: VEC elements per work-item when every operand is aligned
        # to VEC elements (a layout class: part of the key, like contiguity).
        vec = VECTOR_WIDTH.get(device.kind, 4)
        dts = [dt for _, _, dt in lw.leaf_list] + [o.node.dtype for o in item.outputs]
        if vec > 1 and total % vec == 0 and all(dt.kind != "c" for dt in dts) and \
                all(v.offset % vec == 0 for v in leaf_views) and \
                all(o.view.offset % vec == 0 for o in item.outputs):
            flat = vec
    row_class = _row_class(item, lw, out_instrs, device)
    if (flat or row_class[3]) and device.kind == "cpu":
        # PERF: 64-bit flat indices on CPUs. With `int gid` and int offsets, PoCL sign-extends
        # each `offset + gid` and its work-item loop no longer makes contiguous vector loads:
        # the chain a*b+c*d-e*0.5 ran at 0.84-0.88 of a hand kernel, 0.98 with long.
        wide = True  # (and column reductions: their outputs are work-items too)
    key = (
        "k", len(full), item.raxes,
        # split: 1, or the final dtype where the last work-group finishes the row (combine)
        (("combine", item.combine.node.dtype.name) if item.combine is not None
         else int(item.chunks > 1)),
        item.reduced_out, flat, wide,
        tuple((dt.name, len(v.shape), _unit_last(v)) for _, v, dt in lw.leaf_list),
        tuple((len(v.shape), len(s)) for v, s in lw.views),
        tuple(dt.name for _, dt in lw.consts),
        tuple(lw.reduce_regions), out_instrs, tuple(outs),
        tuple((len(o.view.shape), _unit_last(o.view)) for o in item.outputs),
        # Bounds check on the flat index: GPUs launch whole work-groups past the end; CPUs
        # launch exactly (and PERF: an early return keeps PoCL from vectorizing).
        device.kind != "cpu",
        *row_class,
    )
    return Lowered(
        key=key, leaf_buffers=[b for b, _, _ in lw.leaf_list], leaf_views=leaf_views,
        view_args=lw.views, const_values=lw.consts,
        out_buffers=[o.buffer for o in item.outputs], out_views=[o.view for o in item.outputs],
        full=full, raxes=item.raxes, chunks=item.chunks, flat=flat, wide=wide,
        names=lw.names, vrow=row_class[0], col=row_class[3],
        combine=(item.counter, item.combine.buffer, item.combine.view)
        if item.combine is not None else None,
    )


def _row_class(item: KernelItem, lw: _Lowerer, out_instrs: tuple[Any, ...], device: Any
               ) -> tuple[int, int, bool, bool]:
    """Layout and capability classes of a row (reduction) kernel on a GPU, all part of the key:
    (vector width along the rows, register cache steps per work-item, warp shuffles, column
    layout)."""
    if not item.raxes:
        return 0, 0, False, False
    full, raxes, rank = item.full, item.raxes, len(item.full)
    regions = [ins for _, _, _, _, ins in lw.reduce_regions]
    every = [i for r in regions for i in r] + list(out_instrs)
    if _column_layout(item, lw, every):
        return 0, 0, False, True
    if device.kind == "cpu":
        return 0, 0, False, False
    if any(len(i) > 1 and i[1] in ("ctx", "iota") for i in every):
        vec = 0  # views and indices need index math per element
    else:
        vec = VECTOR_WIDTH.get(device.kind, 4)
    slots = sorted({i[2] for i in every if len(i) > 1 and i[1] == "load" and i[3] == 0})
    rn = prod([full[a] for a in raxes])
    if vec > 1:
        # Vector class: rows are the trailing axes; every operand read along the row is
        # contiguous over the kernel shape and aligned to the width, like ``flat``.
        views = [lw.leaf_list[k][1] for k in slots]
        dts = [lw.leaf_list[k][2] for k in slots]
        row_out = not item.reduced_out and item.chunks == 1
        if row_out:
            views += [o.view for o in item.outputs]
            dts += [o.node.dtype for o in item.outputs]
        ok = raxes == tuple(range(rank - len(raxes), rank)) and rn % vec == 0 and \
            all(v.shape == full and v.is_contiguous and v.offset % vec == 0 for v in views) \
            and all(dt.kind != "c" for dt in dts)
        vec = vec if ok else 0
    else:
        vec = 0
    # Register cache: rows read more than once (softmax: max, sum, write) keep the values of
    # the first pass when the row fits (checked at run time; the slow path stays).
    passes = sum(any(len(i) > 1 and i[1] == "load" and i[3] == 0 for i in r) for r in regions)
    if not item.reduced_out:
        passes += any(len(i) > 1 and i[1] == "load" and i[3] == 0 for i in out_instrs)
    cache = 0
    if ROW_CACHE_ELEMS and item.chunks == 1 and passes >= 2 and slots:
        cache = max(1, ROW_CACHE_ELEMS // (max(vec, 1) * len(slots)))
    shfl = _nvidia_ptx(device)
    return vec, cache, shfl, False


def _column_layout(item: KernelItem, lw: _Lowerer, every: list[Any]) -> bool:
    """A reduction over leading axes whose row loads are contiguous along the kernel's last
    axis, which the reduction keeps (column sums): a work-item per output element (see
    GPU_COL_LOCAL). Structural, like every layout class: a new shape reuses the program."""
    full, raxes = item.full, item.raxes
    if (len(full) - 1) in raxes or item.combine is not None:
        return False
    slots = {i[2] for i in every if len(i) > 1 and i[1] == "load" and i[3] == 0}
    return bool(slots) and all(_unit_last(lw.leaf_list[k][1]) for k in slots)


def column_layout(item: KernelItem, device: Any) -> bool:
    """Whether ``item`` lowers to the column layout on ``device`` (a cheap test first)."""
    if not item.raxes or (len(item.full) - 1) in item.raxes:
        return False
    return lower(item, device).col


def column_items(device: Any) -> int:
    """Work-items a column-layout reduction should launch in all (its reduced axes are split
    until it does): GPUs, ``GPU_COL_ITEMS_PER_CU`` per compute unit; CPUs, a few groups per
    core (PoCL runs a group's work-items as vector lanes)."""
    cu = device.caps.compute_units
    return 4 * cu * CPU_COL_LOCAL if device.kind == "cpu" else GPU_COL_ITEMS_PER_CU * cu


def _nvidia_ptx(device: Any) -> bool:
    """NVIDIA inline PTX (warp shuffles), by the runtime's capability probe (run once per
    device and driver, then read from its caps)."""
    probe = getattr(device, "probe", None)
    return bool(probe("nvidia_ptx")) if probe is not None else False


def _unit_last(v: View) -> bool:
    """Layout class of an operand: unit stride on its last axis (lets the renderer drop a
    multiply and the device compiler vectorize)."""
    return bool(v.shape) and v.strides[-1] == 1


def scalar_arg(value: Any, dtype: DType) -> Any:
    """A constant as a kernel argument of the dtype's math type."""
    if dtype.kind == "c":
        c = complex(value)
        npd = np.dtype([("x", np.float32), ("y", np.float32)]) if dtype.name == "complex64" \
            else np.dtype([("x", np.float64), ("y", np.float64)])
        return np.array((c.real, c.imag), dtype=npd)
    if dtype.name in ("float16", "bfloat16"):
        return np.float32(value)
    if dtype.kind == "b":
        return np.int32(bool(value))
    return dtype.np.type(value)
