"""Kernels, scan: inclusive sums and products along contiguous rows (``scan.cl``): chunks
scanned in parallel, their totals scanned, then added back. One program per element type."""

from __future__ import annotations

import numpy as np

from ..graph.dtypes import DType
from ..runtime import CLDevice
from ..runtime.pool import Buffer
from .launch import flat_geometry, math_options, shared_kernel

I64 = np.int64


def scan(dev: CLDevice, dtype: DType, op: str, x: Buffer, x_off: int, out: Buffer, o_off: int,
         rows: int, n: int, include_initial: bool = False) -> None:
    """Inclusive scan (``op`` "sum" or "prod") of ``rows`` contiguous rows of ``n`` elements;
    output rows hold ``n + 1`` elements (identity first) with ``include_initial``."""
    shift = 1 if include_initial else 0
    if rows == 0 or (n == 0 and not shift):
        return
    opts = math_options(dtype) + (("-DOP_MUL",) if op == "prod" else ())
    # PERF: enough chunks to occupy every compute unit; chunks of at least 256 elements.
    want = 4 * dev.caps.compute_units if dev.kind == "cpu" else 8 * dev.caps.compute_units * 32
    nchunks = max(1, min(-(-n // 256), -(-want // rows))) if n else 1
    chunk = max(1, -(-n // nchunks))
    nchunks = max(1, -(-n // chunk)) if n else 1
    items = rows * nchunks
    totals = dev.alloc(items * dtype.itemsize)
    g, loc = flat_geometry(dev, items)
    k1 = shared_kernel(dev, "scan", "scan_chunks", opts)
    dev.launch(k1, g, loc, [x, I64(x_off), out, I64(o_off), totals, I64(n), I64(shift), I64(chunk),
                            I64(nchunks), I64(items)], reads=[x], writes=[out, totals],
               name="scan_chunks")
    if nchunks > 1:
        k2 = shared_kernel(dev, "scan", "scan_totals", opts)
        g2, loc2 = flat_geometry(dev, rows)
        dev.launch(k2, g2, loc2, [totals, I64(nchunks), I64(rows)], reads=[totals],
                   writes=[totals], name="scan_totals")
        k3 = shared_kernel(dev, "scan", "scan_fix", opts)
        dev.launch(k3, g, loc, [out, I64(o_off), totals, I64(n), I64(shift), I64(chunk),
                                I64(nchunks), I64(items)], reads=[totals, out], writes=[out],
                   name="scan_fix")
