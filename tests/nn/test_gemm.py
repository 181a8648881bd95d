"""The hand-written GEMM (clops/kernels/gemm.cl): its portable kernel on every device, for
float32 and float16, plain and batched, against numpy; and clops.matmul's choice of it."""

from __future__ import annotations

import numpy as np
import pytest

import clops
from clops.kernels import gemm

RNG = np.random.default_rng(1)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("batch", [1, 2])
def test_gemm_portable(device, dtype, batch):
    m, n, k = 256, 128, 64
    a = RNG.standard_normal((batch, m, k)).astype(dtype)
    b = RNG.standard_normal((batch, k, n)).astype(dtype)
    ta = clops.asarray(a, device=device).realize()
    tb = clops.asarray(b, device=device).realize()
    tc = clops.empty((batch, m, n), dtype=getattr(clops, dtype), device=device)
    assert gemm.supports(device, dtype, m, n, k, (ta.offset, tb.offset), (), force=True)
    gemm.gemm(device, tc.buffer, tc.offset, n, ta.buffer, ta.offset, k, tb.buffer, tb.offset, n,
              m, n, k, dtype, batch, (m * n, m * k, k * n), portable=True)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = np.asarray(tc).astype(np.float64)
    tol = 1e-5 if dtype == "float32" else 2e-3
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < tol


def test_gemm_tensor_cores(device):
    # the inline-PTX mma.sync kernel, where the device has it (NVIDIA), through clops.matmul
    if not gemm.use_mma(device, "float16"):
        pytest.skip("no NVIDIA inline PTX on this device")
    m, n, k = 512, 256, 1024
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((k, n)).astype(np.float16)
    assert gemm.supports(device, "float16", m, n, k, (0, 0), ())
    got = np.asarray(clops.matmul(clops.asarray(a, device=device),
                                  clops.asarray(b, device=device))).astype(np.float64)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3


def test_matmul_dispatch(device):
    # CPUs and small products keep the generated kernel; the result is the same either way
    a = RNG.standard_normal((128, 256)).astype(np.float32)
    b = RNG.standard_normal((256, 128)).astype(np.float32)
    got = np.asarray(clops.matmul(clops.asarray(a, device=device), clops.asarray(b, device=device)))
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)
    assert not gemm.supports(device, "float32", 100, 128, 128, (), (), force=True)
