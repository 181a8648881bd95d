"""Compiler, realize: schedule pending nodes, look each kernel up by structure (render and build
only on a miss), and launch it through the runtime with sizes, strides and offsets as args."""

from __future__ import annotations

import math
import re
import sys
from typing import Any

import numpy as np

from .. import _config
from ..graph.ir import Node, View, contiguous_strides, prod
from .lower import (
    CPU_COL_LOCAL,
    GPU_COL_LOCAL,
    GPU_ROW_LOCAL,
    GPU_SPLIT_LOCAL,
    Lowered,
    lower,
    scalar_arg,
)
from .render import Renderer
from .schedule import KernelItem, schedule

_RENDERER = Renderer()
# (device id, structural key, local size) -> (pyopencl Kernel, name)
_KERNELS: dict[tuple[int, tuple[Any, ...], int], tuple[Any, str]] = {}
STATS = {"launches": 0}


def _kernel_name(lw: Lowered) -> str:
    base = "_".join(lw.names) or "copy"
    return "k_" + re.sub(r"[^a-zA-Z0-9_]", "", base)[:40]


def _local_size(device: Any, lw: Lowered) -> int:
    if not lw.raxes:
        return 0
    if device.kind == "cpu" or lw.col:
        # PERF: on PoCL a serial row per work-item with unrolled accumulators wins; the
        # column layout is the same body over adjacent outputs (launch() groups them)
        return 1
    # One work-group size for every shape, so a new shape never needs a new program; split
    # reductions (stage 1) launch GPU_SPLIT_GROUPS_PER_CU groups of their size per unit.
    L = GPU_SPLIT_LOCAL if lw.chunks > 1 else GPU_ROW_LOCAL
    return min(L, device.caps.max_work_group)


def run_item(item: KernelItem, device: Any) -> None:
    if _config.CONFIG.debug >= 2:
        outs = ", ".join(f"{o.node.dtype.name}{list(o.view.shape)}" for o in item.outputs)
        print(f"[clops] schedule: kernel over {list(item.full)} reduce axes {list(item.raxes)}"
              f"{' chunks ' + str(item.chunks) if item.chunks > 1 else ''} -> {outs}",
              file=sys.stderr)
    lw = lower(item, device)
    L = _local_size(device, lw)
    ck = (id(device), lw.key, L)
    hit = _KERNELS.get(ck)
    if hit is None:
        name = _kernel_name(lw)
        src = _RENDERER.render(lw.key, L, name)
        if _config.CONFIG.debug >= 1:
            print(f"[clops] kernel {name}:\n{src}", file=sys.stderr)
        hit = _KERNELS[ck] = (device.kernel(src, name, arg_types=_RENDERER.arg_types), name)
    kernel, name = hit
    launch(device, kernel, name, lw, L)


def launch(device: Any, kernel: Any, name: str, lw: Lowered, L: int) -> None:
    outputs = prod([n for i, n in enumerate(lw.full) if i not in lw.raxes])
    if outputs == 0:
        return  # nothing to write (sizes of other axes may not even fit the index type)
    I = np.int64 if lw.wide else np.int32
    args: list[Any] = []
    flat = lw.flat
    for buf, v in zip(lw.out_buffers, lw.out_views):
        args += [buf, I(v.offset)]
        if not flat:
            args += [I(s) for s in v.strides]
    for buf, v in zip(lw.leaf_buffers, lw.leaf_views):
        args += [buf, I(v.offset)]
        if not flat:
            args += [I(s) for s in v.strides]
    for v, src_shape in lw.view_args:
        args.append(I(v.offset))
        args += [I(s) for s in v.strides]
        args += [I(n) for n in src_shape]
        args += [I(p) for p in contiguous_strides(src_shape)]
    for value, dt in lw.const_values:
        args.append(scalar_arg(value, dt))
    full = lw.full
    if not flat:
        args += [I(n) for n in full]
    gsize: tuple[int, ...]
    lsize: tuple[int, ...] | None
    if lw.raxes:
        rows = prod([n for i, n in enumerate(full) if i not in lw.raxes])
        rn = prod([full[i] for i in lw.raxes])
        args += [I(rows), I(rn)]
        outputs = rows
        if lw.chunks > 1:
            chunk = -(-rn // lw.chunks)
            if lw.vrow:
                chunk = -(-chunk // lw.vrow) * lw.vrow  # chunks start aligned to the vectors
            args += [I(lw.chunks), I(chunk)]
            rows *= lw.chunks
            if lw.combine is not None:
                counter, fbuf, fview = lw.combine
                args += [counter, fbuf, I(fview.offset)]
        if rows == 0:
            return
        if lw.col:
            # a work-item per output (the first axis) and chunk (the second). CPUs launch
            # exactly (the kernel has no bounds check) in groups that divide the outputs: the
            # group's work-items step through their loops together
            if device.kind == "cpu":
                wg = math.gcd(outputs, CPU_COL_LOCAL)
                gsize, lsize = (outputs, lw.chunks), (wg, 1)
            else:
                wg = min(GPU_COL_LOCAL, device.caps.max_work_group)
                gsize, lsize = (-(-outputs // wg) * wg, lw.chunks), (wg, 1)
        else:
            gsize, lsize = (rows * L,), (L,)
    else:
        total = prod(full)
        if total == 0:
            return
        if flat > 1:
            total //= flat  # work-items, each on a vector of `flat` elements
        args.append(I(total))
        if device.kind == "cpu":
            gsize, lsize = (total,), None
        else:
            wg = min(256, device.caps.max_work_group)
            gsize, lsize = (-(-total // wg) * wg,), (wg,)
    if _config.CONFIG.debug >= 1:
        print(f"[clops] launch {name} global={gsize} local={lsize}", file=sys.stderr)
    STATS["launches"] += 1
    writes = list(lw.out_buffers)
    if lw.combine is not None:
        writes += [lw.combine[0], lw.combine[1]]
    device.launch(kernel, gsize, lsize, args, reads=lw.leaf_buffers, writes=writes, name=name)


def realize(targets: list[tuple[Node, Any, View | None]], device: Any) -> None:
    """Compute ``targets`` (node, destination buffer or None, destination view or None)."""
    schedule(targets, device, lambda item: run_item(item, device))
