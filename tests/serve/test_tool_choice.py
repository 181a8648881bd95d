"""``tool_choice`` held by constrained decoding, and the request fields that cannot take effect
refused by name. A tiny random model writes random tokens: only the grammar makes its answer a
tool call, so an answer that parses as a call of the right function with arguments valid
against the function's schema, seed after seed, shows that the grammar holds it. The model's
tokenizer here is byte-level (every byte a token, as GPT-2's without merges), so that it can
spell JSON; its chat template is swapped per tool-call syntax."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("llguidance")

import clops.llm  # noqa: E402
from clops.llm.tokenizer import byte_alphabet  # noqa: E402
from clops.serve.constrain import Constraint, tool_call_grammar  # noqa: E402
from clops.serve.tools import SYNTAXES  # noqa: E402

from ..llm.tiny import make_model  # noqa: E402
from .conftest import start  # noqa: E402

WEATHER_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "pattern": "^[a-z]{1,6}$"},
    "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"], "additionalProperties": False}
ADD_PARAMS = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                     "maximum": 99},
                                               "b": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}},
         {"type": "function", "function": {"name": "add", "parameters": ADD_PARAMS}}]
PARAMS = {"get_weather": WEATHER_PARAMS, "add": ADD_PARAMS}
MSGS = [{"role": "user", "content": "Weather in Oslo?"}]

_TURNS = "{% for m in messages %}{{ m.content }} {% endfor %}"
_NAMES = "{% for t in tools %}{{ t.function.name }} {% endfor %}"
TEMPLATES = {
    "tagged": "{% if tools %}Answer with <tool_call>{\"name\": ..., \"arguments\": ...}"
              "</tool_call>: " + _NAMES + "{% endif %}" + _TURNS,
    "mistral": "{% if tools %}[AVAILABLE_TOOLS]" + _NAMES + "[/AVAILABLE_TOOLS]{% endif %}"
               "{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]"
               "{{ m.tool_calls | length }}{% else %}{{ m.content }} {% endif %}{% endfor %}",
    "llama": "{% if tools %}Respond in the format {\"name\": function name, \"parameters\": "
             "dictionary of argument name and its value}. " + _NAMES + "{% endif %}" + _TURNS,
    # takes tools, but asks for no syntax the server knows
    "unknown": "{% if tools %}Call one of " + _NAMES + "{% endif %}" + _TURNS,
}


def _byte_level_tokenizer(path) -> None:
    """Every byte a token (GPT-2's stand-in characters, no merges), then <s>, </s>, the
    Hermes tags as plain added tokens and Mistral's [TOOL_CALLS] as a special one."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in byte_alphabet().items()}
    tok = Tokenizer(models.BPE(vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True),
                            AddedToken("[TOOL_CALLS]", special=True)])
    tok.add_tokens([AddedToken("<tool_call>", normalized=False),
                    AddedToken("</tool_call>", normalized=False)])
    tok.save(str(path / "tokenizer.json"))
    with open(path / "tokenizer_config.json", "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
                   "chat_template": TEMPLATES["tagged"]}, f)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    path = tmp_path_factory.mktemp("tool_choice")
    make_model(str(path), "llama")
    _byte_level_tokenizer(path)
    model = clops.llm.load(str(path), progress=False, max_seq_len=256, kv_cache="float32")
    run = start(model, parallel=4, model_name="tiny")
    yield run
    run.stop()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture
def template(srv):
    """Sets the model's chat template by family name; the tagged one back afterwards."""
    tok = srv.server.tok

    def use(name: str) -> None:
        tok.chat_template = TEMPLATES[name]

    yield use
    tok.chat_template = TEMPLATES["tagged"]


def _valid(value, schema) -> bool:
    """``value`` against the few JSON schema keywords the schemas above use."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema["type"]
    if kind == "object":
        props = schema["properties"]
        return isinstance(value, dict) and set(schema["required"]) <= set(value) \
            and set(value) <= set(props) and all(_valid(v, props[k]) for k, v in value.items())
    if kind == "string":
        return isinstance(value, str) and re.fullmatch(schema["pattern"], value) is not None
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) and \
            schema.get("minimum", value) <= value <= schema.get("maximum", value)
    if kind == "boolean":
        return isinstance(value, bool)
    raise AssertionError(f"no check for {schema}")


def _check_call(call, names) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in names
    args = json.loads(call.function.arguments)
    assert _valid(args, PARAMS[call.function.name]), (call.function.name, args)
    return args


def _create(client, **kw):
    args = dict(model="tiny", messages=MSGS, tools=TOOLS, max_tokens=100, temperature=1.0)
    return client.chat.completions.create(**{**args, **kw})


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_makes_even_a_random_model_call_a_tool(client, seed):
    out = _create(client, tool_choice="required", parallel_tool_calls=False, seed=seed)
    ch = out.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    (call,) = ch.message.tool_calls
    _check_call(call, {"get_weather", "add"})
    # without the choice the same seed writes text, not a call
    auto = _create(client, seed=seed, max_tokens=20).choices[0]
    assert auto.finish_reason == "length" and not auto.message.tool_calls


@pytest.mark.parametrize("name,seed", [("add", 4), ("get_weather", 5), ("add", 6)])
def test_a_named_function_is_the_one_called(client, name, seed):
    out = _create(client, tool_choice={"type": "function", "function": {"name": name}},
                  seed=seed, parallel_tool_calls=False)
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == name
    _check_call(call, {name})


def test_parallel_calls_by_default_stop_where_the_model_ends(client, srv):
    # the end-of-text token favoured: the model ends after its first call, which it may
    eos = srv.server.tok.eos_ids[0]
    out = _create(client, tool_choice="required", seed=7, logit_bias={str(eos): 100})
    ch = out.choices[0]
    assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1
    _check_call(ch.message.tool_calls[0], {"get_weather", "add"})


@pytest.mark.parametrize("family", ["tagged", "mistral", "llama"])
def test_the_grammar_allows_a_second_call_only_with_parallel_calls(srv, family):
    syntax = next(s for s in SYNTAXES if s.name == family)
    server = srv.server
    calls = [{"name": "add", syntax.args_key: {"a": 1, "b": True}},
             {"name": "get_weather", syntax.args_key: {"city": "oslo", "unit": "c"}}]
    bodies = [json.dumps(c, separators=(",", ":")) for c in calls]
    a, b = syntax.around
    text = syntax.opening + ("[" + ",".join(bodies) + "]" if syntax.as_list else
                             syntax.between.join(a + x + b for x in bodies))
    ids = server.tok.encode(text)
    added = server.added_tokens

    def accepts(parallel: bool) -> bool:
        c = Constraint(server.vocab(), tool_call_grammar(syntax, TOOLS, None, parallel, added))
        return all(c.matcher.consume_token(t) for t in ids)

    assert accepts(True) == syntax.parallel
    assert not accepts(False)
    one = syntax.opening + ("[" + bodies[0] + "]" if syntax.as_list else a + bodies[0] + b)
    c = Constraint(server.vocab(), tool_call_grammar(syntax, TOOLS, None, False, added))
    assert all(c.matcher.consume_token(t) for t in server.tok.encode(one))
    c = Constraint(server.vocab(), tool_call_grammar(syntax, TOOLS, "get_weather", True, added))
    assert not all(c.matcher.consume_token(t) for t in server.tok.encode(one))  # "add"


@pytest.mark.parametrize("family,seed", [("mistral", 8), ("llama", 9), ("mistral", 10)])
def test_each_templates_syntax(client, template, family, seed):
    template(family)
    out = _create(client, tool_choice="required", seed=seed, parallel_tool_calls=False)
    ch = out.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    _check_call(ch.message.tool_calls[0], {"get_weather", "add"})


def test_streamed_calls_as_openai_sends_them(client):
    kw = dict(tool_choice={"type": "function", "function": {"name": "get_weather"}}, seed=11,
              parallel_tool_calls=False)
    whole = _create(client, **kw).choices[0].message.tool_calls[0]
    calls: dict[int, dict] = {}
    roles, reasons, chunks = [], [], 0
    for chunk in _create(client, stream=True, **kw):  # the loop of the client's README
        chunks += 1
        delta = chunk.choices[0].delta
        roles.append(delta.role)
        reasons.append(chunk.choices[0].finish_reason)
        for tc in delta.tool_calls or []:
            if tc.index not in calls:  # the first delta of a call names it
                assert tc.id and tc.type == "function" and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            else:
                assert tc.id is None and tc.function.name is None
            calls[tc.index]["arguments"] += tc.function.arguments or ""
    assert roles[0] == "assistant" and roles[1:] == [None] * (chunks - 1)
    assert reasons[-1] == "tool_calls" and reasons[:-1] == [None] * (chunks - 1)
    assert list(calls) == [0]
    assert calls[0]["name"] == whole.function.name == "get_weather"
    assert calls[0]["arguments"] == whole.function.arguments  # the same seed, the same call


def test_role_only_in_each_choices_first_chunk(srv):
    with httpx.stream("POST", srv.url + "/v1/chat/completions", timeout=120, json={
            "messages": MSGS, "max_tokens": 6, "n": 2, "seed": 3, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    for i in range(2):
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant"
        assert all("role" not in c["delta"] for c in mine[1:])


def test_none_does_not_offer_the_tools(client, srv):
    plain = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2)
    offered = _create(client, max_tokens=2)
    none = _create(client, max_tokens=2, tool_choice="none")
    assert offered.usage.prompt_tokens > plain.usage.prompt_tokens + 10
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    assert none.choices[0].message.tool_calls is None
    # a template without tools: "none" needs no place for them, the others do
    srv.server.tok.chat_template = _TURNS
    try:
        assert _create(client, max_tokens=2, tool_choice="none").usage.prompt_tokens == \
            plain.usage.prompt_tokens
        for choice in ("auto", "required"):
            with pytest.raises(openai.BadRequestError, match="does not take tools"):
                _create(client, max_tokens=2, tool_choice=choice)
    finally:
        srv.server.tok.chat_template = TEMPLATES["tagged"]


def _post(srv, path="/v1/chat/completions", **body):
    return httpx.post(srv.url + path, timeout=60, json=body)


def _refused(r, param, *words):
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    for w in words:
        assert w in err["message"], err


def test_tool_choice_refusals(srv, template):
    base = {"messages": MSGS, "max_tokens": 4}
    named = {"type": "function", "function": {"name": "send_email"}}
    _refused(_post(srv, **base, tools=TOOLS, tool_choice=named), "tool_choice", "'send_email'",
             "not among")
    for choice in ("required", "auto", "none", named):
        _refused(_post(srv, **base, tool_choice=choice), "tool_choice", "only allowed")
    for bad in ("always", {"type": "function"}, {"name": "add"}, 3):
        _refused(_post(srv, **base, tools=TOOLS, tool_choice=bad), "tool_choice", "must be")
    _refused(_post(srv, **base, tools=TOOLS, tool_choice="required",
                   response_format={"type": "json_object"}), "response_format")
    _refused(_post(srv, **base, tools=TOOLS, tool_choice="required", stop=["}"]), "stop")
    bad_params = [{"type": "function", "function": {"name": "f",
                                                    "parameters": {"type": "string"}}}]
    _refused(_post(srv, **base, tools=bad_params, tool_choice="required"), "tools", "'f'")
    dangling = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/nowhere"}}}}}]
    _refused(_post(srv, **base, tools=dangling, tool_choice="required", stream=True), "tools")
    _refused(_post(srv, **base, tools=TOOLS, parallel_tool_calls="yes"), "parallel_tool_calls")
    template("unknown")
    _refused(_post(srv, **base, tools=TOOLS, tool_choice="required"), "tool_choice",
             "no tool-call syntax")
    assert _post(srv, **base, tools=TOOLS, tool_choice="auto").status_code == 200


@pytest.mark.parametrize("path,field,value", [
    ("chat", "modalities", ["text", "audio"]),
    ("chat", "audio", {"voice": "alloy", "format": "wav"}),
    ("chat", "prediction", {"type": "content", "content": "w1"}),
    ("chat", "reasoning_effort", "high"),
    ("chat", "web_search_options", {}),
    ("chat", "functions", [{"name": "f", "parameters": {}}]),
    ("chat", "function_call", "auto"),
    ("chat", "service_tier", "flex"),
    ("chat", "store", True),
    ("chat", "metadata", {"k": 1}),
    ("chat", "user", 7),
    ("chat", "top_logprobs", 2),
    ("chat", "max_tokens", 7),  # beside max_completion_tokens 4
    ("completions", "suffix", "w1"),
    ("completions", "best_of", 3),
    ("completions", "tools", TOOLS),
    ("embeddings", "dimensions", 8),
    ("embeddings", "encoding_format", "int8"),
])
def test_fields_that_cannot_take_effect_are_refused_by_name(srv, path, field, value):
    body = {"chat": {"messages": MSGS, "max_completion_tokens": 4},
            "completions": {"prompt": "w1", "max_tokens": 2},
            "embeddings": {"input": "w1"}}[path]
    route = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
             "embeddings": "/v1/embeddings"}[path]
    _refused(_post(srv, route, **body, **{field: value}), field)


def test_fields_that_take_effect_or_are_metadata(client, srv):
    kw = dict(model="tiny", messages=MSGS, temperature=0)
    want = client.chat.completions.create(max_tokens=5, **kw)
    assert want.usage.completion_tokens == 5
    out = client.chat.completions.create(max_completion_tokens=5, user="u1", store=False,
                                         metadata={"team": "a"}, service_tier="auto",
                                         modalities=["text"], **kw)
    assert out.usage.completion_tokens == 5
    assert out.choices[0].message.content == want.choices[0].message.content
    r = _post(srv, messages=MSGS, max_tokens=3, max_completion_tokens=None, temperature=0)
    assert r.json()["usage"]["completion_tokens"] == 3
    one = client.completions.create(model="tiny", prompt="w1", max_tokens=3, n=2, best_of=2,
                                    seed=1)
    assert len(one.choices) == 2
    floats = client.embeddings.create(model="tiny", input="w1 w2", encoding_format="float")
    raw = _post(srv, "/v1/embeddings", input="w1 w2", encoding_format="base64").json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(decoded, floats.data[0].embedding, rtol=1e-6)


def test_response_format_holds_completions_too(client):
    schema = {"type": "object", "properties": {"pick": {"enum": ["left", "right"]}},
              "required": ["pick"], "additionalProperties": False}
    for seed in (1, 2):
        out = client.completions.create(
            model="tiny", prompt="w1", max_tokens=40, seed=seed,
            extra_body={"response_format": {"type": "json_schema",
                                            "json_schema": {"name": "p", "schema": schema}}})
        assert json.loads(out.choices[0].text)["pick"] in ("left", "right")
