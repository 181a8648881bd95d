"""clops.jit from many threads at once: functions jitted once and called from eight threads, each
with inputs of its own (so that the threads capture and replay the same traces at the same
time), give numpy's results."""

from __future__ import annotations

import numpy as np

import clops
from tests.threads import THREADS, run_threads

CALLS = 6  # per thread and function


@clops.jit
def affine_tanh_sum(x, w, b):
    return clops.tanh(x @ w + b).sum(axis=-1)


@clops.jit
def softmax_rows(x):
    e = clops.exp(x - clops.max(x, axis=-1, keepdims=True))
    return e / clops.sum(e, axis=-1, keepdims=True)


@clops.jit
def long_sum(x):
    # one row of 100k: a split reduction, its partials in a buffer of the trace (not an output)
    return clops.sum(x * 0.5 + 1.0)


@clops.jit
def clip_cast(a, b):
    return clops.astype(clops.where(a > b, a - b, b - a), clops.int32), clops.mean(a * b)


def _numpy_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_jitted_functions_called_from_threads_at_once(device):
    w = np.random.default_rng(99).standard_normal((16, 8)).astype(np.float32)
    b = np.random.default_rng(98).standard_normal(8).astype(np.float32)
    cw, cb = clops.asarray(w, device=device), clops.asarray(b, device=device)

    def work(t: int) -> None:
        for r in range(CALLS):
            rng = np.random.default_rng(100 * t + r)
            # half of the threads share each shape: the same trace captured and replayed at once
            rows = 3 + t % 2
            x = rng.standard_normal((rows, 16)).astype(np.float32)
            got = np.asarray(affine_tanh_sum(clops.asarray(x, device=device), cw, cb))
            np.testing.assert_allclose(got, np.tanh(x @ w + b).sum(-1), rtol=1e-4, atol=1e-5,
                                       err_msg=f"affine_tanh_sum, thread {t}, call {r}")

            s = (rng.standard_normal((rows + 2, 33)) * 4).astype(np.float32)
            got = np.asarray(softmax_rows(clops.asarray(s, device=device)))
            np.testing.assert_allclose(got, _numpy_softmax(s), rtol=1e-5, atol=1e-7,
                                       err_msg=f"softmax_rows, thread {t}, call {r}")

            v = rng.integers(-100, 100, 100_000).astype(np.float32)
            got = float(long_sum(clops.asarray(v, device=device)))
            assert got == float((v * 0.5 + 1.0).sum(dtype=np.float64)), ("long_sum", t, r)

            a = rng.integers(0, 50, (4, 5)).astype(np.float32)
            c = rng.integers(0, 50, (4, 5)).astype(np.float32)
            i, m = clip_cast(clops.asarray(a, device=device), clops.asarray(c, device=device))
            np.testing.assert_array_equal(np.asarray(i), np.abs(a - c).astype(np.int32))
            np.testing.assert_allclose(float(m), (a * c).mean(), rtol=1e-6)

    run_threads(work)
    # (each shape's trace is kept once, whichever thread captured it last)
    assert len(long_sum.traces) == 1 and len(softmax_rows.traces) == 2


def test_one_trace_replayed_by_threads_at_once(device):
    # captured first, then only replayed: the replays share the buffers the trace made besides
    # its output (the product, the packed weight, the sums' partials)
    @clops.jit
    def energy(x, w):
        h = clops.tanh(x @ w)
        return clops.sum(h * h) + clops.sum(x)

    rng = np.random.default_rng(7)
    w = (rng.standard_normal((256, 64)) * 0.1).astype(np.float32)
    cw = clops.asarray(w, device=device)
    inputs = [rng.standard_normal((32, 256)).astype(np.float32) for _ in range(THREADS)]
    xs = [clops.asarray(v, device=device).realize() for v in inputs]
    energy(xs[0], cw)
    want = [float((np.tanh(v.astype(np.float64) @ w) ** 2).sum() + v.sum(dtype=np.float64))
            for v in inputs]

    def work(t: int) -> None:
        for r in range(4 * CALLS):  # (replays alone: fast)
            j = (t + r) % THREADS
            got = float(energy(xs[j], cw))
            np.testing.assert_allclose(got, want[j], rtol=1e-4, err_msg=f"thread {t}, call {r}")

    run_threads(work)
    assert len(energy.traces) == 1
