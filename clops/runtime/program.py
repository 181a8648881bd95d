"""Runtime, programs: builds OpenCL C with an in-memory cache and an on-disk binary cache (each
entry checked before its binary reaches the driver), and turns build failures into errors that
show the numbered source and the compiler log."""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from .. import _config
from . import cachefiles, cachesize
from .keylocks import KeyedLocks

if TYPE_CHECKING:
    from .protocols import Device

# Counted for tests and benchmarks: "builds" (compiler runs), "disk_hits", "memory_hits" and
# "disk_refused" (cache entries that failed a check and were rebuilt).
STATS: Counter[str] = Counter()


class BuildError(RuntimeError):
    """An OpenCL C program failed to build. The message holds the numbered source around the
    failing lines and the compiler's log."""

    def __init__(self, device_name: str, source: str, options: tuple[str, ...], log: str):
        self.source = source
        self.log = log.strip()
        self.options = options
        cpu = _UNKNOWN_CPU.search(self.log)
        if cpu:
            # not this kernel's fault: the runtime's compiler cannot target the processor
            super().__init__(
                f"{device_name} cannot compile any kernel: its OpenCL compiler does not know "
                f"this processor ({cpu.group(0)}; an older PoCL's LLVM, such as PoCL 3.0 of "
                "pyopencl's wheel, predates it). Use another OpenCL runtime: Intel's CPU "
                "runtime (pip install 'clops-opencl[intel]'), a newer PoCL (apt install "
                "pocl-opencl-icd), or pick another device with CLOPS_DEVICE (clops info "
                "lists them).")
            return
        super().__init__(
            f"OpenCL build failed on {device_name} (options: {' '.join(options) or 'none'})\n"
            f"{excerpt(source, error_lines(self.log))}\n--- compiler log ---\n{self.log}")


_UNKNOWN_CPU = re.compile(r"unknown target CPU '[^']*'")


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


# kernel objects given back by launches run once (``release_kernel``), by (program, function),
# for ``new_kernel`` to hand out again
_SPARE: dict[tuple[int, str], list[cl.Kernel]] = {}
_SPARE_LOCK = threading.Lock()
SPARE_MAX = 8  # kept a (program, function) at most


def new_kernel(program: cl.Program, function: str, where: str = "the program") -> cl.Kernel:
    """A kernel object of its own (its own argument slots, no one else's) for ``function`` of a
    built program: one a launch run once gave back (``release_kernel``), else a new one.
    Raises LookupError where the program has no such kernel (checked by name first: some
    drivers, NVIDIA's, make a kernel object for any name).

    NOTE: one kernel object, not the program's every kernel (``all_kernels``): a kernel object
    costs pyopencl about 0.08 ms, and a batched step's plan makes one per launch."""
    with _SPARE_LOCK:
        spare = _SPARE.get((program.int_ptr, function))
        if spare:
            return spare.pop()
    try:
        names: list[str] | None = str(program.get_info(cl.program_info.KERNEL_NAMES)).split(";")
    except cl.Error:
        # NVIDIA's driver (580) answers INVALID_PROGRAM_EXECUTABLE for a program built for any
        # device of a context but its first (a split model's later GPUs), whose kernels are
        # there and run: the name goes unchecked there
        names = None
    if names is not None and function not in names:
        raise LookupError(f"no kernel {function!r} in {where}")
    return cl.Kernel(program, function)


def device_binary(program: cl.Program, dev: cl.Device) -> bytes:
    """``program``'s binary for ``dev``: a program built from source in a context of several
    devices has one entry a device of the context, empty for those it was not built for."""
    binaries: list[bytes] = program.get_info(cl.program_info.BINARIES)  # type: ignore[assignment]
    devices: list[cl.Device] = program.get_info(cl.program_info.DEVICES)  # type: ignore[assignment]
    for d, b in zip(devices, binaries):
        if d == dev:
            return bytes(b)
    return bytes(binaries[0]) if len(binaries) == 1 else b""


def spare_ok(knl: cl.Kernel) -> cl.Kernel:
    """Mark a kernel object from ``new_kernel`` as one a single launch owns (kernels.launch's
    ``kernel``), so that ``release_kernel`` takes it back; objects shared between callers (a
    device's or a module's cache) are never marked."""
    setattr(knl, "_clops_spare_ok", True)  # noqa: B010 - a mark on pyopencl's object
    return knl


def release_kernel(knl: cl.Kernel, args: list[object]) -> None:
    """Give back a kernel object marked ``spare_ok`` that nothing holds any more (a launch run
    once, just enqueued with ``args``), for ``new_kernel`` to hand out again; any other object
    is left alone. The first time, its scalar arguments' types are set from ``args`` (numpy
    scalars; buffers have none), so that setting its arguments costs microseconds, not about
    5 us each (left unset where an argument is a Python number, whose width the kernel alone
    knows)."""
    if type(knl) is not cl.Kernel or not getattr(knl, "_clops_spare_ok", False):
        return
    if not getattr(knl, "_clops_typed", False) and not any(
            isinstance(a, (int, float)) and not isinstance(a, np.generic) for a in args):
        knl.set_scalar_arg_dtypes([type(a) if isinstance(a, np.generic) else None
                                   for a in args])
        setattr(knl, "_clops_typed", True)  # noqa: B010 - a mark on pyopencl's object
    prog: Any = knl.get_info(cl.kernel_info.PROGRAM)
    key = (prog.int_ptr, knl.function_name)
    with _SPARE_LOCK:
        spare = _SPARE.setdefault(key, [])
        if len(spare) < SPARE_MAX and not any(k is knl for k in spare):
            spare.append(knl)


class _QuietBuilds:
    """Keeps a driver's remarks on a build it completed (pyopencl's ``CompilerWarning``, and
    its warning on asking a program it never built for its log) from the user while any
    thread builds; ``CLOPS_DEBUG`` prints the build log instead.

    NOTE: ``warnings.catch_warnings`` swaps process-wide state and restores what it saw on
    entry: two builds on two threads, each in a block of its own, left in the order they came
    and restored each other's filters (for good: a recording block's, which hides every later
    warning). One block is held while any build runs, entered by the first and left by the
    last, and builds of other programs go on at the same time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._block: Any = None

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                block = warnings.catch_warnings()
                block.__enter__()
                warnings.simplefilter("ignore", cl.CompilerWarning)
                warnings.filterwarnings("ignore", "Pre-build attribute access")
                self._block = block
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                block, self._block = self._block, None
                block.__exit__(None, None, None)


QUIET_BUILDS = _QuietBuilds()


def sm90a_ptx(ptx: bytes) -> bytes:
    """NVIDIA's PTX of a program for sm_90 named for sm_90a (Hopper's wgmma, bulk copies and
    mbarriers, which NVIDIA's OpenCL compiler does not target), its hidden ("//@@")
    instructions uncommented: ``rebuilt_from_binary``'s patch. Raises ValueError for other
    PTX."""
    text = ptx.decode()
    if not re.search(r"^\.target\s+sm_90\b", text, re.M):
        raise ValueError("not PTX for sm_90")
    text = re.sub(r"^(\.target\s+)sm_90\b", r"\1sm_90a", text, flags=re.M)
    return text.replace("//@@", "").encode()


def rebuilt_from_binary(device: Device, program: cl.Program,
                        patch: Callable[[bytes], bytes]) -> cl.Program:
    """``program``'s binary passed through ``patch`` and built again as a binary (not cached).
    NVIDIA's binaries are PTX text: gemm.py names the sm_90a target there, which NVIDIA's
    OpenCL compiler does not (Hopper's wgmma). Raises cl.Error where the driver refuses it."""
    dev = device.cl_device
    prog = cl.Program(device.context, [dev], [patch(device_binary(program, dev))])
    with QUIET_BUILDS:
        prog.build(devices=[dev], cache_dir=False)  # type: ignore[arg-type]
    return prog


class _BuildNote:
    """A one-line note on a terminal while programs compile for the first time (a cold cache
    spends seconds there): shown during each compile, erased after it. Only where stderr is a
    terminal; CLOPS_PROGRESS=0 turns it off."""

    def __init__(self) -> None:
        self.count = 0

    def on(self) -> bool:
        try:
            return sys.stderr.isatty() and _config.progress()
        except (AttributeError, ValueError):  # a replaced or closed stderr
            return False

    def start(self, device: str) -> bool:
        self.count += 1
        if not self.on():
            return False
        sys.stderr.write(f"\r[clops] compiling OpenCL program {self.count} for {device[:40]} "
                         "(first use; cached for later runs)...")
        sys.stderr.flush()
        return True

    @staticmethod
    def done() -> None:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


BUILD_NOTE = _BuildNote()


# Settings under which a CPU runtime compiles for another CPU than the one it runs on, without
# the device it reports changing (Intel's runtime keeps its device name under
# CL_CONFIG_CPU_TARGET_ARCH=core-avx2): a cached binary and a remembered probe result are tied
# to them where they are set, so that a binary made for AVX-512, or a verdict on its code, is
# never taken by a process asking for AVX2 (nor the reverse).
TARGET_ENV = ("CL_CONFIG_CPU_TARGET_ARCH", "POCL_KERNELLIB_NAME", "POCL_LLVM_CPU_NAME")


def target_setting() -> str:
    """The ``TARGET_ENV`` settings of this process ("" where none is set), as part of what a
    cached binary or a remembered probe result is tied to."""
    return ";".join(f"{k}={os.environ[k]}" for k in TARGET_ENV if os.environ.get(k))


class ProgramCache:
    """Per-device cache of built programs: memory first, then disk binaries. Threads may share
    it: each program is built once, different programs at the same time."""

    def __init__(self, device: Device, disk_dir: str | None) -> None:
        self.device = device
        self.disk_dir = disk_dir
        self._mem: dict[tuple[str, tuple[str, ...]], cl.Program] = {}
        self._filling = KeyedLocks()

    def _identity(self) -> dict[str, str]:
        """What a binary is tied to besides its source: device, platform and driver, and the
        target CPU a CPU runtime was told to compile for, where it was (``TARGET_ENV``)."""
        d = self.device
        ident = {"device": d.name, "platform": d.platform_version, "driver": d.driver_version}
        target = target_setting()
        if target:
            ident["target"] = target
        return ident

    def _key(self, source: str, options: tuple[str, ...]) -> str:
        h = hashlib.sha256()
        for part in (source, "\0".join(options), *self._identity().values()):
            h.update(part.encode())
            h.update(b"\x01")
        return h.hexdigest()

    def build(self, source: str, options: tuple[str, ...] = ()) -> cl.Program:
        key = (source, options)
        prog = self._mem.get(key)
        if prog is not None:
            STATS["memory_hits"] += 1
            return prog
        # PERF (PoCL 3.1, 2 cores): 8 programs built on 8 threads took 1.5 s, one after
        # another 2.6 s: only a thread that wants the very program being built waits
        with self._filling.hold(key):
            prog = self._mem.get(key)
            if prog is None:
                prog = self._load_or_build(source, options)
                self._mem[key] = prog
        return prog

    def _load_or_build(self, source: str, options: tuple[str, ...]) -> cl.Program:
        path = expect = None
        # (PoCL 3.0-rc2, pip's pocl-binary-distribution: reading a program's binaries was seen
        # to crash the process after some builds, and a binary it wrote to lack a kernel of its
        # source, 2026-12-02; its programs are built each run instead, none read or written)
        if self.disk_dir is not None and \
                "PoCL 3.0-rc" not in self.device.cl_device.platform.version:
            key = self._key(source, options)
            path = os.path.join(self.disk_dir, key[:40] + ".bin")
            expect = dict(self._identity(), key=key)
            prog = self._load(path, expect, options)
            if prog is not None:
                STATS["disk_hits"] += 1
                cachesize.touch(path)
                return prog
        prog = self._compile(source, options)
        if path is not None and expect is not None:
            self._store(path, expect, prog)
            cachesize.trim_at_exit()
        return prog

    def _load(self, path: str, expect: dict[str, str], options: tuple[str, ...]
              ) -> cl.Program | None:
        """The program of the cache entry at ``path``, or None when there is none or it fails a
        check (length, sha256, key, device, driver): a damaged binary can crash a driver, so
        nothing unchecked is handed to one. A refused entry is rewritten after the build."""
        try:
            data = cachefiles.read_file(path)
        except FileNotFoundError:
            return None
        except (OSError, cachefiles.CacheEntryError) as e:
            self._refused(path, str(e))
            return None
        try:
            _, binary = cachefiles.unpack_entry(data, expect)
        except cachefiles.CacheEntryError as e:
            self._refused(path, str(e))
            return None
        dev = self.device.cl_device
        try:
            prog = cl.Program(self.device.context, [dev], [binary])
            # a driver's remarks on linking its own binary (PoCL's, Intel's): not the user's
            # concern, as on a build from source
            with QUIET_BUILDS:
                prog.build(options=list(options) + self._quiet(), devices=[dev])
        except cl.Error as e:  # e.g. a driver that no longer takes its own older binaries
            self._refused(path, f"the driver refused the binary: {e}")
            return None
        return prog

    def _refused(self, path: str, why: str) -> None:
        STATS["disk_refused"] += 1
        if _config.CONFIG.debug >= 1:
            print(f"[clops] program cache entry {path} not used ({why}); building from source",
                  file=sys.stderr)

    def _compile(self, source: str, options: tuple[str, ...]) -> cl.Program:
        dev = self.device.cl_device
        STATS["builds"] += 1
        noted = BUILD_NOTE.start(self.device.name)
        try:
            return self._compile_program(source, options, dev)
        finally:
            if noted:
                BUILD_NOTE.done()

    def _quiet(self) -> list[str]:
        """Options that keep a driver from writing its compiler's remarks to the process's
        stderr itself: PoCL prints clang's "N warnings generated." there (on CPUs without
        AVX-512, for every kernel with 16-wide vectors), past pyopencl; OpenCL's ``-w`` (no
        warnings) keeps it quiet. Not part of a program's key (its binary is the same);
        CLOPS_DEBUG keeps the warnings, for the build log it prints."""
        if _config.CONFIG.debug >= 1 or "PoCL" not in self.device.platform_version:
            return []
        return ["-w"]

    def _compile_program(self, source: str, options: tuple[str, ...], dev: cl.Device
                         ) -> cl.Program:
        prog = cl.Program(self.device.context, source)
        # A driver's remarks on a successful build (NVIDIA prints some) are not the user's
        # concern; CLOPS_DEBUG shows them.
        with QUIET_BUILDS:
            try:
                prog.build(options=list(options) + self._quiet(), devices=[dev],
                           cache_dir=False)  # type: ignore[arg-type]
            except cl.Error as e:
                try:
                    # (where pyopencl has no program object left to ask, drivers it does not
                    # trust to cache, the log is in the error's text)
                    log = str(prog.get_build_info(dev, cl.program_build_info.LOG))
                except cl.Error:
                    log = str(e)
                raise BuildError(self.device.name, source, options, log or str(e)) from None
            if _config.CONFIG.debug >= 1:
                log = str(prog.get_build_info(dev, cl.program_build_info.LOG)).strip()
                if log:
                    print(f"[clops] compiler output: {log}", file=sys.stderr)
        return prog

    def _store(self, path: str, meta: dict[str, str], prog: cl.Program) -> None:
        try:
            built = device_binary(prog, self.device.cl_device)
        except cl.Error:
            return
        if built and len(built) < cachefiles.MAX_FILE_BYTES - (64 << 10):
            cachefiles.write_file(path, cachefiles.pack_entry(meta, built))

    def clear(self) -> None:
        self._mem.clear()


class KernelObjects:
    """A device's kernel objects of its cached programs: one per (source, options, name),
    shared by every caller (``CLDevice.kernel``)."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, tuple[str, ...], str], cl.Kernel] = {}

    def get(self, build: Callable[[str, Sequence[str]], cl.Program], source: str, name: str,
            options: Sequence[str] = (), arg_types: Sequence[Any] | None = None) -> cl.Kernel:
        """The kernel object of ``name`` in ``build(source, options)``'s program; ``arg_types``
        (numpy dtypes of scalar arguments, None for buffers) makes setting arguments about 100
        times cheaper."""
        key = (source, tuple(options), name)
        k = self._objects.get(key)
        if k is None:
            k = cl.Kernel(build(source, options), name)
            if arg_types is not None:
                k.set_scalar_arg_dtypes(list(arg_types))
            # (threads that made one each at once all get the first one kept)
            k = self._objects.setdefault(key, k)
        return k
