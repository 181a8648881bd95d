"""llm, weight sources: one naming for the tensors of a GGUF file or a safetensors directory, so
the model builder asks for ``"blk.3.q"`` whatever the file calls it; and the check, before any
weight reaches a device, that every tensor the model reads has the type and shape its config
implies (and, as each weight is read, values a float32 model can compute with)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from ..nn.quant import SUPPORTED, PackedWeight, pack_float
from .config import ModelConfig, check_rotary
from .gguf_file import GGUFFile, ModelFileError, ggml_type_name
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
# a per-layer tensor's name: its layer, and its name within the layer
_GGUF_LAYER_NAME = re.compile(r"blk\.(\d+)\.(.+)")
_HF_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")

# The shape of each tensor, by the names of the config's sizes (see _sizes): 2-D ones are read
# as weights [n, k] (row n is output n), 1-D ones as float vectors.
_TOP_SHAPES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab_size", "dim"), "out_norm": ("dim",), "output": ("vocab_size", "dim"),
    "rope_freqs": ("rope_pairs",),
}
_LAYER_SHAPES: dict[str, tuple[str, ...]] = {
    "attn_norm": ("dim",), "ffn_norm": ("dim",),
    "q": ("q_rows", "dim"), "k": ("kv_rows", "dim"), "v": ("kv_rows", "dim"),
    "o": ("dim", "q_rows"), "gate": ("ffn_dim", "dim"), "up": ("ffn_dim", "dim"),
    "down": ("dim", "ffn_dim"), "q_bias": ("q_rows",), "k_bias": ("kv_rows",),
    "v_bias": ("kv_rows",),
}
_BIASES = ("q_bias", "k_bias", "v_bias")
# A weight's magnitude must stay below float16's range: real models keep theirs far below it,
# and a value near float32's limit (a flipped exponent bit) overflows the arithmetic to inf.
MAX_WEIGHT = 65536.0
# per float format: its unsigned view, the mask of its magnitude bits, and the magnitude bits of
# MAX_WEIGHT (float16's infinity: its largest finite value is below MAX_WEIGHT)
_MAGNITUDE_BITS: dict[str, tuple[type[np.unsignedinteger], int, int]] = {
    "f32": (np.uint32, 0x7FFFFFFF, 0x47800000), "bf16": (np.uint16, 0x7FFF, 0x4780),
    "f16": (np.uint16, 0x7FFF, 0x7C00)}
_CHUNK = 1 << 22


_DIM_LABELS = {"q_rows": "n_heads * head_dim", "kv_rows": "n_kv_heads * head_dim",
               "rope_pairs": "head_dim / 2"}


def _dim_fields(dims: tuple[str, ...]) -> list[str]:
    """The config fields behind dimension names, each once."""
    out: list[str] = []
    for d in dims:
        for f in _DIM_LABELS.get(d, d).replace("*", " ").replace("/", " ").split():
            if not f.isdigit() and f not in out:
                out.append(f)
    return out


def _sizes(cfg: ModelConfig) -> dict[str, int]:
    return {"vocab_size": cfg.vocab_size, "dim": cfg.dim, "ffn_dim": cfg.ffn_dim,
            "q_rows": cfg.n_heads * cfg.head_dim, "kv_rows": cfg.n_kv_heads * cfg.head_dim,
            "rope_pairs": cfg.head_dim // 2}


def expected_tensors(cfg: ModelConfig) -> Iterator[tuple[str, tuple[str, ...], bool]]:
    """(canonical name, dimension names, required) for every tensor the model may read."""
    yield "embed", _TOP_SHAPES["embed"], True
    yield "out_norm", _TOP_SHAPES["out_norm"], True
    yield "output", _TOP_SHAPES["output"], not cfg.tied_embeddings
    yield "rope_freqs", _TOP_SHAPES["rope_freqs"], False
    for i in range(cfg.n_layers):
        for key, dims in _LAYER_SHAPES.items():
            yield f"blk.{i}.{key}", dims, key not in _BIASES or cfg.qkv_bias


def _check_values(where: str, p: PackedWeight) -> None:
    """Raise unless every value of ``p`` is finite and below MAX_WEIGHT in magnitude."""
    if p.fmt in _MAGNITUDE_BITS:
        utype, mask, limit = _MAGNITUDE_BITS[p.fmt]
        bits = np.ascontiguousarray(p.data).reshape(-1).view(utype)
        for s in range(0, bits.size, _CHUNK):
            mag = bits[s:s + _CHUNK] & utype(mask)
            if int(mag.max()) >= limit:
                bad = int(np.argmax(mag >= limit)) + s
                raise ModelFileError(
                    f"{where}: the value at [{bad // p.k}, {bad % p.k}] is "
                    f"{_as_float(p.fmt, bits[bad])}, outside (-{MAX_WEIGHT:g}, "
                    f"{MAX_WEIGHT:g}) (corrupt data)")
        return
    assert p.scales is not None
    sc = np.abs(p.scales.astype(np.float32))
    # q4: value = q * scale + min with q in 0..15; q8: value = q * scale with q in -128..127
    bound = sc[..., 0] * 15 + sc[..., 1] if p.fmt == "q4" else sc * 128
    worst = float(bound.max()) if bound.size else 0.0
    if not worst < MAX_WEIGHT:
        bad = int(np.argmax(~(bound < MAX_WEIGHT).reshape(-1)))
        per_row = bound.size // max(p.n, 1)
        raise ModelFileError(
            f"{where}: the scales of row {bad // per_row}, block {bad % per_row} allow values "
            f"up to {worst:g} in magnitude, outside (-{MAX_WEIGHT:g}, {MAX_WEIGHT:g}) "
            "(corrupt data)")


def _as_float(fmt: str, bits: np.generic) -> float:
    if fmt == "f32":
        return float(np.asarray(bits, np.uint32).view(np.float32))
    if fmt == "f16":
        return float(np.asarray(bits, np.uint16).view(np.float16))
    return float((np.asarray(bits, np.uint32) << 16).view(np.float32))


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

    def shape(self, name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def type_error(self, name: str) -> str | None:
        """Why the tensor's stored type cannot be computed with, or None when it can."""
        raise NotImplementedError

    # a layer's tensors as the file names them (after the layer's prefix), tensors that would
    # change the model but that clops does not apply, and where Q/K/V biases are declared
    layer_names: dict[str, str]
    unsupported: tuple[str, ...]
    qkv_bias_source: str

    def layer_tensors(self) -> Iterator[tuple[int, str, str]]:
        """(layer, file name, name within the layer) of every per-layer tensor in the file."""
        raise NotImplementedError

    def validate(self, cfg: ModelConfig) -> None:
        """Raise ``ModelFileError`` unless every tensor the model reads is present (where
        ``cfg`` needs it), of a type clops computes with and of the shape ``cfg`` implies, and
        no tensor belongs to a layer past ``cfg.n_layers``. Reads no weight data but the
        rotary frequency factors."""
        sizes = _sizes(cfg)
        for name, dims, required in expected_tensors(cfg):
            if not self.has(name):
                if required:
                    self.need(name)
                continue
            fn = self.file_name(name)
            want = tuple(sizes[d] for d in dims)
            got = self.shape(name)
            if got != want:
                raise ModelFileError(
                    f"{self.path}: tensor {fn!r} has shape {list(got)}, expected {list(want)}: "
                    f"[{', '.join(_DIM_LABELS.get(d, d) for d in dims)}] of the config ("
                    f"{', '.join(cfg.name(f) for f in _dim_fields(dims))})")
            why = self.type_error(name)
            if why:
                raise ModelFileError(f"{self.path}: tensor {fn!r} {why}")
        canonical = {v: k for k, v in self.layer_names.items()}
        for i, fn, within in self.layer_tensors():
            if i >= cfg.n_layers:
                raise ModelFileError(
                    f"{self.path}: tensor {fn!r} belongs to layer {i}, but the config has "
                    f"{cfg.n_layers} layers ({cfg.name('n_layers')}; a corrupt count?)")
            if within in self.unsupported:
                raise ModelFileError(
                    f"{self.path}: tensor {fn!r} is a bias clops does not apply (only the Q, "
                    "K and V projections may have biases)")
            if canonical.get(within) in _BIASES and not cfg.qkv_bias:
                raise ModelFileError(
                    f"{self.path}: tensor {fn!r} is a Q/K/V bias, but the model has none "
                    f"({self.qkv_bias_source})")
        if self.has("rope_freqs"):
            f = self.vector("rope_freqs").astype(np.float32)
            where = f"{self.path}: tensor {self.file_name('rope_freqs')!r}"
            if not (f > 0).all():
                raise ModelFileError(f"{where} holds factors that are not positive")
            check_rotary(cfg.inv_freq() / f, "divided by its factors", where)


class GGUFSource(WeightSource):
    layer_names = _GGUF_LAYER
    unsupported = ("attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias")
    qkv_bias_source = "layer 0 has no blk.0.attn_q.bias"

    def __init__(self, f: GGUFFile) -> None:
        self.f, self.path = f, f.path

    def file_name(self, name: str) -> str:
        i, key = _split(name)
        return _GGUF_TOP[key] if i is None else f"blk.{i}.{_GGUF_LAYER[key]}"

    def has(self, name: str) -> bool:
        return self.file_name(name) in self.f.tensors

    def matrix(self, name: str) -> PackedWeight:
        self.need(name)
        fn = self.file_name(name)
        p = self.f.packed(fn)
        _check_values(f"{self.path}: tensor {fn!r}", p)
        return p

    def vector(self, name: str) -> np.ndarray:
        self.need(name)
        fn = self.file_name(name)
        v = self.f.vector(fn)
        _check_vector(f"{self.path}: tensor {fn!r}", v)
        return v

    def nbytes(self, name: str) -> int:
        return int(self.f.tensors[self.file_name(name)].data.nbytes) if self.has(name) else 0

    def shape(self, name: str) -> tuple[int, ...]:
        return self.f.tensors[self.file_name(name)].shape

    def type_error(self, name: str) -> str | None:
        t = self.f.tensors[self.file_name(name)]
        if t.ggml_type in SUPPORTED:
            return None
        return (f"is {ggml_type_name(t.ggml_type)}, which clops cannot compute with "
                f"({', '.join(ggml_type_name(g) for g in sorted(SUPPORTED))})")

    def layer_tensors(self) -> Iterator[tuple[int, str, str]]:
        for fn in self.f.tensors:
            m = _GGUF_LAYER_NAME.fullmatch(fn)
            if m:
                yield int(m.group(1)), fn, m.group(2)


class SafetensorsSource(WeightSource):
    layer_names = _HF_LAYER
    unsupported = ("self_attn.o_proj.bias", "mlp.gate_proj.bias", "mlp.up_proj.bias",
                   "mlp.down_proj.bias")
    qkv_bias_source = "config.json: a llama without attention_bias"

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
        p = pack_float(np.asarray(arr), fmt)
        _check_values(f"{self.path}: tensor {self.file_name(name)!r}", p)
        return p

    def vector(self, name: str) -> np.ndarray:
        arr, fmt = self._array(name)
        if fmt == "bf16":
            v = (np.asarray(arr).astype(np.uint32) << 16).view(np.float32).reshape(-1)
        else:
            v = np.asarray(arr, dtype=np.float32).reshape(-1)
        _check_vector(f"{self.path}: tensor {self.file_name(name)!r}", v)
        return v

    def nbytes(self, name: str) -> int:
        if not self.has(name):
            return 0
        fn = self.file_name(name)
        return int(self.tensors[fn].array(fn).nbytes)

    def shape(self, name: str) -> tuple[int, ...]:
        fn = self.file_name(name)
        return self.tensors[fn].shape(fn)

    def type_error(self, name: str) -> str | None:
        fn = self.file_name(name)
        dt = self.tensors[fn].dtype(fn)
        return None if dt in _HF_FMT else f"is {dt}, not a float type ({', '.join(_HF_FMT)})"

    def layer_tensors(self) -> Iterator[tuple[int, str, str]]:
        for fn in self.tensors:
            m = _HF_LAYER_NAME.fullmatch(fn)
            if m:
                yield int(m.group(1)), fn, m.group(2)


def _check_vector(where: str, v: np.ndarray) -> None:
    """Raise unless every value of the float32 vector ``v`` is finite and below MAX_WEIGHT."""
    worst = float(np.abs(v).max()) if v.size else 0.0
    if not worst < MAX_WEIGHT:
        bad = int(np.argmax(~(np.abs(v) < MAX_WEIGHT)))
        raise ModelFileError(f"{where}: the value at [{bad}] is {float(v[bad])}, outside "
                             f"(-{MAX_WEIGHT:g}, {MAX_WEIGHT:g}) (corrupt data)")
