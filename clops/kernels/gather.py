"""Kernels, gather: gather and scatter by element offsets, the last-writer scatter of repeated
offsets, and nonzero compaction (``gather.cl``), on device buffers with element offsets; the
array layer prepares contiguous operands and wraps the results. One program per element size,
so every shape reuses it."""

from __future__ import annotations

import math

import numpy as np

from ..runtime import CLDevice
from ..runtime.pool import Buffer
from .launch import flat_geometry, shared_kernel

_BITS_TYPE = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong", 16: "ulong2"}
BITS_TYPES = frozenset(_BITS_TYPE)  # the element sizes these kernels copy
I64 = np.int64


def _opts(dev: CLDevice, t: str, *more: str) -> tuple[str, ...]:
    """Build options: the element type ``t`` and, on CPUs (launched with exactly as many
    work-items as elements: ``flat_geometry``, ``_grid``), no bound checks."""
    return (f"-DT={t}", *more) + (("-DEXACT",) if dev.kind == "cpu" else ())


def gather(dev: CLDevice, itemsize: int, out: Buffer, out_off: int, src: Buffer, src_off: int,
           idx: Buffer, idx_off: int, n: int) -> None:
    """``out[out_off + i] = src[src_off + idx[idx_off + i]]`` for ``i < n``."""
    if n == 0:
        return
    k = shared_kernel(dev, "gather", "gather", _opts(dev, _BITS_TYPE[itemsize]))
    g, loc = flat_geometry(dev, n)
    dev.launch(k, g, loc, [out, I64(out_off), src, I64(src_off), idx, I64(idx_off), I64(n)],
               reads=[src, idx], writes=[out], name="gather")


def scatter(dev: CLDevice, itemsize: int, dst: Buffer, dst_off: int, val: Buffer, val_off: int,
            idx: Buffer, idx_off: int, n: int) -> None:
    """``dst[dst_off + idx[idx_off + i]] = val[val_off + i]`` for ``i < n``."""
    if n == 0:
        return
    k = shared_kernel(dev, "gather", "scatter", _opts(dev, _BITS_TYPE[itemsize]))
    g, loc = flat_geometry(dev, n)
    dev.launch(k, g, loc, [dst, I64(dst_off), val, I64(val_off), idx, I64(idx_off), I64(n)],
               reads=[val, idx, dst], writes=[dst], name="scatter")


def scatter_last(dev: CLDevice, itemsize: int, dst: Buffer, dst_off: int, val: Buffer,
                 val_off: int, sorted_idx: Buffer, perm: Buffer, n: int) -> None:
    """Scatter through stably sorted offsets; of repeated offsets the last one in the original
    order writes (``perm`` holds the original positions)."""
    if n == 0:
        return
    k = shared_kernel(dev, "gather", "scatter_last", _opts(dev, _BITS_TYPE[itemsize]))
    g, loc = flat_geometry(dev, n)
    dev.launch(k, g, loc, [dst, I64(dst_off), val, I64(val_off), sorted_idx, perm, I64(n)],
               reads=[val, sorted_idx, perm, dst], writes=[dst], name="scatter_last")


def compact_index(dev: CLDevice, out: Buffer, flags: Buffer, f_off: int, pos: Buffer,
                  p_off: int, n: int) -> None:
    """Write the index of every nonzero flag at its place (``pos`` = inclusive prefix sum)."""
    if n == 0:
        return
    k = shared_kernel(dev, "gather", "compact_index", _opts(dev, "uchar"))
    g, loc = flat_geometry(dev, n)
    dev.launch(k, g, loc, [out, flags, I64(f_off), pos, I64(p_off), I64(n)], reads=[flags, pos],
               writes=[out], name="compact_index")


def take_axis(dev: CLDevice, itemsize: int, out: Buffer, src: Buffer, src_off: int, idx: Buffer,
              idx_off: int, n: int, length: int, axis_stride: int, outer: int,
              outer_stride: int, inner: int, inner_stride: int) -> None:
    """``out`` (contiguous, outer x n x inner) = the view ``src[src_off + o * outer_stride +
    i * axis_stride + j * inner_stride]`` at the ``n`` raw int64 indices ``i`` of ``idx``
    (negatives wrap by ``length``, then clamped into range)."""
    if n == 0 or outer == 0 or inner == 0:
        return
    opts = _opts(dev, _BITS_TYPE[itemsize])
    common = [out, src, I64(src_off), idx, I64(idx_off), I64(n), I64(length), I64(axis_stride),
              I64(outer_stride)]
    if inner == 1:
        k = shared_kernel(dev, "gather", "take_elems", opts)
        g, loc = _grid(dev, (n, outer))
        dev.launch(k, g, loc, common, reads=[src, idx], writes=[out], name="take_elems")
        return
    k = shared_kernel(dev, "gather", "take_blocks",
                      opts + (("-DUNIT_INNER",) if inner_stride == 1 else ()))
    g, loc = _grid(dev, (inner, n, outer))
    dev.launch(k, g, loc, common + [I64(inner_stride), I64(inner)], reads=[src, idx],
               writes=[out], name="take_blocks")


def _grid(dev: CLDevice, dims: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """A global size over ``dims`` (dim 0 padded to groups of up to 256 off CPUs; the kernels
    check dim 0's bound) and its local size (the driver's choice on CPUs)."""
    if dev.kind == "cpu":
        return dims, None
    wg = min(256, dev.caps.max_work_group, 1 << max(0, (dims[0] - 1).bit_length()))
    return (-(-dims[0] // wg) * wg,) + dims[1:], (wg,) + (1,) * (len(dims) - 1)


def compress(dev: CLDevice, itemsize: int, out: Buffer, src: Buffer, src_off: int,
             flags: Buffer, f_off: int, pos: Buffer, p_off: int, n: int, inner: int) -> None:
    """Rows ``i < n`` of ``inner`` contiguous elements of ``src`` whose uchar flag is set, packed
    in order into ``out`` (``pos``: the inclusive prefix sum of the flags)."""
    if n == 0 or inner == 0:
        return
    opts = _opts(dev, _BITS_TYPE[itemsize])
    args = [out, src, I64(src_off), flags, I64(f_off), pos, I64(p_off), I64(n)]
    if inner == 1:
        k = shared_kernel(dev, "gather", "compress_elems", opts)
        g, loc = _grid(dev, (n,))
        dev.launch(k, g, loc, args, reads=[src, flags, pos], writes=[out],
                   name="compress_elems")
        return
    k = shared_kernel(dev, "gather", "compress_blocks", opts)
    g, loc = _grid(dev, (inner, n))
    dev.launch(k, g, loc, args + [I64(inner)], reads=[src, flags, pos], writes=[out],
               name="compress_blocks")


def copy_rows(dev: CLDevice, itemsize: int, out: Buffer, out_off: int, out_row: int, col: int,
              src: Buffer, src_off: int, rows: int, inner: int) -> None:
    """``rows`` contiguous rows of ``inner`` elements of ``src`` into ``out`` at column ``col`` of
    its rows of ``out_row`` elements (one input of a concatenation)."""
    if rows == 0 or inner == 0:
        return
    k = shared_kernel(dev, "gather", "copy_rows", _opts(dev, _BITS_TYPE[itemsize]))
    g, loc = _grid(dev, (inner, rows))
    dev.launch(k, g, loc, [out, I64(out_off), I64(out_row), I64(col), src, I64(src_off),
                           I64(inner)], reads=[src], writes=[out], name="copy_rows")


# Edge of the tiles of permute_lines and permute_tiles (TB in gather.cl).
PERMUTE_TILE = 16


def permute_tiles(dev: CLDevice, itemsize: int, out: Buffer, src: Buffer, src_off: int,
                  nq: int, osq: int, nj: int, sj: int, na: int, sa: int, osa: int, nb: int,
                  sb: int, osb: int) -> None:
    """``out[ia*osa + ib*osb + iq*osq + j] = src[src_off + ia*sa + ib*sb + iq + j*sj]`` for the
    ``na x nb x nq x nj`` indices: a copy that takes the source's unit-stride axis q out of the
    last place (the output's, j), q in tiles (``permute_lines`` on Intel's runtime,
    ``permute_tiles`` elsewhere: gather.cl says why)."""
    if 0 in (nq, nj, na, nb):
        return
    lines = dev.backend == "intel"
    name = "permute_lines" if lines else "permute_tiles"
    k = shared_kernel(dev, "gather", name, _opts(dev, _BITS_TYPE[itemsize]))
    across = nj if lines else -(-nj // PERMUTE_TILE)
    g, loc = _grid(dev, (across, -(-nq // PERMUTE_TILE), na * nb))
    dev.launch(k, g, loc, [out, src, I64(src_off), I64(nq), I64(nj), I64(sj), I64(nb), I64(sa),
                           I64(sb), I64(osa), I64(osb), I64(osq)],
               reads=[src], writes=[out], name=name)


# The fewest elements a permuting copy takes permute_tiles for (below: the compiler's flat copy).
PERMUTE_TILES_MIN = 1 << 12


def permute_plan(shape: tuple[int, ...], strides: tuple[int, ...]
                 ) -> tuple[int, int, int, int, int, int, int, int, int, int] | None:
    """``permute_tiles``' (nq, osq, nj, sj, na, sa, osa, nb, sb, osb) for a contiguous copy of the
    view (``shape``, ``strides``), or None where it does not fit: the view must be a permutation
    of a dense block (positive strides) whose unit-stride axis is not the last one, in at most
    four axes once axes that stay together are merged, each of the two moved axes at least half
    a tile long, of PERMUTE_TILES_MIN elements or more."""
    if math.prod(shape) < PERMUTE_TILES_MIN:
        return None
    dims = [(n, s) for n, s in zip(shape, strides, strict=True) if n != 1]
    if any(s <= 0 for _, s in dims):
        return None
    merged: list[tuple[int, int]] = []
    for n, s in dims:
        if merged and merged[-1][1] == s * n:
            merged[-1] = (merged[-1][0] * n, s)
        else:
            merged.append((n, s))
    if len(merged) < 2 or len(merged) > 4 or merged[-1][1] == 1:
        return None
    dense = 1
    for n, s in sorted(merged, key=lambda d: d[1]):
        if s != dense:
            return None
        dense *= n
    out_strides = []
    acc = 1
    for n, _ in reversed(merged):
        out_strides.append(acc)
        acc *= n
    out_strides.reverse()
    q = next(i for i, (_, s) in enumerate(merged) if s == 1)
    nj, sj = merged[-1]
    nq = merged[q][0]
    if min(nq, nj) < PERMUTE_TILE // 2:
        return None
    rest = [(merged[i][0], merged[i][1], out_strides[i]) for i in range(len(merged) - 1)
            if i != q]
    rest = [(1, 0, 0)] * (2 - len(rest)) + rest
    (na, sa, osa), (nb, sb, osb) = rest
    return nq, out_strides[q], nj, sj, na, sa, osa, nb, sb, osb
