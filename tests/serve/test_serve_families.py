"""``clops serve`` on every family the library loads, through the official ``openai`` client:
tiny models of each family of ``tests.llm.families`` (among them a Gemma 3 body with
sliding-window layers shorter than the prompts, a Phi-3 body with partial rotary and
mixtures of experts), several requests at once, answer the same greedy text as
``Model.generate`` alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("torch")
pytest.importorskip("transformers")

import clops.llm  # noqa: E402

from ..llm.families import FAMILIES, WINDOW, make  # noqa: E402
from .conftest import start  # noqa: E402

NEW = 8
PROMPTS = ["w1 w2", "w5 w17 w42 w7 w3 w9", "the cat sat on the mat and then it slept all day",
           "w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_served_family_answers_as_the_model_alone(family, tmp_path, device):
    _, hf, gguf_path = make(family, str(tmp_path))
    # (half the families from safetensors, half from GGUF)
    path = hf if list(FAMILIES).index(family) % 2 == 0 or family == "gemma3" else gguf_path
    model = clops.llm.load(path, device=device, max_seq_len=64, progress=False,
                           kv_cache="float32")
    cfg = model.config
    if family == "gemma3":
        assert cfg.sliding_window == WINDOW
        assert max(len(model.tokenizer.encode(p)) for p in PROMPTS) > WINDOW
    elif family == "phi3":
        assert cfg.rotary < cfg.head_dim
    elif family in ("qwen3moe", "mixtral", "olmoe", "gpt_oss"):
        assert cfg.n_experts > cfg.n_experts_used > 1
    alone = ["".join(model.generate(p, max_new_tokens=NEW)) for p in PROMPTS]
    run = start(model, parallel=4, model_name=family, prefill_chunk=16)
    try:
        client = openai.OpenAI(base_url=run.url + "/v1", api_key="none", max_retries=0,
                               timeout=120)

        def ask(p: str) -> str:
            out = client.completions.create(model=family, prompt=p, max_tokens=NEW,
                                            temperature=0)
            return out.choices[0].text

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            served = list(pool.map(ask, PROMPTS))
        assert run.server.engine.stats()["generated_tokens"] > 0
    finally:
        run.stop()
    assert served == alone and any(alone)
