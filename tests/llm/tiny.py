"""Tiny random Llama and Qwen2 models made with transformers and saved as safetensors
directories, for tests that compare clops with transformers on PyTorch CPU."""

from __future__ import annotations

import json
import os

import numpy as np

VOCAB = 320


def save_tokenizer(path: str) -> None:
    """A word-level tokenizer.json over VOCAB tokens (the tests feed ids directly)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(VOCAB - 3)}
    vocab.update({"<unk>": VOCAB - 3, "<s>": VOCAB - 2, "</s>": VOCAB - 1})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
                   "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}, f)


def make_model(path: str, arch: str = "llama", tied: bool = False, dtype: str = "float32",
               rope_scaling: bool = False, seed: int = 0, ffn: int = 96, hidden: int = 64):
    """Save a random model to ``path``; returns the float32 transformers model to compare with
    (its weights rounded through ``dtype`` like the saved ones). ``hidden``: the residual
    stream's width (llama's heads stay 4 of 16)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-5, tie_word_embeddings=tied)
    if arch == "llama":
        rope: dict = {"rope_type": "default", "rope_theta": 10000.0}
        if rope_scaling:
            rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16}
        cfg = LlamaConfig(**common, head_dim=16, rope_parameters=rope)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = Qwen2Config(**common, rope_parameters={"rope_type": "default",
                                                     "rope_theta": 1000000.0})
        model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():  # larger than the default init: errors would show
            p.normal_(0.0, 0.2)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.to(getattr(torch, dtype)).save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)
    # NOTE: reloaded rather than cast back, so that buffers such as the rotary frequencies
    # are float32 again (a cast round trip would leave them rounded)
    cls = type(model)
    return cls.from_pretrained(path, dtype=torch.float32).eval()


def hf_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def logit_tolerance(model) -> float:
    """The relative logit error a model's prompt path allows: float32 products (2e-5), or rows
    in float16 on tensor cores (``kernels.matmul.tensor_core_rows``; the prompt's attention then
    rounds to float16 as well), whose rounding (2^-11 of each value) grew to 3e-3 of the largest
    logit through the layers of the tiny models on an H100 (transformers on the GPU in float16
    does the same), as do a prompt's experts there (``experts.tensor_rows``); a KV cache of
    float16 values (the default on GPUs) rounds the same way (1.2e-3 to 2e-3 on the tiny
    models, on CPUs)."""
    from clops.kernels import matmul
    from clops.llm import experts

    mats = [w for ly in model.layers for w in (ly.o, ly.down) if w is not None]
    moe = [ly.experts for ly in model.layers if ly.experts is not None]
    if model.kv_half or any(matmul.tensor_core_rows(model.device, model.chunk, w)
                            for w in mats) or \
            (moe and experts.tensor_rows(model.device, moe, model.chunk, True)):
        return 6e-3
    return 2e-5
