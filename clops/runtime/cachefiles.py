"""Runtime, cache files: where clops keeps files between runs, and reading and writing them so
that whatever is found there (truncated, swapped, a folder, a pipe, planted by another user)
is refused before it reaches a driver, and what is written appears whole or not at all."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile

from .. import _config

# Larger files are not read (nor written): a cache entry is a program binary or a small table.
MAX_FILE_BYTES = 256 << 20
# The first line of every program cache entry; the second is a JSON header (below).
ENTRY_MAGIC = b"clops-cache-entry 1\n"
_MAX_HEADER_BYTES = 64 << 10


class CacheEntryError(ValueError):
    """A cache file that may not be used; the message says why."""


class UnsafeDirectoryError(OSError):
    """A folder that others could change (not ours, a symbolic link, or writable by others)."""


def root() -> str:
    """The cache folder: ``CLOPS_CACHE_DIR``, else the user's cache folder for clops (the same
    rule as ``runtime.device.cache_dir``)."""
    d = _config.cache_dir()
    if not d:
        import platformdirs

        d = platformdirs.user_cache_dir("clops")
    return d


def read_file(path: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    Never blocks: a named pipe, a device or a folder at ``path`` raises ``CacheEntryError``
    (as does a file larger than ``limit``, or one owned by another user than us or root);
    a missing or unreadable file raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheEntryError("not a regular file")
        if hasattr(os, "geteuid") and st.st_uid not in (os.geteuid(), 0):
            raise CacheEntryError(f"owned by uid {st.st_uid}, not by this user")
        if st.st_size > limit:
            raise CacheEntryError(f"{st.st_size} bytes, more than the {limit} a cache file has")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise CacheEntryError(f"grew past {limit} bytes while being read")
        return data
    finally:
        os.close(fd)


def write_file(path: str, data: bytes) -> bool:
    """Write ``data`` to ``path`` atomically (a private temporary file in the same folder,
    flushed, then renamed over ``path``): a reader sees the old file or the new one, never a
    part. An empty folder in the way is removed; returns False when the file could not be
    written (the cache is then only slower)."""
    folder = os.path.dirname(path) or "."
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".",
                                   suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)  # only an empty one; a folder with files in it stays (OSError)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def pack_entry(meta: dict[str, str], payload: bytes) -> bytes:
    """A program cache entry: ``ENTRY_MAGIC``, a one-line JSON header (``meta`` plus the
    payload's length and sha256), then the payload."""
    header = dict(meta, bytes=str(len(payload)), sha256=hashlib.sha256(payload).hexdigest())
    line = json.dumps(header, sort_keys=True, ensure_ascii=True).encode() + b"\n"
    return ENTRY_MAGIC + line + payload


def unpack_entry(data: bytes, expect: dict[str, str] | None = None) -> tuple[dict[str, str],
                                                                          bytes]:
    """(header, payload) of an entry written by ``pack_entry``, checked: its magic line, a
    header of strings only, the payload's length and sha256, and every field of ``expect``
    (the key and the device it was built for). Raises ``CacheEntryError`` naming what failed.

    >>> unpack_entry(pack_entry({"key": "k"}, b"abc"), {"key": "k"})[1]
    b'abc'
    """
    if not data.startswith(ENTRY_MAGIC):
        raise CacheEntryError("no clops cache header (an old, foreign or damaged file)")
    end = data.find(b"\n", len(ENTRY_MAGIC), len(ENTRY_MAGIC) + _MAX_HEADER_BYTES)
    if end < 0:
        raise CacheEntryError("header line missing or too long")
    try:
        header = json.loads(data[len(ENTRY_MAGIC):end].decode("ascii"))
    except (ValueError, RecursionError):
        raise CacheEntryError("header is not JSON") from None
    if not isinstance(header, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in header.items()):
        raise CacheEntryError("header is not a table of strings")
    payload = data[end + 1:]
    if header.get("bytes") != str(len(payload)):
        raise CacheEntryError(f"{len(payload)} bytes of binary where the header says "
                              f"{header.get('bytes')!r} (truncated or extended)")
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        raise CacheEntryError("sha256 of the binary differs from the header's (damaged)")
    for name, value in (expect or {}).items():
        if header.get(name) != value:
            raise CacheEntryError(f"built for another {name} ({header.get(name)!r}, this is "
                                  f"{value!r})")
    return header, payload


def _safe_dir_stat(path: str, st: os.stat_result) -> str | None:
    """Why the folder with ``st`` is unsafe to trust, or None when it is safe: it must be
    owned by us (or root) and not writable by others unless sticky (as /tmp is)."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if st.st_uid not in (os.geteuid(), 0):
        return f"{path} is owned by uid {st.st_uid}, not by this user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"{path} is writable by other users"
    return None


def private_dir(path: str) -> str:
    """Create (or take) ``path`` as a folder only this user can reach: mode 0700, owned by us,
    not a symbolic link, its parent made the same way, and every folder above it owned by us
    or root and not writable by others (unless sticky). Returns its resolved path (what to hand
    to other programs, so that no link on the way can be swapped later). Raises
    ``UnsafeDirectoryError`` saying what is wrong, or ``OSError`` when it cannot be made."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(os.path.dirname(parent), mode=0o700, exist_ok=True)
    for folder in (parent, path):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(folder)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeDirectoryError(f"{folder} is a symbolic link; clops makes this folder "
                                       "itself: remove the link")
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeDirectoryError(f"{folder} is not a folder: remove it")
        if st.st_uid != os.geteuid():
            raise UnsafeDirectoryError(f"{folder} belongs to uid {st.st_uid}, not to this user "
                                       f"(uid {os.geteuid()}): remove it")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(folder, 0o700)  # ours: made private (its files are written afresh)
    real = os.path.realpath(path)
    probe = os.path.dirname(real)
    while True:
        reason = _safe_dir_stat(probe, os.stat(probe))
        if reason is not None:
            raise UnsafeDirectoryError(f"{reason}, so it could swap {path}: choose another "
                                       "CLOPS_CACHE_DIR")
        up = os.path.dirname(probe)
        if up == probe:
            break
        probe = up
    st = os.stat(real)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        raise UnsafeDirectoryError(f"{path} changed while it was being made private")
    return real
