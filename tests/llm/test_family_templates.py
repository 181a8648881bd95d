"""Each family's chat template (model data in ``data/templates``: Llama 3.2, Mistral Nemo,
SmolLM2, Qwen3, Gemma 2, Phi-3.5, Granite 3.3) renders through clops' sandboxed jinja2 exactly
as transformers' ``apply_chat_template`` renders it: plain turns, a system prompt, several
turns, and tool calls with their results; a conversation transformers' rendering rejects is
rejected by clops too."""

from __future__ import annotations

import copy
import os

import pytest

pytest.importorskip("transformers")

from clops.llm.chat import TemplateError, render  # noqa: E402

HERE = os.path.join(os.path.dirname(__file__), "data", "templates")
TEMPLATES = sorted(f[:-6] for f in os.listdir(HERE) if f.endswith(".jinja"))
BOS, EOS = "<s>", "</s>"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
CONVERSATIONS = {
    "one turn": ([{"role": "user", "content": "What's Oxygen?"}], None),
    "system": ([{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What's Oxygen?"},
                {"role": "assistant", "content": "An element."},
                {"role": "user", "content": " And hydrogen? "}], None),
    "turns": ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
               {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
              None),
    "tool call": ([{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [{
                       "id": "call12345", "type": "function", "function": {
                           "name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "tool_call_id": "call12345", "content": "18 C, sunny"},
                   {"role": "user", "content": "Thanks"}], TOOLS),
    "tools offered": ([{"role": "user", "content": "Weather in Paris?"}], TOOLS),
}


def _transformers_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, BOS: 1, EOS: 2}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        vocab, unk_token="<unk>")), bos_token=BOS, eos_token=EOS, unk_token="<unk>")


@pytest.fixture(scope="module")
def hf_tokenizer():
    return _transformers_tokenizer()


def test_the_families_have_templates():
    assert {"llama3", "mistral", "smollm2", "qwen3", "gemma2", "phi3", "granite"} <= set(
        TEMPLATES)


@pytest.mark.parametrize("generation", [True, False])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", TEMPLATES)
def test_template_renders_as_transformers(hf_tokenizer, name, conversation, generation):
    with open(os.path.join(HERE, f"{name}.jinja"), encoding="utf-8") as f:
        template = f.read()
    messages, tools = CONVERSATIONS[conversation]
    hf_tokenizer.chat_template = template
    try:
        want = hf_tokenizer.apply_chat_template(copy.deepcopy(messages), tools=tools,
                                                add_generation_prompt=generation,
                                                tokenize=False)
    except Exception as e:  # noqa: BLE001 - transformers raises the template's own errors
        with pytest.raises(TemplateError):
            render(template, copy.deepcopy(messages), generation, BOS, EOS, tools=tools)
        assert str(e)
        return
    got = render(template, copy.deepcopy(messages), generation, BOS, EOS, tools=tools)
    assert got == want
