"""Runtime, command buffers: a launch plan recorded once with ``cl_khr_command_buffer`` and
replayed with one enqueue.

A decode step is a fixed list of launches whose arguments never change (positions and sizes
live in device buffers), so where the driver offers command buffers the whole step is recorded
once and each token costs one ``clEnqueueCommandBufferKHR`` instead of one enqueue per kernel.
The extension's entry points are reached through ``clGetExtensionFunctionAddressForPlatform``
of the OpenCL loader that pyopencl loaded, and called with pyopencl's handles.

Every step of this is optional: a device without the extension, a driver that refuses a
recording, or ``CLOPS_COMMAND_BUFFERS=0`` leaves the plan on per-kernel enqueues.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Sequence
from typing import Any

import pyopencl as cl

from .. import _config
from . import rawenqueue
from .rawenqueue import error_name

EXTENSION = "cl_khr_command_buffer"

_DEVICE_CAPABILITIES = 0x12A9
_DEVICE_REQUIRED_QUEUE_PROPERTIES = 0x12AA
_CAPABILITY_SIMULTANEOUS_USE = 1 << 2
_FLAGS = 0x1293
_FLAG_SIMULTANEOUS_USE = 1 << 0
_STATE = 0x1297
_STATE_PENDING = 2

_vp, _u32, _i32, _size = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32, ctypes.c_size_t
_SIGNATURES: dict[str, tuple[Any, ...]] = {
    # (restype, argtypes...) as in the extension's header
    "clCreateCommandBufferKHR": (_vp, _u32, _vp, _vp, ctypes.POINTER(_i32)),
    "clCommandNDRangeKernelKHR": (_i32, _vp, _vp, _vp, _vp, _u32, _vp, _vp, _vp, _u32, _vp, _vp,
                                  _vp),
    "clFinalizeCommandBufferKHR": (_i32, _vp),
    "clEnqueueCommandBufferKHR": (_i32, _u32, _vp, _vp, _u32, _vp, _vp),
    "clReleaseCommandBufferKHR": (_i32, _vp),
    "clGetCommandBufferInfoKHR": (_i32, _vp, _u32, _size, _vp, _vp),
}


class _Api:
    """The extension's functions for one platform."""

    def __init__(self, fns: dict[str, Any]) -> None:
        self.create = fns["clCreateCommandBufferKHR"]
        self.ndrange = fns["clCommandNDRangeKernelKHR"]
        self.finalize = fns["clFinalizeCommandBufferKHR"]
        self.enqueue = fns["clEnqueueCommandBufferKHR"]
        self.release = fns["clReleaseCommandBufferKHR"]
        self.info = fns["clGetCommandBufferInfoKHR"]


@functools.cache
def _api(platform_ptr: int) -> _Api | None:
    lib = rawenqueue.loader()
    lookup = getattr(lib, "clGetExtensionFunctionAddressForPlatform", None) if lib else None
    if lookup is None:
        return None
    lookup.restype = _vp
    lookup.argtypes = [_vp, ctypes.c_char_p]
    fns = {}
    for name, (res, *args) in _SIGNATURES.items():
        addr = lookup(platform_ptr, name.encode())
        if not addr:
            return None
        fns[name] = ctypes.CFUNCTYPE(res, *args)(addr)
    return _Api(fns)


def _device_ulong(device: cl.Device, param: int) -> int | None:
    lib = rawenqueue.loader()
    if lib is None:
        return None
    fn = lib.clGetDeviceInfo
    fn.restype = _i32
    fn.argtypes = [_vp, _u32, _size, _vp, _vp]
    out = ctypes.c_uint64(0)
    if fn(device.int_ptr, param, 8, ctypes.byref(out), None):
        return None
    return out.value


@functools.cache
def _support(device_ptr: int, platform_ptr: int, extensions: str, queue_props: int
             ) -> tuple[bool, bool, str]:
    """(usable, simultaneous use, why not) for a device and the properties of its queues."""
    if EXTENSION not in extensions.split():
        return False, False, f"the device has no {EXTENSION}"
    if _api(platform_ptr) is None:
        return False, False, f"the OpenCL loader gives no {EXTENSION} entry points"
    dev = cl.Device.from_int_ptr(device_ptr)
    caps = _device_ulong(dev, _DEVICE_CAPABILITIES)
    required = _device_ulong(dev, _DEVICE_REQUIRED_QUEUE_PROPERTIES)
    if caps is None or required is None:
        return False, False, "the device does not answer the command-buffer queries"
    if required & ~queue_props:
        return False, False, (f"command buffers need queue properties {required:#x}; "
                              f"the queues have {queue_props:#x}")
    return True, bool(caps & _CAPABILITY_SIMULTANEOUS_USE), ""


def support(queue: cl.CommandQueue) -> tuple[bool, str]:
    """Whether launch plans on ``queue`` can be recorded into command buffers, and if not, why.
    ``CLOPS_COMMAND_BUFFERS``: unset, GPUs and other accelerators only (on CPUs the host's
    enqueues bound nothing, and PoCL's recordings cost it more host time than its plain
    enqueues); ``1`` CPUs too; ``0`` none."""
    mode = _config.command_buffers()
    if mode == "off":
        return False, "CLOPS_COMMAND_BUFFERS=0"
    if mode == "auto" and queue.device.type & cl.device_type.CPU:
        return False, "kernel-by-kernel enqueues on CPUs (CLOPS_COMMAND_BUFFERS=1 records them)"
    ok, _, why = _queue_support(queue)
    return ok, why


def _queue_support(queue: cl.CommandQueue) -> tuple[bool, bool, str]:
    """``_support`` for ``queue``'s device and properties."""
    dev = queue.device
    return _support(dev.int_ptr, dev.platform.int_ptr, dev.extensions, int(queue.properties))


def _geometry_problem(kernel: cl.Kernel, device: cl.Device, g: Sequence[int],
                      lsz: Sequence[int] | None) -> str:
    """What is wrong with a launch's sizes ('' if nothing), as clEnqueueNDRangeKernel checks."""
    if not 1 <= len(g) <= 3 or (lsz is not None and len(lsz) != len(g)):
        return f"global size {tuple(g)} and local size {lsz} do not match in dimensions"
    if any(x <= 0 for x in g):
        return f"global size {tuple(g)} has an empty dimension"
    if lsz is None:
        return ""
    limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, device)
    total = 1
    for x, most in zip(lsz, device.max_work_item_sizes):
        if not 0 < x <= most:
            return f"local size {tuple(lsz)} exceeds the device's {device.max_work_item_sizes}"
        total *= x
    if total > limit:
        return f"a work-group of {total} exceeds the kernel's limit of {limit}"
    return ""


def _release(api: _Api, handles: list[int]) -> None:
    for h in handles:
        api.release(h)
    handles.clear()


class CommandBuffer:
    """Launches (kernels with their arguments set, global and local sizes) recorded on one
    in-order queue. ``enqueue()`` runs them all, in order, after whatever the queue holds.

    Arguments are captured when recorded: a launch whose arguments change needs a new
    recording. Where the driver does not let a pending recording be enqueued again, a few
    copies are recorded and taken in turn.
    """

    _COPIES = 3

    def __init__(self, queue: cl.CommandQueue,
                 launches: Sequence[tuple[cl.Kernel, Sequence[int], Sequence[int] | None]]
                 ) -> None:
        dev = queue.device
        ok, simultaneous, why = _queue_support(queue)
        if not ok:
            raise RuntimeError(f"no command buffers here: {why}")
        api = _api(dev.platform.int_ptr)
        assert api is not None
        for i, (k, g, lsz) in enumerate(launches):
            why = _geometry_problem(k, dev, g, lsz)
            if why:  # some drivers crash on a bad geometry in a recording: refuse it here
                raise RuntimeError(f"cannot record {k.function_name} (launch {i}): {why}")
        self.queue = queue
        self._api = api
        # the kernels (their arguments were captured) and the sizes stay with the recording
        self._keep = [(k, (_size * len(g))(*g),
                       (_size * len(lsz))(*lsz) if lsz is not None else None)
                      for k, g, lsz in launches]
        self._handles: list[int] = []
        self._finalizer = weakref.finalize(self, _release, api, self._handles)
        self._simultaneous = simultaneous
        self._next = 0
        try:
            self._handles.append(self._record(simultaneous))
        except RuntimeError:
            if not simultaneous:
                raise
            # a driver that lists simultaneous use but refuses the flag: record copies
            self._simultaneous = False
            self._handles.append(self._record(False))

    def _record(self, simultaneous: bool) -> int:
        api = self._api
        err = _i32(0)
        queues = (_vp * 1)(self.queue.int_ptr)
        props = (ctypes.c_uint64 * 3)(_FLAGS, _FLAG_SIMULTANEOUS_USE, 0) if simultaneous \
            else None
        h = api.create(1, queues, props, ctypes.byref(err))
        if err.value or not h:
            raise RuntimeError(f"clCreateCommandBufferKHR failed: {error_name(err.value)}")
        # each command waits for the one before it: the plan's order, whatever the queue
        prev, point = _u32(0), _u32(0)
        for i, (k, gs, ls) in enumerate(self._keep):
            rc = api.ndrange(h, None, None, k.int_ptr, len(gs), None, gs, ls,
                             1 if i else 0, ctypes.byref(prev) if i else None,
                             ctypes.byref(point), None)
            if rc:
                api.release(h)
                raise RuntimeError(f"clCommandNDRangeKernelKHR failed for {k.function_name} "
                                   f"(launch {i}): {error_name(rc)}")
            prev.value = point.value
        rc = api.finalize(h)
        if rc:
            api.release(h)
            raise RuntimeError(f"clFinalizeCommandBufferKHR failed: {error_name(rc)}")
        return int(h)

    def _pending(self, h: int) -> bool:
        state = _u32(0)
        if self._api.info(h, _STATE, 4, ctypes.byref(state), None):
            return False  # drivers that allow enqueues while pending dropped the state
        return state.value == _STATE_PENDING

    def enqueue(self) -> None:
        """Enqueue every recorded launch on the queue, with no event."""
        if self._simultaneous:
            h = self._handles[0]
        else:
            h = self._free_copy()
        rc = self._api.enqueue(0, None, h, 0, None, None)
        if rc:
            raise RuntimeError(f"clEnqueueCommandBufferKHR failed: {error_name(rc)}; nothing of "
                               "this step was enqueued")

    def _free_copy(self) -> int:
        n = len(self._handles)
        for j in range(n):
            h = self._handles[(self._next + j) % n]
            if not self._pending(h):
                self._next = (self._next + j + 1) % n
                return h
        if n < self._COPIES:
            self._handles.append(self._record(False))
            self._next = 0
            return self._handles[-1]
        self.queue.finish()  # every copy is still queued: wait for the oldest
        return self._free_copy()

    @property
    def copies(self) -> int:
        return len(self._handles)

    def release(self) -> None:
        self._finalizer()
