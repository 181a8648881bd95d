"""clops logits and generation against transformers on tiny random safetensors models."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import clops.llm  # noqa: E402

from .tiny import VOCAB, hf_logits, logit_tolerance, make_model  # noqa: E402

CASES = {
    "llama": dict(arch="llama"),
    "llama-tied": dict(arch="llama", tied=True),
    "llama3-rope-scaling": dict(arch="llama", rope_scaling=True),
    "qwen2": dict(arch="qwen2"),
    "llama-bf16": dict(arch="llama", dtype="bfloat16"),
    "qwen2-f16": dict(arch="qwen2", dtype="float16", tied=True),
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    ref = make_model(path, **CASES[request.param])
    return request.param, path, ref


def test_logits_match_transformers(pair, device):
    name, path, ref = pair
    model = clops.llm.load(path, device=device, max_seq_len=256, progress=False)
    rng = np.random.default_rng(1)
    # longer than the prefill chunk, so the KV cache carries over between chunks
    ids = rng.integers(0, VOCAB, 150).tolist()
    got = model.logits(ids)
    want = hf_logits(ref, ids)
    assert got.shape == (150, VOCAB) and got.dtype == np.float32
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < logit_tolerance(model), f"{name}: relative logit error {err}"
    assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.99


def test_greedy_decode_matches_transformers(pair, device):
    import torch

    name, path, ref = pair
    model = clops.llm.load(path, device=device, max_seq_len=256, progress=False)
    prompt = [5, 17, 42, 7, 99, 3]
    got = list(model.generate_ids(prompt, max_new_tokens=20, temperature=0.0,
                                  stop_ids=[]))
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    want = out[0, len(prompt):].tolist()
    assert got == want, name


def test_float16_kv_cache_matches_transformers(pair, device):
    """A cache of float16 keys and values (the GPUs' default; here on the test device's own
    prompt and decode kernels): a prompt longer than a chunk, then a decode step, against
    transformers in float32, within the float16 rounding of the cache."""
    name, path, ref = pair
    model = clops.llm.load(path, device=device, max_seq_len=256, progress=False,
                           kv_cache="float16")
    assert model.kv_half
    ids = np.random.default_rng(3).integers(0, VOCAB, 150).tolist()
    got, want = model.logits(ids), hf_logits(ref, ids)
    tol = logit_tolerance(model)
    assert np.abs(got - want).max() / np.abs(want).max() < tol, name
    # a decode step (attention over the cache written by the prompt and the step before)
    first = list(model.generate_ids(ids, max_new_tokens=2, stop_ids=[]))[0]
    step = np.empty(VOCAB, np.float32)  # (the logits of the step after the first new token)
    model.device.read(step, model.logits_buf, blocking=True)
    want_step = hf_logits(ref, ids + [first])[-1]
    assert np.abs(step - want_step).max() / np.abs(want_step).max() < tol, name


def test_kv_cache_type_is_checked(tmp_path, device):
    path = str(tmp_path)
    make_model(path, "llama")
    with pytest.raises(ValueError, match="kv_cache must be one of"):
        clops.llm.load(path, device=device, progress=False, kv_cache="int8")
    assert not clops.llm.load(path, device=device, progress=False, kv_cache="float32").kv_half
