"""Runtime, native kernels: a host function that a CPU device's queue runs in order with its
other commands (``clEnqueueNativeKernel``), on the host addresses of the device's buffers.

A ``NativeKernel`` stands where a kernel object stands in a ``Launch``: arguments set by
position (``set_arg``, ``set_args``, buffers as their ``cl_mem``), a ``function_name``, and
``enqueue``, which ``CLDevice.launch`` and ``CLDevice.enqueue_prepared`` call for it. A subclass
says how its arguments fill the C function's argument block (``block``): the runtime copies
that block and puts each buffer's host address where its ``cl_mem`` handle was."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import pyopencl as cl

from . import rawenqueue

EXEC_NATIVE_KERNEL = 2  # CL_EXEC_NATIVE_KERNEL, of CL_DEVICE_EXECUTION_CAPABILITIES


def supported(device: cl.Device) -> bool:
    """Whether ``device`` runs native kernels (CPU runtimes: PoCL, Intel's)."""
    try:
        return bool(device.execution_capabilities & EXEC_NATIVE_KERNEL)
    except cl.Error:
        return False


@functools.cache
def _enqueue_native() -> Any | None:
    """ctypes ``clEnqueueNativeKernel`` of pyopencl's OpenCL loader, or None."""
    vp = ctypes.c_void_p
    return rawenqueue._function("clEnqueueNativeKernel",
                                [vp, vp, vp, ctypes.c_size_t, ctypes.c_uint32, vp, vp,
                                 ctypes.c_uint32, vp, vp])


def available() -> bool:
    return _enqueue_native() is not None


class NativeKernel:
    """A native function with its arguments, launched like a kernel object. ``fn``: the
    address of ``void fn(void *block)``.

    ``chain_fn`` (a subclass's): the address of a function that runs a chain's records (a
    count, then for each record its ``chain_kind``, its size in bytes and its block, all
    64-bit aligned), so that kernels in a row that share it go to the queue as one
    (``chain_items``)."""

    chain_fn: int | None = None
    chain_kind = 0

    def __init__(self, fn: int, name: str, nargs: int) -> None:
        self.fn = fn
        self.function_name = name
        self.args: list[Any] = [None] * nargs
        self.version = 0  # (counts the arguments set)
        # the argument block and its memory objects as clEnqueueNativeKernel takes them, made
        # once for the arguments set (a launch plan's replays set none)
        self._call: tuple[Any, ...] | None = None

    def set_arg(self, index: int, value: Any) -> None:
        self.args[index] = value
        self.version += 1
        self._call = None

    def set_args(self, *values: Any) -> None:
        if len(values) != len(self.args):
            raise ValueError(f"{self.function_name} takes {len(self.args)} arguments, "
                             f"not {len(values)}")
        self.args = list(values)
        self.version += 1
        self._call = None

    def block(self) -> tuple[ctypes.Structure, list[tuple[str | int, Any]]]:
        """The argument block and its memory objects: (field name, or byte offset in the
        block, and the ``cl.MemoryObject`` whose handle that field holds)."""
        raise NotImplementedError

    def enqueue(self, queue: cl.CommandQueue, wait_for: Sequence[cl.Event] = ()) -> cl.Event:
        """Enqueue the function with the arguments set now; returns its event."""
        out = self._enqueue(queue, wait_for, True)
        assert out is not None
        return cl.Event.from_int_ptr(out, retain=False)

    def enqueue_bare(self, queue: cl.CommandQueue) -> None:
        """``enqueue`` with no event (a launch plan's replay)."""
        self._enqueue(queue, (), False)

    def _stale(self) -> bool:
        return self._call is None

    def _enqueue(self, queue: cl.CommandQueue, wait_for: Sequence[cl.Event],
                 event: bool) -> int | None:
        fn = _enqueue_native()
        if fn is None:
            raise RuntimeError("clEnqueueNativeKernel is not reachable through ctypes")
        if self._stale():
            blk, mems = self.block()
            base = ctypes.addressof(blk)
            n = len(mems)
            # (listed in the order of their handles: PoCL 3.1 takes them so, whatever the
            # order given, and gave a buffer listed after one of a higher handle its memory)
            pairs = sorted((m.int_ptr, base + (f if isinstance(f, int) else
                                               getattr(type(blk), f).offset))
                           for f, m in mems)
            handles = (ctypes.c_void_p * n)(*[h for h, _ in pairs])
            locs = (ctypes.c_void_p * n)(*[loc for _, loc in pairs])
            # PERF (Intel's CPU runtime, 2-core EPYC): made at every enqueue, this took about
            # 3 us of the host's time a product (a 1B decode step's enqueues 0.86 -> 0.66 ms),
            # time taken from the cores the products run on
            self._call = (blk, base, ctypes.sizeof(blk), n, handles, locs)
        assert self._call is not None
        blk, base, size, n, handles, locs = self._call
        waits = (ctypes.c_void_p * len(wait_for))(*[e.int_ptr for e in wait_for])
        out = ctypes.c_void_p()
        rc = fn(queue.int_ptr, self.fn, base, size, n, handles, locs,
                len(wait_for), waits if wait_for else None,
                ctypes.byref(out) if event else None)
        if rc:
            raise RuntimeError(f"clEnqueueNativeKernel failed for {self.function_name}: "
                               f"{rawenqueue.error_name(rc)}")
        return out.value if event else None


class Chain(NativeKernel):
    """Native kernels in a row that share a ``chain_fn``, run as one: one command of the
    queue instead of one each (its host time, and the runtime's, once)."""

    def __init__(self, kernels: Sequence[NativeKernel]) -> None:
        fn = kernels[0].chain_fn
        assert fn is not None and all(k.chain_fn == fn for k in kernels)
        super().__init__(fn, "native_chain", 0)
        self.kernels = list(kernels)
        self._versions: list[int] = []

    def _stale(self) -> bool:
        return self._call is None or self._versions != [k.version for k in self.kernels]

    def block(self) -> tuple[ctypes.Structure, list[tuple[str | int, Any]]]:
        self._versions = [k.version for k in self.kernels]
        parts = [k.block() for k in self.kernels]
        fields: list[tuple[str, Any]] = [("count", ctypes.c_int64)]
        for i, (blk, _) in enumerate(parts):
            if ctypes.sizeof(blk) % 8:
                raise ValueError(f"{self.kernels[i].function_name}: a chained block must be "
                                 f"a multiple of 8 bytes, not {ctypes.sizeof(blk)}")
            fields += [(f"kind{i}", ctypes.c_int64), (f"size{i}", ctypes.c_int64),
                       (f"block{i}", type(blk))]
        block_type = type("ChainBlock", (ctypes.Structure,), {"_fields_": fields})
        out = block_type()
        out.count = len(parts)
        mems: list[tuple[str | int, Any]] = []
        for i, (k, (blk, sub)) in enumerate(zip(self.kernels, parts)):
            setattr(out, f"kind{i}", k.chain_kind)
            setattr(out, f"size{i}", ctypes.sizeof(blk))
            setattr(out, f"block{i}", blk)
            at = getattr(block_type, f"block{i}").offset
            mems += [(at + (f if isinstance(f, int) else getattr(type(blk), f).offset), m)
                     for f, m in sub]
        return out, mems


def chain_items(items: Sequence[tuple[Any, ...]]) -> list[int | Chain]:
    """Launch items (kernel first) as ``CLDevice.enqueue_prepared`` replays them: the index of
    each item, except that native kernels in a row sharing a ``chain_fn`` become one
    ``Chain``."""
    out: list[int | Chain] = []
    i = 0
    while i < len(items):
        k = items[i][0]
        j = i + 1
        if isinstance(k, NativeKernel) and k.chain_fn is not None:
            while (j < len(items) and isinstance(items[j][0], NativeKernel)
                   and items[j][0].chain_fn == k.chain_fn):
                j += 1
        if j - i > 1:
            out.append(Chain([it[0] for it in items[i:j]]))
        else:
            out.append(i)
        i = j
    return out
