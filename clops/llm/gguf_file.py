"""llm, GGUF files: a strict reader of the format (header, metadata, tensor table, aligned data),
memory-mapped. Every count, length, type, dimension and offset is checked against a bound and
against the bytes present before anything is allocated for it, so a malformed, truncated or
hostile file raises ``ModelFileError`` naming the key or tensor, what was expected and what was
found, instead of looping, growing memory or reading out of bounds."""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..nn.quant import (
    BLOCKS,
    GGML_BF16,
    GGML_F16,
    GGML_F32,
    SUPPORTED,
    SUPPORTED_NAMES,
    PackedWeight,
    pack_ggml,
)

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)

# Metadata value types (the numbers are the format's): scalar type -> (struct code, name).
T_STRING, T_ARRAY, T_BOOL = 8, 9, 7
SCALARS: dict[int, tuple[str, str]] = {
    0: ("B", "uint8"), 1: ("b", "int8"), 2: ("H", "uint16"), 3: ("h", "int16"),
    4: ("I", "uint32"), 5: ("i", "int32"), 6: ("f", "float32"), 7: ("?", "bool"),
    10: ("Q", "uint64"), 11: ("q", "int64"), 12: ("d", "float64"),
}
TYPE_NAMES = {**{t: name for t, (_, name) in SCALARS.items()}, T_STRING: "string",
              T_ARRAY: "array"}
# the fewest bytes one value of a type takes in the file: a string is its 8-byte length at
# least, an array its 4-byte item type and 8-byte count
MIN_BYTES = {**{t: struct.calcsize("<" + c) for t, (c, _) in SCALARS.items()}, T_STRING: 8,
             T_ARRAY: 12}

# GGML tensor types (the numbers are the format's): type -> (name, values per block, bytes per
# block). clops computes with the ones in ``nn.quant.SUPPORTED``; the others are sized so that
# their place in the file can be checked, and fail only if the model uses them.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

# Bounds on what a file may ask for. Real models stay far inside them: the longest metadata
# string is a chat template (tens of KiB), the longest arrays a vocabulary and its merges
# (a few hundred thousand), no model nests arrays.
MAX_ENTRIES = 1 << 16  # metadata entries, and tensors (a real model has hundreds to thousands)
MAX_KEY_BYTES = 65535  # the format's own limit
MAX_STRING_BYTES = 16 << 20
MAX_ARRAY_VALUES = 1 << 22
MAX_METADATA_VALUES = 1 << 23  # over all arrays of the file together
MAX_ARRAY_DEPTH = 4  # an array of arrays is depth 2
MAX_TENSOR_NAME_BYTES = 1024
MAX_DIMS = 4  # GGML's
DEFAULT_ALIGNMENT = 32
# A model split by llama.cpp's gguf-split (or the gguf package's writer): files
# ``<name>-00001-of-00003.gguf``..., each with these keys; the first holds the metadata.
SPLIT_NAME = re.compile(r"(.*)-([0-9]{5})-of-([0-9]{5})\.gguf")
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
MAX_SPLITS = 9999
_UNSIGNED = (0, 2, 4, 10)  # uint8, uint16, uint32, uint64
_INTEGER = (*_UNSIGNED, 1, 3, 5, 11)


def split_paths(path: str, count: int) -> list[str]:
    """The files of a model split in ``count`` whose one file is ``path``, in order."""
    m = SPLIT_NAME.fullmatch(os.path.basename(path))
    if m is None:
        raise ModelFileError(
            f"{path}: one of {count} splits of a model (split.count), but its name is not "
            "<name>-0000k-of-0000n.gguf, so the other files cannot be found (keep the names "
            "llama.cpp's gguf-split gave them)")
    if int(m.group(3)) != count:
        raise ModelFileError(f"{path}: its name says {int(m.group(3))} splits, its metadata "
                             f"split.count {count}")
    folder = os.path.dirname(path)
    return [os.path.join(folder, f"{m.group(1)}-{k:05d}-of-{count:05d}.gguf")
            for k in range(1, count + 1)]


class ModelFileError(ValueError):
    """A model file is malformed, truncated, or describes something clops cannot run."""


@dataclass
class GGUFTensor:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # row-major (outer first): [n, k] for a weight
    data: np.ndarray  # the tensor's raw bytes (uint8), memory-mapped
    offset: int = 0  # of the data from the start of the file


class _TensorInfo(NamedTuple):
    """An entry of the tensor table; ``offset`` is from the start of the data section."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def ggml_type_name(ggml_type: int) -> str:
    known = GGML_TYPES.get(ggml_type)
    return known[0] if known else f"unknown type {ggml_type}"


class _Cursor:
    """Reads little-endian fields in order, each checked against the bytes left."""

    def __init__(self, buf: Any, size: int, path: str) -> None:
        self.buf, self.size, self.path, self.pos = buf, size, path, 0
        self.values_left = MAX_METADATA_VALUES

    def fail(self, what: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: {what}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"{what} at byte {self.pos} needs {n} bytes, but the file ends at "
                            f"byte {self.size} (truncated or corrupt)")

    def scalar(self, code: str, what: str) -> Any:
        n = struct.calcsize("<" + code)
        self.need(n, what)
        (v,) = struct.unpack_from("<" + code, self.buf, self.pos)
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return int(self.scalar("I", what))

    def u64(self, what: str) -> int:
        return int(self.scalar("Q", what))

    def string(self, what: str, limit: int) -> str:
        n = self.u64(f"the length of {what}")
        if n > limit:
            raise self.fail(f"{what} is {n} bytes long, more than the {limit} allowed "
                            "(corrupt length)")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 ({e})") from None

    def value(self, vtype: int, key: str, depth: int = 1) -> Any:
        """One metadata value of type ``vtype`` (arrays as lists, nested ones as lists of lists)."""
        where = f"metadata {key!r}"
        scalar = SCALARS.get(vtype)
        if scalar is not None:
            if vtype == T_BOOL:
                b = self.scalar("B", where)
                if b > 1:
                    raise self.fail(f"{where}: a bool holds {b}, expected 0 or 1")
                return bool(b)
            return self.scalar(scalar[0], where)
        if vtype == T_STRING:
            return self.string(where, MAX_STRING_BYTES)
        if vtype != T_ARRAY:
            raise self.fail(f"{where}: value type {vtype} is not a GGUF type "
                            f"(0-{max(TYPE_NAMES)})")
        if depth > MAX_ARRAY_DEPTH:
            raise self.fail(f"{where}: arrays nested {depth} deep, more than the "
                            f"{MAX_ARRAY_DEPTH} allowed")
        itype = self.u32(f"the item type of {where}")
        count = self.u64(f"the length of {where}")
        if itype not in TYPE_NAMES:
            raise self.fail(f"{where}: array item type {itype} is not a GGUF type "
                            f"(0-{max(TYPE_NAMES)})")
        left = self.size - self.pos
        if count > MAX_ARRAY_VALUES or count * MIN_BYTES[itype] > left:
            raise self.fail(
                f"{where}: an array of {count} {TYPE_NAMES[itype]} values, but at most "
                f"{min(MAX_ARRAY_VALUES, left // MIN_BYTES[itype])} fit (the {left} bytes "
                f"left in the file; at most {MAX_ARRAY_VALUES} values an array)")
        self.values_left -= count
        if self.values_left < 0:
            raise self.fail(f"{where}: the metadata holds more than {MAX_METADATA_VALUES} "
                            "array values in all")
        if itype in SCALARS:
            code = SCALARS[itype][0]
            dtype = np.dtype("<" + ("u1" if itype == T_BOOL else code))
            arr = np.frombuffer(self.buf, dtype, count, self.pos)
            self.pos += count * dtype.itemsize
            if itype == T_BOOL:
                if count and int(arr.max()) > 1:
                    raise self.fail(f"{where}: a bool holds {int(arr.max())}, expected 0 or 1")
                return arr.astype(bool).tolist()
            return arr.tolist()
        return [self.value(itype, f"{key}[{i}]", depth + 1) for i in range(count)]


class GGUFFile:
    """A GGUF file opened read-only: ``metadata`` (key -> Python value) and ``tensors``.

    A split model (``name-00001-of-00003.gguf``, ...) opened by any of its files is the whole
    model: the metadata of the first file, the tensors of all (``whole=False``: this file's
    alone). ``paths``: the files read.

    >>> f = GGUFFile("model.gguf")
    >>> f.metadata["general.architecture"]
    'llama'
    """

    version: int

    def __init__(self, path: str, whole: bool = True) -> None:
        self.path = path
        self.paths = [path]
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no GGUF file at {path}")
        size = os.path.getsize(path)
        if size < 24:
            raise ModelFileError(f"{path}: truncated GGUF header ({size} bytes, at least 24 "
                                 "expected)")
        with open(path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        cur = _Cursor(self._map, size, path)
        self._read_header(cur)
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, int] = {}
        for i in range(self.n_kv):
            key = cur.string(f"the key of metadata entry {i}", MAX_KEY_BYTES)
            if key in self.metadata:
                raise ModelFileError(f"{path}: metadata key {key!r} appears twice")
            vtype = cur.u32(f"the type of metadata {key!r}")
            self.metadata[key] = cur.value(vtype, key)
            self.metadata_types[key] = vtype
        infos = [self._read_tensor_info(cur, i) for i in range(self.n_tensors)]
        self.alignment = self._alignment()
        start = -(-cur.pos // self.alignment) * self.alignment
        if infos and start > size:
            raise ModelFileError(f"{path}: the tensor data would start at byte {start}, past "
                                 f"the end of the {size}-byte file (truncated)")
        self.data_offset = start
        self.tensors: dict[str, GGUFTensor] = {}
        for name, ggml_type, shape, offset, nbytes in infos:
            if name in self.tensors:
                raise ModelFileError(f"{path}: tensor {name} appears twice in the tensor table")
            if offset % self.alignment:
                raise ModelFileError(
                    f"{path}: tensor {name} has data offset {offset}, expected a multiple of "
                    f"the alignment {self.alignment}")
            begin = start + offset
            if begin + nbytes > size:
                raise ModelFileError(
                    f"{path}: tensor {name} ({ggml_type_name(ggml_type)} {list(shape)}, "
                    f"{nbytes} bytes) lies at bytes [{begin}, {begin + nbytes}), past the end "
                    f"of the {size}-byte file (truncated or corrupt)")
            data = np.frombuffer(self._map, np.uint8, nbytes, begin)
            self.tensors[name] = GGUFTensor(name, ggml_type, shape, data, begin)
        self._check_overlaps()
        self.split = self._split_keys()
        if whole and self.split is not None:
            self._join_splits(*self.split)

    def _split_keys(self) -> tuple[int, int, int] | None:
        """(split.no, split.count, split.tensors.count) of a split model's file, checked; None
        for a file that is the whole model."""
        if SPLIT_COUNT not in self.metadata:
            if SPLIT_NO in self.metadata or SPLIT_TENSORS in self.metadata:
                raise ModelFileError(f"{self.path}: has {SPLIT_NO} or {SPLIT_TENSORS} but no "
                                     f"{SPLIT_COUNT}")
            return None
        values = []
        for key, types, low, high in (
                (SPLIT_NO, _UNSIGNED, 0, MAX_SPLITS - 1), (SPLIT_COUNT, _UNSIGNED, 1, MAX_SPLITS),
                (SPLIT_TENSORS, _INTEGER, 0, MAX_ENTRIES * MAX_SPLITS)):
            v, vtype = self.metadata.get(key), self.metadata_types.get(key)
            if vtype not in types or not isinstance(v, int) or not low <= v <= high:
                raise ModelFileError(
                    f"{self.path}: metadata {key!r} is {v!r} "
                    f"({TYPE_NAMES.get(vtype, 'missing') if vtype is not None else 'missing'}), "
                    f"expected an integer in [{low}, {high}]")
            values.append(v)
        no, count, total = values
        if no >= count:
            raise ModelFileError(f"{self.path}: split.no {no} of split.count {count} (they count "
                                 f"from 0)")
        return (no, count, total) if count > 1 else None

    def _join_splits(self, no: int, count: int, total: int) -> None:
        """The metadata of the first split and the tensors of every split, each checked to be
        one of the same model's."""
        paths = split_paths(self.path, count)
        if os.path.abspath(paths[no]) != os.path.abspath(self.path):
            raise ModelFileError(f"{self.path}: split.no {no} says it is "
                                 f"{os.path.basename(paths[no])}")
        parts: list[GGUFFile] = []
        for k, p in enumerate(paths):
            if k == no:
                parts.append(self)
                continue
            if not os.path.isfile(p):
                raise ModelFileError(
                    f"{self.path}: split {k + 1} of {count} of this model, {p}, is missing "
                    "(download every file of the split model into one folder)")
            part = GGUFFile(p, whole=False)
            if part.split is None or part.split != (k, count, total):
                raise ModelFileError(
                    f"{p}: split keys (split.no, split.count, split.tensors.count) are "
                    f"{part.split}, expected {(k, count, total)} beside {self.path}")
            parts.append(part)
        first = parts[0]
        self.metadata, self.metadata_types = first.metadata, first.metadata_types
        self.version = first.version
        tensors: dict[str, GGUFTensor] = {}
        for part in parts:
            for name, t in part.tensors.items():
                if name in tensors:
                    raise ModelFileError(f"{part.path}: tensor {name} is in another split of "
                                         "the model too")
                tensors[name] = t
        if len(tensors) != total:
            raise ModelFileError(
                f"{self.path}: the {count} splits hold {len(tensors)} tensors, but "
                f"split.tensors.count says {total}")
        self.tensors = tensors
        self.paths = paths
        self._parts = parts  # NOTE: the maps stay open while the model is

    def _read_header(self, cur: _Cursor) -> None:
        path = self.path
        magic = bytes(self._map[:4])
        if magic != GGUF_MAGIC:
            raise ModelFileError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        cur.pos = 4
        version = cur.u32("the version")
        if int.from_bytes(version.to_bytes(4, "little"), "big") in VERSIONS:
            raise ModelFileError(f"{path}: a big-endian GGUF file, which clops does not read "
                                 "(convert it to little-endian)")
        if version not in VERSIONS:
            raise ModelFileError(f"{path}: GGUF version {version} is not supported "
                                 f"({' or '.join(map(str, VERSIONS))})")
        self.version = version
        self.n_tensors: int = cur.u64("the tensor count")
        self.n_kv: int = cur.u64("the metadata count")
        # each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor
        # entry 8 (name length) + 4 (dims) + 8 (one dim) + 4 (type) + 8 (offset)
        left = cur.size - cur.pos
        if max(self.n_kv, self.n_tensors) > MAX_ENTRIES:
            raise ModelFileError(
                f"{path}: header claims {self.n_tensors} tensors and {self.n_kv} metadata "
                f"entries, expected at most {MAX_ENTRIES} of each (a corrupt count?)")
        if self.n_kv * 13 + self.n_tensors * 32 > left:
            raise ModelFileError(
                f"{path}: header claims {self.n_tensors} tensors and {self.n_kv} metadata "
                f"entries, more than the {left} bytes after it can hold (corrupt or truncated)")

    def _read_tensor_info(self, cur: _Cursor, i: int) -> _TensorInfo:
        name = cur.string(f"the name of tensor {i}", MAX_TENSOR_NAME_BYTES)
        where = f"tensor {name}"
        n_dims = cur.u32(f"the dimension count of {where}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ModelFileError(f"{self.path}: {where} has {n_dims} dimensions, expected 1 "
                                 f"to {MAX_DIMS}")
        dims = [cur.u64(f"dimension {d} of {where}") for d in range(n_dims)]
        ggml_type = cur.u32(f"the type of {where}")
        offset = cur.u64(f"the data offset of {where}")
        shape = tuple(reversed(dims))  # the file lists the innermost dimension first
        if any(d == 0 for d in dims):
            raise ModelFileError(f"{self.path}: {where} has shape {list(shape)}, with an empty "
                                 "dimension")
        if ggml_type not in GGML_TYPES:
            raise ModelFileError(f"{self.path}: {where} has GGML type {ggml_type}, which is "
                                 "not a type clops knows (corrupt, or a newer format)")
        tname, block, block_bytes = GGML_TYPES[ggml_type]
        if dims[0] % block:
            raise ModelFileError(
                f"{self.path}: {where} rows of {dims[0]} values do not split into {tname} "
                f"blocks of {block}")
        count = 1
        for d in dims:
            count *= d
        return _TensorInfo(name, ggml_type, shape, offset, count // block * block_bytes)

    def _alignment(self) -> int:
        key = "general.alignment"
        if key not in self.metadata:
            return DEFAULT_ALIGNMENT
        value, vtype = self.metadata[key], self.metadata_types[key]
        if vtype != 4 or value == 0 or value & (value - 1):
            raise ModelFileError(
                f"{self.path}: metadata {key!r} is {value!r} ({TYPE_NAMES[vtype]}), expected a "
                "uint32 power of two")
        return int(value)

    def _check_overlaps(self) -> None:
        spans = sorted((t.offset, t.offset + t.data.nbytes, t.name)
                       for t in self.tensors.values())
        for (_, end, name), (begin, end2, other) in zip(spans, spans[1:]):
            if begin < end:
                raise ModelFileError(
                    f"{self.path}: the data of tensors {name} and {other} overlap (bytes "
                    f"[{begin}, {min(end, end2)}) are in both)")

    def packed(self, name: str) -> PackedWeight:
        """Tensor ``name`` as a 2-D weight [n, k] in a device format."""
        t = self.tensors[name]
        if t.ggml_type not in SUPPORTED:
            raise ModelFileError(
                f"{self.path}: tensor {name} has GGML type {ggml_type_name(t.ggml_type)}, "
                f"which clops cannot compute with (supported: {', '.join(SUPPORTED_NAMES)})")
        k = t.shape[-1]
        n = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
        if t.ggml_type in BLOCKS and k % BLOCKS[t.ggml_type][0]:
            raise ModelFileError(f"{self.path}: tensor {name} rows of {k} values do not split "
                                 f"into blocks of {BLOCKS[t.ggml_type][0]}")
        return pack_ggml(t.data, t.ggml_type, n, k)

    def vector(self, name: str) -> np.ndarray:
        """A float tensor (norm weights, biases) as float32."""
        t = self.tensors[name]
        if t.ggml_type == GGML_F32:
            return t.data.view(np.float32).reshape(-1)
        if t.ggml_type == GGML_F16:
            return t.data.view(np.float16).astype(np.float32).reshape(-1)
        if t.ggml_type == GGML_BF16:
            return (t.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(-1)
        return self.packed(name).dequantize().reshape(-1)
