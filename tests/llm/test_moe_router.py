"""The router of a mixture of experts against transformers': the experts clops chooses on the
device (the last layer's choices, read back after a prompt) are transformers' choices wherever
the k-th and the next expert's scores are apart by more than rounding; where they tie within
rounding, clops' choice is one of the tied experts; and an exact tie (two experts with the same
router row and the same weights) goes to the lower expert index, with logits still equal to
transformers'."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import clops.llm  # noqa: E402

from .families import hf_logits, make  # noqa: E402
from .tiny import logit_tolerance  # noqa: E402

PROMPT = 40


def _hf_router_scores(ref, ids: list[int]) -> np.ndarray:
    """transformers' router scores of the last layer [rows, experts]."""
    with torch.no_grad():
        out = ref(torch.tensor([ids]), output_router_logits=True)
    return out.router_logits[-1].float().numpy().reshape(len(ids), -1)


def _clops_choices(model) -> np.ndarray:
    """The experts clops' last layer chose for each row of the last prompt chunk [rows, k]."""
    cfg, b = model.config, model.ex
    got = np.zeros(PROMPT * cfg.n_experts_used, np.int32)
    model.device.read(got, b.ids)
    return got.reshape(PROMPT, cfg.n_experts_used)


def _check_choices(scores: np.ndarray, chosen: np.ndarray, bound: float) -> int:
    """Asserts the rules above; returns how many rows had a clear choice."""
    k = chosen.shape[1]
    clear = 0
    for r, row in enumerate(scores):
        order = np.argsort(-row, kind="stable")
        kth, nxt = row[order[k - 1]], row[order[k]]
        if kth - nxt > bound:
            assert sorted(chosen[r]) == sorted(order[:k]), f"row {r}"
            clear += 1
        else:  # a tie within rounding: every choice scores at least the k-th, within it
            assert (row[chosen[r]] >= kth - bound).all(), f"row {r}"
    return clear


def test_router_chooses_transformers_experts(tmp_path, device):
    ref, hf, _ = make("qwen3moe", str(tmp_path))
    model = clops.llm.load(hf, device=device, max_seq_len=64, progress=False,
                           kv_cache="float32")
    ids = np.random.default_rng(5).integers(0, ref.config.vocab_size, PROMPT).tolist()
    model.logits(ids)
    scores = _hf_router_scores(ref, ids)
    bound = 1e-4 * float(np.abs(scores).max())
    clear = _check_choices(scores, _clops_choices(model), bound)
    assert clear > PROMPT * 0.9


def test_an_exact_tie_goes_to_the_lower_expert(tmp_path, device):
    """The last expert of the last layer made a copy (router row and weights) of the expert
    its router most often ranks k-th: transformers and clops agree on the logits whichever of
    the two is taken, and where the pair straddles the k-th place clops takes the lower
    index."""
    ref, _, _ = make("qwen3moe", str(tmp_path / "base"))
    ids = np.random.default_rng(6).integers(0, ref.config.vocab_size, PROMPT).tolist()
    k, last_e = ref.config.num_experts_per_tok, ref.config.num_local_experts - 1
    kth = np.argsort(-_hf_router_scores(ref, ids), axis=1, kind="stable")[:, k - 1]
    a = int(np.argmax(np.bincount(kth, minlength=last_e + 1)[:last_e]))
    last = ref.model.layers[-1].mlp
    with torch.no_grad():
        last.gate.weight[last_e] = last.gate.weight[a]
        last.experts.gate_up_proj[last_e] = last.experts.gate_up_proj[a]
        last.experts.down_proj[last_e] = last.experts.down_proj[a]
    hf = str(tmp_path / "tied")
    ref.save_pretrained(hf, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "tied" / name).write_bytes((tmp_path / "base" / "hf" / name).read_bytes())
    model = clops.llm.load(hf, device=device, max_seq_len=64, progress=False,
                           kv_cache="float32")
    got, want = model.logits(ids), hf_logits(ref, ids)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < logit_tolerance(model)
    chosen = _clops_choices(model)
    scores = _hf_router_scores(ref, ids)
    assert (scores[:, a] == scores[:, last_e]).all()
    has_a, has_last = (chosen == a).any(axis=1), (chosen == last_e).any(axis=1)
    assert not (has_last & ~has_a).any()
    # the tie matters: it straddles the k-th place in some rows
    assert (has_a & ~has_last).sum() >= 3
