"""Mixture-of-experts files clops cannot run as written are refused by name, before any weight
reaches a device: shared experts, a sigmoid router or scaled expert weights, more experts a
token than there are, dense layers among sparse ones, an expert count on a family without
experts, a sparse family without one, DeepSeek-V2's architecture; and a file whose experts'
tensors disagree with its counts."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import clops.llm  # noqa: E402
from clops.llm import config  # noqa: E402
from clops.llm.gguf_file import GGUFFile, ModelFileError  # noqa: E402

from .families import make  # noqa: E402


@pytest.fixture(scope="module")
def qwen3moe(tmp_path_factory):
    _, hf, gguf_path = make("qwen3moe", str(tmp_path_factory.mktemp("moe_files")))
    f = GGUFFile(gguf_path)
    with open(os.path.join(hf, "config.json")) as fh:
        hf_config = json.load(fh)
    return dict(f.metadata), set(f.tensors), hf_config, hf


@pytest.mark.parametrize("key, value, message", [
    ("expert_shared_count", 2, "shared experts"),
    ("expert_gating_func", 2, "expert_gating_func = 2"),
    ("expert_weights_scale", 2.5, "expert_weights_scale = 2.5"),
    ("expert_used_count", 9, "more than the n_experts"),
    ("expert_used_count", 0, r"n_experts_used \('qwen3moe.expert_used_count'\) = 0"),
    ("expert_count", 100000, "expected an integer in"),
    ("expert_feed_forward_length", 40, "expected a multiple of 32"),
])
def test_gguf_expert_settings_refused(qwen3moe, key, value, message):
    meta, names, _, _ = qwen3moe
    bad = {**meta, f"qwen3moe.{key}": value}
    with pytest.raises(ModelFileError, match=message):
        config.from_gguf(bad, names, "m.gguf")


def test_a_sparse_family_without_an_expert_count_is_refused(qwen3moe):
    meta, names, _, _ = qwen3moe
    bad = {k: v for k, v in meta.items() if k != "qwen3moe.expert_count"}
    with pytest.raises(ModelFileError, match="has experts, but the file gives no n_experts"):
        config.from_gguf(bad, names, "m.gguf")


def test_experts_on_a_family_without_them_are_refused(qwen3moe):
    meta, names, _, _ = qwen3moe
    bad = {("qwen3." + k[len("qwen3moe."):] if k.startswith("qwen3moe.") else k): v
           for k, v in meta.items()}
    bad["general.architecture"] = "qwen3"
    with pytest.raises(ModelFileError, match="runs qwen3 models without experts"):
        config.from_gguf(bad, names, "m.gguf")


def test_deepseek2_is_refused_by_name(qwen3moe):
    meta, names, _, _ = qwen3moe
    with pytest.raises(ModelFileError, match="architecture 'deepseek2' is not supported"):
        config.from_gguf({**meta, "general.architecture": "deepseek2"}, names, "m.gguf")


@pytest.mark.parametrize("key, value", [
    ("mlp_only_layers", [0]), ("decoder_sparse_step", 2), ("num_shared_experts", 1)])
def test_hf_configs_clops_cannot_run_are_refused(qwen3moe, key, value):
    _, _, hf_config, _ = qwen3moe
    with pytest.raises(ModelFileError, match=f"'{key}' is"):
        config.from_hf({**hf_config, key: value}, "config.json")


def test_experts_tensors_must_agree_with_the_counts(qwen3moe, tmp_path):
    """A config that counts more experts than the files hold: the missing expert's tensor is
    named."""
    _, _, hf_config, hf = qwen3moe
    bad = tmp_path / "hf"
    bad.mkdir()
    for name in os.listdir(hf):
        (bad / name).symlink_to(os.path.join(hf, name))
    (bad / "config.json").unlink()
    key = "num_local_experts" if "num_local_experts" in hf_config else "num_experts"
    with open(bad / "config.json", "w") as fh:
        json.dump({**hf_config, key: hf_config[key] + 1}, fh)
    n = hf_config[key]
    with pytest.raises(ModelFileError, match=rf"mlp\.(gate\.weight|experts\.{n}\.)"):
        clops.llm.load(str(bad), progress=False)


def test_a_models_repr_names_its_experts(qwen3moe):
    _, _, hf_config, hf = qwen3moe
    model = clops.llm.load(hf, progress=False, max_seq_len=32)
    assert "qwen3moe 2 layers, dim 64, 8 experts (2 a token), vocab" in repr(model)
