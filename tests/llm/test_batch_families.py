"""Every family through the batched engine (``BatchEngine``, ``llm.step``): tiny random models
of each family (``tests.llm.families``: transformers' own classes, their safetensors and the
GGUF file llama.cpp's converter writes) give the same greedy tokens for eight prompts run
together as for each prompt run alone through ``Model``, with sliding windows shorter than
most prompts, and log-probabilities within the family test's bound of transformers'."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import clops.llm  # noqa: E402
from clops.llm import batch  # noqa: E402
from clops.llm.arch import ARCHS  # noqa: E402
from clops.llm.batch import BatchEngine, SamplingParams  # noqa: E402

from .families import FAMILIES, WINDOW, hf_logits, make  # noqa: E402
from .tiny import logit_tolerance  # noqa: E402

LENGTHS = (3, 5, 8, 11, 13, 16, 18, 20)  # prompts shorter and longer than WINDOW
NEW = 6
TOP = 5  # log-probabilities compared a step


def _kind(family: str) -> str:
    """Half the families from safetensors, half from GGUF (every family's loader is the
    family test's; here one file of each family is enough)."""
    return "gguf" if list(FAMILIES).index(family) % 2 else "safetensors"


@pytest.fixture(params=list(FAMILIES))
def family(request, tmp_path_factory, device):
    name = request.param
    ref, hf, gguf_path = make(name, str(tmp_path_factory.mktemp(f"batch_{name}")))
    path = gguf_path if _kind(name) == "gguf" else hf
    # (a float32 cache, as the family test's: the family's own rounding sets the bound)
    model = clops.llm.load(path, device=device, max_seq_len=64, progress=False,
                           kv_cache="float32")
    return name, ref, model


def _prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, vocab, n).tolist() for n in LENGTHS]


def _run(engine: BatchEngine, prompts: list[list[int]], params: SamplingParams):
    ids = [engine.add(p, params, NEW) for p in prompts]
    tokens: dict[int, list[int]] = {i: [] for i in ids}
    tops: dict[int, list[dict[int, float]]] = {i: [] for i in ids}
    while engine.has_work():
        for o in engine.step():
            assert o.error is None
            tokens[o.seq].append(o.token)
            tops[o.seq].append(dict(o.top))
    return [tokens[i] for i in ids], [tops[i] for i in ids]


def test_every_architecture_is_batched():
    assert {FAMILIES[f][3] for f in FAMILIES} == set(ARCHS)


def test_batched_equals_alone_and_transformers(family):
    name, ref, model = family
    assert batch.unsupported(model) is None
    cfg = model.config
    if name.startswith("gemma"):  # the windows matter here: shorter than most prompts
        assert cfg.sliding_window == WINDOW < max(LENGTHS)
        assert any(ly.window == WINDOW for ly in model.weights.layers)
    if name == "phi3":
        assert cfg.rotary < cfg.head_dim
    prompts = _prompts(cfg.vocab_size)
    alone = [list(model.generate_ids(p, max_new_tokens=NEW, stop_ids=[])) for p in prompts]
    # 8 sequences through 4 slots, prompt chunks of 16 rows, blocks of 8 positions
    engine = BatchEngine(model, max_batch=4, block_size=8, prefill_chunk=16)
    together, tops = _run(engine, prompts, SamplingParams(logprobs=TOP))
    assert together == alone, f"{name}: batched tokens differ from each prompt alone"
    err = _worst_error(ref, prompts, together, tops)
    # (a log-probability is a logit less the row's log-sum-exp: the error of both)
    assert err < 2 * logit_tolerance(model), f"{name}: relative log-probability error {err:.2e}"


def _worst_error(ref, prompts, tokens, tops) -> float:
    """The largest error of the steps' top log-probabilities against transformers' at the same
    positions, relative to the largest logit of the position's row."""
    worst = 0.0
    for p, toks, steps in zip(prompts, tokens, tops):
        want = hf_logits(ref, (p + toks)[:-1])[len(p) - 1:]
        top = want.max(-1, keepdims=True)
        want_lp = want - top - np.log(np.exp(want - top).sum(-1, keepdims=True))
        for j, got in enumerate(steps):
            assert len(got) == TOP and toks[j] in got
            t = np.fromiter(got, np.int64)
            lp = np.fromiter(got.values(), np.float64)
            worst = max(worst, float(np.abs(lp - want_lp[j, t]).max() / np.abs(want[j]).max()))
    return worst


def test_batched_attention_needs_the_window(tmp_path, device):
    """The comparison can fail: gemma2 whose batched step forgets its window (the layers' views
    without it) is further from transformers than the bound."""
    ref, hf, _ = make("gemma2", str(tmp_path))
    model = clops.llm.load(hf, device=device, max_seq_len=64, progress=False,
                           kv_cache="float32")
    prompts = _prompts(model.config.vocab_size)[-3:]  # (the longer ones)
    engine = BatchEngine(model, max_batch=4, block_size=8, prefill_chunk=16)
    w = engine.builder.w
    engine.builder.w = replace(w, layers=tuple(replace(ly, window=0) for ly in w.layers))
    tokens, tops = _run(engine, prompts, SamplingParams(logprobs=TOP))
    assert _worst_error(ref, prompts, tokens, tops) > 2 * logit_tolerance(model)


@pytest.mark.standin
@pytest.mark.parametrize("combine", [True, False], ids=["one-launch", "two-launches"])
def test_windows_across_the_split_attentions_chunks(tmp_path, device, monkeypatch, combine):
    """The GPUs' split attention (paged_attn_wg: a row's positions in chunks of 32 or 64
    here), run on this device too, with windows that leave the first chunks of long rows out (their
    partials not counted) and rows whose window spans two chunks: gemma2's tokens alone and
    its log-probabilities within the bound of transformers'."""
    from clops.kernels import attention, paged

    monkeypatch.setattr(paged, "split_attention", lambda dev, head_dim: True)
    monkeypatch.setattr(attention, "decode_combines", lambda dev: combine)
    ref, hf, _ = make("gemma2", str(tmp_path))
    model = clops.llm.load(hf, device=device, max_seq_len=128, progress=False,
                           kv_cache="float32")
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in (5, 68, 93)]
    alone = [list(model.generate_ids(p, max_new_tokens=NEW, stop_ids=[])) for p in prompts]
    engine = BatchEngine(model, max_batch=4, block_size=8, prefill_chunk=32)
    assert engine.split
    tokens, tops = _run(engine, prompts, SamplingParams(logprobs=TOP))
    assert tokens == alone
    assert _worst_error(ref, prompts, tokens, tops) < 2 * logit_tolerance(model)


@pytest.mark.standin
@pytest.mark.parametrize("name", ["gemma2", "phi3", "qwen3", "gpt_oss"])
def test_decode_steps_split_attention_batched_equals_alone(tmp_path, device, monkeypatch, name):
    """The GPUs' plan for steps of decode rows (``paged.rope_store``, then attention split over
    chunks of positions, ``paged.attention_split``), run on this device too: windows and soft
    caps (gemma2), partial rotary (phi3), QK-norm folded into the rotation (qwen3), sinks
    (gpt-oss); every sequence's tokens those of the prompt alone, and log-probabilities within
    the bound of transformers'."""
    from clops.kernels import paged

    monkeypatch.setattr(paged, "split_attention", lambda dev, head_dim: True)
    ref, hf, gguf_path = make(name, str(tmp_path))
    model = clops.llm.load(gguf_path if _kind(name) == "gguf" else hf, device=device,
                           max_seq_len=128, progress=False, kv_cache="float32")
    prompts = _prompts(model.config.vocab_size)[::2]
    alone = [list(model.generate_ids(p, max_new_tokens=NEW, stop_ids=[])) for p in prompts]
    engine = BatchEngine(model, max_batch=4, block_size=8, prefill_chunk=64)
    tokens, tops = _run(engine, prompts, SamplingParams(logprobs=TOP))
    # (every batched plan's attention split over chunks of positions)
    plans = [p for key, p in engine._plans.items() if isinstance(key, tuple)]
    assert plans and all(any(ln.kernel.function_name == "paged_attn_wg"
                             for ln in p.plan.launches) for p in plans)
    assert tokens == alone, f"{name}: batched tokens differ from each prompt alone"
    assert _worst_error(ref, prompts, tokens, tops) < 2 * logit_tolerance(model)


@pytest.mark.standin
@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2", "gemma3", "gpt_oss"])
def test_a_decode_row_alone_takes_the_single_sequence_kernel(tmp_path, device, monkeypatch,
                                                             name):
    """The GPUs' plan for a decode row alone (``single_row``) attends through the single
    sequence's decode kernel over the row's blocks (``attn_decode_rope`` with ``paged``:
    rotation, the stores and attention in one launch), run on this device too: QK-norm
    (qwen3), soft caps and windows that leave the first chunks of long rows out (gemma2,
    gemma3), attention sinks in the first chunk that takes part (gpt-oss); each sequence's
    tokens those of ``Model`` alone, and log-probabilities within the bound of
    transformers'."""
    from clops.kernels import attention, paged
    from clops.llm.batch import SINGLE
    from clops.llm.step import StepBuilder

    monkeypatch.setattr(paged, "split_attention", lambda dev, head_dim: True)
    monkeypatch.setattr(attention, "fused_decode", lambda dev, head_dim: True)
    monkeypatch.setattr(StepBuilder, "single_row", lambda self: True)
    monkeypatch.setattr(StepBuilder, "lone_row", lambda self: False)
    # (chunks of 8 positions: a window of 8 spans two, after chunks wholly before it)
    monkeypatch.setattr(attention, "decode_chunk", lambda dev, n, h: (8, -(-n // 8)))
    ref, hf, gguf_path = make(name, str(tmp_path))
    model = clops.llm.load(gguf_path if _kind(name) == "gguf" else hf, device=device,
                           max_seq_len=128, progress=False, kv_cache="float32")
    rng = np.random.default_rng(13)
    prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in (4, 37, 90)]
    alone = [list(model.generate_ids(p, max_new_tokens=NEW, stop_ids=[])) for p in prompts]
    engine = BatchEngine(model, max_batch=4, block_size=8, prefill_chunk=64)
    got, tops = [], []
    for p in prompts:  # (one at a time: each decode step is a row alone)
        t, lp = _run(engine, [p], SamplingParams(logprobs=TOP))
        got += t
        tops += lp
    single = engine._plans[SINGLE].plan.launches
    names = [ln.name for ln in single]
    assert sum(ln.kernel.function_name == "attn_decode_rope" for ln in single) == \
        model.config.n_layers and not any(n.startswith("rope_store") for n in names)
    assert got == alone, f"{name}: a row alone differs from the model's own tokens"
    assert _worst_error(ref, prompts, got, tops) < 2 * logit_tolerance(model)
