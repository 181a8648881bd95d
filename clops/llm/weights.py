"""llm, weight sources: one naming for the tensors of a GGUF file or a safetensors directory, so
the model builder asks for ``"blk.3.q"`` whatever the file calls it."""

from __future__ import annotations

import numpy as np

from ..nn.quant import PackedWeight, pack_float
from .gguf_file import GGUFFile, ModelFileError
from .safetensors_file import SafetensorsFile

_GGUF_LAYER = {
    "attn_norm": "attn_norm.weight", "q": "attn_q.weight", "k": "attn_k.weight",
    "v": "attn_v.weight", "o": "attn_output.weight", "q_bias": "attn_q.bias",
    "k_bias": "attn_k.bias", "v_bias": "attn_v.bias", "ffn_norm": "ffn_norm.weight",
    "gate": "ffn_gate.weight", "up": "ffn_up.weight", "down": "ffn_down.weight",
}
_GGUF_TOP = {"embed": "token_embd.weight", "out_norm": "output_norm.weight",
             "output": "output.weight", "rope_freqs": "rope_freqs.weight"}

_HF_LAYER = {
    "attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight",
    "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
    "o": "self_attn.o_proj.weight", "q_bias": "self_attn.q_proj.bias",
    "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
    "ffn_norm": "post_attention_layernorm.weight", "gate": "mlp.gate_proj.weight",
    "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
}
_HF_TOP = {"embed": "model.embed_tokens.weight", "out_norm": "model.norm.weight",
           "output": "lm_head.weight"}
_HF_FMT = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


def _split(name: str) -> tuple[int | None, str]:
    if name.startswith("blk."):
        _, i, key = name.split(".", 2)
        return int(i), key
    return None, name


class WeightSource:
    """Tensors by canonical name: ``embed``, ``out_norm``, ``output``, ``blk.<i>.<key>``."""

    path: str

    def file_name(self, name: str) -> str:
        raise NotImplementedError

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def matrix(self, name: str) -> PackedWeight:
        raise NotImplementedError

    def vector(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def nbytes(self, name: str) -> int:
        raise NotImplementedError

    def need(self, name: str) -> None:
        if not self.has(name):
            raise ModelFileError(f"{self.path}: tensor {self.file_name(name)!r} is missing")


class GGUFSource(WeightSource):
    def __init__(self, f: GGUFFile) -> None:
        self.f, self.path = f, f.path

    def file_name(self, name: str) -> str:
        i, key = _split(name)
        return _GGUF_TOP[key] if i is None else f"blk.{i}.{_GGUF_LAYER[key]}"

    def has(self, name: str) -> bool:
        return self.file_name(name) in self.f.tensors

    def matrix(self, name: str) -> PackedWeight:
        self.need(name)
        return self.f.packed(self.file_name(name))

    def vector(self, name: str) -> np.ndarray:
        self.need(name)
        return self.f.vector(self.file_name(name))

    def nbytes(self, name: str) -> int:
        return int(self.f.tensors[self.file_name(name)].data.nbytes) if self.has(name) else 0


class SafetensorsSource(WeightSource):
    def __init__(self, path: str, tensors: dict[str, SafetensorsFile]) -> None:
        self.path, self.tensors = path, tensors

    def file_name(self, name: str) -> str:
        i, key = _split(name)
        return _HF_TOP[key] if i is None else f"model.layers.{i}.{_HF_LAYER[key]}"

    def has(self, name: str) -> bool:
        i, key = _split(name)
        if (_HF_TOP if i is None else _HF_LAYER).get(key) is None:
            return False
        return self.file_name(name) in self.tensors

    def _array(self, name: str) -> tuple[np.ndarray, str]:
        self.need(name)
        fn = self.file_name(name)
        sf = self.tensors[fn]
        dt = sf.dtype(fn)
        if dt not in _HF_FMT:
            raise ModelFileError(f"{sf.path}: tensor {fn!r} is {dt}, not a float type")
        return sf.array(fn), _HF_FMT[dt]

    def matrix(self, name: str) -> PackedWeight:
        arr, fmt = self._array(name)
        if arr.ndim != 2:
            raise ModelFileError(f"{self.path}: tensor {self.file_name(name)!r} has shape "
                                 f"{arr.shape}, expected 2-D")
        return pack_float(np.asarray(arr), fmt)

    def vector(self, name: str) -> np.ndarray:
        arr, fmt = self._array(name)
        if fmt == "bf16":
            return (np.asarray(arr).astype(np.uint32) << 16).view(np.float32).reshape(-1)
        return np.asarray(arr, dtype=np.float32).reshape(-1)

    def nbytes(self, name: str) -> int:
        if not self.has(name):
            return 0
        fn = self.file_name(name)
        return int(self.tensors[fn].array(fn).nbytes)
