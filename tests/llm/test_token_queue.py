"""Generation's reads of the chosen tokens on a queue of their own (GPUs: the next step's
kernels do not wait behind each copy to the host): the same tokens as reads on the decode
queue, greedy and sampled, on any device; a generation's last token read on the decode queue."""

from __future__ import annotations

import pytest

import clops.llm
from clops.llm import model as model_mod

from ..fuzz.tiny_files import TinyShape, write_gguf

SHAPE = TinyShape(dim=128, layers=2, heads=4, kv_heads=2, head_dim=32, ffn=256,
                  embed_type="Q8_0", output_type="Q8_0", context=256,
                  layer_types=(("Q8_0", "Q4_0", "Q8_0", "Q4_0"),))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_token_queue_gives_the_same_tokens(device, monkeypatch, tmp_path, temperature):
    path = write_gguf(str(tmp_path / "tiny.gguf"), shape=SHAPE)
    model = clops.llm.load(path, device=device, max_seq_len=256, progress=False)
    out = {}
    for own in (False, True):
        monkeypatch.setattr(model_mod, "token_queue", lambda dev, own=own: own)
        out[own] = [list(model.generate_ids([5, 9, 2, 7], max_new_tokens=24, stop_ids=[],
                                            temperature=temperature, seed=3))
                    for _ in range(2)]
    assert len(out[True][0]) == 24
    assert out[True] == out[False]
    # (a generation's last token, which no step follows, is read on the decode queue: one
    # token alone, and two)
    monkeypatch.setattr(model_mod, "token_queue", lambda dev: True)
    for n in (1, 2):
        got = list(model.generate_ids([5, 9, 2, 7], max_new_tokens=n, stop_ids=[],
                                      temperature=temperature, seed=3))
        assert got == out[False][0][:n]
    # (the queue of its own was made, and is kept for the next generation)
    assert model._token_queue is not None
