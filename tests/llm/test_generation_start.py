"""A generation's copies and reads: the tokens seen so far (what a repetition penalty reads)
are written only for a generation with a penalty, so that one after generations without it
chooses as a freshly loaded model does; inside a ``clops.stream`` block the copies and reads
stay on the model's queue, in order with its launches. On any device."""

from __future__ import annotations

import numpy as np
import pytest

import clops
import clops.llm

from ..fuzz.tiny_files import TinyShape, write_gguf

SHAPE = TinyShape(dim=128, layers=2, heads=4, kv_heads=2, head_dim=32, ffn=256,
                  embed_type="Q8_0", output_type="Q8_0", context=256,
                  layer_types=(("Q8_0", "Q4_0", "Q8_0", "Q4_0"),))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_penalty_after_generations_without_one(device, tmp_path, temperature):
    path = write_gguf(str(tmp_path / "tiny.gguf"), shape=SHAPE)
    used = clops.llm.load(path, device=device, max_seq_len=256, progress=False)
    # (without a penalty: other prompts, whose chosen tokens the kernels mark as seen)
    for prompt in ([11, 12, 13], [40, 41, 42, 43, 44]):
        list(used.generate_ids(prompt, max_new_tokens=16, stop_ids=[], temperature=temperature,
                               seed=1))
    fresh = clops.llm.load(path, device=device, max_seq_len=256, progress=False)
    prompt = [5, 9, 2, 7]
    got = {name: list(m.generate_ids(prompt, max_new_tokens=16, stop_ids=[],
                                     temperature=temperature, seed=3,
                                     repetition_penalty=0.3))
           for name, m in (("used", used), ("fresh", fresh))}
    assert got["used"] == got["fresh"]
    # (the penalty chose differently: the seen tokens were read)
    assert got["fresh"] != list(fresh.generate_ids(prompt, max_new_tokens=16, stop_ids=[],
                                                   temperature=temperature, seed=3))


@pytest.mark.parametrize("own_queue", [False, True])
def test_generation_inside_a_stream_block(device, monkeypatch, tmp_path, own_queue):
    """A generation inside a ``clops.stream`` block (another queue, out of order) runs on the
    model's own queue all the same: its copies and reads of tokens stay in order with its
    launches, and it gives the tokens and logits it gives outside the block."""
    from clops.llm import model as model_mod

    monkeypatch.setattr(model_mod, "token_queue", lambda dev: own_queue)
    path = write_gguf(str(tmp_path / "tiny.gguf"), shape=SHAPE)
    model = clops.llm.load(path, device=device, max_seq_len=256, progress=False)
    # (two prompts in turn: a read that ran ahead of the launches would find the other
    # prompt's token at that position)
    prompts = ([5, 9, 2, 7], [60, 3, 81, 14])
    want = {(i, n): list(model.generate_ids(p, max_new_tokens=n, stop_ids=[]))
            for n in (1, 12) for i, p in enumerate(prompts)}
    assert want[0, 1] != want[1, 1]
    logits = [model.logits(p) for p in prompts]
    with clops.stream(device=model.device, out_of_order=True):
        got = {(i, n): list(model.generate_ids(p, max_new_tokens=n, stop_ids=[]))
               for n in (1, 12) for i, p in enumerate(prompts)}
        got_logits = [model.logits(p) for p in prompts]
    assert got == want
    assert all(np.array_equal(a, b) for a, b in zip(got_logits, logits))
