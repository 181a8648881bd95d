"""Reference models for the LLM tests: a transformers ``LlamaForCausalLM`` holding the
dequantized weights of a GGUF file (Q/K rows put back in Hugging Face's order)."""

from __future__ import annotations

import numpy as np


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo the row permutation llama GGUF converters apply to Q/K weights (adjacent-pair
    rotary order back to split halves)."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def hf_model_from_gguf(path: str):
    """A float32 transformers Llama model with the GGUF file's dequantized weights."""
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import LlamaConfig, LlamaForCausalLM

    r = GGUFReader(path)

    def meta(key):
        return r.fields[key].contents()

    a = "llama."
    n_head, n_kv = int(meta(a + "attention.head_count")), int(meta(a + "attention.head_count_kv"))
    cfg = LlamaConfig(
        vocab_size=int(meta(a + "vocab_size")), hidden_size=int(meta(a + "embedding_length")),
        intermediate_size=int(meta(a + "feed_forward_length")),
        num_hidden_layers=int(meta(a + "block_count")), num_attention_heads=n_head,
        num_key_value_heads=n_kv, rms_norm_eps=float(meta(a + "attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta(a + "rope.freq_base")), max_position_embeddings=2048,
        tie_word_embeddings="output.weight" not in {t.name for t in r.tensors})
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": float(meta(a + "rope.freq_base"))}
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight":
             "model.norm.weight", "output.weight": "lm_head.weight"}
    per = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
           "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
           "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    sd = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(s) for s in reversed(t.shape.tolist())])
        if t.name in names:
            sd[names[t.name]] = w
            continue
        _, i, kind, _ = t.name.split(".")
        if kind == "attn_q":
            w = unpermute_qk(w, n_head)
        elif kind == "attn_k":
            w = unpermute_qk(w, n_kv)
        sd[f"model.layers.{i}.{per[kind]}.weight"] = w
    model = LlamaForCausalLM(cfg).eval()
    missing = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                                     for k, v in sd.items()}, strict=False)
    assert not [k for k in missing.missing_keys if "lm_head" not in k], missing
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model
