"""The attention kernels' per-family choices against numpy: soft-capped scores and a sliding
window, for a prompt's rows (attn_prefill) and a decode row (attn_decode with its split
combine), on the test device; partial rotary in rope_store; caches of float16 values."""

from __future__ import annotations

import numpy as np
import pytest

import clops.kernels.launch
from clops.kernels import attention

H, KV, D, MAX = 4, 2, 16, 64


def _ref(q, kc, vc, pos, scale, softcap, window):
    """q [M][H][D] at positions pos[m]; caches [KV][MAX][D]."""
    out = np.zeros_like(q)
    for m in range(q.shape[0]):
        lo = max(0, pos[m] - window + 1) if window else 0
        for h in range(H):
            k, v = kc[h // (H // KV), lo:pos[m] + 1], vc[h // (H // KV), lo:pos[m] + 1]
            s = (k.astype(np.float64) @ q[m, h]) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            out[m, h] = (p / p.sum()) @ v
    return out


def _buf(dev, a):
    b = dev.alloc(max(a.nbytes, 4))
    dev.write(b, np.ascontiguousarray(a), blocking=True)
    return b


def _read(dev, b, shape):
    out = np.empty(shape, np.float32)
    dev.read(out, b)
    return out


@pytest.mark.parametrize("softcap, window", [(0.0, 0), (2.5, 0), (0.0, 5), (3.0, 7)])
@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("kv_half", [False, True])
def test_capped_and_windowed_attention(device, monkeypatch, softcap, window, gpu, kv_half):
    if gpu:
        monkeypatch.setattr(clops.kernels.launch, "is_cpu", lambda dev: False)
        monkeypatch.setattr("clops.nn.quant.layout_for", lambda dev: "rows")
    rng = np.random.default_rng(int(softcap * 10) + window)
    ct = np.float16 if kv_half else np.float32
    # (the reference reads the cache's values as the kernels do: float16-rounded)
    kc = (rng.standard_normal((KV, MAX, D)) * 2).astype(ct).astype(np.float32)
    vc = rng.standard_normal((KV, MAX, D)).astype(ct).astype(np.float32)
    scale = 0.4
    dev = device
    kb, vb = _buf(dev, kc.astype(ct)), _buf(dev, vc.astype(ct))
    # a prompt chunk: 20 rows from position 13
    p0, m = 13, 20
    q = rng.standard_normal((m, H, D)).astype(np.float32) * 2
    state = _buf(dev, np.array([p0, 0, 0, 0], np.int32))
    out = dev.alloc(q.nbytes)
    attention.attn_prefill(dev, out, _buf(dev, q), 0, H * D, kb, vb, 0, 0, MAX * D, state,
                           pos_add=0, causal=True, n_keys=MAX, m=m, n_heads=H, n_kv=KV,
                           head_dim=D, scale=scale, softcap=softcap, window=window,
                           kv_half=kv_half).run(dev)
    want = _ref(q, kc, vc, [p0 + i for i in range(m)], scale, softcap, window)
    np.testing.assert_allclose(_read(dev, out, q.shape), want, rtol=1e-4, atol=1e-5)
    # a decode row at position 50: splits before the window weigh nothing
    q1 = q[:1]
    state = _buf(dev, np.array([50, 0, 0, 0], np.int32))
    part = dev.alloc(attention.part_nbytes(dev, MAX, H, D))
    dev.write(part, np.full(attention.part_nbytes(dev, MAX, H, D) // 4, np.nan, np.float32),
              blocking=True)
    out1 = dev.alloc(q1.nbytes)
    for ln in attention.attn_decode(dev, out1, part, _buf(dev, q1), kb, vb, state, n_heads=H,
                                    n_kv=KV, head_dim=D, max_seq=MAX, scale=scale,
                                    softcap=softcap, window=window, kv_half=kv_half):
        ln.run(dev)
    want1 = _ref(q1, kc, vc, [50], scale, softcap, window)
    np.testing.assert_allclose(_read(dev, out1, q1.shape), want1, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("kv_half", [False, True])
def test_partial_rotary(device, neox, kv_half):
    rot, m = 8, 3
    rng = np.random.default_rng(5)
    n_qkv = (H + 2 * KV) * D
    qkv = rng.standard_normal((m, n_qkv)).astype(np.float32)
    inv = (1.0 / 10000 ** (np.arange(0, rot, 2) / rot)).astype(np.float32)
    dev = device
    ct = np.float16 if kv_half else np.float32
    q_out = dev.alloc(m * H * D * 4)
    kc, vc = (dev.alloc(attention.kv_nbytes(KV, MAX, D, kv_half)) for _ in range(2))
    state = _buf(dev, np.array([7, 0, 0, 0], np.int32))
    attention.rope_store(dev, q_out, _buf(dev, qkv), n_qkv, kc, vc, state, _buf(dev, inv), m=m,
                         n_heads=H, n_kv=KV, head_dim=D, max_seq=MAX, neox=neox,
                         rot_dim=rot, kv_half=kv_half).run(dev)
    heads = qkv[:, :(H + KV) * D].reshape(m, H + KV, D)
    want = heads.copy()
    for r in range(m):
        ang = (7 + r) * inv
        c, s = np.cos(ang), np.sin(ang)
        idx = (np.arange(rot // 2), np.arange(rot // 2) + rot // 2) if neox else (
            np.arange(0, rot, 2), np.arange(1, rot, 2))
        a, b = heads[r][:, idx[0]], heads[r][:, idx[1]]
        want[r][:, idx[0]], want[r][:, idx[1]] = a * c - b * s, a * s + b * c
    got_q = _read(dev, q_out, (m, H, D))
    got_k, got_v = (np.empty((KV, MAX, D), ct) for _ in range(2))
    dev.read(got_k, kc)
    dev.read(got_v, vc)
    np.testing.assert_allclose(got_q, want[:, :H], rtol=1e-5, atol=1e-5)
    # (a float16 cache: the same values rounded, within an ulp of float16 where the angles'
    # sines differ in their last bits)
    np.testing.assert_allclose(got_k[:, 7:7 + m].transpose(1, 0, 2).astype(np.float32),
                               want[:, H:].astype(ct), rtol=2e-3 if kv_half else 1e-5,
                               atol=1e-5)
    vals = qkv[:, (H + KV) * D:].reshape(m, KV, D).transpose(1, 0, 2)
    np.testing.assert_array_equal(got_v[:, 7:7 + m], vals.astype(ct))


@pytest.mark.parametrize("rot, neox, slices", [(16, False, 3), (8, True, 2), (16, True, 4)])
def test_rope_store_adds_up_slices(device, rot, neox, slices):
    """rope_store reading a product's partial sums [slices][m][n] (a split QKV product's,
    left unsummed) gives the same q rows and cache entries, bit for bit, as rope_store of the
    rows those slices add up to in order."""
    m, n_qkv = 5, (H + 2 * KV) * D
    rng = np.random.default_rng(11)
    parts = rng.standard_normal((slices, m, n_qkv)).astype(np.float32)
    rows = np.zeros((m, n_qkv), np.float32)
    for p in parts:  # (in order, in float32, as split_sum and the kernel add them)
        rows = rows + p
    inv = (1.0 / 10000 ** (np.arange(0, rot, 2) / rot)).astype(np.float32)
    dev = device
    got = []
    for src, s in ((parts, slices), (rows, 1)):
        q_out = dev.alloc(m * H * D * 4)
        kc, vc = (dev.alloc(attention.kv_nbytes(KV, MAX, D, True)) for _ in range(2))
        for c in (kc, vc):
            dev.write(c, np.zeros(KV * MAX * D, np.float16), blocking=True)
        state = _buf(dev, np.array([9, 0, 0, 0], np.int32))
        attention.rope_store(dev, q_out, _buf(dev, src), n_qkv, kc, vc, state, _buf(dev, inv),
                             m=m, n_heads=H, n_kv=KV, head_dim=D, max_seq=MAX, neox=neox,
                             rot_dim=rot, kv_half=True, slices=s).run(dev)
        ck, cv = (np.empty((KV, MAX, D), np.float16) for _ in range(2))
        dev.read(ck, kc)
        dev.read(cv, vc)
        got.append((_read(dev, q_out, (m, H, D)), ck, cv))
    for a, b in zip(*got, strict=True):
        np.testing.assert_array_equal(a, b)
    assert np.abs(got[0][2][:, 9:9 + m]).max() > 0  # (the values did land)


def _ref_rows(q, kc, vc, lims, scale):
    """q [M][H][Dh] against keys [0, lims[m]) of caches [KV][MAX][Dh], float64."""
    n_rep = q.shape[1] // kc.shape[0]
    out = np.zeros(q.shape, np.float64)
    for m, lim in enumerate(lims):
        for h in range(q.shape[1]):
            if lim == 0:
                continue
            s = (kc[h // n_rep, :lim].astype(np.float64) @ q[m, h]) * scale
            p = np.exp(s - s.max())
            out[m, h] = (p / p.sum()) @ vc[h // n_rep, :lim]
    return out


@pytest.mark.parametrize("dh", [64, 128, 16])
@pytest.mark.parametrize("p0,m,causal", [(0, 150, True), (37, 64, True), (200, 9, True),
                                         (0, 70, False)])
@pytest.mark.parametrize("kv_half", [False, True])
def test_prefill_tensor_cores(device, dh, p0, m, causal, kv_half):
    """attn_prefill(half=True) on tensor cores (attn_prefill_mma, NVIDIA): against float64 from
    float16-rounded q, k, v; rows past a group of 64, keys past a tile of 64 and a start
    position inside one, 4 query heads a key-value head, a causal prompt from 0 (rows attend to
    1 .. 150 keys), and all keys; from caches of float32 or float16 values."""
    dev = device
    if not attention.prefill_mma(dev, dh):
        pytest.skip(f"{dev.name}: no tensor-core prefill attention (needs NVIDIA mma.sync)")
    h, kv, cap = 8, 2, 320
    rng = np.random.default_rng(p0 + m + dh)
    kc = rng.standard_normal((kv, cap, dh)).astype(np.float32) * 1.5
    vc = rng.standard_normal((kv, cap, dh)).astype(np.float32)
    q = rng.standard_normal((m, h, dh)).astype(np.float32) * 1.5
    scale = dh ** -0.5
    n_keys = cap if causal else 250
    lims = [min(n_keys, p0 + i + 1) if causal else n_keys for i in range(m)]
    state = _buf(dev, np.array([p0, 0, 0, 0], np.int32))
    out = dev.alloc(q.nbytes)
    dev.write(out, np.full(q.size, np.nan, np.float32), blocking=True)
    ct = np.float16 if kv_half else np.float32
    ln = attention.attn_prefill(dev, out, _buf(dev, q), 0, h * dh, _buf(dev, kc.astype(ct)),
                                _buf(dev, vc.astype(ct)), 0, 0, cap * dh, state, pos_add=0,
                                causal=causal, n_keys=n_keys, m=m, n_heads=h, n_kv=kv,
                                head_dim=dh, scale=scale, half=True, kv_half=kv_half)
    assert ln.kernel.function_name == "attn_prefill_mma"
    ln.run(dev)
    f16 = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    want = _ref_rows(f16(q), f16(kc), f16(vc), lims, scale)
    got = _read(dev, out, q.shape)
    # the weights are rounded to float16 too: about 1e-3 of the output's scale
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-3)
    # the same rows as float16 values (an LLM prompt's output product reads them so)
    hout = dev.alloc(q.size * 2)
    attention.attn_prefill(dev, hout, _buf(dev, q), 0, h * dh, _buf(dev, kc.astype(ct)),
                           _buf(dev, vc.astype(ct)), 0, 0, cap * dh, state, pos_add=0,
                           causal=causal, n_keys=n_keys, m=m, n_heads=h, n_kv=kv, head_dim=dh,
                           scale=scale, half=True, kv_half=kv_half, half_out=True).run(dev)
    halves = np.empty(q.shape, np.float16)
    dev.read(halves, hout, blocking=True)
    np.testing.assert_array_equal(halves, got.astype(np.float16))


@pytest.mark.parametrize("p0,m,window", [(0, 150, 37), (200, 70, 100), (5, 9, 64)])
def test_prefill_tensor_cores_window_sinks(device, p0, m, window):
    """gpt-oss's windowed layers on tensor cores (attn_prefill_mma with WINDOW, a sink logit a
    head): each row the last ``window`` keys up to its own, the tiles wholly before a row
    group's window skipped, against float64 from float16-rounded q, k, v."""
    dev = device
    dh, h, kv, cap = 64, 8, 2, 320
    if not attention.prefill_mma(dev, dh):
        pytest.skip(f"{dev.name}: no tensor-core prefill attention (needs NVIDIA mma.sync)")
    rng = np.random.default_rng(p0 + m + window)
    kc = rng.standard_normal((kv, cap, dh)).astype(np.float32) * 1.5
    vc = rng.standard_normal((kv, cap, dh)).astype(np.float32)
    q = rng.standard_normal((m, h, dh)).astype(np.float32) * 1.5
    sinks = rng.standard_normal(h).astype(np.float32) + 2.0
    scale = dh ** -0.5
    state = _buf(dev, np.array([p0, 0, 0, 0], np.int32))
    out = dev.alloc(q.nbytes)
    ln = attention.attn_prefill(dev, out, _buf(dev, q), 0, h * dh, _buf(dev, kc), _buf(dev, vc),
                                0, 0, cap * dh, state, pos_add=0, causal=True, n_keys=cap, m=m,
                                n_heads=h, n_kv=kv, head_dim=dh, scale=scale, half=True,
                                window=window, sinks=_buf(dev, sinks))
    assert ln.kernel.function_name == "attn_prefill_mma"
    ln.run(dev)
    f16 = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    qh, kh, vh = f16(q), f16(kc), f16(vc)
    want = np.zeros(q.shape)
    for i in range(m):
        lo, hi = max(0, p0 + i - window + 1), p0 + i + 1
        for j in range(h):
            sc = (kh[j // (h // kv), lo:hi] @ qh[i, j]) * scale
            top = max(sc.max(), sinks[j])
            e = np.exp(sc - top)
            want[i, j] = (e @ vh[j // (h // kv), lo:hi]) / (e.sum() + np.exp(sinks[j] - top))
    np.testing.assert_allclose(_read(dev, out, q.shape), want, rtol=0, atol=4e-3)


def test_prefill_half_out_is_refused_off_tensor_cores(device):
    """Float16 output rows come from the tensor-core kernel alone: elsewhere, or with a cap,
    attn_prefill refuses them."""
    dev = device
    b = dev.alloc(1 << 16)
    for softcap in (0.0, 30.0):
        if softcap == 0.0 and attention.prefill_mma(dev, 64):
            continue
        with pytest.raises(ValueError, match="float16 output"):
            attention.attn_prefill(dev, b, b, 0, 64, b, b, 0, 0, 64, b, pos_add=0, causal=True,
                                   n_keys=8, m=8, n_heads=1, n_kv=1, head_dim=64, scale=0.125,
                                   half=True, softcap=softcap, half_out=True)
