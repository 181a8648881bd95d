"""OpenAI's wire format as the official client and the common client code read it: a stream
without ``stream_options.include_usage`` has no usage chunk (the tutorials' loop reads
``chunk.choices[0]`` of every chunk), its first chunk carries the role; ``echo``; image parts
refused by name; ``/v1/models/{id}``, ``/tokenize``, ``/detokenize``, CORS preflights and
latency histograms in ``/metrics``."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import clops.llm  # noqa: E402
from clops.serve.limits import Limits  # noqa: E402

from ..llm.tiny import make_model  # noqa: E402
from .conftest import start  # noqa: E402

ORIGIN = "https://chat.example.org"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    path = tmp_path_factory.mktemp("wire")
    make_model(str(path), "llama")
    model = clops.llm.load(str(path), progress=False, max_seq_len=128, kv_cache="float32")
    run = start(model, parallel=2, model_name="tiny", limits=Limits(cors_origins=(ORIGIN,)))
    yield run
    run.stop()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)


MSGS = [{"role": "user", "content": "w9 w8 w7"}]


def test_the_tutorial_loop_reads_every_chunk(client):
    text, roles = "", []
    for chunk in client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8,
                                                temperature=0, stream=True):
        roles.append(chunk.choices[0].delta.role)  # IndexError on a usage chunk
        text += chunk.choices[0].delta.content or ""
    assert roles[0] == "assistant"
    whole = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8,
                                           temperature=0)
    assert text == whole.choices[0].message.content
    for chunk in client.completions.create(model="tiny", prompt="w1 w2", max_tokens=4,
                                           stream=True):
        assert chunk.choices and chunk.usage is None


def test_usage_only_when_asked(client, srv):
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])
    r = httpx.post(srv.url + "/v1/completions", json={
        "prompt": "w1", "max_tokens": 2, "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"


def test_echo(client):
    plain = client.completions.create(model="tiny", prompt="w1 w2", max_tokens=4,
                                      temperature=0).choices[0].text
    echoed = client.completions.create(model="tiny", prompt="w1 w2", max_tokens=4,
                                       temperature=0, echo=True).choices[0].text
    assert echoed == "w1 w2" + plain
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="w1 w2", max_tokens=4, temperature=0, echo=True, stream=True))
    assert streamed == echoed
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(model="tiny", prompt="w1", max_tokens=2, echo=True,
                                  logprobs=1)


def test_image_parts_are_refused_by_name(client):
    with pytest.raises(openai.BadRequestError, match=r"content\[1\] is image_url"):
        client.chat.completions.create(model="tiny", max_tokens=2, messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "w1"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    out = client.chat.completions.create(model="tiny", max_tokens=3, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "w9 w8"},
                                     {"type": "text", "text": " w7"}]}])
    assert out.choices[0].message.content == client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=3, temperature=0).choices[0].message.content


def test_model_by_id(client):
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4o")


def test_tokenize_and_detokenize(srv):
    tok = srv.server.tok
    r = httpx.post(srv.url + "/tokenize", json={"content": "w5 w6 w7"}).json()
    assert r["tokens"] == tok.encode("w5 w6 w7") and r["count"] == 3
    with_bos = httpx.post(srv.url + "/tokenize",
                          json={"content": "w5", "add_special": True}).json()["tokens"]
    assert with_bos == tok.encode("w5", add_special_tokens=True) and len(with_bos) == 2
    back = httpx.post(srv.url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["content"] == tok.decode(r["tokens"])
    for bad in ([-1], [10**9], ["w1"], "w1", [True]):
        r = httpx.post(srv.url + "/detokenize", json={"tokens": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    assert httpx.post(srv.url + "/tokenize", json={"text": "w1"}).status_code == 400


def test_cors(srv):
    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(srv.url + "/v1/chat/completions", headers=pre)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.options(srv.url + "/v1/chat/completions",
                      headers={**pre, "Origin": "https://elsewhere.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.post(srv.url + "/v1/completions", headers={"Origin": ORIGIN},
                   json={"prompt": "w1", "max_tokens": 2})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN


def test_latency_histograms(client, srv):
    client.completions.create(model="tiny", prompt="w3 w4", max_tokens=6, temperature=0)
    text = httpx.get(srv.url + "/metrics").text
    for name in ("clops_time_to_first_token_seconds", "clops_time_per_output_token_seconds",
                 "clops_request_duration_seconds"):
        assert f"# TYPE {name} histogram" in text
        count = [ln for ln in text.splitlines() if ln.startswith(f"{name}_count ")]
        inf = [ln for ln in text.splitlines() if ln.startswith(f'{name}_bucket{{le="+Inf"}}')]
        assert int(count[0].split()[1]) >= 1 and inf[0].split()[1] == count[0].split()[1]


def test_logit_bias_and_penalties_take_effect(client, srv):
    def words(**kw):
        return client.completions.create(model="tiny", prompt="w1 w2", max_tokens=6,
                                         temperature=0, **kw).choices[0].text.split()

    assert words(logit_bias={"17": 100}) == ["w17"] * 6
    plain = words()
    first = srv.server.tok.encode(plain[0])[0]
    assert words(logit_bias={str(first): -100})[0] != plain[0]
    # a presence penalty of 2 makes a repeat of the greedy text unlikely: it changes the text
    # whenever the plain text repeats a word
    if len(set(plain)) < len(plain):
        assert words(presence_penalty=2.0) != plain
    for bad in ({"logit_bias": {"w1": 3}}, {"logit_bias": {"5": 500}},
                {"presence_penalty": 3}, {"frequency_penalty": "a lot"}):
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "w1", **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] in bad, r.text
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "w1",
                                                      "logit_bias": {"99999": 1}})
    assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"]
