"""The real chat templates of the model families (model data in ``templates/``, saved verbatim:
see ``SOURCES``) render through clops' sandboxed jinja2 exactly as transformers'
``apply_chat_template`` renders them, for plain turns, a system prompt, several turns, tool
calls and their results, reasoning, and text that JSON or HTML would escape; with and without
the generation prompt. A conversation that transformers' rendering rejects (Gemma's alternating
roles, Llama 3's single tool call, ...) is rejected by clops too, with the template's message."""

from __future__ import annotations

import copy
import json
import os
from datetime import date, datetime

import pytest

pytest.importorskip("transformers")

import jinja2  # noqa: E402
import transformers.utils.chat_template_utils as hf_chat  # noqa: E402

import clops.llm.chat as clops_chat  # noqa: E402
from clops.llm.chat import TemplateError, render  # noqa: E402

# (what it checks does not depend on the device: CI's second pass, on PoCL, leaves it out)
pytestmark = pytest.mark.host

HERE = os.path.join(os.path.dirname(__file__), "templates")
# Where each file comes from. "llama.cpp" is models/templates/<name> of a llama.cpp checkout
# (Raudbjorn/ggml-llama.cpp at ae1a0b1, a fork of ggml-org/llama.cpp; written there by
# scripts/get_chat_template.py, which prints the model's chat_template as it is on the Hub).
# "Hub history" is the template text recorded from the model's Hugging Face repository at that
# commit, as the data set s1mar/chat-template-drift (data/history/<model>.json) keeps it; its
# recorded length was checked.
SOURCES = {
    "gemma2": "llama.cpp google-gemma-2-2b-it.jinja (google/gemma-2-2b-it)",
    "gemma3": "Hub history: unsloth/gemma-3-1b-it tokenizer_config.json at 2ea91725 (the "
              "upload of google/gemma-3-1b-it, which is gated)",
    "granite3_3": "llama.cpp ibm-granite-granite-3.3-2B-Instruct.jinja",
    "llama3_1": "llama.cpp meta-llama-Llama-3.1-8B-Instruct.jinja",
    "llama3_2": "llama.cpp meta-llama-Llama-3.2-3B-Instruct.jinja",
    "mistral_nemo": "llama.cpp mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "olmo2": "Hub history: allenai/OLMo-2-1124-7B-Instruct tokenizer_config.json at 77a26095",
    "phi3_5": "llama.cpp microsoft-Phi-3.5-mini-instruct.jinja",
    "phi4_mini": "Hub history: microsoft/Phi-4-mini-instruct tokenizer_config.json at 618e63e6",
    "qwen2_5": "llama.cpp Qwen-Qwen2.5-7B-Instruct.jinja",
    "qwen3": "llama.cpp Qwen-Qwen3-0.6B.jinja (the Hub's revision of 2025-04-28; Qwen/"
             "Qwen3-30B-A3B's first revision, fd4bf3be of 2025-04-28, is this text too)",
    "qwen3_30b_a3b": "Hub history: Qwen/Qwen3-30B-A3B tokenizer_config.json at f0abbbee "
                     "(2025-05-19, the latest: content and reasoning_content taken only where "
                     "they are strings); that history file's sha256 checked against the data "
                     "set's MANIFEST.sha256",
    "mixtral": "llama-cpp-python 0.3.36 (PyPI sdist) llama_cpp/llama_chat_format.py "
               "MIXTRAL_INSTRUCT_CHAT_TEMPLATE, which it records from mistralai/Mixtral-8x7B-"
               "Instruct-v0.1's tokenizer_config.json: the original revision, as GGUF files of "
               "that time carry it (a later Hub revision that takes a system prompt was not "
               "to be had verbatim here)",
    "gpt_oss": "llama.cpp openai-gpt-oss-120b.jinja, from the llama-cpp-python 0.3.36 (PyPI "
               "sdist) vendor/llama.cpp/models/templates (OpenAI's harmony template; its 16714 "
               "characters and its ending are those of openai/gpt-oss-20b's latest Hub "
               "revision, chat_template.jinja at cbf31f62, 2025-08-08)",
    "smollm2": "Hub history: HuggingFaceTB/SmolLM2-135M-Instruct tokenizer_config.json at "
               "eba0825d",
    "smollm3": "Hub history: HuggingFaceTB/SmolLM3-3B chat_template.jinja at 486a602f (the "
               "latest)",
    "smollm3_unsloth": "llama.cpp HuggingFaceTB-SmolLM3-3B.jinja (Unsloth's edit of SmolLM3's "
                       "template, as its GGUF files carry it)",
}
TEMPLATES = sorted(f[:-len(".jinja")] for f in os.listdir(HERE) if f.endswith(".jinja"))
BOS, EOS = "<s>", "</s>"

WEATHER = {"type": "function", "function": {
    # keys in an order that sorting would change, and text that HTML escaping would change
    "name": "get_weather", "description": "The weather in a city (°C, <b>now</b> & 'here').",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "e.g. Zürich"},
        "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TOOLS = [WEATHER, TIME]


def _call(name: str, args: dict, call_id: str) -> dict:
    # Mistral's template wants ids of 9 letters and digits
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


USER = {"role": "user", "content": "What's the weather in Zürich?"}
CALL = {"role": "assistant", "content": "",
        "tool_calls": [_call("get_weather", {"city": "Zürich", "unit": "C"}, "call00001")]}
RESULT = {"role": "tool", "tool_call_id": "call00001", "content": '{"temp": 18, "sky": "sunny"}'}

# name: (messages, tools)
CONVERSATIONS: dict[str, tuple[list[dict], list[dict] | None]] = {
    "user": ([{"role": "user", "content": "What's Oxygen?"}], None),
    "system": ([{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What's Oxygen?"},
                {"role": "assistant", "content": "An element."},
                {"role": "user", "content": "And hydrogen?"}], None),
    "turns": ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
               {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
              None),
    "turns then user": ([{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello!"},
                         {"role": "user", "content": "2+2?"},
                         {"role": "assistant", "content": "4"},
                         {"role": "user", "content": "3+3?"}], None),
    "tools offered": ([{"role": "system", "content": "You help with travel."}, USER], TOOLS),
    "tool call": ([USER, CALL, RESULT,
                   {"role": "assistant", "content": "18 °C and sunny."}], TOOLS),
    "tool result pending": ([USER, CALL, RESULT], TOOLS),
    "parallel tool calls": ([
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            _call("get_weather", {"city": "Paris"}, "call00002"),
            _call("get_time", {"city": "Paris"}, "call00003")]},
        {"role": "tool", "tool_call_id": "call00002", "content": "21 C"},
        {"role": "tool", "tool_call_id": "call00003", "content": "14:05"},
        {"role": "assistant", "content": "21 °C; it is 14:05."}], TOOLS),
    # what OpenAI-style clients send: no text beside the call is null
    "tool call, null content": ([USER, {**CALL, "content": None}, RESULT], TOOLS),
    "empty tool list": ([USER], []),
    # Phi-4-mini takes its tools as a JSON string on the system message
    "tools on the system message": ([
        {"role": "system", "content": "You help with travel.", "tools": json.dumps(TOOLS)},
        USER], None),
    "reasoning": ([
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "reasoning_content": "Add again.", "content": "6"}], None),
    # the name some OpenAI-style servers give the reasoning
    "reasoning, other name": ([
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "reasoning": "Add them.", "content": "4"}], None),
    "text to escape": ([
        {"role": "system", "content": "  Answer in <b>HTML</b> & \"quote\" 'it'.\n"},
        {"role": "user", "content": "\n  Zürich → Genève: ≈ 280 km? {{ not jinja }} \\n "}],
        None),
    "two users in a row": ([{"role": "user", "content": "Hi"},
                            {"role": "user", "content": "Hello?"}], None),
}

def _cases():
    for template in TEMPLATES:
        for conversation in CONVERSATIONS:
            for generation_prompt in (True, False):
                yield pytest.param(template, conversation, generation_prompt,
                                   id=f"{template}-{conversation.replace(' ', '_')}-"
                                      f"{'prompt' if generation_prompt else 'no_prompt'}")


@pytest.fixture(scope="module")
def hf_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, BOS: 1, EOS: 2}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        bos_token=BOS, eos_token=EOS, unk_token="<unk>")


@pytest.fixture(scope="module")
def template_texts() -> dict[str, str]:
    texts = {}
    for name in TEMPLATES:
        with open(os.path.join(HERE, name + ".jinja"), encoding="utf-8") as f:
            texts[name] = f.read()
    return texts


class _FixedDatetime(datetime):
    @classmethod
    def now(cls, tz=None):  # datetime.now's signature
        return cls(2024, 7, 26, 12, 0, 0)


class _FixedDate(date):
    @classmethod
    def today(cls):
        return cls(2024, 7, 26)


@pytest.fixture(autouse=True)
def same_day(monkeypatch):
    """Llama 3.2, Granite 3.3 and SmolLM3 write today's date through ``strftime_now`` (Llama 3.2
    reads a ``date_string`` first, but clops' ``render`` takes no such template variable). Both
    sides keep their own ``strftime_now``; the clock each reads (transformers'
    ``datetime.now``, clops' ``date.today``) is pinned to the same day, so that the prompts are
    comparable and a render never straddles midnight."""
    monkeypatch.setattr(hf_chat, "datetime", _FixedDatetime)
    monkeypatch.setattr(clops_chat, "date", _FixedDate)


def test_every_template_has_its_source():
    assert set(TEMPLATES) == set(SOURCES)


def test_the_day_is_pinned_on_both_sides(hf_tokenizer, template_texts):
    text = template_texts["llama3_2"]
    messages = [{"role": "user", "content": "Hi"}]
    expected = hf_tokenizer.apply_chat_template(messages, chat_template=text, tokenize=False,
                                                add_generation_prompt=True)
    got = render(text, messages, True, BOS, EOS)
    assert "Today Date: 26 Jul 2024" in expected
    assert "Today Date: 26 Jul 2024" in got


# Conversations that transformers cleans up before rendering, as clops does: keys whose value
# is None left out, reasoning under another name given as reasoning_content. Older releases
# (5.17) rendered such messages as given; there the reference is not the behaviour clops follows.
CLEANED = {"tool call, null content": ("{{ messages[0].content is defined }}", "False"),
           "reasoning, other name": ("{{ messages[0].reasoning_content }}", "x")}


def _transformers_cleans(tok, conversation: str) -> bool:
    probe, want = CLEANED[conversation]
    msg = {"role": "assistant", "content": None, "reasoning": "x"}
    return tok.apply_chat_template([msg], chat_template=probe, tokenize=False) == want


def _transformers_gives_thinking(tok) -> bool:
    """Whether this transformers hands a message's reasoning_content to a template as
    ``thinking`` too (gpt-oss's name), as newer releases and clops do (5.17 did not)."""
    msg = {"role": "assistant", "content": "4", "reasoning_content": "x"}
    return tok.apply_chat_template([msg], chat_template="{{ messages[0].thinking }}",
                                   tokenize=False) == "x"


@pytest.mark.parametrize("template,conversation,generation_prompt", list(_cases()))
def test_renders_as_transformers(hf_tokenizer, template_texts, template, conversation,
                                 generation_prompt):
    text = template_texts[template]
    messages, tools = CONVERSATIONS[conversation]
    if conversation in CLEANED and not _transformers_cleans(hf_tokenizer, conversation):
        pytest.skip("this transformers renders the messages as given, not cleaned up as "
                    "newer releases and clops do")
    if (conversation.startswith("reasoning") and "thinking" in text
            and not _transformers_gives_thinking(hf_tokenizer)):
        pytest.skip("this transformers does not give reasoning_content to templates as "
                    "`thinking`, as newer releases and clops do")
    try:
        expected = hf_tokenizer.apply_chat_template(
            copy.deepcopy(messages), tools=copy.deepcopy(tools), chat_template=text,
            add_generation_prompt=generation_prompt, tokenize=False)
    except Exception as e:  # noqa: BLE001 - whatever the template raises there
        with pytest.raises(TemplateError) as got:
            render(text, copy.deepcopy(messages), generation_prompt, BOS, EOS, tools=tools)
        if type(e) is jinja2.exceptions.TemplateError:  # the template's raise_exception
            assert str(got.value) == str(e)
        return
    got = render(text, copy.deepcopy(messages), generation_prompt, BOS, EOS, tools=tools)
    assert got == expected
