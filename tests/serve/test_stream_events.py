"""The streamed events' host path: a text piece's event from a cut template is the bytes a
chunk's JSON gives; events ready together (the first ones, the last choice's last ones with
the usage and ``[DONE]``) leave as one write, in order, with nothing lost; both HTTP
protocols (httptools, h11) carry the same events, keep the header deadline and cap the
headers."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from types import SimpleNamespace

import pytest

httpx = pytest.importorskip("httpx")

import clops.llm  # noqa: E402
from clops.llm.batch import SamplingParams, StepOutput  # noqa: E402
from clops.serve import app as serve_app  # noqa: E402
from clops.serve.limits import MAX_HEADER_BYTES, PROTOCOLS, Limits  # noqa: E402

from ..llm.tiny import make_model  # noqa: E402
from .conftest import start  # noqa: E402

PIECES = ["w1", " w2", "", '"quoted" \\ back', "tab\tnew\nline", "\x00\x1f", "é ü 中文 🚀",
          "\ud7ff\ue000", "data: [DONE]\n\n", "\x00clops-text\x00"]


def _job(chat: bool, n: int = 1, want_lp: bool = False, include_usage: bool = True,
         tools: list | None = None, echo: str | None = None) -> serve_app._Job:
    return serve_app._Job(chat, [1, 2, 3], 8, SamplingParams(), n, [], None, tools, want_lp,
                          True, False, include_usage, echo, rid="cmpl-x", created=7)


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("name", ["m", 'a "model" \x00clops-text\x00'])
def test_a_text_piece_is_the_chunk_json_writes(chat, name):
    server = SimpleNamespace(name=name)
    job = _job(chat, n=3)
    chunks = serve_app._TextChunks(server, job)
    for i in range(3):
        for piece in PIECES:
            ch = {"index": i, "delta": {"content": piece}} if chat else \
                {"index": i, "text": piece}
            ch["finish_reason"] = None
            assert chunks(i, piece) == serve_app._chunk(server, job, [ch])


def _out(seq: int, token: int) -> StepOutput:
    return StepOutput(seq, token, -0.25, [], False, None)


class FakeServer:
    """What ``_stream_events`` reads of a server, with each choice's items given."""

    name = "m"

    def __init__(self, items: list[list[tuple]]) -> None:
        self.items = items
        self.runner = SimpleNamespace(stats=SimpleNamespace(errors=0, disconnects=0))

    def choice(self, *args):
        raise AssertionError("not called: the job's choices are the given items")

    def logprob_entry(self, o: StepOutput) -> dict:
        return {"token": str(o.token), "logprob": o.logprob, "bytes": [], "top_logprobs": []}


def _events(server: FakeServer, job: serve_app._Job, monkeypatch) -> list[str]:
    """The strings ``_events`` yields (each one write), the choices' items as given."""

    async def gen(items):
        for item in items:
            await asyncio.sleep(0)
            yield item

    monkeypatch.setattr(job, "choices", lambda s: [gen(it) for it in server.items],
                        raising=False)

    async def run() -> list[str]:
        return [s async for s in serve_app._events(server, job)]

    return asyncio.run(run())


def _split(writes: list[str]) -> list[dict | str]:
    """Every event of the writes, in order ([DONE] as the string)."""
    events = []
    for w in writes:
        assert w.endswith("\n\n")
        for ev in w[:-2].split("\n\n"):
            assert ev.startswith("data: ")
            events.append(ev[6:] if ev == "data: [DONE]" else json.loads(ev[6:]))
    return events


@pytest.mark.parametrize("chat", [True, False])
def test_one_choice_streams_each_piece_then_ends_in_one_write(chat, monkeypatch):
    toks = [[_out(0, 5)], [_out(0, 6), _out(0, 7)], [_out(0, 8)], [_out(0, 9)]]
    server = FakeServer([[("a", toks[0], None), ("b c", toks[1], None), ("", toks[2], None),
                          ("d", toks[3], "length")]])
    job = _job(chat)
    writes = _events(server, job, monkeypatch)
    events = _split(writes)
    key = (lambda c: c["delta"].get("content")) if chat else (lambda c: c["text"])
    first = 1 if chat else 0
    assert len(writes) == first + 2 + 1  # (role), "a", "b c", then the end in one write
    if chat:
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    body = events[first:]
    assert [key(e["choices"][0]) for e in body[:3]] == ["a", "b c", "d"]
    assert [e["choices"][0]["finish_reason"] for e in body[:3]] == [None, None, "length"]
    assert body[3]["choices"] == [] and body[3]["usage"]["completion_tokens"] == 5
    assert body[4] == "[DONE]"
    assert _split([writes[-1]]) == body[2:]  # the last piece, usage and [DONE] together


def test_choices_that_end_before_the_last_are_written_at_once(monkeypatch):
    server = FakeServer([[("a", [_out(0, 1)], None), ("b", [_out(0, 2)], "stop")],
                         [("x", [_out(1, 3)], None), ("y", [_out(1, 4)], None),
                          ("z", [_out(1, 5)], "length")]])
    job = _job(False, n=2, include_usage=False)
    writes = _events(server, job, monkeypatch)
    events = _split(writes)
    texts = {0: "", 1: ""}
    for e in events[:-1]:
        (c,) = e["choices"]
        texts[c["index"]] += c["text"]
    assert texts == {0: "ab", 1: "xyz"} and events[-1] == "[DONE]"
    # the last write is the last choice's last piece with [DONE]; the other choice's end was
    # a write of its own
    assert _split([writes[-1]])[0]["choices"][0]["index"] == 1
    assert len(_split([writes[-1]])) == 2
    ends = [w for w in writes if '"finish_reason": "stop"' in w]
    assert len(ends) == 1 and "[DONE]" not in ends[0]


def test_logprobs_and_an_error_mid_stream(monkeypatch):
    server = FakeServer([[("a", [_out(0, 1)], None), ("b", [_out(0, 2)], None)]])
    job = _job(True, want_lp=True)
    events = _split(_events(server, job, monkeypatch))
    assert [e["choices"][0]["logprobs"]["content"][0]["token"] for e in events[1:3]] == \
        ["1", "2"]

    async def broken():
        yield ("a", [_out(0, 1)], None)
        raise ValueError("the grammar cannot go on")

    monkeypatch.setattr(job, "choices", lambda s: [broken()], raising=False)
    job.want_lp = False

    async def run() -> list[str]:
        return [s async for s in serve_app._events(server, job)]

    events = _split(asyncio.run(run()))
    assert events[1]["choices"][0]["delta"]["content"] == "a"
    assert events[-1]["error"]["message"] == "the grammar cannot go on"
    assert server.runner.stats.errors == 1


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream_events")
    make_model(str(path), "llama")
    return clops.llm.load(str(path), progress=False, max_seq_len=128, kv_cache="float32")


@pytest.fixture(scope="module", params=PROTOCOLS)
def srv(model, request):
    run = start(model, parallel=2, model_name="tiny", limits=Limits(read_timeout=1.0),
                timeout=1.0, http=request.param)
    yield run
    run.stop()


def _stream_text(srv, body: dict) -> tuple[str, list]:
    with httpx.stream("POST", srv.url + "/v1/completions", timeout=60, json={
            **body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert events[-1]["choices"] == [] and all(e.get("usage") is None for e in events[:-1])
    return "".join(c["text"] for e in events for c in e["choices"]), events


@pytest.mark.parametrize("stop", [None, ["w"], [" w1", "w2"]])
def test_streamed_text_is_the_whole_answer(srv, stop):
    body = {"prompt": "w3 w4", "max_tokens": 12, "temperature": 0, "stop": stop}
    whole = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
    text, events = _stream_text(srv, body)
    assert text == whole["choices"][0]["text"]
    assert events[-1]["usage"] == whole["usage"]
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] \
        == [whole["choices"][0]["finish_reason"]]


def test_dripping_headers_are_cut_off(srv):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    deadline = time.monotonic() + 15
    closed = False
    while not closed and time.monotonic() < deadline:
        try:
            s.sendall(b"X-Drip: 1\r\n")
            s.settimeout(0.3)
            closed = s.recv(100) == b""
        except TimeoutError:
            pass
        except OSError:
            closed = True
    s.close()
    assert closed
    # still serving: a whole answer of two tokens (their text may be empty: sampled tokens
    # of the tiny vocabulary include ones that print nothing)
    _, events = _stream_text(srv, {"prompt": "w1", "max_tokens": 2, "temperature": 0,
                                   "ignore_eos": True})
    assert events[-1]["usage"]["completion_tokens"] == 2


def test_headers_past_the_cap_are_refused_and_others_served(srv):
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "w1", "max_tokens": 2},
                   headers={"X-Big": "a" * 12000}, timeout=30)
    assert r.status_code == 200
    if srv.uv.config.http.__name__ != "ClopsHttpToolsProtocol":
        return  # (h11 holds 16 KiB of an incomplete request; more where it comes at once)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MAX_HEADER_BYTES +
              b"\r\n\r\n")
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    s.close()
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert httpx.get(srv.url + "/v1/models", timeout=30).status_code == 200


@pytest.fixture(scope="module")
def server(model):
    s = serve_app.Server(model, parallel=1)
    yield s
    s.runner.close()


def _choice(server, monkeypatch, steps: list[list[int]], stops: list[str],
            leave_after: int | None = None) -> tuple[list[tuple], list]:
    """The items of ``server.choice`` where each step's tokens arrive on its handle at once
    (the last one finished), and the handles it cancelled; ``leave_after``: close the
    choice after that many items, as a client that leaves does."""
    from clops.serve.runner import Handle

    cancelled: list = []
    monkeypatch.setattr(server.runner, "cancel", lambda h: cancelled.append(h))

    async def run() -> list[tuple]:
        h = Handle(asyncio.get_running_loop(), asyncio.Queue())
        n = sum(len(s) for s in steps)

        async def submit(*args, **kw):
            return h

        monkeypatch.setattr(server.runner, "submit", submit)
        items: list[tuple] = []
        gen = server.choice([1, 2], SamplingParams(), n, stops, None, ignore_eos=True)
        k = 0
        for step in steps:
            for t in step:
                k += 1
                h.queue.put_nowait(StepOutput(0, t, -0.5, [], k == n, "length" if k == n
                                              else None))
            try:
                items.append(await gen.__anext__())
            except StopAsyncIteration:
                break
            if leave_after is not None and len(items) >= leave_after:
                break
        await gen.aclose()
        return items

    return asyncio.run(run()), cancelled


def test_tokens_of_one_step_come_in_order(server, monkeypatch):
    tok = server.tok
    ids = tok.encode("w1 w2 w3 w4 w5 w6")
    steps = [ids[:1], ids[1:4], ids[4:]]
    items, _ = _choice(server, monkeypatch, steps, [])
    assert [[o.token for o in toks] for _, toks, _ in items] == steps
    assert "".join(p for p, _, _ in items) == tok.decode(ids)
    assert [r for _, _, r in items] == [None, None, "length"]


def test_a_stop_string_across_tokens_that_came_together(server, monkeypatch):
    tok = server.tok
    ids = tok.encode("w1 w2 w3 w4 w5 w6")
    items, cancelled = _choice(server, monkeypatch, [ids[:1], ids[1:5], ids[5:]], [" w3 w"])
    assert "".join(p for p, _, _ in items) == "w1 w2"
    assert items[-1][2] == "stop" and len(items) == 2 and cancelled


def test_leaving_mid_stream_cancels_the_sequence(server, monkeypatch):
    ids = server.tok.encode("w1 w2 w3 w4 w5 w6")
    items, cancelled = _choice(server, monkeypatch, [ids[:2], ids[2:4], ids[4:]], [],
                               leave_after=1)
    assert len(items) == 1 and items[0][2] is None and cancelled
