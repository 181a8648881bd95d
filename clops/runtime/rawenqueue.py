"""Runtime, event-free enqueues: ``clEnqueueNDRangeKernel`` called through ctypes with no event
requested, for replaying launch plans whose arguments are already set.

pyopencl creates (and later releases) an event for every enqueue. On NVIDIA's driver that
event is about half of an enqueue's host cost (measured on an H100: 13-20 us an enqueue through
pyopencl, 6-13 us with no event), and a decode step of a small model is bounded by that cost.
A plan that owns its buffers on one in-order queue needs no per-launch events, so its replay
goes through here where the driver gains from it. The library called is the OpenCL loader that
pyopencl itself loaded, so that handles stay with one loader.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Sequence
from typing import Any

import pyopencl as cl


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


_Raw = tuple[int, int, Any, Any, Any]  # kernel handle, dims, global, local, the kernel object


def prepare(launches: Sequence[tuple[cl.Kernel, Sequence[int], Sequence[int] | None, str]]
            ) -> list[_Raw]:
    """ctypes-ready launches; each keeps its kernel object alive."""
    out: list[_Raw] = []
    for kernel, g, lsize, _ in launches:
        dims = len(g)
        gs = (ctypes.c_size_t * dims)(*g)
        ls = (ctypes.c_size_t * dims)(*lsize) if lsize is not None else None
        out.append((kernel.int_ptr, dims, gs, ls, kernel))
    return out


def resized(item: _Raw, global_size: Sequence[int]) -> _Raw:
    """A prepared launch with another global size."""
    handle, dims, _, ls, kernel = item
    return handle, dims, (ctypes.c_size_t * dims)(*global_size), ls, kernel


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


def enqueue(queue: cl.CommandQueue, raw: Sequence[_Raw]) -> None:
    """Enqueue ``raw`` launches in order on ``queue`` with no events."""
    fn = _enqueue_function()
    if fn is None:  # prepare() was called only where available() holds
        raise RuntimeError("clEnqueueNDRangeKernel is not reachable through ctypes")
    q = queue.int_ptr
    for i, (k, dims, gs, ls, kernel) in enumerate(raw):
        rc = fn(q, k, dims, None, gs, ls, 0, None, None)
        if rc:
            raise RuntimeError(
                f"clEnqueueNDRangeKernel failed for {kernel.function_name} (launch {i} of the "
                f"plan): {error_name(rc)}; the launches before it were enqueued")
