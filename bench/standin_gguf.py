"""Benchmark helper: a stand-in for a GGUF model file that is too large to carry to a machine.

``skeleton`` keeps the file's header (metadata, tokenizer, tensor table) and drops the tensor
data; ``fill`` writes a complete GGUF from a skeleton, with random weights of the same types and
shapes (so the same bytes move per token as with the real file).

    python bench/standin_gguf.py skeleton model.gguf model.skel.npz
    python bench/standin_gguf.py fill model.skel.npz out.gguf
"""

from __future__ import annotations

import argparse
import os

import numpy as np

# bytes per block, values per block
_BLOCKS = {"F32": (4, 1), "F16": (2, 1), "Q4_0": (18, 32), "Q4_1": (20, 32), "Q8_0": (34, 32)}


def skeleton(src: str, dst: str) -> None:
    """Save the header of ``src`` and its tensor table (name, type, offset, bytes)."""
    from gguf import GGUFReader

    r = GGUFReader(src)
    with open(src, "rb") as f:
        head = f.read(r.data_offset)
    rows = [(t.tensor_type.name, int(t.data_offset) - r.data_offset, int(t.n_bytes))
            for t in r.tensors]
    size = os.path.getsize(src) - r.data_offset
    np.savez(dst, head=np.frombuffer(head, np.uint8), size=np.int64(size),
             types=np.array([t for t, _, _ in rows]),
             offsets=np.array([o for _, o, _ in rows], np.int64),
             nbytes=np.array([n for _, _, n in rows], np.int64))


def _random_blocks(kind: str, nbytes: int, rng: np.random.Generator) -> bytes:
    bsize, _ = _BLOCKS[kind]
    n = nbytes // bsize
    if kind == "F32":
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32).tobytes()
    if kind == "F16":
        return (0.05 * rng.standard_normal(n)).astype(np.float16).tobytes()
    raw = rng.integers(0, 256, (n, bsize), dtype=np.uint8)
    if kind == "Q8_0":
        raw[:, :2] = np.full((n, 1), 0.0008, np.float16).view(np.uint8)
    elif kind == "Q4_0":
        raw[:, :2] = np.full((n, 1), 0.012, np.float16).view(np.uint8)
    else:  # Q4_1: scale, min
        raw[:, :2] = np.full((n, 1), 0.012, np.float16).view(np.uint8)
        raw[:, 2:4] = np.full((n, 1), -0.09, np.float16).view(np.uint8)
    return raw.tobytes()


def fill(skel: str, dst: str, seed: int = 0) -> None:
    """Write a GGUF with the header of ``skel`` and random tensor data of the same types."""
    s = np.load(skel)
    rng = np.random.default_rng(seed)
    data = bytearray(int(s["size"]))
    for kind, off, nb in zip(s["types"], s["offsets"], s["nbytes"], strict=True):
        if str(kind) not in _BLOCKS:
            raise ValueError(f"tensor type {kind} is not supported here")
        data[off:off + nb] = _random_blocks(str(kind), int(nb), rng)
    with open(dst, "wb") as f:
        f.write(s["head"].tobytes())
        f.write(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("mode", choices=["skeleton", "fill"])
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args()
    (skeleton if a.mode == "skeleton" else fill)(a.src, a.dst)


if __name__ == "__main__":
    main()
