"""Split GGUF models (``name-00001-of-00003.gguf``, as llama.cpp's gguf-split and the gguf
package's writer make them): any one file opens the whole model, whose tensors and logits are
the unsplit file's; a missing or foreign split is refused by name."""

from __future__ import annotations

import functools
import os
import shutil

import numpy as np
import pytest

from clops.llm import ModelFileError, load
from clops.llm.gguf_file import SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS, GGUFFile

from ..fuzz.tiny_files import write_gguf


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, list[str]]:
    """The tiny llama model as one file, and the same model split by the gguf package's writer
    into files of at most 8 tensors."""
    import gguf

    one = write_gguf(str(tmp_path_factory.mktemp("one") / "tiny.gguf"), "llama", seed=5)
    folder = tmp_path_factory.mktemp("split")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFWriter", functools.partial(gguf.GGUFWriter, split_max_tensors=8))
        write_gguf(str(folder / "tiny.gguf"), "llama", seed=5)
    parts = sorted(str(folder / n) for n in os.listdir(folder))
    assert len(parts) >= 3 and parts[0].endswith(f"tiny-00001-of-{len(parts):05d}.gguf")
    return one, parts


def test_any_split_opens_the_whole_model(models):
    one, parts = models
    ref = GGUFFile(one)
    for path in (parts[0], parts[-1]):
        f = GGUFFile(path)
        assert f.paths == parts
        meta = {k: v for k, v in f.metadata.items() if not k.startswith("split.")}
        assert meta == ref.metadata
        assert set(f.tensors) == set(ref.tensors)
        for name, t in ref.tensors.items():
            got = f.tensors[name]
            assert (got.ggml_type, got.shape) == (t.ggml_type, t.shape), name
            assert np.array_equal(got.data, t.data), name
    # a split alone holds only its own tensors
    assert len(GGUFFile(parts[1], whole=False).tensors) <= 8


def test_split_model_logits_equal_the_unsplit_ones(models):
    one, parts = models
    ids = [1, 5, 9, 200, 7, 3]
    want = load(one, device="cpu", progress=False).logits(ids)
    got = load(parts[1], device="cpu", progress=False).logits(ids)
    np.testing.assert_array_equal(got, want)


def test_a_missing_split_is_named(models, tmp_path):
    _, parts = models
    for p in parts[:1] + parts[2:]:
        shutil.copy(p, tmp_path)
    missing = str(tmp_path / os.path.basename(parts[1]))
    with pytest.raises(ModelFileError, match=f"split 2 of {len(parts)} .*{missing}.* is missing"):
        GGUFFile(str(tmp_path / os.path.basename(parts[0])))
    with pytest.raises(ModelFileError, match="is missing"):
        load(str(tmp_path / os.path.basename(parts[-1])), device="cpu", progress=False)


def test_a_renamed_split_is_refused(models, tmp_path):
    _, parts = models
    shutil.copy(parts[0], tmp_path / "renamed.gguf")
    with pytest.raises(ModelFileError, match="name is not <name>-0000k-of-0000n.gguf"):
        GGUFFile(str(tmp_path / "renamed.gguf"))


def _part(folder, k: int, count: int, total: int, tensors: dict[str, np.ndarray],
          keys: dict | None = None) -> str:
    """Split ``k`` (from 1) of ``count``, written key by key."""
    import gguf

    path = str(folder / f"m-{k:05d}-of-{count:05d}.gguf")
    w = gguf.GGUFWriter(path, "llama")
    keys = {SPLIT_NO: k - 1, SPLIT_COUNT: count, SPLIT_TENSORS: total} | (keys or {})
    for key, v in keys.items():
        if v is not None:
            (w.add_int32 if key == SPLIT_TENSORS else w.add_uint16)(key, v)
    for name, a in tensors.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("second, total, wanted", [
    ({"b": 1, "a": 2}, 3, "tensor a is in another split of the model too"),
    ({"b": 1}, 3, "the 2 splits hold 2 tensors, but split.tensors.count says 3"),
    ({"b": 1, SPLIT_NO: 0}, 2, r"split keys .* are \(0, 2, 2\), expected \(1, 2, 2\)"),
    ({"b": 1, SPLIT_COUNT: 3}, 2, r"are \(1, 3, 2\), expected \(1, 2, 2\)"),
    ({"b": 1, SPLIT_TENSORS: 7}, 2, r"are \(1, 2, 7\), expected \(1, 2, 2\)"),
])
def test_foreign_splits_are_refused(tmp_path, second, total, wanted):
    v = np.ones(32, np.float32)
    first = _part(tmp_path, 1, 2, total, {"a": v})
    keys = {k: second.pop(k) for k in list(second) if k.startswith("split.")}
    _part(tmp_path, 2, 2, total, {name: v * n for name, n in second.items()}, keys)
    with pytest.raises(ModelFileError, match=wanted):
        GGUFFile(first)


@pytest.mark.parametrize("keys, wanted", [
    ({SPLIT_NO: 2}, "split.no 2 of split.count 2"),
    ({SPLIT_COUNT: 0}, r"'split.count' is 0 \(uint16\), expected an integer in \[1, 9999\]"),
    ({SPLIT_COUNT: None}, "has split.no or split.tensors.count but no split.count"),
    ({SPLIT_NO: 1}, "split.no 1 says it is m-00002-of-00002.gguf"),
])
def test_split_keys_are_checked(tmp_path, keys, wanted):
    path = _part(tmp_path, 1, 2, 2, {"a": np.ones(32, np.float32)}, keys)
    with pytest.raises(ModelFileError, match=wanted):
        GGUFFile(path)
