"""The batched engine's host sampler (``clops.llm.batch._sample``), which sorts only the prefix
of tokens its filters keep: the same token as a draw over the whole sorted vocabulary, for the
same random state, under top-k, top-p and min-p, with ties and disallowed tokens; and, with no
filter (no order at all), frequencies that follow softmax(z)."""

from __future__ import annotations

import numpy as np
import pytest

from clops.llm.batch import SamplingParams, _sample


def _reference(z: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """The definition: sort everything (ties by index), filter, draw."""
    order = np.argsort(-z, kind="stable")
    zs = z[order]
    keep = int(np.isfinite(zs).sum())
    if p.top_k > 0:
        keep = min(keep, p.top_k)
    zs = zs[:keep]
    probs = np.exp(zs - zs[0])
    probs /= probs.sum()
    if p.top_p < 1.0:
        probs = probs[: int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)]
    if p.min_p > 0.0:
        probs = probs[probs >= p.min_p * probs[0]]
    probs = probs / probs.sum()
    return int(order[rng.choice(len(probs), p=probs)])


def _logits(seed: int, v: int, spread: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(v) * spread
    z[rng.integers(0, v, 8)] += 6.0  # a few likely tokens, as a model's logits have
    z = np.round(z, 1)  # many exact ties
    z[rng.random(v) < 0.2] = -np.inf  # disallowed by a mask
    return z


FILTERED = [SamplingParams(temperature=1.0, top_k=40),
            SamplingParams(temperature=1.0, top_k=1),
            SamplingParams(temperature=1.0, top_p=0.9),
            SamplingParams(temperature=1.0, top_p=0.3),
            SamplingParams(temperature=1.0, top_p=0.999),
            SamplingParams(temperature=1.0, top_k=50, top_p=0.8),
            SamplingParams(temperature=1.0, min_p=0.05),
            SamplingParams(temperature=1.0, min_p=0.001),
            SamplingParams(temperature=1.0, top_p=0.95, min_p=0.01),
            SamplingParams(temperature=1.0, top_k=5000, min_p=0.0001)]


@pytest.mark.parametrize("p", FILTERED, ids=lambda p: f"k{p.top_k}-p{p.top_p}-m{p.min_p}")
@pytest.mark.parametrize("v,spread", [(49152, 2.0), (49152, 0.5), (300, 3.0), (7, 1.0)])
def test_filtered_draws_equal_the_whole_sort(p, v, spread):
    for seed in range(12):
        z = _logits(seed, v, spread)
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        for _ in range(5):
            assert _sample(z, p, a) == _reference(z, p, b)


def test_unfiltered_draws_follow_the_softmax():
    z = np.array([2.0, -np.inf, 0.5, 0.5, -1.0, 1.5, -np.inf, 0.0])
    want = np.exp(z - z.max())
    want /= want.sum()
    rng = np.random.default_rng(0)
    n = 40_000
    counts = np.bincount([_sample(z, SamplingParams(temperature=1.0), rng) for _ in range(n)],
                         minlength=len(z))
    assert counts[1] == counts[6] == 0  # disallowed: never
    # within 5 standard deviations of the expected counts
    sd = np.sqrt(n * want * (1 - want))
    assert np.all(np.abs(counts - n * want) <= 5 * sd + 1e-9), (counts, n * want)


def test_one_allowed_token_is_chosen():
    z = np.full(1000, -np.inf)
    z[637] = -3.0
    for p in [SamplingParams(temperature=1.0), *FILTERED]:
        assert _sample(z, p, np.random.default_rng(0)) == 637


def _choose(row, params, counts=None, seen=None):
    """The engine's choice of a token from ``row`` for a sequence that generated ``counts``."""
    import types

    from clops.llm.batch import BatchEngine, _Seq

    s = _Seq(0, [1], params, 8, None, np.random.default_rng(0), seen=set(seen or ()),
             counts=dict(counts or {}))
    fake = types.SimpleNamespace(_chosen=lambda s, tok, lp, top: tok)
    return BatchEngine._choose(fake, s, np.asarray(row, np.float32), 0.0)


def test_presence_and_frequency_penalties_are_openais():
    row = [0.0, 3.0, 2.6, 2.0, -1.0]
    assert _choose(row, SamplingParams()) == 1
    # generated once: 3.0 - 0.5 = 2.5 < 2.6
    assert _choose(row, SamplingParams(presence_penalty=0.5), {1: 1}) == 2
    assert _choose(row, SamplingParams(presence_penalty=0.3), {1: 1}) == 1
    # three times: 3.0 - 3 * 0.2 = 2.4 < 2.6; once: 2.8 > 2.6
    assert _choose(row, SamplingParams(frequency_penalty=0.2), {1: 3}) == 2
    assert _choose(row, SamplingParams(frequency_penalty=0.2), {1: 1}) == 1
    # both: 3.0 - 0.1 - 2 * 0.2 = 2.5 < 2.6
    assert _choose(row, SamplingParams(presence_penalty=0.1, frequency_penalty=0.2),
                   {1: 2}) == 2
    # the prompt's tokens are not penalised (only generated ones), and negative values reward
    assert _choose(row, SamplingParams(presence_penalty=2.0), {}, seen={1}) == 1
    assert _choose(row, SamplingParams(presence_penalty=-1.5), {3: 1}) == 3


def test_logit_bias_is_added_to_the_logits():
    row = [0.0, 3.0, 2.6, 2.0, -1.0]
    assert _choose(row, SamplingParams(logit_bias={4: 4.5})) == 4
    assert _choose(row, SamplingParams(logit_bias={4: 3.9})) == 1
    assert _choose(row, SamplingParams(logit_bias={1: -100.0})) == 2
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={1: 101.0}).check()
    with pytest.raises(ValueError, match="presence_penalty"):
        SamplingParams(presence_penalty=2.5).check()
