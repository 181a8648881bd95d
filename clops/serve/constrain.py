"""serve, constrain: ``response_format`` as a mask of allowed tokens for every step, from a JSON
schema (or any JSON object) through llguidance, which compiles the schema into a grammar over
the model's own vocabulary."""

from __future__ import annotations

import json
from typing import Any

import numpy as np


class ConstraintError(ValueError):
    """A response_format that cannot be enforced (HTTP 400)."""


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


class Constraint:
    """One sequence's grammar state: ``mask`` before each token, ``consume`` after it."""

    def __init__(self, vocab: Vocabulary, grammar: str) -> None:
        llg = vocab.llg
        self.matcher = llg.LLMatcher(vocab.tokenizer, grammar)
        if self.matcher.is_error():
            raise ConstraintError(f"invalid JSON schema: {self.matcher.get_error()}")
        self.vocab = vocab
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

    @property
    def finished(self) -> bool:
        return bool(self.matcher.is_stopped())
