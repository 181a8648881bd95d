"""nn, weight formats: float and GGUF block-quantized weights repacked (on the host, with numpy)
into the layouts the matmul and embedding kernels read, and uploaded to the device still
quantized.

Device formats (``kernels/matmul.cl`` spells out the layouts):

- ``f32``, ``f16``, ``bf16``: row-major ``[N, K]``.
- ``q4``: 4-bit values, a (scale, min) pair per 32; from Q4_0, Q4_1 (half scales, exact) and
  Q4_K's ``k4`` (``PackedWeight.expanded``: float scales, the 6-bit sub-scales times the
  super-block scale, exact).
- ``q8``: int8 values, a scale per 32 or per 16, half where the file's scale is one (Q8_0, Q5_0
  less 16, IQ4_NL's table values), else float, the file's scale times its sub-scale computed as
  GGUF does (Q6_K less 32 and Q3_K, per 16; IQ4_XS, and MXFP4's doubled E2M1 values times its
  power-of-two scale, per 32).
- ``q8m``: the values of a type with a min term, int8, and a (scale, min) pair per 32 or per
  16, value = (q * scale) + min rounded twice as GGUF computes it (q * scale is exact in
  float32 for these types, so a fused multiply-add gives the same value): Q5_1 (its half
  d and m; 5-bit q), Q5_K (d * sub-scale and -(dmin * sub-min) per 32, float; 5-bit q) and Q2_K
  (the same per 16; 2-bit q). 1 byte a value and 8 bytes per group (Q5_1: 4), 1.125 to 1.5
  bytes a value, not float32's 4. The kernels see ``WFMT`` 4 with ``QMIN`` 1; products that
  quantize their rows to int8 (the GPU decode row, the native CPU kernels) and the fused decode
  layers do not take it, the float paths do.
- ``k4``, ``k5``, ``k6``: Q4_K, Q5_K and Q6_K as compactly as in the file (0.58, 0.70 and 0.82
  bytes a value against ``q4``'s 0.75 and ``q8m``'s and ``q8``'s 1.25), for the row layout
  (GPUs); the CPU layout takes their ``q4``, ``q8m`` and ``q8`` forms
  (``PackedWeight.expanded``). Q3_K takes ``k6`` too (its value (d * (sc - 32)) * q, q in
  -4..3, is Q6_K's with sub-scale sc - 32 and 6-bit value q + 32: 0.82 bytes a value against
  the file's 0.43 and ``q8``'s 1.25). Each row of K values is one run of bytes
  (``kq_row_bytes``): the 4-bit low parts as ``q4`` packs them (16 bytes a group of 32), the
  high bits (none for Q4_K, 4 bytes a group for Q5_K's one bit a value, 8 for Q6_K's two), the
  sub-scales (2 bytes a group: Q4_K's and Q5_K's 6-bit scale and min, Q6_K's two int8 scales
  of 16 values), then the half super-scales of each 256 values (d and dmin; Q6_K's d and a
  zero), padded to 16 bytes. With q unsigned (0..15, 0..31, 0..63), a value is q * s + mn for
  Q4_K and Q5_K (s = d * scale, mn = -(dmin * min)) and (q - 32) * s for Q6_K (s = d *
  sub-scale), as GGUF computes them: each product of halves and small whole numbers exact in
  float32. The high bits of a group are
  laid out for the int8 products: the bit of the value in byte b of the group's 4-byte word w
  (words 0..3 the low nibbles of bytes 4w..4w+3, values 4w..4w+3; words 4..7 their high
  nibbles, values 16+4(w-4)..) is bit 8b + w of the group's word (Q5_K), or bits 8b + 2(w mod
  4) and the next of word w // 4 (Q6_K), so that a shift and a mask place them beside the
  nibbles, 4 values at a time. The kernels see ``WFMT`` 5 with ``KQB`` (high bits a value)
  and ``KQM`` (1: the mins of Q4_K and Q5_K).
- ``i4``: IQ4_XS the same way (0.58 bytes a value against ``q8``'s 1.125; the file's 0.53):
  the 4-bit indices into IQ4's table, a group's int8 sub-scale (less 32) twice, d and a zero
  a 256; value = (d * sub-scale) * table[q]. A group's 16 bytes of indices are four words,
  word i holding values 4i..4i+3 in its low 16 bits and 16+4i..16+4i+3 in its high 16 bits, a
  nibble each, so that NVIDIA's byte permute looks up 4 values at once (``KQT`` 1). The CPU
  layout takes its ``q8`` form.
- ``m4``: MXFP4 the same way (0.58 bytes a value against ``q8``'s 1.125; the file's 0.53): the
  4-bit indices into the doubled E2M1 values as ``i4`` orders them, a group's E8M0 exponent
  byte e twice, no super-scales (zeros); value = 2^(e - 128) * table[q] (``KQT`` 2; e >= 2:
  the packer refuses subnormal scales and gives an all-zero group e = 2). The CPU layout takes
  its ``q8`` form.
- ``n4``: IQ4_NL the same way (0.58 bytes a value against ``q8``'s 1.125; the file's 0.56):
  ``i4``'s indices, a group's half scale d in its two sub-scale bytes, no super-scales (zeros);
  value = d * table[q] (``KQT`` 3). The CPU layout takes its ``q8`` form.
- ``h5``: Q5_0 the same way (0.70 bytes a value against ``q8``'s 1.0625; the file's 0.69):
  ``k5``'s low nibbles and high bits, a group's half scale d in its two sub-scale bytes, no
  super-scales; value = (q - 16) * d (``KQH`` 1). The CPU layout takes its ``q8`` form.

The fused decode layers (``kernels.layer``) read none of the compact formats: the models small
enough for those keep Q4_K's layers in ``q4`` (``llm.model``).

Every value a device reads equals ``gguf.quants.dequantize`` of the file bit for bit.

Layouts: ``rows`` (row-major, as above) on GPUs; ``rb16`` on CPUs (``interleave_rows``,
``kernels/matmul_cpu.cl``): blocks of 16 rows stored value by value, the block's 16 rows side
by side, so that a CPU work-item meets 16 output columns with 16-wide vector arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernels import gemm, matmul
from ..runtime import CLDevice
from ..runtime.pool import Buffer

# GGML type ids (the numbers are the file format's) and their block sizes in values and bytes.
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0 = 0, 1, 2, 3, 8
GGML_Q4_K, GGML_Q6_K, GGML_BF16 = 12, 14, 30
GGML_Q5_0, GGML_Q5_1, GGML_Q2_K, GGML_Q3_K, GGML_Q5_K = 6, 7, 10, 11, 13
GGML_IQ4_NL, GGML_IQ4_XS, GGML_MXFP4 = 20, 23, 39
BLOCKS: dict[int, tuple[int, int]] = {
    GGML_Q4_0: (32, 18), GGML_Q4_1: (32, 20), GGML_Q8_0: (32, 34),
    GGML_Q4_K: (256, 144), GGML_Q6_K: (256, 210),
    GGML_Q5_0: (32, 22), GGML_Q5_1: (32, 24), GGML_Q2_K: (256, 84), GGML_Q3_K: (256, 110),
    GGML_Q5_K: (256, 176), GGML_IQ4_NL: (32, 18), GGML_IQ4_XS: (256, 136), GGML_MXFP4: (32, 17),
}
FLOATS: dict[int, str] = {GGML_F32: "f32", GGML_F16: "f16", GGML_BF16: "bf16"}
SUPPORTED = set(BLOCKS) | set(FLOATS)
# the names of the types above, in the order messages list them
SUPPORTED_NAMES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_0", "Q5_1", "Q5_K", "Q4_0", "Q4_1",
                   "Q4_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "MXFP4")
# IQ4_NL's and IQ4_XS's non-linear 4-bit values; MXFP4's E2M1 values, doubled (0..15 -> int8)
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      np.int8)
E2M1_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
# the bytes a value of each GGML type takes on the device once repacked (the packers below), in
# the CPU layout: placement's estimate of a model's memory before it is uploaded
DEVICE_BYTES: dict[int, float] = {
    GGML_F32: 4, GGML_F16: 2, GGML_BF16: 2, GGML_Q8_0: 1 + 2 / 32, GGML_Q4_0: 0.5 + 2 / 32,
    GGML_Q4_1: 0.5 + 4 / 32, GGML_Q4_K: 0.5 + 8 / 32, GGML_Q6_K: 1 + 4 / 16,
    GGML_Q5_0: 1 + 2 / 32, GGML_IQ4_NL: 1 + 2 / 32, GGML_MXFP4: 1 + 4 / 32, GGML_Q3_K: 1 + 4 / 16,
    GGML_IQ4_XS: 1 + 4 / 32, GGML_Q5_1: 1 + 4 / 32, GGML_Q5_K: 1 + 8 / 32, GGML_Q2_K: 1 + 8 / 16,
}
# ... and in the row layout, where the compact formats keep Q4_K, Q5_K, Q6_K and IQ4_XS about
# as the file does (kq_row_bytes, less a row's padding)
DEVICE_BYTES_ROWS: dict[int, float] = {
    **DEVICE_BYTES, GGML_Q4_K: 0.5 + 2 / 32 + 4 / 256, GGML_Q5_K: 0.5 + 6 / 32 + 4 / 256,
    GGML_Q6_K: 0.5 + 10 / 32 + 4 / 256, GGML_IQ4_XS: 0.5 + 2 / 32 + 4 / 256,
    GGML_MXFP4: 0.5 + 2 / 32 + 4 / 256, GGML_IQ4_NL: 0.5 + 2 / 32 + 4 / 256,
    GGML_Q5_0: 0.5 + 6 / 32 + 4 / 256, GGML_Q3_K: 0.5 + 10 / 32 + 4 / 256,
}
WFMT = {"f32": 0, "f16": 1, "bf16": 2, "q4": 3, "q8": 4, "q8m": 4, "k4": 5, "k5": 5, "k6": 5,
        "i4": 5, "m4": 5, "n4": 5, "h5": 5}
# the compact formats of the row layout: (KQB high bits a value, KQM mins, KQT the 4-bit
# values' table: 1 IQ4's, 2 MXFP4's doubled E2M1 values, 3 IQ4's under a half scale a group)
KQ_FORMATS: dict[str, tuple[int, int, int]] = {"k4": (0, 1, 0), "k5": (1, 1, 0), "k6": (2, 0, 0),
                                               "i4": (0, 0, 1), "m4": (0, 0, 2), "n4": (0, 0, 3),
                                               "h5": (1, 0, 0)}
# ... and those whose groups hold a half scale and no min, value (q - 16) * d (KQH 1)
KQ_HALF = ("h5",)
# the table of each format whose 4-bit values index one
KQ_TABLES = {"i4": IQ4_VALUES, "m4": E2M1_DOUBLED, "n4": IQ4_VALUES}
assert tuple(KQ_FORMATS) == matmul.COMPACT_FORMATS  # (the kernels' list of them)


def kq_row_bytes(fmt: str, k: int) -> int:
    """Bytes of a row of k values in the compact format ``fmt`` (``k4``, ``k5``, ``k6``,
    ``i4``, ``m4``, ``n4``, ``h5``)."""
    hb = KQ_FORMATS[fmt][0]
    return -(-(k // 2 + hb * k // 8 + k // 16 + k // 64) // 16) * 16


class UnsupportedFormatError(ValueError):
    """A tensor is stored in a type clops cannot compute with."""


@dataclass
class PackedWeight:
    """A 2-D weight ``[n, k]`` (row n is output n) in one of the device formats, on the host."""

    fmt: str
    n: int
    k: int
    data: np.ndarray
    scales: np.ndarray | None = None  # q4: [n, k/32, 2]; q8: [n, k/group]; q8m [n, k/group, 2]
    group: int = 32
    # Q4_K and Q6_K: the float scales above as the file holds them, a half per 256 values and
    # a small whole number per group (``Split``), which the native CPU products read instead
    split: Split | None = None

    @property
    def scale_half(self) -> bool:
        return self.scales is not None and self.scales.dtype == np.float16

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.scales is None else self.scales.nbytes)

    def dequantize(self) -> np.ndarray:
        """The float32 values ``[n, k]`` (for tests and host-side references)."""
        if self.fmt in KQ_FORMATS:
            q, s, mn = _kq_decode(self)
            g = q.reshape(self.n, -1, self.group).astype(np.float32)
            if self.fmt in KQ_TABLES:
                return (KQ_TABLES[self.fmt][q.reshape(g.shape)].astype(np.float32)
                        * s[..., None]).reshape(self.n, self.k)
            if self.fmt in ("k6", "h5"):  # (q - 32) s, (q - 16) s: GGUF's -0.0 where s < 0
                off = 32 if self.fmt == "k6" else 16
                return ((g - off) * s[..., None]).reshape(self.n, self.k)
            return (g * s[..., None] + mn[..., None]).reshape(self.n, self.k)
        if self.fmt == "f32":
            return self.data.astype(np.float32)
        if self.fmt == "f16":
            return self.data.view(np.float16).astype(np.float32)
        if self.fmt == "bf16":
            return (self.data.astype(np.uint32) << 16).view(np.float32)
        assert self.scales is not None
        sc = self.scales.astype(np.float32)
        if self.fmt == "q4":
            b = self.data.reshape(self.n, self.k // 32, 16)
            q = np.concatenate([b & 15, b >> 4], axis=-1).astype(np.float32)
            return (q * sc[..., :1] + sc[..., 1:]).reshape(self.n, self.k)
        q = self.data.astype(np.float32).reshape(self.n, self.k // self.group, self.group)
        if self.fmt == "q8m":
            return (q * sc[..., :1] + sc[..., 1:]).reshape(self.n, self.k)
        return (q * sc[..., None]).reshape(self.n, self.k)

    def expanded(self) -> PackedWeight:
        """A weight in a compact format (``k4``, ``k5``, ``k6``, ``i4``, ``m4``, ``n4``, ``h5``)
        in the form the CPU layout reads (``q4``, ``q8m``, then ``q8``: the same values); any
        other weight as it is."""
        if self.fmt not in KQ_FORMATS:
            return self
        n, k = self.n, self.k
        rows = self.data.reshape(n, -1)
        if self.fmt == "k4":  # (its 4-bit values are q4's bytes already: the scales alone)
            s, mn = kq_scales(self)
            so, po = _kq_sub_offset("k4", k), _kq_sup_offset("k4", k)
            split = Split(np.ascontiguousarray(rows[:, po:po + k // 64]).view(np.float16)
                          .reshape(n, k // 256, 2),
                          np.ascontiguousarray(rows[:, so:so + k // 16]).reshape(n, k // 32, 2))
            sm = np.stack([s, mn], axis=-1)
            return PackedWeight("q4", n, k, np.ascontiguousarray(rows[:, :k // 2]), sm, 32,
                                split)
        q, s, mn = _kq_decode(self)
        if self.fmt == "k5":
            return _q8m(n, k, q, s, mn, 32)
        if self.fmt == "h5":  # (q - 16 as int8, the file's half scales)
            return PackedWeight("q8", n, k, (q.astype(np.int16) - 16).astype(np.int8),
                                s.astype(np.float16), 32)
        if self.fmt in KQ_TABLES:  # (n4: its half scales as the file has them)
            return PackedWeight("q8", n, k, KQ_TABLES[self.fmt][q],
                                s.astype(np.float16) if self.fmt == "n4" else s, 32)
        sub = np.ascontiguousarray(rows[:, _kq_sub_offset(self.fmt, k):][:, :k // 16])
        sup = np.ascontiguousarray(rows[:, _kq_sup_offset(self.fmt, k):][:, :k // 64])
        split = Split(sup.view(np.float16).reshape(n, k // 256, 2)[..., :1].copy(),
                      sub.view(np.int8).reshape(n, k // 16, 1))
        q8 = (q - np.uint8(32)).view(np.int8)  # (q - 32, in -32..31)
        return PackedWeight("q8", n, k, q8, s, 16, split)


@dataclass
class Split:
    """A K-quant's scales as its file holds them: ``sup`` float16 ``[n, k/256, c]`` and ``sub``
    (uint8 or int8) ``[n, k/group, c]``; c = 1 (q8, Q6_K): scale = sup * sub; c = 2 (q4, Q4_K):
    scale = sup[0] * sub[0] and min = -(sup[1] * sub[1]). Each product is exact in float32 (an
    11-bit significand times at most 8 bits), so these give the float scales bit for bit."""

    sup: np.ndarray
    sub: np.ndarray


def pack_float(w: np.ndarray, fmt: str = "f32") -> PackedWeight:
    """A float weight ``[n, k]`` (any float numpy dtype; bf16 as uint16 bits) in ``fmt``."""
    if w.ndim != 2:
        raise ValueError(f"a weight must be 2-D, got shape {w.shape}")
    n, k = w.shape
    if k % 32:
        raise ValueError(f"the inner size of a weight must be a multiple of 32, got {k}")
    if fmt == "bf16":
        data = w if w.dtype == np.uint16 else _to_bf16(w.astype(np.float32))
    elif fmt == "f16":
        data = w.astype(np.float16).view(np.uint16)
    elif fmt == "f32":
        data = w.astype(np.float32)
    else:
        raise ValueError(f"unknown float format {fmt!r}")
    return PackedWeight(fmt, n, k, np.ascontiguousarray(data))


def _to_bf16(x: np.ndarray) -> np.ndarray:
    u = x.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16)


def _nibbles_to_q4(v: np.ndarray) -> np.ndarray:
    """Values ``[..., 32]`` in 0..15 -> bytes ``[..., 16]``: byte j = v[j] | v[j+16] << 4."""
    return (v[..., :16] | (v[..., 16:] << 4)).astype(np.uint8)


def pack_ggml(raw: np.ndarray, ggml_type: int, n: int, k: int) -> PackedWeight:
    """Repack the bytes of a GGML tensor with ``n`` rows of ``k`` values."""
    if ggml_type in FLOATS:
        dt = {GGML_F32: np.float32, GGML_F16: np.float16, GGML_BF16: np.uint16}[ggml_type]
        return pack_float(np.asarray(raw).view(dt).reshape(n, k), FLOATS[ggml_type])
    if ggml_type not in BLOCKS:
        raise UnsupportedFormatError(
            f"GGML type {ggml_type} is not supported; the supported types are "
            f"{', '.join(SUPPORTED_NAMES)}")
    bs, bb = BLOCKS[ggml_type]
    if k % bs:
        raise ValueError(f"rows of {k} values do not split into blocks of {bs}")
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // bs, bb)
    if ggml_type == GGML_Q8_0:
        d = _f16(b[..., :2]).reshape(n, k // 32)
        q = b[..., 2:].view(np.int8).reshape(n, k)
        return PackedWeight("q8", n, k, np.ascontiguousarray(q), d.copy(), 32)
    if ggml_type in (GGML_Q4_0, GGML_Q4_1):
        d = _f16(b[..., :2]).reshape(n, k // 32)
        if ggml_type == GGML_Q4_0:
            m = (d.astype(np.float32) * -8.0).astype(np.float16)
            qs = b[..., 2:]
        else:
            m = _f16(b[..., 2:4]).reshape(n, k // 32)
            qs = b[..., 4:]
        sm = np.stack([d, m], axis=-1)
        return PackedWeight("q4", n, k, np.ascontiguousarray(qs).reshape(n, k // 2), sm, 32)
    if ggml_type == GGML_MXFP4:
        _check_mxfp4(b)
    # (in runs of rows of about PACK_CHUNK bytes, so that the packers' passes stay in the caches)
    rows = max(1, PACK_CHUNK // (bb * (k // bs)))
    if n <= rows:
        return _PACKERS[ggml_type](b, n, k)
    parts = [_PACKERS[ggml_type](b[i:i + rows], min(rows, n - i), k) for i in range(0, n, rows)]
    out = concat(parts)
    assert out is not None
    return out


# PERF (2-core EPYC, a gpt-oss layer's 32 x 2880 x 2880 MXFP4 experts): the packers' passes
# over runs of 1 MB of the file's rows, not over the whole tensor at once
PACK_CHUNK = 1 << 20


def _pack_q4_k(b: np.ndarray, n: int, k: int) -> PackedWeight:
    # block: d, dmin (half), 12 bytes of packed 6-bit scales and mins, qs[128] (4 chunks of 64
    # values: low nibbles, then high). value = (d * sc) * q - (dmin * m), a (sc, m) per 32
    nb = k // 256
    sc, mn = _k_scales_mins(b[..., 4:16])
    sub = np.stack([sc, mn], axis=-1).reshape(n, k // 16)
    return _kq_rows("k4", n, k, _chunks_to_q4(b[..., 16:144]), None, sub,
                    b[..., 0:4].reshape(n, nb * 4))


def _pack_q6_k(b: np.ndarray, n: int, k: int) -> PackedWeight:
    # block: ql[128], qh[64], int8 scales[16] (one a 16 values), d (half); value = (d * sc) *
    # (q - 32), q 6-bit. Each half of 128 values: ql's 64 bytes A (0..31) and B (32..63) hold
    # the low nibbles of values l (A[l] & 15), 32 + l (B[l] & 15), 64 + l (A[l] >> 4) and
    # 96 + l (B[l] >> 4), and qh[l] their 2 high bits at bits 0, 2, 4 and 6: group G (of 32)
    # of a half takes qh's bits 2G.
    nb = k // 256
    # (ql's 32-byte chunks as Q4_K's: each gives the q4 bytes of its low nibbles' group, then
    # its high nibbles'; a half's groups are A's low, B's low, A's high, B's high)
    q4 = _chunks_to_q4(b[..., 0:128]).reshape(n, nb, 2, 2, 2, 16).swapaxes(-2, -3)
    # k6's word of group G and half hf (16 values) holds value 16 hf + 4 wq + b's 2 bits at bits
    # 8 b + 2 wq: of qh's words (bytes 16 hf + 4 wq + b, b = 0..3), the fields at bits 2G of
    # each byte, the wq-th word's shifted by 2 wq (in the long axis last: PERF, 12x the
    # per-byte form)
    w = np.ascontiguousarray(b[..., 128:192]).view("<u4").reshape(-1, 4)  # [(.., half, hf), wq]
    w = np.ascontiguousarray(w.T)
    m3 = np.uint32(0x03030303)
    words = np.stack([((w[0] >> np.uint32(2 * g)) & m3) |
                      (((w[1] >> np.uint32(2 * g)) & m3) << np.uint32(2)) |
                      (((w[2] >> np.uint32(2 * g)) & m3) << np.uint32(4)) |
                      (((w[3] >> np.uint32(2 * g)) & m3) << np.uint32(6)) for g in range(4)],
                     axis=-1).reshape(n, nb, 2, 2, 4).swapaxes(-1, -2)  # [.., half, G, hf]
    words = np.ascontiguousarray(words).astype("<u4").view(np.uint8)
    sup = np.concatenate([b[..., 208:210], np.zeros_like(b[..., 208:210])], axis=-1)
    return _kq_rows("k6", n, k, q4, words, b[..., 192:208].reshape(n, k // 16),
                    sup.reshape(n, nb * 4))


def _low_high_nibbles(qs: np.ndarray) -> np.ndarray:
    """Bytes ``[..., 16]`` -> values ``[..., 32]``: the low nibbles, then the high ones (the
    order of Q4_0, Q5_0, IQ4_NL, IQ4_XS and MXFP4 blocks of 32)."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _bits(raw: np.ndarray, count: int) -> np.ndarray:
    """Bytes ``[..., count // 8]`` -> their bits ``[..., count]``, bit j of byte j // 8 at j."""
    return np.unpackbits(raw, axis=-1, count=count, bitorder="little")


def _pack_q5_0(b: np.ndarray, n: int, k: int) -> PackedWeight:
    # value = d * (q - 16): a group's half d kept as the file has it, in its sub-scale bytes
    # (its 16 bytes of low nibbles are q4's; its high bits, bit v of a group's word for value
    # v, go where k5 puts them)
    qh = b[..., 2:6]
    high = (_H5_BITS[0][qh[..., 0]] | _H5_BITS[1][qh[..., 1]] | _H5_BITS[2][qh[..., 2]] |
            _H5_BITS[3][qh[..., 3]]).astype("<u4").view(np.uint8)
    return _kq_rows("h5", n, k, b[..., 6:22], high, b[..., 0:2].reshape(n, k // 16),
                    np.zeros((n, k // 64), np.uint8))


def _pack_iq4_nl(b: np.ndarray, n: int, k: int) -> PackedWeight:
    # value = d * table[q]: a group's half d kept as the file has it, in its sub-scale bytes
    return _kq_rows("n4", n, k, _table_order(b[..., 2:18]), None,
                    b[..., 0:2].reshape(n, k // 16), np.zeros((n, k // 64), np.uint8))


def _check_mxfp4(b: np.ndarray) -> None:
    """Refuse MXFP4 blocks [n, k/32, 17] whose nonzero values are float32 subnormals."""
    e = b[..., 0]  # [n, k/32]
    qs = b[..., 1:17]  # [n, k/32, 16]: the table's indices, two a byte
    tiny = np.zeros(e.shape, bool)
    low = e < 2
    if low.any():  # (an index of 0 or 8 is a zero: +0 or -0)
        tiny[low] = (qs[low] & 0x77 != 0).any(axis=-1)
    if tiny.any():
        row, blk = (int(i[0]) for i in np.nonzero(tiny))
        raise UnsupportedFormatError(
            f"MXFP4 block {blk} of row {row} has scale exponent byte {int(e[row, blk])}: its "
            "values are float32 subnormals (below 2^-126), which not every device computes "
            "exactly; clops refuses such blocks")


def _pack_mxfp4(b: np.ndarray, n: int, k: int) -> PackedWeight:
    # value = 2^(e - 128) * doubled E2M1 value: the scale is the float32 of exponent e - 128
    # (GGUF's half of the E8M0 scale), exact as a float scale; kept as the file has it (m4).
    # (pack_ggml has refused subnormal scales over nonzero values: _check_mxfp4)
    # (a group of zeros under a subnormal scale: zeros under any other)
    e = np.maximum(b[..., 0], np.uint8(2))
    return _kq_rows("m4", n, k, _table_order(b[..., 1:17]), None, np.repeat(e, 2, axis=-1),
                    np.zeros((n, k // 64), np.uint8))


def _pack_q3_k(b: np.ndarray, n: int, k: int) -> PackedWeight:
    # block: hmask[32], qs[64], 12 bytes of 6-bit signed sub-scales, d (half).
    # value = (d * (sub-scale - 32)) * q, q = 2-bit low part less 4 where the hmask bit is 0:
    # Q6_K's value (d * sc) * (q6 - 32) with sc = sub-scale - 32 (int8) and q6 = q + 32, so it
    # takes k6 (0.82 bytes a value; its CPU form q8 with the file's scales, as Q6_K's)
    nb = k // 256
    s = b[..., 96:108]
    lo = np.concatenate([s[..., 0:8] & 15, s[..., 0:8] >> 4], axis=-1)  # sub-scale i, low 4 bits
    hi = np.concatenate([(s[..., 8:12] >> sh) & 3 for sh in (0, 2, 4, 6)], axis=-1)
    sub = ((lo | (hi << 4)).astype(np.int16) - 32).astype(np.int8)  # [n, nb, 16]
    # value 128 h + 32 s + l (group g = 4 h + s of the block): its low 2 bits at bits 2 s of
    # qs[32 h + l], its high bit at bit g of hmask[l]; q + 32 = low + 4 high + 28 (28..35),
    # 4 values a 32-bit word operation (the long axis last)
    m = n * nb
    qw = np.ascontiguousarray(np.ascontiguousarray(b[..., 32:96]).view("<u4").reshape(m, 16).T)
    hw = np.ascontiguousarray(np.ascontiguousarray(b[..., 0:32]).view("<u4").reshape(m, 8).T)
    m3, m1, c = np.uint32(0x03030303), np.uint32(0x01010101), np.uint32(0x1C1C1C1C)
    words = np.empty((64, m), np.uint32)
    for g in range(8):
        h, sh = divmod(g, 4)
        words[8 * g:8 * g + 8] = (((qw[8 * h:8 * h + 8] >> np.uint32(2 * sh)) & m3) +
                                  (((hw >> np.uint32(g)) & m1) << np.uint32(2)) + c)
    q6 = np.ascontiguousarray(words.T).astype("<u4").view(np.uint8).reshape(n, nb, 8, 32)
    sup = np.concatenate([b[..., 108:110], np.zeros_like(b[..., 108:110])], axis=-1)
    return _kq_rows("k6", n, k, _nibbles_to_q4(q6 & 15), _high2_words(q6 >> 4),
                    sub.view(np.uint8).reshape(n, k // 16), sup.reshape(n, nb * 4))


def _pack_iq4_xs(b: np.ndarray, n: int, k: int) -> PackedWeight:
    # block: d (half), scales_h (uint16: 2 bits a group), scales_l[4] (4 bits a group),
    # qs[128]. value = (d * (sub-scale - 32)) * table[q], a sub-scale per 32
    nb = k // 256
    sh = b[..., 2].astype(np.uint16) | (b[..., 3].astype(np.uint16) << 8)  # [n, nb]
    sl = b[..., 4:8]
    lo = np.stack([sl & 15, sl >> 4], axis=-1).reshape(n, nb, 8)
    hi = (sh[..., None] >> (2 * np.arange(8, dtype=np.uint16))) & 3
    sub = ((lo.astype(np.int16) | (hi.astype(np.int16) << 4)) - 32).astype(np.int8)
    sup = np.concatenate([b[..., 0:2], np.zeros_like(b[..., 0:2])], axis=-1)
    return _kq_rows("i4", n, k, _table_order(b[..., 8:136].reshape(n, nb, 8, 16)), None,
                    np.repeat(sub.view(np.uint8), 2, axis=-1).reshape(n, k // 16),
                    sup.reshape(n, nb * 4))


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 bytes of Q4_K's and Q5_K's packed 6-bit scales and mins -> 8 of each."""
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)],
                        axis=-1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)],
                        axis=-1)
    return sc, mn


def _q8m(n: int, k: int, q: np.ndarray, scale: np.ndarray, mn: np.ndarray,
         group: int) -> PackedWeight:
    sm = np.stack([scale, mn], axis=-1).reshape(n, k // group, 2)
    return PackedWeight("q8m", n, k, q.astype(np.int8).reshape(n, k), sm, group)


def _pack_q5_1(b: np.ndarray, n: int, k: int) -> PackedWeight:
    # value = (d * q) + m, q 5-bit; d and m stay half (the kernels widen them exactly)
    d = _f16(b[..., 0:2]).reshape(n, k // 32)
    m = _f16(b[..., 2:4]).reshape(n, k // 32)
    q = _low_high_nibbles(b[..., 8:24]) | (_bits(b[..., 4:8], 32) << 4)
    return _q8m(n, k, q, d, m, 32)


def _pack_q5_k(b: np.ndarray, n: int, k: int) -> PackedWeight:
    # block: d, dmin (half), 12 bytes of scales and mins, qh[32], qs[128].
    # value = (d * sc) * q - (dmin * m), a (sc, m) per 32, q 5-bit
    nb = k // 256
    sc, mn = _k_scales_mins(b[..., 4:16])
    # qh[l] bit g: value 32 g + l's high bit; k5's word of group g holds value 16 half + 4 wq +
    # b's at bit 8 b + 4 half + wq: of qh's word j = 4 half + wq (bytes 16 half + 4 wq + b),
    # bit g of each byte, shifted by j (in the long axis last)
    w = np.ascontiguousarray(np.ascontiguousarray(b[..., 16:48]).view("<u4").reshape(-1, 8).T)
    one = np.uint32(0x01010101)
    words = np.empty((8, w.shape[1]), np.uint32)
    for g in range(8):
        acc = (w[0] >> np.uint32(g)) & one
        for j in range(1, 8):
            acc |= ((w[j] >> np.uint32(g)) & one) << np.uint32(j)
        words[g] = acc
    high = np.ascontiguousarray(words.T).astype("<u4").view(np.uint8)
    sub = np.stack([sc, mn], axis=-1).reshape(n, k // 16)
    return _kq_rows("k5", n, k, _chunks_to_q4(b[..., 48:176]), high, sub,
                    b[..., 0:4].reshape(n, nb * 4))


# the bit of the high-bits word each value of a group of 32 takes (``k5``: bit 8b + w of one
# word; ``k6``: bits 8b + 2 (w mod 4) and the next of word w // 4), b and w as the format says
_KQ_V = np.arange(32)
_KQ_W = np.where(_KQ_V < 16, _KQ_V // 4, 4 + (_KQ_V - 16) // 4)
_KQ_B = _KQ_V % 4
_KQ_SHIFT = {"k5": (8 * _KQ_B + _KQ_W).astype(np.uint32),
             "k6": (8 * _KQ_B + 2 * (_KQ_W % 4)).astype(np.uint32)}
_KQ_SHIFT["h5"] = _KQ_SHIFT["k5"]
# Q5_0's high-bit word (bit v: value v's) as h5's, byte by byte: _H5_BITS[i][x] is byte i = x's
# bits where h5 puts values 8i..8i+7
_H5_BITS = np.array([[sum(1 << int(_KQ_SHIFT["h5"][8 * i + j]) for j in range(8) if x >> j & 1)
                      for x in range(256)] for i in range(4)], np.uint32)


def _kq_sub_offset(fmt: str, k: int) -> int:
    return k // 2 + KQ_FORMATS[fmt][0] * k // 8


def _kq_sup_offset(fmt: str, k: int) -> int:
    return _kq_sub_offset(fmt, k) + k // 16


# The packers above hand ``_kq_rows`` the parts of the compact rows made straight from the
# file's bytes, a few passes over them (PERF: 2-core EPYC, 5760 x 3072 values: MXFP4 and Q6_K
# 0.06-0.10 Gvalues/s through the values one a byte and ``_kq_pack``'s reductions); tests
# check them against ``_kq_pack`` of the same values.
def _chunks_to_q4(qs: np.ndarray) -> np.ndarray:
    """Q4_K's and Q5_K's 128 bytes of low nibbles a 256 values (4 chunks of 32 bytes: values
    64c + j in the low, 64c + 32 + j in the high nibble of byte j) -> q4's bytes [..., 128]
    (8 groups of 16: value j of a group in the low, j + 16 in the high nibble of byte j)."""
    w = np.ascontiguousarray(qs).view("<u4").reshape(-1, 2, 4)  # [.., chunk, 16 bytes, word]
    lo, hi = np.uint32(0x0F0F0F0F), np.uint32(0xF0F0F0F0)
    c0, c1 = w[:, 0, :], w[:, 1, :]
    even = (c0 & lo) | ((c1 << np.uint32(4)) & hi)  # group 2c: the low nibbles
    odd = ((c0 >> np.uint32(4)) & lo) | (c1 & hi)  # group 2c + 1: the high ones
    return np.stack([even, odd], axis=1).astype("<u4").view(np.uint8).reshape(qs.shape)


def _table_order(qs: np.ndarray) -> np.ndarray:
    """A group's 16 bytes of 4-bit indices as the file holds them (value j in the low, j + 16
    in the high nibble of byte j) -> the table formats' order (word i: values 4i..4i+3 in its
    low 16 bits, 16 + 4i..16 + 4i + 3 in its high 16 bits, a nibble each), [..., 16]."""
    w = np.ascontiguousarray(qs).view("<u4")  # word i: bytes 4i..4i+3, values 4i + b, 16 + ..

    def pairs(x: np.ndarray) -> np.ndarray:  # nibbles in bytes 0..3 -> bits 0..15
        x = (x | (x >> 4)) & np.uint32(0x00FF00FF)
        return (x | (x >> 8)) & np.uint32(0xFFFF)

    lo = pairs(w & np.uint32(0x0F0F0F0F))
    hi = pairs((w >> np.uint32(4)) & np.uint32(0x0F0F0F0F))
    return (lo | (hi << np.uint32(16))).astype("<u4").view(np.uint8).reshape(qs.shape)


def _high2_words(h: np.ndarray) -> np.ndarray:
    """Two high bits a value [..., 32 g] (uint8 0..3) -> k6's words, 8 bytes a group of 32
    (value v = 16 half + 4 wq + b at bits 8 b + 2 wq of word half)."""
    t = h.reshape(*h.shape[:-1], -1, 2, 4, 4)  # [.., group, half, wq, b]
    out = t[..., 0, :] | (t[..., 1, :] << 2) | (t[..., 2, :] << 4) | (t[..., 3, :] << 6)
    return out.reshape(*h.shape[:-1], -1)


def _kq_rows(fmt: str, n: int, k: int, low: np.ndarray, high: np.ndarray | None,
             sub: np.ndarray, sup: np.ndarray) -> PackedWeight:
    """A compact weight of its rows' parts, bytes each: ``low`` [n, k / 2] (q4's order, or the
    table formats'), ``high`` [n, hb * k / 8] (the high bits' words), ``sub`` [n, k / 16] and
    ``sup`` [n, k / 64]."""
    row = np.zeros((n, kq_row_bytes(fmt, k)), np.uint8)
    row[:, :k // 2] = low.reshape(n, k // 2)
    so = _kq_sub_offset(fmt, k)
    if high is not None:
        row[:, k // 2:so] = high.reshape(n, so - k // 2)
    row[:, so:so + k // 16] = sub.reshape(n, k // 16)
    po = _kq_sup_offset(fmt, k)
    row[:, po:po + k // 64] = sup.reshape(n, k // 64)
    return PackedWeight(fmt, n, k, row, None, 16 if fmt == "k6" else 32)


def _kq_pack(fmt: str, q: np.ndarray, sub: np.ndarray, sup: np.ndarray) -> PackedWeight:
    """The compact rows of unsigned values ``q`` [n, k] (``i4``, ``m4``, ``n4``: the table's
    indices), sub-scale bytes ``sub`` [n, k / 16] and super-scale bytes ``sup`` [n, k / 64]
    (two halves a 256 values)."""
    n, k = q.shape
    g = q.reshape(n, k // 32, 32)
    row = np.zeros((n, kq_row_bytes(fmt, k)), np.uint8)
    if fmt in KQ_TABLES:  # (a word's low half values 4i..4i+3, its high half 16+4i..16+4i+3)
        pairs = (g[..., 0::2] | (g[..., 1::2] << 4)).astype(np.uint8)  # [n, groups, 16]
        row[:, :k // 2] = np.stack([pairs[..., :8].reshape(n, -1, 4, 2),
                                    pairs[..., 8:].reshape(n, -1, 4, 2)], axis=3).reshape(n, -1)
    else:
        row[:, :k // 2] = _nibbles_to_q4(g & 15).reshape(n, k // 2)
    so = _kq_sub_offset(fmt, k)
    if fmt in _KQ_SHIFT:
        high = (g >> 4).astype(np.uint32) << _KQ_SHIFT[fmt]
        if KQ_FORMATS[fmt][0] == 1:
            words = np.bitwise_or.reduce(high, axis=-1)  # [n, groups]
        else:
            words = np.stack([np.bitwise_or.reduce(high[..., :16], axis=-1),
                              np.bitwise_or.reduce(high[..., 16:], axis=-1)], axis=-1)
        row[:, k // 2:so] = np.ascontiguousarray(words, np.uint32).view(np.uint8).reshape(n, -1)
    row[:, so:so + k // 16] = sub
    po = _kq_sup_offset(fmt, k)
    row[:, po:po + k // 64] = sup
    return PackedWeight(fmt, n, k, row, None, 16 if fmt == "k6" else 32)


def _kq_decode(p: PackedWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A compact weight's unsigned values [n, k] (uint8; ``i4``, ``m4``, ``n4``: the table's
    indices) and each group's float32 scale and min [n, k / group] (``kq_scales``;
    ``PackedWeight.dequantize`` makes the values of them)."""
    fmt, n, k = p.fmt, p.n, p.k
    rows = p.data.reshape(n, -1)
    if fmt in KQ_TABLES:
        pairs = rows[:, :k // 2].reshape(n, k // 32, 4, 2, 2)  # [.., word, lo/hi half, pair]
        nib = np.stack([pairs & 15, pairs >> 4], axis=-1)  # [.., word, half, pair, member]
        q = nib.transpose(0, 1, 3, 2, 4, 5).reshape(n, k)
        return (q, *kq_scales(p))
    g = _low_high_nibbles(rows[:, :k // 2].reshape(n, k // 32, 16))  # [n, groups, 32]
    so = _kq_sub_offset(fmt, k)
    words = np.ascontiguousarray(rows[:, k // 2:so]).view(np.uint32)
    if fmt == "k4":
        return (g.reshape(n, k), *kq_scales(p))
    # value v = 16 half + 4 wq + b: k5's bit 8 b + 4 half + wq of the group's word, k6's bits
    # 8 b + 2 wq of word half; each shift and mask of the words gives 4 values' bits, one a
    # byte, in the values' order
    if KQ_FORMATS[fmt][0] == 1:
        w = words.reshape(-1)
        high = np.stack([(w >> np.uint32(j)) & np.uint32(0x01010101) for j in range(8)],
                        axis=-1)  # [(n, group), 4 half + wq]
    else:
        w = words.reshape(-1)  # [(n, group, half)]
        high = np.stack([(w >> np.uint32(2 * wq)) & np.uint32(0x03030303) for wq in range(4)],
                        axis=-1)
    high = high.astype("<u4").view(np.uint8).reshape(n, k // 32, 32)
    q = (g | (high << 4)).reshape(n, k)
    return (q, *kq_scales(p))


def kq_scales(p: PackedWeight) -> tuple[np.ndarray, np.ndarray]:
    """A compact weight's scale and min of each group, float32 [n, k / group] (Q6_K's min
    -32 s, Q5_0's -16 s; IQ4_XS's, MXFP4's and IQ4_NL's 0)."""
    fmt, n, k = p.fmt, p.n, p.k
    rows = p.data.reshape(n, -1)
    so, po = _kq_sub_offset(fmt, k), _kq_sup_offset(fmt, k)
    sub = np.ascontiguousarray(rows[:, so:so + k // 16])
    if fmt == "m4":  # (a group's exponent byte twice, e >= 2: 2^(e - 128))
        e = sub.reshape(n, k // 32, 2)[..., 0].astype(np.uint32)
        s = ((e - 1) << np.uint32(23)).view(np.float32)
        return s, np.zeros_like(s)
    if fmt in ("n4", "h5"):  # (a group's half scale; h5's min -16 s)
        s = sub.view(np.float16).reshape(n, k // 32).astype(np.float32)
        return s, (np.float32(-16.0) * s if fmt == "h5" else np.zeros_like(s))
    sup = np.ascontiguousarray(rows[:, po:po + k // 64]).view(np.float16).astype(np.float32)
    sup = sup.reshape(n, k // 256, 2)
    if fmt == "i4":  # (a group's sub-scale twice, no min)
        sc = sub.view(np.int8).reshape(n, k // 256, 8, 2)[..., 0].astype(np.float32)
        s = (sup[..., None, 0] * sc).reshape(n, k // 32)
        return s.astype(np.float32), np.zeros_like(s, np.float32)
    if fmt in ("k4", "k5"):
        sm = sub.reshape(n, k // 256, 8, 2).astype(np.float32)
        s = (sup[..., None, 0] * sm[..., 0]).reshape(n, k // 32)
        mn = (-(sup[..., None, 1] * sm[..., 1])).reshape(n, k // 32)
    else:
        sc = sub.view(np.int8).reshape(n, k // 256, 16).astype(np.float32)
        s = (sup[..., None, 0] * sc).reshape(n, k // 16)
        mn = np.float32(-32.0) * s
    return s.astype(np.float32), mn.astype(np.float32)


def _pack_q2_k(b: np.ndarray, n: int, k: int) -> PackedWeight:
    # block: 16 bytes of 4-bit scales (low) and mins (high), qs[64], d, dmin (half).
    # value = (d * sc) * q - (dmin * m), a (sc, m) per 16, q 2-bit
    nb = k // 256
    s = b[..., 0:16]
    d = _f16(b[..., 80:82]).astype(np.float32)  # [n, nb, 1]
    dmin = _f16(b[..., 82:84]).astype(np.float32)
    qs = b[..., 16:80].reshape(n, nb, 2, 1, 32)
    q = ((qs >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3).reshape(n, nb, 16, 16)
    return _q8m(n, k, q, d * (s & 15).astype(np.float32),
                -(dmin * (s >> 4).astype(np.float32)), 16)


def fusable(a: PackedWeight, b: PackedWeight) -> bool:
    """Whether two weights share one format, so that ``concat`` stacks them."""
    return (a.fmt, a.k, a.group, a.scale_half, a.data.dtype) == (
        b.fmt, b.k, b.group, b.scale_half, b.data.dtype)


def concat(parts: list[PackedWeight]) -> PackedWeight | None:
    """Stack weights along the output axis (fused QKV, gate/up) when they share one format;
    None when they do not (the caller then launches them separately into one output)."""
    first = parts[0]
    if not all(fusable(first, p) for p in parts[1:]):
        return None
    data = np.concatenate([p.data for p in parts], axis=0)
    scales = None
    if first.scales is not None:
        scales = np.concatenate([p.scales for p in parts], axis=0)  # type: ignore[misc]
    split = None
    if all(p.split is not None and p.split.sub.dtype == first.split.sub.dtype  # type: ignore[union-attr]
           for p in parts):
        split = Split(np.concatenate([p.split.sup for p in parts]),  # type: ignore[union-attr]
                      np.concatenate([p.split.sub for p in parts]))  # type: ignore[union-attr]
    return PackedWeight(first.fmt, sum(p.n for p in parts), first.k, data, scales, first.group,
                        split)


def concat_experts(gate: PackedWeight, up: PackedWeight, n_experts: int) -> PackedWeight | None:
    """Each expert's gate rows, then its up rows: [E * F, k] twice -> [E * 2F, k] (a mixture of
    experts' [gate | up] product in one launch), where the two share one format; else None."""
    if (up.fmt, up.k, up.group, up.scale_half, up.data.dtype, up.n) != (
            gate.fmt, gate.k, gate.group, gate.scale_half, gate.data.dtype, gate.n) or \
            gate.n % n_experts:
        return None

    def per_expert(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        e = n_experts
        return np.concatenate([a.reshape(e, -1, *a.shape[1:]), b.reshape(e, -1, *b.shape[1:])],
                              axis=1).reshape(-1, *a.shape[1:])

    scales = None if gate.scales is None else per_expert(gate.scales, up.scales)  # type: ignore[arg-type]
    split = None  # (the file's scales, where both carry them: the native CPU products')
    if gate.split is not None and up.split is not None and \
            gate.split.sub.dtype == up.split.sub.dtype:
        split = Split(per_expert(gate.split.sup, up.split.sup),
                      per_expert(gate.split.sub, up.split.sub))
    return PackedWeight(gate.fmt, 2 * gate.n, gate.k, per_expert(gate.data, up.data), scales,
                        gate.group, split)


_PACKERS = {
    GGML_Q4_K: _pack_q4_k, GGML_Q6_K: _pack_q6_k, GGML_Q5_0: _pack_q5_0,
    GGML_IQ4_NL: _pack_iq4_nl, GGML_MXFP4: _pack_mxfp4, GGML_Q3_K: _pack_q3_k,
    GGML_IQ4_XS: _pack_iq4_xs, GGML_Q5_1: _pack_q5_1, GGML_Q5_K: _pack_q5_k,
    GGML_Q2_K: _pack_q2_k,
}

# Rows per block of the CPU layout (kernels/matmul_cpu.cl)
RB = 16


def q4_symmetric(packed: PackedWeight) -> bool:
    """Whether every min of a ``q4`` weight is -8 times its scale, as Q4_0's are: both
    layouts then keep the scales alone (``Q4_SYM``), the file's 18 bytes per 32 values."""
    if packed.fmt != "q4" or packed.scales is None or not packed.scale_half:
        return False
    sc = packed.scales
    return bool(np.array_equal(sc[..., 1], (sc[..., 0].astype(np.float32) * -8.0)
                               .astype(np.float16)))


def interleave_rows(packed: PackedWeight,
                    symmetric: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """The values and scales of ``packed`` in the CPU layout ``rb16`` (``matmul_cpu.cl``):
    blocks of 16 rows (the last padded with zero rows), each stored k by k with the block's 16
    rows side by side, so that one 16-wide load gives the same k of 16 rows. ``symmetric``
    (``q4_symmetric``): a q4 weight's scales without its mins."""
    n, k = packed.n, packed.k
    nb = -(-n // RB)

    def blocks(a: np.ndarray) -> np.ndarray:  # [n, ...] -> [nb, RB, ...], zero rows added
        if nb * RB != n:
            a = np.concatenate([a, np.zeros((nb * RB - n,) + a.shape[1:], a.dtype)])
        return a.reshape((nb, RB) + a.shape[1:])

    sc = packed.scales
    if packed.fmt == "q8m":  # values as q8's; S[b][g][2][16]: the scales, then the mins
        assert sc is not None
        data = blocks(packed.data.reshape(n, k)).transpose(0, 2, 1)  # [b, k, r]
        scales = blocks(sc.reshape(n, k // packed.group, 2)).transpose(0, 2, 3, 1)
        return np.ascontiguousarray(data), np.ascontiguousarray(scales)
    if packed.fmt == "q4":
        assert sc is not None
        g = k // 32
        data = blocks(packed.data.reshape(n, g, 16)).transpose(0, 2, 3, 1)  # [b, g, j, r]
        scales = blocks(sc.reshape(n, g, 2)).transpose(0, 2, 3, 1)  # [b, g, 2, r]
        if symmetric:
            scales = scales[:, :, 0]  # [b, g, r]
        return np.ascontiguousarray(data), np.ascontiguousarray(scales)
    data = blocks(packed.data.reshape(n, k)).transpose(0, 2, 1)  # [b, k, r]
    if packed.fmt == "q8":
        assert sc is not None
        scales = blocks(sc.reshape(n, k // packed.group)).transpose(0, 2, 1)  # [b, g, r]
        return np.ascontiguousarray(data), np.ascontiguousarray(scales)
    return np.ascontiguousarray(data), None


def interleave_split(packed: PackedWeight) -> np.ndarray | None:
    """The scales of ``packed.split`` in the CPU layout, as the native products read them (one
    byte buffer, ``kernels/native_cpu.c``): ``sub[b][g][c][16]``, then ``sup[b][s][c][16]``
    (half), blocks of 16 rows as ``interleave_rows`` makes them; None without a split."""
    sp = packed.split
    if sp is None:
        return None
    nb = -(-packed.n // RB)

    def blocks(a: np.ndarray) -> np.ndarray:  # [n, G, c] -> [nb, G, c, RB], zero rows added
        if nb * RB != packed.n:
            a = np.concatenate([a, np.zeros((nb * RB - packed.n,) + a.shape[1:], a.dtype)])
        return np.ascontiguousarray(a.reshape((nb, RB) + a.shape[1:]).transpose(0, 2, 3, 1))

    return np.concatenate([blocks(sp.sub).view(np.uint8).reshape(-1),
                           blocks(sp.sup).view(np.uint8).reshape(-1)])


def layout_for(device: CLDevice) -> str:
    """The layout weights take on ``device``: ``rb16`` on CPUs whose runtime builds and runs
    16-wide vector kernels (the CPU product probe, ``kernels.gemm.cpu_kernel_works``), for
    16-wide vector arithmetic; ``rows`` (row-major) elsewhere (PoCL 3.0 of the pip wheel, built
    without AVX-512, drops such kernels: the row-major kernels serve there)."""
    return "rb16" if device.kind == "cpu" and gemm.cpu_kernel_works(device, "float32") else "rows"


class DeviceWeight:
    """A packed weight on a device: its value buffer, its scale buffer, its layout (``rows``:
    row-major; ``rb16``: CPUs, ``interleave_rows``) and the compile-time parameters of the
    kernels that read it."""

    def __init__(self, device: CLDevice, packed: PackedWeight, layout: str | None = None) -> None:
        self.device = device
        self.layout = layout_for(device) if layout is None else layout
        if self.layout not in ("rows", "rb16"):
            raise ValueError(f"unknown weight layout {self.layout!r} (rows or rb16)")
        if self.layout != "rows":
            packed = packed.expanded()  # (the compact K-quants are row-layout formats)
        self.fmt, self.n, self.k, self.group = packed.fmt, packed.n, packed.k, packed.group
        self.scale_half = packed.scale_half
        # PERF (2-core EPYC, Intel's runtime, a Llama-3.2-1B body in Q4_0): a decode step
        # streams its weights; Q4_0's implied mins left out are 10% fewer bytes. The same on
        # GPUs (H200, a Llama-3.1-8B body in Q4_0: a token read 4.55 GB with the mins, the
        # file's matrices 4.12)
        self.q4_sym = q4_symmetric(packed)
        if self.layout == "rb16":
            data, sc = interleave_rows(packed, self.q4_sym)
        else:
            data, sc = packed.data, packed.scales
            if self.q4_sym:
                assert sc is not None
                sc = np.ascontiguousarray(sc[..., 0])
        self.data = upload(device, data)
        # kernels take a scale pointer even for float weights; a tiny buffer stands in
        self.scales = upload(device, sc if sc is not None else np.zeros(1, np.float32))
        self.nbytes = data.nbytes + (0 if sc is None else sc.nbytes)  # as on the device
        # PERF (2-core EPYC, AVX2, Intel's runtime): Q4_K's and Q6_K's scales as the file
        # holds them (a half per 256 values, a byte per group), beside the float scales the
        # OpenCL kernels read: the native products read these, 0.58 bytes a Q4_K value where
        # the float scales make 0.75, 1.07 a Q6_K value where they make 1.25
        ks = interleave_split(packed) if self.layout == "rb16" else None
        self.kscales: Buffer | None = None if ks is None else upload(device, ks)
        # a float16 copy [n][k] for tensor-core products, where its owner keeps one
        # (kernels.matmul.linear then converts nothing)
        self.half: Buffer | None = None
        # whether its products may quantize their input rows to int8, where the device runs
        # that faster (kernels.matmul: NVIDIA's decode rows; kernels.native_cpu)
        self.int8 = True
        self._keep: Any = None  # what owns ``data`` when the weight reads it in place

    @classmethod
    def from_buffer(cls, device: CLDevice, buffer: Buffer, fmt: str, n: int, k: int,
                    keep: Any = None) -> DeviceWeight:
        """A float weight ``[n, k]`` (``fmt`` "f32", "f16" or "bf16") read in place from a
        row-major device buffer, with no copy; ``keep`` (the tensor that owns the buffer)
        stays alive with the weight."""
        if fmt not in ("f32", "f16", "bf16"):
            raise ValueError(f"from_buffer takes float formats, not {fmt!r}")
        if k % 32:
            raise ValueError(f"the inner size of a weight must be a multiple of 32, got {k}")
        w = cls.__new__(cls)
        w.device, w.fmt, w.n, w.k, w.group = device, fmt, n, k, 32
        w.scale_half, w.layout = False, "rows"
        w.data = buffer
        w.scales = upload(device, np.zeros(1, np.float32))
        w.nbytes = n * k * (4 if fmt == "f32" else 2)
        w.half = None
        w.int8 = True
        w._keep = keep
        w.q4_sym = False
        w.kscales = None
        return w

    @property
    def defines(self) -> dict[str, Any]:
        d = {"WFMT": WFMT[self.fmt], "SCALE_HALF": int(self.scale_half), "QGROUP": self.group,
             "Q4_SYM": int(self.q4_sym)}
        if self.fmt == "q8m":
            d["QMIN"] = 1
        if self.fmt in KQ_FORMATS:
            d["KQB"], d["KQM"], d["KQT"] = KQ_FORMATS[self.fmt]
            if self.fmt in KQ_HALF:
                d["KQH"] = 1
        return d

    def __repr__(self) -> str:
        return f"<clops.nn.DeviceWeight {self.fmt} [{self.n}, {self.k}] {self.layout}>"


def upload(device: CLDevice, arr: np.ndarray) -> Buffer:
    """A new device buffer holding ``arr`` (C-contiguous; at least 4 bytes, so that an empty
    array still gives a kernel argument), written before this returns."""
    arr = np.ascontiguousarray(arr)
    buf = device.alloc(max(arr.nbytes, 4))
    device.write(buf, arr, blocking=True)
    return buf
