"""The decode plan as GPUs build it (norms and the GLU folded into the matmuls, teams of
work-items per output column, work-group attention), forced on whatever device the tests use:
logits and greedy tokens against transformers on tiny random models."""

from __future__ import annotations

import numpy as np
import pytest

# (a GPU path run on the CPU device: .ci/run's second pass leaves it out)
pytestmark = pytest.mark.standin

pytest.importorskip("torch")
pytest.importorskip("transformers")

import clops.llm  # noqa: E402
from clops.kernels import attention, launch, sample  # noqa: E402

from .tiny import VOCAB, hf_logits, logit_tolerance, make_model  # noqa: E402


@pytest.mark.parametrize("combine", [True, False])
@pytest.mark.parametrize("case", [dict(arch="llama"), dict(arch="qwen2", dtype="float16",
                                                             tied=True)])
@pytest.mark.parametrize("kv_cache", ["float32", "float16"])
def test_gpu_plan_matches_transformers(device, monkeypatch, tmp_path, case, combine, kv_cache):
    import torch

    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)

    monkeypatch.setattr("clops.nn.quant.layout_for", lambda dev: "rows")
    # and the decode step replayed as one command buffer, as GPUs do where they can
    monkeypatch.setenv("CLOPS_COMMAND_BUFFERS", "1")
    # decode attention in one launch (combine: the last work-group combines the splits) or
    # two; chunks of 8 positions, so that the generated steps span several
    monkeypatch.setattr(attention, "decode_combines", lambda dev: combine)
    monkeypatch.setattr(attention, "decode_chunk", lambda dev, max_seq, n_heads:
                        (8, -(-max_seq // 8)))
    # (the sampler's work-groups of 16: greedy steps take several even at this vocabulary)
    monkeypatch.setattr(sample, "sample_lsize", lambda dev: 16)
    ref = make_model(str(tmp_path), **case)
    model = clops.llm.load(str(tmp_path), device=device, max_seq_len=256, progress=False,
                           kv_cache=kv_cache)
    assert model.kv_half == (kv_cache == "float16")
    ids = np.random.default_rng(2).integers(0, VOCAB, 40).tolist()
    got, want = model.logits(ids), hf_logits(ref, ids)
    assert np.abs(got - want).max() / np.abs(want).max() < logit_tolerance(model)
    prompt = [5, 17, 42, 7, 99, 3]
    sampled = list(model.generate_ids(prompt, max_new_tokens=12, temperature=0.9, seed=7,
                                      stop_ids=[]))
    toks = list(model.generate_ids(prompt, max_new_tokens=12, temperature=0.0, stop_ids=[]))
    # (the plan of the first decode step: the one whose attention spans its positions)
    decode = model._plan(1, "last", True, model._decode_span(len(prompt) + 1))
    assert decode.launches[-1].name == "greedy"
    from clops.runtime import cmdbuf

    assert decode.recorded == cmdbuf.support(device.queue.cl_queue)[0]
    # the sampler's settings changed twice; the recording follows them (drivers that capture
    # arguments when recording need the new recording; PoCL reads them at each enqueue)
    assert list(model.generate_ids(prompt, max_new_tokens=12, temperature=0.9, seed=7,
                                   stop_ids=[])) == sampled
    assert model._plan(1, "last", True, model._decode_span(len(prompt) + 1)).launches[-1].name \
        == "sample"
    assert list(model.generate_ids(prompt, max_new_tokens=12, temperature=0.0,
                                   stop_ids=[])) == toks
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert toks == out[0, len(prompt):].tolist()


def test_decode_plans_by_span_match_the_whole_cache(device, monkeypatch, tmp_path):
    # Decode steps run the plan whose attention covers the positions they attend to (chunks
    # and work-groups for those only); across the spans' boundaries (64, 128) the tokens and
    # logits are those of the plan over the whole cache.
    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr("clops.nn.quant.layout_for", lambda dev: "rows")
    monkeypatch.setattr(attention, "decode_chunk", lambda dev, max_seq, n_heads:
                        (8, -(-max_seq // 8)))
    make_model(str(tmp_path), arch="llama")
    model = clops.llm.load(str(tmp_path), device=device, max_seq_len=256, progress=False)
    ids = np.random.default_rng(3).integers(0, VOCAB, 58).tolist()
    got = list(model.generate_ids(ids, max_new_tokens=12, stop_ids=[]))
    spans = {k[3] for k in model._plans if k[:3] == (1, "last", True)}
    assert spans == {64, 128}
    last = np.empty(VOCAB, np.float32)
    model.device.read(last, model.logits_buf, blocking=True)
    monkeypatch.setattr(model, "_decode_span", lambda positions: None)
    assert list(model.generate_ids(ids, max_new_tokens=12, stop_ids=[])) == got
    whole = np.empty(VOCAB, np.float32)
    model.device.read(whole, model.logits_buf, blocking=True)
    np.testing.assert_allclose(last, whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max())


def test_prompt_products_match_transformers(device, tmp_path):
    """A prompt's products as the GPU plan chains them (float16 weights, an FFN of 128): on
    tensor cores the output products leave the next norm's float16 rows (split_norm_half, or
    half_rows after an unsplit product), the tensor-core attention writes the float16 rows
    the output product reads, and on Hopper the gate and up product's epilogue gives the
    GLU's float16 rows; logits of a 40-row prompt against transformers, whatever
    route the device takes."""
    from clops.kernels import matmul

    ref = make_model(str(tmp_path), dtype="float16", ffn=128)
    model = clops.llm.load(str(tmp_path), device=device, max_seq_len=256, progress=False,
                           kv_cache="float32")
    ids = np.random.default_rng(3).integers(0, VOCAB, 40).tolist()
    got, want = model.logits(ids), hf_logits(ref, ids)
    assert np.abs(got - want).max() / np.abs(want).max() < logit_tolerance(model)
    names = [ln.name for key, plan in model._plans.items() if key[0] == 40
             for ln in plan.launches]
    ly = model.layers[0]
    if matmul.tensor_core_route(device, 40, ly.o, model.wh):
        assert sum(n.startswith(("split_norm_half.o", "half_rows.after.o")) for n in names) == 2
        assert sum(n.startswith(("split_norm_half.down", "half_rows.after.down"))
                   for n in names) == 1  # (the last layer's: lm_head reads float32 rows)
    if matmul.glu_half_rows(device, 40, ly.gate_up.parts[0][0]):
        assert not any(n.startswith("half_rows.down") for n in names)
    if model.half_prompt and attention.prefill_mma(device, model.config.head_dim) and \
            matmul.tensor_core_route(device, 40, ly.o, model.wh):
        assert not any(n.startswith("half_rows.o") for n in names)  # (attention's own)


def test_prompt_qkv_slices_added_up_by_the_rotation(device, tmp_path, monkeypatch):
    """A prompt's QKV product split over k (a residual stream of 1024) leaves its slices for
    rope_store to add up as it reads them: no split_sum.qkv launch, and the very logits of the
    slices summed first; near transformers'."""
    from clops.kernels import matmul

    ref = make_model(str(tmp_path), dtype="float16", hidden=1024)
    model = clops.llm.load(str(tmp_path), device=device, max_seq_len=256, progress=False,
                           kv_cache="float32")
    if matmul.product_slices(device, 40, model.layers[0].qkv.parts[0][0], model.wh) < 2:
        pytest.skip(f"{device.name}: a prompt's QKV product is not split here")
    ids = np.random.default_rng(5).integers(0, VOCAB, 40).tolist()
    got = model.logits(ids)
    names = [ln.name for key, plan in model._plans.items() if key[0] == 40
             for ln in plan.launches]
    assert not any(n.startswith("split_sum.qkv") for n in names), names
    monkeypatch.setattr(matmul, "product_slices", lambda *a: 1)
    model._plans.clear()
    summed = model.logits(ids)
    names = [ln.name for key, plan in model._plans.items() if key[0] == 40
             for ln in plan.launches]
    assert sum(n.startswith("split_sum.qkv") for n in names) == 2, names
    np.testing.assert_array_equal(got, summed)
    # (the products' float16 rows of a 1024-wide stream: H100, 1.4% of the largest logit off
    # transformers' float32, summed first or not; a slice lost or added twice is off by the
    # logits' scale)
    want = hf_logits(ref, ids)
    assert np.abs(got - want).max() / np.abs(want).max() < 0.05


def test_head_greedy_plan_matches_transformers(device, monkeypatch, tmp_path):
    """Where the LM head makes the greedy token too (``head_greedy``: NVIDIA's float16 heads,
    forced here), a prompt's and each step's greedy tokens match transformers', and a
    repetition penalty reaches that launch as it reaches ``greedy``."""
    import torch

    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr("clops.nn.quant.layout_for", lambda dev: "rows")
    monkeypatch.setattr(sample, "takes_head", lambda dev, w: w.fmt == "f16" and w.k % 256 == 0)
    monkeypatch.setattr(sample, "sample_lsize", lambda dev: 16)  # (greedy: several groups)
    ref = make_model(str(tmp_path), arch="qwen2", dtype="float16", tied=True, hidden=256)
    model = clops.llm.load(str(tmp_path), device=device, max_seq_len=128, progress=False)
    prompt = [5, 17, 42, 7, 99, 3]
    toks = list(model.generate_ids(prompt, max_new_tokens=12, temperature=0.0, stop_ids=[]))
    decode = model._plan(1, "last", True, model._decode_span(len(prompt) + 1))
    assert decode.launches[-1].name == "head_greedy"
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert toks == out[0, len(prompt):].tolist()
    # a sampled run between, then a penalty (below 1: the seen tokens favoured): the same tokens
    # as the product and greedy give
    list(model.generate_ids(prompt, max_new_tokens=4, temperature=0.9, seed=3, stop_ids=[]))
    pen = list(model.generate_ids(prompt, max_new_tokens=12, temperature=0.0,
                                  repetition_penalty=0.2, stop_ids=[]))
    assert model._plan(1, "last", True, model._decode_span(len(prompt) + 1)) \
        .launches[-1].name == "head_greedy"
    monkeypatch.setattr(sample, "takes_head", lambda dev, w: False)
    model._plans.clear()
    assert list(model.generate_ids(prompt, max_new_tokens=12, temperature=0.0,
                                   repetition_penalty=0.2, stop_ids=[])) == pen
    assert model._plan(1, "last", True, model._decode_span(len(prompt) + 1)) \
        .launches[-1].name == "greedy"
    assert pen != toks  # (the penalty changed the choice)
