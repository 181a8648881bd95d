"""Kernels, sort: stable sorts of contiguous rows by LSD radix sorts, one for CPUs
(``sort_cpu.cl``) and one for GPUs (``sort_gpu.cl``), and binary search (``sort.cl``). One program
per element type (and what a sort writes, and its tile), so every shape reuses it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph.dtypes import DType
from ..runtime import CLDevice
from ..runtime.pool import Buffer
from .launch import eager_kernel, flat_geometry, math_options, shared_kernel

I64 = np.int64


def sort(dev: CLDevice, dtype: DType, x: Buffer, x_off: int, rows: int, n: int,
         descending: bool, algorithm: str | None = None) -> tuple[Buffer, Buffer, int]:
    """Stable sort of ``rows`` contiguous rows of ``n`` keys. Returns (keys, indices, P): rows
    of ``P`` = ``n`` entries, the sorted keys and their original positions (int64).
    ``algorithm``: "radix" (the CPUs' form, ``radix_sort``) or "gpu" (``gpu_radix_sort``); by
    default the device's own."""
    form = algorithm or ("radix" if dev.kind == "cpu" else "gpu")
    if form not in ("radix", "gpu"):
        raise ValueError(f"sort: no algorithm {algorithm!r}; 'radix' or 'gpu'")
    keys, idx = (radix_sort if form == "radix" else gpu_radix_sort)(
        dev, dtype, x, x_off, rows, n, descending)
    assert keys is not None and idx is not None
    return keys, idx, n


def sort_one(dev: CLDevice, dtype: DType, x: Buffer, x_off: int, rows: int, n: int,
             descending: bool, indices: bool) -> tuple[Buffer, int]:
    """``sort``'s keys, or (``indices``) its indices, and P (= n): only that one is computed."""
    run = radix_sort if dev.kind == "cpu" else gpu_radix_sort
    keys, idx = run(dev, dtype, x, x_off, rows, n, descending, not indices, indices)
    out = idx if indices else keys
    assert out is not None
    return out, n


# The radix sort of CPU devices (``sort_cpu.cl``): the element's bits and how its key is made.
_BITS = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}
_UNSIGNED: dict[int, type[np.unsignedinteger]] = {1: np.uint8, 2: np.uint16, 4: np.uint32,
                                                  8: np.uint64}
# the bits of +inf, by float dtype
_INF = {"float16": "0x7c00", "bfloat16": "0x7f80", "float32": "0x7f800000u",
        "float64": "0x7ff0000000000000ul"}
# Rows of at most this many keys are insertion-sorted (private memory), longer ones radix-sorted.
RADIX_SMALL = 32
# Most chunks a row is cut into (the passes' private counts are CMAX * 256 per work-item), and
# the fewest keys a chunk gets.
RADIX_CMAX = 16
RADIX_MIN_CHUNK = 1 << 14
# Bits of a digit. PERF: 11-bit digits (3 passes for 4-byte keys) ran 2^19 float32 no faster
# than 8-bit ones on Intel's runtime (2 cores), often slower.
RADIX_BITS = 8
# Chunks a row is cut into for each compute unit, when there are too few rows.
RADIX_CHUNKS_PER_CU = 4
# Rows of more than RADIX_SMALL and up to BITONIC_MAX keys, at least BITONIC_MIN_ROWS of them,
# whose sorted values alone are asked for, are sorted by a bitonic network, 8 rows at once as
# vectors (rows with a NaN or a -0.0 go on to the radix sort): on Intel's runtime by its
# vectorization across work-items (bsort_rows_lanes), elsewhere by explicit vectors (bsort_rows8).
# PERF (2 cores, kernel time, minimum of 12): Intel's runtime 512x1024 float32 1.6 ms against
# 2.6-3.0 by radix, 2048x256 1.4 against 2.4-3.3, 64x8192 even (2.5-2.7, so not past 4096); on
# that AVX2 CPU 16 lanes no faster, on AVX-512 ones 7x faster (``bitonic_lanes``); explicit
# vectors 1.9 there. PoCL 3.1 ran the lanes form 3x slower than its
# radix sort (no vectors), the explicit one 2.0-2.9 ms against 2.7-5.7 by radix. Keys of 1 or 2
# bytes (1 or 2 radix passes) stay with the radix sort (uint8 512x1024 1.4 ms against 3.4);
# float64 512x1024 3.3-5.4 against 6.2-6.4, 2048x256 2.0-3.5 against 8.8-11.6.
BITONIC_MAX = 4096
BITONIC_MIN_ROWS = 8


def bitonic_lanes(dev: CLDevice) -> int:
    """The bitonic network's form on ``dev``: rows a work-group of ``bsort_rows_lanes`` (a
    work-item a row) on Intel's runtime, the device's native float vector width and 8 at least;
    0 elsewhere (``bsort_rows8``). Intel's runtime vectorizes the network across a group's
    work-items only where the group fills its vectors: PERF (2-core EPYC with AVX-512, 16-wide,
    wall ms a call, float32 rows): groups of 8 512x1024 8.7, 2048x256 6.1, 64x4096 6.4; groups
    of 16 1.24 / 0.57 / 0.76 (32: 1.28 / 0.59 / 0.81; numpy 0.65 / 0.30 for the first two);
    keys of int32, float64 and uint64 alike (float64 512x1024 10.5 -> 1.7)."""
    if dev.backend != "intel":
        return 0
    return max(8, dev.caps.native_vector_width_float)


# a scalar argument's numpy type in the radix kernels (None: a buffer)
_ROWS_ARGS = [None, I64, None, None, None, None, None, None, I64, I64]
_HIST_ARGS = [None, I64, None, I64, np.int32, I64, I64]
_PASS_ARGS = [None, I64, None, None, None, None, None, None, None, None, I64, np.int32, I64, I64]


def _radix_options(dtype: DType, values: bool, indices: bool, r: int) -> dict[str, object]:
    size = dtype.itemsize
    kind = {"u": 0, "b": 0, "i": 1, "f": 2}[dtype.kind]
    opts: dict[str, object] = dict(U=_BITS[size], BITS=8 * size, R=r, NB=1 << r,
                                   PASSES=-(-8 * size // r), KIND=kind, VALS=values,
                                   IDX=indices, SMALL=RADIX_SMALL, CMAX=RADIX_CMAX)
    if kind == 2:
        opts["INF"] = _INF[dtype.name]
    return opts


def radix_chunks(dev: CLDevice, rows: int, n: int) -> tuple[int, int]:
    """(C, s): each row in C chunks of 2^s keys (C = 1: a work-item sorts a whole row). Rows
    are cut when there are too few of them to keep every compute unit busy."""
    cu = max(1, dev.caps.compute_units)
    if n <= RADIX_SMALL or rows >= 2 * cu:
        return 1, max(0, (n - 1).bit_length())
    want = min(RADIX_CMAX, -(-RADIX_CHUNKS_PER_CU * cu // rows), max(1, n // RADIX_MIN_CHUNK))
    s = max(0, (-(-n // want) - 1).bit_length())
    return -(-n // (1 << s)), s


def _radix_outputs(dev: CLDevice, dtype: DType, rows: int, n: int, descending: bool,
                   values: bool, indices: bool) -> tuple[Buffer | None, Buffer | None, Any, Any]:
    """Both radix sorts' start: the output buffers asked for (values, int64 positions), the
    unsigned type of the element's bits and the key's flip (all ones when descending)."""
    if n >= 1 << 32:
        raise ValueError(f"sort: rows of {n} elements; the radix sort takes fewer than 2^32")
    total = rows * n
    ov = dev.alloc(max(total, 1) * dtype.itemsize) if values else None
    oi = dev.alloc(max(total, 1) * 8) if indices else None
    U = _UNSIGNED[dtype.itemsize]
    return ov, oi, U, U(~U(0) if descending else 0)


def radix_sort(dev: CLDevice, dtype: DType, x: Buffer, x_off: int, rows: int, n: int,
               descending: bool, values: bool = True, indices: bool = True
               ) -> tuple[Buffer | None, Buffer | None]:
    """Stable sort of ``rows`` contiguous rows of ``n`` keys of ``dtype`` (any kind but
    complex, a byte to 8) by an LSD radix sort of their keys, for CPU devices: (the sorted
    values if ``values``, their original positions as int64 if ``indices``), rows of ``n``."""
    ov, oi, U, flip = _radix_outputs(dev, dtype, rows, n, descending, values, indices)
    if rows * n == 0:
        return ov, oi
    size, total = dtype.itemsize, rows * n
    C, s = radix_chunks(dev, rows, n)
    r = RADIX_BITS
    opts = _radix_options(dtype, values, indices, r)
    passes = -(-8 * size // r)
    dummy = dev.alloc(8)
    ovb, oib = ov or dummy, oi or dummy
    scratch = total * size if n > RADIX_SMALL else 8
    sv0, sv1 = dev.alloc(scratch), dev.alloc(scratch)
    iscratch = total * 4 if indices and n > RADIX_SMALL else 8
    si0, si1 = dev.alloc(iscratch), dev.alloc(iscratch)
    outs = [b for b in (ov, oi) if b is not None] + [sv0, sv1, si0, si1]
    if C == 1:
        todo, only = dummy, 0
        if ov is not None and not indices and RADIX_SMALL < n <= BITONIC_MAX and \
                rows >= BITONIC_MIN_ROWS and size >= 4:
            todo, only = dev.alloc(rows), 1
            P = 1 << (n - 1).bit_length()
            W = bitonic_lanes(dev)
            lanes = W > 0
            W = W or 8
            groups = -(-rows // W)
            tb = dev.alloc(groups * W * P * size)
            kb = eager_kernel(dev, "sort_cpu", "bsort_rows_lanes" if lanes else "bsort_rows8",
                              [None, I64, None, None, None, I64, I64, np.int32, I64, U], **opts)
            dev.launch(kb, (groups * W,) if lanes else (groups,), (W,) if lanes else (1,),
                       [x, I64(x_off), ov, tb, todo, I64(n), I64(P),
                        np.int32(P.bit_length() - 1), I64(rows), flip],
                       reads=[x], writes=[ov, tb, todo], name="bsort_rows")
        k = eager_kernel(dev, "sort_cpu", "rsort_rows", _ROWS_ARGS + [U, None, np.int32], **opts)
        dev.launch(k, (rows,), (1,), [x, I64(x_off), ovb, oib, sv0, sv1, si0, si1, I64(n),
                                      I64(rows), flip, todo, np.int32(only)],
                   reads=[x, todo], writes=outs, name="rsort_rows")
        return ov, oi
    g = rows * C
    hist = dev.alloc(g * (passes * (1 << r) + 1) * 4)
    part = dev.alloc(2 * g * C * (1 << r) * 4)
    kh = eager_kernel(dev, "sort_cpu", "rsort_hist", _HIST_ARGS + [U], **opts)
    dev.launch(kh, (g,), (1,), [x, I64(x_off), hist, I64(n), np.int32(s), I64(C), I64(g), flip],
               reads=[x], writes=[hist], name="rsort_hist")
    kp = eager_kernel(dev, "sort_cpu", "rsort_pass", _PASS_ARGS + [U, np.int32], **opts)
    for p in range(passes):
        dev.launch(kp, (g,), (1,), [x, I64(x_off), ovb, oib, sv0, sv1, si0, si1, hist, part,
                                    I64(n), np.int32(s), I64(C), I64(g), flip, np.int32(p)],
                   reads=[x, hist, part], writes=outs + [part], name="rsort_pass")
    return ov, oi


# The radix sort of GPUs (``sort_gpu.cl``): work-groups of GPU_WG on tiles of GPU_WG * ITEMS keys
# in local memory, ITEMS at most GPU_ITEMS (tiles of 4096), fewer where local memory is short;
# rows of at most SHORT_ROW keys take work-groups of SHORT_WG (short rows waste no work-items).
GPU_WG = 256
GPU_ITEMS = 16
SHORT_WG = 64
SHORT_ROW = SHORT_WG * 4
GPU_DIGITS = 256  # 8 bits a pass of long rows
_GROWS_ARGS = [None, I64, None, None, I64]
_GCOUNT_ARGS = [None, I64, None, None, None, None, I64, I64, np.int32]
_GSCATTER_ARGS = [None, I64, None, None, None, None, None, None, None, None, None, I64, I64,
                  np.int32]


def _gpu_local_bytes(wg: int, items: int, size: int, indices: bool) -> int:
    """Local memory of a work-group of ``sort_gpu.cl``: the tile (bits, indices), the nibble
    counts (ushort), the scan's scratch and the digits' bases and run starts."""
    return wg * items * (size + (4 if indices else 0)) + wg * (2 * 16 + 4) + 8 * GPU_DIGITS


def gpu_tiles(dev: CLDevice, n: int, size: int, indices: bool) -> tuple[int, int, bool]:
    """(WG, ITEMS, whole): the work-group and keys a work-item of the GPU radix sort of rows of
    ``n`` keys of ``size`` bytes; ``whole``: a work-group sorts a whole row (rs_rows), else rows
    are cut into tiles of WG * ITEMS (rs_count, rs_scan, rs_scatter a pass)."""
    top = 1 << (min(GPU_WG, dev.caps.max_work_group).bit_length() - 1)
    budget = dev.caps.local_mem - 1024
    items = GPU_ITEMS
    while items > 1 and _gpu_local_bytes(top, items, size, indices) > budget:
        items //= 2
    if n <= SHORT_ROW:
        wg = min(SHORT_WG, top)
        return wg, SHORT_ROW // wg, True
    # NOTE: tiles of 4, 8 or GPU_ITEMS keys a work-item only: a program takes Intel's runtime
    # 7-14 s to build, one for each (dtype, what is written, tile)
    for fit in (4, 8):
        if fit < items and n <= top * fit:
            return top, fit, True
    return top, items, n <= top * items


def gpu_radix_sort(dev: CLDevice, dtype: DType, x: Buffer, x_off: int, rows: int, n: int,
                   descending: bool, values: bool = True, indices: bool = True
                   ) -> tuple[Buffer | None, Buffer | None]:
    """Stable sort of ``rows`` contiguous rows of ``n`` keys of ``dtype`` (any kind but
    complex, a byte to 8) by an LSD radix sort for GPUs (``sort_gpu.cl``): (the sorted values if
    ``values``, their original positions as int64 if ``indices``), rows of ``n``. Rows that fit
    a tile: one launch; longer rows: three a pass of 8 bits (a byte of the element)."""
    ov, oi, U, flip = _radix_outputs(dev, dtype, rows, n, descending, values, indices)
    if rows * n == 0:
        return ov, oi
    size, total = dtype.itemsize, rows * n
    wg, items, whole = gpu_tiles(dev, n, size, indices)
    opts = _radix_options(dtype, values, indices, RADIX_BITS)
    for k in ("R", "NB", "SMALL", "CMAX"):
        del opts[k]
    opts.update(WG=wg, ITEMS=items)
    dummy = dev.alloc(8)
    ovb, oib = ov or dummy, oi or dummy
    outs = [b for b in (ov, oi) if b is not None]
    if whole:
        k = eager_kernel(dev, "sort_gpu", "rs_rows", _GROWS_ARGS + [U], **opts)
        dev.launch(k, (rows * wg,), (wg,), [x, I64(x_off), ovb, oib, I64(n), flip], reads=[x],
                   writes=outs, name="rs_rows")
        return ov, oi
    passes = size
    T = -(-n // (wg * items))
    A, B = dev.alloc(total * size), dev.alloc(total * size)
    iA, iB = (dev.alloc(total * 4), dev.alloc(total * 4)) if indices else (dummy, dummy)
    st = dev.alloc(rows * (passes + 1) * 4)
    cnt = dev.alloc(rows * GPU_DIGITS * T * 4)
    tot = dev.alloc(rows * GPU_DIGITS * 4)
    kc = eager_kernel(dev, "sort_gpu", "rs_count", _GCOUNT_ARGS + [U], **opts)
    ks = eager_kernel(dev, "sort_gpu", "rs_scan", [None, None, I64], **opts)
    kp = eager_kernel(dev, "sort_gpu", "rs_scatter", _GSCATTER_ARGS + [U], **opts)
    tiles = (rows * T * wg,)
    for p in range(passes):
        dev.launch(kc, tiles, (wg,), [x, I64(x_off), A, B, st, cnt, I64(n), I64(T),
                                      np.int32(p), flip],
                   reads=[x, A, B, st], writes=[cnt], name="rs_count")
        dev.launch(ks, (rows * GPU_DIGITS * wg,), (wg,), [cnt, tot, I64(T)], reads=[cnt],
                   writes=[cnt, tot], name="rs_scan")
        dev.launch(kp, tiles, (wg,), [x, I64(x_off), A, B, iA, iB, ovb, oib, st, cnt, tot,
                                      I64(n), I64(T), np.int32(p), flip],
                   reads=[x, A, B, iA, iB, st, cnt, tot],
                   writes=[A, B, iA, iB, st] + outs, name="rs_scatter")
    return ov, oi


def run_starts(dev: CLDevice, dtype: DType, x: Buffer, x_off: int, flags: Buffer, n: int) -> None:
    """Bool flags (bytes) of where the runs of equal values of the sorted ``x[0:n]`` start
    (every NaN a run of its own, -0.0 and 0.0 one value), through ``sort_cpu.cl``."""
    if n == 0:
        return
    k = eager_kernel(dev, "sort_cpu", "run_starts", [None, I64, None, I64],
                     **_radix_options(dtype, True, False, RADIX_BITS))
    g, loc = flat_geometry(dev, n)
    dev.launch(k, g, loc, [x, I64(x_off), flags, I64(n)], reads=[x], writes=[flags],
               name="run_starts")


def searchsorted(dev: CLDevice, dtype: DType, a: Buffer, a_off: int, a_stride: int, n: int,
                 v: Buffer, v_off: int, out: Buffer, m: int, right: bool) -> None:
    """Insertion points of ``m`` contiguous values in the sorted (strided) ``a`` of ``n``."""
    if m == 0:
        return
    k = shared_kernel(dev, "sort", "searchsorted", math_options(dtype))
    g, loc = flat_geometry(dev, m)
    dev.launch(k, g, loc, [a, I64(a_off), I64(a_stride), I64(n), v, I64(v_off), out, I64(m),
                           np.int32(1 if right else 0)], reads=[a, v], writes=[out],
               name="searchsorted")


# distinct (sort_cpu.cl's distinct_chunks): slots of a work-item's hash table (DCAP there), and
# the fewest keys a work-item takes.
DISTINCT_SLOTS = 4096
DISTINCT_MIN_CHUNK = 1 << 14


def distinct(dev: CLDevice, dtype: DType, x: Buffer, x_off: int, n: int
             ) -> tuple[Buffer, Buffer, int] | None:
    """The distinct values of the contiguous ``x[0:n]`` of ``dtype`` (a byte to 8, not complex),
    found by hashing (``sort_cpu.cl``: chunks of ``x`` a work-item each, then one table; equal as
    ``run_starts`` compares, the first of -0.0 and 0.0 kept): (values, their int64 counts, how
    many), in no order. Reads that count back. None where a chunk holds a NaN or more than half
    a table of values: sort instead."""
    cu = max(1, dev.caps.compute_units)
    g = max(1, min(RADIX_CHUNKS_PER_CU * cu, n // DISTINCT_MIN_CHUNK))
    chunk = -(-n // g)
    if n == 0 or chunk >= 1 << 32:  # a chunk's counts are uint
        return None
    g = -(-n // chunk)
    opts = _radix_options(dtype, True, False, RADIX_BITS)
    tab = dev.alloc(g * DISTINCT_SLOTS * dtype.itemsize)
    cnt = dev.alloc(g * DISTINCT_SLOTS * 4)
    found = dev.alloc(g * 8)
    k = eager_kernel(dev, "sort_cpu", "distinct_chunks", [None, I64, I64, I64, None, None, None],
                     **opts)
    dev.launch(k, (g,), (1,), [x, I64(x_off), I64(n), I64(chunk), tab, cnt, found], reads=[x],
               writes=[tab, cnt, found], name="distinct_chunks")
    # one table of at least twice the values the chunks can hold
    lg = (g * DISTINCT_SLOTS - 1).bit_length()
    vals, counts = dev.alloc((1 << lg) * dtype.itemsize), dev.alloc((1 << lg) * 8)
    info = dev.alloc(8)
    km = eager_kernel(dev, "sort_cpu", "distinct_merge",
                      [None, None, None, I64, np.int32, None, None, None], **opts)
    dev.launch(km, (1,), (1,), [tab, cnt, found, I64(g), np.int32(lg), vals, counts, info],
               reads=[tab, cnt, found], writes=[vals, counts, info], name="distinct_merge")
    host = np.empty(1, np.int64)
    dev.read(host, info, 0)
    m = int(host[0])
    return None if m < 0 else (vals, counts, m)
