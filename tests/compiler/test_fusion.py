"""Fusion and caching: kernel counts measured with clops.profile(); renders and builds counted
by the compiler and the program cache."""

from __future__ import annotations

import numpy as np

import clops
from clops.compiler import realize as compiler_realize
from clops.compiler import render
from clops.runtime import BUILD_STATS


def _kernels(fn):
    with clops.profile() as prof:
        out = fn()
        np.asarray(out) if not isinstance(out, tuple) else [np.asarray(o) for o in out]
    return prof.kernel_count, out


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_mul_add_sum_is_one_kernel(device):
    a, b, c = (_rand(64, 33, seed=i) for i in range(3))
    ta, tb, tc = (clops.asarray(x, device=device) for x in (a, b, c))
    n, out = _kernels(lambda: (ta * tb + tc).sum(axis=1))
    assert n == 1
    np.testing.assert_allclose(np.asarray(out), (a * b + c).sum(axis=1), rtol=1e-5, atol=1e-4)


def test_row_softmax_is_at_most_two_kernels(device):
    x = _rand(50, 77)
    t = clops.asarray(x, device=device)

    def softmax():
        e = clops.exp(t - clops.max(t, axis=-1, keepdims=True))
        return e / clops.sum(e, axis=-1, keepdims=True)

    n, out = _kernels(softmax)
    assert n <= 2
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(out), e / e.sum(-1, keepdims=True), rtol=1e-5,
                               atol=1e-7)


def test_rmsnorm_and_layernorm_fuse(device):
    x = _rand(16, 64)
    t = clops.asarray(x, device=device)
    n, out = _kernels(lambda: t / clops.sqrt(clops.mean(t * t, axis=-1, keepdims=True) + 1e-6))
    assert n == 1
    np.testing.assert_allclose(np.asarray(out),
                               x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6), rtol=1e-5)
    n, out = _kernels(lambda: (t - clops.mean(t, axis=-1, keepdims=True)) /
                      clops.sqrt(clops.var(t, axis=-1, keepdims=True) + 1e-5))
    assert n == 1
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-5)


def test_several_outputs_of_one_region_share_a_kernel(device):
    a, b = _rand(100), _rand(100, seed=1)
    ta, tb = clops.asarray(a, device=device), clops.asarray(b, device=device)
    with clops.profile() as prof:
        x, y = ta * tb, ta + tb
        clops.realize(x, y)
    assert prof.kernel_count == 1
    np.testing.assert_allclose(np.asarray(x), a * b)
    np.testing.assert_allclose(np.asarray(y), a + b)


def test_second_call_renders_and_builds_nothing_and_new_shapes_reuse(device):
    def expr(t, u):
        return (clops.tanh(t) * 3 - u / 7).sum(axis=0)

    t, u = clops.asarray(_rand(9, 5), device=device), clops.asarray(_rand(9, 5, seed=3),
                                                                   device=device)
    np.asarray(expr(t, u))
    r0, b0 = render.RENDER_STATS["renders"], BUILD_STATS["builds"]
    np.asarray(expr(t, u))
    assert render.RENDER_STATS["renders"] == r0 and BUILD_STATS["builds"] == b0
    for shape in [(3, 2), (17, 11), (1, 40), (64, 3)]:
        x, y = _rand(*shape), _rand(*shape, seed=9)
        got = np.asarray(expr(clops.asarray(x, device=device), clops.asarray(y, device=device)))
        np.testing.assert_allclose(got, (np.tanh(x) * 3 - y / 7).sum(axis=0), rtol=1e-5,
                                   atol=1e-5)
    assert BUILD_STATS["builds"] == b0
    assert render.RENDER_STATS["renders"] == r0


def test_constants_are_arguments_not_structure(device):
    t = clops.asarray(_rand(10), device=device)
    np.asarray(t * 2.0 + 1.0)
    r0 = render.RENDER_STATS["renders"]
    for c in (3.0, -1.5, 1e10):
        np.testing.assert_allclose(np.asarray(t * c + 1.0), np.asarray(t) * np.float32(c) + 1,
                                   rtol=1e-6)
    assert render.RENDER_STATS["renders"] == r0


def test_matmul_is_one_kernel(device):
    a, b = _rand(7, 13), _rand(13, 5, seed=2)
    ta, tb = clops.asarray(a, device=device), clops.asarray(b, device=device)
    n, out = _kernels(lambda: ta @ tb)
    assert n == 1
    np.testing.assert_allclose(np.asarray(out), a @ b, rtol=1e-5, atol=1e-5)
    # batched, broadcast, vector forms
    c = _rand(2, 3, 13, 4, seed=5)
    np.testing.assert_allclose(np.asarray(ta @ clops.asarray(c, device=device)), a @ c,
                               rtol=1e-5, atol=1e-5)
    v = _rand(13, seed=6)
    np.testing.assert_allclose(np.asarray(ta @ clops.asarray(v, device=device)), a @ v,
                               rtol=1e-5, atol=1e-5)


def test_launch_counter_moves():
    before = compiler_realize.STATS["launches"]
    np.asarray(clops.asarray([1.0, 2.0]) * 2)
    assert compiler_realize.STATS["launches"] == before + 1
