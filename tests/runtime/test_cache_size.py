"""Runtime, cache size: the kernel caches stay under CLOPS_CACHE_LIMIT, least recently used
first, what was used lately kept; a process that compiled trims at exit; ``clops cache``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clops import _config
from clops.runtime import cachesize

NOW = 1_000_000_000.0
DAY = 86400.0


def _file(path: Path, nbytes: int, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * nbytes)
    os.utime(path, (mtime, mtime))


def _program(root: Path, name: str, nbytes: int, used: float) -> Path:
    path = root / "programs" / f"{name}.bin"
    _file(path, nbytes, used)
    return path


def _pocl(root: Path, name: str, nbytes: int, used: float) -> Path:
    prog = root / "pocl" / name[:2] / name
    _file(prog / "k" / "1-1-1" / "k.so", nbytes, used - DAY)
    _file(prog / "last_accessed", 0, used)
    return prog


def test_least_recently_used_go_first_until_under_the_limit(tmp_path: Path) -> None:
    old_prog = _program(tmp_path, "a" * 40, 400, NOW - 5 * DAY)
    old_pocl = _pocl(tmp_path, "AAOLD", 300, NOW - 4 * DAY)
    mid = _program(tmp_path, "b" * 40, 200, NOW - 2 * DAY)
    new_pocl = _pocl(tmp_path, "ABNEW", 300, NOW - DAY)
    assert cachesize.usage(str(tmp_path)) == {"programs": 600, "pocl": 600}
    freed = cachesize.trim(900, str(tmp_path), now=NOW)
    # 1200 bytes over a limit of 900: down to at most 720, the oldest first
    assert freed == 700
    assert not old_prog.exists() and not old_pocl.exists()
    assert mid.exists() and new_pocl.exists()
    assert sum(cachesize.usage(str(tmp_path)).values()) == 500


def test_under_the_limit_or_without_one_nothing_goes(tmp_path: Path) -> None:
    p = _program(tmp_path, "a" * 40, 400, NOW - 5 * DAY)
    assert cachesize.trim(400, str(tmp_path), now=NOW) == 0
    assert cachesize.trim(0, str(tmp_path), now=NOW) == 0
    assert p.exists()


def test_what_was_used_lately_stays_even_over_the_limit(tmp_path: Path) -> None:
    recent = _program(tmp_path, "a" * 40, 400, NOW - 60)
    old = _program(tmp_path, "b" * 40, 400, NOW - DAY)
    assert cachesize.trim(100, str(tmp_path), now=NOW) == 400
    assert recent.exists() and not old.exists()


def test_pocl_use_is_read_from_its_last_accessed_file(tmp_path: Path) -> None:
    # built long ago (old files) but used yesterday: newer than a program used two days ago
    used = _pocl(tmp_path, "AAUSED", 300, NOW - DAY)
    prog = _program(tmp_path, "a" * 40, 300, NOW - 2 * DAY)
    cachesize.trim(500, str(tmp_path), now=NOW)
    assert used.exists() and not prog.exists()


def test_a_hit_marks_the_binary_used(tmp_path: Path) -> None:
    p = _program(tmp_path, "a" * 40, 10, NOW - DAY)
    cachesize.touch(str(p), now=NOW)
    assert os.stat(p).st_mtime == NOW
    cachesize.touch(str(p), now=NOW + 60)  # within the hour: left as it is
    assert os.stat(p).st_mtime == NOW


def test_limit_reads_units_and_refuses_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLOPS_CACHE_LIMIT", raising=False)
    assert _config.cache_limit() == 2 << 30
    monkeypatch.setenv("CLOPS_CACHE_LIMIT", "512MB")
    assert _config.cache_limit() == 512 << 20
    monkeypatch.setenv("CLOPS_CACHE_LIMIT", "0")
    assert _config.cache_limit() == 0
    monkeypatch.setenv("CLOPS_CACHE_LIMIT", "lots")
    with pytest.raises(ValueError, match="CLOPS_CACHE_LIMIT.*byte count"):
        _config.cache_limit()


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    env = dict(os.environ, CLOPS_CACHE_DIR=str(tmp_path), CLOPS_PROGRESS="0", **more)
    env.pop("POCL_CACHE_DIR", None)
    return env


def test_a_process_that_compiles_trims_at_exit(tmp_path: Path) -> None:
    import clops

    if clops.device().programs.disk_dir is None:
        pytest.skip("the default device's driver caches its builds itself (NVIDIA): clops "
                    "stores no binaries for it, so its builds trim nothing")
    stale = _program(tmp_path, "f" * 40, 1 << 20, time.time() - 30 * DAY)
    code = ("import clops, numpy as np\n"
            "x = clops.asarray(np.arange(7, dtype=np.float32))\n"
            "print(float(((x * 3.25 + 1.5) ** 2).sum()))\n")
    res = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path, CLOPS_CACHE_LIMIT="1"),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert not stale.exists()
    # the program just built stays (used within the last minutes)
    assert list((tmp_path / "programs").glob("*.bin"))


def test_clops_cache_shows_trims_and_clears(tmp_path: Path) -> None:
    old = _program(tmp_path, "a" * 40, 3 << 20, time.time() - 30 * DAY)
    cmd = [sys.executable, "-m", "clops", "cache"]
    out = subprocess.run(cmd, env=_env(tmp_path, CLOPS_CACHE_LIMIT="1MB"), capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert str(tmp_path) in out and "programs/     3.0 MiB" in out
    assert "limit           1.0 MiB" in out
    out = subprocess.run([*cmd, "--trim"], env=_env(tmp_path, CLOPS_CACHE_LIMIT="1MB"),
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "removed 3.0 MiB" in out and not old.exists()
    _program(tmp_path, "b" * 40, 1 << 20, time.time())
    out = subprocess.run([*cmd, "--clear"], env=_env(tmp_path), capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "removed 1.0 MiB" in out and not list((tmp_path / "programs").glob("*.bin"))
