"""Fuzz tests, tiny model files: GGUF files written with the gguf package's GGUFWriter (a llama
with quantized, float16, bfloat16 and float32 weights and rotary factors, with a byte-level BPE
or a SentencePiece vocabulary; a qwen2 with Q/K/V biases and tied embeddings) and Hugging Face
safetensors directories (``tests.llm.tiny``), small enough that one process loads and runs
hundreds of mutations of them in a few seconds."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from clops.llm.tokenizer import (
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    byte_alphabet,
)

from ..llm.tiny import VOCAB

DIM, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 2, 4, 2, 16, 96
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}")


def _spm_vocabulary() -> tuple[list[str], list[int], list[float]]:
    """A SentencePiece-style vocabulary of VOCAB pieces (``tokenizer.ggml.model`` "llama"):
    unknown, BOS, EOS, the 256 byte pieces, then word pieces with falling scores."""
    letters = "etaoinshrl"
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256
    pieces = ["\u2581"] + list(letters) + [f"\u2581{c}" for c in letters] + [
        a + b for a in letters for b in letters]
    pieces = pieces[: VOCAB - len(tokens)]
    scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
    return tokens + pieces, types + [TOKEN_NORMAL] * len(pieces), scores


def _vocabulary() -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary of VOCAB tokens: the 256 byte symbols, merged letter pairs,
    then the special tokens; with its token types and merges."""
    tokens = [byte_alphabet()[b] for b in range(256)]
    letters = "etaoinshrl"
    pairs = [(a, b) for a in letters for b in letters][: VOCAB - 256 - len(SPECIALS)]
    tokens += [a + b for a, b in pairs]
    tokens += SPECIALS
    types = [TOKEN_NORMAL] * (VOCAB - len(SPECIALS)) + [TOKEN_CONTROL] * len(SPECIALS)
    return tokens, types, [f"{a} {b}" for a, b in pairs]


@dataclass
class TinyShape:
    """The sizes of a tiny model and the GGML types of its weights: ``layer_types`` gives each
    layer's (q/k/v, o, gate/up, down) types, cycled over the layers."""

    dim: int = DIM
    layers: int = LAYERS
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    head_dim: int = HEAD_DIM
    ffn: int = FFN
    embed_type: str = "Q8_0"
    output_type: str | None = "Q8_0"  # None: tied embeddings
    layer_types: tuple[tuple[str, str, str, str], ...] = (
        ("Q8_0", "Q4_0", "Q4_1", "F16"), ("BF16", "F32", "Q8_0", "Q4_1"))
    rope_freqs: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False  # per-head QK-norm weights (Qwen3's attn_q_norm, attn_k_norm)
    alignment: int | None = None
    context: int = 256


# the types written as random blocks: (values and bytes a block, {byte offset of a half scale:
# its value}); Q4_K: d, dmin, 12 bytes of 6-bit scales and mins, 128 of 4-bit values
RANDOM_BLOCKS: dict[str, tuple[int, int, dict[int, float]]] = {
    "Q4_K": (256, 144, {0: 4e-4, 2: 3e-3}), "Q5_K": (256, 176, {0: 2e-4, 2: 3e-3}),
    "Q2_K": (256, 84, {80: 6e-3, 82: 1e-2}), "Q3_K": (256, 110, {108: 2e-3}),
    "IQ4_XS": (256, 136, {0: 5e-5}), "IQ4_NL": (32, 18, {0: 2e-3}),
    "Q6_K": (256, 210, {208: 5e-5}), "IQ2_XS": (256, 74, {0: 1e-3}),
}

LLAMA = TinyShape()
QWEN2 = TinyShape(embed_type="F32", output_type=None, rope_freqs=False, qkv_bias=True,
                  alignment=64, layer_types=(("F32", "F16", "F32", "F16"),
                                             ("F16", "F32", "F16", "F32")))


def write_gguf(path: str, arch: str = "llama", seed: int = 0,
               extra: dict[str, np.ndarray] | None = None, shape: TinyShape | None = None,
               tokenizer: str = "gpt2") -> str:
    """A random ``arch`` model as a GGUF file at ``path``; returns ``path``.

    ``shape`` defaults to LLAMA for llama (2 layers, untied output, rotary factors, weights in
    Q8_0, Q4_0, Q4_1, F16, BF16 and F32) and QWEN2 for qwen2 (tied embeddings, Q/K/V biases,
    F32 and F16 weights, an alignment of 64). ``extra``: more tensors (name -> float32 values).
    ``tokenizer``: "gpt2" (byte-level BPE with merges) or "llama" (SentencePiece pieces with
    scores)."""
    import gguf

    sh = shape or (LLAMA if arch == "llama" else QWEN2)
    q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(sh.layers)
    w.add_context_length(sh.context)
    w.add_embedding_length(sh.dim)
    w.add_feed_forward_length(sh.ffn)
    w.add_head_count(sh.heads)
    w.add_head_count_kv(sh.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0 if arch == "llama" else 1e6)
    w.add_rope_dimension_count(sh.head_dim)
    w.add_vocab_size(VOCAB)
    w.add_file_type(7)
    if sh.alignment:
        w.add_custom_alignment(sh.alignment)
    w.add_tokenizer_model(tokenizer)
    if tokenizer == "llama":
        tokens, types, scores = _spm_vocabulary()
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_scores(scores)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
    else:
        tokens, types, merges = _vocabulary()
        w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(VOCAB - 2)
        w.add_eos_token_id(VOCAB - 1)
        w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_array("general.tags", ["tiny", "random"])
    w.add_float64("general.fuzz_seed", float(seed))

    def add(name: str, shape: tuple[int, ...], kind: str, scale: float = 0.2) -> None:
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        if name.endswith("norm.weight"):
            x = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        if kind == "F32":
            w.add_tensor(name, x)
        elif kind == "F16":
            w.add_tensor(name, x.astype(np.float16))
        elif kind == "BF16":
            bits = (x.view(np.uint32) >> 16).astype(np.uint16)
            w.add_tensor(name, bits, raw_shape=shape, raw_dtype=q.BF16)
        elif kind in RANDOM_BLOCKS:  # (gguf cannot quantize to these) random blocks, their
            # half scales set so that the values are about x's scale
            bs, bb, halves = RANDOM_BLOCKS[kind]
            raw = rng.integers(0, 256, (shape[0], shape[1] // bs, bb), dtype=np.uint8)
            for at, value in halves.items():
                raw[..., at:at + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
            data = raw.reshape(shape[0], -1)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=getattr(q, kind))
        else:
            qt = getattr(q, kind)
            data = gguf.quants.quantize(x, qt)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qt)

    q_rows, kv_rows = sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim
    add("token_embd.weight", (VOCAB, sh.dim), sh.embed_type)
    add("output_norm.weight", (sh.dim,), "F32")
    if sh.output_type:
        add("output.weight", (VOCAB, sh.dim), sh.output_type)
    if sh.rope_freqs:
        w.add_tensor("rope_freqs.weight",
                     (1.0 + 0.5 * rng.random(sh.head_dim // 2)).astype(np.float32))
    for i in range(sh.layers):
        qkv, o, gate_up, down = sh.layer_types[i % len(sh.layer_types)]
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (sh.dim,), "F32")
        add(p + "attn_q.weight", (q_rows, sh.dim), qkv)
        add(p + "attn_k.weight", (kv_rows, sh.dim), qkv)
        add(p + "attn_v.weight", (kv_rows, sh.dim), qkv)
        if sh.qkv_bias:
            add(p + "attn_q.bias", (q_rows,), "F32")
            add(p + "attn_k.bias", (kv_rows,), "F32")
            add(p + "attn_v.bias", (kv_rows,), "F32")
        if sh.qk_norm:  # (weights far from 1, so that a norm without them shows)
            for n in "qk":
                w.add_tensor(p + f"attn_{n}_norm.weight",
                             (1.0 + 0.3 * rng.standard_normal(sh.head_dim)).astype(np.float32))
        add(p + "attn_output.weight", (sh.dim, q_rows), o)
        add(p + "ffn_norm.weight", (sh.dim,), "F32")
        add(p + "ffn_gate.weight", (sh.ffn, sh.dim), gate_up)
        add(p + "ffn_up.weight", (sh.ffn, sh.dim), gate_up)
        add(p + "ffn_down.weight", (sh.dim, sh.ffn), down)
    for name, values in (extra or {}).items():
        w.add_tensor(name, values.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# The safetensors directories: tests.llm.tiny.make_model's arguments for each base.
SAFETENSORS_BASES: dict[str, dict[str, object]] = {
    "hf-llama": dict(arch="llama"),
    "hf-qwen2-bf16": dict(arch="qwen2", dtype="bfloat16", tied=True),
}


def write_safetensors_dir(path: str, **kw: object) -> str:
    """A tiny random Hugging Face model directory (``tests.llm.tiny.make_model``) at ``path``."""
    from ..llm.tiny import make_model

    os.makedirs(path, exist_ok=True)
    make_model(path, **kw)  # type: ignore[arg-type]
    return path


def build_bases(root: str, safetensors: bool = True) -> dict[str, str]:
    """Every base model under ``root``: name -> path (a file or a directory). The safetensors
    ones need torch and transformers; ``safetensors=False`` leaves them out."""
    bases = {"gguf-llama": write_gguf(os.path.join(root, "llama.gguf"), "llama", seed=1),
             "gguf-qwen2": write_gguf(os.path.join(root, "qwen2.gguf"), "qwen2", seed=2),
             "gguf-llama-spm": write_gguf(os.path.join(root, "spm.gguf"), "llama", seed=3,
                                          tokenizer="llama")}
    if safetensors:
        for name, kw in SAFETENSORS_BASES.items():
            bases[name] = write_safetensors_dir(os.path.join(root, name), **kw)
    return bases
