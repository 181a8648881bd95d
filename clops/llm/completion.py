"""llm, completion: what ``Model.generate`` and its OpenAI-shaped answers are made of, apart
from the model: the text of a sequence's tokens as they arrive, cut at stop strings; chat
messages checked; and the response and chunk dicts of ``create_chat_completion`` and
``create_completion`` in the shapes OpenAI's API (and llama-cpp-python) give them."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from .tokenizer import TextStream, TextTokenizer


def find_stop(text: str, stops: list[str]) -> int | None:
    """Where the first of ``stops`` begins in ``text`` (None: none is there)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


class TextOut:
    """The text of one sequence's tokens as they arrive: ``push`` returns the new text that is
    safe to show (no incomplete UTF-8 sequence, nothing that may be the start of a stop
    string), ``stopped`` turns True where a stop string appears (the text ends before it),
    and ``finish`` returns the rest once no more tokens come."""

    def __init__(self, tok: TextTokenizer, stops: list[str] | tuple[str, ...] = ()) -> None:
        self.tok = tok
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.stream = TextStream(tok)
        self.sent = 0
        self.stopped = False

    def push(self, token: int) -> str:
        self.stream.push(token)
        if self.stream.held:
            return ""  # an incomplete UTF-8 sequence: wait for the next token
        text = self.stream.text
        cut = find_stop(text, self.stops)
        if cut is not None:
            self.stopped = True
            piece = text[self.sent:cut] if cut > self.sent else ""
            self.sent = max(self.sent, cut)
            return piece
        safe = len(text) - self.hold
        if safe > self.sent:
            piece = text[self.sent:safe]
            self.sent = safe
            return piece
        return ""

    def finish(self) -> str:
        """The text not given yet (with any ids held back at the end), up to a stop string."""
        if self.stopped:
            return ""
        text = self.tok.decode(self.stream.ids)
        if len(text) <= self.sent:
            return ""
        cut = find_stop(text, self.stops)
        if cut is not None:
            self.stopped = True
        end = cut if cut is not None else len(text)
        piece = text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece


@dataclass
class Finished:
    """A sequence's whole answer: its text, why it ended ("stop": an end-of-text token or a
    stop string; "length": its token budget) and how many tokens it took."""

    text: str
    reason: str
    prompt_tokens: int
    completion_tokens: int


def stop_list(stop: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """A request's ``stop`` (a string, a list of them, or None) as a list."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) for s in stop):
        raise TypeError(f"stop must be a string or a list of strings, not {stop!r}")
    return list(stop)


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI chat ``messages`` for the chat template: each a dict with a string ``role``;
    ``content`` a string, None (empty) or a list of text parts (joined)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be a dict with a string 'role'")
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise ValueError(f"messages[{i}].content[{j}] is not a text part "
                                     "({'type': 'text', 'text': ...}): the models read text only")
            content = "".join(part["text"] for part in content)
        if content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string, None or text parts")
        out.append({**m, "content": content or ""})
    return out


def check_chat_extras(tools: Any, tool_choice: Any, response_format: Any) -> None:
    """Refuse, by name, the chat request fields that only ``clops serve`` implements."""
    if tool_choice not in (None, "auto", "none"):
        raise ValueError(f"tool_choice {tool_choice!r}: only None, 'auto' and 'none' are taken")
    if tools and tool_choice != "none":
        raise ValueError("tools: function calling (tool calls read back from the answer) is "
                         "done by clops serve's /v1/chat/completions; "
                         "Model.create_chat_completion takes no tools")
    if response_format is not None and response_format != {"type": "text"}:
        raise ValueError(f"response_format {response_format!r}: answers constrained to JSON "
                         "are made by clops serve's /v1/chat/completions; "
                         "Model.create_chat_completion gives plain text only")


class Response:
    """The fields every response and chunk of one request shares."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model

    @property
    def kind(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def whole(self, answers: list[Finished], prefix: list[str] | None = None) -> dict:
        """The response of a request not streamed (``prefix``: completions' echo, a text
        before each answer)."""
        choices = []
        for i, a in enumerate(answers):
            text = (prefix[i] if prefix else "") + a.text
            if self.chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": a.reason})
            else:
                choices.append({"index": i, "text": text, "logprobs": None,
                                "finish_reason": a.reason})
        prompt = sum(a.prompt_tokens for a in answers)
        completion = sum(a.completion_tokens for a in answers)
        return {"id": self.id, "object": self.kind, "created": self.created,
                "model": self.model, "choices": choices,
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion}}

    def chunk(self, piece: str | None, reason: str | None = None, role: bool = False) -> dict:
        """A streamed chunk of choice 0: chat's ``delta`` (``role``: the first one, which
        names the assistant) or completions' ``text``."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else \
                ({"content": piece} if piece else {})
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": reason}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None,
                      "finish_reason": reason}
        return {"id": self.id, "object": self.kind + ".chunk" if self.chat else self.kind,
                "created": self.created, "model": self.model, "choices": [choice]}
