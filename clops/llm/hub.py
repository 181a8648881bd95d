"""llm, models by name: a Hugging Face hub id (``org/name``, ``org/name:Q4_K_M``,
``org/name/file.gguf``) resolved to a local file or directory through huggingface_hub's cache,
as transformers and llama.cpp's ``-hf`` resolve them; downloaded only when not offline."""

from __future__ import annotations

import os
import re
from typing import Any, NamedTuple

from .gguf_file import SPLIT_NAME, ModelFileError

# org/name: letters, digits, '-', '_', '.' (the hub's own rule, without its length limit)
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_ID = re.compile(rf"({_PART}/{_PART})(?::([A-Za-z0-9._-]+)|/(.+\.gguf))?")
# what a directory model needs (besides its weights)
_DIRECTORY_FILES = ("config.json", "tokenizer.json")
# what a download of a directory model fetches
_DIRECTORY_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]


class HubRef(NamedTuple):
    """A parsed hub id: the repository, and the GGUF quantization or file asked for."""

    repo: str
    quant: str | None = None
    file: str | None = None


def parse(name: str) -> HubRef | None:
    """``name`` as a hub id, or None when it is not one.

    >>> parse("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M")
    HubRef(repo='bartowski/Llama-3.2-1B-Instruct-GGUF', quant='Q4_K_M', file=None)
    """
    m = _ID.fullmatch(name)
    if m is None or ".." in m.group(1) or (m.group(3) and ".." in m.group(3).split("/")):
        return None
    return HubRef(m.group(1), m.group(2), m.group(3))


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids downloads (read now, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def cache_dir() -> str:
    """huggingface_hub's cache folder: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub``, read now."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return os.path.expanduser(os.environ["HUGGINGFACE_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def _how_to_get(repo: str) -> str:
    return f"get it with `hf download {repo}` (or `huggingface-cli download {repo}`)"


def not_found(name: str, why: str = "") -> FileNotFoundError:
    """The error for a model name that is nothing here."""
    ref = parse(name)
    if ref is None:
        return FileNotFoundError(
            f"no model at {name!r}: not a file, not a directory, and not a Hugging Face hub id "
            "(org/name, org/name:QUANT or org/name/file.gguf)")
    return FileNotFoundError(
        f"no model at {name!r}: not a file, not a directory, and not a Hugging Face model in "
        f"the local cache ({cache_dir()}){why}; {_how_to_get(ref.repo)}")


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        return None
    return huggingface_hub


def resolve(name: str) -> str:
    """The local file or directory of model ``name``: ``name`` itself where it exists, else the
    hub id's snapshot in the cache (downloaded first unless offline). A directory model's
    snapshot is a directory (config.json, tokenizer.json, *.safetensors); a GGUF repository's
    model is the file that ``:QUANT`` or ``/file.gguf`` picks, or its only one (a split model's
    first file)."""
    if os.path.exists(name):
        return name
    ref = parse(name)
    if ref is None:
        raise not_found(name)
    hub = _hub()
    if hub is None:
        raise not_found(name, ", and huggingface_hub, which looks hub ids up, is not installed "
                              "(pip install huggingface_hub)")
    snapshot = _cached(hub, ref.repo)
    if snapshot is not None:
        try:
            return pick(snapshot, ref, name)
        except (FileNotFoundError, ModelFileError):
            if offline():
                raise
    if offline():
        raise not_found(name, " (HF_HUB_OFFLINE is set, so nothing is downloaded)")
    return pick(_download(hub, ref), ref, name)


def _cached(hub: Any, repo: str) -> str | None:
    try:
        return str(hub.snapshot_download(repo, cache_dir=cache_dir(), local_files_only=True))
    except Exception:  # noqa: BLE001 - huggingface_hub's "not in the cache" errors vary
        return None


def _download(hub: Any, ref: HubRef) -> str:
    """The snapshot of ``ref`` with the files its model needs, downloaded."""
    try:
        files = hub.list_repo_files(ref.repo)
        ggufs = [f for f in files if f.endswith(".gguf")]
        if ref.file or ref.quant or (ggufs and not _is_directory_model(files)):
            chosen = _choose(ggufs, ref, ref.repo)
            split = SPLIT_NAME.fullmatch(os.path.basename(chosen))
            patterns = _expected_splits(chosen) if split else [chosen]
        else:
            patterns = _DIRECTORY_PATTERNS
        return str(hub.snapshot_download(ref.repo, cache_dir=cache_dir(),
                                         allow_patterns=patterns))
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - network and hub errors of many kinds
        raise FileNotFoundError(f"{ref.repo}: not in the local cache ({cache_dir()}) and not "
                                f"downloaded ({type(e).__name__}: {e}); "
                                f"{_how_to_get(ref.repo)}") from None


def _is_directory_model(files: list[str]) -> bool:
    names = {os.path.basename(f) for f in files}
    return all(n in names for n in _DIRECTORY_FILES) and any(
        f.endswith(".safetensors") for f in files)


def _files(snapshot: str) -> list[str]:
    out = []
    for root, _, names in os.walk(snapshot):
        for n in names:
            out.append(os.path.relpath(os.path.join(root, n), snapshot).replace(os.sep, "/"))
    return sorted(out)


def pick(snapshot: str, ref: HubRef, name: str) -> str:
    """The model of ``ref`` in a snapshot directory."""
    files = _files(snapshot)
    ggufs = [f for f in files if f.endswith(".gguf")]
    if not (ref.file or ref.quant) and _is_directory_model(
            [f for f in files if "/" not in f]):
        return snapshot
    if not ggufs:
        raise not_found(name, f" (its cached snapshot {snapshot} holds neither a .gguf file "
                              f"nor {', '.join(_DIRECTORY_FILES)} and *.safetensors)")
    chosen = _choose(ggufs, ref, name)
    if SPLIT_NAME.fullmatch(os.path.basename(chosen)):
        missing = [f for f in _expected_splits(chosen) if f not in files]
        if missing:
            raise ModelFileError(
                f"{name}: the cached snapshot {snapshot} lacks split(s) "
                f"{', '.join(missing)} of {chosen}; {_how_to_get(ref.repo)}")
    return os.path.join(snapshot, chosen)


def _expected_splits(first: str) -> list[str]:
    m = SPLIT_NAME.fullmatch(os.path.basename(first))
    assert m is not None
    folder = os.path.dirname(first)
    n = int(m.group(3))
    return [(folder + "/" if folder else "") + f"{m.group(1)}-{k:05d}-of-{n:05d}.gguf"
            for k in range(1, n + 1)]


def _models(ggufs: list[str]) -> list[str]:
    """The GGUF models among files: each whole file, and each split model's first file."""
    out = []
    for f in ggufs:
        m = SPLIT_NAME.fullmatch(os.path.basename(f))
        if m is None or int(m.group(2)) == 1:
            out.append(f)
    return out


def _choose(ggufs: list[str], ref: HubRef, name: str) -> str:
    """The GGUF file ``ref`` asks for among a repository's."""
    models = _models(ggufs)
    if ref.file:
        if ref.file in ggufs:
            m = SPLIT_NAME.fullmatch(os.path.basename(ref.file))
            return _expected_splits(ref.file)[0] if m else ref.file
        raise FileNotFoundError(f"{name}: {ref.repo} has no file {ref.file} (its GGUF files: "
                                f"{', '.join(ggufs) or 'none'})")
    if ref.quant:
        # the quantization as a word of the path: Q4_K does not pick Q4_K_M
        word = re.compile(rf"(?<![A-Za-z0-9]){re.escape(ref.quant)}(?![A-Za-z0-9_])",
                          re.IGNORECASE)
        matches = [f for f in models if word.search(f)]
        if len(matches) == 1:
            return matches[0]
        what = "several files" if matches else "no file"
        raise FileNotFoundError(
            f"{name}: {what} of {ref.repo} match{'' if matches else 'es'} {ref.quant!r} "
            f"({', '.join(matches or models)}); name one as {ref.repo}/<file>.gguf")
    if len(models) == 1:
        return models[0]
    raise FileNotFoundError(
        f"{name}: {ref.repo} holds {len(models)} GGUF models; pick one as {ref.repo}:<QUANT> or "
        f"{ref.repo}/<file>.gguf: {', '.join(models)}")
