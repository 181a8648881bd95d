"""Model files that mix the GGUF weight types, as llama.cpp's mixes do (Q5_K_M-like: Q5_K, Q6_K,
Q5_0 and the other K types; one of IQ4_XS, IQ4_NL and MXFP4): their logits are a float32
model's of the file's dequantized weights (``gguf.quants.dequantize``, in transformers), and a
file with a type clops cannot compute with is refused by name before anything is uploaded."""

from __future__ import annotations

import numpy as np
import pytest

import clops
import clops.llm
from clops.nn.quant import SUPPORTED_NAMES

from ..fuzz.tiny_files import TinyShape, write_gguf

pytest.importorskip("transformers")

_SIZES = dict(dim=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512, context=256,
              rope_freqs=False)
MIXES = {
    # layers (q/k/v, o, gate/up, down)
    "k": TinyShape(embed_type="Q5_K", output_type="Q6_K", **_SIZES,
                   layer_types=(("Q5_K", "Q5_0", "Q5_K", "Q6_K"),
                                ("Q3_K", "Q2_K", "Q5_1", "Q4_K"))),
    "iq": TinyShape(embed_type="IQ4_NL", output_type="MXFP4", **_SIZES,
                    layer_types=(("IQ4_XS", "MXFP4", "IQ4_NL", "IQ4_XS"),
                                 ("MXFP4", "IQ4_XS", "MXFP4", "Q8_0"))),
}


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_mix_logits_equal_a_float32_reference(device, tmp_path, mix):
    import torch

    from .reference import hf_model_from_gguf

    path = write_gguf(str(tmp_path / f"{mix}.gguf"), shape=MIXES[mix], seed=63)
    # float rows (no int8 activations): the products are float32 sums of the exact weights
    model = clops.llm.load(path, device=device, max_seq_len=256, progress=False,
                           int8_activations=False)
    reference = hf_model_from_gguf(path)
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, 12).tolist()
    with torch.no_grad():
        want = reference(torch.tensor([ids])).logits[0].numpy()
    got = model.logits(ids)  # the prompt's products: 12 rows at once
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 2e-3, err
    # decode steps (products of one row): greedy tokens as the reference's, unless the
    # reference's best two logits lie within that error
    new = list(model.generate_ids(ids, max_new_tokens=4, stop_ids=[]))
    for step, token in enumerate(new):
        with torch.no_grad():
            logits = reference(torch.tensor([ids + new[:step]])).logits[0, -1].numpy()
        best = int(logits.argmax())
        gap = float(logits[best] - logits[token])
        assert token == best or gap <= 4e-3 * float(np.abs(logits).max()), (step, token, best)


def test_unsupported_types_are_refused_before_upload(device, tmp_path, monkeypatch):
    shape = TinyShape(**{**_SIZES, "layers": 1}, embed_type="Q8_0", output_type="Q8_0",
                      layer_types=(("Q8_0", "Q8_0", "IQ2_XS", "Q8_0"),))
    path = write_gguf(str(tmp_path / "iq2.gguf"), shape=shape)

    def no_alloc(*a, **kw):
        raise AssertionError("the device allocated memory before refusing the file")

    monkeypatch.setattr(type(clops.device(device)), "alloc", no_alloc)
    with pytest.raises(clops.llm.ModelFileError) as e:
        clops.llm.load(path, device=device, max_seq_len=256, progress=False)
    msg = str(e.value)
    assert "blk.0.ffn_gate.weight" in msg and "is IQ2_XS" in msg, msg
    assert ", ".join(SUPPORTED_NAMES) in msg, msg


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_mixes_in_the_row_layout(device, tmp_path, monkeypatch, mix):
    """The GPUs' row layout on whatever device: Q5_K, Q6_K and IQ4_XS stay in their compact
    forms (read in place, as the file packs them) and the model's logits and tokens are the
    reference's."""
    from clops.nn import quant

    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    path = write_gguf(str(tmp_path / f"{mix}.gguf"), shape=MIXES[mix], seed=63)
    model = clops.llm.load(path, device=device, max_seq_len=256, progress=False)
    ly = model.weights.layers[0]
    if mix == "k":
        assert [p[0].fmt for p in ly.qkv.parts] == ["k5"] and ly.down.fmt == "k6"
        assert model.weights.embed.fmt == "k5"
    else:
        assert ly.qkv.parts[0][0].fmt == "i4" and ly.down.fmt == "i4"
    test_mix_logits_equal_a_float32_reference(device, tmp_path, mix)


def test_a_projection_of_two_formats_stacks_each_run(device):
    """A QKV whose q and k share a format and whose v has another (llama.cpp's mixes give v
    more bits in some layers): q and k stacked into one weight, v on its own, each writing its
    columns of the one output: two launches, not three."""
    from types import SimpleNamespace

    from gguf import GGMLQuantizationType as Q

    from clops.llm.model import Model
    from clops.nn.quant import pack_ggml

    from ..nn.test_functional import _random_k_quant

    kinds, rows = (Q.Q4_K, Q.Q4_K, Q.Q6_K), (64, 32, 32)
    parts = [pack_ggml(_random_k_quant(t, n, 256), int(t), n, 256) for t, n in zip(kinds, rows)]
    biases = [np.arange(n, dtype=np.float32) + i * 100 for i, n in enumerate(rows)]
    proj = Model._fuse(SimpleNamespace(device=clops.device(device)), parts, biases)
    assert proj.n == 128 and [(off, w.n) for w, off, _ in proj.parts] == [(0, 96), (96, 32)]
    x = np.random.default_rng(3).standard_normal((1, 256)).astype(np.float32)
    want = np.concatenate([x.astype(np.float64) @ p.dequantize().T + b
                           for p, b in zip(parts, biases)], axis=1)
    got = np.concatenate([np.asarray(clops.nn.linear(clops.asarray(x, device=device), w,
                                                     clops.asarray(_read_bias(device, b, w.n),
                                                                   device=device)))
                          for w, _, b in proj.parts], axis=1)
    np.testing.assert_allclose(got, want, rtol=3e-2, atol=3e-2 * np.abs(want).max())


def _read_bias(device, buf, n):
    out = np.empty(n, np.float32)
    clops.device(device).read(out, buf)
    return out


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_placements_estimate_is_the_layouts_bytes(device, tmp_path, mix):
    """What placement counts for each matrix before the upload is what the weight then takes
    on the device, in either layout (the row layout's compact formats at about the file's
    size: a GPU holding a model of Q5_K or IQ4_XS is not told it does not fit), within a
    row's padding."""
    from clops.llm.gguf_file import GGUFFile
    from clops.llm.weights import GGUFSource
    from clops.nn import quant
    from clops.nn.quant import DeviceWeight

    path = write_gguf(str(tmp_path / f"{mix}.gguf"), shape=MIXES[mix], seed=63)
    src = GGUFSource(GGUFFile(path))
    dev = clops.device(device)
    for name in ["embed", "output"] + [f"blk.{i}.{k}" for i in range(2)
                                       for k in ("q", "k", "v", "o", "gate", "up", "down")]:
        p = src.matrix(name)
        for layout in ("rows", "rb16"):
            if layout == "rb16" and quant.layout_for(dev) != "rb16":
                continue  # (the CPU layout's kernels do not run on this device)
            got = DeviceWeight(dev, p, layout=layout).nbytes
            want = src.device_nbytes(name, layout)
            assert want <= got <= want + 16 * p.n + 8 * p.n * (layout == "rb16"), \
                (name, layout, p.fmt, got, want)
