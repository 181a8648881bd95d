"""llm, safetensors: a strict reader of the format (8-byte header length, JSON header, raw
little-endian data), memory-mapped. Nothing is unpickled; every size and offset is checked
against the file so a malformed or truncated file raises ``ModelFileError``."""

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
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ModelFileError(f"{path}: header is not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise ModelFileError(f"{path}: header is not a JSON object")
        self.metadata = header.pop("__metadata__", None)
        data_start, data_len = 8 + n, size - 8 - n
        self._entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            self._entries[name] = self._check_entry(name, info, data_len)
        self._map = np.memmap(path, np.uint8, "r", offset=data_start, shape=(data_len,)) \
            if data_len > 0 else np.zeros(0, np.uint8)

    def _check_entry(self, name: str, info: Any, data_len: int
                     ) -> tuple[str, tuple[int, ...], int, int]:
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise ModelFileError(f"{where}: entry is not an object")
        dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPES:
            raise ModelFileError(f"{where}: dtype {dtype!r} is not supported")
        if not isinstance(shape, list) or not all(
                isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 40
                for s in shape):
            raise ModelFileError(f"{where}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(
                isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise ModelFileError(f"{where}: bad data_offsets {offs!r}")
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
    try:
        with open(cfg_path, encoding="utf-8") as f:
            config = json.load(f)
    except OSError:
        raise ModelFileError(f"{path}: no config.json (not a Hugging Face model directory)"
                             ) from None
    except ValueError as e:
        raise ModelFileError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ModelFileError(f"{cfg_path}: not a JSON object")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError) as e:
            raise ModelFileError(f"{index}: malformed index ({e})") from None
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
            tensors[t] = sf
    return config, tensors
