"""serve, constrain: ``response_format`` and a forced ``tool_choice`` as a mask of allowed tokens
for every step, from a JSON schema (or any JSON object) or the model's tool-call syntax with
each function's parameters, through llguidance, which compiles the grammar over the model's own
vocabulary."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from .tools import CallSyntax


class ConstraintError(ValueError):
    """A response_format or tool_choice that cannot be enforced (HTTP 400); ``param``: the
    request field at fault."""

    def __init__(self, message: str, param: str = "response_format") -> None:
        super().__init__(message)
        self.param = param


class Vocabulary:
    """The model's tokenizer as llguidance sees it (built once: it takes about a second)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        try:
            import llguidance
            import llguidance.numpy  # noqa: F401 - the bitmask helpers
        except ImportError as e:
            raise ConstraintError("response_format needs llguidance: pip install "
                                  "'clops-opencl[serve]'") from e
        to_str = getattr(tokenizer.backend, "to_str", None)
        if to_str is None:
            raise ConstraintError("this model's tokenizer cannot be used for constrained "
                                  "output (response_format)")
        eos = tokenizer.eos_ids[0] if tokenizer.eos_ids else None
        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(to_str(), n_vocab=vocab_size, eos_token=eos)
        self.vocab_size = vocab_size

    def check(self, grammar: str, param: str = "response_format") -> None:
        """Raise ConstraintError where ``grammar`` cannot be compiled over this vocabulary."""
        err = self.llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if err and not err.startswith("WARNING"):
            raise ConstraintError(f"the {param} cannot be enforced: {err}", param)


def grammar_for(response_format: Any) -> str | None:
    """The llguidance grammar of an OpenAI ``response_format``; None for plain text."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise ConstraintError("response_format must be an object with a 'type'")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema: Any = {"type": "object"}
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise ConstraintError("response_format.json_schema must be an object with a "
                                  "'schema' object")
        schema = spec.get("schema", {})
    else:
        raise ConstraintError(f"response_format type {kind!r} is not supported (text, "
                              "json_object, json_schema)")
    import llguidance

    try:
        return llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False})
    except (ValueError, TypeError) as e:
        raise ConstraintError(f"invalid JSON schema: {e}") from None


def tool_call_grammar(syntax: CallSyntax, tools: list[dict[str, Any]], only: str | None,
                      parallel: bool, added: dict[str, int] | None = None) -> str:
    """The grammar of an answer that is tool calls alone, in ``syntax``: one call (or more,
    where ``parallel`` and the syntax allow), each of a function of ``tools`` (of ``only``,
    where given) with arguments valid against its ``parameters`` schema. ``added``: the
    tokenizer's added tokens (text -> id), which the syntax's markers are where they are one."""
    import llguidance

    def literal(text: str) -> str:
        return _literal(text, added or {})

    options = [_call_schema(t["function"], syntax.args_key) for t in tools
               if only is None or t["function"]["name"] == only]
    one: dict = options[0] if len(options) == 1 else {"anyOf": options}
    many = parallel and syntax.parallel
    flat = {"x-guidance": {"whitespace_flexible": False}}
    if syntax.as_list:
        schema = {"type": "array", "items": one, "minItems": 1, **({} if many else
                                                                   {"maxItems": 1}), **flat}
        body = f"{literal(syntax.opening)} %json {json.dumps(schema)}"
    else:
        before, after = (literal(s) for s in syntax.around)
        call = f"{before} %json {json.dumps({**one, **flat})} {after}"
        more = f" ({literal(syntax.between)} call)*" if many else ""
        body = f"{literal(syntax.opening)} call{more}\ncall: {call}"
    try:
        return llguidance.LLMatcher.grammar_from_lark(f"start: {body}\n")
    except (ValueError, TypeError) as e:
        raise ConstraintError(f"the tools' parameters cannot be enforced: {e}", "tools") from None


def _literal(text: str, added: dict[str, int]) -> str:
    """``text`` as a sequence of the grammar: an added token's text as that token (llguidance
    matches an added token only by its id, never by its spelling), the rest as quoted text."""
    if not text:
        return ""
    found = sorted((t for t in added if t and t in text), key=len, reverse=True)
    if not found:
        return json.dumps(text)
    cut = re.compile("(" + "|".join(map(re.escape, found)) + ")")
    return " ".join(f"<[{added[p]}]>" if p in added else json.dumps(p)
                    for p in cut.split(text) if p)


def _call_schema(function: dict[str, Any], args_key: str) -> dict[str, Any]:
    """The JSON schema of one call's object: ``{"name": <the name>, <args_key>: {...}}``."""
    params = function.get("parameters")
    if params is None:
        params = {}
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ConstraintError(f"the parameters of the function {function['name']!r} must be a "
                              "JSON schema of an object", "tools")
    return {"type": "object",
            "properties": {"name": {"const": function["name"]},
                           args_key: {**params, "type": "object"}},
            "required": ["name", args_key], "additionalProperties": False}


class Constraint:
    """One sequence's grammar state: ``mask`` before each token, ``consume`` after it, both on
    the engine's thread. The matcher is touched there alone (it is not safe across threads, and
    the engine runs ahead of the reader of its tokens): ``complete_after`` tells the reader,
    in a plain number, after how many tokens the grammar was complete."""

    def __init__(self, vocab: Vocabulary, grammar: str) -> None:
        llg = vocab.llg
        self.matcher = llg.LLMatcher(vocab.tokenizer, grammar)
        if self.matcher.is_error():
            raise ConstraintError(f"invalid JSON schema: {self.matcher.get_error()}")
        self.vocab = vocab
        self.consumed = 0
        self.complete_after: int | None = None
        self._bits = llg.numpy.allocate_token_bitmask(1, vocab.tokenizer.vocab_size)

    def mask(self, _seq: int) -> np.ndarray | None:
        llg = self.vocab.llg
        llg.numpy.fill_next_token_bitmask(self.matcher, self._bits, 0)
        if self.matcher.is_error():
            raise ConstraintError(self.matcher.get_error())
        bits = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little").astype(bool)
        out = np.zeros(self.vocab.vocab_size, bool)
        n = min(len(bits), self.vocab.vocab_size)
        out[:n] = bits[:n]
        return out

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise ConstraintError(f"token {token} broke the grammar: "
                                  f"{self.matcher.get_error()}")
        self.consumed += 1
        if self.complete_after is None and self.matcher.is_stopped():
            self.complete_after = self.consumed

    def finished(self, tokens: int) -> bool:
        """Whether the grammar was complete after the first ``tokens`` tokens (safe to ask
        from any thread)."""
        done = self.complete_after
        return done is not None and tokens >= done
