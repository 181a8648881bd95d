"""Compiler, lowering: turns a scheduled kernel into a structural program (SSA ``Instr``s with
numbered leaves, in a ``KernelKey``) plus its launch arguments (a ``Lowered``). The key is the
program-cache key: values, sizes, strides and offsets are arguments, so a new shape or constant
reuses the built program."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..graph.dtypes import DType
from ..graph.ir import Node, View, prod, resolved
from .device import Device
from .geometry import (
    launches_exactly,
    long_flat_index,
    long_row_index,
    own_vector_math,
    own_vector_math_widths,
    serial_rows,
    split_groups,
    vector_math_agrees,
    vector_math_widths,
    vector_width,
    warp_shuffles,
)
from .kernel import (
    VECTOR_ARITHMETIC,
    Instr,
    KernelItem,
    KernelKey,
    KernelOutput,
    Leaf,
    Lowered,
    Reduction,
    ViewArg,
    is_expand_back,
    storage_dtype,
    vector_math,
)

INT32_LIMIT = 2**31 - 1
# Row values a work-item keeps in registers between the passes over a row (softmax: max, sum,
# write). PERF (H100, 256 work-items, float4): 16 covers rows up to 4096; 32 made rows of 1024
# slower (0.65 vs 0.89 of copy bandwidth: the unused steps still cost registers).
ROW_CACHE_ELEMS = 16


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
        self.reduce_regions: list[Reduction] = []
        self.red_of: dict[int, int] = {}  # reduce node id -> reduce slot
        self.memo: dict[tuple[int, int, int], int] = {}
        self.region = 0
        self.nregions = 0
        self.cur: list[Instr] = []
        self.names: list[str] = []

    def val(self) -> int:
        self.nval += 1
        return self.nval - 1

    def emit(self, op: str, **fields: Any) -> int:
        v = self.val()
        self.cur.append(Instr(v, op, **fields))
        return v

    def leaf(self, buf: Any, v: View, dtype: DType) -> int:
        key = (id(buf), v, dtype.name)
        slot = self.leaves.get(key)
        if slot is None:
            slot = self.leaves[key] = len(self.leaf_list)
            self.leaf_list.append((buf, v, dtype))
        return slot

    def expr(self, node: Node, ctx: int) -> int:
        node = resolved(node)
        mk = (self.region, node.id, ctx)
        got = self.memo.get(mk)
        if got is not None:
            return got
        op = node.op
        if op == "load":
            buf, v = node.arg
            out = self.emit("load", slot=self.leaf(buf, v, node.dtype), ctx=ctx,
                            dtype=node.dtype.name)
        elif op == "const":
            self.consts.append((node.arg, node.dtype))
            out = self.emit("const", slot=len(self.consts) - 1, dtype=node.dtype.name)
        elif op == "iota":
            out = self.emit("iota", axis=node.arg, ctx=ctx, dtype=node.dtype.name)
        elif op == "ew":
            srcs = tuple(self.expr(s, ctx) for s in node.srcs)
            kinds = tuple(resolved(s).dtype.name for s in node.srcs)
            out = self.emit("ew", fn=node.arg, srcs=srcs, kinds=kinds, dtype=node.dtype.name)
            if len(self.names) < 4 and node.arg not in self.names:
                self.names.append(node.arg)
        elif op == "cast":
            src = self.expr(node.srcs[0], ctx)
            out = self.emit("cast", srcs=(src,), kinds=(resolved(node.srcs[0]).dtype.name,),
                            dtype=node.dtype.name)
        elif op == "view":
            vsrc = resolved(node.srcs[0])
            vw: View = node.arg
            item = self.item
            if item.raxes and is_expand_back(vw, vsrc, item.full, item.raxes):
                # per-row value broadcast back: evaluate src with the reduced axes at 0
                nctx = self.nctx
                self.nctx += 1
                self.ctx_rank[nctx] = self.rank
                self.cur.append(Instr(-1, "rowctx", ctx=nctx))
                out = self.expr(vsrc, nctx)
            elif vsrc.op == "reduce" and vsrc.id in self.red_of:
                raise AssertionError("a fused reduction is read through a non-broadcast view")
            else:
                self.views.append((vw, vsrc.shape))
                nctx = self.nctx
                self.nctx += 1
                self.ctx_rank[nctx] = len(vsrc.shape)
                self.cur.append(Instr(-1, "ctx", ctx=nctx, slot=len(self.views) - 1, parent=ctx,
                                      vrank=len(vw.shape), srank=len(vsrc.shape)))
                out = self.expr(vsrc, nctx)
        elif op == "reduce":
            out = self.emit("red", slot=self.reduction(node))
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
        # an arg reduction accumulates its values (and their position, the result)
        acc = storage_dtype(resolved(node.srcs[0]).dtype if op in ARG_REDUCTIONS else
                            node.dtype).name
        self.reduce_regions.append(Reduction(op, acc, resolved(node.srcs[0]).dtype.name, body,
                                             instrs))
        self.red_of[node.id] = slot
        if op not in self.names:
            self.names.append(op)
        return slot


def lower(item: KernelItem, device: Device) -> Lowered:
    """The structural kernel of ``item`` on ``device`` and its launch values."""
    lw = _Lowerer(item)
    outs = []
    for o in item.outputs:
        root = resolved(o.node)
        if item.chunks > 1:
            # stage 1 of a split reduction: the root is the reduction itself
            v = lw.val()
            lw.cur.append(Instr(v, "red", slot=lw.reduction(root)))
            outs.append((v, o.node.dtype.name, o.view))
            continue
        if root.op == "reduce" and item.reduced_out:
            val = lw.emit("red", slot=lw.reduction(root))
        else:
            val = lw.expr(root, 0)
        outs.append((val, o.node.dtype.name, o.view))
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
               not any(ins.op == "iota" for ins in out_instrs))
    if flat:
        # Vector loads and stores: VEC elements per work-item when every operand is aligned
        # to VEC elements (a layout class: part of the key, like contiguity).
        vec = vector_width(device)
        dts = [dt for _, _, dt in lw.leaf_list] + [o.node.dtype for o in item.outputs]
        if vec > 1 and total % vec == 0 and all(dt.kind != "c" for dt in dts) and \
                all(v.offset % vec == 0 for v in leaf_views) and \
                all(o.view.offset % vec == 0 for o in item.outputs):
            flat = vec
    leaves = tuple(Leaf(dt.name, len(v.shape), _unit_last(v)) for _, v, dt in lw.leaf_list)
    outputs = tuple(KernelOutput(val, dname, len(ov.shape), _unit_last(ov))
                    for val, dname, ov in outs)
    vmath = False
    own: tuple[str, ...] = ()
    widths = vector_math_widths(device)
    if flat == 1 and widths and vector_math(
            out_instrs, leaves, outputs,
            lambda fn: vector_math_agrees(device, fn) or own_vector_math(device, fn)):
        # PERF: CPUs run slow scalar math (sin, log, ...) on vectors as written; clops' own
        # functions where the runtime's vector forms are wrong
        own = tuple(sorted({i.fn for i in out_instrs if i.op == "ew" and
                            own_vector_math(device, i.fn)}))
        for w in own_vector_math_widths(device) if own else widths:
            if total % w == 0 and all(v.offset % w == 0 for v in leaf_views) and \
                    all(o.view.offset % w == 0 for o in item.outputs):
                flat, vmath = w, True
                break
        if not vmath:
            own = ()
    row_class = _row_class(item, lw, out_instrs, device)
    if ((flat or row_class[3]) and long_flat_index(device)) or \
            (item.raxes and long_row_index(device, len(lw.reduce_regions))):
        # PERF: 64-bit flat indices on CPUs. With `int gid` and int offsets, PoCL sign-extends
        # each `offset + gid` and its work-item loop no longer makes contiguous vector loads:
        # the chain a*b+c*d-e*0.5 ran at 0.84-0.88 of a hand kernel, 0.98 with long.
        wide = True  # (and column reductions: their outputs are work-items too)
    vrow, cache, shfl, col = row_class
    strip = column_strip(item, lw, out_instrs, device) if col else 0
    runs = serial_rows(device) and not col and len(item.raxes) > 1
    vser = serial_vector(item, lw, device) if not col else 0
    # CPUs: whole rows on vectors take runs of adjacent rows per work-item (``geometry.
    # row_batch``). NOTE: not scalar rows: Intel's runtime ran softmax and logsumexp rows (exp
    # on scalars) slower so (64x128x64 softmax 3.5 -> 8.9 ms of kernel time)
    batch = vser > 0 and item.chunks == 1
    key = KernelKey(
        rank=len(full), raxes=item.raxes,
        # split: stage 1 of a split reduction; combine: the final dtype where the last
        # work-group finishes the row
        chunked=item.chunks > 1,
        combine=item.combine.node.dtype.name if item.combine is not None else None,
        reduced_out=item.reduced_out, flat=flat, wide=wide,
        leaves=leaves,
        views=tuple(ViewArg(len(v.shape), len(s)) for v, s in lw.views),
        consts=tuple(dt.name for _, dt in lw.consts),
        reductions=tuple(lw.reduce_regions), instrs=out_instrs,
        outputs=outputs,
        # Bounds check on the flat index: GPUs launch whole work-groups past the end; CPUs
        # launch exactly (and PERF: an early return keeps PoCL from vectorizing).
        guard=not launches_exactly(device),
        vrow=vrow, cache=cache, shfl=shfl, col=col, vmath=vmath, own_math=own,
        strip=strip, runs=runs, vser=vser, batch=batch,
    )
    return Lowered(
        key=key, leaf_buffers=[b for b, _, _ in lw.leaf_list], leaf_views=leaf_views,
        view_args=lw.views, const_values=lw.consts,
        out_buffers=[o.buffer for o in item.outputs], out_views=[o.view for o in item.outputs],
        full=full, raxes=item.raxes, chunks=item.chunks, flat=flat, wide=wide,
        names=lw.names, vrow=vrow, col=col, strip=strip, batch=batch,
        combine=(item.counter, item.combine.buffer, item.combine.view)
        if item.combine is not None else None,
    )


def _row_class(item: KernelItem, lw: _Lowerer, out_instrs: tuple[Instr, ...], device: Device
               ) -> tuple[int, int, bool, bool]:
    """Layout and capability classes of a row (reduction) kernel on a GPU, all part of the key:
    (vector width along the rows, register cache steps per work-item, warp shuffles, column
    layout)."""
    if not item.raxes:
        return 0, 0, False, False
    full, raxes, rank = item.full, item.raxes, len(item.full)
    regions = [r.instrs for r in lw.reduce_regions]
    every = [i for r in regions for i in r] + list(out_instrs)
    if _column_layout(item, lw, every):
        return 0, 0, False, True
    if serial_rows(device):
        return 0, 0, False, False
    if any(i.op in ("ctx", "iota") for i in every):
        vec = 0  # views and indices need index math per element
    else:
        vec = vector_width(device)
    slots = sorted({i.slot for i in every if _row_load(i)})
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
    passes = sum(any(_row_load(i) for i in r) for r in regions)
    if not item.reduced_out:
        passes += any(_row_load(i) for i in out_instrs)
    cache = 0
    if ROW_CACHE_ELEMS and item.chunks == 1 and passes >= 2 and slots:
        cache = max(1, ROW_CACHE_ELEMS // (max(vec, 1) * len(slots)))
    return vec, cache, warp_shuffles(device), False


def _row_load(ins: Instr) -> bool:
    """A load along the row (context 0)."""
    return ins.op == "load" and ins.ctx == 0


def _column_layout(item: KernelItem, lw: _Lowerer, every: list[Instr]) -> bool:
    """A reduction over leading axes whose row loads are contiguous along the kernel's last
    axis, which the reduction keeps (column sums): a work-item per output element (see
    geometry.GPU_COL_LOCAL). Structural, like every layout class: a new shape reuses the program."""
    full, raxes = item.full, item.raxes
    if (len(full) - 1) in raxes or item.combine is not None:
        return False
    slots = {i.slot for i in every if _row_load(i)}
    return bool(slots) and all(_unit_last(lw.leaf_list[k][1]) for k in slots)


# CPUs' column layout: outputs per work-item, the widest that divides the last axis, read as
# float8 vectors. PERF (4096x4096 float32 column sum, two cores, hand kernels): a work-item
# per column 22.6 ms on Intel's runtime (the group in lockstep 36), a strip of 8 columns
# 21.8, of 64 columns 4.7-5.6 (numpy 3.8-4.4); on PoCL 3.1 148, 10.6, 6.1-9.1: a strip
# reads whole cache lines of each row, its accumulators in registers.
CPU_STRIP_WIDTHS = (64, 32, 16, 8)  # multiples of the renderer's strip_vector
# Reductions and float32 operations that give the same values on vectors as on scalars.
STRIP_REDUCTIONS = frozenset({"sum", "max", "min"})
STRIP_EW = VECTOR_ARITHMETIC | {"divide"}
# Math a strip runs on the runtime's vector forms where they give its scalar values (a probe,
# ``vector_math_agrees``). PERF (logsumexp of 256^3 float32, two cores, ms a call, numpy 51-55
# in the same runs): over axis 0 90.9 -> 13.8 on Intel's runtime, 62.1 -> 15.5 on PoCL 3.1;
# over axis 1 124.4 -> 12.9, 76.9 -> 14.0 (exp kept the lockstep layout, a work-item per
# output).
STRIP_MATH = frozenset({"exp", "log"})


def _strip_math(device: Device) -> Callable[[str], bool]:
    """Whether a function runs on the vectors of a strip or a serial row on ``device``: one of
    ``STRIP_MATH`` whose vector form there agrees with its scalar one."""
    return lambda fn: fn in STRIP_MATH and vector_math_agrees(device, fn)


def column_strip(item: KernelItem, lw: _Lowerer, out_instrs: tuple[Instr, ...],
                 device: Device) -> int:
    """Outputs per work-item of a column layout on a CPU (0: one, the group in lockstep): a
    strip of the last axis when every operand is float32, the reductions and operations are
    exact on vectors (or every reduction is an arg reduction whose positions are the int64
    outputs), and the strip width divides the last axis (a layout class)."""
    if not serial_rows(device) or (not item.reduced_out and item.chunks == 1):
        return 0
    arg = any(r.op in ARG_REDUCTIONS for r in lw.reduce_regions)
    if arg and (item.chunks > 1 or any(r.op not in ARG_REDUCTIONS for r in lw.reduce_regions)
                or any(i.op != "red" for i in out_instrs)):
        return 0
    out_dtype = "int64" if arg else "float32"
    if any(dt.name != "float32" for _, _, dt in lw.leaf_list) or lw.views or \
            any(o.node.dtype.name != out_dtype or not _unit_last(o.view)
                for o in item.outputs):
        return 0
    math = _strip_math(device)
    for r in lw.reduce_regions:
        if r.op not in STRIP_REDUCTIONS | ARG_REDUCTIONS or r.acc != "float32" or \
                r.src != "float32" or \
                not all(_strip_instr(i, loads=True, math=math) for i in r.instrs):
            return 0
    if not all(_strip_instr(i, loads=False, math=math) for i in out_instrs):
        return 0
    last = item.full[-1]
    return next((w for w in CPU_STRIP_WIDTHS if last % w == 0), 0)


# Reductions to the position of the first maximum or minimum of float values along one axis
# (NaN counts as either), rendered on CPUs' serial rows and column strips alone
# (``arg_reduce_native``).
ARG_REDUCTIONS = frozenset({"argmax", "argmin"})


def arg_reduce_native(device: Device, dtype: DType, shape: tuple[int, ...], axis: int) -> bool:
    """Whether an ``argmax``/``argmin`` reduction node of ``dtype`` values over ``axis`` of
    ``shape`` compiles on ``device`` in one pass: CPUs, float32 values, along the last axis
    (serial rows) or a leading one where a ``CPU_STRIP_WIDTHS`` width divides the last (a
    column strip); elsewhere an arg reduction is a max reduction, then a min reduction of the
    positions that hold it (two passes)."""
    return serial_rows(device) and dtype.name == "float32" and \
        (axis == len(shape) - 1 or any(shape[-1] % w == 0 for w in CPU_STRIP_WIDTHS))


# CPUs: rows this long or longer, fewer than the split reduction's work-groups, are arg-reduced
# in chunks (``arg_row_chunks``); a shorter row is read by one core in less time than the three
# launches that take the chunks in cost.
ARG_SPLIT_ROW = 1 << 20


def arg_row_chunks(device: Device, rows: int, n: int) -> int:
    """Chunks each of ``rows`` rows of ``n`` contiguous values is cut into for a one-pass arg
    reduction on a CPU (0: none), so that every core takes a part: a power of two that divides
    ``n``, enough for ``split_groups`` work-groups in all."""
    if not serial_rows(device) or n < ARG_SPLIT_ROW or rows >= split_groups(device):
        return 0
    k = 2
    while k * rows < split_groups(device):
        k *= 2
    while k >= 2 and n % k:
        k //= 2
    return k if k >= 2 else 0


# CPUs: vector width of serial rows on vectors (``serial_vector``); the renderer keeps several
# accumulators of it. PERF (sum of 2^24 float32, two cores, hand kernels, kernel time): 8
# scalar accumulators 3.1-4.2 ms on Intel's runtime, float8 vectors x 4 accumulators 2.3-3.1,
# float16 x 4 2.3-2.5 (numpy 4.3-5.3); an argmax on float8 lanes 3.0-3.4 ms on Intel's, 3.4-4.3
# on PoCL 3.1, on scalar pairs 7-13.
CPU_SERIAL_VECTOR = 8


def serial_vector(item: KernelItem, lw: _Lowerer, device: Device) -> int:
    """Vector width of a CPU's serial rows (0: scalar): when the last axis is reduced (whole
    rows or stage 1 of a split reduction), every reduction is ``STRIP_REDUCTIONS`` (or an arg
    reduction) of float32 values computed by float32 loads along the row with unit stride on
    the last axis, constants, operations exact on vectors and ``STRIP_MATH`` functions whose
    vector forms agree with the scalar ones (a layout class, like ``column_strip``).
    PERF (logsumexp, exp on the vectors, two cores with AVX-512, Intel's runtime, wall ms with
    the read, in turns): 2^24 float32 over all 23.4-27.4 -> 5.8 (numpy 19.2), 4096x4096 over
    axis 1 11.8-12.0 -> 7.6-8.0 (numpy 30.4).

    PERF (kernel time, medians of 21 calls in turns, two cores, before -> after, ms; whole rows
    were scalar before, 8 accumulators): 4096x4096 over axis 1 ``max`` 3.22 -> 2.53 on Intel's
    runtime, 2.90 -> 2.71 on PoCL 3.1, ``sum`` 2.83 -> 1.95 and 2.32 -> 2.03; 256^3 over axis 2
    ``max`` 3.65 -> 2.84, 3.34 -> 3.03 (a quiet machine; loaded, Intel's ``max`` of 4096x4096
    9.9 -> 3.9); 64x128x64 over axis 2 with ``row_batch`` ``max`` 0.169 -> 0.072 and 0.205 ->
    0.107, ``sum`` 0.145 -> 0.066 and 0.139 -> 0.057."""
    if not serial_rows(device) or (len(item.full) - 1) not in item.raxes or not lw.reduce_regions:
        return 0
    math = _strip_math(device)
    for r in lw.reduce_regions:
        if (r.op not in STRIP_REDUCTIONS and r.op not in ARG_REDUCTIONS) or \
                r.acc != "float32" or r.src != "float32":
            return 0
        for ins in r.instrs:
            if not _strip_instr(ins, loads=True, math=math) or \
                    (ins.op == "load" and not _unit_last(lw.leaf_list[ins.slot][1])):
                return 0
    return CPU_SERIAL_VECTOR


def _strip_instr(ins: Instr, loads: bool, math: Callable[[str], bool] = lambda fn: False
                 ) -> bool:
    """Whether ``ins`` runs on float32 vectors (``math``: the functions beyond ``STRIP_EW``
    whose vector forms the device computes right)."""
    if ins.op == "load":
        return loads and ins.ctx == 0 and ins.dtype == "float32"
    if ins.op == "const":
        return ins.dtype == "float32"
    if ins.op == "ew":
        return (ins.fn in STRIP_EW or math(ins.fn)) and ins.dtype == "float32" and \
            all(k == "float32" for k in ins.kinds)
    # an earlier reduction's result (var: the mean), read in a row context of its own (loads
    # in it are refused above: only context 0 is rendered on vectors)
    return ins.op in ("red", "rowctx")


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
