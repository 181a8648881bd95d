"""The command line: ``python -m clops info`` and ``python -m clops demo`` in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys

import clops
from clops.runtime import CLDevice


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clops", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_info() -> None:
    res = _run("info")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert out.startswith(f"clops {clops.__version__}: {len(clops.devices())} OpenCL device(s)")
    for d in clops.devices():
        assert d.selector in out and d.name in out
    assert out.count("capabilities") == len(clops.devices())
    assert "builds=yes" in out
    from clops.runtime import cmdbuf

    for d in clops.devices():  # how each device replays launch plans
        ok, why = cmdbuf.support(d.queue.cl_queue)
        assert ("one command buffer a replay" if ok else why) in out


def test_info_without_probes() -> None:
    res = _run("info", "--no-probe")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "builds=" not in res.stdout and "fp64=" in res.stdout


def test_demo(device: CLDevice) -> None:
    res = _run("demo", env={"CLOPS_DEVICE": device.selector})
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"device: {device.selector}" in res.stdout
    assert "matches numpy" in res.stdout and "WRONG" not in res.stdout


def test_no_command_prints_help() -> None:
    res = _run()
    assert res.returncode == 0
    assert "info" in res.stdout and "demo" in res.stdout
