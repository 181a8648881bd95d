"""Hopper's tensor memory accelerator (TMA) for OpenCL kernels.

A TMA copy (``cp.async.bulk.tensor``) reads a tile of a matrix through a *tensor map*: 128
opaque bytes holding the matrix's address, sizes, strides, the tile's box and the layout it
lands in. OpenCL has no call that makes one; the CUDA driver (``libcuda``, installed with
NVIDIA's OpenCL driver) has ``cuTensorMapEncodeTiled``, which needs a current CUDA context: the
GPU's primary context, retained once per process. The matrix's address is the device address
of the OpenCL buffer, read once per buffer by a one-work-item kernel on a queue of its own and
kept by the buffer pool while it holds the memory. Maps are written to small device buffers,
kept per distinct map pair.

Everything here answers None where it cannot (no libcuda, no matching CUDA device, a refused
encoding); callers then use their cp.async path. Products take this path unless
``CLOPS_TMA=0`` (kernels/gemm.py, use_tma): the CUDA context holds 524 MiB of an H100's memory
(none more where the process has one already, PyTorch's for one).
It lives in the runtime, beside the other driver calls.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from typing import Any

import numpy as np
import pyopencl as cl

from . import probes
from .capture import capturing
from .device import CLDevice
from .pool import Buffer
from .program import new_kernel

# CUtensorMapDataType FLOAT16, CUtensorMapSwizzle 128B, CUtensorMapL2promotion 256B
_FLOAT16, _SWIZZLE_128B, _L2_256B = 6, 3, 3
# CUdevice_attribute: PCI bus, device and domain
_PCI_BUS, _PCI_DEVICE, _PCI_DOMAIN = 33, 34, 50
_LOCK = threading.Lock()
_ADDR_SRC = "__kernel void address_of(__global const uchar *p, __global ulong *o) " \
            "{ o[0] = (ulong)p; }"


class _Cuda:
    """libcuda and the primary context of the CUDA device that is this OpenCL device."""

    def __init__(self, lib: Any, ctx: ctypes.c_void_p) -> None:
        self.lib, self.ctx = lib, ctx
        # maps already encoded, by their arguments: a product repeated on the same buffers
        # (a loop, a model's layers) asks the driver once
        self.known: collections.OrderedDict[tuple[Any, ...], bytes | None] = \
            collections.OrderedDict()

    def encode(self, address: int, dims: tuple[int, ...], strides: tuple[int, ...],
               box: tuple[int, ...]) -> bytes | None:
        key = (address, dims, strides, box)
        with _LOCK:
            if key in self.known:
                self.known.move_to_end(key)
                return self.known[key]
        got = self._encode(address, dims, strides, box)
        with _LOCK:
            self.known[key] = got
            while len(self.known) > 512:
                self.known.popitem(last=False)
        return got

    def memory(self) -> tuple[int, int] | None:
        """The GPU's free and total bytes as the CUDA driver counts them (every process's
        allocations), or None where it does not say."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        with _LOCK:
            if self.lib.cuCtxPushCurrent_v2(self.ctx) != 0:
                return None
            try:
                ok = self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
            finally:
                self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        return (int(free.value), int(total.value)) if ok else None

    def _encode(self, address: int, dims: tuple[int, ...], strides: tuple[int, ...],
                box: tuple[int, ...]) -> bytes | None:
        u64, u32 = ctypes.c_uint64, ctypes.c_uint32
        rank = len(dims)
        out = (u64 * 16)()
        with _LOCK:
            if self.lib.cuCtxPushCurrent_v2(self.ctx) != 0:
                return None
            try:
                err = self.lib.cuTensorMapEncodeTiled(
                    ctypes.byref(out), _FLOAT16, u32(rank), ctypes.c_void_p(address),
                    (u64 * rank)(*dims), (u64 * (rank - 1))(*strides), (u32 * rank)(*box),
                    (u32 * rank)(*([1] * rank)), 0, _SWIZZLE_128B, _L2_256B, 0)
            finally:
                self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        return bytes(out) if err == 0 else None


def _pci(dev: CLDevice) -> tuple[int, int, int] | None:
    """The OpenCL device's PCI domain, bus and slot (NVIDIA's attribute query)."""
    info = cl.device_info
    try:
        d = dev.cl_device
        got: list[Any] = [d.get_info(q) for q in (info.PCI_DOMAIN_ID_NV, info.PCI_BUS_ID_NV,
                                                  info.PCI_SLOT_ID_NV)]
        return int(got[0]), int(got[1]), int(got[2])
    except (cl.Error, AttributeError, ValueError):
        return None


@probes.per_device
def cuda(dev: CLDevice) -> _Cuda | None:
    """The CUDA driver bound to ``dev``'s GPU (its primary context retained), or None (not
    NVIDIA, no libcuda, no CUDA device on the same PCI bus)."""
    if dev.backend != "nvidia":
        return None
    pci = _pci(dev)
    if pci is None:
        return None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        if lib.cuInit(0) != 0:
            return None
        count = ctypes.c_int()
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return None
        found = []
        for i in range(count.value):
            handle = ctypes.c_int()
            if lib.cuDeviceGet(ctypes.byref(handle), i) != 0:
                continue
            attrs = []
            for attr in (_PCI_DOMAIN, _PCI_BUS, _PCI_DEVICE):
                v = ctypes.c_int()
                lib.cuDeviceGetAttribute(ctypes.byref(v), attr, handle)
                attrs.append(v.value)
            # NVIDIA's slot id: the PCI device number, or it and the function (device << 3)
            if attrs[:2] == list(pci[:2]) and pci[2] in (attrs[2], attrs[2] << 3):
                found.append(handle)
        if len(found) != 1:
            return None
        ctx = ctypes.c_void_p()
        if lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), found[0]) != 0:
            return None
        return _Cuda(lib, ctx)
    except (OSError, AttributeError):
        return None


class _Addresses:
    """Device addresses of OpenCL buffers: a one-work-item kernel on a queue of its own (so
    that it does not wait behind the device's queued work; it reads no memory, only the
    address), one per buffer."""

    def __init__(self, dev: CLDevice) -> None:
        self.dev = dev
        self.queue = dev.create_queue()
        self.kernel = new_kernel(dev.build(_ADDR_SRC), "address_of", "tma.py")
        self.out = dev.alloc(8)

    def __call__(self, buf: Buffer) -> int:
        got = np.zeros(1, np.uint64)
        with _LOCK:
            self.dev.launch(self.kernel, (1,), (1,), [buf, self.out], writes=[self.out],
                            queue=self.queue, name="address_of")
            self.dev.read(got, self.out, queue=self.queue)
        return int(got[0])


@probes.per_device
def _addresses(dev: CLDevice) -> _Addresses:
    return _Addresses(dev)


def address(dev: CLDevice, buf: Buffer) -> int:
    """The device address of ``buf``'s memory (kept by the pool while it holds the memory)."""
    pool = buf.pool
    key = buf.mem.int_ptr
    if pool is not None:
        known = pool.addresses.get(key)
        if known is not None:
            return known
    addr = _addresses(dev)(buf)
    if pool is not None:
        pool.addresses[key] = addr
    return addr


class _Maps:
    """Device buffers of tensor maps, one per distinct set, the last 256 sets kept."""

    def __init__(self) -> None:
        self.known: collections.OrderedDict[bytes, Buffer] = collections.OrderedDict()

    def get(self, dev: CLDevice, maps: bytes) -> Buffer:
        with _LOCK:
            buf = self.known.get(maps)
            if buf is not None:
                self.known.move_to_end(maps)
                return buf
        buf = dev.alloc(len(maps))
        dev.write(buf, np.frombuffer(maps, np.uint8), blocking=True)
        with _LOCK:
            self.known[maps] = buf
            while len(self.known) > 256:
                self.known.popitem(last=False)
        return buf


@probes.per_device
def _maps(dev: CLDevice) -> _Maps:
    return _Maps()


def describable(offset: int, rows: int, ld: int, batch: int, bstride: int) -> bool:
    """Whether a tensor map can describe ``batch`` float16 matrices from element ``offset``,
    ``ld`` elements a row and ``bstride`` a matrix: addresses and strides in multiples of 16
    bytes, no matrix shared by the batch (stride 0)."""
    if batch == 1:
        bstride = rows * ld
    return not ((offset * 2) % 16 or (ld * 2) % 16 or (bstride * 2) % 16 or bstride <= 0)


def matrix_map(dev: CLDevice, buf: Buffer, offset: int, rows: int, cols: int, ld: int,
               batch: int, bstride: int, box: tuple[int, int]) -> bytes | None:
    """The tensor map of ``batch`` float16 matrices of ``rows`` x ``cols`` (row-major, ``ld``
    elements a row, ``bstride`` a matrix) from element ``offset`` of ``buf``, read in boxes of
    ``box`` (columns, rows) with the 128-byte swizzle; None where the CUDA driver is not there
    or refuses (addresses and strides must be multiples of 16 bytes)."""
    cu = cuda(dev)
    if cu is None or capturing():  # a plan being recorded reads nothing back
        return None
    if not describable(offset, rows, ld, batch, bstride):
        return None
    if batch == 1:
        bstride = rows * ld
    return cu.encode(address(dev, buf) + offset * 2, (cols, rows, batch),
                     (ld * 2, bstride * 2), (box[0], box[1], 1))


def maps_buffer(dev: CLDevice, *maps: bytes) -> Buffer:
    """A device buffer holding ``maps`` one after another (kept and reused for the same)."""
    return _maps(dev).get(dev, b"".join(maps))
