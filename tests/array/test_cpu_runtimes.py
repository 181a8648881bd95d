"""Every CPU runtime clops lists gets a matrix product right: where a runtime cannot build the
CPU GEMM kernel (PoCL 3.0 from the pocl-binary-distribution wheel on some processors: LLVM
there cannot select fma on 16-wide float vectors), products take the portable kernel instead of
failing."""

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


# runtimes that cannot build the CPU GEMM kernel here: PoCL 3.0 from the
# pocl-binary-distribution wheel on some hosts (its LLVM 14 selected no fma on 16-wide float
# vectors on AMD EPYC machines; on an Intel Xeon with AVX-512 it builds and runs the kernel)
FAILING = [d for d in CPUS if d.probe("builds") and not gemm.cpu_kernel_works(d, "float32")]


@pytest.mark.parametrize("dev", CPUS, ids=[d.selector for d in CPUS])
def test_cpu_products_follow_the_probe(dev):
    # a product takes gemm_cpu exactly where the runtime passed the probe; elsewhere the
    # portable kernel (test_matmul_on_every_cpu_runtime: right either way)
    if not dev.probe("builds"):
        pytest.skip(f"{dev.name} cannot build OpenCL C at all")
    assert gemm.cpu_supports(dev, "float32", 256, 256, 256) == \
        gemm.cpu_kernel_works(dev, "float32")


@pytest.mark.skipif(not FAILING or len(CPUS) < 2,
                    reason="needs a CPU runtime that fails the gemm_cpu probe (every one here "
                    "passes it) beside another")
def test_the_default_is_never_a_runtime_that_fails_the_probe(tmp_path):
    """Listed first (CLOPS_VISIBLE_DEVICES), a runtime that fails the probe is still not the
    default: the first CPU runtime that passes the product probe is; ``clops info`` marks the
    one that fails."""
    import os
    import subprocess
    import sys

    good = next(d for d in CPUS if d not in FAILING and gemm.cpu_kernel_works(d, "float32"))
    env = {**os.environ, "CLOPS_VISIBLE_DEVICES": f"{FAILING[0].selector},{good.selector}"}
    env.pop("CLOPS_DEVICE", None)
    code = "import clops; print(clops.device().caps.driver)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(good.caps.driver)
    info = subprocess.run([sys.executable, "-m", "clops", "info"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert "FAILED the gemm_cpu probe" in info.stdout
    assert info.stdout.count("gemm_cpu (vectorized)") >= 1
