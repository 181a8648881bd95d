"""Split reductions of one long row finished in one kernel (GPUs): the last work-group to store
its part adds up the parts. The GPU path is forced on whatever device the tests use."""

from __future__ import annotations

import numpy as np
import pytest

import clops
from clops.compiler import realize


def _kernels(fn):
    before = realize.STATS["launches"]
    out = fn()
    return out, realize.STATS["launches"] - before


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod", "any", "all"])
@pytest.mark.parametrize("dtype", ["float32", "int32", "float16"])
def test_one_kernel_full_reduction(gpu_path, op, dtype):
    rng = np.random.default_rng(0)
    n = 300_001  # not a multiple of the chunks or the vector width
    if op == "prod":
        a = rng.choice([1, -1], n).astype(dtype)
        a[::20000] = 2 if dtype != "float16" else 1  # 2**16: exact in every dtype
    elif op in ("any", "all"):
        a = (rng.random(n) < 0.999).astype(dtype)
    else:
        a = (rng.standard_normal(n) * 100).astype(dtype)
    x = clops.asarray(a, device=gpu_path).realize()
    fn = {"sum": clops.sum, "max": clops.max, "min": clops.min, "prod": clops.prod,
          "any": lambda t: clops.any(t), "all": lambda t: clops.all(t)}[op]
    ref = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod, "any": np.any,
           "all": np.all}[op]
    for _ in range(3):  # the counter is set back by each kernel
        got, launches = _kernels(lambda: np.asarray(fn(x)))
        assert launches == 1
        want = ref(a.astype(np.float64) if dtype == "float16" and op == "sum" else a)
        if dtype == "float32" and op == "sum":
            np.testing.assert_allclose(got, want, rtol=1e-5)
        elif dtype == "float16" and op == "sum":
            np.testing.assert_allclose(float(got), float(want), rtol=1e-3)
        else:
            assert got == want


def test_epilogue_keeps_two_kernels(gpu_path):
    # mean = sum * (1/n): the output is not the reduction itself; stage 2 stays its own kernel
    a = np.random.default_rng(1).standard_normal(100_000).astype(np.float32)
    x = clops.asarray(a, device=gpu_path).realize()
    got, launches = _kernels(lambda: float(clops.mean(x)))
    assert launches == 2
    np.testing.assert_allclose(got, a.mean(dtype=np.float64), rtol=1e-5, atol=1e-7)


def test_into_a_view_and_keepdims(gpu_path):
    a = np.random.default_rng(2).standard_normal(50_000).astype(np.float32)
    x = clops.asarray(a, device=gpu_path).realize()
    got = np.asarray(clops.sum(x.reshape((1, -1)), axis=1, keepdims=True))
    np.testing.assert_allclose(got, a.sum(dtype=np.float64).reshape(1, 1), rtol=1e-5)
    out = clops.zeros(4, dtype=clops.float32, device=gpu_path).realize()
    out[2] = clops.max(x)
    np.testing.assert_array_equal(np.asarray(out), [0, 0, a.max(), 0])


def test_rows_keep_two_kernels(gpu_path):
    # several long rows: each row's parts are added by a kernel of their own
    a = np.random.default_rng(3).standard_normal((3, 40_000)).astype(np.float32)
    x = clops.asarray(a, device=gpu_path).realize()
    got = np.asarray(clops.sum(x, axis=1))
    np.testing.assert_allclose(got, a.sum(1, dtype=np.float64), rtol=1e-5)


def test_counter_is_shared_and_ordered(gpu_path):
    # two reductions in a row on the same counter (the second waits for the first)
    a = np.arange(70_000, dtype=np.float32)
    x = clops.asarray(a, device=gpu_path).realize()
    s1, s2 = clops.sum(x), clops.max(x)
    assert float(s1) == pytest.approx(a.sum(dtype=np.float64), rel=1e-6)
    assert float(s2) == a.max()
    assert realize.counter(gpu_path) is realize.counter(gpu_path)


def _first_stage_groups(t) -> int:
    """Work-groups of the schedule's widest kernel (a split reduction's first stage)."""
    p = clops.compiler.schedule_of(t)
    return max(k.geometry.global_size[0] // (k.geometry.local_size or (1,))[0]
               for k in p.kernels)


@pytest.mark.parametrize("n", [70_001, 300_000])
def test_a_reduction_inside_a_long_row_splits_too(gpu_path, n):
    """argmax (the max, then the first index holding it), var (the mean) and logsumexp (the
    max) of one long row: the inner reduction is computed first, split, and the outer one
    splits as well, rather than one work-group walking the row (special values included)."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal(n).astype(np.float32)
    a[[5, n // 2, n - 1]] = a.max() + 1  # ties: the first index wins
    x = clops.asarray(a, device=gpu_path).realize()

    def lse(t):
        m = clops.max(t, keepdims=True)
        return clops.log(clops.sum(clops.exp(t - m), keepdims=True)) + m

    for make in (clops.argmax, clops.var, lse):
        assert _first_stage_groups(make(x)) > 1
    assert int(clops.argmax(x)) == 5
    assert int(clops.argmin(x)) == int(a.argmin())
    np.testing.assert_allclose(float(clops.var(x)), a.astype(np.float64).var(), rtol=1e-5)
    m = a.astype(np.float64).max()
    want = np.log(np.exp(a.astype(np.float64) - m).sum()) + m
    np.testing.assert_allclose(float(np.asarray(lse(x)).ravel()[0]), want, rtol=1e-6)
    b = a.copy()
    b[7] = np.nan
    y = clops.asarray(b, device=gpu_path).realize()
    assert int(clops.argmax(y)) == 7 and int(clops.argmin(y)) == 7
    assert np.isnan(float(clops.var(y)))
