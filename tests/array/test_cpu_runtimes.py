"""Every CPU runtime clops lists gets a matrix product right: where a runtime cannot build the
CPU GEMM kernel (PoCL 3.0 from the pocl-binary-distribution wheel: LLVM there cannot select
fma on 16-wide float vectors), products take the portable kernel instead of failing."""

from __future__ import annotations

import numpy as np
import pytest

import clops
from clops.kernels import gemm

CPUS = [d for d in clops.devices("cpu")]


@pytest.mark.parametrize("dev", CPUS, ids=[d.selector for d in CPUS])
def test_matmul_on_every_cpu_runtime(dev):
    if not dev.probe("builds"):
        pytest.skip(f"{dev.name} cannot build OpenCL C at all")
    a = np.random.default_rng(0).standard_normal((96, 128)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
    got = np.asarray(clops.asarray(a, device=dev) @ clops.asarray(b, device=dev))
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)


POCL30 = [d for d in CPUS if str(d.caps.driver).startswith("3.0")]


@pytest.mark.skipif(not POCL30, reason="no PoCL 3.0 runtime here (the pocl-binary-distribution "
                    "wheel's)")
def test_pocl_30_takes_the_portable_kernel():
    dev = POCL30[0]
    assert not gemm.cpu_kernel_works(dev, "float32")
    assert not gemm.cpu_supports(dev, "float32", 256, 256, 256)
