"""Kernels, GEMM: launches of ``gemm.cl`` on runtime Buffers (row-major, element offsets, row and
batch strides), and the choice between its NVIDIA tensor-core kernel and the portable one.

``clops.matmul`` hands large float32/float16 products on GPUs here (``supports``: the tiled and
tensor-core kernels of ``gemm.cl``; ``any_supports``: ``gemm_any.cl`` for any other shape and
strides, K sliced where the output has few tiles), and float32
and float64 products on CPUs (``cpu_supports``, ``gemm_cpu.cl``); everything else stays on the
generated kernels.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np

from .. import _config
from ..runtime import CLDevice, Event, probes, tma
from ..runtime.device import add_cpu_default_check
from ..runtime.pool import Buffer
from ..runtime.program import new_kernel, rebuilt_from_binary, sm90a_ptx
from . import native_cpu
from .launch import eager_kernel, kernel, narrow_cpu, program

TILE = 128
GROUP = 256
# PERF: below this many multiply-adds the generated kernel's one launch is as fast.
MIN_MACS = 1 << 24
# depth of the tiles: portable kernel (16 or 32), tensor-core kernel (32 or 64)
TILED_DEPTH = 16
MMA_DEPTH = 64
# gemm_mma_async tile shapes, preferred first: block BM x BN, warp WM x WN, depth BK, STAGES
# local tiles, RASTER tile rows per launch-order band. The first that divides the product runs;
# the last (128 x 128, depth 32) divides every product ``supports`` takes.
MMA_CONFIGS: list[dict[str, int]] = [
    dict(BM=128, BN=128, WM=64, WN=64, BK=32, STAGES=3, RASTER=8),
]

# gemm_wgmma tile shapes (Hopper's wgmma, where ``use_wgmma``), preferred first: block BM x BN
# (BM / 64 warpgroups of 128 work-items), depth BK, STAGES local tiles (STAGES x (BM + BN) x BK
# x 2 bytes: NVIDIA's OpenCL takes static local arrays past its reported 48 KB), WAITN wgmma
# batches left in flight, RASTER as above; WS producer warps (warp specialization: they copy
# the tiles, the warpgroups only multiply) handing a tile over PLEAD copies later; WG marks them.
WGMMA_CONFIGS: list[dict[str, int]] = [
    # PERF (H100, 4096^3, device time, PyTorch 715-723 in the same run): 539 TFLOP/s a tile a
    # work-group, 505-509 persistent (PERSIST); 4 producer warps, 192 KB, one work-group a
    # multiprocessor; 128 x 128 without producers (two work-groups a multiprocessor) 467-469.
    # Wall time in other runs: 516 against 1 producer warp 405, 2 495, the same tile with every
    # work-item copying 451; no swizzle 197.
    dict(WG=1, BM=128, BN=256, BK=64, STAGES=4, WAITN=1, RASTER=8, WS=4, PLEAD=3),
    dict(WG=1, BM=128, BN=128, BK=64, STAGES=3, WAITN=0, RASTER=8),
]
# gemm_wgmma with its tiles copied by the tensor memory accelerator (runtime/tma.py; TMA marks
# it), in front of WGMMA_CONFIGS where ``use_tma`` (unless CLOPS_TMA=0): one producer
# work-item.
# PERF (H100, 4096^3, device time, PyTorch 715-723 in the same run): 574-580 TFLOP/s
# persistent, 574 a tile a work-group (546 before the ring's stage and phase were counted
# instead of divided out). Earlier: 128 x 128 tiles 458-463, 256 x 128 519.
TMA_CONFIGS: list[dict[str, int]] = [
    dict(WG=1, BM=128, BN=256, BK=64, STAGES=4, WAITN=1, RASTER=8, WS=1, TMA=1, PERSIST=1),
]

# gemm_nt_wgmma tile shapes (a prompt's products of a linear layer's [N][K] weight, where
# ``use_nt_wgmma``), as WGMMA_CONFIGS; ``nt_config`` picks one for a product.
NT_WGMMA_CONFIGS: list[dict[str, int]] = [
    dict(BM=128, BN=128, BK=64, STAGES=3, WAITN=0, RASTER=8),
    dict(BM=64, BN=128, BK=64, STAGES=4, WAITN=0, RASTER=8),
]
# Prompts of up to NT_SMALL_M rows, whose products the weight's bytes bound: deeper rings of
# tiles, a wgmma batch left in flight (and matmul.tensor_core_split's slices of k filling one
# wave of work-groups, no more).
# PERF (H100, device time, bench/sweep_gemm.py --nt, rows x N x K): 128x2048x8192 26.6 us (64 x
# 128, 4 stages, 8 slices: the former choice) -> 20.2 (8 stages, WAITN 1, 4 slices);
# 128x3072x2048 16.8 (4 slices) -> 14.3 (2); 128x2048x2048 13.9 -> 13.5; 128x16384x2048 41.8
# -> 43.7. At 512 rows the same tiles were slower (the 1B body's pp512 124-129k against
# 132-136k tok/s), so larger prompts keep NT_WGMMA_CONFIGS.
NT_SMALL_M = 128
NT_WGMMA_CONFIGS_SMALL: list[dict[str, int]] = [
    dict(BM=64, BN=128, BK=64, STAGES=8, WAITN=1, RASTER=8),
]

_DT = {"float32": 0, "float16": 1}
# CPUs (gemm_cpu.cl): float32 and float64 products from this many multiply-adds (below, the
# generated kernel's fusion with its neighbours is worth more), n a multiple of the vectors'
# width (16 floats, 8 doubles).
CPU_MIN_MACS = 1 << 18
CPU_COLS = {"float32": 16, "float64": 8}
# n not a multiple of the width: padded from this many widths (below, the generated kernel)
CPU_PAD_MIN = 4


# the scalar arguments' types of gemm.cl's gemm kernels (None: a buffer), given to the kernel
# objects ``gemm`` launches: pyopencl then sets their arguments in microseconds, not the
# ~0.1 ms it takes to find each one's type at every launch
_I32, _I64 = np.int32, np.int64
GEMM_ARG_TYPES = [None, _I32, _I32, _I64, None, _I32, _I32, _I64, None, _I32, _I32, _I64,
                  _I32, _I32, _I32]


def _typed(knl: Any, tma_maps: bool = False) -> Any:
    """``knl`` (a kernel of gemm.cl's gemm signature; ``tma_maps``: with the tensor maps after
    it) told its arguments' types."""
    knl.set_scalar_arg_dtypes(GEMM_ARG_TYPES + ([None] if tma_maps else []))
    return knl


def use_mma(dev: CLDevice, dtype: str) -> bool:
    """float16 products go to tensor cores (``mma.sync``) where the PTX probe succeeds."""
    return dtype == "float16" and dev.kind != "cpu" and dev.probe("nvidia_ptx") \
        and _mma_builds(dev)


@probes.per_device
def _mma_builds(dev: CLDevice) -> bool:
    """Whether the tensor-core kernel builds on ``dev`` (a capability probe, once per device)."""
    try:
        kernel(dev, "gemm", "gemm_mma", DT=1, USE_MMA=1, MDEPTH=32)
        return True
    except Exception:  # noqa: BLE001 - a driver without these PTX forms: portable path
        return False


def _async_kernel(dev: CLDevice, cfg: dict[str, int]) -> Any | None:
    """gemm_mma_async for ``cfg``, or None where it does not build (no cp.async / ldmatrix:
    the older gemm_mma runs instead)."""
    return _async_kernel_for(dev, tuple(sorted(cfg.items())))


@probes.per_device
def _async_kernel_for(dev: CLDevice, cfg: tuple[tuple[str, int], ...]) -> Any | None:
    try:
        return eager_kernel(dev, "gemm", "gemm_mma_async", GEMM_ARG_TYPES, DT=1, USE_MMA=1,
                            USE_MMA_ASYNC=1, **dict(cfg))
    except Exception:  # noqa: BLE001 - a driver without these PTX forms
        return None


def wg_threads(cfg: dict[str, int]) -> int:
    """Work-items of a gemm_wgmma / gemm_nt_wgmma work-group of tile shape ``cfg``: BM / 64
    warpgroups of consumers and WS producer warps."""
    return cfg["BM"] // 64 * 128 + cfg.get("WS", 0) * 32


def use_wgmma(dev: CLDevice) -> bool:
    """float16 products go to ``gemm_wgmma`` where its sm_90a build runs and gets a small
    product right (a capability probe, once per device): Hopper GPUs."""
    return use_mma(dev, "float16") and _wgmma_works(dev)


def use_tma(dev: CLDevice) -> bool:
    """float16 products take TMA_CONFIGS' tiles where ``tma_builds``, unless ``CLOPS_TMA=0``."""
    return _config.tma() and tma_builds(dev)


def tma_builds(dev: CLDevice) -> bool:
    """Whether TMA_CONFIGS run here: ``use_wgmma``, the CUDA driver encodes tensor maps for
    this GPU (runtime/tma.py; this retains its CUDA context) and a small batched product comes
    out right (a capability probe, once per device)."""
    return use_wgmma(dev) and tma.cuda(dev) is not None and _tma_works(dev)


@probes.per_device
def _tma_works(dev: CLDevice) -> bool:
    rng = np.random.default_rng(1)
    for cfg in TMA_CONFIGS:
        if _wgmma_kernel(dev, cfg) is None:
            return False
        # fewer tiles of K than stages, and two passes of the ring
        if not all(_product_right(dev, cfg, 256, 512, k, 2, rng) for k in (128, 320)):
            return False
        if cfg.get("PERSIST") and not _persist_right(dev, cfg, rng):
            return False
    return True


def _persist_right(dev: CLDevice, cfg: dict[str, int], rng: np.random.Generator) -> bool:
    """Whether a persistent tile shape gets products right where each work-group takes two or
    three tiles of C, the ring's phases running on from one tile to the next mid-pass."""
    m, n = 2 * cfg["BM"], 4 * cfg["BN"]
    return all(_product_right(dev, cfg, m, n, k, 2, rng, persist_groups=3)
               for k in (cfg["BK"], 5 * cfg["BK"]))


def _product_right(dev: CLDevice, cfg: dict[str, int], m: int, n: int, k: int, batch: int,
                   rng: np.random.Generator, persist_groups: int | None = None) -> bool:
    """Whether gemm with tile shape ``cfg`` gets a random batched float16 product of these sizes
    right (relative error below 2e-3 against float64); a TMA shape whose tensor maps cannot be
    made here is not right."""
    a = rng.standard_normal((batch, m, k)).astype(np.float16)
    b = rng.standard_normal((batch, k, n)).astype(np.float16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    ba, bb, bc = (dev.alloc(x.nbytes) for x in (a, b, want.astype(np.float16)))
    dev.write(ba, a, blocking=True)
    dev.write(bb, b, blocking=True)
    if cfg.get("TMA") and _tma_maps(dev, cfg, ba, 0, k, bb, 0, n, m, n, k, batch,
                                    (m * k, k * n)) is None:
        return False
    gemm(dev, bc, 0, n, ba, 0, k, bb, 0, n, m, n, k, "float16", batch, (m * n, m * k, k * n),
         mma_config=cfg, persist_groups=persist_groups)
    got = np.empty((batch, m, n), np.float16)
    dev.read(got, bc)
    return bool(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) < 2e-3)


def _tma_maps(dev: CLDevice, cfg: dict[str, int], a: Buffer, a_off: int, lda: int, b: Buffer,
              b_off: int, ldb: int, m: int, n: int, k: int, batch: int,
              strides: tuple[int, int]) -> Buffer | None:
    """The device buffer of gemm_wgmma's tensor maps (A's, then B's) for this product, or None
    where they cannot be made (no CUDA driver, unaligned or broadcast matrices)."""
    if not (tma.describable(a_off, m, lda, batch, strides[0])
            and tma.describable(b_off, k, ldb, batch, strides[1])):
        return None  # (before either buffer's address is asked for)
    ma = tma.matrix_map(dev, a, a_off, m, k, lda, batch, strides[0], (cfg["BK"], cfg["BM"]))
    mb = tma.matrix_map(dev, b, b_off, k, n, ldb, batch, strides[1], (64, cfg["BK"]))
    if ma is None or mb is None:
        return None
    return tma.maps_buffer(dev, ma, mb)


def _wgmma_kernel(dev: CLDevice, cfg: dict[str, int]) -> Any | None:
    """gemm_wgmma for ``cfg``, or None where it does not build (not Hopper, not NVIDIA)."""
    return _wgmma_kernel_for(dev, tuple(sorted((k, v) for k, v in cfg.items() if k != "WG")))


@probes.per_device
def _wgmma_kernel_for(dev: CLDevice, cfg: tuple[tuple[str, int], ...]) -> Any | None:
    # one kernel object, for gemm's launches one at a time (arguments set at each)
    prog = _wgmma_program_for(dev, cfg)
    return None if prog is None else _typed(new_kernel(prog, "gemm_wgmma", "gemm.cl"),
                                            tma_maps=bool(dict(cfg).get("TMA")))


@probes.per_device
def _wgmma_program_for(dev: CLDevice, cfg: tuple[tuple[str, int], ...]) -> Any | None:
    if dev.backend != "nvidia":
        return None
    try:
        hidden = program(dev, "gemm", DT=1, USE_MMA=1, USE_WGMMA=1, **dict(cfg))
        return rebuilt_from_binary(dev, hidden, sm90a_ptx)
    except Exception:  # noqa: BLE001 - a driver or GPU without sm_90a: the mma.sync kernels
        return None


def nt_wgmma_kernel(dev: CLDevice, cfg: dict[str, int], split: int, has_bias: bool,
                    accum: bool, glu: bool = False) -> Any | None:
    """A new gemm_nt_wgmma kernel object (its own argument slots: a launch plan sets each
    launch's arguments once) for tile shape ``cfg``, ``split`` slices of K and the epilogue
    flags (``glu``: float16 silu(gate) * up of [gate | up] rows; one slice, no bias or
    accumulation, no producer warps), or None where it does not build."""
    if glu and (split != 1 or has_bias or accum or cfg.get("WS")):
        raise ValueError("gemm_nt_wgmma: the GLU epilogue takes one slice of K, no bias, no "
                         "accumulation and no producer warps")
    key = dict(cfg, WG_NT=1, SPLIT=split, HAS_BIAS=int(has_bias), ACCUM=int(accum),
               **({"GLU": 1} if glu else {}))
    prog = _wgmma_program_for(dev, tuple(sorted(key.items())))
    return None if prog is None else new_kernel(prog, "gemm_nt_wgmma", "gemm.cl")


def nt_config(dev: CLDevice, m: int, n: int, k: int) -> dict[str, int] | None:
    """The gemm_nt_wgmma tile shape for m rows of an [n][k] weight: the first of
    NT_WGMMA_CONFIGS whose tiles divide n and k and make at least one tile a compute unit
    (else the one making most tiles); where none divides n, those whose last tile's columns
    past n (which it computes and does not store) are at most an eighth of n, n a multiple of
    8 (gpt-oss's 2880 columns: its output product in 23 tiles of 128); None where none fits
    or ``use_nt_wgmma`` fails."""
    if not use_nt_wgmma(dev):
        return None
    configs = NT_WGMMA_CONFIGS_SMALL if m <= NT_SMALL_M else NT_WGMMA_CONFIGS
    fits = [c for c in configs if n % c["BN"] == 0 and k % c["BK"] == 0] or [
        c for c in configs if k % c["BK"] == 0 and n % 8 == 0 and not c.get("WS")
        and 8 * (-n % c["BN"]) <= n]
    for cfg in fits:
        if -(-m // cfg["BM"]) * -(-n // cfg["BN"]) >= dev.caps.compute_units:
            return cfg
    return max(fits, key=lambda c: -(-m // c["BM"]) * -(-n // c["BN"]), default=None)


def use_nt_wgmma(dev: CLDevice) -> bool:
    """A prompt's linear products go to ``gemm_nt_wgmma`` where it builds and gets small
    products right for each tile shape (a capability probe, once per device): Hopper GPUs."""
    return use_mma(dev, "float16") and _nt_wgmma_works(dev)


def run_nt_wgmma(dev: CLDevice, knl: Any, cfg: dict[str, int], split: int, c: Buffer,
                 a: Buffer, b: Buffer, bias: Buffer, m: int, n: int, k: int) -> None:
    """Run ``nt_wgmma_kernel``'s ``knl`` (tile shape ``cfg``, ``split`` slices of K) once on
    whole buffers: c (float32 [split][m][n]) = a [m][k] . b [n][k]^T (+ bias where built in)."""
    group = wg_threads(cfg)
    dev.launch(knl, (-(-n // cfg["BN"]) * group, -(-m // cfg["BM"]), split), (group, 1, 1),
               [c, np.int32(0), np.int32(n), a, np.int32(k), b, np.int32(k), bias, np.int32(m),
                np.int32(n), np.int32(k), np.int64(m * n)],
               reads=[a, b, bias], writes=[c], name="gemm_nt_wgmma")


@probes.per_device
def _nt_wgmma_works(dev: CLDevice) -> bool:
    if dev.backend != "nvidia":
        return False
    rng = np.random.default_rng(0)
    m, n, k = 200, 320, 256  # rows past a tile's end, columns past the last one; two slices
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    bias = rng.standard_normal(n).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64).T + bias
    ba, bb, bbias, bc = (dev.alloc(x.nbytes) for x in (a, b, bias, want.astype(np.float32)))
    bp = dev.alloc(2 * m * n * 4)
    for buf, x in ((ba, a), (bb, b), (bbias, bias)):
        dev.write(buf, x, blocking=True)
    for cfg in NT_WGMMA_CONFIGS + NT_WGMMA_CONFIGS_SMALL:
        for split in (1, 2):
            knl = nt_wgmma_kernel(dev, cfg, split, split == 1, False)
            if knl is None:
                return False
            c = bc if split == 1 else bp
            run_nt_wgmma(dev, knl, cfg, split, c, ba, bb, bbias, m, n, k)
            got = np.empty((split, m, n), np.float32)
            dev.read(got, c, blocking=True)
            got = got.sum(0) + (bias if split == 2 else 0)
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            if not err < 1e-3:
                return False
    return True


@probes.per_device
def _wgmma_works(dev: CLDevice) -> bool:
    """gemm_wgmma builds for each of WGMMA_CONFIGS and gets a small batched product right."""
    if not use_mma(dev, "float16"):
        return False
    rng = np.random.default_rng(0)
    m, n, k, batch = 128, 256, 192, 2
    for cfg in WGMMA_CONFIGS:
        if _wgmma_kernel(dev, cfg) is None:
            return False
        if k % cfg["BK"] or n % cfg["BN"]:
            continue
        if not _product_right(dev, cfg, m, n, k, batch, rng):
            return False
        if cfg.get("PERSIST") and not _persist_right(dev, cfg, rng):
            return False
    return True


def _mma_config(dev: CLDevice, m: int, n: int, k: int, tma_ok: bool = True) -> dict[str, int]:
    if use_wgmma(dev):
        for cfg in (TMA_CONFIGS if tma_ok and use_tma(dev) else []) + WGMMA_CONFIGS:
            if m % cfg["BM"] == 0 and n % cfg["BN"] == 0 and k % cfg["BK"] == 0:
                return cfg
    return _mma_sync_config(m, n, k)


def _mma_sync_config(m: int, n: int, k: int) -> dict[str, int]:
    for cfg in MMA_CONFIGS:
        if m % cfg["BM"] == 0 and n % cfg["BN"] == 0 and k % cfg["BK"] == 0:
            return cfg
    return dict(BM=TILE, BN=TILE, WM=64, WN=64, BK=32, STAGES=3, RASTER=8)


def depth(dev: CLDevice, dtype: str) -> int:
    return 32 if use_mma(dev, dtype) else TILED_DEPTH


def supports(dev: CLDevice, dtype: str, m: int, n: int, k: int, offsets: tuple[int, ...],
             strides: tuple[int, ...], force: bool = False, batch: int = 1) -> bool:
    """Whether ``gemm`` takes this product (``batch`` of them): a GPU (unless ``force``),
    float32/float16, tile multiples, aligned rows, and enough work to beat the generated
    kernel."""
    if dtype not in _DT or (dev.kind == "cpu" and not force):
        return False
    if not force and batch * m * n * k < MIN_MACS:
        return False
    align = 4 if dtype == "float32" else 8
    return (m % TILE == 0 and n % TILE == 0 and k % depth(dev, dtype) == 0
            and all(o % align == 0 for o in offsets) and all(s % align == 0 for s in strides))


def gemm(dev: CLDevice, c: Buffer, c_off: int, ldc: int, a: Buffer, a_off: int, lda: int,
         b: Buffer, b_off: int, ldb: int, m: int, n: int, k: int, dtype: str = "float32",
         batch: int = 1, strides: tuple[int, int, int] = (0, 0, 0),
         portable: bool = False, tiled_depth: int | None = None,
         mma_depth: int | None = None, mma_config: dict[str, int] | None = None,
         persist_groups: int | None = None) -> Event:
    """C[i] = A[i] @ B[i] for i < batch (row-major; ``strides`` are the batch strides of C, A,
    B in elements). ``portable`` skips the tensor-core kernels; ``mma_depth`` picks the older
    ``gemm_mma`` at that depth, ``mma_config`` a tile shape of ``gemm_mma_async`` (or, with
    ``WG``, of ``gemm_wgmma``); ``persist_groups`` caps the work-groups a batch of a persistent
    tile shape (``PERSIST``) launches (default: the compute units' share), so that each takes
    several tiles."""
    mma = not portable and use_mma(dev, dtype)
    bm, bn, group, name = TILE, TILE, GROUP, "gemm"
    knl = None
    persist = False
    maps: Buffer | None = None
    if mma and mma_depth is None:
        cfg = mma_config or _mma_config(dev, m, n, k)
        if cfg.get("TMA"):
            maps = _tma_maps(dev, cfg, a, a_off, lda, b, b_off, ldb, m, n, k, batch, strides[1:])
            if maps is None:  # the copies by cp.async instead
                cfg = _mma_config(dev, m, n, k, tma_ok=False)
        if cfg.get("WG"):
            knl = _wgmma_kernel(dev, cfg)
            if knl is not None:
                bm, bn, name, group = cfg["BM"], cfg["BN"], "gemm_wgmma", wg_threads(cfg)
                persist = bool(cfg.get("PERSIST"))
            else:
                cfg = _mma_sync_config(m, n, k)
        if knl is None:
            knl = _async_kernel(dev, cfg)
            if knl is not None:
                bm, bn, name = cfg["BM"], cfg["BN"], "gemm_mma"
                group = bm // cfg["WM"] * (bn // cfg["WN"]) * 32
    if knl is None and mma:
        d = mma_depth or (MMA_DEPTH if k % MMA_DEPTH == 0 else 32)
        knl = eager_kernel(dev, "gemm", "gemm_mma", GEMM_ARG_TYPES, DT=1, USE_MMA=1, MDEPTH=d)
        name = "gemm_mma"
    if knl is None:
        knl = eager_kernel(dev, "gemm", "gemm_tiled", GEMM_ARG_TYPES, DT=_DT[dtype],
                           DEPTH=tiled_depth or TILED_DEPTH)
    i32, i64 = np.int32, np.int64
    args: list[Any] = [c, i32(c_off), i32(ldc), i64(strides[0]), a, i32(a_off), i32(lda),
                       i64(strides[1]), b, i32(b_off), i32(ldb), i64(strides[2]), i32(m),
                       i32(n), i32(k)]
    reads = [a, b]
    if maps is not None and name == "gemm_wgmma":
        args.append(maps)
        reads.append(maps)
        name = "gemm_wgmma_tma"
    grid = (n // bn * group, m // bm, batch)
    if persist:  # a work-group a compute unit, each taking tiles of its batch in turn
        tiles = n // bn * (m // bm)
        groups = persist_groups or max(1, dev.caps.compute_units // batch)
        grid = (min(tiles, groups) * group, 1, batch)
    return dev.launch(knl, grid, (group, 1, 1), args, reads=reads, writes=[c], name=name)


# gemm_any's and splitk_sum's scalar arguments' types (see GEMM_ARG_TYPES)
_ANY_ARG_TYPES = [None, _I64, _I64, _I64] + [None, _I64, _I64, _I64, _I64] * 2 + [_I32] * 5
_SUM_ARG_TYPES = [None, _I64, _I64, _I64, None, _I32, _I32, _I32]
# gemm_any (gemm_any.cl): GPU products ``gemm`` does not take, from this many multiply-adds
# (below, the generated kernel's fusion with its neighbours is worth more).
ANY_MIN_MACS = 1 << 22
ANY_TILE, ANY_DEPTH = 64, 16
# work-groups gemm_any launches per compute unit at least (K is sliced until it does; more for
# gemm_any_mma, whose tiles wait on memory: H200, 200x200x200000 float16, 17 / 34 / 66 / 132
# slices 1.00 / 0.83 / 0.67 / 0.67 ms) ...
ANY_GROUPS_PER_CU = 2
ANY_MMA_GROUPS_PER_CU = 8
# ... each slice of K at least this deep
ANY_MIN_SLICE = 256


def any_supports(dev: CLDevice, dtype: str, m: int, n: int, k: int, force: bool = False,
                 batch: int = 1) -> bool:
    """Whether ``gemm_any`` takes this product (``batch`` of them): a GPU (unless ``force``),
    float32/float16, enough work; any shape, offsets and strides."""
    if dtype not in _DT or (dev.kind == "cpu" and not force):
        return False
    return force or batch * m * n * k >= ANY_MIN_MACS


@probes.per_device
def any_mma_builds(dev: CLDevice) -> bool:
    """Whether gemm_any_mma builds on ``dev`` (an NVIDIA GPU whose mma.sync gemm builds)."""
    try:
        eager_kernel(dev, "gemm_any", "gemm_any_mma", _ANY_ARG_TYPES, DT=1, MMA=1, PART=0)
        return True
    except Exception:  # noqa: BLE001 - a driver without these PTX forms: the float kernel
        return False


# float16 products of other shapes go to gemm's tensor-core tiles on zero-padded copies of
# their operands from this many multiply-adds, where the padding adds at most this fraction of
# work (below or beyond: gemm_any_mma). PERF (H200, 2026-11-29): see RESULTS' gemm_any rows.
PAD_MIN_MACS = 1 << 29
PAD_MAX_WORK = 1.3


def padded_shape(dev: CLDevice, dtype: str, m: int, n: int, k: int
                 ) -> tuple[int, int, int] | None:
    """(M, N, K) rounded up to gemm's tiles, where a float16 product of this shape runs faster
    on zero-padded copies through them than through gemm_any_mma; else None."""
    if not use_mma(dev, dtype) or m * n * k < PAD_MIN_MACS:
        return None
    mp, np_, kp = (-(-v // r) * r for v, r in ((m, TILE), (n, TILE), (k, MMA_DEPTH)))
    return (mp, np_, kp) if mp * np_ * kp <= PAD_MAX_WORK * m * n * k else None


def pad_copy(dev: CLDevice, src: Buffer, s_off: int, strides: tuple[int, int, int], m: int,
             k: int, mp: int, kp: int, batch: int) -> Buffer:
    """A new buffer of ``batch`` contiguous float16 [mp][kp] matrices: the (m, k) matrices of a
    view of ``src`` (element (b, m, k) at s_off + b*strides[0] + m*strides[1] + k*strides[2])
    with zeros past their edges."""
    out = dev.alloc(batch * mp * kp * 2)
    i64 = np.int64
    dev.launch(eager_kernel(dev, "gemm_any", "pad_copy", [None, None] + [_I64] * 4 + [_I32] * 4),
               (-(-kp // 32) * 32, -(-mp // 32) * 8, batch), (32, 8, 1),
               [out, src, i64(s_off), *(i64(v) for v in strides), np.int32(m), np.int32(k),
                np.int32(mp), np.int32(kp)], reads=[src], writes=[out], name="gemm.pad_copy")
    return out


def _vec_view(off: int, strides: tuple[int, int, int], fast: int) -> bool:
    """Whether gemm_any_mma reads an operand 8 float16 values a load: stride 1 along axis
    ``fast`` (1: rows, 2: columns), its other strides and its offset multiples of 8."""
    other = 3 - fast
    return strides[fast] == 1 and off % 8 == 0 and strides[0] % 8 == 0 and \
        strides[other] % 8 == 0 and strides[other] != 0


def any_slices(dev: CLDevice, m: int, n: int, k: int, batch: int,
               per_cu: int = ANY_GROUPS_PER_CU) -> int:
    """Slices of K ``gemm_any`` splits a product into: enough work-groups to fill the device
    (``per_cu`` a compute unit)."""
    tiles = -(-m // ANY_TILE) * -(-n // ANY_TILE) * batch
    want = per_cu * dev.caps.compute_units
    if tiles >= want:
        return 1
    return max(1, min(-(-want // tiles), k // ANY_MIN_SLICE))


def gemm_any(dev: CLDevice, c: Buffer, c_off: int, c_strides: tuple[int, int],
             a: Buffer, a_off: int, a_strides: tuple[int, int, int],
             b: Buffer, b_off: int, b_strides: tuple[int, int, int],
             m: int, n: int, k: int, batch: int = 1, dtype: str = "float32",
             slices: int | None = None) -> Event:
    """C[i] = A[i] @ B[i] for i < batch: element (m, k) of A at a_off + i*a_strides[0] +
    m*a_strides[1] + k*a_strides[2] (elements; any strides, 0 and negative included), likewise
    B's (k, n); C's rows c_strides[1] apart, batches c_strides[0], columns contiguous.
    ``slices`` of K (default ``any_slices``): above one, each slice's sums go to a float32
    buffer and ``splitk_sum`` adds them up in order."""
    if dtype not in _DT:
        raise ValueError(f"gemm_any takes float32 or float16, not {dtype}")
    # float16 on NVIDIA's tensor cores (the same tiles, slices and argument order)
    mma = use_mma(dev, dtype) and any_mma_builds(dev)
    s = slices or any_slices(dev, m, n, k, batch,
                             ANY_MMA_GROUPS_PER_CU if mma else ANY_GROUPS_PER_CU)
    per = -(-k // s)
    ks = -(-per // ANY_DEPTH) * ANY_DEPTH  # each slice a whole number of tiles deep
    s = max(1, -(-k // ks))
    i32, i64 = np.int32, np.int64
    defs = dict(DT=_DT[dtype], A_KFAST=int(a_strides[2] == 1 and a_strides[1] != 1),
                B_NFAST=int(b_strides[2] == 1 or b_strides[1] != 1), PART=int(s > 1))
    grid = (-(-n // ANY_TILE) * 16, -(-m // ANY_TILE) * 16, batch * s)
    tail = [b, i64(b_off), *(i64(v) for v in b_strides), i32(m), i32(n), i32(k), i32(s),
            i32(ks)]
    head = [a, i64(a_off), *(i64(v) for v in a_strides)]
    # each operand of gemm_any_mma 16 bytes a load where one axis has stride 1 and the rest
    # keep 16-byte alignment
    if mma:
        defs.update(MMA=1, VEC_A=int(_vec_view(a_off, a_strides, fast=2 if defs["A_KFAST"]
                                               else 1)),
                    VEC_B=int(_vec_view(b_off, b_strides, fast=2 if defs["B_NFAST"] else 1)))
    knl = eager_kernel(dev, "gemm_any", "gemm_any_mma" if mma else "gemm_any", _ANY_ARG_TYPES,
                       **defs)
    name = "gemm_any_mma" if mma else "gemm_any"
    if s == 1:
        return dev.launch(knl, grid, (16, 16, 1),
                          [c, i64(c_off), i64(c_strides[0]), i64(c_strides[1]), *head, *tail],
                          reads=[a, b], writes=[c], name=name)
    p = dev.alloc(batch * s * m * n * 4)
    dev.launch(knl, grid, (16, 16, 1), [p, i64(0), i64(0), i64(0), *head, *tail], reads=[a, b],
               writes=[p], name=f"{name}.slices")
    return dev.launch(eager_kernel(dev, "gemm_any", "splitk_sum", _SUM_ARG_TYPES,
                                   DT=_DT[dtype]), (n, m, batch), None,
                      [c, i64(c_off), i64(c_strides[0]), i64(c_strides[1]), p, i32(s), i32(m),
                       i32(n)], reads=[p], writes=[c], name="gemm_any.sum")


def cpu_supports(dev: CLDevice, dtype: str, m: int, n: int, k: int) -> bool:
    """Whether ``gemm_cpu`` takes this product: a CPU, float32 (n a multiple of 16) or float64
    where the device has it (n a multiple of 8), enough work, and a runtime that builds and
    runs the kernel (``cpu_kernel_works``)."""
    if dev.kind != "cpu" or dtype not in CPU_COLS or (dtype == "float64" and not dev.caps.fp64):
        return False
    return n % CPU_COLS[dtype] == 0 and m > 0 and k > 0 and m * n * k >= CPU_MIN_MACS \
        and cpu_kernel_works(dev, dtype)


_CPU_WORKS: dict[tuple[str, str], bool] = {}
_CPU_CHILD = """
import sys
import clops
from clops.kernels import gemm
dev = clops.device(sys.argv[1])
print("CLOPS_GEMM_CPU", gemm._cpu_check(dev, sys.argv[2]), flush=True)
"""


def cpu_kernel_works(dev: CLDevice, dtype: str) -> bool:
    """Whether this CPU runtime builds ``gemm_cpu`` and gets a small product right: checked in
    a child process (a runtime whose compiler fails may abort the process that tried it, as
    PoCL 3.0 from the ``pocl-binary-distribution`` wheel does at exit on AMD EPYC hosts: LLVM
    there cannot select ``fma`` on 16-wide float vectors), once per device and driver,
    remembered with the device's other probes. Where it fails, products take the portable
    kernel and ``CLOPS_DEBUG`` says why."""
    key = (dev.key, dtype)
    ok = _CPU_WORKS.get(key)
    if ok is not None:
        return ok
    why = ["remembered"]

    def child() -> bool:
        try:
            res = subprocess.run([sys.executable, "-c", _CPU_CHILD, dev.selector, dtype],
                                 capture_output=True, text=True, timeout=300)
        except (subprocess.TimeoutExpired, OSError) as e:
            why[0] = str(e)
            return False
        why[0] = (res.stderr.strip().splitlines() or [f"status {res.returncode}"])[-1]
        return "CLOPS_GEMM_CPU True" in res.stdout

    # (2: the check covers the packed kernels too)
    ok = _CPU_WORKS[key] = dev.remembered(f"gemm_cpu2_{dtype}", child)
    if not ok and _config.debug_level():
        print(f"clops: gemm_cpu does not work on {dev.name} ({why[0][:200]}); {dtype} "
              "products there take the portable kernel", file=sys.stderr)
    return ok


def _cpu_check(dev: CLDevice, dtype: str) -> bool:
    """A small product through ``gemm_cpu`` against numpy (run by the child process)."""
    w = CPU_COLS[dtype]
    np_dt: Any = np.float64 if dtype == "float64" else np.float32
    rng = np.random.default_rng(0)
    # (8 rows: the kernel on A in place; past CPU_PACK_ROWS, a row count no tile divides, and
    # CPU_PA_MIN_K deep: the packed kernels)
    for m, k in ((8, 32), (CPU_PACK_ROWS + 7, CPU_PA_MIN_K)):
        a = rng.standard_normal((m, k)).astype(np_dt)
        b = rng.standard_normal((k, 2 * w)).astype(np_dt)
        bufs = [dev.alloc(x.nbytes) for x in (a, b, np.empty((m, 2 * w), np_dt))]
        dev.write(bufs[0], a, blocking=True)
        dev.write(bufs[1], b, blocking=True)
        gemm_cpu(dev, bufs[2], 0, 2 * w, bufs[0], 0, k, bufs[1], 0, 2 * w, m, 2 * w, k,
                 dtype=dtype, native=False)
        c = np.empty((m, 2 * w), np_dt)
        dev.read(c, bufs[2])
        if not np.allclose(c, a @ b, rtol=1e-4, atol=1e-4):
            return False
    return True


def _row_tile(dev: CLDevice, m: int) -> int:
    """Rows of C per work-item of ``gemm_cpu``: the largest of 8, 4, 2, 1 that divides m; of 4,
    2, 1 on a CPU of 8-wide vectors (``launch.narrow_cpu``: 8 rows of 16 columns are all 16 of
    its registers).

    PERF (2-core EPYC with AVX2, float32, wall time under load): 1024^3 Intel's runtime 49-56
    -> 24-25 ms, PoCL 3.1 52-53 -> 25 ms; 2048^3 455 -> 139-163 and 406-413 -> 161-166 ms."""
    return next(r for r in ((4, 2, 1) if narrow_cpu(dev) else (8, 4, 2, 1)) if m % r == 0)


def gemm_cpu(dev: CLDevice, c: Buffer, c_off: int, ldc: int, a: Buffer, a_off: int, lda: int,
             b: Buffer, b_off: int, ldb: int, m: int, n: int, k: int, batch: int = 1,
             strides: tuple[int, int, int] = (0, 0, 0), dtype: str = "float32",
             a_trans: bool = False, native: bool = True) -> Event:
    """``gemm`` on a CPU (``gemm_cpu.cl``; float32 with n % 16 == 0, float64 with n % 8).
    ``a_trans``: A is stored transposed, element (i, k) at a_off + k * lda + i. float32 runs
    natively where the device runs the native products (``native_cpu.takes_gemm``; ``native``
    False: the OpenCL C kernels all the same; PERF there)."""
    if dtype not in CPU_COLS:
        raise ValueError(f"gemm_cpu: {dtype} is not float32 or float64")
    w = CPU_COLS[dtype]
    if n % w:
        raise ValueError(f"gemm_cpu: n = {n} is not a multiple of {w} ({dtype})")
    if native and native_cpu.takes_gemm(dev, dtype, n):
        return native_cpu.gemm(dev, c, c_off, ldc, a, a_off, lda, b, b_off, ldb, m, n, k, batch,
                               strides, a_trans).run(dev)
    dt = int(dtype == "float64")
    i32, i64 = np.int32, np.int64
    sb = strides[2]
    packed = m >= CPU_PACK_ROWS
    if packed:
        # PERF: B's column panels made contiguous first (2048^3 float32: 0.44x numpy with
        # panels read 8 KB apart, their rows on the same cache sets)
        pb = dev.alloc(batch * k * n * (8 if dt else 4))
        dev.launch(eager_kernel(dev, "gemm_cpu", "pack_b", [None, None, _I32, _I32, _I64, _I32],
                                DT=dt), (n // w, -(-k // 16), batch), None,
                   [pb, b, i32(b_off), i32(ldb), i64(sb), i32(k)], reads=[b], writes=[pb],
                   name="gemm_cpu.pack_b")
        b, b_off, ldb, sb = pb, 0, w, k * n
        if packs_a(dev, dtype, m, k):
            return _gemm_packed_a(dev, c, c_off, ldc, strides[0], a, a_off, lda, strides[1],
                                  b, sb, m, n, k, batch, a_trans)
    rm = _row_tile(dev, m)
    knl = eager_kernel(dev, "gemm_cpu", "gemm_cpu", GEMM_ARG_TYPES[:-3] + [_I32], RM=rm, DT=dt,
                       PACKED=int(packed), A_T=int(a_trans))
    args: list[Any] = [c, i32(c_off), i32(ldc), i64(strides[0]), a, i32(a_off), i32(lda),
                       i64(strides[1]), b, i32(b_off), i32(ldb), i64(sb), i32(k)]
    return dev.launch(knl, (m // rm, n // w, batch), (1, 1, 1), args, reads=[a, b],
                      writes=[c], name="gemm_cpu")


# rows of C a work-item of gemm_cpu_pa keeps (two float8 halves of 16 columns a row: 12 of an
# AVX2 core's 16 registers at 6)
CPU_PA_ROWS = 6
# and the depth (k) it takes from: A is read once more to pack it, and a shallower tile is too
# little work for a work-group's fixed cost (PERF, Intel's runtime: 8192x64x64 1.7-2.9 ms
# packed against 2.1 in place)
CPU_PA_MIN_K = 256


def packs_a(dev: CLDevice, dtype: str, m: int, k: int) -> bool:
    """Whether ``gemm_cpu`` takes ``gemm_cpu_pa`` (A packed in tiles of ``CPU_PA_ROWS``, any
    row count) for these rows: float32 on a CPU of 8-wide vectors, B packed too (m from
    ``CPU_PACK_ROWS``), k from ``CPU_PA_MIN_K``."""
    return (dtype == "float32" and narrow_cpu(dev) and m >= CPU_PACK_ROWS
            and k >= CPU_PA_MIN_K)


def _gemm_packed_a(dev: CLDevice, c: Buffer, c_off: int, ldc: int, sc: int, a: Buffer,
                   a_off: int, lda: int, sa: int, pb: Buffer, sb: int, m: int, n: int, k: int,
                   batch: int, a_trans: bool) -> Event:
    """float32 ``gemm_cpu`` on a CPU of 8-wide vectors (``launch.narrow_cpu``) with B packed
    (``pb``): A's rows packed in tiles of ``CPU_PA_ROWS`` (the last one padded with zeros),
    then ``gemm_cpu_pa``."""
    i32, i64 = np.int32, np.int64
    rm = CPU_PA_ROWS
    tiles = -(-m // rm)
    pa = dev.alloc(batch * tiles * rm * k * 4)
    dev.launch(eager_kernel(dev, "gemm_cpu", "pack_a",
                            [None, None, _I32, _I32, _I64, _I32, _I32], RM=rm, A_T=int(a_trans)),
               (-(-k // 16), tiles, batch), None,
               [pa, a, i32(a_off), i32(lda), i64(sa), i32(m), i32(k)], reads=[a], writes=[pa],
               name="gemm_cpu.pack_a")
    knl = eager_kernel(dev, "gemm_cpu", "gemm_cpu_pa",
                       [None, _I32, _I32, _I64, None, _I64, None, _I64, _I32, _I32], RM=rm)
    return dev.launch(knl, (tiles, n // 16, batch), (1, 1, 1),
                      [c, i32(c_off), i32(ldc), i64(sc), pa, i64(tiles * rm * k), pb, i64(sb),
                       i32(m), i32(k)], reads=[pa, pb], writes=[c],
                      name="gemm_cpu")


def pad_columns(dev: CLDevice, b: Buffer, b_off: int, k: int, n: int, batch: int,
                dtype: str) -> Buffer:
    """A new buffer of ``batch`` contiguous [k][n] matrices at ``b_off`` with zero columns
    past n up to a multiple of gemm_cpu's width (``pad_cols``)."""
    w = CPU_COLS[dtype]
    wide = -(-n // w) * w
    out = dev.alloc(batch * k * wide * (8 if dtype == "float64" else 4))
    dev.launch(eager_kernel(dev, "gemm_cpu", "pad_cols", [None, None, _I32, _I32, _I64, _I32],
                            DT=int(dtype == "float64")),
               (wide // w, k, batch), (1, 1, 1), [out, b, np.int32(b_off), np.int32(n),
                                                  np.int64(k * n), np.int32(n)],
               reads=[b], writes=[out], name="gemm_cpu.pad_cols")
    return out


# gemm_cpu packs B's column panels from this many rows of A (below, the pass over B costs more
# than it saves)
CPU_PACK_ROWS = 64


def matmul(x1: Any, x2: Any, dtype: Any, empty: Any) -> Any | None:
    """``x1 @ x2`` through ``gemm`` (GPUs) or ``gemm_cpu`` (CPUs) when it takes these operands
    (Tensors of ``dtype``, 2-D, or 3-D with equal batches), else ``None``.
    ``empty(shape, dtype, device)`` makes the result."""
    dev = x1.device
    if x1.dtype != dtype or x2.dtype != dtype or dtype.name not in (
            CPU_COLS if dev.kind == "cpu" else _DT):
        return None
    if x1.ndim != x2.ndim or x1.ndim not in (2, 3) or x1.shape[:-2] != x2.shape[:-2]:
        return None
    (m, k), (k2, n) = x1.shape[-2:], x2.shape[-2:]
    if k != k2:
        return None
    if dev.kind == "cpu":
        # n not a multiple of the vectors' width: B padded with zero columns to the next one,
        # C computed that wide and the result its first n columns (a view), where the padding
        # is at most a quarter of n
        w = CPU_COLS[dtype.name]
        wide = -(-n // w) * w
        if (wide != n and n < CPU_PAD_MIN * w) or not cpu_supports(dev, dtype.name, m, wide, k):
            return None
        batch = x1.shape[0] if x1.ndim == 3 else 1
        # x.T of a row-major x (a Gram matrix x.T @ x) is read in place, not copied
        a_trans = m > 1 and k > 1 and tuple(x1.strides) == (
            (m * k, 1, m) if x1.ndim == 3 else (1, m))
        a = x1 if a_trans else x1.contiguous()
        lda, a_row = (m, 1) if a_trans else (k, k)
        b = x2.contiguous()
        b_buf, b_off = b.buffer, b.offset
        if wide != n:  # B's rows with zero columns past them
            b_buf, b_off = pad_columns(dev, b.buffer, b.offset, k, n, batch, dtype.name), 0
        out = empty((*x1.shape[:-2], m, wide), dtype, dev)
        strides = (m * wide, m * k, k * wide)
        # rows in tiles of 8 (gemm_cpu's widest), the rest in a launch of their own (m = 257
        # would otherwise take one row a work-item throughout); packed A tiles and the native
        # product take any rows
        whole = m <= 8 or packs_a(dev, dtype.name, m, k) or \
            native_cpu.takes_gemm(dev, dtype.name, wide)
        for r0, rows in ((0, m),) if whole else ((0, m - m % 8), (m - m % 8, m % 8)):
            if rows:
                gemm_cpu(dev, out.buffer, out.offset + r0 * wide, wide, a.buffer,
                         a.offset + r0 * a_row, lda, b_buf, b_off, wide, rows, wide, k, batch,
                         strides, dtype.name, a_trans)
        return out if wide == n else out[..., :n]
    # PERF (H200, float32 1024 x 128^3, counted without the batch): the generated kernel,
    # 25.2 ms of device time against CuPy's 0.15
    batch = x1.shape[0] if x1.ndim == 3 else 1
    if supports(dev, dtype.name, m, n, k, (), (), batch=batch):
        a, b = x1.contiguous(), x2.contiguous()
        if supports(dev, dtype.name, m, n, k, (a.offset, b.offset), (), batch=batch):
            out = empty((*x1.shape[:-2], m, n), dtype, dev)
            gemm(dev, out.buffer, out.offset, n, a.buffer, a.offset, k, b.buffer, b.offset, n,
                 m, n, k, dtype.name, batch, (m * n, m * k, k * n))
            return out
    if not any_supports(dev, dtype.name, m, n, k, batch=batch):
        return None
    sa = x1.strides if x1.ndim == 3 else (0, *x1.strides)
    sb = x2.strides if x2.ndim == 3 else (0, *x2.strides)
    pads = padded_shape(dev, dtype.name, m, n, k)
    if pads is not None:
        # zero-padded copies through gemm's tensor-core tiles; the result a view of C's corner
        mp, np_, kp = pads
        ap = pad_copy(dev, x1.buffer, x1.offset, sa, m, k, mp, kp, batch)
        bp = pad_copy(dev, x2.buffer, x2.offset, sb, k, n, kp, np_, batch)
        wide = empty((*x1.shape[:-2], mp, np_), dtype, dev)
        gemm(dev, wide.buffer, wide.offset, np_, ap, 0, kp, bp, 0, np_, mp, np_, kp,
             dtype.name, batch, (mp * np_, mp * kp, kp * np_))
        return wide[..., :m, :n]
    # any shape and strides (a transposed view is read in place)
    out = empty((*x1.shape[:-2], m, n), dtype, dev)
    gemm_any(dev, out.buffer, out.offset, (m * n, n), x1.buffer, x1.offset, sa, x2.buffer,
             x2.offset, sb, m, n, k, batch, dtype.name)
    return out


def _products_work(dev: CLDevice) -> bool:
    return cpu_kernel_works(dev, "float32")


# a CPU runtime whose vectorized product fails is not the default where another passes
add_cpu_default_check(_products_work)
