"""decode_layer (kernels/layer.cl): a decode row's whole decoder layer in one launch of
work-groups that all run at once and meet at grid barriers, against the per-layer plan it
replaces (the same int8 rows), at one chunk of positions and at several (the last work-group
of a head combining the chunks). Runs where the grid-barrier probe passes (NVIDIA GPUs); CPU
runtimes promise no concurrent work-groups and are not asked."""

from __future__ import annotations

import numpy as np
import pytest

import clops.llm
from clops.kernels import layer

from ..fuzz.tiny_files import TinyShape, write_gguf

# every layer matrix 4- or 8-bit (what decode_layer takes); heads of 64 (a multiple of 16)
SHAPE = TinyShape(dim=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512,
                  embed_type="Q8_0", output_type="Q8_0", context=1024,
                  layer_types=(("Q4_0", "Q8_0", "Q4_1", "Q8_0"),
                               ("Q8_0", "Q4_1", "Q8_0", "Q4_0")))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    return write_gguf(str(tmp_path_factory.mktemp("layer") / "tiny.gguf"), shape=SHAPE)


def _step_logits(model, ids: list[int], whole: bool) -> np.ndarray:
    """The logits of the decode step after ``ids`` (the prompt's token, then one step)."""
    model._whole = whole
    model._plans.clear()
    list(model.generate_ids(ids, max_new_tokens=2, stop_ids=[]))
    out = np.empty(model.config.vocab_size, np.float32)
    model.device.read(out, model.logits_buf, blocking=True)
    return out


@pytest.mark.parametrize("prompt", [40, 300, 700])
def test_layer_kernel_matches_the_per_layer_plan(device, monkeypatch, model_file, prompt):
    if not layer.resident_groups(device):
        pytest.skip(f"{device.name}: no grid barriers (the probe found its work-groups not all "
                    "resident, or it is a CPU)")
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "1")
    model = clops.llm.load(model_file, device=device, max_seq_len=1024, progress=False)
    assert model._layer_kernels()
    ids = np.random.default_rng(prompt).integers(0, model.config.vocab_size, prompt).tolist()
    want = _step_logits(model, ids, False)
    got = _step_logits(model, ids, True)
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()
    bar = np.empty(4, np.int32)
    device.read(bar, model.bar, blocking=True)
    # every barrier met, none timed out
    assert layer.arrivals(bar) % layer.resident_groups(device) == 0 and bar[2] == 0, bar
    # and a generation through it: the same greedy tokens as the per-layer plan's, the first
    # of them at least (random weights: later near-ties may part them)
    model._whole, model._plans = True, {}
    toks = list(model.generate_ids(ids, max_new_tokens=6, stop_ids=[]))
    model._whole, model._plans = False, {}
    assert list(model.generate_ids(ids, max_new_tokens=6, stop_ids=[]))[:2] == toks[:2]


def test_layer_kernel_is_off_by_default(device, monkeypatch, model_file):
    monkeypatch.delenv("CLOPS_LAYER_KERNEL", raising=False)
    model = clops.llm.load(model_file, device=device, max_seq_len=256, progress=False)
    assert not model._layer_kernels()


def test_layer_kernel_asked_for_runs_only_with_grid_barriers(device, monkeypatch, model_file):
    # CPU runtimes (and GPUs whose probe fails) keep the per-layer plan when it is asked for
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "1")
    model = clops.llm.load(model_file, device=device, max_seq_len=256, progress=False)
    assert model._layer_kernels() == bool(layer.resident_groups(device))
    assert list(model.generate_ids([1, 2, 3], max_new_tokens=3, stop_ids=[]))
