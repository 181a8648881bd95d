"""llm, architectures: each decoder family clops runs, as one small declarative description.

A description names the tensors a layer reads (by canonical key: ``q``, ``k_norm``,
``post_ffn_norm`` ...), how the family's files spell them (GGUF as llama.cpp's converter writes
them, safetensors as transformers saves them), the family's config keys, and its choices: norm
placement (pre, post, sandwich: which of the four norms a layer has), QK-norm, activation,
rotary layout, sliding-window layers, soft-capping and scale multipliers, attention sinks, and a
mixture of experts in place of the FFN (its router's normalisation, biases, the GLU's clamp).
``config.py`` reads a file's settings through it and ``step.py`` builds launches from the
result; adding a family is one entry in ``ARCHS`` (and its test), not a change to the step
builder."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

# Canonical per-layer keys and their names in GGUF files (llama.cpp's converter) and in
# transformers' safetensors checkpoints, after the layer's prefix ("blk.3.", "model.layers.3.").
GGUF_NAMES: dict[str, str] = {
    "attn_norm": "attn_norm.weight", "q": "attn_q.weight", "k": "attn_k.weight",
    "v": "attn_v.weight", "qkv": "attn_qkv.weight", "o": "attn_output.weight",
    "q_bias": "attn_q.bias", "k_bias": "attn_k.bias", "v_bias": "attn_v.bias",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight", "ffn_norm": "ffn_norm.weight",
    "gate": "ffn_gate.weight", "up": "ffn_up.weight", "gate_up": "ffn_up.weight",
    "down": "ffn_down.weight", "post_ffn_norm": "post_ffw_norm.weight",
    "router": "ffn_gate_inp.weight", "gate_exps": "ffn_gate_exps.weight",
    "up_exps": "ffn_up_exps.weight", "down_exps": "ffn_down_exps.weight",
    "o_bias": "attn_output.bias", "sinks": "attn_sinks.weight", "router_bias": "ffn_gate_inp.bias",
    "gate_exps_bias": "ffn_gate_exps.bias", "up_exps_bias": "ffn_up_exps.bias",
    "down_exps_bias": "ffn_down_exps.bias",
}
HF_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight",
    "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
    "qkv": "self_attn.qkv_proj.weight", "o": "self_attn.o_proj.weight",
    "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias", "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight", "post_attn_norm": "post_attention_layernorm.weight",
    "ffn_norm": "post_attention_layernorm.weight", "gate": "mlp.gate_proj.weight",
    "up": "mlp.up_proj.weight", "gate_up": "mlp.gate_up_proj.weight",
    "down": "mlp.down_proj.weight", "post_ffn_norm": "post_feedforward_layernorm.weight",
    # experts: one tensor per expert, "{e}" its index
    "router": "mlp.gate.weight", "gate_exps": "mlp.experts.{e}.gate_proj.weight",
    "up_exps": "mlp.experts.{e}.up_proj.weight", "down_exps": "mlp.experts.{e}.down_proj.weight",
    "o_bias": "self_attn.o_proj.bias", "sinks": "self_attn.sinks",
    "router_bias": "mlp.gate.bias", "gate_exps_bias": "mlp.experts.{e}.gate_proj.bias",
    "up_exps_bias": "mlp.experts.{e}.up_proj.bias",
    "down_exps_bias": "mlp.experts.{e}.down_proj.bias",
}
BIASES = ("q_bias", "k_bias", "v_bias")
# a mixture of experts' FFN (the router and the experts' stacked gate, up and down weights), in
# place of the dense one
DENSE_FFN = ("gate", "up", "gate_up", "down")
EXPERTS = ("router", "gate_exps", "up_exps", "down_exps")
EXPERT_BIASES = ("router_bias", "gate_exps_bias", "up_exps_bias", "down_exps_bias")
NORMS = ("attn_norm", "q_norm", "k_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm")

# The layer of a pre-norm decoder with separate projections (Llama)
PRE_NORM = ("attn_norm", "q", "k", "v", "o", "ffn_norm", "gate", "up", "down")
SANDWICH = PRE_NORM + ("post_attn_norm", "post_ffn_norm")


@dataclass(frozen=True)
class Setting:
    """A ``ModelConfig`` field the family reads from its files: the config.json key, the GGUF
    key after the ``<arch>.`` prefix, and a function of the config.json value (None: as is)."""

    hf: str | None
    gguf: str | None
    convert: Callable[[float], float] | None = None


@dataclass(frozen=True)
class Arch:
    """One decoder family. ``layer``: the canonical keys every layer reads (Q/K/V biases are
    optional where ``biases`` allows them); names differing from GGUF_NAMES/HF_NAMES are given
    in ``gguf_names``/``hf_names``."""

    name: str                        # GGUF general.architecture
    hf_types: tuple[str, ...]        # config.json model_type
    layer: tuple[str, ...] = PRE_NORM
    gguf_names: dict[str, str] = field(default_factory=dict)
    hf_names: dict[str, str] = field(default_factory=dict)
    biases: bool = False             # Q/K/V biases may be present (qwen2 always has them)
    # GGUF Q/K rows in split-halves rotary order (True); False: llama.cpp's converter permuted
    # them to adjacent pairs (llama-style families). Safetensors are always split halves.
    gguf_neox: bool = True
    qk_norm: str | None = None       # None, "head" (one weight per head_dim), "full" (q and k)
    act: str = "silu"                # GLU activation: "silu" or "gelu_tanh"
    hf_norm_offset: float = 0.0      # safetensors norm weights are applied as offset + w
    embed_scale_sqrt_dim: bool = False
    settings: dict[str, Setting] = field(default_factory=dict)
    # the sliding-window layers where a file names the window but not the layers: 1 every
    # layer, n > 1 layer i unless i % n == n - 1 (llama.cpp's "swa pattern")
    swa_pattern: int = 1
    swa_theta: float | None = None   # rope base of sliding layers where the file has none
    nope_interval: int = 0           # every n-th layer (i % n == n - 1) has no rotary
    partial_rotary: bool = False     # rope.dimension_count may be less than the head size
    # mixtures of experts: None, the family has none; else whether the chosen experts' weights
    # are renormalised to sum to 1 where the file does not say (llama.cpp's choice per family)
    experts_norm: bool | None = None
    experts_always: bool = False     # every file of the family has experts
    experts_biases: bool = False     # the router and the experts have biases (gpt-oss)
    # safetensors hold each layer's experts as two tensors, [experts, dim, 2 ffn] with gate and
    # up columns interleaved and [experts, ffn, dim] (gpt-oss), not one tensor per expert
    hf_experts_fused: bool = False
    # the GLU's clamp (gpt-oss: gate <= limit, |up| <= limit, (up + 1) * gate * sigmoid(alpha *
    # gate)); 0: none
    glu_limit: float = 0.0
    glu_alpha: float = 1.0
    # YaRN's correction range rounded to whole dimensions (False: gpt-oss, as its reference
    # computes it; a GGUF file does not say)
    yarn_truncate: bool = True
    # the layer count of the family's one model whose attention scale is 1 / sqrt(dim / heads)
    # rather than 1 / sqrt(head_dim) (Gemma 2 and 3 27B: query_pre_attn_scalar 144 and 168,
    # head_dim 128): its GGUF files do not say (no attention.scale), and llama.cpp knows it by
    # the layer count (0: none)
    gguf_width_scale_layers: int = 0

    def gguf_name(self, key: str) -> str:
        return self.gguf_names.get(key, GGUF_NAMES[key])

    def hf_name(self, key: str) -> str:
        return self.hf_names.get(key, HF_NAMES[key])

    def layer_keys(self, qkv_bias: bool, experts: bool = False) -> tuple[str, ...]:
        keys = self.layer
        if experts:
            keys = tuple(k for k in keys if k not in DENSE_FFN) + EXPERTS
            keys += EXPERT_BIASES if self.experts_biases else ()
        return keys + (BIASES if qkv_bias else ())


def _gemma_scale(v: float) -> float:
    return float(v) ** -0.5  # query_pre_attn_scalar


_GEMMA_HF = {"ffn_norm": "pre_feedforward_layernorm.weight"}
_GEMMA2_SETTINGS = {
    "attn_softcap": Setting("attn_logit_softcapping", "attn_logit_softcapping"),
    "final_softcap": Setting("final_logit_softcapping", "final_logit_softcapping"),
    "attn_scale": Setting("query_pre_attn_scalar", "attention.scale", _gemma_scale),
}
_GEMMA3_SETTINGS = {
    "attn_softcap": Setting("attn_logit_softcapping", "attn_logit_softcapping"),
    "final_softcap": Setting("final_logit_softcapping", "final_logit_softcapping"),
    "attn_scale": Setting("query_pre_attn_scalar", "attention.scale", _gemma_scale),
}

_MIXTRAL_HF = {"router": "block_sparse_moe.gate.weight",
               "gate_exps": "block_sparse_moe.experts.{e}.w1.weight",
               "up_exps": "block_sparse_moe.experts.{e}.w3.weight",
               "down_exps": "block_sparse_moe.experts.{e}.w2.weight"}

_GPT_OSS_HF = {"router": "mlp.router.weight", "router_bias": "mlp.router.bias",
               "gate_exps": "mlp.experts.gate_up_proj", "up_exps": "mlp.experts.gate_up_proj",
               "down_exps": "mlp.experts.down_proj",
               "gate_exps_bias": "mlp.experts.gate_up_proj_bias",
               "up_exps_bias": "mlp.experts.gate_up_proj_bias",
               "down_exps_bias": "mlp.experts.down_proj_bias"}

ARCHS: dict[str, Arch] = {a.name: a for a in (
    # (Mixtral: llama with experts)
    Arch("llama", ("llama", "mistral", "mixtral"), biases=True, gguf_neox=False,
         hf_names=_MIXTRAL_HF, experts_norm=True),
    Arch("qwen2", ("qwen2",), biases=True),
    Arch("qwen3", ("qwen3",), layer=PRE_NORM + ("q_norm", "k_norm"), qk_norm="head"),
    Arch("gemma2", ("gemma2",), layer=SANDWICH, hf_names=_GEMMA_HF, act="gelu_tanh",
         hf_norm_offset=1.0, embed_scale_sqrt_dim=True, settings=_GEMMA2_SETTINGS,
         swa_pattern=2, gguf_width_scale_layers=46),
    Arch("gemma3", ("gemma3_text",), layer=SANDWICH + ("q_norm", "k_norm"),
         hf_names=_GEMMA_HF, qk_norm="head", act="gelu_tanh", hf_norm_offset=1.0,
         embed_scale_sqrt_dim=True, settings=_GEMMA3_SETTINGS, swa_pattern=6,
         swa_theta=10000.0, gguf_width_scale_layers=62),
    Arch("phi3", ("phi3",), layer=("attn_norm", "qkv", "o", "ffn_norm", "gate_up", "down"),
         partial_rotary=True),
    Arch("granite", ("granite",), gguf_neox=False, settings={
        "embed_scale": Setting("embedding_multiplier", "embedding_scale"),
        "residual_scale": Setting("residual_multiplier", "residual_scale"),
        "attn_scale": Setting("attention_multiplier", "attention.scale"),
        "logit_scale": Setting("logits_scaling", "logit_scale")}),
    Arch("olmo2", ("olmo2",), layer=("q", "k", "v", "o", "q_norm", "k_norm", "post_attn_norm",
                                     "gate", "up", "down", "post_ffn_norm"), qk_norm="full"),
    Arch("smollm3", ("smollm3",), gguf_neox=False, nope_interval=4),
    Arch("qwen3moe", ("qwen3_moe",), layer=PRE_NORM + ("q_norm", "k_norm"), qk_norm="head",
         experts_norm=True, experts_always=True),
    Arch("olmoe", ("olmoe",), layer=PRE_NORM + ("q_norm", "k_norm"), qk_norm="full",
         experts_norm=False, experts_always=True),
    # gpt-oss: attention sinks, an output bias, even layers sliding; experts with biases, the
    # softmax over the chosen experts' scores, the clamped SwiGLU
    Arch("gpt-oss", ("gpt_oss",), layer=PRE_NORM + ("o_bias", "sinks"), biases=True,
         gguf_names={"ffn_norm": "post_attention_norm.weight"}, hf_names=_GPT_OSS_HF,
         swa_pattern=2, experts_norm=True, experts_always=True, experts_biases=True,
         hf_experts_fused=True, glu_limit=7.0, glu_alpha=1.702, yarn_truncate=False),
)}

HF_TYPES: dict[str, Arch] = {t: a for a in ARCHS.values() for t in a.hf_types}
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def supported() -> str:
    """The supported families, for messages: "llama (llama, mistral), qwen2, ..."."""
    return ", ".join(a.name + (f" ({', '.join(a.hf_types)})" if a.hf_types != (a.name,) else "")
                     for a in ARCHS.values())


def swa_layers(pattern: int, n_layers: int) -> tuple[bool, ...]:
    """Which layers slide under llama.cpp's pattern ``pattern`` (see Arch.swa_pattern)."""
    if pattern <= 0:
        return (False,) * n_layers
    return tuple(pattern == 1 or i % pattern < pattern - 1 for i in range(n_layers))


def nope_layers(interval: int, n_layers: int) -> tuple[bool, ...]:
    """Layers without rotary embedding: every ``interval``-th (none when 0)."""
    return tuple(interval > 0 and i % interval == interval - 1 for i in range(n_layers))


def sqrt_dim(dim: int) -> float:
    return math.sqrt(dim)
