"""Attention sinks (gpt-oss): a learned logit a query head, one more term exp(sink) in each
softmax's denominator with no value, in attn_prefill, attn_decode (its split and combine) and
the paged kernels (attention, attention_split with its combine in one launch or two), against
numpy in float64; with a sliding window and without, grouped-query heads, caches of float32
and float16 values, and the GPUs' kernels run on this device where they can be."""

from __future__ import annotations

import numpy as np
import pytest

import clops.kernels.launch
from clops.kernels import attention, paged

from .test_attention_choices import _buf, _read

H, KV, D = 4, 2, 16
SCALE = 0.4
# sink logits a head: none; dominating; -inf-like (the result is attention without sinks);
# of the scores' size (the result differs from attention without sinks)
SINKS = {"none": None, "big": [8.0, 7.5, 8.5, 9.0], "neg": [-30.0] * H,
         "mid": [0.5, -1.0, 2.0, 1.2]}


def _ref(q, k, v, first, last, sinks):
    """q [M][H][Dh] of row m against keys first[m] .. last[m] of k, v [KV][N][Dh] (a row's own
    sequence: k[m], v[m] where they are lists), float64: exp(s - M) v / (sum exp(s - M) +
    exp(sink - M)), M the largest of the scores and the sink."""
    n_rep = q.shape[1] // KV
    out = np.zeros(q.shape, np.float64)
    for m in range(q.shape[0]):
        km, vm = (k[m], v[m]) if isinstance(k, list) else (k, v)
        for h in range(q.shape[1]):
            kk = km[h // n_rep, first[m]:last[m] + 1].astype(np.float64)
            s = (kk @ q[m, h].astype(np.float64)) * SCALE
            top = s.max() if sinks is None else max(s.max(), sinks[h])
            e = np.exp(s - top)
            den = e.sum() + (0.0 if sinks is None else np.exp(sinks[h] - top))
            out[m, h] = (e @ vm[h // n_rep, first[m]:last[m] + 1]) / den
    return out


def _check(got, q, k, v, first, last, kind):
    """got against the reference with the sinks of ``kind``; where the sinks count (mid,
    big), got is not attention without them."""
    sinks = SINKS[kind]
    want = _ref(q, k, v, first, last, sinks)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6, err_msg=kind)
    plain = want if sinks is None else _ref(q, k, v, first, last, None)
    if kind == "neg":
        np.testing.assert_allclose(got, plain, rtol=1e-4, atol=2e-6)
    if kind in ("mid", "big"):  # (by far more than the tolerance above)
        assert np.abs(got - plain).max() > (0.05 if kind == "big" else 1e-3), kind


# NOTE: a sliding window only with a float16 cache (not all four of window and cache): each
# case compiles its kernels, which takes PoCL seconds each.


def _as_gpu(monkeypatch, gpu):
    """The GPUs' choices of kernels (work-groups a head or rows), run on this device."""
    if gpu:
        monkeypatch.setattr(clops.kernels.launch, "is_cpu", lambda dev: False)


def _cache(rng, shape, kv_half):
    """(values as the kernels read them, as stored): float16-rounded for a float16 cache."""
    ct = np.float16 if kv_half else np.float32
    a = (rng.standard_normal(shape) * 2).astype(ct)
    return a.astype(np.float32), a


@pytest.mark.parametrize("window, kv_half", [(0, False), (0, True), (7, True)],
                         ids=["f32", "f16", "window-f16"])
@pytest.mark.parametrize("gpu, dh", [(False, 16), (False, 12), (True, 16)],
                         ids=["cpu", "cpu-scalar", "gpu"])
def test_prefill(device, monkeypatch, gpu, dh, window, kv_half):
    """attn_prefill, causal: 20 rows from position 13 of a cache of 64."""
    _as_gpu(monkeypatch, gpu)
    dev, cap, p0, m = device, 64, 13, 20
    rng = np.random.default_rng(dh + window)
    kc, kst = _cache(rng, (KV, cap, dh), kv_half)
    vc, vst = _cache(rng, (KV, cap, dh), kv_half)
    kb, vb = _buf(dev, kst), _buf(dev, vst)
    q = rng.standard_normal((m, H, dh)).astype(np.float32)
    state = _buf(dev, np.array([p0, 0, 0, 0], np.int32))
    last = [p0 + i for i in range(m)]
    first = [max(0, p - window + 1) if window else 0 for p in last]
    for kind, sinks in SINKS.items():
        out = dev.alloc(q.nbytes)
        sb = None if sinks is None else _buf(dev, np.array(sinks, np.float32))
        ln = attention.attn_prefill(dev, out, _buf(dev, q), 0, H * dh, kb, vb, 0, 0, cap * dh,
                                    state, pos_add=0, causal=True, n_keys=cap, m=m,
                                    n_heads=H, n_kv=KV, head_dim=dh, scale=SCALE,
                                    window=window, kv_half=kv_half, sinks=sb)
        if gpu and not window:
            assert ln.kernel.function_name == "attn_prefill_wg"
        ln.run(dev)
        _check(_read(dev, out, q.shape), q, kc, vc, first, last, kind)


# (the GPU kernel in one case: each case builds its own kernels, slow on PoCL)
@pytest.mark.parametrize("gpu, window, kv_half", [
    (False, 0, False), (False, 0, True), (False, 37, True), (True, 37, True)],
    ids=["cpu-f32", "cpu-f16", "cpu-window-f16", "gpu-window-f16"])
def test_decode(device, monkeypatch, gpu, window, kv_half):
    """attn_decode of a row at position 200 of a cache of 256: several splits, those before
    the window empty, the sink in the first that attends (its combine the same as without)."""
    _as_gpu(monkeypatch, gpu)
    dev, cap, pos = device, 256, 200
    rng = np.random.default_rng(window + 3)
    kc, kst = _cache(rng, (KV, cap, D), kv_half)
    vc, vst = _cache(rng, (KV, cap, D), kv_half)
    kb, vb = _buf(dev, kst), _buf(dev, vst)
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    state = _buf(dev, np.array([pos, 0, 0, 0], np.int32))
    assert attention.decode_chunk(dev, cap, H)[1] > 1
    first = [max(0, pos - window + 1) if window else 0]
    nbytes = attention.part_nbytes(dev, cap, H, D)
    for kind, sinks in SINKS.items():
        part = _buf(dev, np.full(nbytes // 4, np.nan, np.float32))
        out = dev.alloc(q.nbytes)
        sb = None if sinks is None else _buf(dev, np.array(sinks, np.float32))
        lns = attention.attn_decode(dev, out, part, _buf(dev, q), kb, vb, state, n_heads=H,
                                    n_kv=KV, head_dim=D, max_seq=cap, scale=SCALE,
                                    window=window, kv_half=kv_half, sinks=sb)
        if gpu and not window:
            assert lns[0].kernel.function_name == "attn_decode_wg"
        for ln in lns:
            ln.run(dev)
        _check(_read(dev, out, q.shape), q, kc, vc, first, [pos], kind)


BS, MAXB, SLOTS = 8, 16, 2
# (slot, position) of each row of a step: rows of one sequence at several positions, one
# within its first chunk, one at the last position
ROWS = [(0, 100), (1, 20), (1, 70), (0, 127), (1, 3)]


def _paged(dev, rng, kv_half):
    """Pools [blocks][KV][BS][D] holding two sequences of MAXB * BS positions in shuffled
    blocks; their caches [KV][N][D] as the kernels read them; the rows (PagedRows, q)."""
    n = MAXB * BS
    caches = [[_cache(rng, (KV, n, D), kv_half) for _ in range(2)] for _ in range(SLOTS)]
    ct = np.float16 if kv_half else np.float32
    order = rng.permutation(SLOTS * MAXB)
    table = order.reshape(SLOTS, MAXB).astype(np.int32)
    kp, vp = (np.zeros((SLOTS * MAXB, KV, BS, D), ct) for _ in range(2))
    for s in range(SLOTS):
        for j in range(MAXB):
            for pool, (_, stored) in zip((kp, vp), caches[s], strict=True):
                pool[table[s, j]] = stored[:, j * BS:(j + 1) * BS]
    rows = paged.PagedRows(_buf(dev, table), MAXB,
                           _buf(dev, np.array([s for s, _ in ROWS], np.int32)),
                           _buf(dev, np.array([p for _, p in ROWS], np.int32)), BS)
    k = [caches[s][0][0] for s, _ in ROWS]
    v = [caches[s][1][0] for s, _ in ROWS]
    q = rng.standard_normal((len(ROWS), H, D)).astype(np.float32)
    return _buf(dev, kp), _buf(dev, vp), rows, k, v, q


@pytest.mark.parametrize("window, kv_half", [(0, False), (0, True), (37, True)],
                         ids=["f32", "f16", "window-f16"])
@pytest.mark.parametrize("kernel", ["cpu", "ls1", "ls4"])
def test_paged_attention(device, monkeypatch, kernel, window, kv_half):
    """paged.attention: paged_attn_cpu where this device takes it, paged_attn with one
    work-item a (row, head) and with four (the sink in the first one's part)."""
    if kernel != "cpu":
        monkeypatch.setattr(attention, "cpu_decode", lambda dev, head_dim: False)
    dev = device
    rng = np.random.default_rng(window + 11)
    kp, vp, rows, k, v, q = _paged(dev, rng, kv_half)
    last = [p for _, p in ROWS]
    first = [max(0, p - window + 1) if window else 0 for p in last]
    for kind, sinks in SINKS.items():
        out = dev.alloc(q.nbytes)
        sb = None if sinks is None else _buf(dev, np.array(sinks, np.float32))
        ln = paged.attention(dev, out, _buf(dev, q), kp, vp, rows, m=len(ROWS), n_heads=H,
                             n_kv=KV, head_dim=D, scale=SCALE, lsize=4 if kernel == "ls4" else 1,
                             window=window, kv_half=kv_half, sinks=sb)
        ln.run(dev)
        _check(_read(dev, out, q.shape), q, k, v, first, last, kind)


@pytest.mark.parametrize("combine, window, kv_half", [
    (True, 0, False), (True, 37, True), (False, 0, True)],
    ids=["one-launch-f32", "one-launch-window-f16", "two-launches-f16"])
def test_paged_attention_split(device, combine, window, kv_half):
    """paged.attention_split (paged_attn_wg, then paged_attn_combine where not combined in the
    same launch): rows over one chunk and over several, the sink in the first that takes
    part."""
    dev = device
    rng = np.random.default_rng(window + 17)
    kp, vp, rows, k, v, q = _paged(dev, rng, kv_half)
    context = MAXB * BS
    assert attention.decode_chunk(dev, context, H)[1] > 1
    last = [p for _, p in ROWS]
    first = [max(0, p - window + 1) if window else 0 for p in last]
    nfloats = paged.part_floats(dev, len(ROWS), H, D, context)
    for kind, sinks in SINKS.items():
        out = _buf(dev, np.full(q.size, np.nan, np.float32))
        part = _buf(dev, np.full(nfloats, np.nan, np.float32))
        count = _buf(dev, np.zeros(len(ROWS) * H, np.int32))
        sb = None if sinks is None else _buf(dev, np.array(sinks, np.float32))
        for ln in paged.attention_split(dev, out, part, count, _buf(dev, q), kp, vp, rows,
                                        m=len(ROWS), n_heads=H, n_kv=KV, head_dim=D,
                                        scale=SCALE, context=context, window=window,
                                        combine=combine, kv_half=kv_half, sinks=sb):
            ln.run(dev)
        _check(_read(dev, out, q.shape), q, k, v, first, last, kind)


def test_sinks_are_the_last_argument_and_absent_without(device):
    """The launch with sinks has them as its one extra, last argument (other code resizes
    paged launches by argument index), and none without."""
    dev = device
    rng = np.random.default_rng(1)
    kp, vp, rows, _, _, q = _paged(dev, rng, False)
    sb = _buf(dev, np.zeros(H, np.float32))
    kw = dict(m=len(ROWS), n_heads=H, n_kv=KV, head_dim=D, scale=SCALE, lsize=1)
    qb, out = _buf(dev, q), dev.alloc(q.nbytes)
    without = paged.attention(dev, out, qb, kp, vp, rows, **kw)
    with_ = paged.attention(dev, out, qb, kp, vp, rows, **kw, sinks=sb)
    assert with_.args[:-1] == without.args and with_.args[-1] is sb
