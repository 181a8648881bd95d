"""Gemma 2 and 3 27B keep an attention scale of 1 / sqrt(dim / heads) (their
query_pre_attn_scalar, 144 and 168) where their other sizes take 1 / sqrt(head_dim); their
GGUF files do not hold it, and the loader knows the 27B model by its layer count, as
llama.cpp's does."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("transformers")

from clops.llm import config  # noqa: E402
from clops.llm.gguf_file import GGUFFile  # noqa: E402

from .families import make  # noqa: E402

LAYERS_27B = {"gemma2": 46, "gemma3": 62}


@pytest.fixture(scope="module", params=list(LAYERS_27B))
def gemma(request, tmp_path_factory):
    name = request.param
    _, _, gguf_path = make(name, str(tmp_path_factory.mktemp(f"scale_{name}")))
    f = GGUFFile(gguf_path)
    meta = dict(f.metadata)
    p = f"{name}."
    # heads of twice the width dim / heads gives: the two scales differ
    meta[p + "attention.key_length"] = meta[p + "attention.value_length"] = \
        2 * meta[p + "embedding_length"] // meta[p + "attention.head_count"]
    return name, meta, set(f.tensors)


def test_the_27b_layer_count_takes_dim_over_heads(gemma):
    name, meta, names = gemma
    p = f"{name}."
    meta = {**meta, p + "block_count": LAYERS_27B[name]}
    cfg = config.from_gguf(meta, names, "m.gguf")
    want = (cfg.dim / cfg.n_heads) ** -0.5
    assert want != 1 / math.sqrt(cfg.head_dim)
    assert cfg.scale == pytest.approx(want, rel=1e-12)


def test_other_layer_counts_take_the_head_width(gemma):
    name, meta, names = gemma
    cfg = config.from_gguf(meta, names, "m.gguf")
    assert cfg.n_layers != LAYERS_27B[name]
    assert cfg.scale == pytest.approx(1 / math.sqrt(cfg.head_dim), rel=1e-12)


def test_a_file_that_says_its_scale_keeps_it(gemma):
    name, meta, names = gemma
    p = f"{name}."
    meta = {**meta, p + "block_count": LAYERS_27B[name], p + "attention.scale": 0.125}
    assert config.from_gguf(meta, names, "m.gguf").scale == 0.125
