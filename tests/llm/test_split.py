"""A model's layers split over several devices (``clops.llm.load(device=[...], split=...)``),
on the two sub-devices of the test device (a CPU's compute units in two halves): every family
and the GGUF weight-type mixes give the same logits, greedy and sampled tokens, batched tokens
and log-probabilities as the model on one of those sub-devices alone, bit for bit (the same
kernels run the same rows). The placement follows ``split`` or the devices' free memory, and a
model that does not fit is refused, with the bytes per device, before any upload."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import clops
import clops.llm
from clops.llm import placement
from clops.llm.batch import BatchEngine, SamplingParams
from clops.runtime.fission import FissionError

from ..fuzz.tiny_files import write_gguf
from .families import FAMILIES, make
from .test_gguf_mixes import MIXES

pytest.importorskip("torch")
pytest.importorskip("transformers")

NEW = 6


@pytest.fixture
def halves(device):
    """Two sub-devices of the test device, in one context."""
    try:
        subs = device.create_sub_devices(2)
    except FissionError as e:
        pytest.skip(f"{device.name} does not split into sub-devices ({e}); a split over GPUs "
                    "is measured on hosts of several GPUs (bench/bench_split.py)")
    assert subs[0].shares_context(subs[1])
    return subs


def _load(path, devices, **kw):
    return clops.llm.load(path, device=devices, max_seq_len=64, progress=False,
                          kv_cache="float32", **kw)


def _source(path):
    from clops.llm.safetensors_file import open_directory
    from clops.llm.weights import SafetensorsSource

    return SafetensorsSource(path, open_directory(path)[1])


def _batched(model, prompts: list[list[int]]):
    engine = BatchEngine(model, max_batch=4, prefill_chunk=8)
    params = [SamplingParams(), SamplingParams(temperature=0.9, seed=5, logprobs=3)]
    seqs = {engine.add(p, params[i % 2], NEW): i for i, p in enumerate(prompts)}
    out: dict[int, list] = {i: [] for i in range(len(prompts))}
    while engine.has_work():
        for o in engine.step():
            assert o.error is None
            out[seqs[o.seq]].append((o.token, o.logprob, o.top))
    return out


def _same_as_alone(path, halves, split=(1, 1)):
    alone = _load(path, halves[0])
    both = _load(path, halves, split=list(split))
    assert both.devices == list(halves) and len(both.stages) == len(halves)
    assert all(a.stop == b.first for a, b in zip(both.stages, both.stages[1:]))
    vocab = alone.config.vocab_size
    rng = np.random.default_rng(3)
    ids = rng.integers(0, vocab, 11).tolist()
    assert np.array_equal(alone.logits(ids), both.logits(ids))
    for kw in ({}, {"temperature": 0.8, "seed": 11}):
        assert list(alone.generate_ids(ids, NEW, **kw)) == list(both.generate_ids(ids, NEW, **kw))
    prompts = [rng.integers(0, vocab, n).tolist() for n in (3, 9, 14)]
    assert _batched(alone, prompts) == _batched(both, prompts)
    return both


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_split_gives_the_tokens_of_one_device(family, halves, tmp_path):
    _, hf, gguf_path = make(family, str(tmp_path))
    path = gguf_path if list(FAMILIES).index(family) % 2 else hf
    both = _same_as_alone(path, halves)
    n = both.config.n_layers
    assert [(st.first, st.stop) for st in both.stages] == [(0, n // 2), (n // 2, n)]


@pytest.mark.standin
def test_a_split_models_single_decode_row(halves, tmp_path, monkeypatch):
    """Where a decode row alone takes the plan of one row's products (``single_row``: GPUs;
    forced here), every part of a split model takes it for that step: the tokens and
    log-probabilities of the model on one device, which takes it too."""
    from clops.llm.batch import SINGLE
    from clops.llm.step import StepBuilder

    monkeypatch.setattr(StepBuilder, "single_row", lambda self: True)
    _, hf, _ = make("qwen3", str(tmp_path))
    alone, both = _load(hf, halves[0]), _load(hf, halves)
    prompt = [np.random.default_rng(4).integers(0, alone.config.vocab_size, 9).tolist()]
    engines = []

    def batched(model):
        engine = BatchEngine(model, max_batch=4, prefill_chunk=8)
        engines.append(engine)
        seq = engine.add(prompt[0], SamplingParams(logprobs=3), NEW)
        out = []
        while engine.has_work():
            out += [(o.token, o.logprob, o.top) for o in engine.step() if o.seq == seq]
        return out

    assert batched(alone) == batched(both)
    one, two = engines
    assert SINGLE in one._plans and SINGLE in two._plans
    assert all(SINGLE in p.plans for p in two._before)


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_weight_type_mixes_split(mix, halves, tmp_path):
    path = write_gguf(str(tmp_path / f"{mix}.gguf"), shape=MIXES[mix], seed=63)
    _same_as_alone(path, halves)


def test_a_split_model_is_served(halves, tmp_path):
    openai = pytest.importorskip("openai")
    from ..serve.conftest import start

    _, hf, _ = make("gemma3", str(tmp_path))  # six layers, sliding windows
    model = _load(hf, halves, split=[1, 2])
    prompts = ["w1 w2", "w5 w17 w42 w7 w3 w9", "w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13"]
    alone = ["".join(_load(hf, halves[1]).generate(p, max_new_tokens=NEW)) for p in prompts]
    run = start(model, parallel=3, model_name="split", prefill_chunk=8)
    try:
        client = openai.OpenAI(base_url=run.url + "/v1", api_key="none", max_retries=0,
                               timeout=120)

        def ask(p: str) -> str:
            return client.completions.create(model="split", prompt=p, max_tokens=NEW,
                                             temperature=0).choices[0].text

        with ThreadPoolExecutor(len(prompts)) as pool:  # (batched together)
            served = list(pool.map(ask, prompts))
    finally:
        run.stop()
    assert served == alone and any(alone)


def test_shares_place_the_layers(halves, tmp_path):
    _, hf, _ = make("smollm3", str(tmp_path))  # four layers
    three_one = _load(hf, halves, split=[3, 1])
    assert [(st.first, st.stop) for st in three_one.stages] == [(0, 3), (3, 4)]
    # without shares: by free memory, which the two halves of one CPU share equally: the
    # parts' bytes (the embedding with the first, the head and the logits with the last) as
    # even as a boundary between layers makes them, one layer each at least
    even = _load(hf, halves)
    a, b = even.stages
    layers = placement.layer_nbytes(even.config, _source(hf), even.max_seq, False)
    assert a.stop == b.first
    gap = abs(a.nbytes - b.nbytes)
    if a.stop > 1:  # one layer fewer on the first
        assert abs(a.nbytes - b.nbytes - 2 * layers[a.stop - 1]) >= gap
    if a.stop < 3:  # one more
        assert abs(a.nbytes - b.nbytes + 2 * layers[a.stop]) >= gap
    # a share too small for a layer still gets one
    tiny = _load(hf, halves, split=[1, 1000])
    assert [(st.first, st.stop) for st in tiny.stages] == [(0, 1), (1, 4)]
    assert "layers 0-0" in tiny.where and "layers 1-3" in tiny.where


def test_a_model_that_does_not_fit_is_refused_before_upload(halves, tmp_path, monkeypatch):
    _, hf, _ = make("llama", str(tmp_path))
    before = [d.memory_stats()["in_use"] for d in halves]
    mib = 2**20
    monkeypatch.setattr(placement, "free_bytes", lambda dev: mib // 4)
    with pytest.raises(placement.DoesNotFitError) as e:
        _load(hf, halves)
    text = str(e.value)
    for d in halves:
        assert d.selector in text
    assert text.count(", needs ") == 2 and "0.2 MiB free" in text and "of one memory" in text
    with pytest.raises(placement.DoesNotFitError, match="does not fit the device"):
        _load(hf, halves[0])
    assert [d.memory_stats()["in_use"] for d in halves] == before


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_parts_in_two_contexts_meet_through_the_host(family, device, halves, tmp_path):
    # (the halves of two partitions: two OpenCL contexts, as a GPU's and a CPU runtime's are)
    other = device.create_sub_devices(2)
    assert not halves[0].shares_context(other[1])
    _, hf, gguf_path = make(family, str(tmp_path))
    _same_as_alone(gguf_path if family == "qwen3" else hf, [halves[0], other[1]])


def test_a_prompt_in_chunks_over_two_contexts(device, halves, tmp_path, monkeypatch):
    # a prompt of three chunks over parts in two contexts: the host writes each chunk's
    # position and the prompt's tokens to every part, and the next chunk's first part is
    # enqueued while the last part still works on this one (the rows written to it unwaited)
    from clops.llm import model as model_mod

    monkeypatch.setattr(model_mod, "PROMPT_CHUNK_CPU", 4)
    other = device.create_sub_devices(2)
    _, hf, _ = make("gemma3", str(tmp_path))  # six layers
    both = _same_as_alone(hf, [halves[0], other[1]])
    assert both.chunk == 4 and not halves[0].shares_context(other[1]) and both._pipelined
    # two parts in one context and one in another: the chunks one after another
    three = _same_as_alone(hf, [halves[0], halves[1], other[1]], split=(1, 1, 1))
    assert not three._pipelined


def test_two_platforms_split_a_model(device, tmp_path):
    # the test device and a device of another platform (a GPU and a CPU runtime; Intel's CPU
    # runtime and PoCL): two contexts, the rows through the host
    others = sorted((d for d in clops.devices() if d.platform_name != device.platform_name),
                    key=lambda d: d.kind != "cpu")
    if not others:
        pytest.skip("one OpenCL platform here: a split over two needs two")
    from .tiny import logit_tolerance

    _, hf, _ = make("llama", str(tmp_path))
    mixed = _load(hf, [device, others[0]])
    assert not mixed.devices[0].shares_context(mixed.devices[1])
    alone = _load(hf, device)
    ids = list(range(3, 14))
    want, got = alone.logits(ids), mixed.logits(ids)
    # (each part's own kernels: the other platform's products round as the other device's)
    bound = max(1e-4, 2 * logit_tolerance(alone), 2 * logit_tolerance(mixed._prev[0]))
    assert np.abs(got - want).max() <= bound * np.abs(want).max()
    new = list(mixed.generate_ids(ids, NEW))
    assert len(new) == NEW
    # batched on the same split model: the tokens of the model alone
    assert [t for t, _, _ in _batched(mixed, [ids])[0]] == new


def test_devices_that_cannot_be_split_over_are_refused(device, halves, tmp_path):
    _, hf, _ = make("llama", str(tmp_path))  # two layers
    with pytest.raises(ValueError, match="named twice"):
        _load(hf, [halves[0], halves[0]])
    with pytest.raises(ValueError, match="2 positive shares"):
        _load(hf, halves, split=[1])
    with pytest.raises(ValueError, match="2 positive shares"):
        _load(hf, halves, split=[1, 0])
    cfg = _load(hf, halves[0]).config
    cfg.n_layers = 1
    with pytest.raises(ValueError, match="at least one layer"):
        placement.place(cfg, None, halves, 64, False, [8, 8])  # type: ignore[arg-type]
