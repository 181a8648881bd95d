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


@pytest.mark.skipif(not POCL30 or len(CPUS) < 2, reason="needs PoCL 3.0 beside another CPU "
                    "runtime")
def test_the_default_is_never_a_runtime_that_fails_the_probe(tmp_path):
    """Listed first (CLOPS_VISIBLE_DEVICES), PoCL 3.0 is still not the default: the first CPU
    runtime that passes the product probe is; ``clops info`` marks the one that fails."""
    import os
    import subprocess
    import sys

    good = next(d for d in CPUS if d not in POCL30 and gemm.cpu_kernel_works(d, "float32"))
    env = {**os.environ, "CLOPS_VISIBLE_DEVICES": f"{POCL30[0].selector},{good.selector}"}
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
