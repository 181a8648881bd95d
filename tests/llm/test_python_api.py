"""The Python API users of llama-cpp-python and vLLM expect: ``Model.generate`` on a list of
prompts (batched, equal to one at a time when greedy), ``SamplingParams``, OpenAI's penalties
and logit bias against a numpy reference on the logits, and ``create_chat_completion`` /
``create_completion`` in OpenAI's shapes; on the tiny test model."""

from __future__ import annotations

import numpy as np
import pytest

import clops.llm
from clops.llm import SamplingParams, batch

from .tiny import logit_tolerance, make_model

NEW = 10
PROMPTS = ["w1 w2 w3", "w40 w7", "w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20 w21",
           "w300", "w1 w2 w3 w4 w5"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("python_api")
    make_model(str(path), "llama")
    return clops.llm.load(str(path), progress=False, max_seq_len=96, kv_cache="float32")


def _alone(model, prompts, **kw):
    return ["".join(model.generate(p, **kw)) for p in prompts]


def test_sampling_params_is_exported_and_checks_its_fields():
    assert clops.llm.SamplingParams is batch.SamplingParams
    p = SamplingParams(temperature=0.5, max_tokens=4, stop=["x"])
    p.check()
    for bad in (dict(max_tokens=0), dict(stop="x"), dict(top_p=0.0), dict(logit_bias={"1": 2.0}),
                dict(presence_penalty=3.0), dict(logit_bias={1: 101.0})):
        with pytest.raises((ValueError, TypeError)):
            SamplingParams(**bad).check()


def test_a_list_of_prompts_equals_each_alone_when_greedy(model):
    alone = _alone(model, PROMPTS, max_new_tokens=NEW)
    assert all(alone) and len(set(alone)) > 1
    together = model.generate(PROMPTS, max_new_tokens=NEW)
    assert model._engine is not None  # (the batch engine ran them)
    assert together == alone
    # a stop string met in one answer, and chat prompts
    stop = alone[0].split()[2]
    assert model.generate(PROMPTS, max_new_tokens=NEW, stop=[stop]) == \
        _alone(model, PROMPTS, max_new_tokens=NEW, stop=[stop])
    assert model.generate(PROMPTS[:3], max_new_tokens=NEW, chat=True) == \
        _alone(model, PROMPTS[:3], max_new_tokens=NEW, chat=True)
    assert model.generate([], max_new_tokens=NEW) == []


def test_one_sampling_params_per_prompt(model):
    params = [SamplingParams(max_tokens=n) for n in (3, 7, 1, 12, 5)]
    got = model.generate(PROMPTS, sampling=params)
    want = [_alone(model, [p], max_new_tokens=n)[0] for p, n in zip(PROMPTS, (3, 7, 1, 12, 5))]
    assert got == want
    # sampled draws in a batch: repeatable with a seed, and another seed draws others
    hot = SamplingParams(temperature=1.5, seed=3, max_tokens=NEW)
    first = model.generate(PROMPTS, sampling=hot)
    assert model.generate(PROMPTS, sampling=hot) == first
    assert model.generate(PROMPTS, sampling=SamplingParams(temperature=1.5, seed=4,
                                                           max_tokens=NEW)) != first


def test_families_the_batch_engine_does_not_run_go_one_at_a_time(model, monkeypatch):
    want = model.generate(PROMPTS, max_new_tokens=NEW)
    monkeypatch.setattr(batch, "unsupported", lambda m: "not this family")

    def refused(*a, **k):
        raise AssertionError("the batch engine was used")

    monkeypatch.setattr(model, "_engine_for", refused)
    assert model.generate(PROMPTS, max_new_tokens=NEW) == want


def _reference_choice(logits, generated, presence, frequency, bias):
    """numpy: OpenAI's penalties over the generated tokens and the bias, on one row."""
    z = logits.astype(np.float64)
    counts = np.bincount(np.asarray(generated, np.int64), minlength=z.size)
    z = z - presence * (counts > 0) - frequency * counts
    for t, b in bias.items():
        z[t] += b
    return z


def test_penalties_and_logit_bias_against_numpy(model):
    ids = model.tokenizer.encode("w1 w2 w3 w4", add_special_tokens=True)
    presence, frequency, bias = 1.5, 2.0, {7: 4.0, 11: -100.0, 12: 2.5}
    got = list(model.generate_ids(ids, 16, presence_penalty=presence,
                                  frequency_penalty=frequency, logit_bias=bias, stop_ids=[]))
    plain = list(model.generate_ids(ids, 16, stop_ids=[]))
    assert len(got) == 16 and got != plain  # the settings change the answer
    assert 11 not in got
    # (the reference's logits come from the prompt path: within its rounding of the decode's)
    logits = model.logits(ids + got[:-1])[len(ids) - 1:]
    tol = 2 * logit_tolerance(model)
    for k, tok in enumerate(got):
        z = _reference_choice(logits[k], got[:k], presence, frequency, bias)
        scale = float(np.abs(logits[k]).max())
        assert z[tok] >= z.max() - tol * scale, (k, tok, int(np.argmax(z)))


def test_the_host_chooser_follows_the_devices_positions(model):
    """A bias of 0 changes no logit: the host's greedy tokens are the device's (with a
    repetition penalty, which both apply over the prompt and the generated tokens)."""
    ids = model.tokenizer.encode("w9 w8 w7 w6 w5", add_special_tokens=True)
    for penalty in (1.0, 1.3):
        device = list(model.generate_ids(ids, 20, repetition_penalty=penalty, stop_ids=[]))
        host = list(model.generate_ids(ids, 20, repetition_penalty=penalty,
                                       logit_bias={0: 0.0}, stop_ids=[]))
        assert host == device


def test_penalties_reach_generate_and_the_batch(model):
    kw = dict(presence_penalty=1.0, frequency_penalty=1.5, logit_bias={7: 3.0})
    alone = _alone(model, PROMPTS, max_new_tokens=NEW, **kw)
    assert alone != _alone(model, PROMPTS, max_new_tokens=NEW)
    assert model.generate(PROMPTS, max_new_tokens=NEW, **kw) == alone
    assert model.generate(PROMPTS, sampling=SamplingParams(max_tokens=NEW, **kw)) == alone


def test_chat_completion_is_openais_shape(model):
    messages = [{"role": "user", "content": "w3 w4 w5"}]
    r = model.create_chat_completion(messages, max_tokens=6, temperature=0)
    assert set(r) == {"id", "object", "created", "model", "choices", "usage"}
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    (choice,) = r["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["message"]["role"] == "assistant"
    text = choice["message"]["content"]
    assert text == "".join(model.generate(messages, max_new_tokens=6))
    prompt = len(model.tokenizer.encode_chat(messages))
    assert r["usage"] == {"prompt_tokens": prompt, "completion_tokens": 6,
                          "total_tokens": prompt + 6}
    # streamed: the role first, the same text, the reason last
    chunks = list(model.create_chat_completion(messages, max_tokens=6, temperature=0,
                                               stream=True))
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
               for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == text
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    # a stop string, and an end-of-text token, end it with "stop"
    stop = text.split()[1]
    r = model.create_chat_completion(messages, max_tokens=6, temperature=0, stop=stop)
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["message"]["content"] == text[:text.index(stop)]
    eos = model.tokenizer.eos_ids[0]
    r = model.create_chat_completion(messages, max_tokens=6, logit_bias={eos: 100.0})
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["message"]["content"] == ""
    assert r["usage"]["completion_tokens"] == 0


def test_completion_is_openais_shape(model):
    r = model.create_completion("w1 w2 w3", max_tokens=5, temperature=0)
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-")
    (choice,) = r["choices"]
    assert choice["text"] == "".join(model.generate("w1 w2 w3", max_new_tokens=5))
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert r["usage"]["completion_tokens"] == 5
    many = model(PROMPTS, max_tokens=5, temperature=0, echo=True)
    assert [c["index"] for c in many["choices"]] == list(range(len(PROMPTS)))
    assert [c["text"] for c in many["choices"]] == [
        p + t for p, t in zip(PROMPTS, _alone(model, PROMPTS, max_new_tokens=5))]
    assert many["usage"]["completion_tokens"] == 5 * len(PROMPTS)
    chunks = list(model.create_completion("w1 w2 w3", max_tokens=5, temperature=0,
                                          stream=True))
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_what_is_not_taken_is_refused_clearly(model):
    messages = [{"role": "user", "content": "w1"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with pytest.raises(ValueError, match="clops serve"):
        model.create_chat_completion(messages, tools=tools)
    model.create_chat_completion(messages, tools=tools, tool_choice="none", max_tokens=1)
    with pytest.raises(ValueError, match="clops serve"):
        model.create_chat_completion(messages, response_format={"type": "json_object"})
    with pytest.raises(ValueError, match="messages"):
        model.create_chat_completion([])
    with pytest.raises(ValueError, match="either sampling= or"):
        model.generate("w1", temperature=0.5, sampling=SamplingParams())
    with pytest.raises(ValueError, match="one for each"):
        model.generate(["w1", "w2"], sampling=[SamplingParams()])
    with pytest.raises(ValueError, match="logit_bias"):
        model.generate("w1", logit_bias={10**6: 1.0})
    with pytest.raises(ValueError, match="log-probabilities"):
        model.generate("w1", sampling=SamplingParams(logprobs=2))
    with pytest.raises(ValueError, match="one prompt"):
        model.create_completion(["w1", "w2"], stream=True)


def test_load_tokenizer_reads_no_weights(model, tmp_path, monkeypatch):
    """``load_tokenizer`` gives the tokenizer ``load`` gives, from a model directory and from a
    GGUF file (the default model), without building a model (uploading its weights)."""
    from clops.llm import model as model_mod

    gguf = clops.llm.default_model_path()
    full = clops.llm.load(gguf, progress=False, max_seq_len=64).tokenizer

    def refuse(*a, **k):
        raise AssertionError("load_tokenizer built a model")

    monkeypatch.setattr(model_mod.Model, "__init__", refuse)
    text = "w1 w2 w300 w5"
    messages = [{"role": "user", "content": "w1 w2"}]
    for want, where in ((model.tokenizer, model.source_path), (full, gguf)):
        tok = clops.llm.load_tokenizer(where)
        assert tok.encode(text) == want.encode(text) and tok.encode(text)
        assert tok.encode_chat(messages) == want.encode_chat(messages)
        assert tok.eos_ids == want.eos_ids
    with pytest.raises(clops.llm.ModelFileError):
        clops.llm.load_tokenizer(str(tmp_path))
