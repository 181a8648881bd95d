"""clops.nn ops against numpy references, on float and GGUF-quantized weights."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

import clops
import clops.nn as nn

RNG = np.random.default_rng(0)


def _t(a, device):
    return clops.asarray(np.ascontiguousarray(a), device=device)


def _random_k_quant(t: Q, n: int, k: int) -> np.ndarray:
    """Random bytes of a K-quant (or IQ4_XS, IQ4_NL) tensor with sane super-block scales (no
    quantizer in gguf)."""
    bs, bb = {Q.Q4_K: (256, 144), Q.Q5_K: (256, 176), Q.Q6_K: (256, 210),
              Q.IQ4_XS: (256, 136), Q.IQ4_NL: (32, 18), Q.Q3_K: (256, 110)}[t]
    raw = RNG.integers(0, 256, (n, k // bs, bb), dtype=np.uint8)
    scale = np.frombuffer(np.full(n * k // bs * 2, 0.01, np.float16).tobytes(), np.uint8)
    if t in (Q.Q4_K, Q.Q5_K):  # (d and dmin)
        raw[..., 0:4] = scale.reshape(n, k // bs, 4)
    elif t in (Q.IQ4_XS, Q.IQ4_NL):  # (d: values at most 0.01 * 32 * 127; IQ4_NL's 0.01 * 127)
        raw[..., 0:2] = scale[: n * k // bs * 2].reshape(n, k // bs, 2)
    else:  # (d: Q6_K's at 208, Q3_K's at 108)
        at = 208 if t == Q.Q6_K else 108
        raw[..., at:at + 2] = scale[: n * k // bs * 2].reshape(n, k // bs, 2)
    return raw.reshape(n, -1)


def ggml_weight(dev, kind: str, n: int, k: int, rng: np.random.Generator):
    """A weight [n, k] of GGML type ``kind`` on dev (K-quants as random blocks, others
    quantized from rng's normal values), and its float32 values."""
    t = Q[kind]
    if t in (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS, Q.IQ4_NL, Q.Q3_K):
        raw = _random_k_quant(t, n, k)
    else:
        raw = quants.quantize(rng.standard_normal((n, k)).astype(np.float32), t)
    return nn.quantized(raw, ggml_type=int(t), shape=(n, k), device=dev), \
        quants.dequantize(raw, t).reshape(n, k)


def q8_1_activations(x: np.ndarray) -> np.ndarray:
    """x (rows of a multiple of 32 values) as the int8 path of the quantized GEMV sees it: per
    32 values q = round(x * 127 / amax), x ~ q * amax / 127 (GGML's q8_1 scheme), in float64."""
    xb = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(xb).max(1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(xb * inv).astype(np.float64)
    return (q * (amax.astype(np.float64) / 127)).reshape(x.shape)


def check_quantized_matmul(device, got, x, w_ref, b, w):
    """``got`` = x @ w_ref.T + b, with the tolerance of the path the device takes for x with
    weight ``w``."""
    from clops.kernels import matmul

    want = x.astype(np.float64) @ w_ref.T.astype(np.float64) + b
    m, k = x.shape
    if matmul.int8_rows(device, m, w):
        # int8 activations: exact dot products of the int8 x (up to float32 sums and the odd
        # rounding tie) ...
        emu = q8_1_activations(x) @ w_ref.T.astype(np.float64) + b
        np.testing.assert_allclose(got, emu, rtol=1e-4, atol=1e-4 * np.abs(emu).max())
        # ... which are within ~1/254 of each block's largest |x| of the float result: on
        # random data the error is ~5e-3 of the result's norm, up to 1.5e-2 for the random
        # K-quant bytes (llama.cpp's q8_1 activations do the same)
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 3e-2, err
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"])
@pytest.mark.parametrize("m", [1, 5, 19])
def test_linear_quantized(device, kind, m, n=48, k=512):
    w, w_ref = ggml_weight(device, kind, n, k, RNG)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    got = np.asarray(nn.linear(_t(x, device), w, _t(b, device)))
    check_quantized_matmul(device, got, x, w_ref, b, w)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_linear_float(device, dtype):
    x = RNG.standard_normal((2, 3, 64)).astype(np.float32)
    w = RNG.standard_normal((40, 64)).astype(np.float32)
    wt = clops.astype(_t(w, device), getattr(clops, dtype))
    w_used = np.asarray(wt).astype(np.float32)
    got = np.asarray(nn.linear(_t(x, device), wt))
    np.testing.assert_allclose(got, x @ w_used.T, rtol=1e-4, atol=1e-4)


def _rounds_rows(x, w) -> bool:
    """Whether nn.linear takes the tensor-core product (x rounded to float16) for x @ w.T."""
    from clops.kernels import matmul
    from clops.nn.quant import DeviceWeight

    fmt = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[w.dtype.name]
    n, k = w.shape
    if fmt == "f32" or k % 32:
        return False
    dw = DeviceWeight.from_buffer(w.device, w.buffer, fmt, n, k, keep=w)
    return matmul.tensor_core_rows(x.device, x.shape[0], dw)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("m,n,k", [(1, 7, 100), (37, 48, 64), (300, 64, 256)])
def test_linear_tensor_weight_any_size(device, dtype, m, n, k, monkeypatch):
    # a Tensor weight is read on the device (never copied to the host), with any inner size
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((n, k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    wt = clops.astype(_t(w, device), getattr(clops, dtype)).realize()
    w_used = np.asarray(wt).astype(np.float32)
    xt, bt = _t(x, device).realize(), _t(b, device).realize()

    def no_host_copy(*a, **kw):
        raise AssertionError("linear read a weight back to the host")

    monkeypatch.setattr(clops.Tensor, "__array__", no_host_copy)
    y = nn.linear(xt, wt, bt)
    monkeypatch.undo()
    got = np.asarray(y)
    # The tensor-core path (NVIDIA, 16+ rows, a weight not in float32) rounds x to float16
    # first, as its docstring says; the reference rounds the same way, at the same tolerance.
    x_used = x.astype(np.float16).astype(np.float32) if _rounds_rows(xt, wt) else x
    np.testing.assert_allclose(got, x_used @ w_used.T + b, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    with pytest.raises(ValueError, match="features"):
        nn.linear(_t(x[:, :-1], device), wt)
    with pytest.raises(ValueError, match="bias of"):
        nn.linear(xt, wt, _t(b[:-1], device))


def test_embedding_quantized(device):
    raw = quants.quantize(RNG.standard_normal((100, 64)).astype(np.float32), Q.Q8_0)
    table = nn.quantized(raw, ggml_type=int(Q.Q8_0), shape=(100, 64), device=device)
    ids = np.array([[3, 99], [0, 42]], np.int32)
    got = np.asarray(nn.embedding(_t(ids, device), table))
    want = quants.dequantize(raw, Q.Q8_0).reshape(100, 64)[ids]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_norms_and_activations(device):
    x = RNG.standard_normal((7, 96)).astype(np.float32) * 3 + 1
    w = RNG.standard_normal(96).astype(np.float32)
    b = RNG.standard_normal(96).astype(np.float32)
    xt = _t(x, device)
    rms = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(np.asarray(nn.rms_norm(xt, _t(w, device), 1e-6)), rms,
                               rtol=1e-5, atol=1e-5)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    ln = (x - mu) / np.sqrt(var + 1e-5) * w + b
    np.testing.assert_allclose(np.asarray(nn.layer_norm(xt, _t(w, device), _t(b, device))),
                               ln, rtol=1e-4, atol=1e-4)
    # parameters of another size were read out of bounds: refused, naming both sizes
    with pytest.raises(ValueError, match="96 features.*weight has shape \\(95,\\)"):
        nn.rms_norm(xt, _t(w[1:], device))
    with pytest.raises(ValueError, match="bias has shape \\(97,\\)"):
        nn.layer_norm(xt, _t(w, device), _t(np.ones(97, np.float32), device))
    np.testing.assert_allclose(np.asarray(nn.silu(xt)), x / (1 + np.exp(-x)), rtol=1e-5,
                               atol=1e-6)
    from math import erf, pi, sqrt

    gelu = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / sqrt(2))))(x)
    np.testing.assert_allclose(np.asarray(nn.gelu(xt)), gelu, rtol=1e-4, atol=1e-5)
    tanh = 0.5 * x * (1 + np.tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(np.asarray(nn.gelu(xt, approximate="tanh")), tanh, rtol=1e-4,
                               atol=1e-5)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(nn.softmax(xt)), e / e.sum(-1, keepdims=True),
                               rtol=1e-5, atol=1e-7)
    e0 = np.exp(x - x.max(0, keepdims=True))
    np.testing.assert_allclose(np.asarray(nn.softmax(xt, axis=0)), e0 / e0.sum(0, keepdims=True),
                               rtol=1e-5, atol=1e-7)


def _rope_ref(x, pos, inv, layout):
    out = x.copy()
    ang = pos[:, None].astype(np.float32) * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    d = x.shape[-1]
    if layout == "split":
        a, b = x[..., : d // 2], x[..., d // 2:]
        out[..., : d // 2], out[..., d // 2:] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out


@pytest.mark.parametrize("layout", ["split", "adjacent"])
def test_rope(device, layout):
    x = RNG.standard_normal((5, 3, 32)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 2000], np.int32)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    inv = nn.rope_frequencies(32, 500000.0, scaling)
    base = (1.0 / 500000.0 ** (np.arange(0, 32, 2) / 32)).astype(np.float32)
    assert inv[0] == pytest.approx(base[0]) and inv[-1] == pytest.approx(base[-1] / 8)
    got = np.asarray(nn.rope(_t(x, device), pos, 500000.0, layout, scaling))
    np.testing.assert_allclose(got, _rope_ref(x, pos, inv, layout), rtol=1e-4, atol=1e-4)


def _attn_ref(q, k, v, causal):
    lq, h, d = q.shape
    lk, kv, _ = k.shape
    rep = h // kv
    out = np.zeros_like(q)
    for i in range(h):
        s = q[:, i] @ k[:, i // rep].T / np.sqrt(d)
        if causal:
            s = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, i] = (p / p.sum(-1, keepdims=True)) @ v[:, i // rep]
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_grouped_query(device, causal):
    q = RNG.standard_normal((6, 4, 16)).astype(np.float32)
    k = RNG.standard_normal((9, 2, 16)).astype(np.float32)
    v = RNG.standard_normal((9, 2, 16)).astype(np.float32)
    got = np.asarray(nn.scaled_dot_product_attention(_t(q, device), _t(k, device),
                                                     _t(v, device), causal=causal))
    np.testing.assert_allclose(got, _attn_ref(q, k, v, causal), rtol=1e-4, atol=1e-5)


def test_kv_cache_prefill_then_decode(device):
    h, kv, d, n = 6, 2, 32, 300
    q = RNG.standard_normal((n, h, d)).astype(np.float32)
    k = RNG.standard_normal((n, kv, d)).astype(np.float32)
    v = RNG.standard_normal((n, kv, d)).astype(np.float32)
    cache = nn.KVCache(kv, d, max_seq=512, device=device)
    first = np.asarray(cache.attend(_t(q[:250], device), _t(k[:250], device),
                                    _t(v[:250], device)))
    np.testing.assert_allclose(first, _attn_ref(q[:250], k[:250], v[:250], True), rtol=1e-4,
                               atol=1e-5)
    for i in range(250, n):  # decode: one row at a time, split over the KV length
        got = np.asarray(cache.attend(_t(q[i:i + 1], device), _t(k[i:i + 1], device),
                                      _t(v[i:i + 1], device)))
        want = _attn_ref(q[: i + 1], k[: i + 1], v[: i + 1], True)[-1:]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_eager_ops_reuse_their_kernel_objects(device, launched_kernels):
    """An eager op's launch gives its kernel object back once enqueued, and the next launch of
    that kernel takes it (pyopencl's ~0.1 ms to make one saved), its arguments' types set:
    results stay right as shapes and arguments change. While a clops.jit capture is open,
    nothing is given back (the capture keeps the objects it recorded)."""
    from clops.runtime import plan

    seen = launched_kernels
    for m, k in ((3, 1024), (5, 2048), (2, 1024)):  # (one program: the same group size)
        x = RNG.standard_normal((m, k)).astype(np.float32)
        w = RNG.standard_normal(k).astype(np.float32)
        got = np.asarray(nn.rms_norm(_t(x, device), _t(w, device), eps=1e-5))
        want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # (the three calls' rmsnorm launches: one object)
    norms = [knl for knl in seen if knl.function_name == "rmsnorm"]
    assert len(norms) == 3 and norms[0] is norms[1] is norms[2], norms
    with plan.capture(strict=False):
        nn.rms_norm(_t(x, device), _t(w, device))
    nn.rms_norm(_t(x, device), _t(w, device))
    norms = [knl for knl in seen if knl.function_name == "rmsnorm"]
    assert norms[3] is norms[0] and norms[4] is not norms[0]


# the paths, forced on every device: (float16 vector kernels, scalar hand kernels). CPUs whose
# vector exp agrees with the scalar one take the vector kernels (a row in 16-wide loads; 64 or 16
# adjacent columns a work-item where they divide the columns), Intel's runtime the scalar
# column kernel where they do not (8 or more side by side), fewer move the axis last for the
# row kernel; GPUs take the compiler's fused expression (neither).
SOFTMAX_PATHS = [(False, False), (False, True), (True, False), (True, True)]


@pytest.mark.parametrize("shape,axis", [((1024, 512), 0), ((7, 9), 0), ((3, 33, 8), 1),
                                        ((5, 4, 3, 16), 1), ((6, 10, 7), 0), ((2, 300, 40), 0)])
@pytest.mark.parametrize("vectors,hand", SOFTMAX_PATHS)
def test_softmax_over_leading_axes(device, shape, axis, vectors, hand, monkeypatch):
    import clops.nn.functional as functional

    monkeypatch.setattr(functional, "_hand_kernels_pay", lambda dev: hand)
    monkeypatch.setattr(functional, "_vector_kernels", lambda dev: vectors)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32) * 4
    x.flat[::11] = -np.inf
    x.flat[5::13] = 60.0
    xt = _t(x, device)
    e = np.exp(x - x.max(axis, keepdims=True))
    want = e / e.sum(axis, keepdims=True)
    got = np.asarray(nn.softmax(xt, axis=axis))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    # the same values as the row kernel over the moved axis, and from a strided view
    moved = np.asarray(nn.softmax(clops.moveaxis(xt, axis, -1)))
    np.testing.assert_allclose(np.moveaxis(got, axis, -1), moved, rtol=1e-6, atol=1e-8)
    flipped = np.asarray(nn.softmax(xt[::-1], axis=axis))
    e2 = np.exp(x[::-1] - x[::-1].max(axis, keepdims=True))
    np.testing.assert_allclose(flipped, e2 / e2.sum(axis, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", [(3, 5), (4, 16), (7, 97), (2, 4096), (2, 3, 50)])
@pytest.mark.parametrize("vectors,hand", SOFTMAX_PATHS)
def test_softmax_over_the_last_axis(device, shape, vectors, hand, monkeypatch):
    """Rows shorter than a vector, of whole vectors and of vectors and a rest, with -inf,
    large values and a row of -inf alone (NaN, as numpy), from a view too."""
    import clops.nn.functional as functional

    monkeypatch.setattr(functional, "_hand_kernels_pay", lambda dev: hand)
    monkeypatch.setattr(functional, "_vector_kernels", lambda dev: vectors)
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32) * 4
    x.flat[::7] = -np.inf
    x.flat[2::11] = 80.0
    x.reshape(-1, shape[-1])[1] = -np.inf
    with np.errstate(invalid="ignore"):
        e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    got = np.asarray(nn.softmax(_t(x, device)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    half = np.asarray(nn.softmax(_t(x, device)[..., 1:]))
    with np.errstate(invalid="ignore"):
        e = np.exp(x[..., 1:].astype(np.float64) - x[..., 1:].max(-1, keepdims=True))
    np.testing.assert_allclose(half, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape,axis", [((64, 512), -1), ((3, 40000), -1), ((1024, 16), 0),
                                        ((4, 7, 9), 1), ((2, 20000), 0)])
def test_softmax_on_the_gpu_path(device, shape, axis, monkeypatch):
    """GPUs take the compiler's fused softmax (the path is forced here on any device): rows
    long and short, split and column layouts, -inf and large values, float16 input."""
    from clops.compiler import realize

    monkeypatch.setattr(device, "kind", "gpu")
    realize._KERNELS.clear()
    try:
        x = np.random.default_rng(4).standard_normal(shape).astype(np.float32) * 4
        x.flat[::17] = -np.inf
        x.flat[3::29] = 70.0
        e = np.exp(x.astype(np.float64) - x.max(axis, keepdims=True))
        want = e / e.sum(axis, keepdims=True)
        got = np.asarray(nn.softmax(_t(x, device), axis=axis))
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
        h = x.astype(np.float16)
        eh = np.exp(h.astype(np.float64) - h.max(axis, keepdims=True).astype(np.float64))
        goth = np.asarray(nn.softmax(clops.asarray(h, device=device), axis=axis))
        np.testing.assert_allclose(goth, eh / eh.sum(axis, keepdims=True), rtol=2e-5,
                                   atol=1e-7)
    finally:
        monkeypatch.undo()
        realize._KERNELS.clear()
