"""CLBlast provider: GEMM, batched GEMM and GEMV against numpy over layouts (transposed,
strided, offset, broadcast batches), dependency tracking, profiler records, and clops without
the library."""

from __future__ import annotations

import numpy as np
import pytest

import clops
from clops import providers
from clops.array import dispatch
from clops.kernels import layout
from clops.providers import CLBlastProvider

CLBLAST = providers.get("clblast")
needs_clblast = pytest.mark.skipif(not CLBLAST.available,
                                   reason=f"CLBlast missing: {CLBLAST.unavailable_reason()}")
RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@needs_clblast
def test_gemm_layouts(device, up, down):
    m, n, k = 33, 17, 29
    a, b = rand(m, k), rand(k, n)
    c = layout.empty(device, (m, n), "float32")
    CLBLAST.gemm(device, up(a), up(b), c)
    np.testing.assert_allclose(down(c), a @ b, rtol=1e-5, atol=1e-5)
    # a given as a column-major (transposed) view, at an offset inside a bigger buffer
    store = np.zeros(5 + m * k, np.float32)
    store[5:] = a.T.ravel()
    a_t = up(store, (m, k), (1, m), 5)
    # c column-major: computed as c^T = b^T a^T, no copy
    c_t = layout.empty(device, (n, m), "float32").with_shape((m, n), (1, m))
    CLBLAST.gemm(device, a_t, up(b), c_t, alpha=2.0)
    np.testing.assert_allclose(down(c_t), 2 * a @ b, rtol=1e-5, atol=1e-5)
    # every other column: no leading dimension fits, so a relayout on the device
    wide = rand(m, 2 * k)
    c2 = up(np.ones((m, n), np.float32))
    CLBLAST.gemm(device, up(wide, (m, k), (2 * k, 2)), up(b), c2, beta=1.0)
    np.testing.assert_allclose(down(c2), wide[:, ::2] @ b + 1, rtol=1e-5, atol=1e-5)


@needs_clblast
def test_gemm_batched(device, up, down):
    m, n, k = 16, 12, 8
    a, b = rand(3, 4, m, k), rand(4, k, n)
    bb = up(b, (3, 4, k, n), (0, k * n, n, 1))  # broadcast over the first batch dim
    c = layout.empty(device, (3, 4, m, n), "float32")
    CLBLAST.gemm_batched(device, up(a), bb, c)
    np.testing.assert_allclose(down(c), a @ b, rtol=1e-5, atol=1e-5)
    c2 = layout.empty(device, (12, m, n), "float32")  # one uniform batch stride
    CLBLAST.gemm_batched(device, up(a.reshape(12, m, k)), up(np.tile(b, (3, 1, 1))), c2)
    np.testing.assert_allclose(down(c2), (a @ b).reshape(12, m, n), rtol=1e-5, atol=1e-5)


@needs_clblast
def test_gemv(device, up, down):
    m, n = 40, 24
    a, x = rand(m, n), rand(n)
    y = layout.empty(device, (m,), "float32")
    CLBLAST.gemv(device, up(a), up(x), y)
    np.testing.assert_allclose(down(y), a @ x, rtol=1e-5, atol=1e-5)
    # transposed matrix, strided x and y
    at = up(np.ascontiguousarray(a.T), (m, n), (1, m))
    xs = up(np.repeat(x, 3), (n,), (3,))
    ys = layout.empty(device, (2 * m,), "float32").with_shape((m,), (2,))
    CLBLAST.gemv(device, at, xs, ys, alpha=0.5)
    np.testing.assert_allclose(down(ys), 0.5 * a @ x, rtol=1e-5, atol=1e-5)


@needs_clblast
def test_shape_and_status_errors(device, up):
    a = up(rand(4, 5))
    with pytest.raises(ValueError, match=r"\(4, 5\) @ \(4, 5\)"):
        CLBLAST.gemm(device, a, a, layout.empty(device, (4, 5), "float32"))
    if not device.caps.fp16_extension:
        assert "cl_khr_fp16" in CLBLAST.cannot("gemm", device, "float16")


@needs_clblast
def test_waits_for_pending_writes_and_marks_its_own(device, gate, up, down):
    m, n, k = 8, 8, 8
    a, b = rand(m, k), rand(k, n)
    ob = up(b)
    held = layout.empty(device, (m, k), "float32")
    # the write of a is held back behind the gate; the provider call must wait for it
    device.write(held.buffer, a, wait_for=[clops.Event(gate.event)])
    c = layout.empty(device, (m, n), "float32")
    ev = CLBLAST.gemm(device, held, ob, c)
    assert c.buffer.last_write[0] is ev.cl_event
    assert not ev.done
    gate.open()
    np.testing.assert_allclose(down(c), a @ b, rtol=1e-5, atol=1e-5)


@needs_clblast
def test_profiler_and_tensor_matmul(device, clops_env):
    clops_env(CLOPS_PROVIDERS="+clblast")
    a, b, v = rand(32, 24), rand(24, 16), rand(24)
    x, y, w = (clops.asarray(t, device=device) for t in (a, b, v))
    with clops.profile() as prof:
        out = dispatch.matmul(x, y)
        vec = dispatch.matmul(x, w)
        bat = dispatch.matmul(clops.asarray(rand(2, 32, 24), device=device), y)
        np.testing.assert_allclose(np.asarray(out), a @ b, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(vec), a @ v, rtol=1e-5, atol=1e-5)
        assert bat.shape == (2, 32, 16)
    names = {r.name for r in prof.records if r.kind == "provider"}
    assert {"CLBlastSgemm", "CLBlastSgemv"} <= names
    assert all(r.extra["provider"] == "clblast" for r in prof.records if r.kind == "provider")


def test_without_the_library(device, clops_env, monkeypatch):
    missing = CLBlastProvider(library="libclblast-not-here.so")
    assert not missing.available and "not found" in missing.unavailable_reason()
    monkeypatch.setitem(providers.registry._REGISTRY, "clblast", missing)
    clops_env(CLOPS_PROVIDERS="+clblast")
    x = clops.asarray(rand(8, 8), device=device)
    assert providers.choose("gemm", device, "float32", (8, 8, 8)) is None
    assert dispatch.matmul(x, x) is None  # the array layer runs its generated kernel


def test_denied(device, clops_env):
    clops_env(CLOPS_PROVIDERS="-clblast")
    x = clops.asarray(rand(8, 8), device=device)
    assert dispatch.matmul(x, x) is None


@needs_clblast
@pytest.mark.parametrize("m,n,k", [(8, 8, 8), (3, 5, 2), (256, 256, 256)])
def test_forced_provider_takes_every_product_it_can(device, clops_env, m, n, k):
    # +clblast: small products (under the threshold that keeps them generated) and products
    # clops' own GEMM kernels would take (gemm_cpu on CPUs: 256^3) all go to CLBlast
    clops_env(CLOPS_PROVIDERS="+clblast")
    a, b = rand(m, k), rand(k, n)
    x, y = clops.asarray(a, device=device), clops.asarray(b, device=device)
    with clops.profile() as prof:
        got = np.asarray(clops.matmul(x, y))
    calls = [r for r in prof.records if r.kind == "provider" and r.extra["provider"] == "clblast"]
    assert len(calls) == 1
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
    clops_env(CLOPS_PROVIDERS="clblast")  # allowed, not forced: small ones stay generated
    with clops.profile() as prof:
        np.asarray(clops.matmul(x, y) if m * n * k < 1 << 21 else x + 0)
    assert not [r for r in prof.records if r.kind == "provider"]
