"""The CPU layout of weights (``rb16``: 16 rows interleaved, ``kernels/matmul_cpu.cl``) against
numpy, forced on whatever device the tests use: every format, row counts that take each tile
size and the shifted last tile, column counts past a block, bias and accumulation, RMSNorm
folded in, the GLU given by the product, several column blocks per work-item, and the same
sums for a row whatever the batch (row_invariant)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

import clops
from clops.kernels import attention, matmul, native_cpu
from clops.nn.quant import DeviceWeight, interleave_rows, pack_float, pack_ggml, q4_symmetric

from .test_functional import _random_k_quant

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _opencl_products(monkeypatch):
    # these are matmul_cpu.cl's products: the native ones (int8 rows) have their own tests
    # (tests/kernels/test_native_cpu.py)
    monkeypatch.setattr(native_cpu, "takes", lambda dev, w: False)
KINDS = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "f32", "f16", "bf16"]


def _packed(kind: str, n: int, k: int):
    """A packed weight of ``kind`` and its float64 values (K-quants: k rounded up to 256)."""
    if kind in ("Q4_K", "Q6_K"):
        k = -(-k // 256) * 256
    if kind in ("f32", "f16", "bf16"):
        w = RNG.standard_normal((n, k)).astype(np.float32)
        p = pack_float(w, kind)
        return p, p.dequantize().astype(np.float64)
    t = Q[kind]
    raw = _random_k_quant(t, n, k) if t in (Q.Q4_K, Q.Q6_K) else \
        quants.quantize(RNG.standard_normal((n, k)).astype(np.float32), t)
    # (the form the CPU layout reads: Q6_K's int8 values, not the row layout's compact one)
    return (pack_ggml(raw, int(t), n, k).expanded(),
            quants.dequantize(raw, t).reshape(n, k).astype(np.float64))


def _up(dev, a):
    a = np.ascontiguousarray(a)
    buf = dev.alloc(max(a.nbytes, 4))
    dev.write(buf, a, blocking=True)
    return buf


def _run(dev, w, x, n_out, ldy=None, y0=None, **kw):
    m, k = x.shape
    ldy = ldy or n_out
    y = _up(dev, y0 if y0 is not None else np.zeros((m, ldy), np.float32))
    matmul.matmul(dev, y, 0, ldy, _up(dev, x), 0, k, w, m, **kw).run(dev)
    out = np.empty((m, ldy), np.float32)
    dev.read(out, y)
    return out[:, :n_out]


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_interleave_rows_keeps_every_value():
    p, ref = _packed("Q4_1", 40, 64)
    data, scales = interleave_rows(p)
    assert data.shape == (3, 2, 16, 16) and scales.shape == (3, 2, 2, 16)  # 40 rows -> 48
    # row 37, group 1, byte 5: value 5 (low nibble) and 21 (high) of its second group
    byte = data[2, 1, 5, 37 % 16]
    d, mn = scales[2, 1, :, 37 % 16].astype(np.float64)
    assert (byte & 15) * d + mn == pytest.approx(ref[37, 32 + 5])
    assert (byte >> 4) * d + mn == pytest.approx(ref[37, 32 + 21])
    assert not data[2, :, :, 8:].any()  # the padding rows


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 13])
def test_products_of_every_format(device, kind, m, n=40, k=96):
    p, ref = _packed(kind, n, k)
    w = DeviceWeight(device, p, layout="rb16")
    x = RNG.standard_normal((m, p.k)).astype(np.float32)
    _close(_run(device, w, x, n), x @ ref.T)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "f16"])
def test_bias_accumulation_and_row_stride(device, kind, m=9, n=24, k=64):
    p, ref = _packed(kind, n, k)
    w = DeviceWeight(device, p, layout="rb16")
    x = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    y0 = RNG.standard_normal((m, n + 8)).astype(np.float32)  # rows 32 apart, 24 used
    got = _run(device, w, x, n, ldy=n + 8, y0=y0, bias=_up(device, b), accum=True)
    _close(got, y0[:, :n] + x @ ref.T + b)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_K", "Q8_0", "Q6_K", "f32", "bf16"])
@pytest.mark.parametrize("m", [1, 6])
def test_rmsnorm_folded_in(device, kind, m, n=48, k=128, eps=1e-5):
    p, ref = _packed(kind, n, k)
    w = DeviceWeight(device, p, layout="rb16")
    x = (RNG.standard_normal((m, p.k)) * 3).astype(np.float32)
    nw = RNG.standard_normal(p.k).astype(np.float32)
    got = _run(device, w, x, n, norm=(_up(device, nw), eps))
    xn = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * nw
    _close(got, xn @ ref.T)


@pytest.mark.parametrize("kind", ["Q4_1", "Q6_K", "f16"])
@pytest.mark.parametrize("m", [1, 4])
def test_the_product_gives_the_glu(device, kind, m, f=48, k=64):
    p, ref = _packed(kind, 2 * f, k)  # [gate | up]
    w = DeviceWeight(device, p, layout="rb16")
    assert matmul.glu_output(w)
    x = RNG.standard_normal((m, p.k)).astype(np.float32)
    b = RNG.standard_normal(2 * f).astype(np.float32)
    got = _run(device, w, x, f, bias=_up(device, b), glu_out=True)
    gu = x @ ref.T + b
    g, u = gu[:, :f], gu[:, f:]
    _close(got, g / (1 + np.exp(-g)) * u)
    with pytest.raises(ValueError, match="accum"):
        _run(device, w, x, f, glu_out=True, accum=True)


def test_glu_needs_halves_of_whole_blocks(device):
    p, _ = _packed("Q8_0", 48, 32)  # halves of 24 rows
    w = DeviceWeight(device, p, layout="rb16")
    assert not matmul.glu_output(w)
    with pytest.raises(ValueError, match="multiple of 16"):
        _run(device, w, np.ones((1, 32), np.float32), 24, glu_out=True)


@pytest.mark.parametrize("blocks", [2, 4])
def test_several_column_blocks_per_work_item(device, monkeypatch, blocks, n=100, k=64):
    monkeypatch.setattr(matmul, "RB_BLOCKS", blocks)
    p, ref = _packed("Q4_1", n, k)
    w = DeviceWeight(device, p, layout="rb16")
    x = RNG.standard_normal((1, k)).astype(np.float32)
    _close(_run(device, w, x, n), x @ ref.T)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "f16"])
def test_a_rows_sums_do_not_depend_on_the_batch(device, kind, n=32, k=96):
    """row_invariant (the batch engine): each row's result is the same bits whatever the rows
    per work-item and the rows beside it."""
    p, ref = _packed(kind, n, k)
    w = DeviceWeight(device, p, layout="rb16")
    x = RNG.standard_normal((8, k)).astype(np.float32)
    alone = np.concatenate([_run(device, w, x[i:i + 1], n, row_invariant=True)
                            for i in range(8)])
    for tm in (1, 2, 4, 8):
        got = _run(device, w, x, n, tm=tm, row_invariant=True)
        np.testing.assert_array_equal(got, alone)
    _close(alone, x @ ref.T)


def test_embedding_reads_the_cpu_layout(device, n=40, k=64):
    for kind in ("Q4_0", "Q4_1", "Q6_K", "bf16"):
        p, ref = _packed(kind, n, k)
        w = DeviceWeight(device, p, layout="rb16")
        ids = np.array([0, 17, 39, 5], np.int32)
        k = p.k
        out = device.alloc(len(ids) * k * 4)
        state = _up(device, np.zeros(4, np.int32))
        matmul.embedding(device, out, _up(device, ids), state, w, len(ids)).run(device)
        got = np.empty((len(ids), k), np.float32)
        device.read(got, out)
        np.testing.assert_allclose(got, ref[ids], rtol=1e-6, atol=1e-6)


def test_cpus_take_the_cpu_layout(device):
    p, _ = _packed("Q4_1", 16, 32)
    assert DeviceWeight(device, p).layout == ("rb16" if device.kind == "cpu" else "rows")
    with pytest.raises(ValueError, match="layout"):
        DeviceWeight(device, p, layout="columns")
    if device.kind == "cpu":
        w = clops.nn.quantized(np.ones((16, 32), np.float32), "f16", device=device)
        assert w.layout == "rb16"


def test_a_runtime_failing_the_product_probe_keeps_row_major_kernels(device, monkeypatch):
    """A CPU runtime that cannot build 16-wide vector kernels (PoCL 3.0 of the pip wheel drops
    them) keeps the row-major layout and the portable attention kernels."""
    import clops.kernels.gemm as gemm

    monkeypatch.setattr(gemm, "cpu_kernel_works", lambda dev, dtype: False)
    p, ref = _packed("Q4_1", 16, 32)
    w = DeviceWeight(device, p)
    assert w.layout == "rows"
    assert not attention.cpu_vectors(device) and not attention.cpu_decode(device, 64)
    x = RNG.standard_normal((3, 32)).astype(np.float32)
    _close(_run(device, w, x, 16), x @ ref.T)


@pytest.mark.parametrize("layout", ["rb16", "rows"])
def test_q4_0_keeps_its_scales_alone(device, layout, n=48, k=64):
    """Q4_0's mins are -8 x its scales: both layouts store the scales only (18 bytes per 32
    values, as the file), Q4_1's keeps both; a min that differs anywhere keeps both. The
    products of the row layout's kernels (GPUs) make the mins themselves: the same values."""
    p0, ref = _packed("Q4_0", n, k)
    p1, _ = _packed("Q4_1", n, k)
    assert q4_symmetric(p0) and not q4_symmetric(p1)
    w0 = DeviceWeight(device, p0, layout=layout)
    assert w0.q4_sym and w0.nbytes == n * k // 32 * 18
    assert w0.defines["Q4_SYM"] == 1
    assert not DeviceWeight(device, p1, layout=layout).q4_sym
    if layout == "rows":
        x = RNG.standard_normal((3, k)).astype(np.float32)
        _close(_run(device, w0, x, n), x @ ref.T)
    sc = p0.scales.copy()
    sc[3, 1, 1] += np.float16(0.5)
    assert not q4_symmetric(type(p0)(p0.fmt, n, k, p0.data, sc, p0.group))
