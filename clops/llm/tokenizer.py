"""llm, tokenizer: a ``tokenizers.Tokenizer`` from a ``tokenizer.json`` or rebuilt from GGUF
metadata (byte-level BPE for ``gpt2`` vocabularies, SentencePiece-style BPE with byte fallback
for ``llama`` ones), plus the chat template of the model."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

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


class TextTokenizer:
    """Text <-> token ids, with the special tokens and chat template of a model.

    >>> tok = model.tokenizer
    >>> tok.decode(tok.encode("Hello world"))
    'Hello world'
    """

    def __init__(self, backend: Tokenizer, bos_id: int | None, eos_ids: Sequence[int],
                 add_bos: bool, chat_template: str | None) -> None:
        self.backend = backend
        self.bos_id = bos_id
        self.eos_ids = [i for i in eos_ids if i is not None]
        self.add_bos = add_bos
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; BOS is prepended only when asked and the model wants it."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """Render ``messages`` with the model's Jinja chat template (sandboxed)."""
        from .chat import render

        if not self.chat_template:
            raise ValueError("this model has no chat template; run without chat mode")
        bos = self.token_text(self.bos_id) if self.bos_id is not None else ""
        eos = self.token_text(self.eos_ids[0]) if self.eos_ids else ""
        return render(self.chat_template, messages, add_generation_prompt, bos or "", eos or "")


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


def _spm_merges(tokens: list[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a piece into two pieces
    that are themselves in the vocabulary, best merged-piece score first."""
    index = {t: i for i, t in enumerate(tokens)}
    found: list[tuple[float, int, int, int, str, str]] = []
    for piece, score in zip(tokens, scores):
        local = []
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in index and right in index:
                local.append((index[left], index[right], left, right))
        local.sort()
        found.extend((-float(score), len(left), len(right), n, left, right)
                     for n, (_, _, left, right) in enumerate(local))
    # stable on ties, like the order the pieces were listed in
    found.sort(key=lambda f: (f[0], f[1], f[2]))
    return [(f[4], f[5]) for f in found]


def from_gguf_metadata(meta: dict[str, Any], source: str = "GGUF file") -> TextTokenizer:
    """A tokenizer from the ``tokenizer.ggml.*`` metadata of a GGUF file."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(f"{source}: no tokenizer vocabulary (tokenizer.ggml.tokens)")
    types = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    if kind == "gpt2":
        backend, is_byte_level = _gguf_byte_level(meta, tokens), True
    elif kind == "llama":
        backend, is_byte_level = _gguf_sentencepiece(meta, tokens), False
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
                         meta.get("tokenizer.chat_template"))


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
    scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    merges = meta.get("tokenizer.ggml.merges")
    if merges:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        pairs = _spm_merges(tokens, scores)
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    unk_tok = tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None
    bpe = models.BPE(vocab=vocab, merges=pairs, unk_token=unk_tok, fuse_unk=True,
                     byte_fallback=True)
    tk = Tokenizer(bpe)
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tk.decoder = decoders.Sequence(steps)
    return tk


def load_hf_tokenizer_config(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
