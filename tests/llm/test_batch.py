"""clops.llm.batch: continuous batching over a paged KV cache, against the model's own
generation and transformers, with the cache's blocks accounted for."""

from __future__ import annotations

import numpy as np
import pytest

import clops.llm
from clops.kernels import attention, paged
from clops.llm.batch import LONE, SINGLE, BatchEngine, SamplingParams
from clops.llm.step import StepBuilder

from .tiny import logit_tolerance, make_model

NEW = 10


@pytest.fixture(scope="module", params=["llama", "qwen2", "llama-float16",
                                        "qwen2-float32-f16cache"])
def tiny(request, tmp_path_factory):
    # (f16cache: a KV cache of float16 values, the GPUs' default, which the engine's pools
    # then hold too; the others keep float32 on every device, for exact agreement with
    # transformers)
    arch, _, rest = request.param.partition("-")
    dtype, _, cache = rest.partition("-")
    path = tmp_path_factory.mktemp(f"batch_{request.param}")
    ref = make_model(str(path), arch, dtype=dtype or "float32")
    model = clops.llm.load(str(path), progress=False, max_seq_len=160,
                           kv_cache="float16" if cache else "float32")
    return model, ref


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # shorter and longer than a prompt chunk (16), sharing a 24-token prefix in two of them
    out = [[int(t) for t in rng.integers(0, 300, n)] for n in (5, 17, 40, 9, 3, 33)]
    out.append(out[2][:24] + [1, 2, 3, 4, 5])
    return out


def _run(engine: BatchEngine, prompts, params=None, new=NEW):
    ids = [engine.add(p, params or SamplingParams(), new) for p in prompts]
    out: dict[int, list[int]] = {i: [] for i in ids}
    finished = set()
    while engine.has_work():
        for o in engine.step():
            assert o.seq not in finished
            out[o.seq].append(o.token)
            if o.finished:
                assert o.reason == "length"
                finished.add(o.seq)
    assert finished == set(ids)
    return [out[i] for i in ids]


def _engine(model, **kw) -> BatchEngine:
    kw.setdefault("max_batch", 4)
    kw.setdefault("block_size", 8)
    kw.setdefault("prefill_chunk", 16)
    return BatchEngine(model, **kw)


def test_batched_equals_alone_and_the_models_own_generation(tiny):
    model, _ = tiny
    prompts = _prompts()
    engine = _engine(model)
    alone = [_run(engine, [p])[0] for p in prompts]
    together = _run(_engine(model), prompts)  # 7 sequences through 4 slots, a fresh cache
    assert together == alone
    again = _run(engine, prompts)  # prompt prefixes now come from the cache
    assert engine.stats()["reused_prompt_tokens"] > 0
    assert again == alone
    own = [list(model.generate_ids(p, max_new_tokens=NEW, stop_ids=[])) for p in prompts]
    assert own == alone


@pytest.mark.standin
def test_a_single_decode_row_takes_its_own_plan(tiny, monkeypatch):
    """Where ``single_row`` holds (GPUs; forced here) and ``lone_row`` does not (the layer
    kernel's plan goes first where it holds): a decode step of one sequence alone takes a plan
    of one row's products, never resized, and the model's own tokens come out; an engine with
    ``row_invariant`` never takes it."""
    model, _ = tiny
    monkeypatch.setattr(StepBuilder, "single_row", lambda self: True)
    monkeypatch.setattr(StepBuilder, "lone_row", lambda self: False)
    prompts = _prompts()[:3]
    own = [list(model.generate_ids(p, max_new_tokens=NEW, stop_ids=[])) for p in prompts]
    engine = _engine(model)
    assert [_run(engine, [p])[0] for p in prompts] == own
    assert SINGLE in engine._plans and engine._plans[SINGLE].rows == 1
    assert _run(engine, prompts) == own
    inv = _engine(model, row_invariant=True)
    assert _run(inv, prompts[:1]) == own[:1] and SINGLE not in inv._plans


@pytest.mark.standin
def test_a_lone_greedy_row_runs_a_step_ahead(tiny, monkeypatch):
    """A greedy sequence alone on a lone decode row's plan (``single_row``, forced here) has
    its next step enqueued before its token is read back (its token the device's argmax):
    the model's own tokens come out, also where the sequence is cancelled with a step ahead
    (that step is dropped and the cache it wrote serves the next sequences right), where
    another sequence arrives (the two then batched), where an embedding runs between steps,
    where the device's argmax cannot serve a row (its step runs again, its logits read), and
    never past a sequence's last token."""
    model, _ = tiny
    monkeypatch.setattr(StepBuilder, "single_row", lambda self: True)
    monkeypatch.setattr(StepBuilder, "lone_row", lambda self: False)
    prompts = _prompts(5)[:4]
    own = [list(model.generate_ids(p, max_new_tokens=NEW, stop_ids=[])) for p in prompts]
    engine = _engine(model)
    ahead = []
    enqueue = engine._enqueue_ahead

    def counted(s, pos):
        ahead.append(pos)
        return enqueue(s, pos)

    engine._enqueue_ahead = counted
    assert [_run(engine, [p])[0] for p in prompts] == own
    # (every decode step after the first of each sequence was enqueued ahead, none past it)
    assert len(ahead) == len(prompts) * (NEW - 2) and engine._ahead is None

    def steps(sid, n):
        got = []
        for _ in range(n):
            got += [o.token for o in engine.step() if o.seq == sid]
        return got

    # cancelled with a step ahead; then a sequence reusing the first one's prompt blocks
    a = engine.add(prompts[0], SamplingParams(), NEW)
    assert steps(a, 4) == own[0][:4] and engine._ahead is not None
    engine.cancel(a)
    assert not engine.has_work()
    assert _run(engine, prompts[:1]) == own[:1]
    # another sequence arrives while one runs ahead; an embedding between steps
    a = engine.add(prompts[1], SamplingParams(), NEW)
    got_a = steps(a, 3)
    assert engine._ahead is not None
    engine.embed(prompts[3])
    got_a += steps(a, 2)
    b = engine.add(prompts[2], SamplingParams(), NEW)
    out = {a: got_a, b: []}
    while engine.has_work():
        for o in engine.step():
            out[o.seq].append(o.token)
    assert out[a] == own[1] and out[b] == own[2]
    # rows the device's argmax does not serve (forced: every third), taken from the logits
    calls = [0]
    greedy = BatchEngine._greedy

    def now_and_then(s, stats, vocab):
        calls[0] += 1
        return greedy(s, stats, vocab) and calls[0] % 3 != 0

    monkeypatch.setattr(BatchEngine, "_greedy", staticmethod(now_and_then))
    assert [_run(engine, [p])[0] for p in prompts[:2]] == own[:2]


def test_steps_of_any_logits_row_count_share_a_plan(tiny):
    """Steps with 1..4 logits rows (sequences joining and finishing at different steps) take
    one plan per (rows per work-item of the products and of the logits, whether any), resized
    (a plan per count cost a step of 50-80 ms on an H100 at each count met first), and their
    tokens stay those of each sequence alone."""
    model, _ = tiny
    prompts = _prompts(3)[:4]
    engine = _engine(model)
    alone = [_run(engine, [p])[0] for p in prompts]
    engine = _engine(model)
    asked: set[tuple] = set()
    plan = engine._plan

    def recorded(n, nl, embed=False, decode=False, span=None):
        asked.add((n, nl, embed, decode))
        return plan(n, nl, embed, decode, span)

    engine._plan = recorded
    # staggered lengths: sequences leave one by one, so the logits rows go 4, 3, 2, 1
    ids = [engine.add(p, SamplingParams(), NEW + 3 * i) for i, p in enumerate(prompts)]
    got: dict[int, list[int]] = {i: [] for i in ids}
    while engine.has_work():
        for o in engine.step():
            got[o.seq].append(o.token)
    assert [got[i][:NEW] for i in ids] == alone
    assert {1, 2, 3, 4} <= {nl for _, nl, _, _ in asked}
    tm = engine._tm

    def kind(n, nl, e, d):  # (a lone decode row's plans: StepBuilder.lone_row, single_row)
        return LONE if engine._lone(n, nl, e, d) else SINGLE if engine._single(n, nl, e, d) \
            else (tm(n), tm(nl) if nl else 0, e)

    kinds = {kind(*a) for a in asked}
    assert len(engine._plans) == len(kinds) < len({(tm(n), nl, e, d) for n, nl, e, d in asked})


@pytest.mark.standin
@pytest.mark.parametrize("combine", [True, False], ids=["one-launch", "two-launches"])
def test_attention_split_over_positions_gives_the_models_tokens(tiny, monkeypatch, combine):
    """The GPUs' batched attention (paged_attn_wg: each row's positions in chunks over
    work-groups, whose partials the last of a (row, head) combines in the same launch, or
    paged_attn_combine in a second where no device-wide fence is known), run on this device
    too: every sequence gets the model's own tokens, with prompts longer than a chunk (the
    combine) and shorter."""
    model, _ = tiny
    monkeypatch.setattr(paged, "split_attention", lambda dev, head_dim: True)
    monkeypatch.setattr(attention, "decode_combines", lambda dev: combine)
    engine = _engine(model, row_invariant=True)  # (a lone decode row too: the split launches)
    assert engine.split
    rng = np.random.default_rng(5)
    prompts = _prompts()[:3] + [[int(t) for t in rng.integers(0, 300, n)] for n in (120, 90)]
    own = [list(model.generate_ids(p, max_new_tokens=NEW, stop_ids=[])) for p in prompts]
    assert _run(engine, prompts) == own
    assert _run(engine, prompts[::-1]) == own[::-1]  # the counters were left at zero
    # the chunks follow the step's span: a short prompt's step launches fewer than the
    # context's (the one above and the split launches resized back and forth between them)
    assert _run(engine, prompts[:1]) == own[:1]
    chunk, splits = attention.decode_chunk(engine.device, engine.context,
                                           model.config.n_heads)
    plan = engine._plans[(engine._tm(1), engine._tm(1), False)]  # (its last step's)
    span = len(prompts[0]) + NEW - 1
    want = min(splits, -(-(1 << (span - 1).bit_length()) // chunk))
    assert plan.span == span and want < splits
    for i, _ in plan.spanned:
        ln = plan.plan.launches[i]
        if ln.kernel.function_name == "paged_attn_wg":
            assert ln.global_size[0] == want * model.config.head_dim
        else:
            assert int(ln.args[3]) == want


def test_logits_and_logprobs_match_the_model(tiny):
    model, _ = tiny
    p = _prompts()[2]
    engine = _engine(model)
    engine.add(p, SamplingParams(logprobs=5), 1)
    outs = []
    while engine.has_work():  # 40 prompt tokens: three chunks of at most 16
        outs += engine.step()
    (out,) = outs
    logits = model.logits(p)[-1].astype(np.float64)
    logp = logits - np.logaddexp.reduce(logits)
    # NOTE: on GPUs with tensor cores the model's 40-row prompt rounds its rows to float16
    # (logit_tolerance) while the engine's chunks of 16 rows may not: a logprob moves by up to
    # twice that logit error (3e-3 on an H100)
    rel = logit_tolerance(model)
    tol = 1e-4 if rel < 1e-4 else 2 * rel * float(np.abs(logits).max())
    assert out.token == int(np.argmax(logits))
    assert out.logprob == pytest.approx(logp[out.token], abs=tol)
    top = sorted(logp, reverse=True)[:6]
    if min(a - b for a, b in zip(top, top[1:])) > 2 * tol:  # no near tie to reorder
        assert [t for t, _ in out.top] == list(np.argsort(-logp, kind="stable")[:5])
    assert [v for _, v in out.top] == pytest.approx(top[:5], abs=tol)
    # greedy with no top log-probabilities: the device's row statistics give token and logprob
    engine.add(p, SamplingParams(), 1)
    (fast,) = [o for _ in range(3) if engine.has_work() for o in engine.step()]
    assert fast.token == out.token and fast.top == []
    assert fast.logprob == pytest.approx(out.logprob, abs=max(tol, 1e-5))


def test_greedy_tokens_match_transformers(tiny):
    torch = pytest.importorskip("torch")
    model, ref = tiny
    if model.kv_half:
        pytest.skip("a float16 cache promises transformers' float32 logits within its rounding "
                    "(test_hf_models), not its greedy tokens at near ties; the engine's tokens "
                    "are checked against the model's own above")
    prompts = _prompts(1)[:3]
    got = _run(_engine(model), prompts)
    for p, g in zip(prompts, got):
        with torch.no_grad():
            want = ref.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False,
                                eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert g == want


def test_sampling_is_per_sequence_and_repeatable(tiny):
    """A sequence's draws are its own: alone or batched, the same seed gives the same tokens
    where every step is batched (``row_invariant``; a lone decode row may take another kernel,
    whose last bits move a draw near a boundary), and the same run twice the same tokens."""
    model, _ = tiny
    prompts = _prompts()[:4]
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7)
    alone = [_run(_engine(model, row_invariant=True), [p], params)[0] for p in prompts]
    assert _run(_engine(model, row_invariant=True), prompts, params) == alone
    assert _run(_engine(model), prompts, params) == _run(_engine(model), prompts, params)
    assert [_run(_engine(model), [p], params)[0] for p in prompts[:2]] == \
        [_run(_engine(model), [p], params)[0] for p in prompts[:2]]
    other = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=8)
    assert _run(_engine(model, row_invariant=True), prompts, other) != alone


def test_mask_constrains_every_token(tiny):
    model, _ = tiny
    V = model.config.vocab_size
    allowed = np.zeros(V, bool)
    allowed[[3, 17, 250]] = True
    calls = []

    def mask(seq: int) -> np.ndarray:
        calls.append(seq)
        return allowed

    engine = _engine(model)
    sid = engine.add(_prompts()[0], SamplingParams(temperature=1.0, seed=1), NEW, mask=mask)
    toks = []
    while engine.has_work():
        toks += [o.token for o in engine.step()]
    assert len(toks) == NEW and set(toks) <= {3, 17, 250}
    assert calls == [sid] * NEW


def test_blocks_come_back_and_cancel_frees_at_once(tiny):
    model, _ = tiny
    engine = _engine(model, num_blocks=12)
    total = engine.stats()["total_blocks"]
    a = engine.add(_prompts()[2], SamplingParams(), 30)  # 70 positions: 9 blocks of 8
    b = engine.add(_prompts()[1], SamplingParams(), 30)  # 47: 6 blocks: waits for a's
    engine.step()
    st = engine.stats()
    assert (st["running"], st["waiting"]) == (1, 1)
    assert st["free_blocks"] == total - 9
    engine.cancel(a)
    assert engine.stats()["free_blocks"] == total
    engine.step()
    assert engine.stats()["running"] == 1
    engine.cancel(b)
    engine.cancel(b)  # twice is harmless
    st = engine.stats()
    assert (st["running"], st["waiting"], st["free_blocks"]) == (0, 0, total)
    assert not engine.has_work()


def test_bad_requests_are_refused_clearly(tiny):
    model, _ = tiny
    engine = _engine(model)
    with pytest.raises(ValueError, match="context of 160"):
        engine.add([1] * 150, SamplingParams(), 20)
    with pytest.raises(ValueError, match="empty"):
        engine.add([], SamplingParams(), 4)
    with pytest.raises(ValueError, match="token ids"):
        engine.add([model.config.vocab_size], SamplingParams(), 4)
    with pytest.raises(ValueError, match="top_p"):
        engine.add([1, 2], SamplingParams(top_p=0.0), 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.add([1, 2], SamplingParams(), 0)
    assert not engine.has_work()


def test_embedding_is_the_mean_last_hidden_state(tiny):
    torch = pytest.importorskip("torch")
    model, ref = tiny
    p = _prompts()[5]
    engine = _engine(model)
    e = engine.embed(p)
    with torch.no_grad():
        want = ref(torch.tensor([p]), output_hidden_states=True).hidden_states[-1][0].mean(0)
    # (a float16 cache rounds each key and value by up to 2^-11: 2e-4 here)
    tol = 2e-3 if model.kv_half else 1e-4
    np.testing.assert_allclose(e, want.numpy(), rtol=tol, atol=tol)
    assert engine.stats()["free_blocks"] == engine.stats()["total_blocks"]


def test_engine_inside_a_stream_block(tiny):
    """Steps inside a ``clops.stream`` block (another queue, out of order) keep their copies and
    reads on the model's queue, in order with the step's launches: the tokens of the steps
    outside the block, and an embedding's rows."""
    model, _ = tiny
    prompts = _prompts(1)
    want = _run(_engine(model), prompts)
    vecs = [_engine(model).embed(p) for p in prompts[:2]]
    with clops.stream(device=model.device, out_of_order=True):
        got = _run(_engine(model), prompts)
        got_vecs = [_engine(model).embed(p) for p in prompts[:2]]
    assert got == want
    for a, b in zip(got_vecs, vecs):
        np.testing.assert_array_equal(a, b)
