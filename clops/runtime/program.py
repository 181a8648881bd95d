"""Runtime, programs: builds OpenCL C with an in-memory cache and an on-disk binary cache, and
turns build failures into errors that show the numbered source and the compiler log."""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
import warnings
from collections import Counter
from typing import TYPE_CHECKING

import pyopencl as cl

from .. import _config

if TYPE_CHECKING:
    from .device import CLDevice

# Counted for tests and benchmarks: "builds" (compiler runs), "disk_hits", "memory_hits".
STATS: Counter[str] = Counter()


class BuildError(RuntimeError):
    """An OpenCL C program failed to build. The message holds the numbered source around the
    failing lines and the compiler's log."""

    def __init__(self, device_name: str, source: str, options: tuple[str, ...], log: str):
        self.source = source
        self.log = log.strip()
        self.options = options
        super().__init__(
            f"OpenCL build failed on {device_name} (options: {' '.join(options) or 'none'})\n"
            f"{excerpt(source, error_lines(self.log))}\n--- compiler log ---\n{self.log}")


# Where logs put the line, most specific first: ``<source>:12:5: error: ...`` (clang-based
# drivers, NVIDIA, Intel), ``error: /tmp/x.cl:12:5: ...`` (PoCL puts the word first), and
# ``..., line 12: error`` (EDG-style front ends).
_LOCATIONS = (
    re.compile(r"(\d+):\d+:\s*(?:fatal\s+)?error"),
    re.compile(r":(\d+):\d+:"),
    re.compile(r"\bline (\d+)"),
)


def error_lines(log: str) -> list[int]:
    """Line numbers of the errors a compiler log points at.

    >>> error_lines("<source>:12:5: error: use of undeclared identifier 'x'")
    [12]
    """
    found: list[int] = []
    for text in log.splitlines():
        if "error" not in text.lower() or "error generated" in text or "errors generated" in text:
            continue
        for pattern in _LOCATIONS:
            m = pattern.search(text)
            if m is not None:
                found.append(int(m.group(1)))
                break
    return sorted(set(found))


def excerpt(source: str, lines: list[int], context: int = 3) -> str:
    src = source.splitlines()
    width = len(str(len(src)))
    lines = [n for n in lines if 1 <= n <= len(src)]  # a log may point into an included file
    if not lines:
        show = range(1, len(src) + 1) if len(src) <= 60 else range(1, 61)
    else:
        keep: set[int] = set()
        for n in lines:
            keep.update(range(max(1, n - context), min(len(src), n + context) + 1))
        show = sorted(keep)  # type: ignore[assignment]
    out, prev = [], 0
    for n in show:
        if prev and n != prev + 1:
            out.append(" " * width + " | ...")
        mark = ">" if n in lines else " "
        out.append(f"{n:>{width}}{mark}| {src[n - 1]}")
        prev = n
    return "\n".join(out)


class ProgramCache:
    """Per-device cache of built programs: memory first, then disk binaries."""

    def __init__(self, device: CLDevice, disk_dir: str | None) -> None:
        self.device = device
        self.disk_dir = disk_dir
        self._mem: dict[tuple[str, tuple[str, ...]], cl.Program] = {}
        self._lock = threading.Lock()

    def _key(self, source: str, options: tuple[str, ...]) -> str:
        d = self.device
        h = hashlib.sha256()
        for part in (source, "\0".join(options), d.name, d.platform_version, d.driver_version):
            h.update(part.encode())
            h.update(b"\x01")
        return h.hexdigest()[:40]

    def build(self, source: str, options: tuple[str, ...] = ()) -> cl.Program:
        key = (source, options)
        prog = self._mem.get(key)
        if prog is not None:
            STATS["memory_hits"] += 1
            return prog
        with self._lock:
            prog = self._mem.get(key)
            if prog is None:
                prog = self._load_or_build(source, options)
                self._mem[key] = prog
        return prog

    def _load_or_build(self, source: str, options: tuple[str, ...]) -> cl.Program:
        ctx, dev = self.device.context, self.device.cl_device
        path = None
        if self.disk_dir is not None:
            path = os.path.join(self.disk_dir, self._key(source, options) + ".bin")
            if os.path.exists(path):
                try:
                    with open(path, "rb") as f:
                        binary = f.read()
                    prog = cl.Program(ctx, [dev], [binary])
                    prog.build(options=list(options), devices=[dev])
                    STATS["disk_hits"] += 1
                    return prog
                except (OSError, cl.Error):
                    pass  # a stale or truncated binary: build from source below
        STATS["builds"] += 1
        prog = cl.Program(ctx, source)
        try:
            with warnings.catch_warnings(record=True) as notes:
                # A driver's remarks on a successful build (NVIDIA prints some) are not the
                # user's concern; CLOPS_DEBUG shows them.
                warnings.simplefilter("always", cl.CompilerWarning)
                prog.build(options=list(options), devices=[dev],
                           cache_dir=False)  # type: ignore[arg-type]
            if notes and _config.CONFIG.debug >= 1:
                for n in notes:
                    print(f"[clops] compiler output: {n.message}", file=sys.stderr)
        except cl.Error as e:
            try:
                with warnings.catch_warnings():
                    # pyopencl warns when it has no program object left to ask (drivers it
                    # does not trust to cache); the log is then in the error's text.
                    warnings.simplefilter("ignore")
                    log = str(prog.get_build_info(dev, cl.program_build_info.LOG))
            except cl.Error:
                log = str(e)
            raise BuildError(self.device.name, source, options, log or str(e)) from None
        if path is not None:
            try:
                binaries = prog.get_info(cl.program_info.BINARIES)
                built = binaries[0] if isinstance(binaries, list) and binaries else None
                if built:
                    os.makedirs(self.disk_dir or ".", exist_ok=True)
                    tmp = f"{path}.{os.getpid()}.tmp"
                    with open(tmp, "wb") as f:
                        f.write(built)
                    os.replace(tmp, path)
            except (OSError, cl.Error):
                pass
        return prog

    def clear(self) -> None:
        with self._lock:
            self._mem.clear()
