"""llm, GGUF files: metadata and tensors through the ``gguf`` package (memory-mapped), checked so
that a malformed or truncated file raises ``ModelFileError`` saying what is wrong."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..nn.quant import BLOCKS, FLOATS, SUPPORTED, PackedWeight, pack_ggml

GGUF_MAGIC = b"GGUF"


class ModelFileError(ValueError):
    """A model file is malformed, truncated, or describes something clops cannot run."""


@dataclass
class GGUFTensor:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # row-major (outer first): [n, k] for a weight
    data: np.ndarray  # raw bytes or values, memory-mapped


def _check_header(path: str) -> None:
    """Cheap sanity checks before the parser runs: magic, version, and counts that could fit
    in the file (a flipped bit in a count must not send the parser on a huge loop)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24:
        raise ModelFileError(f"{path}: truncated GGUF header ({size} bytes)")
    if head[:4] != GGUF_MAGIC:
        raise ModelFileError(f"{path}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3):
        raise ModelFileError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    # each tensor entry takes at least 8 (name length) + 4 + 8 + 4 + 8 bytes; each kv 8 + 4 + 1
    if n_tensors * 32 + n_kv * 13 > size:
        raise ModelFileError(
            f"{path}: header claims {n_tensors} tensors and {n_kv} metadata entries, more "
            f"than a {size}-byte file can hold (corrupt or truncated)")


def _value(field: Any) -> Any:
    v = field.contents()
    if isinstance(v, np.generic):
        v = v.item()
    return v


class GGUFFile:
    """A GGUF file opened read-only: ``metadata`` (key -> Python value) and ``tensors``.

    >>> f = GGUFFile("model.gguf")
    >>> f.metadata["general.architecture"]
    'llama'
    """

    def __init__(self, path: str) -> None:
        self.path = path
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no GGUF file at {path}")
        _check_header(path)
        try:
            from gguf import GGUFReader

            reader = GGUFReader(path, "r")
            self.metadata: dict[str, Any] = {}
            for key, field in reader.fields.items():
                if key.startswith("GGUF."):
                    continue
                self.metadata[key] = _value(field)
            self.tensors: dict[str, GGUFTensor] = {}
            for t in reader.tensors:
                shape = tuple(int(s) for s in reversed(t.shape.tolist()))
                self.tensors[t.name] = GGUFTensor(t.name, int(t.tensor_type), shape, t.data)
        except ModelFileError:
            raise
        except MemoryError:
            raise ModelFileError(f"{path}: corrupt GGUF (a size in it is absurdly large)") from None
        except Exception as e:  # noqa: BLE001 - the parser raises many types on bad input
            raise ModelFileError(
                f"{path}: malformed or truncated GGUF ({type(e).__name__}: {e})") from None
        self._reader = reader
        self._check_tensors()

    def _check_tensors(self) -> None:
        for t in self.tensors.values():
            if any(s <= 0 for s in t.shape):
                raise ModelFileError(f"{self.path}: tensor {t.name} has shape {t.shape}")
            count = int(np.prod(t.shape))
            if t.ggml_type in BLOCKS:
                bs, bb = BLOCKS[t.ggml_type]
                if t.shape[-1] % bs:
                    raise ModelFileError(
                        f"{self.path}: tensor {t.name} rows of {t.shape[-1]} values do not "
                        f"split into blocks of {bs}")
                want = count // bs * bb
            elif t.ggml_type in FLOATS:
                want = count * (4 if t.ggml_type == 0 else 2)
            else:
                continue  # an unsupported type fails only if the model uses the tensor
            if t.data.nbytes != want:
                raise ModelFileError(
                    f"{self.path}: tensor {t.name} holds {t.data.nbytes} bytes, expected "
                    f"{want} for shape {t.shape} (truncated file?)")

    def packed(self, name: str) -> PackedWeight:
        """Tensor ``name`` as a 2-D weight [n, k] in a device format."""
        t = self.tensors[name]
        if t.ggml_type not in SUPPORTED:
            raise ModelFileError(
                f"{self.path}: tensor {name} has GGML type {t.ggml_type}, which clops cannot "
                "compute with (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, F32, F16, BF16 are supported)")
        k = t.shape[-1]
        n = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
        return pack_ggml(np.asarray(t.data), t.ggml_type, n, k)

    def vector(self, name: str) -> np.ndarray:
        """A float tensor (norm weights, biases) as float32."""
        t = self.tensors[name]
        if t.ggml_type not in FLOATS:
            return self.packed(name).dequantize().reshape(-1)
        return self.packed(name).dequantize().reshape(-1) if t.ggml_type != 0 else np.asarray(
            t.data, dtype=np.float32).reshape(-1)
