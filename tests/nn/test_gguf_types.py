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
from clops.kernels import matmul
from clops.nn.quant import BLOCKS, SUPPORTED_NAMES, UnsupportedFormatError, pack_ggml

from .test_functional import check_quantized_matmul

RNG = np.random.default_rng(63)
NEW = ["Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
# byte offsets of each block's half scales (MXFP4: its exponent byte, at 0)
HALVES = {"Q5_0": (0,), "Q5_1": (0, 2), "Q2_K": (80, 82), "Q3_K": (108,), "Q5_K": (0, 2),
          "IQ4_NL": (0,), "IQ4_XS": (0,)}
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
    # every row through the embedding lookup (the device's layout: rows or the CPU blocks),
    # and columns of the weight picked by unit rows through the product, one row and several
    raw = blocks(kind, n, k)
    want = quants.dequantize(raw, Q[kind]).reshape(n, k)
    table = nn.quantized(raw, ggml_type=int(Q[kind]), shape=(n, k), device=device)
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
