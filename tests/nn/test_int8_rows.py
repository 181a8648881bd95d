"""The batched engine's int8 rows (``matmul.matmul_qrows``: a batch's rows quantized to int8,
then every weight chunk read once for several rows, by dp4a or by the int8 tensor cores'
``matmul_qmma``), forced on whatever device the tests use (the plain-C dot product, and the
tensor cores' instruction emulated, where the device has no NVIDIA PTX): against numpy through
the int8 activations it computes, and a row's values the same whatever the batch around it."""

from __future__ import annotations

import numpy as np
import pytest

import clops
import clops.nn as nn
import clops.nn.quant as quant
from clops.kernels import launch, matmul

from .test_functional import ggml_weight, q8_1_activations

# (a GPU path run on the CPU device: .ci/run's second pass leaves it out)
pytestmark = pytest.mark.standin

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True, params=["default", "wide-teams", "one-row-tiles", "mma",
                                      "mma-split"])
def _gpu_rows(monkeypatch, request):
    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")  # row-major weights
    monkeypatch.setattr(matmul, "int8_batch",
                        lambda dev, w: w.fmt in matmul.INT8_FORMATS and not w.defines.get("QMIN"))
    # (LSIZE, NCOL, CPT, TM, UNR): the default; teams of 64 (their warps' sums meet in local
    # memory on NVIDIA), one column each, several chunks in flight; a row a work-item
    geometry = {"default": None, "wide-teams": (64, 2, 1, 4, 3),
                "one-row-tiles": (16, 8, 4, 1, 1)}.get(request.param)
    monkeypatch.setattr(matmul, "QROWS_OVERRIDE", geometry)
    # the tensor cores' product (matmul_qmma, its instruction emulated where the device has no
    # NVIDIA PTX), (KS, RT): one warp a group and a tile of 8 rows; 2 warps splitting k, 16 rows
    mma = {"mma": (1, 1), "mma-split": (2, 2)}.get(request.param)
    monkeypatch.setattr(matmul, "QMMA_OVERRIDE", mma)


def _weight(dev, kind, n, k):
    w, ref = ggml_weight(dev, kind, n, k, RNG)
    return w, ref.astype(np.float64)


def _buf(dev, a):
    a = np.ascontiguousarray(a, np.float32)
    b = dev.alloc(max(a.nbytes, 4))
    dev.write(b, a, blocking=True)
    return b


def _run(dev, w, x, *, ldx=None, norm=None, glu=False, bias=None, accum=None, rows=None,
         act="silu"):
    """y of x's rows through matmul_qrows (k = w.k; x rows of ldx values)."""
    m = x.shape[0]
    n = w.n
    scratch = matmul.qrows_scratch(dev, rows or m, w.k)
    yb = _buf(dev, accum if accum is not None else np.zeros((m, n), np.float32))
    nb = (_buf(dev, norm[0]), norm[1]) if norm is not None else None
    lns = matmul.matmul_qrows(dev, yb, 0, n, _buf(dev, x), 0, ldx or x.shape[1], w, m, scratch,
                              bias=_buf(dev, bias) if bias is not None else None,
                              accum=accum is not None, norm=nb, glu=glu, act=act)
    product = "matmul_qrows" if matmul.qmma_geometry(dev, w) is None else "matmul_qmma"
    assert [ln.kernel.function_name for ln in lns] == ["quantize_rows", product]
    for ln in lns:
        ln.run(dev)
    out = np.empty((m, n), np.float32)
    dev.read(out, yb)
    return out


def _device_glu(dev, gu, act):
    """act(gate) * up of rows [gate | up], by the device's own GLU kernel."""
    from clops.kernels import activation

    m, f = gu.shape[0], gu.shape[1] // 2
    hb = dev.alloc(m * f * 4)
    activation.glu(dev, hb, _buf(dev, gu), m=m, f=f, act=act).run(dev)
    out = np.empty((m, f), np.float32)
    dev.read(out, hb)
    return out


def _check(got, xin, w_ref, add=0.0):
    emu = q8_1_activations(xin) @ w_ref.T + add
    np.testing.assert_allclose(got, emu, rtol=1e-4, atol=1e-4 * np.abs(emu).max())
    want = xin.astype(np.float64) @ w_ref.T + add
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 3e-2


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS",
                                  "MXFP4", "IQ4_NL", "Q5_0", "Q3_K"])
@pytest.mark.parametrize("m", [1, 5, 19])
def test_int8_rows_against_numpy(device, kind, m, n=48, k=512):
    dev = clops.device(device)
    w, w_ref = _weight(dev, kind, n, k)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    x[0, :32] = 0.0  # a block of zeros: scale 0, no division by it
    _check(_run(dev, w, x), x, w_ref)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("n,k", [(37, 96), (130, 64), (33, 2048)])
def test_int8_rows_ragged(device, kind, n, k):
    # output counts not multiples of a group's columns; rows of fewer chunks than a team has
    # work-items, or no multiple of LSIZE * UNR
    dev = clops.device(device)
    w, w_ref = _weight(dev, kind, n, k)
    x = RNG.standard_normal((7, k)).astype(np.float32)
    _check(_run(dev, w, x), x, w_ref)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
def test_int8_rows_do_not_depend_on_the_batch(device, kind, n=40, k=256):
    """A row's values are the same alone, first, last or among others (bit for bit), and with
    a scratch sized for more rows than the call has."""
    dev = clops.device(device)
    w, _ = _weight(dev, kind, n, k)
    x = RNG.standard_normal((13, k)).astype(np.float32) * \
        RNG.uniform(0.1, 10, (13, 1)).astype(np.float32)
    whole = _run(dev, w, x)
    for i in (0, 6, 12):
        np.testing.assert_array_equal(_run(dev, w, x[i:i + 1], rows=16)[0], whole[i])
    perm = RNG.permutation(13)
    np.testing.assert_array_equal(_run(dev, w, x[perm]), whole[perm])
    np.testing.assert_array_equal(_run(dev, w, x[3:9]), whole[3:9])


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K"])
def test_int8_rows_norm_glu_bias_accum(device, kind, n=48, k=256):
    """RMSNorm(x) * nw folded in (the rows' 1/rms applied to the sums), the GLU of [gate | up]
    rows folded in, a bias, and accumulation into y."""
    dev = clops.device(device)
    w, w_ref = _weight(dev, kind, n, k)
    m, eps = 6, 1e-5
    x = RNG.standard_normal((m, k)).astype(np.float32) * 3
    nw = RNG.uniform(0.5, 1.5, k).astype(np.float32)
    got = _run(dev, w, x, norm=(nw, eps))
    rms = 1 / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + eps)
    emu = (q8_1_activations(x * nw) @ w_ref.T) * rms
    np.testing.assert_allclose(got, emu, rtol=1e-4, atol=1e-4 * np.abs(emu).max())

    gu = RNG.standard_normal((m, 2 * k)).astype(np.float32)
    g, u = gu[:, :k].astype(np.float64), gu[:, k:].astype(np.float64)
    # (the emulation quantizes the GLU's values as the device computes them, activation.glu:
    # one ulp of a host's exp can move a value across an int8 rounding boundary)
    h = _device_glu(dev, gu, "silu")
    np.testing.assert_allclose(h, g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)
    _check(_run(dev, w, gu, ldx=2 * k, glu=True), h, w_ref)
    # (Gemma's GELU, tanh form, as activation.glu computes it)
    h = _device_glu(dev, gu, "gelu_tanh")
    np.testing.assert_allclose(
        h, 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3))) * u,
        rtol=1e-5, atol=1e-6)
    _check(_run(dev, w, gu, ldx=2 * k, glu=True, act="gelu_tanh"), h, w_ref)

    b = RNG.standard_normal(n).astype(np.float32)
    y0 = RNG.standard_normal((m, n)).astype(np.float32)
    _check(_run(dev, w, x, bias=b, accum=y0), x, w_ref, add=b + y0.astype(np.float64))


def test_int8_rows_refuse_what_they_cannot_do(device):
    dev = clops.device(device)
    w, _ = _weight(dev, "Q8_0", 32, 64)
    x = _buf(dev, np.zeros((4, 64)))
    with pytest.raises(ValueError, match="fewer than 4 rows"):
        matmul.matmul_qrows(dev, x, 0, 32, x, 0, 64, w, 4, matmul.qrows_scratch(dev, 3, 64))
    f = nn.quantized(np.zeros((32, 64), np.float32), "bf16", device=dev)
    with pytest.raises(ValueError, match="takes q4, q8"):
        matmul.matmul_qrows(dev, x, 0, 32, x, 0, 64, f, 4, matmul.qrows_scratch(dev, 4, 64))
    with pytest.raises(ValueError, match="do not go together"):
        matmul.matmul_qrows(dev, x, 0, 32, x, 0, 64, w, 4, matmul.qrows_scratch(dev, 4, 64),
                            norm=(x, 1e-6), glu=True)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1"])
def test_int8_rows_grouped_by_expert(device, kind, n_e=4, n=32, k=128):
    """A mixture of experts' grouped product: each tile of TM rows meets its expert's weights
    and bias; a padding tile (expert -1) leaves its rows of y as they were."""
    dev = clops.device(device)
    w, w_ref = _weight(dev, kind, n_e * n, k)
    tm = matmul.qrows_tile(dev, w)
    tiles = np.array([2, -1, 0, 3, 2], np.int32)
    m = len(tiles) * tm
    x = RNG.standard_normal((m, k)).astype(np.float32)
    bias = RNG.standard_normal(n_e * n).astype(np.float32)
    y0 = np.full((m, n), 7.0, np.float32)
    yb = _buf(dev, y0)
    lns = matmul.matmul_qrows(dev, yb, 0, n, _buf(dev, x), 0, k, w, m,
                              matmul.qrows_scratch(dev, m, k), bias=_buf(dev, bias),
                              experts=(_buf(dev, tiles.view(np.float32)), n_e))
    for ln in lns:
        ln.run(dev)
    got = np.empty((m, n), np.float32)
    dev.read(got, yb)
    for t, e in enumerate(tiles):
        rows = slice(t * tm, (t + 1) * tm)
        if e < 0:
            np.testing.assert_array_equal(got[rows], y0[rows])
        else:
            _check(got[rows], x[rows], w_ref[e * n:(e + 1) * n], add=bias[e * n:(e + 1) * n])
    if tm == 1:
        return
    with pytest.raises(ValueError, match="tm="):  # rows no multiple of the tile
        matmul.matmul_qrows(dev, yb, 0, n, yb, 0, k, w, m - 1, matmul.qrows_scratch(dev, m, k),
                            experts=(yb, n_e))


@pytest.mark.parametrize("kind, ptx, chosen", [("Q8_0", True, (8, 2)), ("Q8_0", False, None),
                                               ("Q4_0", True, None), ("Q6_K", True, None)])
def test_int8_rows_take_the_tensor_cores_for_8_bit_weights(device, monkeypatch, kind, ptx,
                                                           chosen):
    # The engine's choice (no override): 8-bit weights with a scale per 32 on NVIDIA's int8
    # tensor cores, one geometry for every row count; 4-bit weights and Q6_K's scales per 16 on
    # the dp4a kernel; nothing where the device has no NVIDIA PTX.
    monkeypatch.setattr(matmul, "QMMA_OVERRIDE", None)
    w, _ = _weight(device, kind, 32, 256)
    probe = device.probe

    def fake(name, *a, **kw):
        return ptx if name == "nvidia_ptx" else probe(name, *a, **kw)

    monkeypatch.setattr(device, "probe", fake)
    assert matmul.qmma_geometry(device, w) == chosen
    assert matmul.qrows_rows(device, w) == (16 if chosen else matmul.qrows_geometry(device, w)[3])
