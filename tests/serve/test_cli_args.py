"""``clops serve``'s arguments: checked before anything loads, each mistake one line on stderr and
status 2; and a server whose engine thread dies exits with status 1 instead of hanging."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import clops
from clops.serve.cli import main, parser


def test_kv_cache_choice():
    assert parser().parse_args([]).kv_cache is None  # float16 on GPUs, float32 on CPUs
    assert parser().parse_args(["m.gguf", "--kv-cache", "float32"]).kv_cache == "float32"
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["--kv-cache", "int8"])
    assert info.value.code == 2


def test_defaults_a_public_server_can_keep():
    a = parser().parse_args([])
    assert (a.host, a.max_body, a.timeout, a.api_key, a.parse_special) == \
        ("127.0.0.1", 8 << 20, 30.0, None, False)
    assert parser().parse_args(["--max-body", "512KB"]).max_body == 512 << 10


def test_row_invariant_reaches_the_engine(monkeypatch):
    """``--row-invariant`` (off by default: a lone decode row may take the single-sequence
    kernel) is the engine's own switch, through ``Server`` and a Ray replica's spec."""
    from clops.cli.serve_ray import spec_of
    from clops.serve import app

    assert parser().parse_args([]).row_invariant is False
    a = parser().parse_args(["m.gguf", "--row-invariant"])
    assert a.row_invariant is True and spec_of(a).row_invariant is True
    made = {}
    monkeypatch.setattr(app, "BatchEngine", lambda model, **kw: made.update(kw) or kw)
    monkeypatch.setattr(app, "Runner", lambda engine, limit: None)
    backend = type("B", (), {"token_to_id": staticmethod(lambda marker: None)})()
    tok = type("T", (), {"eos_ids": [0], "backend": backend})()
    model = type("M", (), {"tokenizer": tok})()
    app.Server(model, row_invariant=True)
    assert made["row_invariant"] is True
    app.Server(model)
    assert made["row_invariant"] is False


@pytest.mark.parametrize("args,words", [
    (["--port", "-1"], "--port"), (["--port", "70000"], "from 1 to 65535"),
    (["--port", "http"], "not a whole number"),
    (["--parallel", "0"], "--parallel"), (["-np", "100000"], "from 1 to 1024"),
    (["--ctx-size", "-5"], "--ctx-size"), (["-c", "0"], ">= 2"),
    (["--queue", "-1"], "--queue"), (["--max-tokens", "0"], "--max-tokens"),
    (["--max-body", "10"], "at least 1KB"), (["--max-body", "lots"], "byte count"),
    (["--timeout", "0"], "--timeout"), (["--timeout", "nan"], "--timeout"),
    (["--api-key", ""], "empty"), (["--host", ""], "empty"),
])
def test_bad_options_are_one_line_and_status_2(capsys, args, words):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("clops serve: error:") and words in err, err


def test_a_missing_model_file_is_one_line(capsys, tmp_path):
    assert main([str(tmp_path / "nope.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no model at" in err and "nope.gguf" in err


def test_a_device_that_is_not_there_is_one_line(capsys):
    missing = ["no-such-device"]
    if not any(d.kind == "gpu" for d in clops.devices()):
        missing.append("gpu")
    for sel in missing:
        assert main(["--device", sel]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("clops serve: error:"), err


def test_a_server_whose_engine_dies_exits_with_status_1(tmp_path):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from ..llm.tiny import make_model

    make_model(str(tmp_path), "llama")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = textwrap.dedent(f"""
        import sys
        import clops.llm.batch as batch
        from clops.serve.cli import main

        class Fatal(BaseException):
            pass

        def step(self):
            raise Fatal("the device fell off the bus")

        batch.BatchEngine.step = step
        sys.exit(main([{str(tmp_path)!r}, "--port", "{port}", "-c", "64"]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        r = httpx.post(url + "/v1/completions", json={"prompt": "w1", "max_tokens": 4},
                       timeout=30)
        assert r.status_code == 503 and "fell off the bus" in r.json()["error"]["message"]
        assert proc.wait(timeout=60) == 1
        err = proc.stderr.read()
        assert "stopped: the engine thread failed (Fatal: the device fell off the bus)" in err
    finally:
        proc.kill()
        proc.wait()
