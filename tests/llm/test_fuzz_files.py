"""Malformed and truncated model files raise a clear ``ModelFileError`` (a ValueError): never a
crash, a hang or another exception. Fuzzed with hypothesis over truncations and byte flips."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clops.llm import config as cfgmod
from clops.llm.gguf_file import GGUFFile, ModelFileError
from clops.llm.safetensors_file import SafetensorsFile, open_directory

# (what it checks does not depend on the device: CI's second pass, on PoCL, leaves it out)
pytestmark = pytest.mark.host


def _small_gguf(path: str) -> None:
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_context_length(64)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(40)])
    w.add_token_merges(["t 1", "t 2"])
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((40, 32)).astype(np.float32))
    q = gguf.quants.quantize(rng.standard_normal((64, 32)).astype(np.float32),
                             gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn_up.weight", q, raw_shape=q.shape,
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _small_safetensors(path: str) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones(5, np.uint16)
    header = {"a": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
              "b": {"dtype": "BF16", "shape": [5], "data_offsets": [48, 58]},
              "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + a.tobytes() + b.tobytes())


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    p = str(tmp_path_factory.mktemp("g") / "m.gguf")
    _small_gguf(p)
    with open(p, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def st_bytes(tmp_path_factory) -> bytes:
    p = str(tmp_path_factory.mktemp("s") / "m.safetensors")
    _small_safetensors(p)
    with open(p, "rb") as f:
        return f.read()


def _mutate(data: bytes, cut: int | None, flips: list[tuple[int, int]]) -> bytes:
    d = bytearray(data if cut is None else data[: cut % (len(data) + 1)])
    for pos, val in flips:
        if d:
            d[pos % len(d)] = val
    return bytes(d)


MUTATIONS = dict(cut=st.one_of(st.none(), st.integers(0, 1 << 20)),
                 flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)),
                                max_size=4))
FUZZ = settings(max_examples=60, deadline=5000,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_intact_files_parse(gguf_bytes, st_bytes, tmp_path):
    p = tmp_path / "ok.gguf"
    p.write_bytes(gguf_bytes)
    f = GGUFFile(str(p))
    assert f.packed("blk.0.ffn_up.weight").fmt == "q8"
    s = tmp_path / "ok.safetensors"
    s.write_bytes(st_bytes)
    sf = SafetensorsFile(str(s))
    assert sf.array("a")[2, 3] == 11 and sf.dtype("b") == "BF16"


@FUZZ
@given(**MUTATIONS)
def test_gguf_fuzz(gguf_bytes, tmp_path, cut, flips):
    p = tmp_path / "fuzz.gguf"
    p.write_bytes(_mutate(gguf_bytes, cut, flips))
    try:
        f = GGUFFile(str(p))
        for name in f.tensors:
            f.packed(name)
        cfgmod.from_gguf(f.metadata, set(f.tensors), str(p))
    except ModelFileError as e:
        assert str(p) in str(e)
    except ValueError:
        pass  # other ValueErrors (bad sizes in the config) are clear enough


@FUZZ
@given(**MUTATIONS)
def test_safetensors_fuzz(st_bytes, tmp_path, cut, flips):
    p = tmp_path / "fuzz.safetensors"
    p.write_bytes(_mutate(st_bytes, cut, flips))
    try:
        sf = SafetensorsFile(str(p))
        for name in sf.names():
            sf.array(name)
    except ModelFileError as e:
        assert str(p) in str(e)


def test_clear_messages(tmp_path, gguf_bytes, st_bytes):
    p = tmp_path / "t.gguf"
    p.write_bytes(gguf_bytes[: len(gguf_bytes) - 100])
    with pytest.raises(ModelFileError, match="truncated|expected"):
        GGUFFile(str(p))
    p.write_bytes(b"NOPE" + gguf_bytes[4:])
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        GGUFFile(str(p))
    s = tmp_path / "t.safetensors"
    s.write_bytes(st_bytes[:-4])
    with pytest.raises(ModelFileError, match="outside"):
        SafetensorsFile(str(s))
    d = tmp_path / "dir"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "pytorch_model.bin").write_bytes(b"\x80\x02")
    with pytest.raises(ModelFileError, match="no \\*.safetensors"):
        open_directory(str(d))
    assert not os.path.exists(d / "unpickled")


@pytest.mark.parametrize("dtype", [["F32"], {"F32": 1}, 32, None, True])
def test_safetensors_non_string_dtype(tmp_path, st_bytes, dtype):
    """A header dtype that is not a string (a list is unhashable) is refused by name."""
    n = struct.unpack("<Q", st_bytes[:8])[0]
    header = json.loads(st_bytes[8:8 + n])
    header["a"]["dtype"] = dtype
    raw = json.dumps(header).encode()
    p = tmp_path / "dtype.safetensors"
    p.write_bytes(struct.pack("<Q", len(raw)) + raw + st_bytes[8 + n:])
    with pytest.raises(ModelFileError, match=r"tensor 'a': dtype .* is not supported, expected "
                                             r"one of the strings F32"):
        SafetensorsFile(str(p))


def _hf_config(**changes: object) -> dict:
    cfg = {"model_type": "llama", "hidden_act": "silu", "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
           "intermediate_size": 96, "vocab_size": 320, "rms_norm_eps": 1e-5}
    cfg.update(changes)
    return cfg


@pytest.mark.parametrize("where, theta", [
    ("top", 0), ("top", 0.0), ("top", -10000.0), ("top", float("inf")), ("top", float("nan")),
    ("top", "10000"), ("top", False), ("top", [10000]),
    ("rope_parameters", 0), ("rope_parameters", -1.0),
])
def test_hf_rope_theta_refused(where, theta):
    """config.json's rope_theta is checked as GGUF's rope.freq_base is: 0 is refused, not
    replaced by the default."""
    source = "/m/config.json"
    if where == "top":
        cfg, key = _hf_config(rope_theta=theta), "'rope_theta'"
    else:
        cfg = _hf_config(rope_parameters={"rope_type": "default", "rope_theta": theta})
        key = "'rope_parameters.rope_theta'"
    with pytest.raises(ModelFileError) as err:
        cfgmod.from_hf(cfg, source)
    msg = str(err.value)
    assert source in msg and key in msg and "number" in msg, msg


def test_hf_rope_theta_default_and_nested():
    assert cfgmod.from_hf(_hf_config(), "c").rope_theta == 10000.0
    assert cfgmod.from_hf(_hf_config(rope_theta=5e5), "c").rope_theta == 5e5
    nested = _hf_config(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert cfgmod.from_hf(nested, "c").rope_theta == 1e6
