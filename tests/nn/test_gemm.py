"""The hand-written GEMMs: gemm.cl's portable kernel on every device, for float32 and float16,
plain and batched, and its tensor-core kernels where NVIDIA PTX runs; gemm_any.cl (any shape and
strides, K in slices) on every device; gemm_cpu.cl (CPUs) on the
device as it is; all against numpy; and clops.matmul's choice of them."""

from __future__ import annotations

import numpy as np
import pytest

import clops
from clops.kernels import gemm, native_cpu

RNG = np.random.default_rng(1)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("batch", [1, 2])
def test_gemm_portable(device, dtype, batch):
    m, n, k = 256, 128, 64
    a = RNG.standard_normal((batch, m, k)).astype(dtype)
    b = RNG.standard_normal((batch, k, n)).astype(dtype)
    ta = clops.asarray(a, device=device).realize()
    tb = clops.asarray(b, device=device).realize()
    tc = clops.empty((batch, m, n), dtype=getattr(clops, dtype), device=device)
    assert gemm.supports(device, dtype, m, n, k, (ta.offset, tb.offset), (), force=True)
    gemm.gemm(device, tc.buffer, tc.offset, n, ta.buffer, ta.offset, k, tb.buffer, tb.offset, n,
              m, n, k, dtype, batch, (m * n, m * k, k * n), portable=True)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = np.asarray(tc).astype(np.float64)
    tol = 1e-5 if dtype == "float32" else 2e-3
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < tol


def test_gemm_tensor_cores(device):
    # the inline-PTX mma.sync kernel, where the device has it (NVIDIA), through clops.matmul
    if not gemm.use_mma(device, "float16"):
        pytest.skip("no NVIDIA inline PTX on this device")
    m, n, k = 512, 256, 1024
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((k, n)).astype(np.float16)
    assert gemm.supports(device, "float16", m, n, k, (0, 0), ())
    got = np.asarray(clops.matmul(clops.asarray(a, device=device),
                                  clops.asarray(b, device=device))).astype(np.float64)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3


@pytest.mark.parametrize("m,n,k,batch", [(256, 384, 96, 2), (384, 256, 32, 1),
                                         (256, 512, 1024, 1), (384, 768, 192, 2)])
@pytest.mark.parametrize("variant", ["auto", "sync", "wide", "tall", "wgmma", "wgmma_wide",
                                     "wgmma_ws", "wgmma_tma", "wgmma_persist",
                                     "wgmma_tma_one_tile", "wgmma_tma_persist"])
def test_gemm_tensor_core_shapes(device, m, n, k, batch, variant):
    # the tensor-core kernels, batched, K of 1 to 32 tiles, tile shapes that divide or not;
    # gemm_wgmma (Hopper) with each of its configs, and producer warps of another count, hand-
    # over lead and wgmma batches in flight (fewer tiles of K than stages included); the
    # persistent shapes with two work-groups a batch, each taking several tiles of C in turn,
    # and launched a tile a work-group
    if not gemm.use_mma(device, "float16"):
        pytest.skip("no NVIDIA inline PTX on this device")
    if variant.startswith("wgmma") and not gemm.use_wgmma(device):
        pytest.skip("no wgmma (sm_90a) on this device")
    if variant.startswith("wgmma_tma") and not gemm.tma_builds(device):
        pytest.skip("no tensor memory accelerator (or CUDA driver to encode its maps) here")
    kw: dict = {"sync": {"mma_depth": 32},
                "wide": {"mma_config": dict(BM=128, BN=256, WM=64, WN=64, BK=32, STAGES=2,
                                            RASTER=8)},
                "tall": {"mma_config": dict(BM=256, BN=128, WM=64, WN=64, BK=32, STAGES=2,
                                            RASTER=4)},
                "wgmma": {"mma_config": gemm.WGMMA_CONFIGS[0]},
                "wgmma_wide": {"mma_config": gemm.WGMMA_CONFIGS[1]},
                "wgmma_ws": {"mma_config": dict(WG=1, BM=128, BN=128, BK=64, STAGES=3, WAITN=0,
                                                RASTER=8, WS=2, PLEAD=2)},
                "wgmma_tma": {"mma_config": gemm.TMA_CONFIGS[0]},
                "wgmma_persist": {"mma_config": dict(gemm.WGMMA_CONFIGS[0], PERSIST=1),
                                  "persist_groups": 2},
                "wgmma_tma_one_tile": {"mma_config": dict(gemm.TMA_CONFIGS[0], PERSIST=0)},
                "wgmma_tma_persist": {"mma_config": gemm.TMA_CONFIGS[0], "persist_groups": 2},
                }.get(variant, {})
    cfg = kw.get("mma_config")
    if cfg and (m % cfg["BM"] or n % cfg["BN"] or k % cfg["BK"]):
        pytest.skip("tile shape does not divide the product")
    a = RNG.standard_normal((batch, m, k)).astype(np.float16)
    b = RNG.standard_normal((batch, k, n)).astype(np.float16)
    ta = clops.asarray(a, device=device).realize()
    tb = clops.asarray(b, device=device).realize()
    tc = clops.empty((batch, m, n), dtype=clops.float16, device=device)
    assert gemm.supports(device, "float16", m, n, k, (ta.offset, tb.offset), (), force=True)
    gemm.gemm(device, tc.buffer, tc.offset, n, ta.buffer, ta.offset, k, tb.buffer, tb.offset, n,
              m, n, k, "float16", batch, (m * n, m * k, k * n), **kw)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = np.asarray(tc).astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3


def _view(dev, base: np.ndarray, how: str):
    """A tensor view of ``base`` (2-D or 3-D) read as ``how``: plain, transposed (the last two
    axes of a contiguous copy swapped), strided (every other column), flipped (rows reversed),
    with its numpy equal."""
    if how == "plain":
        return clops.asarray(base, device=dev).realize(), base
    if how == "transposed":
        src = np.ascontiguousarray(np.swapaxes(base, -1, -2))
        return clops.matrix_transpose(clops.asarray(src, device=dev).realize()), base
    if how == "strided":
        wide = np.repeat(base, 2, axis=-1)
        return clops.asarray(wide, device=dev).realize()[..., ::2], wide[..., ::2]
    flipped = np.flip(base, axis=-2)
    t = clops.flip(clops.asarray(np.ascontiguousarray(flipped), device=dev).realize(), axis=-2)
    return t, base


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("m,n,k,batch,ha,hb,slices", [
    (64, 64, 4096, 1, "transposed", "plain", None),   # x.T @ x of a tall x
    (64, 64, 4096, 1, "transposed", "plain", 5),
    (1, 1, 1, 1, "plain", "plain", None),
    (100, 48, 300, 1, "plain", "transposed", 3),
    (7, 130, 513, 2, "strided", "plain", None),
    (129, 65, 17, 3, "flipped", "strided", 2),
    (33, 16, 1000, 2, "plain", "flipped", 7),
    (70, 200, 64, 1, "transposed", "transposed", 1),
])
def test_gemm_any(device, dtype, m, n, k, batch, ha, hb, slices):
    # any shape, strides (views read in place) and slicing of K, against numpy
    a = RNG.standard_normal((batch, m, k)).astype(dtype)
    b = RNG.standard_normal((batch, k, n)).astype(dtype)
    ta, a = _view(device, a, ha)
    tb, b = _view(device, b, hb)
    assert gemm.any_supports(device, dtype, m, n, k, force=True)
    tc = clops.full((batch, m, n), -7.0, dtype=getattr(clops, dtype), device=device).realize()
    gemm.gemm_any(device, tc.buffer, tc.offset, (m * n, n), ta.buffer, ta.offset, ta.strides,
                  tb.buffer, tb.offset, tb.strides, m, n, k, batch, dtype, slices=slices)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = np.asarray(tc).astype(np.float64)
    tol = 1e-5 if dtype == "float32" else 2e-3
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max() * 4)


def test_gemm_any_repeats_exactly(device):
    # the slices of K are added up in order: the same product gives the same bits every time
    x = RNG.standard_normal((20000, 40)).astype(np.float32)
    t = clops.asarray(x, device=device).realize()
    outs = []
    for _ in range(3):
        c = clops.empty((40, 40), dtype=clops.float32, device=device)
        tt = clops.matrix_transpose(t)
        gemm.gemm_any(device, c.buffer, c.offset, (0, 40), tt.buffer, tt.offset,
                      (0, *tt.strides), t.buffer, t.offset, (0, *t.strides), 40, 40, 20000,
                      slices=9)
        outs.append(np.asarray(c))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    np.testing.assert_allclose(outs[0], x.T.astype(np.float64) @ x, rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_matmul_takes_gemm_any_on_gpus(device, dtype):
    # x.T @ x of a tall x (no 128-multiple, a transposed view): gemm_any on GPUs, read in place
    x = (RNG.standard_normal((70000, 72)) / 4).astype(dtype)  # (sums within float16's range)
    t = clops.asarray(x, device=device).realize()
    out, names = _names(lambda: clops.matmul(clops.matrix_transpose(t), t).realize())
    assert any(n.startswith("gemm_any") for n in names) == (device.kind != "cpu")
    # float16 on NVIDIA's tensor cores
    assert any(n.startswith("gemm_any_mma") for n in names) == (
        dtype == "float16" and gemm.use_mma(device, dtype) and gemm.any_mma_builds(device))
    want = x.T.astype(np.float64) @ x.astype(np.float64)
    tol = 1e-5 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(np.asarray(out).astype(np.float64), want, rtol=tol,
                               atol=tol * np.abs(want).max() * 4)


@pytest.mark.parametrize("view", ["plain", "transposed", "strided", "flipped"])
def test_pad_copy(device, view):
    # a view's matrices, zero-padded to the tiles' multiples, read in place on every device
    a = RNG.standard_normal((2, 45, 70)).astype(np.float16)
    t, a = _view(device, a, view)
    out = gemm.pad_copy(device, t.buffer, t.offset, t.strides, 45, 70, 64, 96, 2)
    got = np.empty((2, 64, 96), np.float16)
    device.read(got, out)
    want = np.zeros((2, 64, 96), np.float16)
    want[:, :45, :70] = a
    assert np.array_equal(got, want)


@pytest.mark.parametrize("shape,view", [((1000, 1000, 1000), "plain"),
                                        ((3, 1000, 900, 700), "transposed"),
                                        ((1200, 1030, 600), "strided")])
def test_float16_products_of_any_shape_take_padded_tensor_core_tiles(device, shape, view):
    # float16 products whose sizes are not multiples of the tiles: zero-padded copies through
    # gemm's tensor-core tiles (NVIDIA), the result a view of the padded product's corner
    if not gemm.use_mma(device, "float16"):
        pytest.skip(f"{device.name}: no tensor-core float16 products")
    *batch, m, n, k = shape
    assert gemm.padded_shape(device, "float16", m, n, k) is not None
    a = (RNG.standard_normal((*batch, m, k)) / 8).astype(np.float16)
    b = (RNG.standard_normal((*batch, k, n)) / 8).astype(np.float16)
    ta, a = _view(device, a, view)
    tb = clops.asarray(b, device=device).realize()
    out, names = _names(lambda: clops.matmul(ta, tb).realize())
    assert "gemm.pad_copy" in names and not any(x.startswith("gemm_any") for x in names)
    assert out.shape == (*batch, m, n)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = np.asarray(out).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max() * 4)


def test_matmul_dispatch(device):
    # small products keep the generated kernel; the result is the same either way
    a = RNG.standard_normal((128, 256)).astype(np.float32)
    b = RNG.standard_normal((256, 128)).astype(np.float32)
    got = np.asarray(clops.matmul(clops.asarray(a, device=device), clops.asarray(b, device=device)))
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)
    assert not gemm.supports(device, "float32", 100, 128, 128, (), (), force=True)


def _names(fn):
    with clops.profile() as prof:
        out = fn()
        clops.synchronize()
    return out, [r.name for r in prof.kernels()]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m,n,k,batch", [(64, 64, 64, 1), (100, 48, 300, 1), (7, 96, 513, 2),
                                         (258, 32, 1, 1), (33, 16, 4096, 3), (40, 24, 600, 1),
                                         (96, 48, 70, 2), (257, 130, 1000, 1), (9, 70, 500, 2),
                                         (300, 300, 300, 1), (70, 32, 260, 2)])
def test_gemm_cpu_shapes(device, m, n, k, batch, dtype, monkeypatch):
    # every row tile (8, 4, 2, 1), k of one to thousands, batches; strided and offset operands
    # (made contiguous first); n a multiple of 8 but not 16 (float64 only); B packed into
    # column panels (m >= CPU_PACK_ROWS), batched too; row-tile groups past the last tile;
    # n of no multiple, B padded with zero columns (from CPU_PAD_MIN widths); rows past the
    # last tile of 8 in a launch of their own; on CPUs of 8-wide vectors, float32 from
    # CPU_PA_MIN_K deep: A packed in tiles of 6 (the last one padded), batched too. Where
    # float32 runs natively (native_cpu.takes_gemm: steps of 256 k, tiles of 6 or 8 rows, a
    # batch of small products a product a thread), the same again through the kernels.
    if dtype == "float64" and not device.caps.fp64:
        pytest.skip("no float64 on this device")
    w = gemm.CPU_COLS[dtype]
    wide = -(-n // w) * w
    native = native_cpu.takes_gemm(device, dtype, wide)
    _gemm_cpu_shape(device, m, n, k, batch, dtype, native)
    if native:
        monkeypatch.setattr(native_cpu, "takes_gemm", lambda *a: False)
        _gemm_cpu_shape(device, m, n, k, batch, dtype, False)


def _gemm_cpu_shape(device, m, n, k, batch, dtype, native):
    a = RNG.standard_normal((batch, m + 3, k + 2)).astype(dtype)
    b = RNG.standard_normal((batch, n, k)).astype(dtype)
    ta = clops.asarray(a, device=device)[:, 3:, 2:]
    tb = clops.asarray(b, device=device).mT  # (batch, k, n), transposed
    if batch == 1:
        ta, tb = ta[0], tb[0]
    ts = ta.mT.mT  # the same view
    got, names = _names(lambda: np.asarray(clops.matmul(ts, tb)))
    want = a[:, 3:, 2:].astype(np.float64) @ b.transpose(0, 2, 1).astype(np.float64)
    want = want[0] if batch == 1 else want
    tol = 1e-4 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.sqrt(k))
    w = gemm.CPU_COLS[dtype]
    wide = -(-n // w) * w
    pads = n % w == 0 or n >= gemm.CPU_PAD_MIN * w
    taken = pads and gemm.cpu_supports(device, dtype, m, wide, k)
    assert ("gemm_cpu" in names or "gemm_cpu.native" in names) == taken
    if device.kind == "cpu":
        assert taken == (m * wide * k >= gemm.CPU_MIN_MACS and pads)
        if native:
            assert names.count("gemm_cpu.native") == int(taken)
            assert "gemm_cpu" not in names and "gemm_cpu.pack_b" not in names
            return
        packed = gemm.packs_a(device, dtype, m, k)
        assert names.count("gemm_cpu") == (1 + (m > 8 and m % 8 != 0 and not packed)) * taken
        assert ("gemm_cpu.pack_a" in names) == (packed and taken)


@pytest.mark.parametrize("shape", [(500, 70), (2, 300, 48), (1000, 64)])
def test_gemm_cpu_reads_a_transposed_view_in_place(device, shape):
    # x.T @ x (a Gram matrix): A is x.T, read where x lies (no copy of it first); rows past the
    # last tile of 8 and padded columns included
    x = RNG.standard_normal(shape).astype(np.float32)
    t = clops.asarray(x, device=device).realize()
    out, names = _names(lambda: clops.matmul(t.mT, t).realize())
    got = np.asarray(out)
    want = np.swapaxes(x, -1, -2).astype(np.float64) @ x.astype(np.float64)
    k = shape[-2]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    if device.kind == "cpu":
        m = shape[-1]
        # nothing but gemm_cpu's own launches: no copy of x.T
        assert set(names) <= {"gemm_cpu", "gemm_cpu.pack_b", "gemm_cpu.pack_a",
                              "gemm_cpu.pad_cols", "gemm_cpu.native"}, names
        if native_cpu.takes_gemm(device, "float32", -(-m // 16) * 16):
            assert names.count("gemm_cpu.native") == 1 and "gemm_cpu" not in names
            return
        assert "gemm_cpu" in names
        packed = gemm.packs_a(device, "float32", m, k)
        assert names.count("gemm_cpu") == 1 + (m % 8 != 0 and not packed)
        assert ("gemm_cpu.pack_a" in names) == packed


@pytest.mark.parametrize("m,n,k", [(64, 64, 64), (70, 64, 300)])  # (A in place; packed)
def test_gemm_cpu_special_values(device, m, n, k):
    if device.kind != "cpu":
        pytest.skip("gemm_cpu runs on CPUs")
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    a[3, 5], a[7, :] = np.inf, np.nan
    b[:, 9] = 0.0
    b[2, 11] = -np.inf
    got, names = _names(lambda: np.asarray(clops.matmul(clops.asarray(a, device=device),
                                                        clops.asarray(b, device=device))))
    assert "gemm_cpu" in names or "gemm_cpu.native" in names
    with np.errstate(invalid="ignore", over="ignore"):
        want = a @ b
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = np.isfinite(want)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-3)


def test_gemm_cpu_refuses_ragged_columns(device):
    assert not gemm.cpu_supports(device, "float32", 64, 40, 64)  # n % 16
    assert not gemm.cpu_supports(device, "float16", 64, 64, 64)
    with pytest.raises(ValueError, match="multiple of 16"):
        t = clops.zeros((8, 8), device=device).realize()
        gemm.gemm_cpu(device, t.buffer, 0, 8, t.buffer, 0, 8, t.buffer, 0, 8, 8, 8, 8)


def test_gemm_tma_offsets_and_fallback(device, monkeypatch):
    """By default (CLOPS_TMA unset), gemm_wgmma through the tensor memory accelerator from
    element offsets of buffers; a batch sharing one B (stride 0, which a tensor map cannot
    describe) takes the cp.async copies instead, twice. With CLOPS_TMA=0, the cp.async copies.
    All against numpy."""
    if not (gemm.use_mma(device, "float16") and gemm.tma_builds(device)):
        pytest.skip("no tensor memory accelerator (or CUDA driver to encode its maps) here")
    monkeypatch.delenv("CLOPS_TMA", raising=False)
    m, n, k, batch = 256, 512, 192, 2
    a = RNG.standard_normal((batch, m, k)).astype(np.float16)
    b = RNG.standard_normal((k, n)).astype(np.float16)
    ba = device.alloc(a.nbytes + 64)
    bb = device.alloc(b.nbytes + 32)
    device.write(ba, np.concatenate([np.zeros(32, np.float16), a.ravel()]), blocking=True)
    device.write(bb, np.concatenate([np.zeros(16, np.float16), b.ravel()]), blocking=True)
    bc = device.alloc(batch * m * n * 2)
    want = a.astype(np.float64) @ b.astype(np.float64)
    for stride_b in (0, 0, k * n):  # broadcast B twice, then B read as a batch of its own
        bs = bb
        if stride_b:
            b2 = np.stack([b, b[::-1]])
            bs = device.alloc(b2.nbytes + 32)
            device.write(bs, np.concatenate([np.zeros(16, np.float16), b2.ravel()]),
                         blocking=True)
            want = a.astype(np.float64) @ b2.astype(np.float64)
        with clops.profile() as prof:
            gemm.gemm(device, bc, 0, n, ba, 32, k, bs, 16, n, m, n, k, "float16", batch,
                      (m * n, m * k, stride_b))
            device.synchronize()
        # (a buffer's device address is read once, by a one-work-item kernel, for its map; a
        # product whose maps cannot be made asks for none)
        names = [r.name for r in prof.kernels()]
        assert [x for x in names if x != "address_of"] == [
            "gemm_wgmma_tma" if stride_b else "gemm_wgmma"], names
        assert stride_b or "address_of" not in names, names
        got = np.empty((batch, m, n), np.float16)
        device.read(got, bc)
        assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) < 2e-3
    monkeypatch.setenv("CLOPS_TMA", "0")
    with clops.profile() as prof:
        gemm.gemm(device, bc, 0, n, ba, 32, k, bs, 16, n, m, n, k, "float16", batch,
                  (m * n, m * k, k * n))
        device.synchronize()
    assert [r.name for r in prof.kernels()] == ["gemm_wgmma"]
    got = np.empty((batch, m, n), np.float16)
    device.read(got, bc)
    assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) < 2e-3


def test_gemm_launches_reuse_one_typed_kernel_object(device, launched_kernels):
    """Eager products launch the device's one kernel object of each kind, told its arguments'
    types (a new object and arguments of unknown types cost pyopencl about 0.15 ms a launch),
    and still get each product right."""
    seen = launched_kernels
    m = n = k = 128
    for _ in range(2):
        a = RNG.standard_normal((m, k)).astype(np.float32)
        b = RNG.standard_normal((k, n)).astype(np.float32)
        ta, tb = (clops.asarray(x, device=device).realize() for x in (a, b))
        tc = clops.empty((m, n), dtype=clops.float32, device=device)
        gemm.gemm(device, tc.buffer, tc.offset, n, ta.buffer, ta.offset, k, tb.buffer,
                  tb.offset, n, m, n, k, portable=True, tiled_depth=16)
        np.testing.assert_allclose(np.asarray(tc), a @ b, rtol=1e-4, atol=1e-4)
        tc2 = clops.empty((m, n), dtype=clops.float32, device=device)
        gemm.gemm_any(device, tc2.buffer, tc2.offset, (m * n, n), ta.buffer, ta.offset,
                      (m * k, 1, m), tb.buffer, tb.offset, (k * n, n, 1), m, n, k,
                      slices=2)  # A read transposed; two slices of K and their sum
        np.testing.assert_allclose(np.asarray(tc2), a.T @ b, rtol=1e-4, atol=1e-4)
    assert len(seen) == 6 and seen[:3] == seen[3:], seen


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(64, 128, 128, 128), (96, 64, 64, 64)])
def test_batched_products_count_their_batch(device, dtype, shape):
    """Many small matrices (attention's scores, say): the GPU kernels take them when the
    batch's work is large, though one matrix alone would stay generated; the same values."""
    batch, m, k, n = shape
    if device.kind == "cpu":
        pytest.skip("a GPU's choice (CPUs: gemm_cpu)")
    assert not gemm.supports(device, dtype, m, n, k, (), ()) and \
        not gemm.any_supports(device, dtype, m, n, k)
    assert gemm.supports(device, dtype, m, n, k, (), (), batch=batch) or \
        gemm.any_supports(device, dtype, m, n, k, batch=batch)
    a = RNG.standard_normal((batch, m, k)).astype(dtype)
    b = RNG.standard_normal((batch, k, n)).astype(dtype)
    with clops.profile() as prof:
        got = np.asarray(clops.matmul(clops.asarray(a, device=device),
                                      clops.asarray(b, device=device))).astype(np.float64)
    assert any(r.name.startswith("gemm") for r in prof.records)
    want = a.astype(np.float64) @ b.astype(np.float64)
    tol = 1e-5 if dtype == "float32" else 2e-3
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < tol
