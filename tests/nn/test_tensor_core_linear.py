"""The tensor-core route of ``kernels.matmul.linear`` (float16 weights, many rows: a prompt's
projections): the float16 staging of the rows on every device, and the ``gemm_nt_mma`` (or on
Hopper ``gemm_nt_wgmma``) product against numpy where the device has NVIDIA tensor cores."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import clops
import clops.nn as nn
import clops.nn.quant as quant
from clops import _config
from clops.kernels import gemm, launch, matmul
from clops.kernels.norm import half_rows
from clops.nn.quant import DeviceWeight, pack_float
from clops.runtime import tma

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _row_major_weights(monkeypatch):
    # the GPU layout of weights on every device (CPUs otherwise interleave rows: matmul_cpu.cl)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")


def _upload(dev, a):
    a = np.ascontiguousarray(a)
    buf = dev.alloc(max(a.nbytes, 4))
    dev.write(buf, a, blocking=True)
    return buf


def _read(dev, buf, shape, dtype):
    out = np.empty(shape, dtype)
    dev.read(out, buf)
    return out


def _silu(v):
    return v / (1 + np.exp(-v))


def _prologue(rows, mode, k, w, eps):
    """What the product reads of ``rows``: RMSNorm * w ("norm"), the GLU of [gate | up] halves
    of 2k ("glu"), or the rows themselves."""
    if mode == "norm":
        return rows / np.sqrt((rows * rows).mean(-1, keepdims=True) + eps) * w
    if mode == "glu":
        return _silu(rows[:, :k]) * rows[:, k:]
    return rows


@pytest.mark.parametrize("k", [96, 1000])  # (1000: a last round of loads part-filled)
@pytest.mark.parametrize("mode", ["plain", "norm", "glu"])
def test_half_rows(device, mode, k, m=5):
    """The float16 rows the tensor-core product reads: a copy, RMSNorm * weight, or the GLU."""
    dev = clops.device(device)
    width = 2 * k if mode == "glu" else k
    ld = width + 8  # rows apart by more than they hold, at an offset
    x = (RNG.standard_normal((m, ld)) * 3).astype(np.float32)
    w = RNG.standard_normal(k).astype(np.float32)
    xb, wb = _upload(dev, np.concatenate([np.zeros(4, np.float32), x.ravel()])), _upload(dev, w)
    y = dev.alloc(matmul.half_scratch_nbytes(m, k))
    norm = (wb, 1e-5) if mode == "norm" else None
    half_rows(dev, y, xb, 4, ld, k=k, m=m, norm=norm, glu=mode == "glu").run(dev)
    got = _read(dev, y, (m, k), np.float16).astype(np.float32)
    want = _prologue(x[:, :width], mode, k, w, 1e-5)
    # float16 rounding: half an ulp, 2^-11 of the value
    np.testing.assert_allclose(got, want.astype(np.float16).astype(np.float32), rtol=2e-3,
                               atol=1e-6)


def test_routing(device):
    """Which products take tensor cores: float16 weights, enough rows, tile-sized n and k."""
    dev = clops.device(device)
    f16 = DeviceWeight(dev, pack_float(np.zeros((128, 64), np.float32), "f16"))
    f32 = DeviceWeight(dev, pack_float(np.zeros((128, 64), np.float32), "f32"))
    odd = DeviceWeight(dev, pack_float(np.zeros((96, 64), np.float32), "f16"))
    assert not matmul.tensor_core_rows(dev, matmul.TENSOR_CORE_ROWS - 1, f16)
    assert not matmul.tensor_core_rows(dev, 64, f32)
    assert not matmul.tensor_core_rows(dev, 64, odd)
    mma = matmul.tensor_core_rows(dev, 64, f16)
    assert mma == (not launch.is_cpu(dev) and gemm.use_mma(dev, "float16"))
    assert len(matmul.linear(dev, dev.alloc(64 * 128 * 4), 0, 128, dev.alloc(64 * 64 * 4), 0, 64,
                        f16, 64)) == (2 if mma else 1)


def test_split(device):
    """Long k over few tiles of C is split into power-of-two slices of at least 512."""
    dev = clops.device(device)
    cu = dev.caps.compute_units
    # enough tiles already (of 64 x 64, or of wgmma's 128 x 128)
    assert matmul.tensor_core_split(dev, 128, 128 * 2 * cu, 8192) == 1
    s = matmul.tensor_core_split(dev, 16, 64, 8192)
    assert s == min(16, 1 << (2 * cu - 1).bit_length())  # slices of 512 at the least
    assert matmul.tensor_core_split(dev, 16, 64, 1024) == 2
    assert matmul.tensor_core_split(dev, 16, 64, 96) == 1


def test_split_small_prompts_fill_one_wave(device):
    """wgmma products of up to NT_SMALL_M rows take their own tiles and split k into as many
    slices as one wave of work-groups holds; larger prompts keep the former tiles and rule."""
    dev = clops.device(device)
    cfg = gemm.nt_config(dev, gemm.NT_SMALL_M, 2048, 8192)
    if cfg is None:
        pytest.skip("no gemm_nt_wgmma products on this device (Hopper GPUs)")
    assert cfg in gemm.NT_WGMMA_CONFIGS_SMALL
    cu = dev.caps.compute_units
    for n in (2048, 3072):
        tiles = -(-gemm.NT_SMALL_M // cfg["BM"]) * (n // cfg["BN"])
        split = matmul.tensor_core_split(dev, gemm.NT_SMALL_M, n, 8192)
        assert tiles * split <= cu < tiles * split * 2
    big = gemm.nt_config(dev, 4 * gemm.NT_SMALL_M, 2048, 8192)
    assert big in gemm.NT_WGMMA_CONFIGS
    tiles = 4 * gemm.NT_SMALL_M // big["BM"] * (2048 // big["BN"])
    split = matmul.tensor_core_split(dev, 4 * gemm.NT_SMALL_M, 2048, 8192)
    assert tiles * split >= cu and (split == 1 or tiles * split // 2 < cu)


@pytest.mark.parametrize("s", [4, 11, 13])  # (the slices' loads go 8, then 4, at a time)
@pytest.mark.parametrize("bias,accum", [(False, False), (True, False), (True, True)])
def test_split_sum(device, bias, accum, s, m=5, n=40):
    """The slices of a split product added up in order, into rows of y at an offset."""
    from clops.kernels import kernel
    from clops.kernels.launch import Launch

    dev = clops.device(device)
    p = RNG.standard_normal((s, m, n)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    ldy, off = n + 3, 2
    y0 = RNG.standard_normal(off + m * ldy).astype(np.float32)
    yb, pb, bb = _upload(dev, y0), _upload(dev, p), _upload(dev, b)
    knl = kernel(dev, "norm", "split_sum", HAS_BIAS=int(bias), ACCUM=int(accum))
    Launch(knl, (n // 4, m), None, [yb, np.int32(off), np.int32(ldy), pb, np.int32(s), bb],
           [pb, bb], [yb]).run(dev)
    got = _read(dev, yb, y0.shape, np.float32)
    want = y0.copy()
    rows = want[off:].reshape(m, ldy)
    total = p[0]
    for i in range(1, s):  # (in order)
        total = total + p[i]
    total = total + (b if bias else 0)
    rows[:, :n] = rows[:, :n] + total if accum else total
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("s,k", [(3, 96), (11, 1000), (13, 96)])
def test_split_norm_half(device, s, k, m=5):
    """The slices of a split product added to the residual rows (at an offset, rows wider than
    k), then the float16 rows of their RMSNorm: the same values as split_sum, then half_rows
    with the norm, bit for bit."""
    from clops.kernels import kernel
    from clops.kernels.launch import Launch
    from clops.kernels.norm import split_norm_half

    dev = clops.device(device)
    p = RNG.standard_normal((s, m, k)).astype(np.float32)
    w = RNG.standard_normal(k).astype(np.float32)
    ldx, off = k + 8, 4
    x0 = RNG.standard_normal(off + m * ldx).astype(np.float32)
    pb, wb = _upload(dev, p), _upload(dev, w)
    xa, xb = _upload(dev, x0), _upload(dev, x0)
    ya, yb = dev.alloc(m * k * 2), dev.alloc(m * k * 2)
    split_norm_half(dev, ya, xa, off, ldx, pb, s, wb, k=k, m=m, eps=1e-5).run(dev)
    knl = kernel(dev, "norm", "split_sum", HAS_BIAS=0, ACCUM=1)
    Launch(knl, (k // 4, m), None, [xb, np.int32(off), np.int32(ldx), pb, np.int32(s), pb],
           [pb, xb], [xb]).run(dev)
    half_rows(dev, yb, xb, off, ldx, k=k, m=m, norm=(wb, 1e-5)).run(dev)
    got_x = _read(dev, xa, x0.shape, np.float32)
    np.testing.assert_array_equal(got_x, _read(dev, xb, x0.shape, np.float32))
    np.testing.assert_array_equal(_read(dev, ya, (m, k), np.float16),
                                  _read(dev, yb, (m, k), np.float16))
    rows = x0[off:].reshape(m, ldx)[:, :k] + p.sum(0)
    np.testing.assert_allclose(got_x[off:].reshape(m, ldx)[:, :k], rows, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got_x[off:].reshape(m, ldx)[:, k:],
                                  x0[off:].reshape(m, ldx)[:, k:])


def _tensor_cores(dev):
    w = DeviceWeight(dev, pack_float(np.zeros((64, 32), np.float32), "f16"))
    if not matmul.tensor_core_rows(dev, 64, w):
        pytest.skip(f"{dev.name}: no tensor-core product (needs NVIDIA PTX mma.sync)")


@pytest.mark.parametrize("m,n,k", [(16, 64, 32), (37, 192, 96), (64, 128, 256),
                                   (130, 64, 512), (128, 320, 64), (37, 128, 2048),
                                   (100, 64, 1024), (200, 384, 512), (513, 256, 1024),
                                   (37, 576, 512), (130, 2880, 256)])
@pytest.mark.parametrize("mode", ["plain", "bias", "accum", "norm", "glu"])
def test_linear_tensor_cores(device, m, n, k, mode):
    """y (+)= f16(prologue(x)) @ w.T (+ b) against numpy from the same float16 values; rows past
    a tile of 64, outputs at an offset with a wider row stride, and k split into slices added up
    by split_sum (two shapes on an H100); on Hopper, wgmma's tiles where they divide n and k
    (its two tile shapes, rows past them, split or not), or leave a last tile's columns past n
    (576 and 2880 columns)."""
    dev = clops.device(device)
    _tensor_cores(dev)
    width = 2 * k if mode == "glu" else k
    x = RNG.standard_normal((m, width)).astype(np.float32)
    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16)
    b = RNG.standard_normal(n).astype(np.float32)
    nw = RNG.standard_normal(k).astype(np.float32)
    dw = DeviceWeight(dev, pack_float(w, "f16"))
    ldy, y_off = n + 64, 32
    y0 = RNG.standard_normal((m, ldy)).astype(np.float32)
    yb, xb = _upload(dev, np.concatenate([np.zeros(y_off, np.float32), y0.ravel()])), \
        _upload(dev, x)
    norm = (_upload(dev, nw), 1e-6) if mode == "norm" else None
    launches = matmul.linear(dev, yb, y_off, ldy, xb, 0, width, dw, m,
                        bias=_upload(dev, b) if mode == "bias" else None,
                        accum=mode == "accum", norm=norm, glu=mode == "glu")
    names = ["half_rows", "gemm_nt_wgmma" if gemm.nt_config(dev, m, n, k) else "gemm_nt_mma"]
    if matmul.tensor_core_split(dev, m, n, k) > 1:
        names.append("split_sum")
    assert [ln.kernel.function_name for ln in launches] == names
    for ln in launches:
        ln.run(dev)
    got = _read(dev, yb, (y_off + m * ldy,), np.float32)[y_off:].reshape(m, ldy)
    a = _prologue(x, mode, k, nw, 1e-6)
    want = a.astype(np.float16).astype(np.float64) @ w.astype(np.float64).T
    if mode == "bias":
        want += b
    if mode == "accum":
        want += y0[:, :n]
    np.testing.assert_allclose(got[:, :n], want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
    np.testing.assert_array_equal(got[:, n:], y0[:, n:])  # past n: untouched


@pytest.mark.parametrize("m,f,k", [(37, 128, 512), (128, 192, 256), (200, 256, 768)])
def test_glu_half_then_half_in(device, m, f, k):
    """Hopper: the gate and up product's epilogue gives the GLU's float16 rows (glu_half, at an
    offset, rows wider than f), which the down product reads as they are (half_in), as
    half_rows would have made them from the float32 product."""
    dev = clops.device(device)
    _tensor_cores(dev)
    wgu = (RNG.standard_normal((2 * f, k)) / np.sqrt(k)).astype(np.float16)
    gu = DeviceWeight(dev, pack_float(wgu, "f16"))
    if not matmul.glu_half_rows(dev, m, gu):
        pytest.skip(f"{dev.name}: no gemm_nt_wgmma product in one slice for {m} x {2 * f}")
    wd = (RNG.standard_normal((64, f)) / np.sqrt(f)).astype(np.float16)
    down = DeviceWeight(dev, pack_float(wd, "f16"))
    x = RNG.standard_normal((m, k)).astype(np.float32)
    nw = RNG.standard_normal(k).astype(np.float32)
    ldh, h_off = f + 8, 16
    h = _upload(dev, np.full(h_off + m * ldh, 7, np.float16))
    norm = (_upload(dev, nw), 1e-6)
    launches = matmul.linear(dev, h, h_off, ldh, _upload(dev, x), 0, k, gu, m, norm=norm,
                             glu_half=True)
    assert [ln.kernel.function_name for ln in launches] == ["half_rows", "gemm_nt_wgmma"]
    for ln in launches:
        ln.run(dev)
    got = _read(dev, h, (h_off + m * ldh,), np.float16)
    assert (got[:h_off] == 7).all()
    got = got[h_off:].reshape(m, ldh)
    assert (got[:, f:] == 7).all()  # past f: untouched
    a = _prologue(x, "norm", k, nw, 1e-6).astype(np.float16).astype(np.float64)
    prod = a @ wgu.astype(np.float64).T
    want = _silu(prod[:, :f]) * prod[:, f:]
    np.testing.assert_allclose(got[:, :f].astype(np.float64), want, rtol=4e-3,
                               atol=4e-3 * np.abs(want).max())
    # the down product from those float16 rows, added to y
    hb = _upload(dev, got)
    y0 = RNG.standard_normal((m, 64)).astype(np.float32)
    yb = _upload(dev, y0)
    launches = matmul.linear(dev, yb, 0, 64, hb, 0, ldh, down, m, accum=True, half_in=True)
    assert "half_rows" not in [ln.kernel.function_name for ln in launches]
    for ln in launches:
        ln.run(dev)
    want = y0 + got[:, :f].astype(np.float64) @ wd.astype(np.float64).T
    np.testing.assert_allclose(_read(dev, yb, (m, 64), np.float32), want, rtol=2e-3,
                               atol=2e-3 * np.abs(want).max())


@pytest.mark.parametrize("m,n,k", [(37, 128, 512), (128, 2048, 2048), (128, 256, 8192)])
def test_norm_after(device, m, n, k):
    """A product accumulated into y leaves the float16 rows of RMSNorm(y) * w for the next
    product (split over k or not): the values half_rows makes from the same y."""
    dev = clops.device(device)
    _tensor_cores(dev)
    w = DeviceWeight(dev, pack_float((RNG.standard_normal((n, k)) / np.sqrt(k)).astype(
        np.float16), "f16"))
    x = RNG.standard_normal((m, k)).astype(np.float32)
    nw = _upload(dev, RNG.standard_normal(n).astype(np.float32))
    y0 = RNG.standard_normal((m, n)).astype(np.float32)
    yb, xb, out = _upload(dev, y0), _upload(dev, x), dev.alloc(m * n * 2)
    launches = matmul.linear(dev, yb, 0, n, xb, 0, k, w, m, accum=True,
                             norm_after=(nw, 1e-5, out))
    names = [ln.kernel.function_name for ln in launches]
    assert names[-1] == ("split_norm_half" if matmul.tensor_core_split(dev, m, n, k) > 1
                         else "half_rows")
    for ln in launches:
        ln.run(dev)
    want = dev.alloc(m * n * 2)
    half_rows(dev, want, yb, 0, n, k=n, m=m, norm=(nw, 1e-5)).run(dev)
    np.testing.assert_array_equal(_read(dev, out, (m, n), np.float16),
                                  _read(dev, want, (m, n), np.float16))


def test_glu_half_and_half_in_refuse_what_they_cannot_do(device):
    """glu_half where no one-slice wgmma product takes it (every device but Hopper, or with a
    bias), half_in with a norm or at an offset, and norm_after without accumulation are
    refused, not run otherwise."""
    dev = clops.device(device)
    w = DeviceWeight(dev, pack_float(np.zeros((256, 512), np.float32), "f16"))
    buf = dev.alloc(256 * 512 * 4)
    with pytest.raises(ValueError, match="glu_half"):
        matmul.linear(dev, buf, 0, 128, buf, 0, 512, w, 128, bias=buf, glu_half=True)
    if not matmul.glu_half_rows(dev, 128, w):
        with pytest.raises(ValueError, match="glu_half"):
            matmul.linear(dev, buf, 0, 128, buf, 0, 512, w, 128, glu_half=True)
    with pytest.raises(ValueError, match="half_in"):
        matmul.linear(dev, buf, 0, 256, buf, 0, 512, w, 128, half_in=True, norm=(buf, 1e-6))
    with pytest.raises(ValueError, match="half_in"):
        matmul.linear(dev, buf, 0, 256, buf, 8, 512, w, 128, half_in=True)
    with pytest.raises(ValueError, match="norm_after"):  # (not accumulated)
        matmul.linear(dev, buf, 0, 256, buf, 0, 512, w, 128, norm_after=(buf, 1e-6, buf))


def test_nn_linear_tensor_cores(device):
    """``clops.nn.linear`` with a float16 weight over many rows takes the same route."""
    dev = clops.device(device)
    _tensor_cores(dev)
    x = RNG.standard_normal((3, 40, 128)).astype(np.float32)
    w = RNG.standard_normal((256, 128)).astype(np.float32)
    wt = clops.astype(clops.asarray(w, device=dev), clops.float16)
    got = np.asarray(nn.linear(clops.asarray(x, device=dev), wt))
    want = x.astype(np.float16).astype(np.float64) @ w.astype(np.float16).astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def _ggml_weight(dev, kind, n, k):
    from .test_functional import ggml_weight
    return ggml_weight(dev, kind, n, k, RNG)


def _weight(dev, kind, n, k):
    """A weight of a GGML type or bfloat16 on dev, and its float32 values."""
    if kind != "bf16":
        return _ggml_weight(dev, kind, n, k)
    w = nn.quantized(RNG.standard_normal((n, k)).astype(np.float32), "bf16", device=dev)
    bits = _read(dev, w.data, (n, k), np.uint16)
    return w, (bits.astype(np.uint32) << 16).view(np.float32)


KINDS = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "MXFP4", "IQ4_NL", "Q5_0",
         "Q3_K"]


@pytest.mark.parametrize("kind", KINDS + ["Q5_1", "F32", "F16", "bf16"])
def test_dequant_half(device, kind, n=24, k=512):
    """The float16 copy of a weight that a prompt's tensor-core product reads (every format of
    the row layout: (scale, min) pairs in Q5_1's, float16 copied as it is)."""
    dev = clops.device(device)
    w, ref = _weight(dev, kind, n, k)
    out = dev.alloc(n * k * 2)
    matmul.dequant_half(dev, out, w).run(dev)
    got = _read(dev, out, (n, k), np.float16)
    np.testing.assert_array_equal(got, ref.astype(np.float16))


@pytest.mark.parametrize("kind", KINDS + ["bf16"])
def test_linear_tensor_cores_quantized(device, kind, m=37, n=128, k=512):
    """Block-quantized and bfloat16 weights: a float16 copy of the weight, then the same
    product; a weight scratch too small keeps the matmul kernel."""
    dev = clops.device(device)
    _tensor_cores(dev)
    w, ref = _weight(dev, kind, n, k)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    xb, yb = _upload(dev, x), dev.alloc(m * n * 4)
    launches = matmul.linear(dev, yb, 0, n, xb, 0, k, w, m)
    product = "gemm_nt_wgmma" if gemm.nt_config(dev, m, n, k) else "gemm_nt_mma"
    assert [ln.kernel.function_name for ln in launches][:3] == \
        ["dequant_half", "half_rows", product]
    for ln in launches:
        ln.run(dev)
    got = _read(dev, yb, (m, n), np.float32)
    want = x.astype(np.float16).astype(np.float64) @ \
        ref.astype(np.float16).astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
    small = dev.alloc(n * k * 2 - 2)
    assert [ln.kernel.function_name for ln in
            matmul.linear(dev, yb, 0, n, xb, 0, k, w, m, wscratch=small)] == ["matmul"]


@pytest.mark.parametrize("m,n,k", [(40, 128, 64), (513, 256, 1024)])
def test_linear_tensor_cores_in_one_plan(device, m, n, k):
    """Two products of the same shape in one launch plan (as a prompt's layers are): each keeps
    its own arguments (the plan sets them once, so the launches may not share a kernel
    object)."""
    from clops.kernels.launch import LaunchPlan

    dev = clops.device(device)
    _tensor_cores(dev)
    plan, ys, wants = LaunchPlan(dev), [], []
    for _ in range(2):
        x = RNG.standard_normal((m, k)).astype(np.float32)
        w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16)
        y = dev.alloc(m * n * 4)
        for ln in matmul.linear(dev, y, 0, n, _upload(dev, x), 0, k,
                                DeviceWeight(dev, pack_float(w, "f16")), m):
            plan.add(ln)
        ys.append(y)
        wants.append(x.astype(np.float16).astype(np.float64) @ w.astype(np.float64).T)
    plan.replay()
    for y, want in zip(ys, wants):
        np.testing.assert_allclose(_read(dev, y, (m, n), np.float32), want, rtol=2e-3,
                                   atol=2e-3 * np.abs(want).max())


def test_nvidia_builds_tensor_core_kernels(device):
    """On an NVIDIA GPU of compute capability 8.0 or later (Ampere, Ada, Hopper) the PTX probe,
    the mma.sync products (gemm_mma, gemm_mma_async) and the decode layer kernel's grid
    barriers pass: each probe answers False on a build failure and the slower path takes over
    silently, so this is where such a failure shows."""
    import pyopencl as cl

    from clops.kernels import layer

    dev = clops.device(device)
    if launch.is_cpu(dev) or dev.backend != "nvidia":
        pytest.skip(f"{dev.name}: not an NVIDIA GPU")
    major = int(dev.cl_device.get_info(cl.device_info.COMPUTE_CAPABILITY_MAJOR_NV))
    if major < 8:
        pytest.skip(f"{dev.name}: compute capability {major}.x, before cp.async")
    assert dev.probe("nvidia_ptx")
    assert gemm.use_mma(dev, "float16")
    assert gemm._async_kernel(dev, gemm.MMA_CONFIGS[0]) is not None
    assert layer.resident_groups(dev) > 0


def test_hopper_builds_wgmma(device):
    """On a Hopper GPU (H100, H200) both wgmma kernels and the tensor-core prompt attention
    build and pass their probes: a build failing there would otherwise leave the slower
    kernels in their place unnoticed (the probes answer False, the tests above follow them)."""
    from clops.kernels import attention

    dev = clops.device(device)
    if launch.is_cpu(dev) or not any(g in dev.name for g in ("H100", "H200", "H800", "H20")):
        pytest.skip(f"{dev.name}: not a Hopper GPU")
    assert gemm.use_wgmma(dev) and gemm.use_nt_wgmma(dev)
    assert attention.prefill_mma(dev, 64)
    # the tensor memory accelerator, where the CUDA driver is there to encode its maps
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    assert tma.cuda(dev) is not None and gemm.tma_builds(dev)
    assert gemm.use_tma(dev) == _config.tma()


@pytest.mark.parametrize("cfg", [dict(BM=128, BN=256, BK=64, STAGES=4, WAITN=1, RASTER=8, WS=4,
                                      PLEAD=3),
                                 dict(BM=64, BN=128, BK=64, STAGES=3, WAITN=0, RASTER=8, WS=2,
                                      PLEAD=2)])
@pytest.mark.parametrize("split", [1, 2])
def test_nt_wgmma_producer_warps(device, cfg, split):
    """gemm_nt_wgmma with producer warps (warp specialization): rows past M (read as the last
    row, not stored), a bias, two slices of K, against numpy (Hopper only)."""
    dev = clops.device(device)
    if launch.is_cpu(dev) or not gemm.use_nt_wgmma(dev):
        pytest.skip("no wgmma (sm_90a) on this device")
    m, n, k = 200, 512, 512
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((n, k)).astype(np.float16)
    bias = RNG.standard_normal(n).astype(np.float32)
    knl = gemm.nt_wgmma_kernel(dev, cfg, split, split == 1, False)
    assert knl is not None
    ba, bb, bbias = _upload(dev, a), _upload(dev, b), _upload(dev, bias)
    c = dev.alloc(split * m * n * 4)
    gemm.run_nt_wgmma(dev, knl, cfg, split, c, ba, bb, bbias, m, n, k)
    got = _read(dev, c, (split, m, n), np.float32).sum(0) + (bias if split == 2 else 0)
    want = a.astype(np.float64) @ b.astype(np.float64).T + bias
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
