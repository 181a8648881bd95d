"""llm, safetensors: a strict reader of the format (8-byte header length, JSON header, raw
little-endian data), memory-mapped, and of the JSON files beside it. Nothing is unpickled; every
size and offset is checked against the file, and no two tensors share bytes, so a malformed,
truncated or hostile file raises ``ModelFileError``."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np

from .gguf_file import ModelFileError

# dtype name -> (numpy dtype on the host, bytes); BF16 stays as uint16 bits.
DTYPES: dict[str, tuple[Any, int]] = {
    "F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2),
    "F64": (np.float64, 8), "I64": (np.int64, 8), "I32": (np.int32, 4), "I16": (np.int16, 2),
    "I8": (np.int8, 1), "U8": (np.uint8, 1), "BOOL": (np.bool_, 1),
}
MAX_HEADER = 100 << 20
MAX_JSON_FILE = 64 << 20  # config.json and the shard index: a few KiB in real models


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice")
        out[k] = v
    return out


def parse_json(text: str | bytes, where: str) -> Any:
    """JSON text, strictly: a key twice, or nesting too deep for the parser, is an error."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelFileError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:
        raise ModelFileError(f"{where}: JSON nested too deeply") from None


def read_json(path: str, what: str) -> Any:
    """A JSON file of at most MAX_JSON_FILE bytes; ``FileNotFoundError`` when it is absent."""
    size = os.path.getsize(path)
    if size > MAX_JSON_FILE:
        raise ModelFileError(f"{path}: {size} bytes, more than the {MAX_JSON_FILE} a {what} "
                             "may take")
    with open(path, "rb") as f:
        return parse_json(f.read(), path)


class SafetensorsFile:
    """One ``.safetensors`` file: ``tensors`` maps a name to (dtype name, shape, ndarray view).

    >>> f = SafetensorsFile("model.safetensors")
    >>> f.dtype("model.norm.weight"), f.shape("model.norm.weight")
    ('F32', (576,))
    """

    def __init__(self, path: str) -> None:
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelFileError(f"{path}: truncated safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise ModelFileError(
                    f"{path}: header length {n} does not fit the {size}-byte file "
                    "(not safetensors, or truncated)")
            raw = f.read(n)
        header = parse_json(raw, f"{path}: header")
        if not isinstance(header, dict):
            raise ModelFileError(f"{path}: header is not a JSON object")
        self.metadata = header.pop("__metadata__", None)
        if self.metadata is not None and not isinstance(self.metadata, dict):
            raise ModelFileError(f"{path}: __metadata__ is {type(self.metadata).__name__}, "
                                 "expected an object")
        data_start, data_len = 8 + n, size - 8 - n
        self._entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            self._entries[name] = self._check_entry(name, info, data_len)
        spans = sorted((start, end, name) for name, (_, _, start, end) in self._entries.items()
                       if end > start)
        for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
            if start < end:
                raise ModelFileError(f"{path}: the data of tensors {name!r} and {other!r} "
                                     f"overlap (both hold byte {start})")
        self._map = np.memmap(path, np.uint8, "r", offset=data_start, shape=(data_len,)) \
            if data_len > 0 else np.zeros(0, np.uint8)

    def _check_entry(self, name: str, info: Any, data_len: int
                     ) -> tuple[str, tuple[int, ...], int, int]:
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise ModelFileError(f"{where}: entry is not an object")
        dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        # NOTE: a list or object is unhashable, so test for a string before the lookup.
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ModelFileError(f"{where}: dtype {dtype!r} is not supported, expected one of "
                                 f"the strings {', '.join(DTYPES)}")
        if not isinstance(shape, list) or len(shape) > 8 or not all(
                isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 40
                for s in shape):
            raise ModelFileError(f"{where}: shape {shape!r}, expected a list of at most 8 "
                                 "integers in [0, 2^40)")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(
                isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise ModelFileError(f"{where}: data_offsets {offs!r}, expected [begin, end] "
                                 "integers")
        start, end = offs
        count = 1
        for s in shape:
            count *= s
        want = count * DTYPES[dtype][1]
        if not 0 <= start <= end <= data_len:
            raise ModelFileError(
                f"{where}: data [{start}, {end}) lies outside the {data_len} data bytes "
                "(truncated file?)")
        if end - start != want:
            raise ModelFileError(f"{where}: {end - start} bytes for {dtype}{shape}, "
                                 f"expected {want}")
        return dtype, tuple(shape), start, end

    def names(self) -> list[str]:
        return list(self._entries)

    def dtype(self, name: str) -> str:
        return self._entries[name][0]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def array(self, name: str) -> np.ndarray:
        """The tensor as a read-only numpy view (BF16 as uint16 bits)."""
        dtype, shape, start, end = self._entries[name]
        np_dtype = DTYPES[dtype][0]
        return self._map[start:end].view(np_dtype).reshape(shape)


def open_directory(path: str) -> tuple[dict[str, Any], dict[str, SafetensorsFile]]:
    """``config.json`` and every tensor of a Hugging Face model directory (single or sharded)."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ModelFileError(f"{path}: no config.json (not a Hugging Face model directory)")
    config = read_json(cfg_path, "config.json")
    if not isinstance(config, dict):
        raise ModelFileError(f"{cfg_path}: not a JSON object")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        data = read_json(index, "shard index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise ModelFileError(f"{index}: malformed index (expected a 'weight_map' object "
                                 "from tensor names to file names)")
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ModelFileError(f"{path}: no *.safetensors files (pickled .bin checkpoints are "
                             "not read: convert them to safetensors)")
    tensors: dict[str, SafetensorsFile] = {}
    for name in files:
        fp = os.path.join(path, os.path.basename(name))
        if not os.path.isfile(fp):
            raise ModelFileError(f"{path}: shard {name} is missing")
        sf = SafetensorsFile(fp)
        for t in sf.names():
            if t in tensors:
                raise ModelFileError(f"{path}: tensor {t!r} is in both {tensors[t].path} and "
                                     f"{fp}")
            tensors[t] = sf
    return config, tensors
