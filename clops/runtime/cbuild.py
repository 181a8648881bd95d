"""Runtime, C builds: a small C source of clops' own built once with the system's C compiler
into a shared library, kept in the cache folder (``native/``) under a name made of its source,
the compiler, its flags and whatever else the caller names (a CPU's model for a library built
for it), and loaded through ctypes. Nothing is built where no compiler is found; the callers
then take their plain paths."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from . import cachefiles


def compiler() -> str | None:
    """The C compiler: ``CC``, else ``cc``, ``gcc`` or ``clang`` (None where none is found)."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


@functools.cache
def _process_folder() -> tempfile.TemporaryDirectory[str]:
    """A folder of this process's own (removed at exit), where the cache cannot be written."""
    return tempfile.TemporaryDirectory(prefix="clops-native-")


def build(stem: str, src: str, flags: list[str], identity: str = "",
          debug: bool = False) -> Any | None:
    """The library built from ``src`` with ``flags`` (ctypes), or None: not Linux, no
    compiler, or a failed build (``debug``: its errors printed)."""
    if not sys.platform.startswith("linux"):
        return None
    cc = compiler()
    if cc is None:
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    key = hashlib.sha256("\0".join([src, cc, version, " ".join(flags), identity])
                         .encode()).hexdigest()[:20]
    folder = os.path.join(cachefiles.root(), "native")
    path = os.path.join(folder, f"{stem}-{key}.so")
    if not os.path.exists(path):
        try:
            os.makedirs(folder, exist_ok=True)
            fd, out = tempfile.mkstemp(suffix=".so", dir=folder)  # beside it: atomic rename
        except OSError:  # (a cache folder that cannot be written: build for this process)
            folder = _process_folder().name
            path = os.path.join(folder, f"{stem}-{key}.so")
            fd, out = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        c_file = out[:-3] + ".c"
        try:
            with open(c_file, "w") as f:
                f.write(src)
            done = subprocess.run([cc, *flags, "-o", out, c_file, "-lm"],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                if debug:
                    print(f"clops: {stem} not built:\n{done.stderr}")
                return None
            os.replace(out, path)  # (another process may be building it too)
        except (OSError, subprocess.SubprocessError):
            return None
        finally:
            for leftover in (c_file, out):
                with contextlib.suppress(OSError):
                    os.remove(leftover)
    import ctypes

    try:
        return ctypes.CDLL(path)
    except OSError:
        return None
