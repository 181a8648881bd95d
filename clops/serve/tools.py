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

``tool_choice`` ``"required"`` or a named function holds the answer to the syntax of the
model's template (``SYNTAXES``), through a grammar (``constrain.tool_call_grammar``); a
template whose syntax is none of these cannot be held to it.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def check_tools(tools: Any, template: str | None, offered: bool = True,
                ) -> list[dict[str, Any]] | None:
    """The request's ``tools``, checked; a ValueError where they are malformed or (where they
    are to be ``offered`` to the model) the model's chat template has no place for them."""
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
    if offered and (not template or "tools" not in template):
        raise ValueError("this model's chat template does not take tools, so it cannot call "
                         "them: use a model whose template does (Qwen2.5, Llama 3.1, "
                         "Mistral, ...)")
    return tools


@dataclass(frozen=True)
class CallSyntax:
    """How one family of chat templates asks its models to write tool calls."""

    name: str
    markers: tuple[str, ...]  # text in a template that shows it asks for this syntax (any)
    args_key: str  # the key of a call's arguments in its JSON object
    opening: str  # written once, before the calls
    around: tuple[str, str]  # written before and after each call's JSON object
    between: str  # between two calls
    as_list: bool  # the calls are one JSON list
    parallel: bool  # the syntax holds more than one call


SYNTAXES = (
    CallSyntax("tagged", ("<tool_call>",), "arguments", "", ("<tool_call>\n", "\n</tool_call>"),
               "\n", as_list=False, parallel=True),
    CallSyntax("mistral", ("[TOOL_CALLS]",), "arguments", "[TOOL_CALLS]", ("", ""), "",
               as_list=True, parallel=True),
    # (Llama 3.1-3.3: one JSON object, its arguments under "parameters")
    CallSyntax("llama", ("<|python_tag|>", '"parameters": dictionary of argument'),
               "parameters", "", ("", ""), "", as_list=False, parallel=False),
)


def call_syntax(template: str | None) -> CallSyntax | None:
    """The tool-call syntax a chat template asks for; None where it is none of ``SYNTAXES``."""
    for syntax in SYNTAXES:
        if template and any(m in template for m in syntax.markers):
            return syntax
    return None


@dataclass(frozen=True)
class ToolChoice:
    """A request's ``tool_choice``, read: ``mode`` is "auto", "none", "required" or "named"
    (then ``name`` is the function's)."""

    mode: str
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")


def read_tool_choice(choice: Any, tools: Any) -> ToolChoice:
    """``tool_choice`` checked against ``tools`` (the request's, checked by ``check_tools``);
    a ValueError names what is wrong."""
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if not tools:
        raise ValueError("'tool_choice' is only allowed with 'tools' (the functions the model "
                         "may call)")
    if choice in ("auto", "none", "required"):
        return ToolChoice(choice)
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not (isinstance(choice, dict) and choice.get("type") == "function"
            and isinstance(fn, dict) and isinstance(fn.get("name"), str)):
        raise ValueError("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    names = [t["function"]["name"] for t in tools]
    if fn["name"] not in names:
        raise ValueError(f"tool_choice names the function {fn['name']!r}, which is not among "
                         f"'tools' ({', '.join(map(repr, names))})")
    return ToolChoice("named", fn["name"])


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


def parse_tool_calls(text: str, tools: list[dict[str, Any]], parallel: bool = True,
                     ) -> tuple[str | None, list[dict]]:
    """(content left over, tool calls) of a model's answer; no calls: (text, []).
    ``parallel=False`` keeps the first call alone (``parallel_tool_calls: false``)."""
    content, calls = _parse(text, tools)
    return content, calls if parallel else calls[:1]


def _parse(text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[dict]]:
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
