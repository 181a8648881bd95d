"""serve, tools: function calling through the model's own chat template. The request's
``tools`` go into the template (templates that support them read a ``tools`` variable), and
the model's answer is read back into OpenAI ``tool_calls`` in the formats chat templates ask
models to write:

- ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, once or more (Qwen2/2.5/3,
  Hermes, SmolLM3 and other templates of that family);
- ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` (Mistral);
- a whole answer that is one JSON object ``{"name": ..., "parameters" | "arguments": {...}}``
  (Llama 3.1-3.3), or a list of them.

An answer in none of these forms is plain content.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def check_tools(tools: Any, template: str | None) -> list[dict[str, Any]] | None:
    """The request's ``tools``, checked; a ValueError where they are malformed or the model's
    chat template has no place for them."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function"
            and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools):
        raise ValueError("'tools' must be a list of {\"type\": \"function\", \"function\": "
                         "{\"name\": ..., \"parameters\": {...}}}")
    if not tools:
        return None
    if not template or "tools" not in template:
        raise ValueError("this model's chat template does not take tools, so it cannot call "
                         "them: use a model whose template does (Qwen2.5, Llama 3.1, "
                         "Mistral, ...)")
    return tools


def _call(obj: Any, names: set[str]) -> dict[str, Any] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names and obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args)}}


def parse_tool_calls(text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[dict]]:
    """(content left over, tool calls) of a model's answer; no calls: (text, [])."""
    names = {t["function"]["name"] for t in tools}
    tagged = _TAGGED.findall(text)
    if tagged:
        calls = []
        for body in tagged:
            try:
                c = _call(json.loads(body), names)
            except json.JSONDecodeError:
                c = None
            if c is None:
                return text, []
            calls.append(c)
        rest = _TAGGED.sub("", text).strip()
        return (rest or None), calls
    body = text.strip()
    if body.startswith("[TOOL_CALLS]"):
        body = body[len("[TOOL_CALLS]"):].strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].strip()
    if body[:1] in "[{":
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return text, []
        items = obj if isinstance(obj, list) else [obj]
        found = [_call(o, names) for o in items]
        calls = [c for c in found if c is not None]
        if items and len(calls) == len(found):
            return None, calls
    return text, []
