"""Runtime, cache files: a damaged, swapped or hostile cache folder (program binaries, probe
results) never crashes, hangs or misleads a later run; PoCL's kernel cache follows
CLOPS_CACHE_DIR and CLOPS_DISK_CACHE. Each later run is a fresh process (a crash there must not
take pytest down), pointed at a copy of a cache that an earlier process filled."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from clops.runtime import CLDevice, cachefiles

# What every later run computes, and what it reports: the result and the program cache's counts.
CHILD = """
import json, numpy as np, clops as xp
from clops.runtime.program import STATS
builds = xp.device().probe("builds")  # reads and writes probes-v2.json
result = np.asarray(xp.asarray([1., 2.]) * 2).tolist()
print(json.dumps({"result": result, "builds_probe": builds, "stats": dict(STATS)}))
"""

# Fills a cache: the program of ``* 2`` and two others (so that there are entries to swap).
FILL = CHILD + """
x = xp.asarray([1., 2., 3.])
np.asarray(x + 1), np.asarray(x.sum())
"""

CHILD_TIMEOUT_S = 300


def _child_env(cache: Path, device: CLDevice, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("POCL_CACHE_DIR", "POCL_KERNEL_CACHE", "CLOPS_DISK_CACHE")}
    env.update(CLOPS_CACHE_DIR=str(cache), CLOPS_DEVICE=device.selector, **extra)
    return env


def _run(code: str, env: dict[str, str]) -> dict[str, object]:
    try:
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a fresh process hung (over {CHILD_TIMEOUT_S} s) on this cache")
    assert res.returncode == 0, (
        f"a fresh process failed (exit status {res.returncode}, negative: killed by that "
        f"signal)\n--- stderr ---\n{res.stderr[-4000:]}")
    out: dict[str, object] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


@pytest.fixture(scope="module")
def filled_caches() -> dict[str, Path]:
    """One filled cache per device, made once; tests work on copies."""
    return {}


@pytest.fixture
def cache(device: CLDevice, filled_caches: dict[str, Path], tmp_path: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Path:
    if device.backend == "nvidia":
        pytest.skip("clops keeps no program binaries for NVIDIA (its driver caches builds)")
    template = filled_caches.get(device.selector)
    if template is None:
        template = tmp_path_factory.mktemp("filled") / "cache"
        out = _run(FILL, _child_env(template, device))
        assert out["result"] == [2.0, 4.0]
        filled_caches[device.selector] = template
    copy = tmp_path / "cache"
    shutil.copytree(template, copy, symlinks=True)
    assert len(_entries(copy)) >= 2
    return copy


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "programs").glob("*.bin"))


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _payload_offset(data: bytes) -> int:
    return data.index(b"\n", len(cachefiles.ENTRY_MAGIC)) + 1


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_clops_header(path: Path) -> None:
    _flip(path, len(cachefiles.ENTRY_MAGIC) + 12)  # inside the JSON header line


def _flip_driver_header(path: Path) -> None:
    # The driver's own header (PoCL's "poclbin" one): a flipped byte there made PoCL abort.
    _flip(path, _payload_offset(path.read_bytes()) + 12)


def _flip_body(path: Path) -> None:
    _flip(path, path.stat().st_size * 3 // 4)


def _zero_length(path: Path) -> None:
    path.write_bytes(b"")


def _old_format(path: Path) -> None:
    # The binary alone, as clops wrote entries before they had a header.
    data = path.read_bytes()
    path.write_bytes(data[_payload_offset(data):])


def _empty_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _directory_with_a_file(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "something").write_text("not ours to delete")


def _unreadable(path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    path.chmod(0)


def _named_pipe(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)  # opening it to read would wait for a writer forever


def _link_to_a_device(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")  # endless


# corruption of each entry -> whether the next run can write a good entry in its place
PER_ENTRY: dict[str, tuple[Callable[[Path], None], bool]] = {
    "truncated": (_truncate, True),
    "flipped_clops_header": (_flip_clops_header, True),
    "flipped_driver_header": (_flip_driver_header, True),
    "flipped_body": (_flip_body, True),
    "zero_length": (_zero_length, True),
    "old_format": (_old_format, True),
    "empty_directory": (_empty_directory, True),
    "directory_with_a_file": (_directory_with_a_file, False),
    "unreadable": (_unreadable, True),
    "named_pipe": (_named_pipe, True),
    "link_to_a_device": (_link_to_a_device, True),
}


@pytest.mark.parametrize("how", list(PER_ENTRY))
def test_damaged_program_entries_are_rebuilt(device: CLDevice, cache: Path, how: str) -> None:
    corrupt, replaced = PER_ENTRY[how]
    for path in _entries(cache):
        corrupt(path)
    env = _child_env(cache, device)
    out = _run(CHILD, env)
    assert out["result"] == [2.0, 4.0]
    assert out["stats"] == {"disk_refused": 1, "builds": 1}
    # The entry was rewritten whole: the next process loads it without building.
    again = _run(CHILD, env)
    assert again["result"] == [2.0, 4.0]
    if replaced:
        assert again["stats"] == {"disk_hits": 1}
    else:  # a folder with files in it is left alone: built each time, never a crash
        assert again["stats"] == {"disk_refused": 1, "builds": 1}
        assert (_entries(cache)[0] / "something").read_text() == "not ours to delete"


def test_swapped_program_entries_are_rebuilt(device: CLDevice, cache: Path) -> None:
    paths = _entries(cache)
    contents = [p.read_bytes() for p in paths]
    for path, data in zip(paths, contents[1:] + contents[:1], strict=True):
        path.write_bytes(data)  # each entry now holds another program's (valid) binary
    env = _child_env(cache, device)
    out = _run(CHILD, env)
    assert out["result"] == [2.0, 4.0]
    assert out["stats"] == {"disk_refused": 1, "builds": 1}
    assert _run(CHILD, env)["stats"] == {"disk_hits": 1}


def test_programs_folder_is_a_file(device: CLDevice, cache: Path) -> None:
    shutil.rmtree(cache / "programs")
    (cache / "programs").write_text("not a folder")
    env = _child_env(cache, device)
    for _ in range(2):  # nothing can be stored, so each run builds
        out = _run(CHILD, env)
        assert out["result"] == [2.0, 4.0] and out["stats"] == {"disk_refused": 1, "builds": 1}


def _write_probes(text: bytes | None) -> Callable[[Path, CLDevice], None]:
    def write(path: Path, device: CLDevice) -> None:
        path.write_bytes((text or b"").replace(b"KEY", json.dumps(device.key).encode()))
    return write


def _probes_pipe(path: Path, device: CLDevice) -> None:
    path.unlink()
    os.mkfifo(path)


def _probes_directory(path: Path, device: CLDevice) -> None:
    path.unlink()
    path.mkdir()


PROBES: dict[str, Callable[[Path, CLDevice], None]] = {
    "a_list": _write_probes(b"[1, 2, 3]"),
    "a_list_value": _write_probes(b'{KEY: [1, 2], "other device": {"builds": true}}'),
    "strings_for_bools": _write_probes(
        b'{KEY: {"builds": "no", "fp16": "yes", "nvidia_ptx": "true"}}'),
    "wrong_types_inside": _write_probes(b'{KEY: {"builds": 1, "fp16": null, "x": {}}, "1": 2}'),
    "garbage": _write_probes(b"\x00\xff{{ not json at all"),
    "deeply_nested": _write_probes(b"[" * 200_000),
    "empty": _write_probes(b""),
    "named_pipe": _probes_pipe,
    "directory": _probes_directory,
}


@pytest.mark.parametrize("how", list(PROBES))
def test_damaged_probe_file_is_ignored_and_rewritten(device: CLDevice, cache: Path,
                                                     how: str) -> None:
    path = cache / "probes-v2.json"
    PROBES[how](path, device)
    out = _run(CHILD, _child_env(cache, device))
    assert out["result"] == [2.0, 4.0]
    assert out["builds_probe"] is True  # probed again, not read as "no" or a list
    saved = json.loads(path.read_bytes())
    assert isinstance(saved, dict)
    assert saved[device.key] == {"builds": True}
    for entry in saved.values():  # what was valid stays, nothing else does
        assert isinstance(entry, dict) and all(type(v) is bool for v in entry.values())
    if how == "a_list_value":
        assert saved["other device"] == {"builds": True}


# -- the checks themselves, without a driver ----------------------------------------------------
META = {"key": "k" * 64, "device": "dev", "platform": "plat", "driver": "1.0"}


def test_entry_round_trip() -> None:
    payload = bytes(range(256)) * 3
    data = cachefiles.pack_entry(META, payload)
    header, back = cachefiles.unpack_entry(data, META)
    assert back == payload
    assert header["sha256"] == hashlib.sha256(payload).hexdigest()
    assert header["bytes"] == str(len(payload))


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda d: d[:-1], "truncated"),
        (lambda d: d + b"x", "truncated or extended"),
        (lambda d: d[:-5] + bytes([d[-5] ^ 1]) + d[-4:], "sha256"),
        (lambda d: b"", "no clops cache header"),
        (lambda d: d[len(cachefiles.ENTRY_MAGIC):], "no clops cache header"),
        (lambda d: cachefiles.ENTRY_MAGIC + b"[1, 2]\n" + b"abc", "not a table of strings"),
        (lambda d: cachefiles.ENTRY_MAGIC + b"{\"bytes\": 3}\n" + b"abc",
         "not a table of strings"),
        (lambda d: cachefiles.ENTRY_MAGIC + b"{nope\n", "not JSON"),
        (lambda d: cachefiles.ENTRY_MAGIC + b"[" * 60_000 + b"\n", "not JSON"),
        (lambda d: cachefiles.ENTRY_MAGIC + b"[" * 100_000 + b"\n", "line missing or too long"),
        (lambda d: cachefiles.ENTRY_MAGIC + b"x" * 10, "line missing"),
    ],
)
def test_entry_checks(change: Callable[[bytes], bytes], complaint: str) -> None:
    data = change(cachefiles.pack_entry(META, b"0123456789" * 10))
    with pytest.raises(cachefiles.CacheEntryError, match=complaint):
        cachefiles.unpack_entry(data, META)


@pytest.mark.parametrize("field", sorted(META))
def test_entry_of_another_key_or_device(field: str) -> None:
    data = cachefiles.pack_entry(dict(META, **{field: "something else"}), b"binary")
    with pytest.raises(cachefiles.CacheEntryError, match=f"built for another {field}"):
        cachefiles.unpack_entry(data, META)


def test_read_file_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "folder").mkdir()
    (tmp_path / "big").write_bytes(b"x" * 100)
    for name in ("pipe", "folder"):
        with pytest.raises(cachefiles.CacheEntryError, match="not a regular file"):
            cachefiles.read_file(str(tmp_path / name))
    with pytest.raises(cachefiles.CacheEntryError, match="more than"):
        cachefiles.read_file(str(tmp_path / "big"), limit=99)
    assert cachefiles.read_file(str(tmp_path / "big"), limit=100) == b"x" * 100
    with pytest.raises(FileNotFoundError):
        cachefiles.read_file(str(tmp_path / "missing"))


def test_write_file_is_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "entry.bin"
    assert cachefiles.write_file(str(target), b"first")
    target.unlink()
    target.mkdir()  # an empty folder in the way is replaced
    assert cachefiles.write_file(str(target), b"second")
    assert target.read_bytes() == b"second"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    link = tmp_path / "sub" / "link.bin"
    link.symlink_to(tmp_path / "elsewhere")
    assert cachefiles.write_file(str(link), b"third")
    assert not link.is_symlink() and not (tmp_path / "elsewhere").exists()
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["entry.bin", "link.bin"]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.bin").mkdir()
    (tmp_path / "full" / "x.bin" / "keep").write_text("keep")
    assert not cachefiles.write_file(str(tmp_path / "full" / "x.bin"), b"fourth")
    assert os.listdir(tmp_path / "full") == ["x.bin"]  # nor a temporary file left behind


# -- PoCL's kernel cache follows clops' settings ------------------------------------------------
def _files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


@pytest.fixture
def pocl_device(device: CLDevice) -> CLDevice:
    if device.backend != "pocl":
        pytest.skip("PoCL's kernel cache: the device is not PoCL")
    return device


def _pocl_env(tmp_path: Path, device: CLDevice, **extra: str) -> dict[str, str]:
    (tmp_path / "xdg").mkdir()
    (tmp_path / "tmp").mkdir()
    # XDG_CACHE_HOME holds PoCL's default cache folder (~/.cache/pocl); TMPDIR temporary ones.
    return _child_env(tmp_path / "cache", device, XDG_CACHE_HOME=str(tmp_path / "xdg"),
                      TMPDIR=str(tmp_path / "tmp"), **extra)


def test_pocl_cache_is_in_the_cache_folder(pocl_device: CLDevice, tmp_path: Path) -> None:
    out = _run(CHILD, _pocl_env(tmp_path, pocl_device))
    assert out["result"] == [2.0, 4.0]
    assert _files_under(tmp_path / "cache" / "pocl")
    assert not (tmp_path / "xdg" / "pocl").exists()


def test_pocl_cache_off_with_the_disk_cache(pocl_device: CLDevice, tmp_path: Path) -> None:
    out = _run(CHILD, _pocl_env(tmp_path, pocl_device, CLOPS_DISK_CACHE="0"))
    assert out["result"] == [2.0, 4.0] and out["stats"] == {"builds": 1}
    assert not (tmp_path / "cache" / "pocl").exists()
    assert not (tmp_path / "cache" / "programs").exists()
    assert not (tmp_path / "xdg" / "pocl").exists()
    assert os.listdir(tmp_path / "tmp") == []  # PoCL's temporary folder went at exit


def test_pocl_cache_dir_set_by_the_user_is_kept(pocl_device: CLDevice, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    out = _run(CHILD, _pocl_env(tmp_path, pocl_device, POCL_CACHE_DIR=str(mine)))
    assert out["result"] == [2.0, 4.0]
    assert _files_under(mine)
    assert not (tmp_path / "cache" / "pocl").exists()
