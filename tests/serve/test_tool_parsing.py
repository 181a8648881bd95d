"""Tool calls read back from the formats chat templates ask models to write."""

from __future__ import annotations

import json

import pytest

from clops.serve.tools import check_tools, parse_tool_calls

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}},
         {"type": "function", "function": {"name": "add", "parameters": {}}}]


def _calls(text):
    content, calls = parse_tool_calls(text, TOOLS)
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                     for c in calls]


def test_tagged_calls_qwen_hermes():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            '\n</tool_call>\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}'
            '</tool_call>')
    assert _calls(text) == ("Let me check.", [("get_weather", {"city": "Paris"}),
                                              ("add", {"a": 1, "b": 2})])


def test_mistral_and_llama_forms():
    assert _calls('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}]') == \
        (None, [("add", {"a": 1})])
    assert _calls('{"name": "get_weather", "parameters": {"city": "Oslo"}}') == \
        (None, [("get_weather", {"city": "Oslo"})])
    assert _calls('<|python_tag|>{"name": "add", "arguments": "{\\"a\\": 3}"}') == \
        (None, [("add", {"a": 3})])


@pytest.mark.parametrize("text", [
    "The weather is fine.",
    '{"name": "unknown_tool", "arguments": {}}',
    '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',
    '<tool_call>not json</tool_call>',
    '{"city": "Paris"}',
    "[1, 2, 3]",
])
def test_anything_else_is_content(text):
    assert parse_tool_calls(text, TOOLS) == (text, [])


def test_tools_are_checked():
    template = "{% for t in tools %}{{ t }}{% endfor %}"
    assert check_tools(None, template) is None
    assert check_tools(TOOLS, template) == TOOLS
    with pytest.raises(ValueError, match="must be a list"):
        check_tools([{"type": "function"}], template)
    with pytest.raises(ValueError, match="does not take tools"):
        check_tools(TOOLS, "{% for m in messages %}{{ m.content }}{% endfor %}")
