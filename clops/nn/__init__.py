"""nn: functional neural-network ops on clops Tensors (linear on float and GGUF-quantized
weights, embedding, RMSNorm/LayerNorm, RoPE, SiLU/GELU, softmax, attention with a KV cache),
each one hand-written kernel from ``clops/kernels``."""

from __future__ import annotations

from .functional import (
    KVCache,
    embedding,
    gelu,
    layer_norm,
    linear,
    quantized,
    rms_norm,
    rope,
    rope_frequencies,
    scaled_dot_product_attention,
    silu,
    softmax,
)
from .quant import DeviceWeight, PackedWeight, UnsupportedFormatError, pack_float, pack_ggml

__all__ = ["DeviceWeight", "KVCache", "PackedWeight", "UnsupportedFormatError", "embedding",
           "gelu", "layer_norm", "linear", "pack_float", "pack_ggml", "quantized", "rms_norm",
           "rope", "rope_frequencies", "scaled_dot_product_attention", "silu", "softmax"]
