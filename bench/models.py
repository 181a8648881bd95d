"""Benchmark helper: the GGUF files of the LLM decode table, written with random weights of the
real layouts, so that clops and llama.cpp read the same bytes on a machine the real files cannot
reach.

    python bench/models.py prepare [SMOLLM2.gguf] DIR   # here: the small files to carry (2 MB)
    python bench/models.py write DIR OUT [--only NAME,...]   # there: OUT/NAME.gguf

Models (NAME):
  smollm2-q4_1   SmolLM2-135M-Instruct's own file (Q4_1 layers, Q8_0 embedding), random weights
  llama1b-f16    a Llama-3.2-1B body (hidden 2048, 16 layers, 32/8 heads of 64, FFN 8192, tied
  llama1b-q8_0   output) with SmolLM2's tokenizer and vocabulary (49152), in F16, Q8_0, Q4_0
  llama1b-q4_0   and Q4_K (Q4_K layers with a Q6_K embedding, as llama.cpp's Q4_K_M keeps its
  llama1b-q4_k   output); norms are float32
  llama8b-f16    a Llama-3.1-8B body (hidden 4096, 32 layers, 32/8 heads of 128, FFN 14336),
  llama8b-q8_0   with SmolLM2's tokenizer and a tied output, as the 1B bodies, in F16 (the
  llama8b-q4_0   file bench_mixes.py makes llama-quantize's mixes from), Q8_0 and Q4_0
  llama70b-q8_0  a Llama-3.1-70B body (hidden 8192, 80 layers, 64/8 heads of 128, FFN 28672;
                 73 GB), every layer the same random weights (the same bytes move per token;
                 written at the disk's speed)
  llama70b20-q8_0  the 70B body's first 20 layers (18 GB): its per-GPU shapes on one GPU,
                 for profiling (bench/profile_step.py)
  qwen3moe-a3b-q4_0  a Qwen3-30B-A3B body (hidden 2048, 48 layers, 32/4 heads of 128 with QK-norm,
                 128 experts of FFN 768, 8 a token; 17 GB) with SmolLM2's tokenizer, Q4_0
                 layers and experts, a float32 router (the file ``llama-quantize
                 --allow-requantize`` makes its Q4_K_M from: the mix depends on the tensors'
                 names and shapes, not on their values)
  qwen3moe-a3b-q4_k_m  the same body in the types llama-quantize's Q4_K_M gives it, written
                 directly (no llama.cpp build needed: a quick body for clops' own runs): Q4_K
                 but a Q6_K embedding (the tied output) and Q6_K attn_v and ffn_down_exps in
                 the layers llama.cpp gives more bits (the first and last eighth, and every third
                 between: 24 of 48)
  gptoss20b-mxfp4  a gpt-oss-20b body (arch gpt-oss: hidden 2880, 24 layers, 64/8 heads of 64
                 with biases and attention sinks, a window of 128 on even layers, YaRN x32 of
                 4096, 32 experts of FFN 2880 with biases, 4 a token; 12 GB) with SmolLM2's
                 tokenizer, MXFP4 experts, Q8_0 attention, embedding and (untied) output,
                 float32 router, norms, sinks and biases, as the published MXFP4 file
  qwen3-0.6b-q8_0  a Qwen3-0.6B body (arch qwen3: hidden 1024, 28 layers, 16/8 heads of 128, so
                 queries of 2048, QK-norm, FFN 3072, rope base 1e6, context 40960; 0.5 GB)
  gemma3-1b-q8_0   a Gemma-3-1B body (arch gemma3: hidden 1152, 26 layers, 4/1 heads of 256,
                 QK-norm, sandwich norms, GELU-tanh FFN 6912, a window of 512 on 5 layers of
                 every 6 with rope base 10000 there and 1e6 on the others, context 32768;
                 0.8 GB; the engine scales the embedding by sqrt(hidden))
                 Both with SmolLM2's tokenizer and a tied output, Q8_0 layers and embedding,
                 float32 norms

``prepare`` keeps SmolLM2's header (``standin_gguf.py skeleton``) and a GGUF holding only its
tokenizer; ``write`` builds every model from them. The weights are random numbers of about the
scale of trained ones (every value finite), so that no engine meets a NaN.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standin_gguf  # noqa: E402

BODY_1B = dict(dim=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192,
               rope_base=500000.0, eps=1e-5, context=131072)
BODY_8B = dict(dim=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336,
               rope_base=500000.0, eps=1e-5, context=131072)
BODY_70B = dict(dim=8192, layers=80, heads=64, kv_heads=8, head_dim=128, ffn=28672,
                rope_base=500000.0, eps=1e-5, context=131072)
BODY_A3B = dict(arch="qwen3moe", dim=2048, layers=48, heads=32, kv_heads=4, head_dim=128,
                ffn=6144, rope_base=1e6, eps=1e-6, context=40960, experts=128, used=8,
                expert_ffn=768, qk_norm=True)
BODY_GPTOSS20B = dict(arch="gpt-oss", dim=2880, layers=24, heads=64, kv_heads=8, head_dim=64,
                      ffn=2880, rope_base=150000.0, eps=1e-5, context=131072, experts=32, used=4,
                      expert_ffn=2880, sliding_window=128, yarn=(32.0, 4096, 32.0, 1.0),
                      biases=True, sinks=True, untied=True)
# dense bodies of other families (``arch``: the GGUF architecture; ``qk_norm``: a norm weight per
# head size on queries and keys; ``sandwich``: norms after attention and after the FFN too;
# ``sliding_window``: llama.cpp's gemma3 loader derives its pattern, 5 sliding layers of 6,
# whose rope base is ``rope_base_swa``)
BODY_QWEN3_06B = dict(arch="qwen3", dim=1024, layers=28, heads=16, kv_heads=8, head_dim=128,
                      ffn=3072, rope_base=1e6, eps=1e-6, context=40960, qk_norm=True)
BODY_GEMMA3_1B = dict(arch="gemma3", dim=1152, layers=26, heads=4, kv_heads=1, head_dim=256,
                      ffn=6912, rope_base=1e6, eps=1e-6, context=32768, qk_norm=True,
                      sandwich=True, sliding_window=512, rope_base_swa=10000.0)
MODELS = {"smollm2-q4_1": None, "llama1b-f16": ("F16", "F16"), "llama1b-q8_0": ("Q8_0", "Q8_0"),
          "llama1b-q4_0": ("Q4_0", "Q4_0"), "llama1b-q4_k": ("Q4_K", "Q6_K"),
          "llama8b-f16": ("F16", "F16"), "llama8b-q8_0": ("Q8_0", "Q8_0"),
          "llama8b-q4_0": ("Q4_0", "Q4_0"),
          "llama70b-q8_0": ("Q8_0", "Q8_0"), "llama70b20-q8_0": ("Q8_0", "Q8_0"),
          "qwen3moe-a3b-q4_0": ("Q4_0", "Q4_0"), "qwen3moe-a3b-q4_k_m": ("Q4_K", "Q6_K"),
          "gptoss20b-mxfp4": ("Q8_0", "Q8_0", "MXFP4"),
          "qwen3-0.6b-q8_0": ("Q8_0", "Q8_0"), "gemma3-1b-q8_0": ("Q8_0", "Q8_0")}
# a model's body is its name less the last "-" part
BODIES = {"llama1b": BODY_1B, "llama8b": BODY_8B, "llama70b": BODY_70B,
          "llama70b20": {**BODY_70B, "layers": 20}, "qwen3moe-a3b": BODY_A3B,
          "gptoss20b": BODY_GPTOSS20B,
          "qwen3-0.6b": BODY_QWEN3_06B, "gemma3-1b": BODY_GEMMA3_1B}
# (bytes, values) per block of each weight type this writer makes
_BLOCK = {"F16": (2, 1), "Q8_0": (34, 32), "Q4_0": (18, 32), "Q4_K": (144, 256),
          "Q6_K": (210, 256), "MXFP4": (17, 32)}


def prepare(src: str, out: str) -> None:
    """``out``/smollm2.skel.npz (SmolLM2's header) and ``out``/tokenizer.gguf (its tokenizer)."""
    from gguf import GGUFReader, GGUFWriter

    os.makedirs(out, exist_ok=True)
    standin_gguf.skeleton(src, os.path.join(out, "smollm2.skel.npz"))
    r = GGUFReader(src)
    w = GGUFWriter(os.path.join(out, "tokenizer.gguf"), "llama")
    for name, field in r.fields.items():
        if name.startswith("tokenizer.") or name == "general.quantization_version":
            _copy_field(w, name, field)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _copy_field(w, name: str, field) -> None:
    from gguf import GGUFValueType

    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        sub = field.types[1]
        if sub == GGUFValueType.STRING:
            vals = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        else:
            vals = [field.parts[i].tolist()[0] for i in field.data]
        w.add_key_value(name, vals, kind, sub_type=sub)
    elif kind == GGUFValueType.STRING:
        w.add_key_value(name, bytes(field.parts[field.data[0]]).decode("utf-8"), kind)
    else:
        w.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)


def random_rows(kind: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` rows of ``k`` random weights in ``kind``'s blocks: uint8 [n, bytes per row], or
    float16 [n, k] for F16. Scales are chosen so that weights are about 0.02-0.1 in size."""
    if kind == "F16":
        return (0.03 * rng.standard_normal((n, k), dtype=np.float32)).astype(np.float16)
    bsize, bvals = _BLOCK[kind]
    if k % bvals:
        raise ValueError(f"{kind} needs rows of a multiple of {bvals} values, not {k}")
    raw = rng.integers(0, 256, (n, k // bvals, bsize), dtype=np.uint8)

    def half(at: int, value: float) -> None:
        raw[:, :, at:at + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)

    if kind == "Q8_0":
        half(0, 0.0008)
    elif kind == "Q4_0":
        half(0, 0.012)
    elif kind == "Q4_K":  # d, dmin, 12 bytes of 6-bit scales and mins, 128 of 4-bit values
        half(0, 1e-4)
        half(2, 1e-3)
    elif kind == "Q6_K":  # 128 + 64 bytes of 6-bit values, 16 int8 scales, d
        half(208, 2e-5)
    elif kind == "MXFP4":  # a power-of-two scale (E8M0, 2^(e-127) halved), 32 4-bit values
        raw[:, :, 0] = 121  # FP4 values up to 6: weights up to about 0.05
    return raw.reshape(n, -1)


def more_bits(i: int, layers: int) -> bool:
    """Whether llama-quantize's K-quant mixes give layer i of ``layers`` more bits (its
    attn_v and ffn_down in Q6_K under Q4_K_M): the first and last eighth of the layers, and
    every third layer between."""
    return i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2


def write_body(tok_path: str, dst: str, layer_kind: str, embed_kind: str, seed: int = 0,
               body: str = "llama1b", expert_kind: str | None = None,
               more: str | None = None) -> None:
    """The body ``body`` (one of ``BODIES``) with the tokenizer of ``tok_path`` at ``dst``:
    matrices in ``layer_kind``, the embedding (and an untied output) in ``embed_kind``, the
    experts of a mixture in ``expert_kind`` (default ``layer_kind``); ``more``: attn_v and
    ffn_down (experts' too) in that type in the layers ``more_bits`` names. Metadata keys and
    tensor names are those llama.cpp's loader reads for the body's architecture."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, RopeScalingType

    b = BODIES[body]
    arch = b.get("arch", "llama")
    expert_kind = expert_kind or layer_kind
    # the 70B body's layers share one layer's random values (generating 73 GB of them would
    # take longer than writing them)
    reuse = body.startswith("llama70b")
    made: dict[str, np.ndarray] = {}
    tok = GGUFReader(tok_path)
    vocab = len(tok.fields["tokenizer.ggml.tokens"].data)
    w = GGUFWriter(dst, arch)
    w.add_name(f"{body}-body {layer_kind}")
    if b.get("experts"):
        w.add_expert_count(b["experts"])
        w.add_expert_used_count(b["used"])
        w.add_expert_feed_forward_length(b["expert_ffn"])
    if arch != "llama":  # (a head need not be hidden / heads)
        w.add_key_length(b["head_dim"])
        w.add_value_length(b["head_dim"])
    if b.get("sliding_window"):
        w.add_sliding_window(b["sliding_window"])
        if "rope_base_swa" in b:
            w.add_rope_freq_base_swa(b["rope_base_swa"])
    if b.get("yarn"):
        factor, orig, beta_fast, beta_slow = b["yarn"]
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_rope_scaling_yarn_beta_fast(beta_fast)
        w.add_rope_scaling_yarn_beta_slow(beta_slow)
    w.add_block_count(b["layers"])
    w.add_context_length(b["context"])
    w.add_embedding_length(b["dim"])
    w.add_feed_forward_length(b["ffn"])
    w.add_head_count(b["heads"])
    w.add_head_count_kv(b["kv_heads"])
    w.add_rope_dimension_count(b["head_dim"])
    w.add_rope_freq_base(b["rope_base"])
    w.add_layer_norm_rms_eps(b["eps"])
    w.add_vocab_size(vocab)
    for name, field in tok.fields.items():
        if name.startswith("tokenizer.") or name == "general.quantization_version":
            _copy_field(w, name, field)
    rng = np.random.default_rng(seed)

    def mat(name: str, kind: str, n: int, k: int, experts: int = 0) -> None:
        role = name.split(".", 2)[-1] if reuse and name.startswith("blk.") else None
        if role is not None and role in made:
            rows = made[role]
        else:
            rows = random_rows(kind, n * max(experts, 1), k, rng)
            if role is not None:
                made[role] = rows
        if experts:
            rows = rows.reshape(experts, n, rows.shape[-1])
        if kind == "F16":
            w.add_tensor(name, rows)
        else:
            w.add_tensor(name, rows, raw_shape=rows.shape,
                         raw_dtype=getattr(GGMLQuantizationType, kind))

    def norm(name: str, n: int = b["dim"]) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    def small(name: str, *shape: int) -> None:  # biases, sinks and the router: float32
        w.add_tensor(name, (0.05 * rng.standard_normal(shape)).astype(np.float32))

    D, H, KV, F = b["dim"], b["heads"], b["kv_heads"], b["ffn"]
    hd = b["head_dim"]
    mat("token_embd.weight", embed_kind, vocab, D)
    norm("output_norm.weight")
    if b.get("untied"):
        mat("output.weight", embed_kind, vocab, D)
    for i in range(b["layers"]):
        p = f"blk.{i}."
        wide = more if more and more_bits(i, b["layers"]) else None
        norm(p + "attn_norm.weight")
        mat(p + "attn_q.weight", layer_kind, H * hd, D)
        mat(p + "attn_k.weight", layer_kind, KV * hd, D)
        mat(p + "attn_v.weight", wide or layer_kind, KV * hd, D)
        mat(p + "attn_output.weight", layer_kind, D, H * hd)
        if b.get("biases"):
            for role, n in (("attn_q", H * hd), ("attn_k", KV * hd), ("attn_v", KV * hd),
                            ("attn_output", D)):
                small(p + role + ".bias", n)
        if b.get("sinks"):
            small(p + "attn_sinks.weight", H)
        if b.get("qk_norm"):
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
        if b.get("sandwich"):
            norm(p + "post_attention_norm.weight")
        # gpt-oss names its pre-FFN norm post_attention_norm
        norm(p + ("post_attention_norm.weight" if arch == "gpt-oss" else "ffn_norm.weight"))
        if b.get("experts"):
            E, FE = b["experts"], b["expert_ffn"]
            small(p + "ffn_gate_inp.weight", E, D)
            mat(p + "ffn_gate_exps.weight", expert_kind, FE, D, experts=E)
            mat(p + "ffn_up_exps.weight", expert_kind, FE, D, experts=E)
            mat(p + "ffn_down_exps.weight", wide or expert_kind, D, FE, experts=E)
            if b.get("biases"):
                small(p + "ffn_gate_inp.bias", E)
                small(p + "ffn_gate_exps.bias", E, FE)
                small(p + "ffn_up_exps.bias", E, FE)
                small(p + "ffn_down_exps.bias", E, D)
            continue
        mat(p + "ffn_gate.weight", layer_kind, F, D)
        mat(p + "ffn_up.weight", layer_kind, F, D)
        mat(p + "ffn_down.weight", wide or layer_kind, D, F)
        if b.get("sandwich"):
            norm(p + "post_ffw_norm.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write(prep: str, out: str, only: list[str] | None = None) -> list[str]:
    """Write the models named in ``only`` (all by default) into ``out``; returns their paths."""
    os.makedirs(out, exist_ok=True)
    names = only or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}: choose from {list(MODELS)}")
    paths = []
    for name in names:
        dst = os.path.join(out, name + ".gguf")
        kinds = MODELS[name]
        if kinds is None:
            standin_gguf.fill(os.path.join(prep, "smollm2.skel.npz"), dst)
        else:
            write_body(os.path.join(prep, "tokenizer.gguf"), dst, kinds[0], kinds[1],
                       body=name.rsplit("-", 1)[0],
                       expert_kind=kinds[2] if len(kinds) > 2 else None,
                       more="Q6_K" if name.endswith("-q4_k_m") else None)
        print(f"{dst} ({os.path.getsize(dst) / 1e6:.0f} MB)", flush=True)
        paths.append(dst)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("args", nargs="+", help="[SMOLLM2.gguf] DIR")
    p = sub.add_parser("write")
    p.add_argument("prep")
    p.add_argument("out")
    p.add_argument("--only", default=None)
    a = ap.parse_args()
    if a.mode == "prepare":
        if len(a.args) == 1:
            sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
            import clops.llm

            src, out = clops.llm.default_model_path(), a.args[0]
        else:
            src, out = a.args[0], a.args[1]
        prepare(src, out)
    else:
        write(a.prep, a.out, a.only.split(",") if a.only else None)


if __name__ == "__main__":
    main()
