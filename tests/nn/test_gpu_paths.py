"""The GPU geometry of the hand-written kernels (teams of work-items per output column, local
memory reductions, work-group attention decode), forced on whatever device the tests use, so
that these paths are checked on CPUs too."""

from __future__ import annotations

import numpy as np
import pytest

import clops.nn as nn
import clops.nn.launchers as launchers

from . import test_functional as tf


@pytest.fixture(params=["cpt1", "cpt4"])
def gpu_geometry(monkeypatch, request):
    monkeypatch.setattr(launchers, "is_cpu", lambda dev: False)
    if request.param == "cpt4":  # several output columns per team, as for large layers
        monkeypatch.setattr(launchers, "matmul_cpt",
                            lambda dev, m, n, fmt: (4 if fmt in ("q4", "q8") else 2)
                            if m == 1 else 1)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1", "Q6_K"])
@pytest.mark.parametrize("m", [1, 5])
def test_linear_quantized_gpu_geometry(device, gpu_geometry, kind, m):
    tf.test_linear_quantized(device, kind, m)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_linear_float_gpu_geometry(device, gpu_geometry, dtype):
    tf.test_linear_float(device, dtype)


def test_kv_cache_gpu_geometry(device, gpu_geometry):
    tf.test_kv_cache_prefill_then_decode(device)


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
    for mode in ("norm", "glu"):
        y = clops.empty((m, n), dtype=clops.float32, device=device).realize()
        if mode == "norm":
            ln = launchers.matmul(device, y.buffer, 0, n, tx.buffer, 0, 2 * k, dw, m,
                                  norm=(tg.buffer, eps))
            xs = x[:, :k]
            xin = xs / np.sqrt((xs * xs).mean(1, keepdims=True) + eps) * g
        else:
            ln = launchers.matmul(device, y.buffer, 0, n, tx.buffer, 0, 2 * k, dw, m, glu=True)
            gate, up = x[:, :k], x[:, k:]
            xin = gate / (1 + np.exp(-gate)) * up
        ln.run(device)
        np.testing.assert_allclose(np.asarray(y), xin @ w_used.T, rtol=2e-4, atol=2e-4)
