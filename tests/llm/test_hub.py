"""Models by hub id: ``org/name``, ``org/name:QUANT`` and ``org/name/file.gguf`` resolve through
a huggingface_hub cache laid out as the real one (models--org--name/{refs/main, snapshots/<rev>,
blobs}), offline; what is not there is refused with how to get it. No test uses the network."""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np
import pytest

from clops.llm import ModelFileError, hub, load

from ..fuzz.tiny_files import write_gguf

pytest.importorskip("huggingface_hub")
REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


def cached(root, repo: str, files: dict[str, str | bytes], rev: str = REV) -> str:
    """``repo`` in the cache at ``root``: each file a link from the snapshot to its blob;
    a ``str`` value is a file to copy. Returns the snapshot folder."""
    base = root / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "blobs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(rev)
    snap = base / "snapshots" / rev
    for name, content in files.items():
        data = open(content, "rb").read() if isinstance(content, str) else content
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, (snap / name).parent), snap / name)
    return str(snap)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return write_gguf(str(tmp_path_factory.mktemp("tiny") / "tiny.gguf"), "llama", seed=7)


def test_parse():
    assert hub.parse("org/name") == hub.HubRef("org/name")
    assert hub.parse("org/na.me-GGUF:Q4_K_M") == hub.HubRef("org/na.me-GGUF", "Q4_K_M")
    assert hub.parse("org/name/sub/m.gguf") == hub.HubRef("org/name", None, "sub/m.gguf")
    for bad in ("name", "model.gguf", "./org/name", "/abs/x", "org/name/x.bin", "org/../x",
                "org/name/../../etc.gguf", "a/b/c"):
        assert hub.parse(bad) is None, bad


def test_a_gguf_repository_loads_by_quant_and_by_file(cache, tiny):
    snap = cached(cache, "org/tiny-GGUF", {"tiny.Q8_0.gguf": tiny, "README.md": b"hi"})
    ids = [1, 4, 9, 33]
    want = load(tiny, device="cpu", progress=False).logits(ids)
    for name in ("org/tiny-GGUF", "org/tiny-GGUF:q8_0", "org/tiny-GGUF/tiny.Q8_0.gguf"):
        assert hub.resolve(name) == os.path.join(snap, "tiny.Q8_0.gguf")
    got = load("org/tiny-GGUF:Q8_0", device="cpu", progress=False).logits(ids)
    np.testing.assert_array_equal(got, want)


def test_a_directory_repository_is_its_snapshot(cache):
    snap = cached(cache, "org/dir", {"config.json": b"{}", "tokenizer.json": b"{}",
                                     "model.safetensors": b"", "extra/model.gguf": b""})
    assert hub.resolve("org/dir") == snap
    # a GGUF asked for by name is that file all the same
    assert hub.resolve("org/dir/extra/model.gguf") == os.path.join(snap, "extra/model.gguf")


def test_hf_home_is_the_cache_when_hf_hub_cache_is_not_set(tmp_path, monkeypatch, tiny):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snap = cached(tmp_path / "home" / "hub", "org/m", {"m-F16.gguf": b"x"})
    assert hub.cache_dir() == str(tmp_path / "home" / "hub")
    assert hub.resolve("org/m") == os.path.join(snap, "m-F16.gguf")


def test_quant_choice(cache):
    splits = {f"Q4_K_M/big-Q4_K_M-{k:05d}-of-00003.gguf": b"x" for k in (1, 2, 3)}
    snap = cached(cache, "org/big", {"big-Q4_K.gguf": b"x", "big-Q8_0.gguf": b"x",
                                     "big-q8_0-imatrix.gguf": b"x", **splits})
    assert hub.resolve("org/big:Q4_K") == os.path.join(snap, "big-Q4_K.gguf")
    # a split model is one choice, its first file
    assert hub.resolve("org/big:Q4_K_M") == os.path.join(
        snap, "Q4_K_M/big-Q4_K_M-00001-of-00003.gguf")
    assert hub.resolve("org/big/Q4_K_M/big-Q4_K_M-00002-of-00003.gguf") == os.path.join(
        snap, "Q4_K_M/big-Q4_K_M-00001-of-00003.gguf")
    with pytest.raises(FileNotFoundError, match=r"several files of org/big match 'Q8_0' \("
                                                r"big-Q8_0.gguf, big-q8_0-imatrix.gguf\)"):
        hub.resolve("org/big:Q8_0")
    with pytest.raises(FileNotFoundError, match="no file of org/big matches 'IQ2_XS'"):
        hub.resolve("org/big:IQ2_XS")
    with pytest.raises(FileNotFoundError, match=r"org/big holds 4 GGUF models; pick one as "
                                                r"org/big:<QUANT> .*big-Q4_K\.gguf"):
        hub.resolve("org/big")
    with pytest.raises(FileNotFoundError, match="has no file nope.gguf"):
        hub.resolve("org/big/nope.gguf")


def test_a_split_missing_from_the_cache_is_named(cache):
    cached(cache, "org/s", {"s-00001-of-00002.gguf": b"x"})
    with pytest.raises(ModelFileError, match="lacks split.* s-00002-of-00002.gguf.*hf download"):
        hub.resolve("org/s")


def test_what_is_not_there_says_how_to_get_it(cache, monkeypatch):
    with pytest.raises(FileNotFoundError) as e:
        load("org/not-cached", device="cpu", progress=False)
    msg = str(e.value)
    for part in ("not a file, not a directory", "not a Hugging Face model in the local cache",
                 str(cache), "HF_HUB_OFFLINE", "hf download org/not-cached",
                 "huggingface-cli download org/not-cached"):
        assert part in msg
    with pytest.raises(FileNotFoundError, match="not a file, not a directory, and not a "
                                                "Hugging Face hub id"):
        load("no-such-model.gguf", device="cpu", progress=False)
    # a cached repository that holds no model
    cached(cache, "org/empty", {"README.md": b""})
    with pytest.raises(FileNotFoundError, match="holds neither a .gguf file"):
        hub.resolve("org/empty")
    monkeypatch.setattr(hub, "_hub", lambda: None)
    with pytest.raises(FileNotFoundError, match="huggingface_hub.* is not installed"):
        hub.resolve("org/anything")


def test_online_uses_the_cache_first(cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    snap = cached(cache, "org/m", {"m.gguf": b"x"})

    def no_download(*args):
        raise AssertionError("downloaded")

    monkeypatch.setattr(hub, "_download", no_download)
    assert hub.resolve("org/m") == os.path.join(snap, "m.gguf")


def test_a_path_that_exists_is_itself(cache, tiny, tmp_path, monkeypatch):
    local = tmp_path / "org" / "tiny-GGUF"
    local.mkdir(parents=True)
    shutil.copy(tiny, local / "tiny.gguf")
    cached(cache, "org/tiny-GGUF", {"other.gguf": b"x"})
    monkeypatch.chdir(tmp_path)
    assert hub.resolve("org/tiny-GGUF") == "org/tiny-GGUF"
