"""llm, weight sources: one naming for the tensors of a GGUF file or a safetensors directory, so
the model builder asks for ``"blk.3.q"`` whatever the file calls it; and the check, before any
weight reaches a device, that every tensor the model reads has the type and shape its config
implies (and, as each weight is read, values a float32 model can compute with)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from ..nn.quant import (
    DEVICE_BYTES,
    DEVICE_BYTES_ROWS,
    GGML_MXFP4,
    KQ_FORMATS,
    SUPPORTED,
    SUPPORTED_NAMES,
    PackedWeight,
    kq_scales,
    pack_float,
    pack_ggml,
)
from .arch import ARCHS, BIASES, NORMS, Arch
from .config import ModelConfig, check_rotary
from .gguf_file import GGUFFile, ModelFileError, ggml_type_name
from .safetensors_file import SafetensorsFile

_GGUF_TOP = {"embed": "token_embd.weight", "out_norm": "output_norm.weight",
             "output": "output.weight", "rope_freqs": "rope_freqs.weight"}
_HF_TOP = {"embed": "model.embed_tokens.weight", "out_norm": "model.norm.weight",
           "output": "lm_head.weight"}
_HF_FMT = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
# a per-layer tensor's name: its layer, and its name within the layer
_GGUF_LAYER_NAME = re.compile(r"blk\.([0-9]+)\.(.+)")
_HF_LAYER_NAME = re.compile(r"model\.layers\.([0-9]+)\.(.+)")
# safetensors' fused experts (arch.Arch.hf_experts_fused): (which of the interleaved [gate, up]
# columns, None: all; whether the last two axes are swapped) of each canonical key
_HF_FUSED = {"gate_exps": (0, True), "up_exps": (1, True), "down_exps": (None, True),
             "gate_exps_bias": (0, False), "up_exps_bias": (1, False)}
_HF_EXPERT = re.compile(r"(.*\.experts\.)([0-9]+)(\..+)")  # an expert's index in a name

# The shape of each tensor, by the names of the config's sizes (see _sizes): 2-D ones are read
# as weights [n, k] (row n is output n), 1-D ones as float vectors.
_TOP_SHAPES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab_size", "dim"), "out_norm": ("dim",), "output": ("vocab_size", "dim"),
    "rope_freqs": ("rope_pairs",),
}
_LAYER_SHAPES: dict[str, tuple[str, ...]] = {
    "attn_norm": ("dim",), "ffn_norm": ("dim",), "post_attn_norm": ("dim",),
    "post_ffn_norm": ("dim",),
    "q": ("q_rows", "dim"), "k": ("kv_rows", "dim"), "v": ("kv_rows", "dim"),
    "qkv": ("qkv_rows", "dim"), "o": ("dim", "q_rows"), "gate": ("ffn_dim", "dim"),
    "up": ("ffn_dim", "dim"), "gate_up": ("ffn_rows", "dim"), "down": ("dim", "ffn_dim"),
    "q_bias": ("q_rows",), "k_bias": ("kv_rows",), "v_bias": ("kv_rows",),
    # experts' weights [experts, n, k], read as one weight [experts * n, k]
    "router": ("n_experts", "dim"), "gate_exps": ("n_experts", "expert_ffn_dim", "dim"),
    "up_exps": ("n_experts", "expert_ffn_dim", "dim"),
    "down_exps": ("n_experts", "dim", "expert_ffn_dim"),
    "o_bias": ("dim",), "sinks": ("n_heads",), "router_bias": ("n_experts",),
    "gate_exps_bias": ("n_experts", "expert_ffn_dim"),
    "up_exps_bias": ("n_experts", "expert_ffn_dim"), "down_exps_bias": ("n_experts", "dim"),
}
# QK-norm weights: one per head dimension, shared by the heads, or one per projected value
_QK_NORM_SHAPES = {"head": {"q_norm": ("head_dim",), "k_norm": ("head_dim",)},
                   "full": {"q_norm": ("q_rows",), "k_norm": ("kv_rows",)}}
# tensors files may hold that change nothing (rotary tables of older checkpoints)
_IGNORED = ("self_attn.rotary_emb.inv_freq", "attn_rot_embd")
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
               "rope_pairs": "rotary / 2", "qkv_rows": "(n_heads + 2 * n_kv_heads) * head_dim",
               "ffn_rows": "2 * ffn_dim"}


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
            "rope_pairs": cfg.rotary // 2, "head_dim": cfg.head_dim,
            "qkv_rows": (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim,
            "ffn_rows": 2 * cfg.ffn_dim, "n_experts": cfg.n_experts,
            "expert_ffn_dim": cfg.expert_ffn_dim, "n_heads": cfg.n_heads}


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[str, ...]]:
    """The dimension names of each tensor a layer of ``cfg``'s family reads."""
    shapes = {**_LAYER_SHAPES, **_QK_NORM_SHAPES.get(cfg.desc.qk_norm or "", {})}
    return {k: shapes[k] for k in cfg.layer_keys()}


def expected_tensors(cfg: ModelConfig) -> Iterator[tuple[str, tuple[str, ...], bool]]:
    """(canonical name, dimension names, required) for every tensor the model may read."""
    yield "embed", _TOP_SHAPES["embed"], True
    yield "out_norm", _TOP_SHAPES["out_norm"], True
    yield "output", _TOP_SHAPES["output"], not cfg.tied_embeddings
    yield "rope_freqs", _TOP_SHAPES["rope_freqs"], False
    shapes = layer_shapes(cfg)
    for i in range(cfg.n_layers):
        for key, dims in shapes.items():
            yield f"blk.{i}.{key}", dims, key not in BIASES


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
    if p.fmt in KQ_FORMATS:  # (the scale and min of each group of the compact K-quants)
        scale, mn = kq_scales(p)
        # (k6: |q - 32| <= 32, mn = -32 s; h5: |q - 16| <= 16, mn = -16 s; i4, n4: IQ4's
        # table values, at most 127; m4: MXFP4's doubled E2M1 values, at most 12)
        most = {"k4": 15, "k5": 31, "k6": 32, "i4": 127, "m4": 12, "n4": 127, "h5": 16}[p.fmt]
        _check_bound(where, p, np.abs(scale) * most + (np.abs(mn) if p.fmt not in ("k6", "h5")
                                                        else 0))
        return
    assert p.scales is not None
    sc = np.abs(p.scales.astype(np.float32))
    # q4: value = q * scale + min with q in 0..15; q8: value = q * scale with q in -128..127;
    # q8m: q * scale + min with q in -128..127
    bound = (sc[..., 0] * 15 + sc[..., 1] if p.fmt == "q4"
             else sc[..., 0] * 128 + sc[..., 1] if p.fmt == "q8m" else sc * 128)
    _check_bound(where, p, bound)


def _check_bound(where: str, p: PackedWeight, bound: np.ndarray) -> None:
    """Raise unless every group's bound on its values' magnitudes is below MAX_WEIGHT."""
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

    def device_nbytes(self, name: str, layout: str = "rb16") -> int:
        """The bytes the tensor takes on a device whose weights take ``layout`` (vectors as
        float32; 0 where it is absent)."""
        if not self.has(name):
            return 0
        shape = self.shape(name)
        return 4 * int(np.prod(shape)) if len(shape) == 1 else self.nbytes(name)

    def need(self, name: str) -> None:
        if not self.has(name):
            raise ModelFileError(f"{self.path}: tensor {self.file_name(name)!r} is missing")

    def shape(self, name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def type_error(self, name: str) -> str | None:
        """Why the tensor's stored type cannot be computed with, or None when it can."""
        raise NotImplementedError

    # the family (set by validate), and where Q/K/V biases are declared
    desc: Arch = ARCHS["llama"]
    qkv_bias_source: str

    def layer_name(self, key: str) -> str:
        """The name of a layer's tensor ``key`` in this kind of file (after the prefix)."""
        raise NotImplementedError

    def layer_tensors(self) -> Iterator[tuple[int, str, str]]:
        """(layer, file name, name within the layer) of every per-layer tensor in the file."""
        raise NotImplementedError

    def validate(self, cfg: ModelConfig) -> None:
        """Raise ``ModelFileError`` unless every tensor the model reads is present (where
        ``cfg`` needs it), of a type clops computes with and of the shape ``cfg`` implies, and
        no tensor belongs to a layer past ``cfg.n_layers`` or is one the family does not read
        (it would change the model). Reads no weight data but the rotary frequency factors."""
        self.desc = cfg.desc
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
        keys = layer_shapes(cfg)
        canonical = {self.layer_name(k): k for k in keys}
        every = {self.layer_name(k): k for k in _LAYER_SHAPES}
        for i, fn, within in self.layer_tensors():
            if i >= cfg.n_layers:
                raise ModelFileError(
                    f"{self.path}: tensor {fn!r} belongs to layer {i}, but the config has "
                    f"{cfg.n_layers} layers ({cfg.name('n_layers')}; a corrupt count?)")
            if within in canonical or within in _IGNORED:
                continue
            if every.get(within) in BIASES:
                raise ModelFileError(
                    f"{self.path}: tensor {fn!r} is a Q/K/V bias, but the model has none "
                    f"({self.qkv_bias_source})")
            raise ModelFileError(
                f"{self.path}: tensor {fn!r} is not part of a {cfg.arch} layer as clops runs "
                f"it (it reads {', '.join(sorted(canonical))}; only the Q, K and V "
                "projections may have biases)")
        if self.has("rope_freqs"):
            f = self.vector("rope_freqs").astype(np.float32)
            where = f"{self.path}: tensor {self.file_name('rope_freqs')!r}"
            if not (f > 0).all():
                raise ModelFileError(f"{where} holds factors that are not positive")
            check_rotary(cfg.inv_freq() / f, "divided by its factors", where)


class GGUFSource(WeightSource):
    qkv_bias_source = "layer 0 has no blk.0.attn_q.bias"

    def __init__(self, f: GGUFFile) -> None:
        self.f, self.path = f, f.path

    def layer_name(self, key: str) -> str:
        return self.desc.gguf_name(key)

    def file_name(self, name: str) -> str:
        i, key = _split(name)
        return _GGUF_TOP[key] if i is None else f"blk.{i}.{self.layer_name(key)}"

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

    def device_nbytes(self, name: str, layout: str = "rb16") -> int:
        if not self.has(name):
            return 0
        t = self.f.tensors[self.file_name(name)]
        values = int(np.prod(t.shape))
        if len(t.shape) == 1:
            return 4 * values
        table = DEVICE_BYTES_ROWS if layout == "rows" else DEVICE_BYTES
        return int(values * table.get(t.ggml_type, 4))

    def type_error(self, name: str) -> str | None:
        t = self.f.tensors[self.file_name(name)]
        if t.ggml_type in SUPPORTED:
            return None
        return (f"is {ggml_type_name(t.ggml_type)}, which clops cannot compute with "
                f"(supported: {', '.join(SUPPORTED_NAMES)})")

    def layer_tensors(self) -> Iterator[tuple[int, str, str]]:
        for fn in self.f.tensors:
            m = _GGUF_LAYER_NAME.fullmatch(fn)
            if m:
                yield int(m.group(1)), fn, m.group(2)


class SafetensorsSource(WeightSource):
    """A safetensors directory's tensors. An experts' weight (a name with ``{e}``) is one
    tensor per expert in the files, read as their stack [experts, n, k]."""

    qkv_bias_source = "config.json: no attention_bias"
    n_experts = 0  # (set by validate)

    def __init__(self, path: str, tensors: dict[str, SafetensorsFile]) -> None:
        self.path, self.tensors = path, tensors

    def validate(self, cfg: ModelConfig) -> None:
        self.n_experts = cfg.n_experts
        super().validate(cfg)

    def layer_name(self, key: str) -> str:
        return self.desc.hf_name(key)

    def file_name(self, name: str) -> str:
        i, key = _split(name)
        return _HF_TOP[key] if i is None else f"model.layers.{i}.{self.layer_name(key)}"

    def _names(self, name: str) -> list[str]:
        """The file's names of tensor ``name``: one, or one per expert."""
        fn = self.file_name(name)
        return [fn.format(e=e) for e in range(self.n_experts)] if "{e}" in fn else [fn]

    def has(self, name: str) -> bool:
        i, key = _split(name)
        if i is None and key not in _HF_TOP:
            return False
        return self._mxfp4(name) is not None or all(fn in self.tensors
                                                    for fn in self._names(name))

    def device_nbytes(self, name: str, layout: str = "rb16") -> int:
        if self.has(name) and self._mxfp4(name):  # (as a GGUF file's MXFP4 blocks)
            table = DEVICE_BYTES_ROWS if layout == "rows" else DEVICE_BYTES
            return int(np.prod(self.shape(name)) * table[GGML_MXFP4])
        return super().device_nbytes(name, layout)

    def _mxfp4(self, name: str) -> tuple[str, str] | None:
        """The (blocks, scales) tensors of a fused experts' weight stored in MXFP4, as gpt-oss's
        checkpoints store them (``<name>_blocks`` [experts, rows, k / 32, 16] bytes, two E2M1
        values a byte, the lower nibble first; ``<name>_scales`` [experts, rows, k / 32], E8M0
        exponents; rows are outputs), or None."""
        fused = self._fused(name)
        fn = self.file_name(name)
        if fused is None or name.endswith("_bias") or fn in self.tensors:
            return None
        blocks, scales = fn + "_blocks", fn + "_scales"
        return (blocks, scales) if blocks in self.tensors and scales in self.tensors else None

    def _mxfp4_matrix(self, name: str, blocks: str, scales: str) -> PackedWeight:
        """``_mxfp4``'s tensors as GGUF's MXFP4 blocks (a scale byte, then 16 bytes holding
        values j and j + 16 of 32), packed as a GGUF tensor is."""
        where = f"{self.path}: tensors {blocks!r}, {scales!r}"
        for fn in (blocks, scales):
            if self.tensors[fn].dtype(fn) != "U8":
                raise ModelFileError(f"{where}: {fn!r} is {self.tensors[fn].dtype(fn)}, "
                                     "expected U8 (MXFP4)")
        b = np.asarray(self.tensors[blocks].array(blocks))
        e = np.asarray(self.tensors[scales].array(scales))
        if b.ndim != 4 or b.shape[-1] != 16 or e.shape != b.shape[:-1]:
            raise ModelFileError(f"{where}: shapes {list(b.shape)} and {list(e.shape)}, "
                                 "expected [experts, rows, blocks, 16] and [experts, rows, "
                                 "blocks]")
        half = self._fused(name)[0]  # type: ignore[index]
        if half is not None:
            b, e = b[:, half::2], e[:, half::2]
        codes = np.empty(b.shape[:-1] + (32,), np.uint8)
        codes[..., 0::2], codes[..., 1::2] = b & 15, b >> 4
        raw = np.concatenate([e[..., None], codes[..., :16] | (codes[..., 16:] << 4)], axis=-1)
        n, k = b.shape[0] * b.shape[1], b.shape[2] * 32
        p = pack_ggml(raw, GGML_MXFP4, n, k)
        _check_values(where, p)
        return p

    def need(self, name: str) -> None:
        if self._mxfp4(name) is not None:
            return
        for fn in self._names(name):
            if fn not in self.tensors:
                raise ModelFileError(f"{self.path}: tensor {fn!r} is missing")

    def _array(self, name: str) -> tuple[np.ndarray, str]:
        self.need(name)
        arrays, fmts = [], set()
        for fn in self._names(name):
            sf = self.tensors[fn]
            dt = sf.dtype(fn)
            if dt not in _HF_FMT:
                raise ModelFileError(f"{sf.path}: tensor {fn!r} is {dt}, not a float type")
            arrays.append(sf.array(fn))
            fmts.add(_HF_FMT[dt])
        if len(fmts) > 1:
            raise ModelFileError(f"{self.path}: the tensors {self.file_name(name)!r} mix the "
                                 f"types {sorted(fmts)}; expected one type for every expert")
        fused = self._fused(name)
        if fused is not None:
            half, swap = fused
            a = np.asarray(arrays[0])
            a = a[..., half::2] if half is not None else a
            return np.ascontiguousarray(a.swapaxes(-1, -2) if swap else a), fmts.pop()
        if len(arrays) == 1:
            return arrays[0], fmts.pop()
        return np.stack([np.asarray(a) for a in arrays]), fmts.pop()

    def _fused(self, name: str) -> tuple[int | None, bool] | None:
        """How a fused experts' tensor gives ``name`` (``_HF_FUSED``), or None."""
        return _HF_FUSED.get(_split(name)[1]) if self.desc.hf_experts_fused else None

    def matrix(self, name: str) -> PackedWeight:
        mx = self._mxfp4(name)
        if mx is not None:
            return self._mxfp4_matrix(name, *mx)
        arr, fmt = self._array(name)
        if arr.ndim == 3:  # experts: [experts, n, k] as one weight [experts * n, k]
            arr = np.asarray(arr).reshape(-1, arr.shape[-1])
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
        if self.desc.hf_norm_offset and _split(name)[1] in NORMS + ("out_norm",):
            # NOTE: such families store w and apply offset + w (GGUF files hold the sum)
            v = v + np.float32(self.desc.hf_norm_offset)
        _check_vector(f"{self.path}: tensor {self.file_name(name)!r}", v)
        return v

    def nbytes(self, name: str) -> int:
        if not self.has(name):
            return 0
        names = self._mxfp4(name) or self._names(name)
        total = sum(int(self.tensors[fn].array(fn).nbytes) for fn in names)
        fused = self._fused(name)
        # (the gate and the up weights are the halves of one fused tensor)
        return total // 2 if fused is not None and fused[0] is not None else total

    def shape(self, name: str) -> tuple[int, ...]:
        mx = self._mxfp4(name)
        if mx is not None:
            b = self.tensors[mx[0]].shape(mx[0])
            if len(b) != 4:
                return b  # (refused as the wrong shape)
            halves = self._fused(name)[0] is not None  # type: ignore[index]
            return (b[0], b[1] // 2 if halves and b[1] % 2 == 0 else b[1], b[2] * 32)
        names = self._names(name)
        shapes = {self.tensors[fn].shape(fn) for fn in names}
        if len(shapes) > 1:
            raise ModelFileError(f"{self.path}: the tensors {self.file_name(name)!r} have "
                                 f"shapes {sorted(shapes)}; expected one shape for every "
                                 "expert")
        one = shapes.pop()
        fused = self._fused(name)
        if fused is not None and len(one) in (2, 3):
            half, swap = fused
            if half is not None:
                if one[-1] % 2:
                    return one  # (no interleaved halves: refused as the wrong shape)
                one = one[:-1] + (one[-1] // 2,)
            return one[:-2] + (one[-1], one[-2]) if swap else one
        return (len(names),) + one if "{e}" in self.file_name(name) else one

    def type_error(self, name: str) -> str | None:
        mx = self._mxfp4(name)
        if mx is not None:
            bad = [fn for fn in mx if self.tensors[fn].dtype(fn) != "U8"]
            return f"is stored in MXFP4 with {bad[0]!r} not U8" if bad else None
        for fn in self._names(name):
            dt = self.tensors[fn].dtype(fn)
            if dt not in _HF_FMT:
                return f"is {dt}, not a float type ({', '.join(_HF_FMT)})"
        return None

    def layer_tensors(self) -> Iterator[tuple[int, str, str]]:
        for fn in self.tensors:
            m = _HF_LAYER_NAME.fullmatch(fn)
            if m:
                within = m.group(2)
                if self.desc.hf_experts_fused and within.endswith(("_blocks", "_scales")):
                    within = within[:-len("_blocks")]  # (MXFP4: see _mxfp4)
                e = _HF_EXPERT.fullmatch(within)
                if e and int(e.group(2)) < self.n_experts:
                    # (an expert past the config's count keeps its index: not part of a layer)
                    within = e.group(1) + "{e}" + e.group(3)
                yield int(m.group(1)), fn, within


def _check_vector(where: str, v: np.ndarray) -> None:
    """Raise unless every value of the float32 vector ``v`` is finite and below MAX_WEIGHT."""
    worst = float(np.abs(v).max()) if v.size else 0.0
    if not worst < MAX_WEIGHT:
        bad = int(np.argmax(~(np.abs(v) < MAX_WEIGHT)))
        raise ModelFileError(f"{where}: the value at [{bad}] is {float(v[bad])}, outside "
                             f"(-{MAX_WEIGHT:g}, {MAX_WEIGHT:g}) (corrupt data)")
