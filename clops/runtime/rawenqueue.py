"""Runtime, event-free enqueues: ``clEnqueueNDRangeKernel`` called through ctypes with no event
requested, for replaying launch plans whose arguments are already set.

pyopencl creates (and later releases) an event for every enqueue. On NVIDIA's driver that
event is about half of an enqueue's host cost (measured on an H100: 13-20 us an enqueue through
pyopencl, 6-13 us with no event), and a decode step of a small model is bounded by that cost.
A plan that owns its buffers on one in-order queue needs no per-launch events, so its replay
goes through here where the driver gains from it. The library called is the OpenCL loader that
pyopencl itself loaded, so that handles stay with one loader. A plan's launches go to it from
one call into ``replay.c`` (built once with the system's C compiler, ``cbuild``), else from a
ctypes call a launch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Sequence
from importlib import resources
from typing import Any

import pyopencl as cl

from .. import _config
from . import cbuild


def loaded_opencl_library() -> str | None:
    """Path of the libOpenCL that this process has mapped (pyopencl's), on Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                if "libOpenCL" in path and path.startswith("/"):
                    return path
    except OSError:
        return None
    return None


@functools.cache
def loader() -> Any | None:
    """The OpenCL loader pyopencl uses, through ctypes (None where it is not found)."""
    import pyopencl._cl  # noqa: F401 - maps the loader into the process

    path = loaded_opencl_library() or ctypes.util.find_library("OpenCL")
    if path is None:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def _function(name: str, argtypes: list[Any]) -> Any | None:
    """ctypes ``name`` of pyopencl's loader (returning a status code), or None where it is not
    found."""
    lib = loader()
    fn = getattr(lib, name, None) if lib is not None else None
    if fn is None:
        return None
    fn.restype = ctypes.c_int32
    fn.argtypes = argtypes
    return fn


@functools.cache
def _enqueue_function() -> Any | None:
    """ctypes ``clEnqueueNDRangeKernel`` of pyopencl's loader, or None where it is not found."""
    return _function("clEnqueueNDRangeKernel",
                     [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                      ctypes.c_void_p])


def available() -> bool:
    return _enqueue_function() is not None


class RawLaunches:
    """Launches ready for the event-free enqueue: their kernels' handles, dimensions, global
    and local sizes in ctypes arrays (as ``replay.c`` reads them: 3 sizes a launch, a local
    size of 0 for none), and the kernel objects, kept alive with them."""

    def __init__(self, launches: Sequence[tuple[cl.Kernel, Sequence[int], Sequence[int] | None,
                                                str]]) -> None:
        n = len(launches)
        self.kernels = [k for k, _, _, _ in launches]
        self.handles = (ctypes.c_void_p * max(n, 1))(*[k.int_ptr for k in self.kernels])
        self.dims = (ctypes.c_uint32 * max(n, 1))(*[len(g) for _, g, _, _ in launches])
        self.gs = (ctypes.c_size_t * max(3 * n, 1))()
        self.ls = (ctypes.c_size_t * max(3 * n, 1))()
        for i, (_, g, lsize, _) in enumerate(launches):
            self.resize(i, g)
            for d, v in enumerate(lsize or ()):
                self.ls[3 * i + d] = v
        size = ctypes.sizeof(ctypes.c_size_t)
        base_g, base_l = ctypes.addressof(self.gs), ctypes.addressof(self.ls)
        # (each launch's arguments for a call from Python, where replay.c is not built)
        self.calls = [(k.int_ptr, len(g), base_g + 3 * i * size,
                       base_l + 3 * i * size if lsize is not None else None)
                      for i, (k, g, lsize, _) in enumerate(launches)]

    def __len__(self) -> int:
        return len(self.kernels)

    def resize(self, index: int, global_size: Sequence[int]) -> None:
        """Launch ``index`` with another global size (of as many dimensions) from now on."""
        if len(global_size) != self.dims[index]:
            raise ValueError(f"launch {index} has {self.dims[index]} dimensions, not "
                             f"{len(global_size)}")
        for d, v in enumerate(global_size):
            self.gs[3 * index + d] = v


def prepare(launches: Sequence[tuple[cl.Kernel, Sequence[int], Sequence[int] | None, str]]
            ) -> RawLaunches:
    """ctypes-ready launches; they keep their kernel objects alive."""
    return RawLaunches(launches)


@functools.cache
def _replay_library() -> Any | None:
    """``replay.c`` built (``cbuild``) and loaded, or None: no compiler, or
    ``CLOPS_NATIVE_REPLAY=0``."""
    if not _config.native_replay():
        return None
    try:
        src = resources.files(__package__).joinpath("replay.c").read_text()
    except OSError:  # (an installation without the source)
        return None
    lib = cbuild.build("replay", src, ["-O2", "-fPIC", "-shared", "-std=gnu11"],
                       debug=bool(_config.debug_level()))
    if lib is None or lib.clops_replay_version() != 1:
        return None
    lib.clops_replay.restype = ctypes.c_int32
    lib.clops_replay.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
    return lib


@functools.cache
def _set_arg_function() -> Any | None:
    """ctypes ``clSetKernelArg`` of pyopencl's loader, or None where it is not found."""
    return _function("clSetKernelArg",
                     [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p])


def set_scalar_arg(kernel: cl.Kernel, index: int, value: Any) -> None:
    """``clSetKernelArg`` of a numpy scalar through ctypes (pyopencl's ``set_arg`` costs
    several microseconds more a call; a resized plan sets one for each of its launches)."""
    fn = _set_arg_function()
    if fn is None:
        kernel.set_arg(index, value)
        return
    data = value.tobytes()
    rc = fn(kernel.int_ptr, index, len(data), data)
    if rc:
        raise RuntimeError(f"clSetKernelArg failed for argument {index} of "
                           f"{kernel.function_name}: {error_name(rc)}")


_ERRORS = {getattr(cl.status_code, n): n for n in dir(cl.status_code) if n.isupper()}
# cl_khr_command_buffer's codes, which pyopencl does not name
_ERRORS.update({-1138: "INVALID_COMMAND_BUFFER_KHR", -1139: "INVALID_SYNC_POINT_WAIT_LIST_KHR",
                -1140: "INCOMPATIBLE_COMMAND_QUEUE_KHR"})


def error_name(rc: int) -> str:
    """The name of an OpenCL status code (the number itself where it has none)."""
    return str(_ERRORS.get(rc, rc))


def enqueue(queue: cl.CommandQueue, raw: RawLaunches) -> None:
    """Enqueue ``raw`` launches in order on ``queue`` with no events: from one call into
    ``replay.c`` where it is built, else one ctypes call a launch.

    PERF: a ctypes call and its loop cost about 2 us a launch in Python (a 2-core EPYC), a
    fifth of what NVIDIA's driver takes for an enqueue; a decode step of a mixture of experts
    is bound by its ~300 enqueues."""
    fn = _enqueue_function()
    if fn is None:  # prepare() was called only where available() holds
        raise RuntimeError("clEnqueueNDRangeKernel is not reachable through ctypes")
    q = queue.int_ptr
    lib = _replay_library()
    if lib is not None:
        failed = ctypes.c_int32(-1)
        rc = lib.clops_replay(ctypes.cast(fn, ctypes.c_void_p), q, len(raw), raw.handles,
                              raw.dims, raw.gs, raw.ls, ctypes.byref(failed))
        if rc:
            _failed(raw, failed.value, rc)
        return
    for i, (k, dims, gs, ls) in enumerate(raw.calls):
        rc = fn(q, k, dims, None, gs, ls, 0, None, None)
        if rc:
            _failed(raw, i, rc)


def _failed(raw: RawLaunches, i: int, rc: int) -> None:
    raise RuntimeError(
        f"clEnqueueNDRangeKernel failed for {raw.kernels[i].function_name} (launch {i} of the "
        f"plan): {error_name(rc)}; the launches before it were enqueued")
