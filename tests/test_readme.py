"""The README runs as written: every ``python`` code block in README.md runs as its own
script in a fresh interpreter (in a temporary folder) and exits cleanly; the OpenAI client
block talks to a ``clops serve`` this test starts (on a free port, in place of 8080)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKS = re.findall(r"^```python\n(.*?)^```", open(os.path.join(ROOT, "README.md"),
                                                    encoding="utf-8").read(), re.S | re.M)
NEEDS = {"dask": "dask", "openai": "openai", "clops.llm": "tokenizers"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(code: str, cwd, timeout: int = 600) -> subprocess.CompletedProcess:
    path = os.path.join(cwd, "block.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(code)
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, path], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "clops.serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"clops serve did not start: {proc.stderr.read()}") \
                        from None
                time.sleep(0.5)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_readme_has_its_blocks():
    assert len(BLOCKS) >= 8


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path, request):
    code = BLOCKS[index]
    for marker, module in NEEDS.items():
        if f"import {marker}" in code or f"from {marker}" in code:
            pytest.importorskip(module)
    if "base_url=" in code:
        port = request.getfixturevalue("server")
        code = code.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    out = _run(code, str(tmp_path))
    assert out.returncode == 0, f"README block {index + 1}:\n{code}\n{out.stderr[-3000:]}"
