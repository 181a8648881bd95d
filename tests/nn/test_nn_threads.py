"""clops.nn from many threads at once: eight threads, each with inputs (and row counts) of its
own, run softmax, layer norm, RMS norm, linear and silu together and get numpy's results."""

from __future__ import annotations

import numpy as np

import clops
import clops.nn as nn
from tests.threads import run_threads

CALLS = 4  # per thread and op
K, N = 64, 48  # features in and out


def _layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_nn_ops_from_threads_at_once(device):
    rng = np.random.default_rng(11)
    lw, lb, rw = (rng.standard_normal(K).astype(np.float32) for _ in range(3))
    weight = (rng.standard_normal((N, K)) * 0.1).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    c = {name: clops.asarray(v, device=device) for name, v in
         (("lw", lw), ("lb", lb), ("rw", rw), ("weight", weight), ("bias", bias))}
    qweight = nn.quantized(weight, "f16", device=device)  # the hand-written product kernels
    wq = weight.astype(np.float16).astype(np.float64)

    def work(t: int) -> None:
        for r in range(CALLS):
            rng = np.random.default_rng(100 * t + r)
            rows = 1 + (t + r) % 5
            x = rng.standard_normal((rows, K)).astype(np.float32)
            cx = clops.asarray(x, device=device)
            where = f"thread {t}, call {r}"

            got = np.asarray(nn.softmax(cx * 3.0))
            np.testing.assert_allclose(got, _softmax(x * 3), rtol=1e-5, atol=1e-7,
                                       err_msg=f"softmax, {where}")
            got = np.asarray(nn.layer_norm(cx, c["lw"], c["lb"]))
            np.testing.assert_allclose(got, _layer_norm(x, lw, lb), rtol=1e-4, atol=1e-5,
                                       err_msg=f"layer_norm, {where}")
            got = np.asarray(nn.rms_norm(cx, c["rw"]))
            want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * rw
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"rms_norm, {where}")
            got = np.asarray(nn.linear(cx, c["weight"], c["bias"]))
            np.testing.assert_allclose(got, x @ weight.T + bias, rtol=1e-4, atol=1e-4,
                                       err_msg=f"linear, {where}")
            got = np.asarray(nn.linear(cx, qweight))
            want = x.astype(np.float64) @ wq.T
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max(),
                                       err_msg=f"linear (float16 weight), {where}")
            got = np.asarray(nn.silu(cx))
            np.testing.assert_allclose(got, x / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6,
                                       err_msg=f"silu, {where}")

    run_threads(work)
