"""Float16 copies of a model's weights for a prompt's tensor-core products
(``clops.llm.load(float16_copies=)``): which weights get one, what they hold, and, where the
device has tensor cores, that the prompt path with them gives the logits of the path that
converts the weights for each chunk."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import clops.llm  # noqa: E402
import clops.llm.model as M  # noqa: E402
from clops.kernels import matmul  # noqa: E402

from .tiny import VOCAB, make_model  # noqa: E402


def _mats(model):
    return [w for ly in model.layers for w in
            [p[0] for p in ly.qkv.parts + ly.gate_up.parts] + [ly.o, ly.down]]


def _load_as_if_tensor_cores(path, device, monkeypatch, **kw):
    """Load while ``tensor_core_rows`` holds for every product of 16 rows or more (as on a GPU
    with tensor cores), so that the copies are made on any device; the plans built afterwards
    see the device as it is."""
    with monkeypatch.context() as mp:
        mp.setattr(matmul, "tensor_core_rows",
                   lambda dev, m, w: m >= matmul.TENSOR_CORE_ROWS and w.fmt != "f32")
        mp.setattr("clops.nn.quant.layout_for", lambda dev: "rows")  # (GPUs' layout)
        return clops.llm.load(path, device=device, max_seq_len=64, progress=False, **kw)


def test_copies_hold_the_weights_in_float16(device, monkeypatch, tmp_path):
    make_model(str(tmp_path), dtype="bfloat16")
    model = _load_as_if_tensor_cores(str(tmp_path), device, monkeypatch)
    mats = _mats(model)
    assert mats and all(w.fmt == "bf16" and w.half is not None for w in mats)
    assert model.wh.nbytes == 4  # no conversion scratch
    for w in mats:
        bits = np.empty(w.n * w.k, np.uint16)
        device.read(bits, w.data, blocking=True)
        want = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float16)
        got = np.empty(w.n * w.k, np.float16)
        device.read(got, w.half, blocking=True)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("setting,fraction,kept", [(False, 1.0, False), (True, 0.0, True),
                                                   (None, 0.0, False), (None, 1.0, True)])
def test_when_copies_are_kept(device, monkeypatch, tmp_path, setting, fraction, kept):
    make_model(str(tmp_path), dtype="bfloat16")
    monkeypatch.setattr(M, "HALF_COPIES_FRACTION", fraction)
    model = _load_as_if_tensor_cores(str(tmp_path), device, monkeypatch,
                                     float16_copies=setting)
    mats = _mats(model)
    assert all((w.half is not None) == kept for w in mats)
    # without copies, each chunk converts into a scratch of the largest weight's size
    assert model.wh.nbytes == (4 if kept else max(w.n * w.k * 2 for w in mats))


def test_no_copies_without_tensor_cores_or_of_float16_weights(device, tmp_path):
    make_model(str(tmp_path), dtype="float16")
    model = clops.llm.load(str(tmp_path), device=device, max_seq_len=64, progress=False,
                           float16_copies=True)
    assert all(w.half is None for w in _mats(model))


def test_copies_give_the_logits_of_converting_each_chunk(device, tmp_path):
    model_args = dict(device=device, max_seq_len=64, progress=False)
    make_model(str(tmp_path), dtype="bfloat16")
    kept = clops.llm.load(str(tmp_path), float16_copies=True, **model_args)
    if not any(matmul.tensor_core_rows(device, kept.chunk, w) for w in _mats(kept)):
        pytest.skip("the device has no tensor cores for a prompt's products")
    again = clops.llm.load(str(tmp_path), float16_copies=False, **model_args)
    ids = np.random.default_rng(4).integers(0, VOCAB, 40).tolist()
    np.testing.assert_array_equal(kept.logits(ids), again.logits(ids))
    names = [ln.name for ln in kept._plan(40, "all", False).launches]
    assert not any(n.startswith("dequant_half") for n in names)
    names = [ln.name for ln in again._plan(40, "all", False).launches]
    assert any(n.startswith("dequant_half") for n in names)
