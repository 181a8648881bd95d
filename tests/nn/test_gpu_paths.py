"""The GPU geometry of the hand-written kernels (teams of work-items per output column, local
memory reductions, work-group attention decode), forced on whatever device the tests use, so
that these paths are checked on CPUs too."""

from __future__ import annotations

import numpy as np
import pytest

import clops.nn as nn
import clops.nn.quant as quant
from clops.kernels import attention, launch, matmul

from . import test_functional as tf
from .test_functional import q8_1_activations

# (a GPU path run on the CPU device: .ci/run's second pass leaves it out)
pytestmark = pytest.mark.standin


@pytest.fixture(params=["cpt1", "cpt4", "int8", "int8-cpt4", "int8-cb3", "int8-wide",
                        "int8-warps"])
def gpu_geometry(monkeypatch, request):
    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")  # row-major weights
    if request.param.endswith("cpt4"):  # several output columns per team, as for large layers
        monkeypatch.setattr(matmul, "matmul_cpt",
                            lambda dev, m, n, fmt: (4 if fmt in matmul.INT8_FORMATS else 2)
                            if m == 1 else 1)
    if request.param.startswith("int8"):
        # the int8-activation decode path (matmul.cl QX), with the plain-C dot product where
        # the device has no NVIDIA PTX; one or several chunks per column in flight (UNR),
        # loads a step ahead (PIPE), several column blocks per work-group (CB)
        monkeypatch.setattr(matmul, "int8_activations",
                            lambda dev, m, fmt, k: m == 1 and fmt in matmul.INT8_FORMATS)
        geom = matmul.qx_geometry
        if request.param == "int8-wide":
            # teams of more than a warp (their warps' sums meet in local memory on NVIDIA),
            # two columns each, groups of 512 work-items
            monkeypatch.setattr(matmul, "qx_geometry",
                                lambda dev, n, k, fmt: (64, 8, 2, 2, 2, 1))
            return
        if request.param == "int8-warps":
            # teams of a warp, 32 columns a group of 1024 work-items, loads a step ahead (the
            # geometry of an 8B body's 4096 columns on GPUs of 128-256 compute units)
            monkeypatch.setattr(matmul, "qx_geometry",
                                lambda dev, n, k, fmt: (32, 32, 1, 2, 1, 1))
            return
        unr, cb, pipe = {"int8": (1, 1, 0), "int8-cpt4": (3, 1, 1),
                         "int8-cb3": (2, 3, 1)}[request.param]
        monkeypatch.setattr(matmul, "qx_geometry",
                            lambda dev, n, k, fmt: geom(dev, n, k, fmt)[:3] + (unr, cb, pipe))


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS",
                                  "MXFP4", "IQ4_NL", "Q5_0", "Q3_K"])
@pytest.mark.parametrize("m", [1, 5])
def test_linear_quantized_gpu_geometry(device, gpu_geometry, kind, m):
    tf.test_linear_quantized(device, kind, m)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("n,k", [(37, 96), (130, 64), (33, 2048)])
def test_linear_quantized_ragged_gpu_geometry(device, gpu_geometry, kind, n, k):
    # output counts not multiples of the columns per team or work-group; rows of fewer chunks
    # than a team has work-items, or a number of chunks no multiple of LSIZE * UNR
    tf.test_linear_quantized(device, kind, 1, n=n, k=k)


@pytest.mark.parametrize("k,want", [(8192, (32, 16)), (16384, (16, 64))])
def test_linear_quantized_long_rows_gpu_geometry(device, monkeypatch, k, want):
    """Long q8 rows on the int8 decode path take the groups of their own (fewer, larger:
    every group quantizes the whole x): warp teams, 16 columns a group from 8192 values;
    half-warp teams, 64 columns a group of 1024 work-items from 16384 (matmul.qx_geometry);
    the product right with either."""
    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    monkeypatch.setattr(matmul, "int8_activations",
                        lambda dev, m, fmt, k: m == 1 and fmt in ("q4", "q8"))
    # (past the branches of few output columns; whole groups: PoCL 3.1 writes past N for
    # ragged groups of teams narrower than a warp, which take the reduction without shuffles)
    n = 64 * (device.caps.compute_units // 2 + 1)
    if device.caps.max_work_group < 1024:
        pytest.skip(f"{device.name} runs work-groups of {device.caps.max_work_group} at most")
    assert matmul.qx_geometry(device, n, k, "q8")[:2] == want
    tf.test_linear_quantized(device, "Q8_0", 1, n=n, k=k)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
def test_linear_quantized_4096_columns(device, kind):
    """A decode row's product of 4096 columns (an 8B body's o and down) on the device's own
    path: on GPUs of 128-256 compute units, the int8 path's teams of a warp, 32 columns a
    group (matmul.qx_geometry); elsewhere whatever the device takes."""
    tf.test_linear_quantized(device, kind, 1, n=4096, k=4096)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_linear_float_gpu_geometry(device, gpu_geometry, dtype):
    tf.test_linear_float(device, dtype)


def test_kv_cache_gpu_geometry(device, gpu_geometry):
    tf.test_kv_cache_prefill_then_decode(device)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lq,lk,d", [(6, 9, 16), (37, 37, 64), (16, 80, 32), (40, 20, 8)])
def test_sdpa_gpu_geometry(device, causal, lq, lk, d):
    """The work-group prefill attention (attn_prefill_wg): query rows past a group of 16, keys
    past a tile of 32, more queries than keys (early rows attend to nothing when causal)."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    try:
        rng = np.random.default_rng(lq * lk)
        q = rng.standard_normal((lq, 4, d)).astype(np.float32)
        k = rng.standard_normal((lk, 2, d)).astype(np.float32)
        v = rng.standard_normal((lk, 2, d)).astype(np.float32)
        got = np.asarray(nn.scaled_dot_product_attention(tf._t(q, device), tf._t(k, device),
                                                         tf._t(v, device), causal=causal))
    finally:
        monkeypatch.undo()
    with np.errstate(invalid="ignore"):
        want = tf._attn_ref(q, k, v, causal)
    # rows with no key to attend (lq > lk, causal) come out as zeros, as from attn_prefill
    np.testing.assert_allclose(got, np.nan_to_num(want, nan=0.0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [37, 130])
def test_linear_ragged_columns_gpu_geometry(device, gpu_geometry, n):
    # output counts that are not multiples of the columns per team or per work-group
    x = tf.RNG.standard_normal((1, 96)).astype(np.float32)
    w = tf.RNG.standard_normal((n, 96)).astype(np.float32)
    got = np.asarray(nn.linear(tf._t(x, device), nn.quantized(w, fmt="f16", device=device)))
    want = x @ w.astype(np.float16).astype(np.float32).T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["q8", "f16"])
@pytest.mark.parametrize("m", [1, 3])
def test_matmul_fused_norm_and_glu(device, gpu_geometry, fmt, m):
    # RMSNorm and the GLU folded into the matmul that reads them (GPU decode plans)
    import clops

    k, n, eps = 128, 70, 1e-5
    rng = tf.RNG
    w = rng.standard_normal((n, k)).astype(np.float32)
    if fmt == "q8":
        from gguf import GGMLQuantizationType as Q
        from gguf import quants

        raw = quants.quantize(w, Q.Q8_0)
        w_used = quants.dequantize(raw, Q.Q8_0).reshape(n, k)
        dw = nn.quantized(raw, ggml_type=int(Q.Q8_0), shape=(n, k), device=device)
    else:
        w_used = w.astype(np.float16).astype(np.float32)
        dw = nn.quantized(w, fmt="f16", device=device)
    x = rng.standard_normal((m, 2 * k)).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    tx, tg = tf._t(x, device).realize(), tf._t(g, device).realize()
    for mode in ("norm", "glu", "gelu_tanh", "clamp"):
        y = clops.empty((m, n), dtype=clops.float32, device=device).realize()
        if mode == "norm":
            ln = matmul.matmul(device, y.buffer, 0, n, tx.buffer, 0, 2 * k, dw, m,
                                  norm=(tg.buffer, eps))
            xs = x[:, :k]
            xin = xs / np.sqrt((xs * xs).mean(1, keepdims=True) + eps) * g
        elif mode == "glu":
            ln = matmul.matmul(device, y.buffer, 0, n, tx.buffer, 0, 2 * k, dw, m, glu=True)
            gate, up = x[:, :k], x[:, k:]
            xin = gate / (1 + np.exp(-gate)) * up
        elif mode == "clamp":  # (gpt-oss's GLU, a limit that most values cross)
            ln = matmul.matmul(device, y.buffer, 0, n, tx.buffer, 0, 2 * k, dw, m, glu=True,
                               limit=0.5, alpha=1.702)
            gate, up = np.minimum(x[:, :k], 0.5), np.clip(x[:, k:], -0.5, 0.5)
            assert (np.abs(x) > 0.5).mean() > 0.5
            xin = ((up + 1) * gate / (1 + np.exp(-1.702 * gate.astype(np.float64)))
                   ).astype(np.float32)
        else:  # (Gemma's GLU)
            ln = matmul.matmul(device, y.buffer, 0, n, tx.buffer, 0, 2 * k, dw, m, glu=True,
                               act=mode)
            gate, up = x[:, :k].astype(np.float64), x[:, k:]
            c = 0.7978845608028654
            xin = (0.5 * gate * (1 + np.tanh(c * (gate + 0.044715 * gate ** 3))) * up
                   ).astype(np.float32)
        ln.run(device)
        got = np.asarray(y)
        if fmt == "q8" and matmul.int8_activations(device, m, "q8", k):
            # int8 activations: x after the norm (up to its scalar 1 / rms) or the GLU is what
            # is quantized
            want = q8_1_activations(xin) @ w_used.T.astype(np.float64)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        else:
            np.testing.assert_allclose(got, xin @ w_used.T, rtol=2e-4, atol=2e-4)


def _rope_ref(x: np.ndarray, pos: int, inv_freq: np.ndarray, neox: bool) -> np.ndarray:
    """x [heads, D] rotated at ``pos``, as the model's rope_store does."""
    d = x.shape[-1]
    ang = np.float32(pos) * inv_freq
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    a, b = (slice(0, d // 2), slice(d // 2, d)) if neox else (slice(0, d, 2), slice(1, d, 2))
    out[:, a] = x[:, a] * c - x[:, b] * s
    out[:, b] = x[:, a] * s + x[:, b] * c
    return out


def _decode_rope_cases() -> list[tuple[bool, bool, bool, bool, int, int]]:
    """(combine, neox, per_kv_head, kv_half, d, chunk): each work-group layout, cache type
    and head size twice, the two with other rotations and combines, chunks alternating, so
    that every pair of two choices' values meets (each case builds its own kernels: the whole
    product of the choices, 56 cases, took 7 minutes on PoCL)."""
    heads = [(False, False, 32), (True, False, 32), (False, True, 32), (True, True, 32),
             (False, False, 128), (True, False, 128), (True, True, 128)]
    return [((i + j) % 2 == 0, j == 0, pkv, half, d, (16, 64)[(i // 2 + j) % 2])
            for i, (pkv, half, d) in enumerate(heads) for j in range(2)]


def test_decode_nrep_choice(device):
    # the query heads a work-group of attn_decode_rope: those of a key-value head where they
    # fit 512 work-items, two at most at spans of 2048 positions or fewer, always a divisor
    nrep = attention.decode_nrep
    for head_dim, n_rep, span, want in [(128, 8, 256, 2), (128, 8, 2048, 2), (128, 8, 4096, 4),
                                        (128, 4, 16384, 4), (64, 4, 16384, 4), (64, 4, 256, 2),
                                        (128, 3, 256, 1), (128, 3, 8192, 3), (256, 2, 8192, 2),
                                        (128, 1, 8192, 1), (64, 16, 8192, 8)]:
        assert nrep(device, head_dim, n_rep, 64, span) == want, (head_dim, n_rep, span)


@pytest.mark.parametrize("combine, neox, per_kv_head, kv_half, d, chunk", _decode_rope_cases())
def test_attn_decode_rope_steps(device, monkeypatch, combine, neox, per_kv_head, kv_half, d,
                                chunk):
    # decode steps through the one-launch attention: rotation of q and k, the cache store of
    # the new row, attention over chunks of 16 or 64 positions (1, 2 and several chunks active,
    # boundaries included; chunks of 64 take two tiles of 32 key rows, the new row alone in
    # the second at position 32) and the combine, by the last work-group or by attn_combine; the
    # head counters must be left at zero for the next step. per_kv_head: a work-group serves
    # the 3 query heads of a key-value head, else one query head.
    # kv_half: a cache of float16 values (the new row's k and v too attend as the cache keeps
    # them, rounded to float16, as they will be read at later steps)
    # (the heads a work-group forced: at these short spans the launcher takes 2 at most, so
    # 1 here)
    monkeypatch.setattr(attention, "DECODE_NREP_OVERRIDE", 3 if per_kv_head else 1)
    ct = np.float16 if kv_half else np.float32
    # d 128: tiles of 32 key rows, fewer than a head's work-items
    h, kv, max_seq = 6, 2, 96
    rng = np.random.default_rng(5)
    inv_freq = (1.0 / 10000 ** (np.arange(0, d, 2) / d)).astype(np.float32)
    dev = device
    kc, vc = (dev.alloc(attention.kv_nbytes(kv, max_seq, d, kv_half)) for _ in range(2))
    for c in (kc, vc):  # positions the steps skip hold zeros, as in the reference
        dev.write(c, np.zeros(kv * max_seq * d, ct), blocking=True)
    out = dev.alloc(h * d * 4)
    part = dev.alloc(h * -(-max_seq // chunk) * (d + 2) * 4)
    count = dev.alloc(h * 4)
    dev.write(count, np.zeros(h, np.int32), blocking=True)
    state = dev.alloc(16)
    qkv = dev.alloc((h + 2 * kv) * d * 4)
    ifq = dev.alloc(inv_freq.nbytes)
    dev.write(ifq, inv_freq, blocking=True)
    keys = np.zeros((max_seq, kv, d), np.float32)
    vals = np.zeros((max_seq, kv, d), np.float32)
    scale = 1 / np.sqrt(d)
    for pos in [0, 1, 15, 16, 17, 31, 32, 33, 50, 80, 95]:
        row = rng.standard_normal((h + 2 * kv) * d).astype(np.float32)
        q = _rope_ref(row[:h * d].reshape(h, d), pos, inv_freq, neox)
        keys[pos] = _rope_ref(row[h * d:(h + kv) * d].reshape(kv, d), pos, inv_freq, neox)
        vals[pos] = row[(h + kv) * d:].reshape(kv, d)
        dev.write(qkv, row, blocking=True)
        dev.write(state, np.array([pos, 0, 0, 0], np.int32), blocking=True)
        for ln in attention.attn_decode_rope(dev, out, part, count, qkv, kc, vc, state, ifq,
                                             n_heads=h, n_kv=kv, head_dim=d, max_seq=max_seq,
                                             scale=float(scale), neox=neox, chunk=chunk,
                                             combine=combine, kv_half=kv_half):
            ln.run(dev)
        got = np.empty((h, d), np.float32)
        dev.read(got, out, blocking=True)
        seen_k = keys[:pos + 1].astype(ct).astype(np.float32)
        seen_v = vals[:pos + 1].astype(ct).astype(np.float32)
        kr = np.repeat(seen_k, h // kv, axis=1)  # [L, h, d]
        vr = np.repeat(seen_v, h // kv, axis=1)
        s = np.einsum("hd,lhd->hl", q.astype(np.float64), kr) * scale
        p = np.exp(s - s.max(1, keepdims=True))
        want = np.einsum("hl,lhd->hd", p / p.sum(1, keepdims=True), vr)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"pos {pos}")
        cached = np.empty((kv, max_seq, d), ct)
        dev.read(cached, kc, blocking=True)
        np.testing.assert_allclose(cached[:, pos], keys[pos].astype(ct), rtol=1e-5 if ct is
                                   np.float32 else 2e-3, atol=1e-6)
        dev.read(cached, vc, blocking=True)
        np.testing.assert_array_equal(cached[:, pos], vals[pos].astype(ct))
        left = np.empty(h, np.int32)
        dev.read(left, count, blocking=True)
        assert not left.any(), "the head counters must be zero after each step"


@pytest.mark.parametrize("window, nrep", [(0, 3), (37, 1)], ids=["whole", "window-37"])
def test_attn_decode_rope_sinks(device, monkeypatch, window, nrep):
    # gpt-oss's decode row in the one launch: a sink logit a query head folded into the
    # head's first chunk that takes part (chunk 0, or with a window the first one holding a
    # position of it), its combine counting it once; heads of one work-group each their own
    # sink. Sinks of the scores' size (the result far from attention without them)
    monkeypatch.setattr(attention, "DECODE_NREP_OVERRIDE", nrep)
    h, kv, d, max_seq, chunk = 6, 2, 32, 96, 16
    sinks = np.array([0.5, -1.0, 2.0, 1.2, 3.0, -0.5], np.float32)
    rng = np.random.default_rng(9)
    inv_freq = (1.0 / 10000 ** (np.arange(0, d, 2) / d)).astype(np.float32)
    dev = device
    kc, vc = (dev.alloc(attention.kv_nbytes(kv, max_seq, d, False)) for _ in range(2))
    for c in (kc, vc):  # positions the steps skip hold zeros, as in the reference
        dev.write(c, np.zeros(kv * max_seq * d, np.float32), blocking=True)
    out, count = dev.alloc(h * d * 4), dev.alloc(h * 4)
    part = dev.alloc(h * -(-max_seq // chunk) * (d + 2) * 4)
    dev.write(count, np.zeros(h, np.int32), blocking=True)
    state, qkv, ifq, sb = dev.alloc(16), dev.alloc((h + 2 * kv) * d * 4), \
        dev.alloc(inv_freq.nbytes), dev.alloc(sinks.nbytes)
    dev.write(ifq, inv_freq, blocking=True)
    dev.write(sb, sinks, blocking=True)
    keys = np.zeros((max_seq, kv, d), np.float32)
    vals = np.zeros((max_seq, kv, d), np.float32)
    scale = 1 / np.sqrt(d)
    for pos in [0, 15, 16, 40, 95]:
        row = rng.standard_normal((h + 2 * kv) * d).astype(np.float32)
        q = _rope_ref(row[:h * d].reshape(h, d), pos, inv_freq, True)
        keys[pos] = _rope_ref(row[h * d:(h + kv) * d].reshape(kv, d), pos, inv_freq, True)
        vals[pos] = row[(h + kv) * d:].reshape(kv, d)
        dev.write(qkv, row, blocking=True)
        dev.write(state, np.array([pos, 0, 0, 0], np.int32), blocking=True)
        for ln in attention.attn_decode_rope(dev, out, part, count, qkv, kc, vc, state, ifq,
                                             n_heads=h, n_kv=kv, head_dim=d, max_seq=max_seq,
                                             scale=float(scale), neox=True, chunk=chunk,
                                             combine=True, window=window, sinks=sb):
            ln.run(dev)
        got = np.empty((h, d), np.float32)
        dev.read(got, out, blocking=True)
        first = max(0, pos - window + 1) if window else 0
        kr = np.repeat(keys[first:pos + 1], h // kv, axis=1).astype(np.float64)
        vr = np.repeat(vals[first:pos + 1], h // kv, axis=1).astype(np.float64)
        s = np.einsum("hd,lhd->hl", q.astype(np.float64), kr) * scale
        top = np.maximum(s.max(1), sinks)
        e = np.exp(s - top[:, None])
        den = e.sum(1) + np.exp(sinks - top)
        want = np.einsum("hl,lhd->hd", e, vr) / den[:, None]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"pos {pos}")
        plain = np.einsum("hl,lhd->hd", e, vr) / e.sum(1)[:, None]
        assert np.abs(got - plain).max() > 1e-2, f"pos {pos}: the sinks did not count"
        left = np.empty(h, np.int32)
        dev.read(left, count, blocking=True)
        assert not left.any(), "the head counters must be zero after each step"
