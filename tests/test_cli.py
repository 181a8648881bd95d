"""The ``clops`` command line: every subcommand listed and helped, every bad argument one line on
stderr and status 2 (in a fresh process, no traceback), ``clops run`` and its older spellings
alike, ``clops chat``'s conversation (history, /clear, Ctrl-C, piped input) and ``clops bench``'s
table and JSON, on the tiny test model."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

import clops
from clops.__main__ import main as clops_main
from clops.cli import bench, chat

SUBCOMMANDS = ("run", "chat", "serve", "bench", "info", "demo", "cache")
HERE = os.path.abspath(__file__)  # a file that is there but no model: the device is checked


def _clops(*args: str | bytes, stdin: bytes | None = None, module: str = "clops",
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", module, *args], input=stdin,
                          capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8", "CLOPS_PROGRESS": "0",
                               **(env or {})})


def _missing_device() -> str:
    return "gpu" if not any(d.kind == "gpu" for d in clops.devices()) else "gpu:99"


# -- help -------------------------------------------------------------------------------------
def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as info:
        clops_main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("    ")]
    assert set(SUBCOMMANDS) <= set(listed), out


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_each_subcommand_has_help(sub, capsys):
    with pytest.raises(SystemExit) as info:
        clops_main([sub, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: clops {sub}"), out


@pytest.mark.parametrize("sub", ["run", "chat", "serve", "bench"])
def test_model_options_are_spelled_alike(sub, capsys):
    with pytest.raises(SystemExit):
        clops_main([sub, "--help"])
    out = capsys.readouterr().out
    for spelling in ("-m PATH, --model PATH", "-c N, --ctx-size N", "--device SEL"):
        assert spelling in out, (sub, spelling)
    if sub in ("run", "chat"):
        for spelling in ("--temp T", "--top-k K", "--top-p P", "-s N, --seed N", "-n N"):
            assert spelling in out, (sub, spelling)
    assert "--ctx " not in out and "--temperature" not in out  # old spellings: hidden


# -- bad arguments: one line, status 2 ----------------------------------------------------------
BAD = [
    ("run", ["-p", "hi", "--bogus"], ["unrecognized arguments: --bogus"]),
    ("run", ["-p", "hi", "-n", "-1"], ["-n/--n-predict", "out of range"]),
    ("run", ["-p", "hi", "-m", "/no/such/model.gguf"], ["no model at", "model.gguf"]),
    ("run", ["-p", "hi", "-m", HERE, "--device", _missing_device()], ["no OpenCL device"]),
    ("run", ["-p", b"caf\xe9"], ["--prompt", "not valid UTF-8"]),
    ("run", ["-f", "/no/such/prompt.txt"], ["cannot read the prompt file"]),
    ("run", [], ["one of the arguments -p/--prompt -f/--file is required"]),
    ("run", ["-p", "hi", "--chat", "--no-chat"], ["not allowed with argument --chat"]),
    ("run", ["-p", "hi", "--no-chat", "-sys", "Be brief."], ["-sys", "leave out --no-chat"]),
    ("chat", ["--bogus"], ["unrecognized arguments: --bogus"]),
    ("chat", ["-c", "0"], ["-c/--ctx-size", "out of range"]),
    ("chat", ["-m", "/no/such/model.gguf"], ["no model at"]),
    ("chat", ["-m", HERE, "--device", _missing_device()], ["no OpenCL device"]),
    ("chat", ["-sys", b"\xff\xfe"], ["--system-prompt", "not valid UTF-8"]),
    ("serve", ["--bogus"], ["unrecognized arguments: --bogus"]),
    ("serve", ["--port", "70000"], ["--port", "from 1 to 65535"]),
    ("serve", ["-m", "/no/such/model.gguf"], ["no model at"]),
    ("serve", ["-m", HERE, "--device", _missing_device()], ["no OpenCL device"]),
    ("serve", ["--name", b"m\xff"], ["--name", "not valid UTF-8"]),
    ("bench", ["--bogus"], ["unrecognized arguments: --bogus"]),
    ("bench", ["-r", "0"], ["-r/--repetitions", "out of range"]),
    ("bench", ["-p", "0", "-n", "0"], ["nothing to measure"]),
    ("bench", ["-c", "16"], ["too small for the tests", "513"]),
    ("bench", ["-m", "/no/such/model.gguf"], ["no model at"]),
    ("bench", ["-m", HERE, "--device", _missing_device()], ["no OpenCL device"]),
    ("bench", ["--device", b"gpu\xff"], ["--device", "not valid UTF-8"]),
    ("info", ["--bogus"], ["unrecognized arguments: --bogus"]),
    # (-m HERE: the split is checked before any model is read, also where the default model
    # is not installed)
    ("run", ["-m", HERE, "-p", "hi", "-ts", "1,x"], ["-ts/--tensor-split", "positive numbers"]),
    ("run", ["-m", HERE, "-p", "hi", "-ts", "1,-1"], ["-ts/--tensor-split", "positive number"]),
    ("run", ["-m", HERE, "-p", "hi", "-ts", "1,1"],
     ["--tensor-split gives 2 shares for 1 device"]),
    ("serve", ["-m", HERE, "-ts", "3,1"], ["--tensor-split gives 2 shares for 1 device"]),
    ("info", ["-m", "/no/such/model.gguf"], ["no model at"]),
    ("info", ["-m", HERE, "--device", "cpu", "-ts", "1,1"], ["--tensor-split gives 2 shares"]),
    ("demo", ["extra"], ["unrecognized arguments: extra"]),
]


@pytest.mark.parametrize("sub, args, words", BAD,
                         ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(BAD)])
def test_a_bad_argument_is_one_line_and_status_2(sub, args, words):
    res = _clops(sub, *args)
    err = res.stderr.decode("utf-8", "backslashreplace")
    assert res.returncode == 2, err
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"clops {sub}: error: "), err
    for w in words:
        assert w in lines[0], err
    assert res.stdout == b""


def test_a_model_larger_than_the_memory_is_refused_with_its_bytes():
    # (the pool's limit stands for a device's memory)
    for sub, args in (("info", ["-m", _smollm2()]), ("run", ["-p", "hi"])):
        res = _clops(sub, *args, env={"CLOPS_MEMORY_LIMIT": "64MB"})
        err = res.stderr.decode()
        assert res.returncode == 2 and len(err.splitlines()) == 1, err
        assert "does not fit the device" in err and "layers 0-29 + embedding + head" in err
        assert re.search(r"needs [0-9.]+ [MG]iB, 64\.0 MiB free", err) and "Traceback" not in err
    res = _clops("info", "-m", _smollm2(), "-c", "512")
    assert res.returncode == 0, res.stderr
    assert "layers 0-29 + embedding + head" in res.stdout.decode()


def test_info_says_where_a_split_model_would_go():
    # two CPU runtimes (Intel's and PoCL, where both are here): the layers by the shares given
    cpus = {d.platform_name: d for d in clops.devices() if d.kind == "cpu"}
    if len(cpus) < 2:
        pytest.skip("one CPU runtime here: a split over two platforms needs two")
    a, b = list(cpus.values())[:2]
    res = _clops("info", "-m", _smollm2(), "--device", f"{a.selector},{b.selector}", "-ts",
                 "2,1", "-c", "256")
    out = res.stdout.decode()
    assert res.returncode == 0, res.stderr
    assert "30 layers on 2 device(s)" in out
    assert f"{a.selector} ({a.name}): layers 0-19 + embedding" in out
    assert f"{b.selector} ({b.name}): layers 20-29 + head" in out


def _smollm2() -> str:
    from clops.llm import default_model_path

    return default_model_path()


def test_an_unknown_subcommand_is_one_line_and_status_2():
    res = _clops("talk", "-m", "x")
    err = res.stderr.decode()
    assert res.returncode == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("clops: error: unknown command 'talk'"), err
    assert "run, chat, serve, bench, info" in err


def test_old_spellings_still_parse():
    from clops.cli.run import build_parser
    from clops.serve.cli import parser

    old = build_parser().parse_args(["-p", "x", "--ctx", "64", "--temperature", "0.5",
                                     "--seed", "3"])
    new = build_parser().parse_args(["-p", "x", "-c", "64", "--temp", "0.5", "-s", "3"])
    assert vars(old) == vars(new)
    assert (new.ctx_size, new.temp, new.seed) == (64, 0.5, 3)
    assert parser().parse_args(["m.gguf", "--ctx", "99"]).ctx_size == 99
    a, b = (parser().parse_args(x) for x in (["--max-tokens", "9"], ["-n", "9"]))
    assert a.max_tokens == b.max_tokens == 9


def test_serve_takes_one_model(capsys):
    from clops.serve.cli import main

    with pytest.raises(SystemExit) as info:
        main(["a.gguf", "-m", "b.gguf"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "two models given ('a.gguf' and -m 'b.gguf')" in err


# -- the tiny model ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    pytest.importorskip("transformers")
    from .llm.tiny import make_model

    path = tmp_path_factory.mktemp("tiny")
    make_model(str(path), "llama")
    return str(path)


@pytest.fixture(scope="module")
def model(tiny):
    return clops.llm.load(tiny, progress=False)


def _greedy(model, messages, n) -> str:
    return "".join(model.generate(messages, max_new_tokens=n))


def test_run_and_its_older_spellings_write_the_same_text(tiny, model):
    runs = [_clops("run", "-m", tiny, "-p", "w1 w2 w3", "-n", "6", "-c", "64", "--temp", "0",
                   "-q", "--no-chat", "--device", model.device.selector),
            _clops("-m", tiny, "-p", "w1 w2 w3", "-n", "6", "--ctx", "64", "--temperature",
                   "0", "-q", "--no-chat", "--device", model.device.selector,
                   module="clops.llama")]
    for res in runs:
        assert res.returncode == 0, res.stderr.decode()
        assert res.stderr == b""  # -q: only the text
    want = "".join(model.generate("w1 w2 w3", max_new_tokens=6))
    assert want.strip()
    assert runs[0].stdout.decode() == runs[1].stdout.decode() == want + "\n"


def test_run_takes_a_hub_id_from_the_local_cache(tiny, model, tmp_path):
    """``-m org/name`` is the model of huggingface_hub's cache (offline); an id that is not
    cached is one line, with how to download it, and status 2."""
    pytest.importorskip("huggingface_hub")
    from .llm.test_hub import cached

    cached(tmp_path, "someorg/tiny", {name: os.path.join(tiny, name) for name in os.listdir(tiny)})
    env = {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    res = _clops("run", "-m", "someorg/tiny", "-p", "w1 w2 w3", "-n", "6", "--temp", "0", "-q",
                 "--device", model.device.selector, env=env)
    assert res.returncode == 0, res.stderr.decode()
    assert res.stdout.decode() == _greedy(model, [{"role": "user", "content": "w1 w2 w3"}],
                                          6) + "\n"
    res = _clops("run", "-m", "someorg/absent", "-p", "hi", env=env)
    err = res.stderr.decode()
    assert res.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert "someorg/absent" in err and "download" in err and "Traceback" not in err


def test_run_uses_the_chat_template_unless_told_not_to(tiny, model, tmp_path):
    """A model with a chat template gets the prompt through it (an instruct model answers);
    --no-chat continues the plain text."""
    import json
    import shutil

    copy = tmp_path / "templated"
    shutil.copytree(tiny, copy)
    with open(copy / "tokenizer_config.json") as f:
        conf = json.load(f)
    conf["chat_template"] = "{% for m in messages %}w7 w8 {{ m['content'] }} w9 {% endfor %}"
    with open(copy / "tokenizer_config.json", "w") as f:
        json.dump(conf, f)
    templated = clops.llm.load(str(copy), device=model.device, progress=False)
    chat = _greedy(templated, [{"role": "user", "content": "w1 w2 w3"}], 6)
    plain = _greedy(templated, "w1 w2 w3", 6)
    assert chat != plain
    for flags, want in (([], chat), (["--chat"], chat), (["--no-chat"], plain)):
        res = _clops("run", "-m", str(copy), "-p", "w1 w2 w3", "-n", "6", "--temp", "0", "-q",
                     "--device", model.device.selector, *flags)
        assert res.returncode == 0, res.stderr.decode()
        assert res.stdout.decode() == want + "\n", flags


def test_run_reads_the_prompt_from_a_file_or_stdin(tiny, model, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"w1 \xff")
    res = _clops("run", "-m", tiny, "-f", str(bad), "-q")
    assert res.returncode == 2 and b"not valid UTF-8 text (byte 3)" in res.stderr
    res = _clops("run", "-m", tiny, "-f", "-", "-n", "4", "-q", "--no-chat", "--device",
                 model.device.selector, stdin=b"w5 w6")
    assert res.returncode == 0, res.stderr.decode()
    assert res.stdout.decode() == _greedy(model, "w5 w6", 4) + "\n"


def _lines(*items):
    """A reader of ``items`` for converse: strings, or exceptions to raise in their place."""
    queue = list(items)

    def read():
        if not queue:
            return None
        item = queue.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    return read


def test_chat_keeps_the_conversation_and_clear_forgets_it(model):
    out, notes = io.StringIO(), []
    c = chat.Chat(model, n_predict=5, out=out, note=notes.append)
    status = chat.converse(c, _lines("w1 w2", "", "w3 w4", "/clear", "w3 w4", "/exit", "w9"))
    assert status == 0
    replies = out.getvalue().split("\n")
    assert len(replies) == 4 and replies[-1] == ""  # three replies; nothing after /exit
    u1, u2 = ({"role": "user", "content": t} for t in ("w1 w2", "w3 w4"))
    a1 = {"role": "assistant", "content": replies[0]}
    assert replies[0] == _greedy(model, [u1], 5)
    assert replies[1] == _greedy(model, [u1, a1, u2], 5)  # the whole conversation
    assert replies[2] == _greedy(model, [u2], 5)  # after /clear: this message alone
    assert replies[1] != replies[2]  # (so the history made a difference)
    assert "the conversation is forgotten" in notes


def test_chat_system_prompt_stays_after_clear(model):
    out = io.StringIO()
    c = chat.Chat(model, system="w7 w8", n_predict=4, out=out, note=lambda _: None)
    chat.converse(c, _lines("w1", "/clear", "w1"))
    first, second, _ = out.getvalue().split("\n")
    msgs = [{"role": "system", "content": "w7 w8"}, {"role": "user", "content": "w1"}]
    assert first == second == _greedy(model, msgs, 4)


class _InterruptedOut(io.StringIO):
    """Ctrl-C arrives while the second piece of the first reply is written."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces = 0

    def write(self, s: str) -> int:
        if s != "\n":
            self.pieces += 1
            if self.pieces == 2:
                raise KeyboardInterrupt
        return super().write(s)


def test_ctrl_c_stops_a_reply_and_keeps_the_chat(model):
    out, notes = _InterruptedOut(), []
    c = chat.Chat(model, n_predict=6, out=out, note=notes.append)
    chat.converse(c, _lines("w1 w2", KeyboardInterrupt(), "w3"))
    assert any("reply stopped" in n for n in notes)
    partial, second, _ = out.getvalue().split("\n")
    full = _greedy(model, [{"role": "user", "content": "w1 w2"}], 6)
    assert partial and full.startswith(partial) and partial != full
    # the next message is answered over the conversation with the stopped reply in it
    assert c.history[1] == {"role": "assistant", "content": partial}
    assert second == _greedy(model, c.history[:2] + [{"role": "user", "content": "w3"}], 6)


def test_a_line_that_is_not_utf8_is_left_out(model):
    out, notes = io.StringIO(), []
    c = chat.Chat(model, n_predict=3, out=out, note=notes.append)
    read = chat.stream_reader(io.BytesIO(b"w1\n\xff\nw2 \\\nw3\n"))
    chat.converse(c, read)
    assert any("not valid UTF-8" in n for n in notes)
    assert [m["content"] for m in c.history if m["role"] == "user"] == ["w1", "w2 \nw3"]


def test_chat_leaves_out_the_oldest_exchanges_past_the_context(tiny):
    small = clops.llm.load(tiny, max_seq_len=24, progress=False)
    out, notes = io.StringIO(), []
    c = chat.Chat(small, n_predict=3, out=out, note=notes.append)
    chat.converse(c, _lines(*["w1 w2 w3 w4"] * 4))
    assert any("oldest" in n and "left out" in n for n in notes), notes
    assert c.prompt_tokens(c.history) <= 24
    assert len(out.getvalue().split("\n")) == 5  # every message got its reply
    assert c.say("w5 " * 40) is None  # alone too long: refused, the chat goes on
    assert notes[-1].startswith("error: this message takes") and \
        "raise -c/--ctx-size (this model allows up to 256)" in notes[-1], notes[-1]


def test_chat_with_piped_input(tiny, model):
    res = _clops("chat", "-m", tiny, "-n", "4", "--device", model.device.selector,
                 stdin=b"w1 w2\n\xff\n/bogus\n/exit\nw3\n")
    err = res.stderr.decode()
    assert res.returncode == 0 and "Traceback" not in err, err
    assert "not valid UTF-8" in err and "unknown command /bogus" in err
    assert res.stdout.decode() == _greedy(model, [{"role": "user", "content": "w1 w2"}], 4) + "\n"


# -- bench ---------------------------------------------------------------------------------------
def test_bench_json_has_every_run(tiny, model):
    res = _clops("bench", "-m", tiny, "-p", "16", "-n", "4", "-r", "2", "--json", "-q",
                 "--device", model.device.selector)
    assert res.returncode == 0, res.stderr.decode()
    got = json.loads(res.stdout)
    assert got["model"]["path"] == tiny and got["device"]["selector"] == model.device.selector
    assert [t["test"] for t in got["tests"]] == ["pp16", "tg4"]
    for t in got["tests"]:
        rates = t["tokens_per_s"]
        assert len(rates) == t["runs"] == 2 and all(r > 0 for r in rates)
        assert t["min"] <= t["median"] <= t["max"] and t["spread"] >= 0


def test_bench_table(tiny, model, capsys):
    assert bench.main(["-m", tiny, "-p", "8", "-n", "0", "-r", "1", "-q",
                       "--device", model.device.selector]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("llama, 2 layers") and model.device.name in out[0]
    header, rule, row = out[1:]
    assert [c.strip() for c in header.strip("|").split("|")] == \
        ["test", "t/s", "min", "max", "spread"]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "pp8" and float(cells[1]) > 0 and cells[4] == "± 0.0%"
    assert set(rule) == {"|", "-"}
