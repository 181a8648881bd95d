"""gpt-oss's safetensors checkpoints as OpenAI publishes them: the experts' weights in MXFP4
(``*_blocks``: two E2M1 values a byte, the lower nibble first; ``*_scales``: an E8M0 exponent
per 32 values; rows are the outputs, gate and up rows interleaved). A tiny gpt-oss whose experts
are quantized so (by the gguf package's MXFP4 quantizer), saved that way, gives the logits and
greedy tokens of transformers running the dequantized weights."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import clops.llm  # noqa: E402
from clops.llm.gguf_file import ModelFileError  # noqa: E402

from .families import hf_greedy, hf_logits, make  # noqa: E402
from .tiny import logit_tolerance  # noqa: E402

PROMPT = 24


def _mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w`` [experts, rows, k] quantized: (blocks [experts, rows, k / 32, 16], scales
    [experts, rows, k / 32], the dequantized values)."""
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    e, rows, k = w.shape
    q = quants.quantize(w.reshape(-1, k).astype(np.float32), T.MXFP4)
    deq = quants.dequantize(q, T.MXFP4).reshape(w.shape)
    blk = q.reshape(e, rows, k // 32, 17)
    scales, qs = blk[..., 0], blk[..., 1:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1)  # GGUF: values j and j + 16 a byte
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)  # the checkpoint: 2i and 2i + 1
    return np.ascontiguousarray(blocks), np.ascontiguousarray(scales), deq


@pytest.fixture(scope="module")
def mxfp4_model(tmp_path_factory):
    from safetensors.numpy import load_file, save_file

    tmp = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    ref, hf, _ = make("gpt_oss", str(tmp))
    out = str(tmp / "mxfp4")
    shutil.copytree(hf, out)
    [st] = [f for f in os.listdir(out) if f.endswith(".safetensors")]
    tensors = load_file(os.path.join(out, st))
    for i, layer in enumerate(ref.model.layers):
        ex = layer.mlp.experts
        for name in ("gate_up_proj", "down_proj"):
            p = getattr(ex, name)
            # the parameter is [experts, in, out]; the checkpoint's blocks are [.., out, in]
            blocks, scales, deq = _mxfp4(p.detach().numpy().transpose(0, 2, 1))
            key = f"model.layers.{i}.mlp.experts.{name}"
            del tensors[key]
            tensors[key + "_blocks"], tensors[key + "_scales"] = blocks, scales
            with torch.no_grad():
                p.copy_(torch.from_numpy(deq.transpose(0, 2, 1).copy()))
    save_file(tensors, os.path.join(out, st))
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    return ref, out


def _source(path):
    from clops.llm.safetensors_file import open_directory
    from clops.llm.weights import SafetensorsSource

    return SafetensorsSource(path, open_directory(path)[1])


def test_mxfp4_experts_match_transformers_dequantized(mxfp4_model, device):
    ref, path = mxfp4_model
    # float rows (no int8 activations: on NVIDIA GPUs a prompt's grouped products of 4- and
    # 8-bit experts quantize their rows, checked at the end): the exact weights' float32 sums
    model = clops.llm.load(path, device=device, max_seq_len=64, progress=False,
                           kv_cache="float32", int8_activations=False)
    # the placement's estimate of the experts' device bytes: the repacked format's, not the
    # file's (the row layout's within its rows' padding)
    src = _source(path)
    src.validate(model.config)
    fused = model.layers[0].experts.gate_up
    assert fused is not None
    want = sum(src.device_nbytes(f"blk.0.{k}_exps", fused.layout) for k in ("gate", "up"))
    assert want <= fused.nbytes <= want + 16 * fused.n
    ex = model.layers[0].experts
    # (MXFP4 as the file has it in the row layout (GPUs), else its values as int8 and a scale;
    # gate and up one weight)
    assert ex.gate_up is not None
    assert ex.gate_up.fmt == ("m4" if fused.layout == "rows" else "q8")
    # (int8_activations=False reaches the experts' products too, which no other layer reads)
    assert not any(w.int8 for ly in model.layers if ly.experts is not None
                   for w in [ly.experts.router, *ly.experts.products()])
    ids = np.random.default_rng(4).integers(0, ref.config.vocab_size, PROMPT).tolist()
    got, want = model.logits(ids), hf_logits(ref, ids)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    # (twice the float files' bound: MXFP4's values reach 6 times their block's scale, and a
    # product's float32 rounding grows with its terms; the H200 measured 2.03e-5 once)
    assert err < 2 * logit_tolerance(model), f"relative logit error {err:.2e}"
    prompt = ids[:5]
    tokens = list(model.generate_ids(prompt, max_new_tokens=16, stop_ids=[]))
    assert tokens == hf_greedy(ref, prompt, 16)
    # the default load (int8 rows where the device takes them): within their error of the
    # reference (a few percent of the largest logit; float rows elsewhere, as above)
    default = clops.llm.load(path, device=device, max_seq_len=64, progress=False,
                             kv_cache="float32")
    err = float(np.abs(default.logits(ids) - want).max() / np.abs(want).max())
    assert err < 5e-2, f"relative logit error {err:.2e} with int8 rows"


def test_mxfp4_blocks_of_the_wrong_type_are_refused(mxfp4_model, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, path = mxfp4_model
    bad = str(tmp_path / "bad")
    shutil.copytree(path, bad)
    [st] = [f for f in os.listdir(bad) if f.endswith(".safetensors")]
    tensors = load_file(os.path.join(bad, st))
    key = "model.layers.0.mlp.experts.down_proj_scales"
    tensors[key] = tensors[key].astype(np.int16)
    save_file(tensors, os.path.join(bad, st))
    with pytest.raises(ModelFileError, match="down_proj_scales.*not U8"):
        clops.llm.load(bad, progress=False)


@pytest.mark.standin
def test_a_lone_decode_rows_experts_on_the_int8_path(mxfp4_model, device, monkeypatch):
    """A lone decode row's experts on the int8 decode path (matmul.cl QX with EXPERTS; forced
    here with the GPU plan, as NVIDIA GPUs take it): each slot its expert's product with its
    biases, and the down products' last work-groups adding up the slots into the residual
    stream (``matmul``'s ``slot_sum=``), with no weighted-sum launch, and the clamped GLU
    folded into the down products: the greedy tokens of the
    same plan with the weighted sum as a launch of its own, and near transformers' logits."""
    from clops.kernels import launch, matmul, moe

    ref, path = mxfp4_model
    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr("clops.nn.quant.layout_for", lambda dev: "rows")
    monkeypatch.setattr(matmul, "int8_activations",
                        lambda dev, m, fmt, k: m == 1 and fmt in matmul.INT8_FORMATS)
    combines: list[int] = []
    real = moe.combine

    def spy(*a, **kw):
        combines.append(kw["m"])
        return real(*a, **kw)

    monkeypatch.setattr(moe, "combine", spy)
    prompt = np.random.default_rng(5).integers(0, ref.config.vocab_size, 5).tolist()
    runs = []
    for sums in (True, False):
        monkeypatch.setattr(matmul, "int8_slots",
                            lambda dev, w, on=sums: on and w.fmt in matmul.INT8_FORMATS)
        combines.clear()
        model = clops.llm.load(path, device=device, max_seq_len=64, progress=False,
                               kv_cache="float32")
        runs.append(list(model.generate_ids(prompt, max_new_tokens=12, stop_ids=[])))
        # (the prompt's plan keeps its weighted sums; a decode row's go into the products
        # where they take the slots' sum)
        assert (1 in combines) != sums, combines
        # (and its clamped GLU in the down products' prologue: no launch of its own)
        decode = model._plans[next(key for key in model._plans if key[0] == 1)]
        assert "glu_clamp" not in [ln.kernel.function_name for ln in decode.launches]
        one = model.logits(prompt[:1])[-1]
        want = hf_logits(ref, prompt[:1])[-1]
        assert np.abs(one - want).max() / np.abs(want).max() < 5e-2
    assert runs[0] == runs[1]
