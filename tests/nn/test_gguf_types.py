"""The GGUF weight types Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS and MXFP4: their values on
the host and on the device equal ``gguf.quants.dequantize`` bit for bit (random blocks and the
special values: zero, negative and tiny scales, extreme sub-scales, all-zero and all-max
quants), their products are float32 products of those values, and the types clops cannot
compute with are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

import clops
import clops.nn as nn
from clops.kernels import layer, matmul, native_cpu
from clops.nn.quant import BLOCKS, SUPPORTED_NAMES, DeviceWeight, UnsupportedFormatError, pack_ggml

from .test_functional import check_quantized_matmul

RNG = np.random.default_rng(63)
NEW = ["Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
# the types whose values carry a min term: int8 values and a (scale, min) pair per group, the
# group, and the most bytes clops keeps per byte of the file (1 + 8 / group bytes a value)
WITH_MIN = {"Q5_1": (32, 1.5), "Q5_K": (32, 1.82), "Q2_K": (16, 4.58)}
# byte offsets of each block's half scales (MXFP4: its exponent byte, at 0)
HALVES = {"Q5_0": (0,), "Q5_1": (0, 2), "Q2_K": (80, 82), "Q3_K": (108,), "Q5_K": (0, 2),
          "IQ4_NL": (0,), "IQ4_XS": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}
# scales of the random rows: normal, negative, zero, half subnormals, large
SPECIAL_HALVES = np.array([0.0, -0.0, 1.0, -1.0, 6e-8, -3e-5, 2.0**-14, 1000.0, -65504.0],
                          np.float16)


def blocks(kind: str, n: int, k: int, scale: float = 0.01) -> np.ndarray:
    """``n`` rows of ``k`` values of type ``kind`` as file bytes: random blocks whose half
    scales are random finite (about ``scale``), the special halves in turn, and rows of all-zero
    and all-0xFF bytes (extreme sub-scales, all-zero and all-max quants) under those scales.
    Where gguf can quantize to the type, the first rows are its quantization of random values."""
    bs, bb = BLOCKS[int(Q[kind])]
    raw = RNG.integers(0, 256, (n, k // bs, bb), dtype=np.uint8)
    raw[1] = 0
    raw[2] = 255
    if kind == "MXFP4":
        # exponent bytes of normal float32 scales 2^-125..2^12 (a byte of 0 or 1 gives subnormal
        # values: refused, below)
        raw[..., 0] = RNG.integers(2, 140, raw.shape[:2])
        raw[3:5, :, 0] = 127  # a scale of 1/2
    else:
        for at in HALVES[kind]:
            h = (RNG.standard_normal(raw.shape[:2]) * scale).astype(np.float16)
            h.reshape(-1)[: SPECIAL_HALVES.size * 2: 2] = SPECIAL_HALVES
            raw[..., at:at + 2] = h.view(np.uint8).reshape(raw.shape[:2] + (2,))
    out = raw.reshape(n, -1)
    if kind in ("Q5_0", "Q5_1", "MXFP4") and n > 3:
        x = RNG.standard_normal((min(3, n - 3), k)).astype(np.float32)
        out[3:3 + len(x)] = quants.quantize(x, Q[kind])
    return out


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("kind", NEW)
def test_host_values_equal_gguf(kind, n=24, k=512):
    raw = blocks(kind, n, k)
    want = quants.dequantize(raw, Q[kind]).reshape(n, k)
    got = pack_ggml(raw, int(Q[kind]), n, k).dequantize()
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(bits(got), bits(want))


def test_mxfp4_subnormal_scales_are_refused():
    raw = blocks("MXFP4", 3, 64)
    raw[2, 17] = 1  # block 1 of row 2: exponent byte 1, nonzero values
    raw[2, 18:34] = 0x77
    with pytest.raises(UnsupportedFormatError, match="MXFP4 block 1 of row 2"):
        pack_ggml(raw, int(Q.MXFP4), 3, 64)
    raw[2, 18:34] = 0x88  # values 0 (-0 in E2M1) under that scale: exact anywhere
    want = quants.dequantize(raw, Q.MXFP4).reshape(3, 64)
    np.testing.assert_array_equal(bits(pack_ggml(raw, int(Q.MXFP4), 3, 64).dequantize()),
                                  bits(want))


@pytest.mark.parametrize("kind", NEW)
def test_device_values_equal_gguf(device, kind, n=20, k=256):
    raw = blocks(kind, n, k)
    table = nn.quantized(raw, ggml_type=int(Q[kind]), shape=(n, k), device=device)
    check_device_values(device, table, quants.dequantize(raw, Q[kind]).reshape(n, k))


@pytest.mark.parametrize("kind", list(WITH_MIN))
def test_min_types_row_major_on_cpus(device, kind, n=20, k=256):
    # CPUs take the layout rb16; the row-major kernels (GPUs', and CPUs' that cannot run
    # 16-wide vector kernels) read the (scale, min) pairs too
    dev = clops.device(device)
    if dev.kind != "cpu":
        pytest.skip("GPUs take the row-major layout in test_device_values_equal_gguf")
    raw = blocks(kind, n, k)
    table = DeviceWeight(dev, pack_ggml(raw, int(Q[kind]), n, k), layout="rows")
    check_device_values(device, table, quants.dequantize(raw, Q[kind]).reshape(n, k))


def check_device_values(device, table, want):
    # every row through the embedding lookup (the weight's layout: rows or the CPU blocks),
    # and columns of the weight picked by unit rows through the product, one row and several
    n, k = want.shape
    ids = np.arange(n, dtype=np.int32)[::-1].copy()
    got = np.asarray(nn.embedding(clops.asarray(ids, device=device), table))
    np.testing.assert_array_equal(bits(got), bits(want[ids]))
    for m in (1, 7):
        cols = RNG.choice(k, m, replace=False)
        x = np.zeros((m, k), np.float32)
        x[np.arange(m), cols] = 1.0
        got = np.asarray(nn.linear(clops.asarray(x, device=device), table))
        if matmul.int8_rows(device, m, table) or matmul.tensor_core_rows(device, m, table):
            # paths that round the rows (int8) or the weights (float16) first: their own bounds
            check_quantized_matmul(device, got, x, want, np.zeros(n), table)
        else:
            # (a sum of products: -0.0 comes out +0.0)
            np.testing.assert_array_equal(bits(got), bits(want[:, cols].T + 0.0))


@pytest.mark.parametrize("kind, fmt, most, k", [
    ("Q4_K", "k4", 1.06, 512), ("Q5_K", "k5", 1.06, 512), ("Q6_K", "k6", 1.06, 512),
    ("IQ4_XS", "i4", 1.12, 512), ("MXFP4", "m4", 1.12, 512), ("MXFP4", "m4", 1.12, 2880),
    ("IQ4_NL", "n4", 1.12, 512), ("IQ4_NL", "n4", 1.12, 2880), ("Q5_0", "h5", 1.06, 512),
    ("Q5_0", "h5", 1.06, 2880), ("Q3_K", "k6", 1.97, 512)])
def test_compact_k_quants(device, kind, fmt, most, k, n=20):
    """The K-quants, IQ4_XS, MXFP4, IQ4_NL and Q5_0 in the row layout keep about the file's
    size (k4, k5, k6, i4, m4, n4, h5: values, sub-scales and super-scales as the file packs
    them, rows padded to 16 bytes; i4's sub-scale byte and m4's exponent byte twice a group,
    n4's and h5's half scale in a group's two sub-scale bytes) with GGUF's values bit for bit,
    special values included, on the host and through the device's kernels (m4, n4, h5: rows of
    any multiple of 32 values, as gpt-oss's 2880); the CPU layout takes their earlier forms
    with the same values."""
    raw = blocks(kind, n, k)
    want = quants.dequantize(raw, Q[kind]).reshape(n, k)
    p = pack_ggml(raw, int(Q[kind]), n, k)
    assert p.fmt == fmt
    assert raw.nbytes < p.nbytes <= most * raw.nbytes
    np.testing.assert_array_equal(bits(p.dequantize()), bits(want))
    e = p.expanded()
    assert e.fmt == {"Q4_K": "q4", "Q5_K": "q8m", "Q6_K": "q8", "IQ4_XS": "q8",
                     "MXFP4": "q8", "IQ4_NL": "q8", "Q5_0": "q8", "Q3_K": "q8"}[kind]
    np.testing.assert_array_equal(bits(e.dequantize()), bits(want))
    dev = clops.device(device)
    assert DeviceWeight(dev, p, layout="rb16").fmt == e.fmt
    table = DeviceWeight(dev, p, layout="rows")
    assert table.fmt == p.fmt and table.nbytes == p.nbytes
    check_device_values(device, table, want)


@pytest.mark.parametrize("kind", list(WITH_MIN))
def test_min_types_keep_int8_values(device, kind, n=16, k=512):
    # int8 values and a (scale, min) pair per group: about the file's size, not float32's 4
    # bytes a value
    group, most = WITH_MIN[kind]
    raw = blocks(kind, n, k)
    # (Q5_K's compact form is the row layout's; the CPU layout and the experts read this one)
    p = pack_ggml(raw, int(Q[kind]), n, k).expanded()
    assert (p.fmt, p.group, p.data.dtype) == ("q8m", group, np.int8)
    assert p.nbytes == n * k + n * (k // group) * 2 * p.scales.dtype.itemsize
    assert p.nbytes <= most * raw.nbytes
    assert 2 * p.nbytes < 4 * n * k
    w = DeviceWeight(clops.device(device), p, layout="rb16" if kind == "Q5_K" else None)
    assert w.nbytes == p.nbytes  # 16 rows: no padding in the CPU blocks either
    # the paths written for weights without mins do not take them (the float paths do)
    assert w.defines["QMIN"] == 1
    assert not matmul.int8_activations(clops.device(device), 1, w.fmt, k)
    assert not native_cpu.takes(clops.device(device), w)
    assert not layer.takes(clops.device(device), [w] * 4, 64)


@pytest.mark.parametrize("kind", NEW)
@pytest.mark.parametrize("m", [1, 5, 19])
def test_products_of_dequantized_values(device, kind, m, n=48, k=512):
    raw = blocks(kind, n + 9, k)[9:]  # random blocks (the special ones have huge scales)
    w_ref = quants.dequantize(raw, Q[kind]).reshape(n, k)
    w = nn.quantized(raw, ggml_type=int(Q[kind]), shape=(n, k), device=device)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    got = np.asarray(nn.linear(clops.asarray(x, device=device), w,
                               clops.asarray(b, device=device)))
    check_quantized_matmul(device, got, x, w_ref, b, w)


@pytest.mark.parametrize("kind", ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
                                  "IQ3_S", "TQ1_0", "TQ2_0", "Q8_1", "Q8_K"])
def test_other_types_are_refused_by_name(kind):
    with pytest.raises(UnsupportedFormatError) as e:
        pack_ggml(np.zeros(1024, np.uint8), int(Q[kind]), 1, 256)
    for name in SUPPORTED_NAMES:
        assert name in str(e.value)


@pytest.mark.parametrize("kind", list(WITH_MIN))
def test_min_types_huge_values_are_refused(kind, n=12, k=256):
    # the load's check of a weight's magnitudes reads the (scale, min) pairs: values past
    # MAX_WEIGHT (a corrupt file's) are refused, ordinary ones pass
    from clops.llm.weights import MAX_WEIGHT, ModelFileError, _check_values

    bs, bb = BLOCKS[int(Q[kind])]
    raw = blocks(kind, n + 9, k)[9:]  # random blocks (the first rows have huge scales)
    b = raw.reshape(n, k // bs, bb)
    for at in HALVES[kind]:
        b[..., at:at + 2] = np.array([0.01], np.float16).view(np.uint8)  # every d and dmin
    _check_values("w", pack_ggml(raw, int(Q[kind]), n, k))
    for at in HALVES[kind]:
        b[2, :, at:at + 2] = np.array([60000.0], np.float16).view(np.uint8)
    assert np.abs(quants.dequantize(raw, Q[kind])).max() >= MAX_WEIGHT
    with pytest.raises(ModelFileError, match="the scales of row 2"):
        _check_values("w", pack_ggml(raw, int(Q[kind]), n, k))


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K", "Q3_K", "IQ4_XS", "MXFP4", "IQ4_NL",
                                  "Q5_0"])
def test_compact_rows_are_the_reference_packers(kind, n=12, k=512):
    """The packers build the compact rows straight from the file's bytes; the same rows come
    out of the plain packer (``_kq_pack``) given their values, sub-scale and super-scale bytes
    one by one, byte for byte (the layout ``matmul.cl`` reads)."""
    from clops.nn import quant

    p = pack_ggml(blocks(kind, n, k), int(Q[kind]), n, k)
    q = quant._kq_decode(p)[0]
    rows = p.data.reshape(n, -1)
    so, po = quant._kq_sub_offset(p.fmt, k), quant._kq_sup_offset(p.fmt, k)
    ref = quant._kq_pack(p.fmt, q, rows[:, so:so + k // 16], rows[:, po:po + k // 64])
    np.testing.assert_array_equal(ref.data, p.data)
    assert (ref.fmt, ref.group) == (p.fmt, p.group)


@pytest.mark.parametrize("kind", NEW + ["Q4_K", "Q6_K"])
def test_packing_in_runs_of_rows_gives_the_whole_tensors_rows(kind, monkeypatch, n=14, k=512):
    """``pack_ggml`` packs a large tensor in runs of rows (``PACK_CHUNK`` bytes): the same
    weight, byte for byte, as one run (here runs of 3 rows and a last one of 2)."""
    from clops.nn import quant

    raw = blocks(kind, n, k)
    whole = pack_ggml(raw, int(Q[kind]), n, k)
    bs, bb = BLOCKS[int(Q[kind])]
    monkeypatch.setattr(quant, "PACK_CHUNK", 3 * bb * (k // bs))
    runs = pack_ggml(raw, int(Q[kind]), n, k)
    assert (runs.fmt, runs.n, runs.k, runs.group) == (whole.fmt, whole.n, whole.k, whole.group)
    np.testing.assert_array_equal(runs.data, whole.data)
    if whole.scales is not None:
        np.testing.assert_array_equal(runs.scales, whole.scales)
    if kind == "MXFP4":  # (a refused block's row counts from the tensor's start)
        raw[11, 17] = 1
        raw[11, 18:34] = 0x77
        with pytest.raises(UnsupportedFormatError, match="MXFP4 block 1 of row 11"):
            pack_ggml(raw, int(Q[kind]), n, k)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q3_K"])
def test_fused_experts_keep_the_files_scales(kind, e=4, f=4, k=512):
    """A mixture of experts' [gate | up] weight made of the CPU forms (as a CPU device loads
    them) keeps the file's scales beside the float ones (the native products read those), each
    expert's gate rows then its up rows."""
    from clops.nn.quant import concat_experts

    raw = blocks(kind, 2 * e * f, k)
    gate = pack_ggml(raw[:e * f], int(Q[kind]), e * f, k).expanded()
    up = pack_ggml(raw[e * f:], int(Q[kind]), e * f, k).expanded()
    fused = concat_experts(gate, up, e)
    assert fused is not None and fused.split is not None
    want = np.concatenate([gate.dequantize().reshape(e, f, k), up.dequantize().reshape(e, f, k)],
                          axis=1).reshape(-1, k)
    np.testing.assert_array_equal(bits(fused.dequantize()), bits(want))
    sp = fused.split
    for name in ("sup", "sub"):
        a, b = getattr(gate.split, name), getattr(up.split, name)
        np.testing.assert_array_equal(getattr(sp, name), np.concatenate(
            [a.reshape(e, f, *a.shape[1:]), b.reshape(e, f, *b.shape[1:])], axis=1
        ).reshape(-1, *a.shape[1:]))
