"""Runtime, cache size: keeps the folders of compiled kernels (clops' program binaries in
``programs/`` and PoCL's kernel cache in ``pocl/``) under ``CLOPS_CACHE_LIMIT`` (default 2 GiB)
by removing what was used least recently.

A process that compiled something trims at exit (nothing else writes there); ``clops cache``
shows the sizes and trims or clears on request. The unit of removal is one program binary, or
one of PoCL's program folders (PoCL touches its ``last_accessed`` file on use); what was used in
the last ten minutes is kept, since another process may be reading it."""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass

from .. import _config
from . import cachefiles

# Trimming goes this far under the limit, so that it does not run again after every build.
TRIM_TO = 0.8
KEEP_RECENT_S = 600.0
FOLDERS = ("programs", "pocl")


@dataclass(frozen=True)
class Unit:
    """What is removed at once: a path, its bytes and when it was last used."""
    path: str
    nbytes: int
    used: float


def _tree(path: str) -> tuple[int, float]:
    """Bytes of the files under ``path`` and the newest modification among them."""
    total, newest = 0, 0.0
    for top, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            total += st.st_size
            newest = max(newest, st.st_mtime)
    return total, newest


def _program_units(folder: str) -> list[Unit]:
    units = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for e in entries:
        if e.is_file(follow_symlinks=False) and e.name.endswith(".bin"):
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            units.append(Unit(e.path, st.st_size, st.st_mtime))
    return units


def _pocl_units(folder: str) -> list[Unit]:
    units = []
    try:
        shards = [e.path for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    for shard in shards:
        try:
            programs = [e.path for e in os.scandir(shard) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for prog in programs:
            nbytes, newest = _tree(prog)
            try:
                used = os.lstat(os.path.join(prog, "last_accessed")).st_mtime
            except OSError:
                used = newest
            units.append(Unit(prog, nbytes, max(used, newest)))
    return units


def units(root: str | None = None) -> dict[str, list[Unit]]:
    """The removable units of each cache folder under ``root`` (default: the cache folder)."""
    root = root or cachefiles.root()
    return {"programs": _program_units(os.path.join(root, "programs")),
            "pocl": _pocl_units(os.path.join(root, "pocl"))}


def usage(root: str | None = None) -> dict[str, int]:
    """Bytes held by each cache folder."""
    return {name: sum(u.nbytes for u in us) for name, us in units(root).items()}


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def trim(limit: int | None = None, root: str | None = None, now: float | None = None,
         keep_recent_s: float = KEEP_RECENT_S) -> int:
    """Remove the least recently used units until the caches hold at most ``TRIM_TO`` of
    ``limit`` (default ``CLOPS_CACHE_LIMIT``), when they hold more than ``limit``; units used
    within ``keep_recent_s`` stay. Returns the bytes removed."""
    limit = _config.cache_limit() if limit is None else limit
    if not limit:
        return 0
    every = [u for us in units(root).values() for u in us]
    total = sum(u.nbytes for u in every)
    if total <= limit:
        return 0
    now = time.time() if now is None else now
    freed = 0
    for u in sorted(every, key=lambda u: u.used):
        if total - freed <= TRIM_TO * limit:
            break
        if now - u.used < keep_recent_s:
            continue
        _remove(u.path)
        freed += u.nbytes
    return freed


def clear(root: str | None = None) -> int:
    """Remove every unit of both folders; returns the bytes removed."""
    freed = 0
    for us in units(root).values():
        for u in us:
            _remove(u.path)
            freed += u.nbytes
    return freed


def touch(path: str, now: float | None = None) -> None:
    """Mark a program binary as used (at most once an hour per file, to spare the disk)."""
    now = time.time() if now is None else now
    try:
        if now - os.stat(path).st_mtime > 3600:
            os.utime(path, (now, now))
    except OSError:
        pass


_REGISTERED = False
_REGISTER_LOCK = threading.Lock()


def trim_at_exit() -> None:
    """Trim once when this process ends (called when it first compiles a program; threads
    may compile at once)."""
    global _REGISTERED
    if _REGISTERED or not _config.CONFIG.disk_cache:
        return
    with _REGISTER_LOCK:
        if _REGISTERED:
            return
        _REGISTERED = True
    import atexit

    atexit.register(_trim_quietly)


def _trim_quietly() -> None:
    try:
        trim()
    except (OSError, ValueError):
        pass
