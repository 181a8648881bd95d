"""llm, tokenizer: a ``tokenizers.Tokenizer`` from a ``tokenizer.json`` or rebuilt from GGUF
metadata (byte-level BPE for ``gpt2`` vocabularies, SentencePiece BPE with byte fallback for
``llama`` ones), plus the chat template of the model."""

from __future__ import annotations

import functools
import heapq
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

# Token types in GGUF metadata (llama.cpp's numbering).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = (
    1, 2, 3, 4, 5, 6)

# How a byte-level BPE vocabulary splits text before its merges, by GGUF ``tokenizer.ggml.pre``
# (the names llama.cpp's converter writes): a sequence of regex splits, each match its own piece,
# as the model's tokenizer.json splits. BYTE_LEVEL is GPT-2's byte-level step with its own regex
# (steps after it see the text as byte characters, as in tokenizer.json); a sequence without it
# ends with the byte mapping alone. The regexes are the tokenizer.json ones where llama.cpp
# quotes them, else llama.cpp's own.
BYTE_LEVEL = "<byte-level>"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_NOT_WORD = r"[^\r\n\p{L}\p{N}]?"
_GPT4O = (f"{_NOT_WORD}{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|{_NOT_WORD}{_UPPER}+{_LOWER}*"
          rf"{_CONTRACTIONS}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
# GPT-2's regex without its last alternative (llama.cpp's lists; the text it would match stays
# a piece of its own all the same)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# the cased letters (Unicode's Lu, Ll, Lt), as DeepSeek LLM's tokenizer lists them
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
    "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-"
    "\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00"
    "-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-"
    "\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-"
    "\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
    "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13"
    "-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943")
_HAN_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_HAN_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_DEEPSEEK3_WORDS = (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"""
                    r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+")
_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"


class PreSplits(NamedTuple):
    """The splits of a ``tokenizer.ggml.pre`` name, and how its BPE model and text behave."""

    steps: tuple[str, ...]
    ignore_merges: bool = False  # a word that is a token is that token, merges or not
    nfc: bool = False  # the text is NFC-normalized first


def _family(*steps: str, ignore_merges: bool = False, nfc: bool = False) -> PreSplits:
    return PreSplits(steps, ignore_merges, nfc)


_PRE_FAMILIES: list[tuple[tuple[str, ...], PreSplits]] = [
    # llama.cpp's own, for files that name no family of their own
    (("default",), _family(r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    (("gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
      "jina-es", "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code",
      "roberta-bpe", "gigachat", "a.x-4.0", "mellum", "modern-bert"), _family(BYTE_LEVEL)),
    (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
      "mellum2"), _family(r"\p{N}", BYTE_LEVEL)),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano"), _family(_LLAMA3, ignore_merges=True)),
    (("dbrx", "smaug-bpe", "glm4", "chatglm-bpe"), _family(_LLAMA3)),
    (("qwen2", "deepseek-r1-qwen"), _family(_QWEN2, nfc=True)),
    (("kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"), _family(_QWEN2)),
    (("qwen35",), _family(
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+", nfc=True)),
    (("jais-2",), _family(
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
        r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")),
    (("deepseek-llm",), _family(
        r"[\r\n]", rf"\s?[{_DEEPSEEK_LETTERS}]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", r"\s+$",
        _HAN_HANGUL, r"\p{N}+")),
    (("deepseek-coder",), _family(r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _HAN_HANGUL, r"\p{N}")),
    (("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), _family(
        r"\p{N}{1,3}", _HAN_KANA,
        _DEEPSEEK3_WORDS + r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")),
    (("spark2_5",), _family(
        r"\p{N}{1,3}", _HAN_KANA, _DEEPSEEK3_WORDS + r"|[\r\n]|\s+(?!\S)|\s+", r"\p{N}")),
    (("youtu",), _family(
        "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b"
        "\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|" + _HAN_KANA,
        f"{_NOT_WORD}{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|{_NOT_WORD}{_UPPER}+{_LOWER}*"
        rf"{_CONTRACTIONS}?|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ignore_merges=True)),
    # Falcon's tokenizer.json: punctuation, GPT-2's split, runs of digits, then threes of them
    (("falcon",), _family(r"[\p{P}$+<=>^`|~]+", BYTE_LEVEL, r"\p{N}+", "[0-9][0-9][0-9]")),
    (("poro-chat", "bloom", "gpt3-finnish"), _family(_BLOOM)),
    (("viking",), _family(_BLOOM, r"\p{N}")),
    (("tekken",), _family(
        f"{_NOT_WORD}{_UPPER}*{_LOWER}+|{_NOT_WORD}{_UPPER}+{_LOWER}*"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+", ignore_merges=True)),
    (("chameleon",), _family(
        "<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
        r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", _GPT2)),
    (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _family(_GPT4O)),
    (("granite-embed-multi-97m",), _family(
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+"
        + _CONTRACTIONS + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+"
        r"((?=[\p{L}\p{M}])([^A-Z]))*" + _CONTRACTIONS + r"?|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+", ignore_merges=True)),
    (("tiny_aya", "cohere2moe"), _family(r"\d{1,3}(?=(?:\d{3})*\b)", _GPT4O)),
    (("superbpe",), _family(r"\p{N}+", r"(?=(\d{3})+(?!\d))")),
    (("bailingmoe", "bailingmoe2", "llada-moe"), _family(
        r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*"
        r"|\s*[\r\n]|\s+(?!\S)|\s+")),
    (("seed-coder",), _family(
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+")),
    (("ufakzeka",), _family(
        r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")),
    (("grok-2",), _family(_QWEN2)),
    (("laguna",), _family(r"[^\n]+|[\n]+", _QWEN2)),
    (("exaone-moe",), _family(
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")),
    (("minicpm5",), _family(
        r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", ignore_merges=True)),
]
PRE_TOKENIZERS: dict[str, PreSplits] = {
    name: pre for names, pre in _PRE_FAMILIES for name in names}
# names llama.cpp knows whose splitting clops does not reproduce, and why
UNSUPPORTED_PRE: dict[str, str] = {
    "kimi-k2": "its splitting is a hand-written procedure of llama.cpp's, not a regex",
    "afmoe": "its digit grouping is a hand-written procedure of llama.cpp's, not a regex",
    "gemma4": "its vocabulary is not byte-level (spaces are \u2581)",
    "granite-embed-multi-311m": "its vocabulary is not byte-level (spaces are \u2581)",
    "sarvam-moe": "its vocabulary is not byte-level (spaces are \u2581)",
    "whitespace": "its vocabulary is not byte-level (a whitespace-split word-piece model)",
}


def pre_tokenizer(name: Any, source: str = "GGUF file") -> PreSplits:
    """The splitting of the ``tokenizer.ggml.pre`` name ``name``; a ``ValueError`` that says
    what is known for a name clops does not know or reproduce, or a missing one (guessing would
    split text wrongly, and so give wrong ids, without a sign).

    >>> pre_tokenizer("qwen2").nfc
    True
    """
    pre = PRE_TOKENIZERS.get(name) if isinstance(name, str) else None
    if pre is not None:
        return pre
    if name is None:
        raise ValueError(
            f"{source}: a byte-level BPE vocabulary (tokenizer.ggml.model 'gpt2') without "
            "tokenizer.ggml.pre, so how it splits text before its merges is unknown; convert "
            "the model again with a current llama.cpp convert_hf_to_gguf.py, or load its "
            "Hugging Face directory (config.json, *.safetensors, tokenizer.json)")
    why = UNSUPPORTED_PRE.get(name) if isinstance(name, str) else None
    if why:
        raise ValueError(f"{source}: tokenizer.ggml.pre {name!r} is not supported: {why}; "
                         "load the model's Hugging Face directory (with its tokenizer.json) "
                         "instead")
    raise ValueError(
        f"{source}: tokenizer.ggml.pre {name!r} is not a pre-tokenizer clops knows, so it "
        "cannot split text as the model was trained to; known: "
        f"{', '.join(sorted(PRE_TOKENIZERS))}. Load the model's Hugging Face directory (with "
        "its tokenizer.json) instead, or convert it with a llama.cpp that names a known one")


def byte_level_pre_tokenizer(pre: PreSplits) -> pre_tokenizers.PreTokenizer:
    """``pre``'s splits as a ``tokenizers`` pre-tokenizer, ending in the byte mapping."""
    steps: list[pre_tokenizers.PreTokenizer] = []
    for step in pre.steps:
        if step == BYTE_LEVEL:
            steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
        else:
            steps.append(pre_tokenizers.Split(Regex(step), behavior="isolated"))
    if BYTE_LEVEL not in pre.steps:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (a fact of the format)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(
        range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class Encoder(Protocol):
    """Text -> ids, matching special tokens in the text or (``parse_special=False``) not."""

    def __call__(self, text: str, parse_special: bool = True) -> list[int]: ...


class SpecialMatch(NamedTuple):
    """A special token found in a text: its span there and its id."""

    start: int
    end: int
    id: int


class SpecialTokens:
    """Where the special tokens of a vocabulary are in a text, found as the ``tokenizers``
    library finds its added tokens: leftmost, then longest, spans that do not overlap."""

    def __init__(self, tokens: dict[str, tuple[int, bool, bool]]) -> None:
        self.tokens = tokens  # text -> (id, lstrip, rstrip)
        self.lengths = sorted({len(t) for t in tokens}, reverse=True)
        # where a token may start: one class of characters, found at C speed
        firsts = "".join(re.escape(c) for c in sorted({t[0] for t in tokens}))
        self.firsts = re.compile(f"[{firsts}]" if firsts else "(?!)")
        # what a string may end (begin) with to make one with the text after (before) it
        self.heads = {t[:k] for t in tokens for k in range(1, len(t))}
        self.tails = {t[k:] for t in tokens for k in range(1, len(t))}
        self.longest = max(self.lengths, default=0)

    def find(self, text: str, start: int = 0, end: int | None = None) -> Iterator[SpecialMatch]:
        """The special tokens in ``text[start:end]``, spans as in ``text``."""
        end = len(text) if end is None else end
        pos = start
        while True:
            m = self.firsts.search(text, pos, end)
            if m is None:
                return
            at = m.start()
            for n in self.lengths:
                if at + n <= end and text[at:at + n] in self.tokens:
                    yield SpecialMatch(at, at + n, self.tokens[text[at:at + n]][0])
                    pos = at + n
                    break
            else:
                pos = at + 1

    def contains(self, text: str) -> bool:
        return next(self.find(text), None) is not None

    def pieces(self, text: str) -> list[tuple[int, int]]:
        """The spans of ``text`` that must stay text beside a template's own text: its special
        tokens, and an end (a start) that could make one with the text after (before) it, the
        longest such, whitespace aside (templates trim it). Sorted and disjoint."""
        spans = [(m.start, m.end) for m in self.find(text)]
        body = text.rstrip()
        for k in range(min(len(body), self.longest - 1), 0, -1):
            if body[-k:] in self.heads:
                spans.append((len(body) - k, len(body)))
                break
        lead = len(text) - len(text.lstrip())
        for k in range(min(len(text) - lead, self.longest - 1), 0, -1):
            if text[lead:lead + k] in self.tails:
                spans.append((lead, lead + k))
                break
        merged: list[tuple[int, int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged


class TextTokenizer:
    """Text <-> token ids, with the special tokens and chat template of a model.

    >>> tok = model.tokenizer
    >>> tok.decode(tok.encode("Hello world"))
    'Hello world'
    """

    def __init__(self, backend: Tokenizer, bos_id: int | None, eos_ids: Sequence[int],
                 add_bos: bool, chat_template: str | None,
                 encoder: Encoder | None = None) -> None:
        self.backend = backend
        # text -> ids where the backend's own model cannot do it exactly (SentencePiece BPE)
        self.encoder = encoder
        self.bos_id = bos_id
        self.eos_ids = [i for i in eos_ids if i is not None]
        self.add_bos = add_bos
        self.chat_template = chat_template
        self._byte_tokens: dict[int, bool] = {}

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False,
               parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; BOS is prepended only when asked and the model wants it.
        Special tokens written in the text become their ids, or (``parse_special=False``)
        plain text."""
        if not parse_special:
            ids = self._encode_plain(text, True)
        elif self.encoder is not None:
            ids = self.encoder(text)
        else:
            ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def is_byte_token(self, token_id: int) -> bool:
        """Whether the token stands for one byte, ``<0xNN>`` (byte fallback)."""
        got = self._byte_tokens.get(token_id)
        if got is None:
            text = self.token_text(token_id)
            got = self._byte_tokens[token_id] = bool(text and _BYTE_TOKEN.fullmatch(text))
        return got

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> str:
        """Render ``messages`` with the model's Jinja chat template (sandboxed); ``tools``
        (OpenAI-style function descriptions) go to templates that take them."""
        from .chat import render

        if not self.chat_template:
            raise ValueError("this model has no chat template; run without chat mode")
        bos = self._bos_text()
        eos = self.token_text(self.eos_ids[0]) if self.eos_ids else ""
        return render(self.chat_template, messages, add_generation_prompt, bos or "", eos or "",
                      tools=tools)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None,
                    parse_special: bool = False) -> list[int]:
        """Token ids of the conversation rendered with the chat template, with BOS first
        where the model wants one and the rendered text does not start with it. The template's
        own markers are special tokens; text that came in the messages or ``tools`` (any
        string: contents, text parts, tool descriptions) is tokenized as text, even where it
        spells a special token, so that a message cannot open a turn of its own.
        ``parse_special=True`` tokenizes the whole rendered text with its special tokens, as
        the text is (what a server that trusts its clients may want).

        Conversations whose strings spell no special token get exactly the ids of the whole
        rendered text. Raises ``ValueError`` when a string spells one and the template rewrote
        or tested it, so that it cannot be told apart from the template's own text.

        >>> ids = tok.encode_chat([{"role": "user", "content": "Hi"}])
        """
        text = self.apply_chat_template(messages, add_generation_prompt, tools)
        bos = self._bos_text()

        def whole() -> list[int]:
            return self.encode(text, add_special_tokens=not (bos and text.startswith(bos)))

        specials = self.special_tokens
        if parse_special or not specials.tokens:
            return whole()
        strings = list(_strings([messages, tools]))
        if not any(specials.pieces(s) for s in strings):
            return whole()
        from .chat import locate

        eos = self.token_text(self.eos_ids[0]) if self.eos_ids else ""
        spans = locate(self.chat_template or "", messages, text, specials.pieces,
                       add_generation_prompt, bos or "", eos or "", tools=tools)
        if spans is None:
            hostile = next((s for s in strings if specials.contains(s)), None)
            if hostile is None:
                # only a string's end that could make a token with the template's text: the
                # text as it is (no string spells a special token itself)
                return whole()
            token = next(specials.find(hostile))
            raise ValueError(
                f"the conversation holds the text of the special token "
                f"{hostile[token.start:token.end]!r}, and this chat template rewrites or tests "
                "that text, so that it cannot be kept apart from the template's own markers; "
                "take the token's text out of the message")
        if not any(_overlaps(m, spans) for m in specials.find(text)):
            return whole()  # the strings' pieces make no special token here: as before
        return self._encode_apart(text, spans, bos)

    def _encode_apart(self, text: str, spans: list[tuple[int, int]],
                      bos: str | None) -> list[int]:
        """``text`` with special tokens only outside ``spans``; the text between two of them
        is tokenized as a whole, as ``encode`` tokenizes the text between special tokens."""
        specials = self.special_tokens
        cuts: list[SpecialMatch] = []
        pos = 0
        for start, end in [*spans, (len(text), len(text))]:
            cuts.extend(specials.find(text, pos, start))
            pos = end
        ids: list[int] = []
        template_bos = bool(bos) and text.startswith(bos or "") and (
            not spans or spans[0][0] >= len(bos or ""))
        if self.add_bos and self.bos_id is not None and not template_bos:
            ids.append(self.bos_id)
        pos = 0
        for k, cut in enumerate(cuts):
            # a token with lstrip/rstrip takes the whitespace beside it, as the backend's own
            # matching does
            _, lstrip, rstrip = specials.tokens[text[cut.start:cut.end]]
            start, end = cut.start, cut.end
            limit = cuts[k + 1].start if k + 1 < len(cuts) else len(text)
            while lstrip and start > pos and text[start - 1].isspace():
                start -= 1
            while rstrip and end < limit and text[end].isspace():
                end += 1
            if start > pos:
                ids += self._encode_plain(text[pos:start], pos == 0)
            ids.append(cut.id)
            pos = end
        if pos < len(text):
            ids += self._encode_plain(text[pos:], pos == 0)
        return ids

    def _bos_text(self) -> str | None:
        return self.token_text(self.bos_id) if self.bos_id is not None else None

    @functools.cached_property
    def special_tokens(self) -> SpecialTokens:
        """The special tokens that ``encode`` finds in text."""
        tokens: dict[str, tuple[int, bool, bool]] = {}
        for tid, added in sorted(self.backend.get_added_tokens_decoder().items()):
            if added.special and added.content:
                tokens.setdefault(added.content, (tid, added.lstrip, added.rstrip))
        return SpecialTokens(tokens)

    def _encode_plain(self, text: str, at_start: bool) -> list[int]:
        """Ids of ``text`` with no special token matched; ``at_start``: the text begins the
        whole text to encode (a Metaspace pre-tokenizer puts its space before that alone)."""
        if self.encoder is not None:
            return self.encoder(text, parse_special=False)
        first, later = self._plain_backends
        return (first if at_start else later).encode(text, add_special_tokens=False).ids

    @functools.cached_property
    def _plain_backends(self) -> tuple[Tokenizer, Tokenizer]:
        # NOTE: copies with encode_special_tokens set, so that the backend other threads use
        # is never changed
        data = json.loads(self.backend.to_str())
        first = Tokenizer.from_str(json.dumps(data))
        first.encode_special_tokens = True
        if not _prepend_first_to_never(data.get("pre_tokenizer")):
            return first, first
        later = Tokenizer.from_str(json.dumps(data))
        later.encode_special_tokens = True
        return first, later


def _strings(value: Any) -> Iterator[str]:
    """Every string in nested lists and dicts (keys too)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


def _overlaps(match: SpecialMatch, spans: list[tuple[int, int]]) -> bool:
    return any(match.start < end and start < match.end for start, end in spans)


def _prepend_first_to_never(pre: Any) -> bool:
    """Turns a Metaspace pre-tokenizer's ``prepend_scheme: first`` (a space before the text at
    the start of the input only) into ``never``, in a pre-tokenizer's JSON; whether it did."""
    if not isinstance(pre, dict):
        return False
    changed = False
    if pre.get("type") == "Metaspace" and pre.get("prepend_scheme") == "first":
        pre["prepend_scheme"] = "never"
        changed = True
    for inner in pre.get("pretokenizers") or []:
        changed = _prepend_first_to_never(inner) or changed
    return changed


class TextStream:
    """The text of token ids that arrive one at a time, at a cost that does not grow with their
    number: each token decodes only the ids since the last complete text and the piece before
    them (so that what a token's text depends on, a joining space or a stripped lead, is as in
    one decode of them all). ``push`` returns the new text; an incomplete UTF-8 sequence at the
    end is held back until a later token completes it (``held``), and ``text`` is all of it.

    Decoding every id again for each new one cost a streamed request's work O(n^2): a fifth
    of a 16-stream server's interpreter time with 64-token answers (H100, SmolLM2)."""

    def __init__(self, tok: TextTokenizer) -> None:
        self.tok = tok
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # ids[_prefix:_read]: the piece before the new ids, decoded already
        self._read = 0

    @property
    def held(self) -> bool:
        """Whether ids have arrived whose text has not come out yet."""
        return self._read < len(self.ids)

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        if self.tok.is_byte_token(self.ids[-1]):
            # a run of byte tokens decodes as one (SentencePiece's byte fallback): where it
            # ends in bytes that are not UTF-8, every byte of the run becomes U+FFFD, also
            # those that made whole characters before; its text waits for the run's end
            return ""
        before = self.tok.decode(self.ids[self._prefix:self._read])
        now = self.tok.decode(self.ids[self._prefix:])
        if len(now) <= len(before) or now.endswith("\ufffd") or not now.startswith(before):
            return ""  # nothing whole yet: the next ids decode with these
        new = now[len(before):]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += new
        return new


def from_tokenizer_json(path: str, config: dict[str, Any] | None = None) -> TextTokenizer:
    """A tokenizer from a Hugging Face ``tokenizer.json`` (and ``tokenizer_config.json``)."""
    try:
        backend = Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - the library raises its own exception type
        raise ValueError(f"{path}: not a readable tokenizer.json ({e})") from None
    cfg = config or {}

    def tid(tok: Any) -> int | None:
        if isinstance(tok, dict):
            tok = tok.get("content")
        return backend.token_to_id(tok) if isinstance(tok, str) else None

    bos = tid(cfg.get("bos_token"))
    eos = cfg.get("eos_token")
    eos_ids = [tid(e) for e in eos] if isinstance(eos, list) else [tid(eos)]
    # the backend's own post-processor may add BOS; ours adds it explicitly instead
    add_bos = bool(cfg.get("add_bos_token", False))
    return TextTokenizer(backend, bos, [e for e in eos_ids if e is not None], add_bos,
                         cfg.get("chat_template"))


def from_gguf_metadata(meta: dict[str, Any], source: str = "GGUF file") -> TextTokenizer:
    """A tokenizer from the ``tokenizer.ggml.*`` metadata of a GGUF file."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(f"{source}: no tokenizer vocabulary (tokenizer.ggml.tokens)")
    types = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    encoder = None
    if kind == "gpt2":
        backend, is_byte_level = _gguf_byte_level(meta, tokens, source), True
    elif kind == "llama":
        backend, is_byte_level = _gguf_sentencepiece(meta, tokens), False
        encoder = SentencePieceBPE(meta, tokens, types).encode
    else:
        raise ValueError(f"{source}: tokenizer model {kind!r} is not supported (gpt2, llama)")
    alphabet = set(byte_alphabet().values())
    special, user = [], []
    for tok, ty in zip(tokens, types):
        if ty == TOKEN_CONTROL and (not is_byte_level or set(tok) <= alphabet):
            special.append(AddedToken(tok, special=True, normalized=False))
        elif ty == TOKEN_USER_DEFINED:
            user.append(AddedToken(tok, special=False, normalized=False))
    if special:
        backend.add_special_tokens(special)
    if user:
        backend.add_tokens(user)
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eot = meta.get("tokenizer.ggml.eot_token_id")
    eos_ids = [e for e in (eos, eot) if isinstance(e, int) and 0 <= e < len(tokens)]
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama"))
    return TextTokenizer(backend, bos if isinstance(bos, int) else None, eos_ids, add_bos,
                         meta.get("tokenizer.chat_template"), encoder)


def _gguf_byte_level(meta: dict[str, Any], tokens: list[str], source: str) -> Tokenizer:
    pre = pre_tokenizer(meta.get("tokenizer.ggml.pre"), source)
    spell = byte_alphabet()
    alphabet = set(spell.values())
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        key = t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))
        vocab.setdefault(key, i)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    bpe = models.BPE(vocab=vocab, merges=[m for m in merges if len(m) == 2],
                     continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                     ignore_merges=pre.ignore_merges)
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = byte_level_pre_tokenizer(pre)
    if pre.nfc:
        tk.normalizer = normalizers.NFC()
    tk.decoder = decoders.ByteLevel()
    return tk


def _gguf_sentencepiece(meta: dict[str, Any], tokens: list[str]) -> Tokenizer:
    """The vocabulary, special tokens and decoder of a ``llama`` vocabulary. Its BPE model has
    no merges: ids come from :class:`SentencePieceBPE`, which a merge table cannot express (it
    merges by piece score, also through characters that are not pieces themselves)."""
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    unk_tok = tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=unk_tok, fuse_unk=True,
                              byte_fallback=True))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    # what the encoder does to the text, for the backend's own encode (coarse: no merges)
    norm = [normalizers.Prepend("\u2581")] if prefix else []
    tk.normalizer = normalizers.Sequence(norm + [normalizers.Replace(" ", "\u2581")])
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tk.decoder = decoders.Sequence(steps)
    return tk


class SentencePieceBPE:
    """Text -> ids the way the ``sentencepiece`` library encodes with a BPE model (llama's
    ``tokenizer.model``: add_dummy_prefix, no whitespace removal, byte fallback), as llama.cpp's
    SPM tokenizer does too (but for unused pieces, which llama.cpp emits as they are).

    Spaces become U+2581 and every text fragment at the start or after a special or
    user-defined token gets one in front, even one that already starts with a space. The text
    starts as one symbol per character; the adjacent pair whose concatenation is the
    best-scoring piece (leftmost on ties) is merged until no pair forms a piece, characters that
    are not pieces included. Symbols that are unused pieces are split back into what they were
    merged from; other unused pieces and symbols that are not pieces become their UTF-8 byte
    tokens (``<0xAB>``), or one unknown token per run where those are missing.
    """

    def __init__(self, meta: dict[str, Any], tokens: list[str], types: Sequence[int]) -> None:
        raw = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
        self.scores = [float(x) for x in raw]
        self.add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        self.pieces: dict[str, int] = {}  # what merges may form (sentencepiece's pieces_)
        added: dict[str, int] = {}
        first: dict[str, int] = {}
        for i, (t, ty) in enumerate(zip(tokens, types)):
            first.setdefault(t, i)
            if ty in (TOKEN_NORMAL, TOKEN_USER_DEFINED, TOKEN_UNUSED):
                self.pieces.setdefault(t, i)
            if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and t:
                added.setdefault(t, i)
        self.unused = {i for i, ty in enumerate(types) if ty == TOKEN_UNUSED}
        self.byte_ids = [first.get(f"<0x{b:02X}>") for b in range(256)]
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        if not (isinstance(unk, int) and 0 <= unk < len(tokens)):
            unk = next((i for i, ty in enumerate(types) if ty == TOKEN_UNKNOWN), None)
        self.unk_id: int | None = unk
        # Character pairs inside some piece: no merge crosses a boundary between two others,
        # so the text is encoded in independent (and cached) stretches cut there.
        self.bigrams = {p[k:k + 2] for p in self.pieces for k in range(len(p) - 1)}
        self.added = added
        # special tokens are matched in the raw text first, longest first (like transformers);
        # user-defined ones also where special tokens are not (parse_special=False)
        self.added_re = _alternatives(added)
        self.user_re = _alternatives([t for t, i in added.items()
                                      if types[i] == TOKEN_USER_DEFINED])
        self._stretch = functools.lru_cache(maxsize=1 << 16)(self._merge)

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        out: list[int] = []
        pos, after_special = 0, True
        pattern = self.added_re if parse_special else self.user_re
        if pattern is not None:
            for m in pattern.finditer(text):
                if m.start() > pos:
                    self._fragment(text[pos:m.start()], after_special, out)
                out.append(self.added[m.group()])
                pos, after_special = m.end(), True
        if pos < len(text):
            self._fragment(text[pos:], after_special, out)
        return out

    def _fragment(self, text: str, prefix: bool, out: list[int]) -> None:
        s = ("\u2581" if prefix and self.add_prefix else "") + text.replace(" ", "\u2581")
        start, n0 = 0, len(out)
        for k in range(1, len(s) + 1):
            if k == len(s) or s[k - 1:k + 1] not in self.bigrams:
                out.extend(self._stretch(s[start:k]))
                start = k
        if self.unk_id is not None:  # one unknown token per run, like sentencepiece
            unk = self.unk_id
            out[n0:] = [t for j, t in enumerate(out[n0:], n0)
                        if not (t == unk and j > n0 and out[j - 1] == unk)]

    def _merge(self, s: str) -> tuple[int, ...]:
        sym = list(s)
        nxt = list(range(1, len(sym) + 1))
        prv = list(range(-1, len(sym) - 1))
        heap: list[tuple[float, int, int, str]] = []
        rev: dict[str, tuple[str, str]] = {}

        def pair(left: int, right: int) -> None:
            if left < 0 or right >= len(sym):
                return
            piece = sym[left] + sym[right]
            i = self.pieces.get(piece)
            if i is not None:
                heapq.heappush(heap, (-self.scores[i], left, right, piece))
                if i in self.unused:
                    rev[piece] = (sym[left], sym[right])

        for k in range(len(sym) - 1):
            pair(k, k + 1)
        while heap:
            _, left, right, piece = heapq.heappop(heap)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != len(piece):
                continue  # stale: one side was merged since
            sym[left], sym[right] = piece, ""
            nxt[left] = nxt[right]
            if nxt[left] < len(sym):
                prv[nxt[left]] = left
            pair(prv[left], left)
            pair(left, nxt[left])
        out: list[int] = []
        for piece in sym:
            if piece:
                self._emit(piece, rev, out)
        return tuple(out)

    def _emit(self, piece: str, rev: dict[str, tuple[str, str]], out: list[int]) -> None:
        i = self.pieces.get(piece)
        if i is not None and i in self.unused and piece in rev:
            for part in rev[piece]:
                self._emit(part, rev, out)
        elif i is not None and i not in self.unused:
            out.append(i)
        else:  # not a piece, or an unused one that was not merged: unknown
            ids = [self.byte_ids[b] for b in piece.encode("utf-8")]
            if all(b is not None for b in ids):
                out.extend(b for b in ids if b is not None)
            elif self.unk_id is not None:
                out.append(self.unk_id)


def _alternatives(texts: Sequence[str] | dict[str, int]) -> re.Pattern[str] | None:
    """A pattern that matches any of ``texts``, the longest first."""
    if not texts:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)))


def load_hf_tokenizer_config(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
