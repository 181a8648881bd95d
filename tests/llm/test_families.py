"""Every supported family against transformers: a tiny random model of it, made with
transformers' own classes (``tests.llm.families``), loaded by clops from its safetensors
directory and from the GGUF file llama.cpp's converter would write, gives transformers'
float32 logits (top-1 equal wherever transformers' choice is not a near tie, relative error
under LOGIT_BOUND) and the same 32 greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import clops.llm  # noqa: E402
from clops.llm.arch import ARCHS  # noqa: E402

from .families import FAMILIES, WINDOW, hf_greedy, hf_logits, make  # noqa: E402
from .tiny import logit_tolerance  # noqa: E402

PROMPT = 40  # tokens: five sliding windows, so that the windows matter
GREEDY = 32


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    ref, hf, gguf_path = make(request.param, str(tmp_path_factory.mktemp(request.param)))
    return request.param, ref, {"safetensors": hf, "gguf": gguf_path}


def test_every_architecture_has_a_family_test():
    assert {FAMILIES[f][3] for f in FAMILIES} == set(ARCHS)


@pytest.mark.parametrize("kind", ["safetensors", "gguf"])
def test_logits_and_greedy_tokens_match_transformers(family, kind, device):
    name, ref, paths = family
    # (a float32 cache: the family's own rounding alone sets the bound, so that most positions
    # have a clear top token; test_hf_models checks the float16 cache against transformers)
    model = clops.llm.load(paths[kind], device=device, max_seq_len=128, progress=False,
                           kv_cache="float32")
    assert model.config.arch == FAMILIES[name][3]
    rng = np.random.default_rng(1)
    ids = rng.integers(0, ref.config.vocab_size, PROMPT).tolist()
    got, want = model.logits(ids), hf_logits(ref, ids)
    bound = logit_tolerance(model)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < bound, f"{name} ({kind}): relative logit error {err:.2e}"
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * bound * np.abs(want).max()
    assert clear.mean() > 0.9
    assert (got.argmax(-1) == want.argmax(-1))[clear].all(), f"{name} ({kind}): top-1"
    prompt = ids[:6]
    tokens = list(model.generate_ids(prompt, max_new_tokens=GREEDY, stop_ids=[]))
    assert tokens == hf_greedy(ref, prompt, GREEDY), f"{name} ({kind}): greedy tokens"


@pytest.mark.parametrize("family_name, rope", [
    ("qwen3", {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
               "rope_theta": 1e6}),
    ("llama", {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}),
])
def test_rope_scaling_matches_transformers(family_name, rope, tmp_path, device):
    ref, hf, gguf_path = make(family_name, str(tmp_path), rope_parameters=rope)
    ids = np.random.default_rng(3).integers(0, ref.config.vocab_size, PROMPT).tolist()
    want = hf_logits(ref, ids)
    for path in (hf, gguf_path):
        model = clops.llm.load(path, device=device, max_seq_len=128, progress=False)
        assert model.config.rope_scaling["rope_type"] == rope["rope_type"]
        got = model.logits(ids)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err < logit_tolerance(model), f"{path}: {err:.2e}"


def test_the_window_and_the_caps_are_what_make_gemma2_agree(tmp_path, device):
    """The comparison can fail: gemma2 without its sliding window or its soft-caps (as a
    config that forgets them would run it) gives other logits."""
    ref, hf, _ = make("gemma2", str(tmp_path))
    ids = np.random.default_rng(2).integers(0, ref.config.vocab_size, PROMPT).tolist()
    want = hf_logits(ref, ids)
    for change in ({"sliding_window": 0}, {"attn_softcap": 0.0}, {"final_softcap": 0.0}):
        model = clops.llm.load(hf, device=device, max_seq_len=128, progress=False)
        for k, v in change.items():
            setattr(model.config, k, v)
        # (the layers' windows are read from the config into the weights' view at load)
        model._builder.w = model._part_weights()
        got = model.logits(ids)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err > 1e-3, f"{change}: {err:.2e}"
    assert WINDOW < PROMPT


def _gguf(path, arch: str, **kv) -> str:
    import gguf

    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_token_list(["a", "b"])
    for k, v in kv.items():
        w.add_string(f"{arch}.{k}", v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _hf_dir(tmp_path, **changes) -> str:
    import json

    _, hf, _ = make("qwen3", str(tmp_path))
    with open(f"{hf}/config.json") as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(f"{hf}/config.json", "w") as f:
        json.dump(cfg, f)
    return hf


@pytest.mark.parametrize("kind, change, named", [
    ("gguf", ("mamba", {}), "'mamba'"),
    ("gguf", ("llama", {"rope.scaling.type": "dynamic"}), "'dynamic'"),
    ("safetensors", {"model_type": "gpt_neox"}, "'gpt_neox'"),
    ("safetensors", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4,
                                         "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}},
     "'longrope'"),
    ("safetensors", {"hidden_act": "relu"}, "'relu'"),
])
def test_what_clops_cannot_run_is_refused_by_name(tmp_path, device, kind, change, named,
                                                   monkeypatch):
    """An architecture, rope type or activation clops cannot run: ModelFileError naming it
    and what is supported, before any weight reaches the device."""
    if kind == "gguf":
        path = _gguf(tmp_path / "m.gguf", change[0], **change[1])
    else:
        path = _hf_dir(tmp_path, **change)
    uploads = []
    monkeypatch.setattr(clops.llm.model, "upload", lambda *a: uploads.append(a))
    with pytest.raises(clops.llm.ModelFileError) as err:
        clops.llm.load(path, device=device, progress=False)
    msg = str(err.value)
    assert named in msg and path in msg, msg
    listed = {"'mamba'": "qwen3", "'gpt_neox'": "gemma3", "'dynamic'": "yarn",
              "'longrope'": "yarn", "'relu'": "silu"}[named]
    assert listed in msg, msg
    assert not uploads


@pytest.mark.parametrize("name", ["gemma3", "olmo2", "phi3", "granite", "smollm3", "qwen3",
                                  "qwen3moe", "mixtral", "gpt_oss"])
@pytest.mark.standin
def test_gpu_plan_of_each_choice_matches_transformers(name, tmp_path, device, monkeypatch):
    """The plan as GPUs build it (norms folded into the matmuls, work-groups per row for the
    norms, single-launch decode attention where the layer allows), forced on the test device:
    post-norms, QK-norm (a decode row's per-head one inside its rotation), GELU, partial
    rotary, multipliers and no-rotary layers included, and a lone decode row's experts with
    the pre-norm (and the plain SiLU GLU: not gpt-oss's clamped one) folded into their
    products (``experts.folds``)."""
    from clops.kernels import launch

    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)

    monkeypatch.setattr("clops.nn.quant.layout_for", lambda dev: "rows")
    ref, hf, gguf_path = make(name, str(tmp_path))
    ids = np.random.default_rng(4).integers(0, ref.config.vocab_size, PROMPT).tolist()
    want = hf_logits(ref, ids)
    # (a float32 cache, as on CPUs: the greedy tokens below are transformers' own)
    model = clops.llm.load(gguf_path, device=device, max_seq_len=128, progress=False,
                           kv_cache="float32")
    got = model.logits(ids)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < logit_tolerance(model), f"{name}: {err:.2e}"
    prompt = ids[:6]
    assert list(model.generate_ids(prompt, max_new_tokens=16, stop_ids=[])) == \
        hf_greedy(ref, prompt, 16)


@pytest.mark.parametrize("name", ["qwen3moe", "mixtral", "olmoe", "gpt_oss"])
@pytest.mark.standin
def test_a_prompts_experts_on_the_tensor_cores_match_transformers(name, tmp_path, device,
                                                                    monkeypatch):
    """A prompt's experts as NVIDIA GPUs run them (``matmul.matmul_xmma``: float16 rows and
    weights on the tensor cores, the rows read through the slots' order, the GLU in the
    [gate | up] product's epilogue, gpt-oss's clamped one too), forced on the test
    device: within the float16 rows' bound of transformers' logits, and the same logits bits
    again from the plan's replay."""
    from clops.kernels import launch, matmul

    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr("clops.nn.quant.layout_for", lambda dev: "rows")
    monkeypatch.setattr(matmul, "XMMA_OVERRIDE", True)
    ref, hf, gguf_path = make(name, str(tmp_path))
    # (70 rows of 2 experts each over 8: tiles whose 16-slot parts hold rows or padding)
    ids = np.random.default_rng(5).integers(0, ref.config.vocab_size, 70).tolist()
    model = clops.llm.load(gguf_path, device=device, max_seq_len=128, progress=False,
                           kv_cache="float32")
    got = model.logits(ids)
    plan = model._plans[next(key for key in model._plans if key[0] == len(ids))]
    names = [ln.kernel.function_name for ln in plan.launches]
    assert "matmul_xmma" in names and "moe_gather" not in names
    assert {"glu", "glu_clamp"} & set(names) == set() and "half_rows" in names
    want = hf_logits(ref, ids)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < logit_tolerance(model) == 6e-3, f"{name}: {err:.2e}"
    np.testing.assert_array_equal(model.logits(ids), got)
