"""Compiler, launch geometry: how many work-items a generated kernel runs as, in groups of what
size, and the device questions that decide it (a CPU runs a row per work-item, a GPU a
work-group per row). Lowering reads the vector widths; the scheduler the split thresholds; the
schedule the global and local sizes of every launch."""

from __future__ import annotations

import math
from typing import NamedTuple

from ..graph.ir import prod
from ..runtime import probes
from .device import Device
from .kernel import OWN_VECTOR_MATH, Lowered

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
# Elementwise kernels on GPUs: work-items per group (CPUs leave it to the driver).
GPU_FLAT_LOCAL = 256
# Reductions over leading axes (column sums: x.sum(axis=0) of a row-major matrix): one
# work-item per output element, adjacent work-items on adjacent elements, so that every step of
# the loop over the reduced axes reads a contiguous run. (On GPUs a work-group per output
# element reads one element of each row: a 32-byte sector for 4 bytes. On PoCL a work-item per
# group walked a column alone: a 4096x4096 column sum in 68 ms, numpy 3.6; now 4.3, and
# 100000x64 in 71 ms, now 1.7, numpy 1.9.)
# Work-items per group, per GPU compute unit to launch in all (the reduced axes are split into
# chunks until there are that many), and the fewest reduced elements per chunk.
GPU_COL_LOCAL = 128
# CPUs (where no strip applies, ``lower.column_strip``): the group steps through the loop
# together. PERF (PoCL, 4096x4096 column sum): 16 work-items 5.3 ms, 64 22, 256 16
CPU_COL_LOCAL = 16
GPU_COL_ITEMS_PER_CU = 2048
GPU_COL_MIN_CHUNK = 32
# Columns shorter than this are never split on GPUs: a second kernel (and its build, the first
# time a shape needs one) costs more than a work-item reading the column alone.
# PERF (H100, (rows, 3) float32 column sum, first kernel start to last end, median of 30):
# whole / split 64 rows 7 / 90 us, 1024 27 / 93, 4096 90 / 193, 16384 338 / 197.
GPU_COL_MIN_SPLIT = 8192
# ... except where the reduction reads this many elements or more: few whole columns then leave
# most of the GPU idle. PERF (H200, float32 sum over axis 0 of 4096x4096, whole columns):
# 247 us of device time (CuPy 127).
GPU_COL_SPLIT_ELEMENTS = 1 << 22
# CPUs: columns shorter than this are never split (a CPU needs few groups).
CPU_COL_MIN_SPLIT = 8192
# Rows (or columns) split into chunks only when longer than this.
MIN_SPLIT_ROW = 8192
# Work-groups per CPU core a split reduction launches in all.
CPU_SPLIT_GROUPS_PER_CU = 4


# -- what kind of device it is, as the compiler asks it -----------------------------------------
def serial_rows(device: Device) -> bool:
    """A work-item per row (CPUs: PoCL runs a group's work-items as vector lanes and a serial
    row with unrolled accumulators wins), not a work-group per row (GPUs)."""
    return device.kind == "cpu"


def launches_exactly(device: Device) -> bool:
    """Launched with exactly as many work-items as there are elements, so kernels need no
    bounds check (CPUs; GPUs round up to whole work-groups)."""
    return device.kind == "cpu"


def long_flat_index(device: Device) -> bool:
    """Flat kernels (and column layouts) index in 64 bits. PERF (PoCL): with `int gid` and int
    offsets, PoCL sign-extends each `offset + gid` and its work-item loop no longer makes
    contiguous vector loads: the chain a*b+c*d-e*0.5 ran at 0.84-0.88 of a hand kernel, 0.98
    with long."""
    return device.kind == "cpu"


def long_row_index(device: Device, reductions: int) -> bool:
    """Row kernels of a work-item per row (CPUs) index in 64 bits. With `int` indices a CPU
    compiler must keep `offset + (r + j)` from wrapping and no longer vectorizes the row's
    loads. PERF (2^24 float32, two cores, 2026-11-26; int -> long): Intel's runtime `sum`
    10.2 -> 2.0 ms (numpy 2.8), 4096 row sums 13.9 -> 1.6, max 4.0 -> 3.9; PoCL row sums 1.9
    -> 1.5, `max` 16.8 -> 2.9, softmax 23.0 -> 15.9. But on Intel's runtime a kernel of
    several reductions slowed (max then sum of exp over rows 6.1 -> 19.4 ms, softmax 27.5 ->
    40.4): there only kernels of one reduction index in 64 bits."""
    if not serial_rows(device):
        return False
    return getattr(device, "backend", "") != "intel" or reductions == 1


def vector_width(device: Device) -> int:
    """Elements per work-item of contiguous kernels (1: no explicit vectors)."""
    return VECTOR_WIDTH.get(device.kind, 4)


# CPUs: elements per work-item of a flat kernel that runs on vectors as written (``vmath``),
# the widest first that divides the size and the offsets.
CPU_VECTOR_MATH_WIDTHS = (16, 8, 4)


def vector_math_widths(device: Device) -> tuple[int, ...]:
    """Vector widths for flat float32 kernels of slow scalar math (``kernel.vector_math``);
    none on GPUs, whose work-items are the vector lanes."""
    return CPU_VECTOR_MATH_WIDTHS if device.kind == "cpu" else ()


def vector_math_agrees(device: Device, fn: str) -> bool:
    """Whether the device's vector form of ``fn`` gives its scalar values (a runtime probe,
    run once per device and driver); a device the runtime cannot probe: no."""
    if not hasattr(device, "remembered"):
        return False
    return probes.vector_math_agrees(device, fn)


def own_vector_math_widths(device: Device) -> tuple[int, ...]:
    """Vector widths for vmath kernels of clops' own functions: none wider than the CPU's own
    float vectors. PERF (PoCL 3.1, AVX2, sin of 4M float32): float8 1.6 ms, float16 3.5-4.5;
    Intel's runtime ran both alike."""
    widths = vector_math_widths(device)
    native = getattr(device.caps, "native_vector_width_float", 0)  # (0: not known)
    narrow = tuple(w for w in widths if w <= native)
    return narrow if narrow else widths


# clops' own vector forms taken even where the runtime's agree, by backend: where measured
# faster. PERF (pow of 2^24 float32 in a flat kernel, two cores, AVX2, in turns in one
# process, median ms): PoCL 3.1 its float8 pow 126, clops' (float64 inside) 87; Intel's
# runtime its own 27, clops' 62 (not taken there).
OWN_FASTER = {"pocl": frozenset({"pow"})}


def own_vector_math(device: Device, fn: str) -> bool:
    """Whether a vmath kernel computes ``fn`` with clops' own vector form (``OWN_VECTOR_MATH``)
    instead of the runtime's: where the runtime's vector form disagrees with its scalar one,
    and where ``OWN_FASTER`` says so for the device's backend (pow: on devices with float64)
    (a device the runtime cannot probe, which cannot build one either: no)."""
    if fn not in OWN_VECTOR_MATH or not hasattr(device, "remembered"):
        return False
    if fn == "pow" and not getattr(device.caps, "fp64", False):
        return False
    return fn in OWN_FASTER.get(getattr(device, "backend", ""), ()) or \
        not probes.vector_math_agrees(device, fn)


def warp_shuffles(device: Device) -> bool:
    """NVIDIA inline PTX (warp shuffles), by the runtime's capability probe (run once per
    device and driver, then read from its caps)."""
    probe = getattr(device, "probe", None)
    return bool(probe("nvidia_ptx")) if probe is not None else False


# CPUs' serial rows on vectors (``KernelKey.batch``): elements a work-item reduces at least,
# in adjacent whole rows, while each core still gets ``CPU_BATCH_ITEMS_PER_CU`` work-items.
# PERF (64x128x64 float32 over the last axis, kernel time, Intel's runtime, two cores): a
# work-group of one work-item per row of 64 0.11 ms (max) and 0.10 (sum) on float8 lanes,
# rows of 4096 elements a work-item 0.072 and 0.066 (512 to 32768 elements ran alike).
ROW_BATCH_ELEMS = 4096
CPU_BATCH_ITEMS_PER_CU = 16


def row_batch(device: Device, rows: int, rn: int) -> int:
    """Rows per work-item of a CPU's serial row kernel on vectors (``KernelKey.batch``) over
    ``rows`` rows of ``rn`` elements: enough for ``ROW_BATCH_ELEMS`` elements, as long as
    every core gets ``CPU_BATCH_ITEMS_PER_CU`` work-items; 1 for long rows."""
    per = max(1, ROW_BATCH_ELEMS // max(rn, 1))
    least = CPU_BATCH_ITEMS_PER_CU * device.caps.compute_units
    return max(1, min(per, rows // least))


def split_groups(device: Device) -> int:
    """Work-groups a split reduction launches in all. CPUs: a few per core. GPUs: enough to
    fill every compute unit with work-items (occupancy, not core count, hides the memory
    latency)."""
    per_cu = CPU_SPLIT_GROUPS_PER_CU if serial_rows(device) else GPU_SPLIT_GROUPS_PER_CU
    return per_cu * device.caps.compute_units


def column_items(device: Device) -> int:
    """Work-items a column-layout reduction should launch in all (its reduced axes are split
    until it does): GPUs, ``GPU_COL_ITEMS_PER_CU`` per compute unit; CPUs, a few groups per
    core (PoCL runs a group's work-items as vector lanes)."""
    cu = device.caps.compute_units
    return CPU_SPLIT_GROUPS_PER_CU * cu * CPU_COL_LOCAL if serial_rows(device) else \
        GPU_COL_ITEMS_PER_CU * cu


def column_min_split(device: Device) -> int:
    """The shortest column worth a split (a second kernel)."""
    return CPU_COL_MIN_SPLIT if serial_rows(device) else GPU_COL_MIN_SPLIT


def column_splits(device: Device, rn: int, total: int) -> bool:
    """Whether columns ``rn`` long (``total`` elements in all) are worth a split."""
    return rn >= column_min_split(device) or (not serial_rows(device) and
                                              total >= GPU_COL_SPLIT_ELEMENTS)


# -- the sizes of one launch ----------------------------------------------------------------------
class Geometry(NamedTuple):
    """A launch: the local size the program is built for (0: no reduction; part of the program
    cache key, the source depends on it) and the global and local sizes of the enqueue (local
    None: the driver's choice)."""

    local: int
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None


def local_size(device: Device, lw: Lowered) -> int:
    """Work-items per row of a reduction kernel (0 for elementwise kernels)."""
    if not lw.raxes:
        return 0
    if serial_rows(device) or lw.col:
        # PERF: on PoCL a serial row per work-item with unrolled accumulators wins; the
        # column layout is the same body over adjacent outputs (grouped below)
        return 1
    # One work-group size for every shape, so a new shape never needs a new program; split
    # reductions (stage 1) launch GPU_SPLIT_GROUPS_PER_CU groups of their size per unit.
    size = GPU_SPLIT_LOCAL if lw.chunks > 1 else GPU_ROW_LOCAL
    return min(size, device.caps.max_work_group)


# PoCL's choice of local size where a launch leaves it to the driver (PoCL 3.1): one work-group
# for up to 16 work-items, two for up to 4096 (groups of 4096 past that), whatever the cores;
# a group runs on one core. Where that leaves cores idle clops chooses: groups of a power of
# two that divides the work-items, at least CPU_SPLIT_GROUPS_PER_CU a core where there are
# work-items for them. PERF (argmax of 2^24 float32, 8 rows of a chunk each, two cores, kernel
# time): 8 work-items in PoCL's one group 9.3-10.3 ms, in groups of 1 6.0-6.5 (hand kernel:
# 10.8 -> 6.5); Intel's runtime chooses groups enough for its cores (8 work-items: 4 groups).
DRIVER_GROUPS_FEW = {"pocl"}


def driver_local(device: Device, global_size: tuple[int, ...]) -> tuple[int, ...] | None:
    """The local size of a launch that leaves it to the driver on CPUs (None: the driver's
    choice), or clops' where the driver would leave cores idle (``DRIVER_GROUPS_FEW``)."""
    if device.kind != "cpu" or getattr(device, "backend", "") not in DRIVER_GROUPS_FEW:
        return None
    items = global_size[0]
    want = split_groups(device)
    cap = max(1, min(device.caps.max_work_group, 4096))
    local = 1
    while local * 2 <= cap and items % (local * 2) == 0 and items // (local * 2) >= want:
        local *= 2
    return (local,) + (1,) * (len(global_size) - 1)


def geometry(device: Device, lw: Lowered) -> Geometry | None:
    """The launch of ``lw`` on ``device``; None when it has nothing to write."""
    L = local_size(device, lw)
    full = lw.full
    outputs = prod([n for i, n in enumerate(full) if i not in lw.raxes])
    if outputs == 0:
        return None  # nothing to write (sizes of other axes may not even fit the index type)
    if lw.raxes:
        rows = outputs * lw.chunks
        if rows == 0:
            return None
        if lw.col:
            # a work-item per output (the first axis) and chunk (the second). CPUs launch
            # exactly (the kernel has no bounds check) in groups that divide the outputs: the
            # group's work-items step through their loops together
            if lw.strip:
                # CPUs: a strip of outputs per work-item, no lockstep (the driver's groups)
                g = (outputs // lw.strip, lw.chunks)
                return Geometry(L, g, driver_local(device, g))
            if launches_exactly(device):
                wg = math.gcd(outputs, CPU_COL_LOCAL)
                return Geometry(L, (outputs, lw.chunks), (wg, 1))
            wg = min(GPU_COL_LOCAL, device.caps.max_work_group)
            return Geometry(L, (-(-outputs // wg) * wg, lw.chunks), (wg, 1))
        if lw.batch:
            # CPUs: runs of adjacent rows per work-item (the kernel reads how many from the
            # global size), in the driver's groups
            per = row_batch(device, rows, prod([full[i] for i in lw.raxes]))
            runs = (-(-rows // per),)
            return Geometry(L, runs, driver_local(device, runs))
        return Geometry(L, (rows * L,), (L,))
    total = work_items(lw)
    if total == 0:
        return None
    if launches_exactly(device):
        return Geometry(L, (total,), driver_local(device, (total,)))
    wg = min(GPU_FLAT_LOCAL, device.caps.max_work_group)
    return Geometry(L, (-(-total // wg) * wg,), (wg,))


def work_items(lw: Lowered) -> int:
    """Work-items of an elementwise kernel (each on a vector of ``flat`` elements when
    ``flat`` > 1)."""
    total = prod(lw.full)
    return total // lw.flat if lw.flat > 1 else total
