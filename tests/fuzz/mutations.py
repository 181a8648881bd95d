"""Fuzz tests, mutations: seeded, structure-aware changes to a GGUF file (header, metadata keys,
value types, counts and values, nested arrays, the tensor table's dimensions, types and
offsets, tensor data, truncation) and to a safetensors directory (header JSON, dtypes, shapes,
offsets, the header length, data, config.json values, the shard index). Each ``Mutation`` says
what it changed and writes the changed copy of its base.

The GGUF layout is read here by a small scanner of its own, for well-formed files only (the
bases), so that the reader under test is not its own oracle."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# GGUF value types: fixed-width scalars (struct code), string 8, array 9.
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q",
           12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass
class Field:
    """One fixed-width field of the file: where it is, its struct code, what it is."""

    offset: int
    code: str
    what: str

    def value(self, data: bytes | bytearray) -> Any:
        return struct.unpack_from("<" + self.code, data, self.offset)[0]


@dataclass
class Entry:
    """A metadata entry or a tensor-table entry: its byte span and its fields."""

    name: str
    start: int
    end: int
    fields: list[Field] = field(default_factory=list)
    strings: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, what)


@dataclass
class GGUFLayout:
    header: list[Field]
    kvs: list[Entry]
    tensors: list[Entry]
    data_start: int
    spans: dict[str, tuple[int, int]]  # tensor name -> [start, end) of its data


def scan_gguf(data: bytes) -> GGUFLayout:
    """The layout of a well-formed little-endian GGUF file."""
    pos = 24
    header = [Field(0, "I", "magic"), Field(4, "I", "version"), Field(8, "Q", "tensor count"),
              Field(16, "Q", "metadata count")]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)

    def string(e: Entry, what: str) -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        e.fields.append(Field(pos, "Q", f"{what} length"))
        e.strings.append((pos + 8, pos + 8 + n, what))
        s = data[pos + 8:pos + 8 + n].decode("utf-8")
        pos += 8 + n
        return s

    def value(e: Entry, vtype: int, what: str) -> Any:
        nonlocal pos
        if vtype in _SCALAR:
            f = Field(pos, _SCALAR[vtype], what)
            e.fields.append(f)
            pos += struct.calcsize("<" + f.code)
            return f.value(data)
        if vtype == _STRING:
            return string(e, what)
        itype, count = struct.unpack_from("<IQ", data, pos)
        e.fields += [Field(pos, "I", f"{what} item type"), Field(pos + 4, "Q", f"{what} count")]
        pos += 12
        return [value(e, itype, f"{what}[{i}]") for i in range(count)]

    kvs: list[Entry] = []
    alignment = 32
    for _ in range(n_kv):
        e = Entry("", pos, 0)
        e.name = key = string(e, "key")
        (vtype,) = struct.unpack_from("<I", data, pos)
        e.fields.append(Field(pos, "I", "type"))
        pos += 4
        v = value(e, vtype, "value")
        if key == "general.alignment":
            alignment = v
        e.end = pos
        kvs.append(e)
    tensors: list[Entry] = []
    offsets: dict[str, tuple[int, list[int], int]] = {}
    for _ in range(n_tensors):
        e = Entry("", pos, 0)
        e.name = name = string(e, "name")
        (n_dims,) = struct.unpack_from("<I", data, pos)
        e.fields.append(Field(pos, "I", "n_dims"))
        pos += 4
        dims = []
        for d in range(n_dims):
            e.fields.append(Field(pos, "Q", f"dimension {d}"))
            dims.append(struct.unpack_from("<Q", data, pos)[0])
            pos += 8
        ggml_type, offset = struct.unpack_from("<IQ", data, pos)
        e.fields += [Field(pos, "I", "type"), Field(pos + 4, "Q", "offset")]
        pos += 12
        e.end = pos
        tensors.append(e)
        offsets[name] = (offset, dims, ggml_type)
    data_start = -(-pos // alignment) * alignment
    ordered = sorted(offsets.items(), key=lambda kv: kv[1][0])
    spans = {}
    for i, (name, (offset, _, _)) in enumerate(ordered):
        end = ordered[i + 1][1][0] if i + 1 < len(ordered) else len(data) - data_start
        spans[name] = (data_start + offset, data_start + end)
    return GGUFLayout(header, kvs, tensors, data_start, spans)


@dataclass
class Mutation:
    """A changed copy of a base model: ``what`` it changed, and how to write it."""

    base: str
    what: str
    write: Callable[[str], str]  # folder -> path of the changed file or directory


# Values a mutated integer field takes: edges of its width, and sizes near the right one.
def _interesting_ints(rng: random.Random, code: str, old: int) -> int:
    bits = struct.calcsize("<" + code) * 8
    signed = code.islower()
    hi = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
    lo = -(1 << (bits - 1)) if signed else 0
    choices = [0, 1, 2, 3, 32, 64, 96, 320, old + 1, old - 1, old * 2, old // 2, old + 32,
               hi, lo, hi // 2 + 1, 1 << min(bits - 1, 31), 1 << min(bits - 1, 40),
               rng.randint(lo, hi)]
    v = rng.choice(choices)
    return min(max(v, lo), hi)


def _interesting_float(rng: random.Random, old: float) -> float:
    return rng.choice([0.0, -0.0, -1.0, 1.0, float("nan"), float("inf"), float("-inf"), 1e-30,
                       1e30, 3.0e38, old * 2, old / 2, -old, rng.uniform(-1e6, 1e6)])


def _set_field(data: bytearray, f: Field, rng: random.Random) -> str:
    old = f.value(data)
    if f.code in "fd":
        new: Any = _interesting_float(rng, old)
    else:
        new = _interesting_ints(rng, f.code, old)
    struct.pack_into("<" + f.code, data, f.offset, new)
    return f"{f.what} {old!r} -> {new!r}"


def gguf_mutations(name: str, path: str, rng: random.Random) -> Iterator[Mutation]:
    """An endless stream of seeded mutations of the GGUF file at ``path``."""
    with open(path, "rb") as fh:
        base = fh.read()
    lay = scan_gguf(base)
    config_keys = [e for e in lay.kvs if e.name.split(".")[0] in ("llama", "qwen2")]
    tok_keys = [e for e in lay.kvs if e.name.startswith("tokenizer.")]
    while True:
        data = bytearray(base)
        kind = rng.choices(list(_GGUF_KINDS), weights=[w for w, _ in _GGUF_KINDS.values()])[0]
        desc = _GGUF_KINDS[kind][1](data, lay, rng, config_keys, tok_keys)
        out = bytes(data)

        def write(folder: str, out: bytes = out) -> str:
            p = os.path.join(folder, "model.gguf")
            with open(p, "wb") as fh:
                fh.write(out)
            return p

        yield Mutation(name, f"{kind}: {desc}", write)


def _m_header(data: bytearray, lay: GGUFLayout, rng: random.Random, *_: Any) -> str:
    f = rng.choice(lay.header)
    if f.what == "magic":
        i = rng.randrange(4)
        data[i] = rng.randrange(256)
        return f"magic byte {i} -> {data[i]}"
    return _set_field(data, f, rng)


def _m_config_value(data: bytearray, lay: GGUFLayout, rng: random.Random,
                    config_keys: list[Entry], *_: Any) -> str:
    e = rng.choice(config_keys)
    f = [f for f in e.fields if f.what == "value"][0]
    return f"{e.name}: {_set_field(data, f, rng)}"


def _m_kv_field(data: bytearray, lay: GGUFLayout, rng: random.Random, *_: Any) -> str:
    e = rng.choice(lay.kvs)
    f = rng.choice(e.fields)
    if f.what.endswith("item type") or f.what == "type":
        old = f.value(data)
        new = rng.choice([0, 4, 5, 6, 7, 8, 9, 9, 9, 10, 12, 13, 255, 1 << 31])
        struct.pack_into("<I", data, f.offset, new)
        return f"{e.name}: {f.what} {old} -> {new}"
    return f"{e.name}: {_set_field(data, f, rng)}"


def _m_string_bytes(data: bytearray, lay: GGUFLayout, rng: random.Random, _c: Any,
                    tok_keys: list[Entry]) -> str:
    e = rng.choice(tok_keys if rng.random() < 0.5 else lay.kvs + lay.tensors)
    strings = [s for s in e.strings if s[1] > s[0]]
    start, end, what = rng.choice(strings)
    i = rng.randrange(start, end)
    old = data[i]
    data[i] = rng.choice([rng.randrange(256), 0x20, ord("."), 0xFF, 0xC3, old ^ 1])
    return f"{e.name}: {what} byte {i - start} {old} -> {data[i]}"


def _m_nested_array(data: bytearray, lay: GGUFLayout, rng: random.Random, *_: Any) -> str:
    arrays = [(e, f) for e in lay.kvs for f in e.fields if f.what == "value item type"]
    e, f = rng.choice(arrays)
    count = [g for g in e.fields if g.what == "value count"][0]
    struct.pack_into("<I", data, f.offset, _ARRAY)
    n = rng.choice([1, 2, 1 << 20, 1 << 40, (1 << 64) - 1])
    struct.pack_into("<Q", data, count.offset, n)
    return f"{e.name}: an array of {n} arrays"


def _m_drop_kv(data: bytearray, lay: GGUFLayout, rng: random.Random, *_: Any) -> str:
    e = rng.choice(lay.kvs)
    del data[e.start:e.end]
    struct.pack_into("<Q", data, 16, len(lay.kvs) - 1)
    return f"metadata {e.name} removed"


def _m_tensor_field(data: bytearray, lay: GGUFLayout, rng: random.Random, *_: Any) -> str:
    e = rng.choice(lay.tensors)
    fields = [f for f in e.fields if not f.what.startswith("name")]
    f = rng.choice(fields)
    if f.what == "type":
        old = f.value(data)
        new = rng.choice([0, 1, 2, 3, 6, 8, 12, 14, 15, 24, 30, 31, 99, 1 << 31])
        struct.pack_into("<I", data, f.offset, new)
        return f"tensor {e.name}: type {old} -> {new}"
    if f.what == "offset":
        old = f.value(data)
        other = rng.choice(lay.tensors)
        new = rng.choice([old + 32, old - 32, old + 1, 0, 1 << 40, (1 << 64) - 32,
                          [g for g in other.fields if g.what == "offset"][0].value(data)])
        struct.pack_into("<Q", data, f.offset, max(new, 0))
        return f"tensor {e.name}: offset {old} -> {max(new, 0)}"
    return f"tensor {e.name}: {_set_field(data, f, rng)}"


def _m_swap_dims(data: bytearray, lay: GGUFLayout, rng: random.Random, *_: Any) -> str:
    e = rng.choice([t for t in lay.tensors
                    if sum(f.what.startswith("dimension ") for f in t.fields) >= 2])
    d0, d1 = [f for f in e.fields if f.what.startswith("dimension ")][:2]
    a, b = d0.value(data), d1.value(data)
    struct.pack_into("<Q", data, d0.offset, b)
    struct.pack_into("<Q", data, d1.offset, a)
    return f"tensor {e.name}: dimensions swapped ({a}, {b}) -> ({b}, {a})"


def _m_drop_tensor(data: bytearray, lay: GGUFLayout, rng: random.Random, *_: Any) -> str:
    e = rng.choice(lay.tensors)
    del data[e.start:e.end]  # NOTE: the data then starts earlier than the offsets assume
    struct.pack_into("<Q", data, 8, len(lay.tensors) - 1)
    return f"tensor {e.name} removed from the table"


def _m_rename_tensor(data: bytearray, lay: GGUFLayout, rng: random.Random, *_: Any) -> str:
    """A tensor hidden (its name changed, the layout kept) or moved to another layer."""
    e = rng.choice(lay.tensors)
    start = e.strings[0][0]
    if e.name.startswith("blk.1.") and rng.random() < 0.6:
        data[start + 4] = rng.choice([ord("0"), ord("2"), ord("7")])
        return f"tensor {e.name} renamed to layer {chr(data[start + 4])}"
    data[start] = ord("x")
    return f"tensor {e.name} renamed to x{e.name[1:]}"


def _m_data(data: bytearray, lay: GGUFLayout, rng: random.Random, *_: Any) -> str:
    name = rng.choice(list(lay.spans))
    start, end = lay.spans[name]
    flips = []
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(start, end)
        data[i] = rng.choice([0xFF, 0x7F, 0x7C, 0x00, rng.randrange(256)])
        flips.append(f"{i - start}={data[i]}")
    return f"tensor {name} data bytes {', '.join(flips)}"


def _m_truncate(data: bytearray, lay: GGUFLayout, rng: random.Random, *_: Any) -> str:
    cut = rng.choice([rng.randrange(len(data)), rng.randrange(lay.data_start),
                      len(data) - rng.randint(1, 64)])
    del data[cut:]
    return f"truncated to {cut} bytes"


def _m_random_bytes(data: bytearray, lay: GGUFLayout, rng: random.Random, *_: Any) -> str:
    flips = []
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(lay.data_start if rng.random() < 0.8 else len(data))
        data[i] = rng.randrange(256)
        flips.append(f"{i}={data[i]}")
    return f"bytes {', '.join(flips)}"


# kind -> (weight, mutator)
_GGUF_KINDS: dict[str, tuple[float, Callable[..., str]]] = {
    "header": (1, _m_header), "config value": (4, _m_config_value),
    "metadata field": (4, _m_kv_field), "string bytes": (2, _m_string_bytes),
    "nested array": (1, _m_nested_array), "drop metadata": (1, _m_drop_kv),
    "tensor field": (4, _m_tensor_field), "swap dims": (2, _m_swap_dims),
    "drop tensor": (1, _m_drop_tensor), "rename tensor": (1, _m_rename_tensor),
    "data": (3, _m_data), "truncate": (1, _m_truncate), "random bytes": (2, _m_random_bytes),
}


# -- safetensors directories ------------------------------------------------------------------

_CONFIG_KEYS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta",
                "max_position_embeddings", "tie_word_embeddings", "model_type", "hidden_act",
                "rope_scaling", "rope_parameters", "attention_bias"]


def _odd_json_value(rng: random.Random, old: Any) -> Any:
    if isinstance(old, bool) or not isinstance(old, (int, float)):
        base: list[Any] = []
    elif isinstance(old, int):
        base = [old // 2, old * 2, old + 1, old - 1, 32, 1, 0, -1, 1 << 31, 1 << 63, 10 ** 30,
                float(old)]
    else:
        base = [old * 2, old / 2, 0.0, -1.0, 1e300, float("nan"), float("inf")]
    odd = [None, True, "32", [32], {"a": 1}, "llama", "gelu",
           {"rope_type": "llama3", "factor": 0.0}, {"rope_type": "yarn"},
           {"rope_type": "linear", "factor": -2.0}, {"rope_type": "llama3", "factor": 8.0,
                                                     "low_freq_factor": 4.0,
                                                     "high_freq_factor": 4.0}]
    return rng.choice(base * 3 + odd) if base else rng.choice(odd)


def _st_config(files: dict[str, bytes], rng: random.Random) -> str:
    cfg = json.loads(files["config.json"])
    key = rng.choice(_CONFIG_KEYS)
    if key in cfg and rng.random() < 0.15:
        del cfg[key]
        files["config.json"] = json.dumps(cfg).encode()
        return f"config.json: {key} removed"
    old = cfg.get(key)
    cfg[key] = new = _odd_json_value(rng, old)
    files["config.json"] = json.dumps(cfg).encode()  # NaN and Infinity as JSON's extensions
    return f"config.json: {key} {old!r} -> {new!r}"


def _st_config_text(files: dict[str, bytes], rng: random.Random) -> str:
    text = files["config.json"]
    choice = rng.randrange(4)
    if choice == 0:
        cut = rng.randrange(len(text))
        files["config.json"] = text[:cut]
        return f"config.json truncated to {cut} bytes"
    if choice == 1:
        files["config.json"] = b"[" * 100000 + b"]" * 100000
        return "config.json nested 100000 deep"
    if choice == 2:
        files["config.json"] = text.rstrip()[:-1] + b', "hidden_size": 32}'
        return "config.json: hidden_size given twice"
    i = rng.randrange(len(text))
    d = bytearray(text)
    d[i] = rng.randrange(256)
    files["config.json"] = bytes(d)
    return f"config.json byte {i} -> {d[i]}"


def _split_safetensors(raw: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack_from("<Q", raw, 0)
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _join_safetensors(header: dict[str, Any], body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def _st_header(files: dict[str, bytes], rng: random.Random) -> str:
    header, body = _split_safetensors(files["model.safetensors"])
    names = [k for k in header if k != "__metadata__"]
    name = rng.choice(names)
    entry = header[name]
    choice = rng.randrange(7)
    if choice == 0:
        old = entry["dtype"]
        entry["dtype"] = rng.choice(["F32", "F16", "BF16", "F64", "I8", "U8", "BOOL", "I64",
                                     "F8_E4M3", "", 5, None])
        what = f"dtype {old} -> {entry['dtype']!r}"
    elif choice == 1:
        old = list(entry["shape"])
        shape = list(old)
        op = rng.randrange(5)
        if op == 0 and len(shape) >= 2:
            shape[0], shape[1] = shape[1], shape[0]
        elif op == 1:
            shape = shape[:-1] if len(shape) > 1 else shape + [1]
        elif op == 2:
            i = rng.randrange(len(shape))
            shape[i] = rng.choice([0, 1, 32, shape[i] // 2, shape[i] * 2, -1, 1 << 40,
                                   1.5, "64", True])
        elif op == 3:
            shape = [int(s) for s in shape] + [1]
        else:
            shape = [shape[0] * shape[-1]] if len(shape) == 2 else [shape[0] // 2, 2]
        entry["shape"] = shape
        what = f"shape {old} -> {shape}"
    elif choice == 2:
        old = list(entry["data_offsets"])
        other = header[rng.choice(names)]["data_offsets"]
        new = rng.choice([[old[0] + 4, old[1] + 4], [old[0] - 4, old[1] - 4], list(other),
                          [old[1], old[0]], [0, old[1] - old[0]], [old[0], 1 << 62],
                          [-1, old[1]], [old[0]], [str(old[0]), old[1]]])
        entry["data_offsets"] = new
        what = f"data_offsets {old} -> {new}"
    elif choice == 3:
        del header[name]
        what = "entry removed"
    elif choice == 4:
        new_name = name.replace("layers.1.", "layers.2.").replace("layers.0.", "layers.5.")
        if new_name == name:
            new_name = name + ".extra"
        header[new_name] = header.pop(name)
        what = f"renamed to {new_name}"
    elif choice == 5:
        header["__metadata__"] = rng.choice([[1], "pt", {"format": 1}, None])
        what = f"__metadata__ -> {header['__metadata__']!r}"
    else:
        header[name] = rng.choice([[], "x", None, {"dtype": "F32"}])
        what = f"entry -> {header[name]!r}"
    files["model.safetensors"] = _join_safetensors(header, body)
    return f"model.safetensors {name}: {what}"


def _st_raw(files: dict[str, bytes], rng: random.Random) -> str:
    raw = bytearray(files["model.safetensors"])
    (n,) = struct.unpack_from("<Q", raw, 0)
    choice = rng.randrange(4)
    if choice == 0:
        new = rng.choice([0, 1, n - 1, n + 1, len(raw), 1 << 40, (1 << 64) - 1])
        struct.pack_into("<Q", raw, 0, new)
        what = f"header length {n} -> {new}"
    elif choice == 1:
        cut = rng.randrange(len(raw))
        del raw[cut:]
        what = f"truncated to {cut} bytes"
    elif choice == 2:
        flips = []
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(8 + n, len(raw))
            raw[i] = rng.choice([0xFF, 0x7F, 0x80, rng.randrange(256)])
            flips.append(f"{i}={raw[i]}")
        what = f"data bytes {', '.join(flips)}"
    else:
        i = rng.randrange(8, 8 + n)
        raw[i] = rng.randrange(256)
        what = f"header byte {i} -> {raw[i]}"
    files["model.safetensors"] = bytes(raw)
    return f"model.safetensors: {what}"


def _st_index(files: dict[str, bytes], rng: random.Random) -> str:
    index = rng.choice([b"{", b"[]", b'{"weight_map": 3}',
                        b'{"weight_map": {"a": "../config.json"}}',
                        b'{"weight_map": {"model.norm.weight": "missing.safetensors"}}',
                        b'{"weight_map": {"x": "model.safetensors"}}'])
    files["model.safetensors.index.json"] = index
    return f"model.safetensors.index.json = {index.decode()}"


_ST_KINDS: dict[str, tuple[float, Callable[[dict[str, bytes], random.Random], str]]] = {
    "config value": (5, _st_config), "config text": (1, _st_config_text),
    "header": (5, _st_header), "raw": (3, _st_raw), "index": (1, _st_index),
}


def safetensors_mutations(name: str, path: str, rng: random.Random) -> Iterator[Mutation]:
    """An endless stream of seeded mutations of the safetensors directory at ``path``."""
    base: dict[str, bytes] = {}
    for fn in sorted(os.listdir(path)):
        with open(os.path.join(path, fn), "rb") as fh:
            base[fn] = fh.read()
    while True:
        files = dict(base)
        kind = rng.choices(list(_ST_KINDS), weights=[w for w, _ in _ST_KINDS.values()])[0]
        desc = _ST_KINDS[kind][1](files, rng)

        def write(folder: str, files: dict[str, bytes] = files) -> str:
            d = os.path.join(folder, "model")
            if os.path.isdir(d):
                shutil.rmtree(d)
            os.makedirs(d)
            for fn, content in files.items():
                with open(os.path.join(d, fn), "wb") as fh:
                    fh.write(content)
            return d

        yield Mutation(name, f"{kind}: {desc}", write)


# -- consistent models of unusual sizes -------------------------------------------------------

_FLOAT_TYPES = ["F32", "F16", "BF16"]
_BLOCK_TYPES = ["Q8_0", "Q4_0", "Q4_1"]


def random_shapes(name: str, rng: random.Random) -> Iterator[Mutation]:
    """Consistent tiny GGUF models of random sizes and weight types (a file may be hostile and
    still agree with itself): each must load and agree with the reference, or be refused."""
    from .tiny_files import TinyShape, write_gguf

    while True:
        heads = rng.choice([1, 2, 3, 4, 6, 8])
        head_dim = rng.choice([4, 8, 12, 16, 24, 32, 64, 128, 256])
        while rng.random() < 0.9 and heads * head_dim % 32:  # mostly sizes clops can run
            heads, head_dim = rng.choice([1, 2, 3, 4, 6, 8]), rng.choice([8, 16, 32, 64])
        kv = rng.choice([d for d in range(1, heads + 1) if heads % d == 0])
        ffn = rng.choice([32, 64, 96, 160])
        dim = rng.choice([32, 64, 96, 128])

        def types(k: int) -> str:  # a block type needs rows that split into blocks of 32
            return rng.choice(_FLOAT_TYPES + (_BLOCK_TYPES if k % 32 == 0 else []))

        layer_types = tuple((types(dim), types(heads * head_dim), types(dim), types(ffn))
                            for _ in range(rng.randint(1, 2)))
        sh = TinyShape(dim=dim, layers=rng.randint(1, 3), heads=heads, kv_heads=kv,
                       head_dim=head_dim, ffn=ffn, embed_type=types(dim),
                       output_type=rng.choice([None, types(dim)]), layer_types=layer_types,
                       rope_freqs=rng.random() < 0.3, qkv_bias=rng.random() < 0.5,
                       alignment=rng.choice([None, 8, 64, 256]))
        arch = rng.choice(["llama", "qwen2"])
        seed = rng.randrange(1 << 30)

        def write(folder: str, sh: TinyShape = sh, arch: str = arch, seed: int = seed) -> str:
            return write_gguf(os.path.join(folder, "model.gguf"), arch, seed, shape=sh)

        what = (f"shapes: {arch} dim {dim}, {sh.layers} layers, {heads} heads of {head_dim} "
                f"({kv} KV), ffn {ffn}, types {sh.embed_type}/{sh.output_type}/"
                f"{layer_types}, bias {sh.qkv_bias}, align {sh.alignment}")
        yield Mutation(name, what, write)


def mutations(name: str, path: str, rng: random.Random) -> Iterator[Mutation]:
    """Mutations of the base model ``name`` at ``path`` (a GGUF file or a safetensors folder;
    "shapes": consistent models of random sizes, which need no base)."""
    if path == "shapes":
        return random_shapes(name, rng)
    if os.path.isdir(path):
        return safetensors_mutations(name, path, rng)
    return gguf_mutations(name, path, rng)


# -- targeted edits (the reproductions of known bugs) ----------------------------------------

def kv_field(lay: GGUFLayout, key: str, what: str = "value") -> Field:
    """The field ``what`` ("value", "type", "value item type", "value count") of metadata
    ``key``."""
    entry = next(e for e in lay.kvs if e.name == key)
    return next(f for f in entry.fields if f.what == what)


def tensor_dims(lay: GGUFLayout, name: str) -> list[Field]:
    entry = next(e for e in lay.tensors if e.name == name)
    return [f for f in entry.fields if f.what.startswith("dimension ")]


def edited_gguf(base: str, path: str, what: str,
                edit: Callable[[bytearray, GGUFLayout], None]) -> Mutation:
    """The GGUF file at ``path`` with ``edit`` applied to its bytes (read when written)."""

    def write(folder: str) -> str:
        with open(path, "rb") as fh:
            data = bytearray(fh.read())
        edit(data, scan_gguf(bytes(data)))
        out = os.path.join(folder, "model.gguf")
        with open(out, "wb") as fh:
            fh.write(data)
        return out

    return Mutation(base, what, write)


def set_kv(key: str, value: Any, what: str = "value") -> Callable[[bytearray, GGUFLayout], None]:
    """An edit: field ``what`` of metadata ``key`` set to ``value``."""

    def edit(data: bytearray, lay: GGUFLayout) -> None:
        f = kv_field(lay, key, what)
        struct.pack_into("<" + f.code, data, f.offset, value)

    return edit


def swap_dims(name: str) -> Callable[[bytearray, GGUFLayout], None]:
    """An edit: the first two dimensions of tensor ``name`` swapped (the same byte count)."""

    def edit(data: bytearray, lay: GGUFLayout) -> None:
        d0, d1 = tensor_dims(lay, name)[:2]
        a, b = d0.value(data), d1.value(data)
        struct.pack_into("<Q", data, d0.offset, b)
        struct.pack_into("<Q", data, d1.offset, a)

    return edit


def set_string_byte(key: str, index: int, byte: int) -> Callable[[bytearray, GGUFLayout], None]:
    """An edit: the first byte of string ``index`` of the array ``key`` set to ``byte``."""

    def edit(data: bytearray, lay: GGUFLayout) -> None:
        entry = next(e for e in lay.kvs if e.name == key)
        start, _, _ = entry.strings[1 + index]  # strings[0] is the key
        data[start] = byte

    return edit


def edited_safetensors_dir(base: str, path: str, what: str,
                           edit: Callable[[dict[str, bytes]], None]) -> Mutation:
    """The safetensors directory at ``path`` with ``edit`` applied to its files' bytes."""

    def write(folder: str) -> str:
        files = {}
        for fn in sorted(os.listdir(path)):
            with open(os.path.join(path, fn), "rb") as fh:
                files[fn] = fh.read()
        edit(files)
        d = os.path.join(folder, "model")
        os.makedirs(d, exist_ok=True)
        for fn, content in files.items():
            with open(os.path.join(d, fn), "wb") as fh:
                fh.write(content)
        return d

    return Mutation(base, what, write)
