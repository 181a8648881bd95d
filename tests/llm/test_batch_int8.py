"""The batched engine's int8 rows (GPUs: ``matmul.matmul_qrows`` for 4- and 8-bit weights),
forced on the test device with the GPUs' row-major weights: every sequence's tokens the same
alone and in any batch, and its logits near the model's own float products'."""

from __future__ import annotations

import numpy as np
import pytest

import clops.llm
from clops.kernels import matmul
from clops.llm.batch import BatchEngine, SamplingParams

from ..fuzz.tiny_files import TinyShape, write_gguf

# (a GPU path run on the CPU device: .ci/run's second pass leaves it out)
pytestmark = pytest.mark.standin

SHAPE = TinyShape(dim=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512,
                  embed_type="Q8_0", output_type="Q8_0", context=256,
                  layer_types=(("Q4_0", "Q8_0", "Q4_1", "Q8_0"), ("Q4_K", "Q4_1", "Q8_0", "Q4_K")))


def _run(engine: BatchEngine, prompts, new: int = 8, **params):
    ids = [engine.add(p, SamplingParams(**params), new) for p in prompts]
    out: dict[int, list] = {i: [] for i in ids}
    while engine.has_work():
        for o in engine.step():
            out[o.seq].append(o)
    return [out[i] for i in ids]


@pytest.mark.parametrize("tensor_cores", [False, True], ids=["dp4a", "tensor-cores"])
def test_int8_rows_batched_equals_alone(device, monkeypatch, tmp_path, tensor_cores):
    monkeypatch.setattr("clops.nn.quant.layout_for", lambda dev: "rows")
    monkeypatch.setattr(matmul, "int8_batch", lambda dev, w: w.int8 and w.fmt in ("q4", "q8")
                        and w.layout == "rows" and not w.defines.get("QMIN"))
    # tensor-cores: the 8-bit layers on matmul_qmma as on NVIDIA GPUs (its instruction emulated
    # where the device has no PTX), the 4-bit ones on matmul_qrows; dp4a: every layer on it
    monkeypatch.setattr(matmul, "qmma_geometry",
                        lambda dev, w: matmul.qmma_takes(w) if tensor_cores else None)
    path = write_gguf(str(tmp_path / "mixed.gguf"), shape=SHAPE)
    model = clops.llm.load(path, device=device, max_seq_len=256, progress=False,
                           kv_cache="float32")
    kw = dict(max_batch=4, block_size=16, prefill_chunk=16, row_invariant=True)
    engine = BatchEngine(model, **kw)
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(0, 200, n)] for n in (5, 23, 40, 9, 3, 17, 31)]
    alone = [[o.token for o in _run(engine, [p])[0]] for p in prompts]
    names = {ln.kernel.function_name for plan in engine._plans.values()
             for ln in plan.plan.launches}
    assert {"quantize_rows", "matmul_qrows"} <= names
    assert ("matmul_qmma" in names) == tensor_cores
    together = [[o.token for o in seq] for seq in _run(BatchEngine(model, **kw), prompts)]
    assert together == alone
    assert [[o.token for o in seq] for seq in _run(engine, prompts[::-1])] == alone[::-1]
    # a prompt's next-token log-probabilities near the model's float rows' (int8 rows move
    # logits by about 1-4% of the largest)
    (out,) = _run(BatchEngine(model, **kw), [prompts[2]], new=1, logprobs=5)
    logits = model.logits(prompts[2])[-1].astype(np.float64)
    logp = logits - np.logaddexp.reduce(logits)
    tol = 0.05 * float(np.abs(logits).max())
    assert out[0].logprob == pytest.approx(logp[out[0].token], abs=tol)
    assert [v for _, v in out[0].top] == pytest.approx(sorted(logp, reverse=True)[:5], abs=tol)
