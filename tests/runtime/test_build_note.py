"""The first run says what it is doing: while a program compiles (a cold cache), a terminal
shows one line naming it and how many have compiled, erased when the build ends; output that
is not a terminal (logs, pipes, tests) gets nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = ("import numpy as np, clops; x = clops.asarray(np.ones(7, np.float32));"
        "print(float((x * 3.5 + 0.25).sum()))")


def _env(tmp_path, **extra):
    return {**os.environ, "CLOPS_CACHE_DIR": str(tmp_path / "cache"), **extra}


def _in_terminal(env) -> bytes:
    pty = pytest.importorskip("pty")
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout and stderr are the terminal
        os.execvpe(sys.executable, [sys.executable, "-c", CODE], env)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out


def test_a_terminal_sees_the_note_while_programs_build(tmp_path):
    out = _in_terminal(_env(tmp_path))
    assert b"[clops] compiling OpenCL program 1 for " in out
    assert b"\r\x1b[K" in out  # erased after the build
    assert out.rstrip().endswith(b"26.25")
    # built once: a second run reads the cache and compiles nothing (where clops keeps the
    # binaries: NVIDIA's driver caches its builds itself, and clops builds there every run)
    import clops

    if clops.device().programs.disk_dir is not None:
        assert b"compiling" not in _in_terminal(_env(tmp_path))


def test_the_note_can_be_turned_off(tmp_path):
    assert b"compiling" not in _in_terminal(_env(tmp_path, CLOPS_PROGRESS="0"))


def test_no_note_where_stderr_is_not_a_terminal(tmp_path):
    out = subprocess.run([sys.executable, "-c", CODE], env=_env(tmp_path), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "26.25"
    assert "compiling" not in out.stderr


REMARK = ('import clops; clops.device().kernel("#warning \\"a remark\\"\\n'
          '__kernel void k(__global int *x) { x[0] = 1; }", "k"); print("built")')


def test_a_drivers_remarks_on_a_build_stay_off_stderr(tmp_path):
    """A driver's compiler remarks on a build that succeeds are not the user's: PoCL writes
    clang's "N warnings generated." to the process's stderr itself (on CPUs without AVX-512
    for every kernel with 16-wide vectors; a #warning makes one on any CPU), which a quiet
    command (``clops run -q``) must not show. CLOPS_DEBUG prints the build log, with it."""
    out = subprocess.run([sys.executable, "-c", REMARK], env=_env(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "built", out.stderr
    assert out.stderr == ""
    debug = subprocess.run([sys.executable, "-c", REMARK], env=_env(tmp_path / "debug",
                                                                      CLOPS_DEBUG="1"),
                           capture_output=True, text=True, timeout=300)
    assert debug.returncode == 0 and "a remark" in debug.stderr, debug.stderr
