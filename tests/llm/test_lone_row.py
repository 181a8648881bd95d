"""The batched engine's lone decode row (``StepBuilder.lone_row``): a step of one decode row
alone runs its layers as ``decode_layers`` launches over the paged cache (layer.cl's PAGED):
its logits against the same kernel over ``Model``'s contiguous cache (which
``test_layer_kernel.py`` holds to the per-layer plan), and the cache's blocks read and written
where the batched plan reads and writes them (sequences that run alone after others leave
keep the tokens of an engine whose steps are all batched, ``row_invariant=True``).
On GPUs whose work-groups the grid-barrier probe finds resident, the kernel itself; on Intel's
CPU runtime, its portable code as one work-group (as ``test_layer_kernel.py`` runs it)."""

from __future__ import annotations

import numpy as np
import pytest

import clops.llm
from clops.kernels import layer
from clops.llm.batch import LONE, BatchEngine, SamplingParams

from ..fuzz.tiny_files import TinyShape, write_gguf

# 4- and 8-bit layers (the kernel's int8 inputs), and float16 ones; heads of 64 and of 32; and
# Qwen3's heads of 128 with QK-norm
SHAPES = {
    "mixed": TinyShape(dim=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512,
                       embed_type="Q8_0", output_type="Q8_0", context=1024,
                       layer_types=(("Q4_0", "Q8_0", "Q4_1", "Q8_0"),
                                    ("Q4_K", "Q4_1", "Q8_0", "Q4_K"))),
    "f16": TinyShape(dim=128, layers=3, heads=4, kv_heads=2, head_dim=32, ffn=256,
                     embed_type="F16", output_type="Q8_0", context=1024,
                     layer_types=(("F16", "F16", "F16", "F16"),)),
    "qk": TinyShape(dim=256, layers=2, heads=2, kv_heads=1, head_dim=128, ffn=512,
                    embed_type="Q8_0", output_type="Q8_0", context=1024, rope_freqs=False,
                    qk_norm=True, layer_types=(("Q8_0", "Q8_0", "Q8_0", "Q8_0"),)),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("lone")
    return {k: write_gguf(str(d / f"{k}.gguf"), arch="qwen3" if v.qk_norm else "llama",
                          shape=v) for k, v in SHAPES.items()}


def _kernel_runs(device, monkeypatch) -> None:
    """Where decode_layers runs on ``device``: itself, or its portable code as one work-group on
    Intel's CPU runtime (row-major weights); elsewhere skip."""
    monkeypatch.setenv("CLOPS_LAYER_KERNEL", "1")
    if layer.resident_groups(device):
        return
    if device.kind != "cpu" or "intel" not in device.platform_name.lower():
        pytest.skip(f"{device.name} on {device.platform_name}: no grid barriers, and the "
                    "portable one-group run is for Intel's CPU runtime (PoCL took 320 s to "
                    "build it)")
    from clops.nn import quant
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    monkeypatch.setattr(layer, "resident_groups", lambda dev: 1)


def _engines(device, path: str, kv_cache: str) -> tuple[BatchEngine, BatchEngine]:
    model = clops.llm.load(path, device=device, max_seq_len=1024, progress=False,
                           kv_cache=kv_cache)
    kw = dict(max_batch=4, block_size=16, prefill_chunk=64)
    lone = BatchEngine(model, **kw)
    assert lone.builder.lone_row()
    return lone, BatchEngine(model, row_invariant=True, **kw)


def _logits(engine: BatchEngine) -> np.ndarray:
    """The last step's first logits row."""
    out = np.empty(engine.model.config.vocab_size, np.float32)
    engine.device.read(out, engine.logits, blocking=True)
    return out


def _first_decode_logits(engine: BatchEngine, prompt: list[int]) -> np.ndarray:
    """The logits of the first decode step after ``prompt`` (run in chunks by the batched
    plan), the sequence alone in the engine (and its last: no step enqueued ahead of it
    writes the logits over)."""
    engine.add(prompt, SamplingParams(), 2)
    while not engine.step():
        pass  # (the prompt's chunks; the last one gives the first token)
    assert engine.step()  # one decode row alone
    return _logits(engine)


# (each shape with one cache: a build of the layer kernel each, about 10 s on Intel's runtime)
@pytest.mark.parametrize("prompt", [40, 300])
@pytest.mark.parametrize("which, kv_cache", [("mixed", "float32"), ("f16", "float16"),
                                             ("qk", "float16")])
def test_a_lone_decode_row_takes_the_layer_kernel(device, monkeypatch, files, which, prompt,
                                                   kv_cache):
    """One decode step of a sequence alone: the layer kernel over the paged cache (positions
    over many blocks of 16, read through the sequence's table; 300 positions: more than one
    round of a work-group's tiles) against the same kernel over the model's own cache after
    the same prompt."""
    _kernel_runs(device, monkeypatch)
    lone, inv = _engines(device, files[which], kv_cache)
    model = lone.model
    ids = np.random.default_rng(prompt).integers(0, model.config.vocab_size, prompt).tolist()
    got = _first_decode_logits(lone, ids)
    assert LONE in lone._plans and LONE not in inv._plans
    names = [ln.name for ln in lone._plans[LONE].plan.launches]
    assert "decode_layers" in names and not any(n.startswith("attn") for n in names), names
    assert model._builder.whole_layers()
    list(model.generate_ids(ids, max_new_tokens=2, stop_ids=[]))  # (the same decode step)
    want = np.empty_like(got)
    model.device.read(want, model.logits_buf, blocking=True)
    # (the two caches were filled by different prompt plans: on Intel's runtime the same
    # values, and the logits then equal; on GPUs the model's prompt may round through float16,
    # which the int8 inputs of 4- and 8-bit layers carry further: 1.1% of the largest logit on
    # the H200; where the engine's prompt products take int8 rows too (NVIDIA GPUs:
    # matmul.int8_batch), its cache holds keys and values of int8 inputs: 4.4% at 300
    # positions on the H200. A wrong block, head or position is off by the logits' scale, and
    # the kernel against the batched plan by up to 5%)
    bound = 0.01 if which == "f16" else 0.06
    assert np.abs(got - want).max() <= bound * np.abs(want).max()
    bar = np.empty(4, np.int32)
    device.read(bar, lone.builder.bar, blocking=True)
    assert bar[2] == 0, bar  # no grid barrier timed out


def test_a_sequence_left_alone_keeps_its_tokens(device, monkeypatch, files):
    """Three sequences together, two of which finish early: the third's steps turn lone (the
    layer kernel reads the keys and values the batched plan stored, and stores its own where
    the batched plan reads them when a fourth sequence joins), and its tokens, and the
    fourth's, are those of the engine that keeps every step batched."""
    _kernel_runs(device, monkeypatch)
    lone, inv = _engines(device, files["f16"], "float16")
    rng = np.random.default_rng(5)
    V = lone.model.config.vocab_size
    prompts = [rng.integers(0, V, n).tolist() for n in (20, 45, 70, 30)]

    def run(engine: BatchEngine) -> list[list[int]]:
        seqs = [engine.add(p, SamplingParams(), n) for p, n in zip(prompts[:3], (2, 4, 24))]
        out: dict[int, list[int]] = {s: [] for s in seqs}
        steps = 0
        while engine.has_work():
            for o in engine.step():
                out[o.seq].append(o.token)
            steps += 1
            if steps == 14:  # (the third sequence has run alone for a few steps)
                late = engine.add(prompts[3], SamplingParams(), 6)
                seqs.append(late)
                out[late] = []
        return [out[s] for s in seqs]

    assert run(lone) == run(inv)
    assert LONE in lone._plans and LONE not in inv._plans
