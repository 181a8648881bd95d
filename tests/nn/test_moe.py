"""The device kernels of a mixture-of-experts FFN block (``kernels/moe.py`` and the grouped
products of ``kernels/matmul.py``, ``experts=``) against numpy: the routing (top-k with exact
ties, both weight modes), the grouping of (row, slot) pairs by expert into padded tiles, the
per-expert strides of every weight format and layout, the whole block (router, route, align,
gather, gate and up, GLU, down, combine onto the residual) for every format, row counts and
expert counts, on the device's layout, the row-major kernels and the GPU geometry forced on
the device; and each row's output the same bits alone as inside a batch."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from clops.kernels import activation, launch, matmul, moe, native_cpu
from clops.nn import quant
from clops.nn.quant import DeviceWeight, concat, interleave_rows, pack_float, pack_ggml

from .test_functional import _random_k_quant
from .test_gguf_types import blocks as gguf_blocks

RNG = np.random.default_rng(2026)
DIM, F = 64, 32
# a device format, the file type it is made from
FORMATS = {"f32": "f32", "f16": "f16", "bf16": "bf16", "q4": "Q4_1", "q4sym": "Q4_0",
           "q8": "Q8_0", "q8m": "Q5_1"}


@pytest.fixture(params=["device", "rows", pytest.param("gpu", marks=pytest.mark.standin)])
def path(request, monkeypatch):
    """The device's own layout and kernels; row-major weights (matmul.cl's CPU loop on a CPU);
    the GPU geometry (teams of work-items per column, chunked loads) forced on the device."""
    if request.param == "gpu":
        monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    if request.param in ("rows", "gpu"):
        monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    return request.param


def _packed(kind: str, n: int, k: int):
    """A packed weight [n, k] made from the file type ``kind`` and its float64 values."""
    w = RNG.standard_normal((n, k)).astype(np.float32)
    if kind in ("f32", "f16", "bf16"):
        p = pack_float(w, kind)
        return p, p.dequantize().astype(np.float64)
    t = Q[kind]
    raw = quants.quantize(w, t)
    return pack_ggml(raw, int(t), n, k), quants.dequantize(raw, t).reshape(n, k).astype(
        np.float64)


def _up(dev, a):
    a = np.ascontiguousarray(a)
    buf = dev.alloc(max(a.nbytes, 4))
    dev.write(buf, a, blocking=True)
    return buf


def _read(dev, buf, shape, dtype=np.float32):
    out = np.empty(shape, dtype)
    dev.read(out, buf)
    return out


# -- the per-expert strides -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "Q4_0", "Q4_1", "Q4_K", "Q8_0", "Q6_K",
                                  "Q5_1", "Q2_K", "Q5_K"])
@pytest.mark.parametrize("layout", ["rows", "rb16"])
def test_each_experts_weights_start_a_whole_stride_apart(device, kind, layout, n_experts=3):
    """Expert e's values and scales start at e / E of the stacked weight's buffers, in every
    format (q4 with Q4_SYM, q8 per 16, q8m included) and both layouts: the strides
    ``expert_strides`` passes the kernels."""
    k = 512  # (two K-quant super-blocks a row: room for gguf_blocks' special scales)
    parts = []
    for _ in range(n_experts):
        if kind in ("Q4_K", "Q6_K", "Q2_K", "Q5_K"):
            t = Q[kind]
            raw = _random_k_quant(t, 16, k) if kind in ("Q4_K", "Q6_K") else \
                gguf_blocks(kind, 16, k)
            parts.append(pack_ggml(raw, int(t), 16, k))
        else:
            parts.append(_packed(kind, 16, k)[0])
    if layout == "rb16":  # (the CPU layout's forms of the compact K-quants)
        parts = [p.expanded() for p in parts]
    stacked = concat(parts)
    assert stacked is not None
    w = DeviceWeight(device, stacked, layout=layout)
    assert w.q4_sym == (kind == "Q4_0")  # (Q4_0's mins left out in both layouts)
    ws, ss = matmul.expert_strides(w, n_experts)
    data_item = {"f32": 4, "f16": 2, "bf16": 2}.get(stacked.fmt, 1)
    assert ws * n_experts * data_item == w.data.nbytes
    if stacked.scales is not None:
        assert ss * n_experts * (2 if w.scale_half else 4) == w.scales.nbytes
    else:
        assert ss == 0
    # the experts' own arrays, at those strides
    if layout == "rb16":
        whole = interleave_rows(stacked, w.q4_sym)
        own = [interleave_rows(p, w.q4_sym) for p in parts]
    else:
        def rows(p):  # (the row layout's arrays: the scales alone where Q4_SYM)
            return p.data, (p.scales[..., 0] if w.q4_sym else p.scales)

        whole, own = rows(stacked), [rows(p) for p in parts]
    for e in range(n_experts):
        np.testing.assert_array_equal(whole[0].reshape(-1)[e * ws:(e + 1) * ws],
                                      own[e][0].reshape(-1))
        if stacked.scales is not None:
            np.testing.assert_array_equal(whole[1].reshape(-1)[e * ss:(e + 1) * ss],
                                          own[e][1].reshape(-1))


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("route", ["rows", pytest.param("float-gpu", marks=pytest.mark.standin),
                                   pytest.param("int8-gpu", marks=pytest.mark.standin),
                                   pytest.param("int8-rows", marks=pytest.mark.standin)])
def test_compact_k_quant_experts(device, monkeypatch, kind, route, n_e=4, n=32, k=256):
    """Experts in the compact K-quants of the row layout (k4, k5, k6): each row tile meets its
    own expert's rows, whole rows apart (their scales inside), on the row-major kernels, the
    GPU geometry's float and int8 decode paths (a lone row's slots) and the batch's int8
    rows."""
    from .test_functional import q8_1_activations

    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    if route != "rows":
        monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr(matmul, "int8_activations", lambda dev, m, fmt, k: route == "int8-gpu"
                        and m == 1 and fmt in matmul.INT8_FORMATS)
    t = Q[kind]
    parts = [pack_ggml(_random_k_quant(t, n, k), int(t), n, k) for _ in range(n_e)]
    refs = [p.dequantize().astype(np.float64) for p in parts]
    w = DeviceWeight(device, concat(parts))
    assert w.fmt == parts[0].fmt == {"Q4_K": "k4", "Q5_K": "k5", "Q6_K": "k6"}[kind]
    ws, ss = matmul.expert_strides(w, n_e)
    assert ss == 0 and ws * n_e == w.data.nbytes
    tm = matmul.qrows_tile(device, w) if route == "int8-rows" else 1
    tiles = [3, 0, 2, 3, 1]
    m = tm * len(tiles)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    tile_e = _up(device, np.array(tiles, np.int32))
    y = device.alloc(m * n * 4)
    if route == "int8-rows":
        monkeypatch.setattr(matmul, "int8_batch", lambda dev, w: True)
        lns = matmul.matmul_qrows(device, y, 0, n, _up(device, x), 0, k, w, m,
                                  matmul.qrows_scratch(device, m, k), experts=(tile_e, n_e))
    else:
        lns = [matmul.matmul(device, y, 0, n, _up(device, x), 0, k, w, m, tm=1,
                             experts=(tile_e, n_e), row_invariant=route != "int8-gpu")]
    for ln in lns:
        ln.run(device)
    got = _read(device, y, (m, n))
    int8 = route.startswith("int8")
    for r in range(m):
        ref = refs[tiles[r // tm]]
        want = (q8_1_activations(x[r:r + 1]) if int8 else x[r:r + 1].astype(np.float64)) @ ref.T
        np.testing.assert_allclose(got[r:r + 1], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_experts_of_rows_not_in_blocks_of_16_are_refused(device):
    w = DeviceWeight(device, _packed("f32", 3 * 24, 32)[0])
    with pytest.raises(ValueError, match="multiple of 16"):
        matmul.expert_strides(w, 3)


# -- route ------------------------------------------------------------------------------------
def _top_k(logits: np.ndarray, k: int, norm: bool) -> tuple[np.ndarray, np.ndarray]:
    """numpy's choice: descending logits, an exact tie to the lower expert; the weights in
    float64."""
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k].astype(np.int32)
    lg = logits.astype(np.float64)
    mx = lg.max(axis=1, keepdims=True)
    chosen = np.take_along_axis(lg, ids, axis=1)
    den = np.exp(chosen - mx).sum(1, keepdims=True) if norm else np.exp(lg - mx).sum(
        1, keepdims=True)
    return ids, np.exp(chosen - mx) / den


@pytest.fixture(params=["device", pytest.param("gpu", marks=pytest.mark.standin)])
def route_path(request, monkeypatch):
    """The device's own route kernel, or the GPUs' (a work-group a row) forced on it."""
    if request.param == "gpu":
        monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    return request.param


def _route(dev, logits, k, norm):
    m, e = logits.shape
    ids, wts = dev.alloc(m * k * 4), dev.alloc(m * k * 4)
    moe.route(dev, ids, wts, _up(dev, logits), m=m, n_experts=e, k=k, norm=norm).run(dev)
    return _read(dev, ids, (m, k), np.int32), _read(dev, wts, (m, k))


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("n_experts,k", [(4, 1), (8, 2), (64, 8), (512, 16), (16, 16)])
def test_route_picks_the_top_k_ties_to_the_lower_expert(device, route_path, n_experts, k, norm,
                                                        m=41):
    # few distinct values: many exact ties, across the k-th place too; a row of one value; a
    # row with -inf logits
    logits = RNG.integers(-3, 3, (m, n_experts)).astype(np.float32) * 0.5
    logits[1] = 1.25
    logits[2, ::2] = -np.inf
    got_ids, got_w = _route(device, logits, k, norm)
    want_ids, want_w = _top_k(logits, k, norm)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_allclose(got_w, want_w, rtol=2e-6, atol=1e-7)
    assert got_ids[1].tolist() == list(range(k))  # all tied: the first k experts, in order
    if k < n_experts and norm:
        np.testing.assert_allclose(got_w.sum(1), 1.0, rtol=1e-6)
    if k < n_experts and not norm:
        assert (got_w.sum(1) < 1.0 + 1e-6).all() and (got_w.sum(1)[3:] < 1.0 - 1e-6).any()


def test_route_weights_of_distinct_logits(device, route_path, m=9, n_experts=32, k=4):
    logits = (RNG.standard_normal((m, n_experts)) * 4).astype(np.float32)
    for norm in (True, False):
        got_ids, got_w = _route(device, logits, k, norm)
        want_ids, want_w = _top_k(logits, k, norm)
        np.testing.assert_array_equal(got_ids, want_ids)
        np.testing.assert_allclose(got_w, want_w, rtol=2e-6, atol=1e-8)
        # the two modes differ: renormalized over k, or over all E
        assert not np.allclose(_route(device, logits, k, not norm)[1], got_w)


# -- align ------------------------------------------------------------------------------------
def _align(dev, ids, m, k, n_experts, tile):
    p = moe.padded_rows(m, k, n_experts, tile)
    order, tile_e, pos = dev.alloc(p * 4), dev.alloc(p // tile * 4), dev.alloc(m * k * 4)
    # (stale values where the kernel writes nothing would show)
    dev.write(order, np.full(p, 12345, np.int32), blocking=True)
    dev.write(tile_e, np.full(p // tile, 12345, np.int32), blocking=True)
    moe.align(dev, order, tile_e, pos, _up(dev, ids.astype(np.int32)), m=m, k=k,
              n_experts=n_experts, tile=tile, p=p).run(dev)
    return (p, _read(dev, order, p, np.int32), _read(dev, tile_e, p // tile, np.int32),
            _read(dev, pos, m * k, np.int32))


def check_alignment(ids, order, tile_e, pos, n_experts, tile):
    """The grouping and padding rules: every pair once; its slot in pos; experts ascending,
    pairs of an expert ascending, each group starting a tile and padded to whole tiles with
    -1; each tile's expert; -1 past the last group."""
    flat = ids.reshape(-1)
    v = order[order >= 0]
    assert sorted(v.tolist()) == list(range(flat.size))  # a permutation of the pairs
    np.testing.assert_array_equal(order[pos], np.arange(flat.size))
    s = 0
    for e in range(n_experts):
        mine = np.nonzero(flat == e)[0]
        if mine.size == 0:
            continue
        span = -(-mine.size // tile) * tile
        np.testing.assert_array_equal(order[s:s + mine.size], mine)  # ascending v
        assert (order[s + mine.size:s + span] == -1).all()
        assert (tile_e[s // tile:(s + span) // tile] == e).all()
        s += span
    assert (order[s:] == -1).all() and (tile_e[s // tile:] == -1).all()


@pytest.mark.parametrize("m,k,n_experts,tile", [(1, 1, 4, 1), (1, 4, 16, 1), (3, 2, 4, 2),
                                                (37, 4, 16, 8), (37, 2, 16, 4),
                                                (2048, 4, 512, 8), (1000, 8, 64, 4),
                                                (300, 1, 8, 8)])
@pytest.mark.parametrize("gpu", [False, pytest.param(True, marks=pytest.mark.standin)])
def test_align_groups_pairs_by_expert_into_whole_tiles(device, monkeypatch, m, k, n_experts,
                                                       tile, gpu):
    if gpu:  # (the GPUs' work-groups of 256: fewer pairs a work-item than work-items)
        monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    # distinct experts per row (as route gives), some experts never chosen
    used = max(k, n_experts * 3 // 4)
    ids = np.stack([RNG.permutation(used)[:k] for _ in range(m)])
    p, order, tile_e, pos = _align(device, ids, m, k, n_experts, tile)
    check_alignment(ids, order, tile_e, pos, n_experts, tile)
    assert p >= (order >= 0).sum() and p % tile == 0


def test_align_pads_each_expert_and_the_bound_is_reached(device):
    # every pair a different expert: each group one pair and tile - 1 padding; P is exact
    m, k, n_experts, tile = 4, 2, 8, 4
    ids = np.arange(8).reshape(m, k)[::-1]
    p, order, tile_e, pos = _align(device, ids, m, k, n_experts, tile)
    assert p == 32
    check_alignment(ids, order, tile_e, pos, n_experts, tile)
    np.testing.assert_array_equal(tile_e, np.arange(8))
    # a checker that can fail: another order of the pairs is caught
    with pytest.raises(AssertionError):
        check_alignment(ids[::-1], order, tile_e, pos, n_experts, tile)


def test_padded_rows_is_an_upper_bound():
    for m in (1, 3, 37, 100):
        for k in (1, 2, 4):
            for n_experts in (4, 16):
                for tile in (1, 2, 4, 8):
                    p = moe.padded_rows(m, k, n_experts, tile)
                    assert p % tile == 0
                    for _ in range(5):
                        c = np.bincount(RNG.integers(0, n_experts, m * k),
                                        minlength=n_experts)
                        assert (-(-c // tile) * tile).sum() <= p
    assert moe.padded_rows(1, 1, 4, 1) == 1 and moe.padded_rows(4, 2, 8, 4) == 32


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_gate_and_up_fuse_expert_by_expert(fmt):
    # each expert's gate rows, then its up rows: the values of both, in that order
    E, F_ = 3, 32
    g, gv = _packed(FORMATS[fmt], E * F_, DIM)
    u, uv = _packed(FORMATS[fmt], E * F_, DIM)
    fused = quant.concat_experts(g, u, E)
    assert fused is not None and (fused.fmt, fused.n, fused.k) == (g.fmt, 2 * E * F_, DIM)
    want = np.concatenate([gv.reshape(E, F_, DIM), uv.reshape(E, F_, DIM)], axis=1)
    assert np.array_equal(fused.dequantize().astype(np.float64), want.reshape(-1, DIM))
    other = "f32" if fmt != "f32" else "f16"
    assert quant.concat_experts(g, _packed(FORMATS[other], E * F_, DIM)[0], E) is None


# -- the block --------------------------------------------------------------------------------
class Block:
    """An MoE block's weights: a float32 router [E, dim], and E experts' gate, up [E * F, dim]
    and down [E * dim, F] in one format, on the device and as float64 values."""

    def __init__(self, dev, fmt: str, n_experts: int) -> None:
        kind = FORMATS[fmt]
        self.n_experts = n_experts
        rp, self.router = _packed("f32", n_experts, DIM)
        gp, self.gate = _packed(kind, n_experts * F, DIM)
        upk, self.up = _packed(kind, n_experts * F, DIM)
        dp, self.down = _packed(kind, n_experts * DIM, F)
        self.w = [DeviceWeight(dev, p) for p in (rp, gp, upk, dp)]

    def reference(self, x: np.ndarray, logits: np.ndarray, k: int, norm: bool,
                  residual: np.ndarray) -> np.ndarray:
        """The block's output in float64, routed by the device's logits (float32 values whose
        order decides the experts)."""
        ids, wts = _top_k(logits, k, norm)
        x64 = x.astype(np.float64)
        out = residual.astype(np.float64).copy()
        for r in range(len(x)):
            for j in range(k):
                e = ids[r, j]
                g = self.gate[e * F:(e + 1) * F] @ x64[r]
                u = self.up[e * F:(e + 1) * F] @ x64[r]
                h = g / (1 + np.exp(-g)) * u
                out[r] += wts[r, j] * (self.down[e * DIM:(e + 1) * DIM] @ h)
        return out


def run_block(dev, blk: Block, x: np.ndarray, residual: np.ndarray, *, k: int, norm: bool,
              rows: int | None = None):
    """The launches of the block on m rows, as a plan records them (nothing read back between
    them): the block's output rows, and the logits, ids, order, tile_e and pos. ``rows``: the
    launches made for m rows, then resized to the first ``rows`` (as their docstrings say)
    before they run."""
    m, n_e = len(x), blk.n_experts
    router, gate, up, down = blk.w
    tile = moe.tile_rows(dev, [gate.fmt, up.fmt, down.fmt], m, k)
    p = moe.padded_rows(m, k, n_e, tile)
    xb, out = _up(dev, x), _up(dev, residual)
    logits, ids, wts = dev.alloc(m * n_e * 4), dev.alloc(m * k * 4), dev.alloc(m * k * 4)
    order, tile_e, pos = dev.alloc(p * 4), dev.alloc(p // tile * 4), dev.alloc(m * k * 4)
    xg, gu, h, yd = (dev.alloc(p * DIM * 4), dev.alloc(p * 2 * F * 4), dev.alloc(p * F * 4),
                     dev.alloc(p * DIM * 4))
    ex = (tile_e, n_e)
    launches = [
        matmul.matmul(dev, logits, 0, n_e, xb, 0, DIM, router, m, row_invariant=True,
                      tm=min(ROUTER_TM, launch.pow2_at_most(m))),
        moe.route(dev, ids, wts, logits, m=m, n_experts=n_e, k=k, norm=norm),
        moe.align(dev, order, tile_e, pos, ids, m=m, k=k, n_experts=n_e, tile=tile, p=p),
        moe.gather(dev, xg, xb, order, p=p, k=k, dim=DIM),
        matmul.matmul(dev, gu, 0, 2 * F, xg, 0, DIM, gate, p, experts=ex, tm=tile,
                      row_invariant=True),
        matmul.matmul(dev, gu, F, 2 * F, xg, 0, DIM, up, p, experts=ex, tm=tile,
                      row_invariant=True),
        activation.glu(dev, h, gu, m=p, f=F),
        matmul.matmul(dev, yd, 0, DIM, h, 0, F, down, p, experts=ex, tm=tile,
                      row_invariant=True),
        moe.combine(dev, out, yd, pos, wts, m=m, k=k, dim=DIM, accum=True),
    ]
    if rows is not None:
        assert moe.tile_rows(dev, [gate.fmt, up.fmt, down.fmt], rows, k) == tile
        m, p = rows, moe.padded_rows(rows, k, n_e, tile)
        _resize(dev, launches, m, p, tile, router.layout, k)
    for ln in launches:
        ln.run(dev)
    return (_read(dev, out, (m, DIM)), _read(dev, logits, (m, n_e)),
            _read(dev, ids, (m, k), np.int32), _read(dev, order, p, np.int32),
            _read(dev, tile_e, p // tile, np.int32), _read(dev, pos, m * k, np.int32), tile)


ROUTER_TM = 4  # (the router product's rows a work-item, fewer for fewer rows)


def _resize(dev, launches, m: int, p: int, tile: int, layout: str, k: int) -> None:
    """The block's launches to m rows (p slots), by the argument indices and global sizes
    their functions document (the products: argument 9 and the row tiles' axis)."""
    router, route, align, gather, gate, up, glu, down, combine = launches

    def product(ln, rows, tm):
        ln.args[9] = np.int32(rows)
        size = list(ln.global_size)
        size[0 if layout == "rb16" else 1] = -(-rows // tm)
        ln.global_size = tuple(size)

    product(router, m, ROUTER_TM)  # (made for more than 4 rows)
    route.args[3] = np.int32(m)
    route.global_size = moe.route_geometry(dev, m, k)[0]
    align.args[4], align.args[5] = np.int32(m), np.int32(p)
    gather.args[3] = np.int32(p)
    gather.global_size = (DIM, p)
    for ln in (gate, up, down):
        product(ln, p, tile)
    glu.global_size = (F, p)
    combine.args[4] = np.int32(m)
    combine.global_size = (DIM, m)


def _inputs(m: int):
    return (RNG.standard_normal((m, DIM)).astype(np.float32),
            RNG.standard_normal((m, DIM)).astype(np.float32))


def _check_block(dev, blk, x, res, k, norm):
    got, logits, ids, order, tile_e, pos, tile = run_block(dev, blk, x, res, k=k, norm=norm)
    np.testing.assert_array_equal(ids, _top_k(logits, k, norm)[0])
    check_alignment(ids, order, tile_e, pos, blk.n_experts, tile)
    want = blk.reference(x, logits, k, norm, res)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4 * np.abs(want - res).max())
    return got


# (E, k, norm) cases: every E with every k, both weight modes
CASES = [(4, 1, True), (4, 2, False), (4, 4, True), (16, 1, False), (16, 2, True),
         (16, 4, False)]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 3, 37])
def test_the_block_of_every_format(device, fmt, m):
    for n_e, k, norm in CASES:
        blk = Block(device, fmt, n_e)
        x, res = _inputs(m)
        _check_block(device, blk, x, res, k, norm)


@pytest.mark.parametrize("fmt", ["f16", "q4sym", "q8m"])
@pytest.mark.parametrize("m", [1, 37])
@pytest.mark.parametrize("path", ["rows", pytest.param("gpu", marks=pytest.mark.standin)],
                         indirect=True)
def test_the_block_on_row_major_and_gpu_kernels(device, path, fmt, m):
    blk = Block(device, fmt, 16)
    assert all(w.layout == "rows" for w in blk.w)
    x, res = _inputs(m)
    for k, norm in ((1, True), (4, False)):
        _check_block(device, blk, x, res, k, norm)


@pytest.mark.parametrize("fmt", ["f32", "bf16", "q4", "q8"])
def test_a_rows_output_is_the_same_alone_and_in_a_batch(device, path, fmt, m=37, k=2):
    """Each row's block output, alone (tiles of one row) and among 37 (tiles of several
    rows, its expert groups beside other rows'): the same bits."""
    blk = Block(device, fmt, 16)
    x, res = _inputs(m)
    batch = _check_block(device, blk, x, res, k, True)
    assert run_block(device, blk, x, res, k=k, norm=True)[-1] > 1  # tiles of several rows
    for r in range(m):
        alone = run_block(device, blk, x[r:r + 1], res[r:r + 1], k=k, norm=True)[0]
        np.testing.assert_array_equal(alone[0], batch[r])


def test_a_wrong_expert_stride_is_seen(device, monkeypatch):
    """The strides matter: every expert read at expert 0's weights (or half a stride off)
    gives another block."""
    blk = Block(device, "q4", 4)
    x, res = _inputs(5)
    _check_block(device, blk, x, res, 2, True)
    real = matmul.expert_strides
    for wrong in (lambda w, e: (0, 0), lambda w, e: (real(w, e)[0] // 2, real(w, e)[1])):
        monkeypatch.setattr(matmul, "expert_strides", wrong)
        with pytest.raises(AssertionError):
            _check_block(device, blk, x, res, 2, True)


def test_grouped_products_refuse_what_they_do_not_take(device, monkeypatch):
    blk = Block(device, "q8", 4)
    _, gate, _, _ = blk.w
    y, x, tile_e = device.alloc(8 * 2 * F * 4), _up(device, np.ones((8, DIM), np.float32)), \
        _up(device, np.zeros(2, np.int32))
    ex = (tile_e, 4)
    # (norm= and glu= where the weights are in the GPUs' row layout: the test below)
    for kw in ({"glu_out": True},) + (({"norm": (x, 1e-5)}, {"glu": True})
                                      if gate.layout == "rb16" else ()):
        with pytest.raises(ValueError, match="experts|glu"):
            matmul.matmul(device, y, 0, F, x, 0, DIM, gate, 8, experts=ex, tm=4, **kw)
    for tm in (None, 3):
        with pytest.raises(ValueError, match="tm="):
            matmul.matmul(device, y, 0, F, x, 0, DIM, gate, 8, experts=ex, tm=tm)
    # never the native CPU products, nor for sums that are row-invariant the int8 rows of the
    # GPU decode path (test_a_lone_rows_slots_take_the_int8_decode_path)
    monkeypatch.setattr(native_cpu, "takes", lambda dev, w: True)
    monkeypatch.setattr(matmul, "int8_activations", lambda dev, m, fmt, k: True)

    def refused(*a, **kw):
        raise AssertionError("an experts product took the native kernels")

    monkeypatch.setattr(native_cpu, "matmul", refused)
    x1 = RNG.standard_normal((1, DIM)).astype(np.float32)
    one = _up(device, np.array([3], np.int32))
    y1 = device.alloc(F * 4)
    matmul.matmul(device, y1, 0, F, _up(device, x1), 0, DIM, gate, 1, experts=(one, 4),
                  tm=1, row_invariant=True).run(device)
    np.testing.assert_allclose(_read(device, y1, F), blk.gate[3 * F:4 * F] @ x1[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["f16", "q4sym", "q8"])
@pytest.mark.parametrize("tm", [1, 4])
def test_grouped_products_take_the_norm_and_the_glu_on_gpu_kernels(device, monkeypatch, fmt,
                                                                    tm, m=8):
    """In the GPUs' row layout (forced here) the grouped products fold in the pre-norm
    (``norm=``: RMSNorm(x) * weight) and the GLU (``glu=``: silu(gate) * up of [gate | up]
    rows), each tile against its expert, as a lone decode row's experts take them."""
    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    blk = Block(device, fmt, 4)
    _, gate, _, down = blk.w
    tiles = np.array([3, 1, 0, 3, 2, 1, 0, 2][:m // tm], np.int32)
    each = np.repeat(tiles, tm)
    ex = (_up(device, tiles), 4)
    x = RNG.standard_normal((m, DIM)).astype(np.float32)
    nw, eps = RNG.standard_normal(DIM).astype(np.float32), 1e-5
    y = device.alloc(m * F * 4)
    matmul.matmul(device, y, 0, F, _up(device, x), 0, DIM, gate, m, experts=ex, tm=tm,
                  row_invariant=True, norm=(_up(device, nw), eps)).run(device)
    x64 = x.astype(np.float64)
    xn = x64 / np.sqrt((x64 ** 2).mean(1, keepdims=True) + eps) * nw
    want = np.stack([blk.gate[e * F:(e + 1) * F] @ xn[r] for r, e in enumerate(each)])
    np.testing.assert_allclose(_read(device, y, (m, F)), want, rtol=1e-4,
                               atol=1e-4 * np.abs(want).max())
    gu = RNG.standard_normal((m, 2 * F)).astype(np.float32)
    y2 = device.alloc(m * DIM * 4)
    matmul.matmul(device, y2, 0, DIM, _up(device, gu), 0, 2 * F, down, m, experts=ex, tm=tm,
                  row_invariant=True, glu=True).run(device)
    g, u = gu[:, :F].astype(np.float64), gu[:, F:].astype(np.float64)
    h = g / (1 + np.exp(-g)) * u
    want = np.stack([blk.down[e * DIM:(e + 1) * DIM] @ h[r] for r, e in enumerate(each)])
    np.testing.assert_allclose(_read(device, y2, (m, DIM)), want, rtol=1e-4,
                               atol=1e-4 * np.abs(want).max())



@pytest.mark.parametrize("fmt", ["q8", "q4sym"])
def test_a_lone_rows_slots_take_the_int8_decode_path(device, monkeypatch, fmt, k=4):
    """A lone decode row's k slots (tiles of one row, each its expert; sums that need not be
    row-invariant) take the GPU decode path's int8 rows (matmul.cl QX, forced here with its
    plain-C dot products) at the geometry of one expert's columns: the [gate | up] products
    reading the row itself (ldx 0) with the pre-norm folded in, the down products reading each
    slot's own [gate | up] row with the GLU folded in; within the int8 rows' error of the
    float64 products, each slot against its own expert."""
    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    monkeypatch.setattr(matmul, "int8_activations",
                        lambda dev, m, fmt, kk: m == 1 and fmt in ("q4", "q8"))
    seen: list[int] = []
    geometry = matmul.qx_geometry

    def spy(dev, n, kk, f):
        seen.append(n)
        return geometry(dev, n, kk, f)

    monkeypatch.setattr(matmul, "qx_geometry", spy)
    blk = Block(device, fmt, 4)
    _, gate, _, down = blk.w
    ids = np.array([3, 1, 0, 3], np.int32)[:k]
    slots = (_up(device, ids), 4)
    x = RNG.standard_normal(DIM).astype(np.float32)
    nw, eps = RNG.standard_normal(DIM).astype(np.float32), 1e-5
    y = device.alloc(k * F * 4)
    matmul.matmul(device, y, 0, F, _up(device, x[None]), 0, 0, gate, k, experts=slots, tm=1,
                  norm=(_up(device, nw), eps)).run(device)
    assert seen == [F]
    x64 = x.astype(np.float64)
    xn = x64 / np.sqrt((x64 ** 2).mean() + eps) * nw
    want = np.stack([blk.gate[e * F:(e + 1) * F] @ xn for e in ids])
    got = _read(device, y, (k, F))
    for r in range(k):  # (each slot within the int8 rows' error of its own expert's product)
        assert np.linalg.norm(got[r] - want[r]) / np.linalg.norm(want[r]) < 3e-2, r
    gu = RNG.standard_normal((k, 2 * F)).astype(np.float32)
    y2 = device.alloc(k * DIM * 4)
    matmul.matmul(device, y2, 0, DIM, _up(device, gu), 0, 2 * F, down, k, experts=slots,
                  tm=1, glu=True).run(device)
    assert seen == [F, DIM]
    g, u = gu[:, :F].astype(np.float64), gu[:, F:].astype(np.float64)
    h = g / (1 + np.exp(-g)) * u
    want = np.stack([blk.down[e * DIM:(e + 1) * DIM] @ h[r] for r, e in enumerate(ids)])
    got = _read(device, y2, (k, DIM))
    for r in range(k):
        assert np.linalg.norm(got[r] - want[r]) / np.linalg.norm(want[r]) < 3e-2, r
    # the weighted sum of the slots' rows (moe.combine's) by the last work-group of each column
    # block, into out (added, or written), the counters left zero for the next launch
    wts = RNG.random(k).astype(np.float32)
    res = RNG.standard_normal(DIM).astype(np.float32)
    count = _up(device, np.zeros(DIM, np.int32))
    for accum in (True, False, True):
        out, y3 = _up(device, res), device.alloc(k * DIM * 4)
        matmul.matmul(device, y3, 0, DIM, _up(device, gu), 0, 2 * F, down, k, experts=slots,
                      tm=1, glu=True, slot_sum=(out, _up(device, wts), count, accum)
                      ).run(device)
        rows = _read(device, y3, (k, DIM))
        np.testing.assert_array_equal(rows, got)  # (the slots' rows as without the sum)
        total = sum(wts[j] * rows[j].astype(np.float64) for j in range(k))
        np.testing.assert_allclose(_read(device, out, DIM), total + res if accum else total,
                                   rtol=1e-5, atol=1e-5 * np.abs(total).max())
        assert not _read(device, count, DIM, np.int32).any()
    with pytest.raises(ValueError, match="slot_sum"):  # (only on the int8 decode path)
        matmul.matmul(device, y3, 0, DIM, _up(device, gu), 0, 2 * F, down, k, experts=slots,
                      tm=1, glu=True, row_invariant=True,
                      slot_sum=(out, _up(device, wts), count, True))


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
@pytest.mark.parametrize("k_len, n", [(2048, 48), (256, 80)])
def test_a_lone_rows_slots_at_the_slot_geometry(device, monkeypatch, kind, k_len, n, k=3,
                                                n_e=4):
    """The int8 decode path's geometry for a lone row's slots (``matmul.qx_slot_geometry``):
    experts' rows of 2048 values take two columns a team of 16, shorter rows 64 teams of 8;
    columns ragged against a work-group's (48 of 32, 80 of 64). Each slot's product is its own
    expert's, and nothing is written past the last slot's row."""
    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    monkeypatch.setattr(matmul, "int8_activations",
                        lambda dev, m, fmt, kk: m == 1 and fmt in ("q4", "q8"))
    want_g = (16, 16, 2) if k_len >= 2048 else (8, 64, 1)
    fmt = "q4" if kind == "Q4_0" else "q8"
    assert matmul.qx_slot_geometry(device, n, k_len, fmt)[:3] == want_g
    p, ref = _packed(kind, n_e * n, k_len)
    w = DeviceWeight(device, p)
    ids = np.array([2, 0, 3], np.int32)
    x = RNG.standard_normal(k_len).astype(np.float32)
    y = _up(device, np.full((k + 1, n), 7.5, np.float32))
    matmul.matmul(device, y, 0, n, _up(device, x[None]), 0, 0, w, k,
                  experts=(_up(device, ids), n_e), tm=1).run(device)
    got = _read(device, y, (k + 1, n))
    for r, e in enumerate(ids):
        want = ref[e * n:(e + 1) * n] @ x.astype(np.float64)
        assert np.linalg.norm(got[r] - want) / np.linalg.norm(want) < 3e-2, r
    assert (got[k] == 7.5).all()


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("case", ["ties", "distinct", "minus_inf"])
def test_a_lone_rows_slots_route_themselves(device, monkeypatch, norm, case, k=3, n_e=8):
    """On the int8 decode path a lone row's [gate | up] work-groups may pick their slots'
    experts from the router's scores themselves (``route=``): the experts and weights
    ``moe.route`` gives (ties at the k-th place to the lower expert; -inf scores), written for
    the launches after it, and each slot's product that of its expert."""
    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    monkeypatch.setattr(matmul, "int8_activations",
                        lambda dev, m, fmt, kk: m == 1 and fmt in ("q4", "q8"))
    blk = Block(device, "q8", n_e)
    _, gate, _, _ = blk.w
    logits = {"ties": np.array([0.5, 1.0, -1.0, 1.0, 0.5, 0.5, 1.0, 0.0]),
              "distinct": RNG.standard_normal(n_e) * 3,
              "minus_inf": np.array([-np.inf, 0.25, -np.inf, -1.0, 2.0, -np.inf, 0.25, -3.0])
              }[case].astype(np.float32)
    want_ids, want_w = _top_k(logits[None], k, norm)
    x = _up(device, RNG.standard_normal((1, DIM)).astype(np.float32))
    tile, wts = _up(device, np.full(k, -7, np.int32)), device.alloc(k * 4)
    y = device.alloc(k * F * 4)
    matmul.matmul(device, y, 0, F, x, 0, 0, gate, k, experts=(tile, n_e), tm=1,
                  route=(_up(device, logits), wts, norm)).run(device)
    np.testing.assert_array_equal(_read(device, tile, k, np.int32), want_ids[0])
    np.testing.assert_allclose(_read(device, wts, k), want_w[0], rtol=2e-6, atol=1e-7)
    given = device.alloc(k * F * 4)
    matmul.matmul(device, given, 0, F, x, 0, 0, gate, k, experts=(_up(device, want_ids[0]),
                                                                 n_e), tm=1).run(device)
    np.testing.assert_array_equal(_read(device, y, (k, F)), _read(device, given, (k, F)))


def test_padding_tiles_store_nothing(device, path):
    """A tile of expert -1 leaves its rows of y as they were; bias is per expert."""
    n_e = 4
    p, ref = _packed("Q8_0", n_e * F, DIM)
    w = DeviceWeight(device, p)
    tile = 2
    x = RNG.standard_normal((6, DIM)).astype(np.float32)
    bias = RNG.standard_normal(n_e * F).astype(np.float32)
    y0 = np.full((6, F), 7.0, np.float32)
    y = _up(device, y0)
    experts = np.array([2, -1, 0], np.int32)
    matmul.matmul(device, y, 0, F, _up(device, x), 0, DIM, w, 6, bias=_up(device, bias),
                  experts=(_up(device, experts), n_e), tm=tile).run(device)
    got = _read(device, y, (6, F))
    for t, e in enumerate(experts):
        rows = slice(t * tile, (t + 1) * tile)
        if e < 0:
            np.testing.assert_array_equal(got[rows], y0[rows])
        else:
            want = x[rows] @ ref[e * F:(e + 1) * F].T + bias[e * F:(e + 1) * F]
            np.testing.assert_allclose(got[rows], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["f16", "q4"])
def test_the_launches_resize_to_fewer_rows(device, path, fmt, k=2):
    """Launches made for 37 rows, resized to 20 by their row arguments and global sizes, give
    what launches made for 20 rows give, bit for bit."""
    blk = Block(device, fmt, 16)
    x, res = _inputs(37)
    want = run_block(device, blk, x[:20], res[:20], k=k, norm=False)[0]
    got = run_block(device, blk, x, res, k=k, norm=False, rows=20)
    np.testing.assert_array_equal(got[0], want)
    # (align saw 20 rows' pairs: an m left at 37 would have filled more slots)
    check_alignment(got[2], got[3], got[4], got[5], 16, got[6])


@pytest.mark.parametrize("fmt", ["q4", "q8", "q4sym"])
def test_the_block_through_int8_rows(device, monkeypatch, fmt, k=2, n_e=8):
    """``llm.experts.ffn`` where the experts' products take the int8 rows (NVIDIA GPUs; forced
    here on row-major weights): tiles of their TM, two launches a product, the block within the
    int8 rows' error of numpy's; launches made for 37 rows resized to 20 give the bits of
    launches made for 20; and rows among fewer others give the same bits."""
    from types import SimpleNamespace

    from clops.llm import experts
    from clops.llm.loaded import Experts

    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    monkeypatch.setattr(matmul, "int8_batch", lambda dev, w: w.fmt in ("q4", "q8")
                        and w.layout == "rows" and not w.defines.get("QMIN"))
    blk = Block(device, fmt, n_e)
    router, gate, up, down = blk.w
    ex = Experts(router, gate, up, down, n=n_e, k=k, ffn=F, norm=True)
    cfg = SimpleNamespace(dim=DIM, act="silu", glu_limit=0.0, glu_alpha=1.0, n_experts=n_e,
                          n_experts_used=k, expert_ffn_dim=F)
    assert experts.int8_rows(device, [ex])
    bufs = experts.buffers(device, cfg, [ex], 37)
    assert bufs.xq is not None

    def run(x, res, logits, made_for=None):
        m = len(x)
        t = experts.tile(device, [ex], made_for or m)
        xb, out = _up(device, x), _up(device, res)
        device.write(bufs.logits, np.ascontiguousarray(logits), blocking=True)
        pairs = experts.ffn(device, cfg, ex, xb, made_for or m, bufs, out, t, accum=True,
                            name="0")
        names = [ln.kernel.function_name for ln, _ in pairs]
        for ln, at in pairs:
            if made_for is not None:
                args, ln.global_size = at(m)
                for i, a in args:
                    ln.args[i] = a
            ln.run(device)
        return _read(device, out, (m, DIM)), names, t

    x, res = _inputs(37)
    logits = RNG.standard_normal((37, n_e)).astype(np.float32)
    got, names, t = run(x, res, logits)
    assert t == matmul.qrows_tile(device, gate) and names.count("quantize_rows") == 3
    want = blk.reference(x, logits, k, True, res)
    err = np.linalg.norm((got - res) - (want - res)) / np.linalg.norm(want - res)
    assert err < 3e-2, err
    resized = run(x[:20], res[:20], logits[:20], made_for=37)[0]
    np.testing.assert_array_equal(resized, run(x[:20], res[:20], logits[:20])[0])
    # a row among others and among fewer: the same bits
    np.testing.assert_array_equal(run(x[5:9], res[5:9], logits[5:9])[0], got[5:9])


def test_the_block_refuses_rows_past_its_buffers(device):
    """``llm.experts.ffn`` for more rows (or larger tiles) than its buffers were sized for is
    refused with the counts, not run past their ends."""
    from types import SimpleNamespace

    from clops.llm import experts
    from clops.llm.loaded import Experts

    blk = Block(device, "q8", 8)
    ex = Experts(*blk.w, n=8, k=2, ffn=F, norm=True)
    cfg = SimpleNamespace(dim=DIM, act="silu", glu_limit=0.0, glu_alpha=1.0, n_experts=8,
                          n_experts_used=2, expert_ffn_dim=F)
    bufs = experts.buffers(device, cfg, [ex], 5)
    x, res = _inputs(37)
    with pytest.raises(ValueError, match="more than the buffers hold"):
        experts.ffn(device, cfg, ex, _up(device, x), 37, bufs, _up(device, res),
                    experts.tile(device, [ex], 37), accum=True, name="0")
