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

# How text is split before BPE, by GGUF ``tokenizer.ggml.pre``. Vocabularies not listed split
# with GPT-2's own pattern (byte-level pre-tokenizer with its regex).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "megrez": _QWEN2_SPLIT,
}


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
        backend, is_byte_level = _gguf_byte_level(meta, tokens), True
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


def _gguf_byte_level(meta: dict[str, Any], tokens: list[str]) -> Tokenizer:
    spell = byte_alphabet()
    alphabet = set(spell.values())
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        key = t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))
        vocab.setdefault(key, i)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    bpe = models.BPE(vocab=vocab, merges=[m for m in merges if len(m) == 2],
                     continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    tk = Tokenizer(bpe)
    split = SPLITS.get(str(meta.get("tokenizer.ggml.pre", "")))
    if split is None:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
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
