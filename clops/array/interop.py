"""Array layer, interop: DLPack and numpy views (the memory itself where the host addresses
it, else copies), host futures, and pyopencl arrays in and out without copies."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import numpy as np

from .. import native, runtime
from ..runtime import plan
from ._ops import OPS, register
from .tensor import Tensor

kDLCPU = 1
kDLOpenCL = 4


class _Holder:
    """Keeps a buffer (and so its memory, out of the pool) alive under numpy views of it."""

    def __init__(self, view: np.ndarray, buf: Any) -> None:
        self.buf = buf
        self.__array_interface__ = view.__array_interface__


@register
def host_array(t: Tensor) -> np.ndarray:
    """``t``'s own memory as a numpy array, no copy, once the device is done with it (the
    array keeps the memory alive). BufferError where the host cannot address the memory."""
    plan.refuse("a host view of a tensor")
    d = t.dtype
    if d.name == "bfloat16":
        raise BufferError("bfloat16 has no numpy dtype: a host view needs a copy (astype)")
    n = t._load
    buf, v = n.arg
    base = np.asarray(_Holder(buf.host_view(), buf))
    isz = d.itemsize
    return np.ndarray(t.shape, np.bool_ if d.kind == "b" else d.np, buffer=base,
                      offset=v.offset * isz, strides=tuple(st * isz for st in v.strides))


@register
def buffer_array(buf: Any, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """The C-contiguous values of ``dtype`` and ``shape`` at the start of ``buf`` as a numpy
    array over its memory, once the device is done with it (the array keeps the buffer alive,
    out of the pool)."""
    base = np.asarray(_Holder(buf.host_view(), buf))
    return np.ndarray(shape, dtype.np, buffer=base)


@register
def zero_copy(t: Tensor) -> bool:
    """Whether ``t`` is in host or shared memory the host addresses in place (numpy and DLPack
    consumers then read it without a copy)."""
    buf = t.buffer
    return buf.kind != "device" and buf.host_addressable and t.dtype.name != "bfloat16"


@register
def dlpack_device(t: Tensor) -> tuple[int, int]:
    """DLPack device of a tensor: the CPU for host or shared memory the host addresses in
    place, else OpenCL, with the index of the device among clops.devices()."""
    if zero_copy(t):
        return (kDLCPU, 0)
    devs = runtime.devices()
    idx = next((i for i, d in enumerate(devs) if d is t.device), 0)
    return (kDLOpenCL, idx)


@register
def dlpack(t: Tensor, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
           copy: bool | None = None) -> Any:
    """A DLPack capsule for a consumer on the CPU (numpy, torch): the tensor's own memory where
    the host addresses it (host and shared memory, and with ``copy=False`` any memory of a
    device that shares the host's, such as PoCL's), else a copy (``copy=False`` then raises
    BufferError saying what would make it zero-copy)."""
    if dl_device is not None and tuple(dl_device) != (kDLCPU, 0):
        raise BufferError(f"DLPack export to device {dl_device} is not supported; use "
                          "dl_device=(1, 0) for the host")
    if copy is not True and (zero_copy(t) or (copy is False and t.buffer.host_addressable)):
        host = host_array(t)
    elif copy is False:
        why = ("bfloat16 has no DLPack type numpy reads" if t.dtype.name == "bfloat16" else
               "its memory is not addressable by the host (" + t.device.name + " has memory "
               "of its own)")
        raise BufferError(f"DLPack export without a copy is not possible: {why}; use "
                          "copy=None or True, or make the tensor with usm_type='host' or "
                          "'shared' on a device that shares the host's memory")
    else:
        host = t.to_numpy()
    if max_version is None:
        return host.__dlpack__()
    return host.__dlpack__(max_version=max_version)


@register
def to_host_future(t: Tensor) -> concurrent.futures.Future[np.ndarray]:
    """Start a non-blocking device-to-host copy; the future resolves to the numpy array."""
    src = t.contiguous()
    buf, v = src._load.arg
    d = t.dtype
    host = np.empty(t.shape, dtype=d.np)
    if host.size == 0:
        fut: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        fut.set_result(host if d.kind != "b" else host.astype(bool))
        return fut
    ev = t.device.read(host, buf, v.offset * d.itemsize, blocking=False)

    def value() -> np.ndarray:
        if d.name == "bfloat16":
            return (host.astype(np.uint32) << 16).view(np.float32)
        return host.astype(bool) if d.kind == "b" else host

    return ev.future(value)


def from_dlpack(x: Any, /, *, device: Any = None, copy: bool | None = None) -> Tensor:
    """A tensor from any DLPack producer (numpy, PyTorch, ...): the host data is copied to the
    device (``copy=False`` cannot be honoured and raises BufferError).

    >>> clops.from_dlpack(np.arange(3.0, dtype=np.float32))
    Tensor([0., 1., 2.], dtype=float32, device=opencl:cpu:0)
    """
    if isinstance(x, Tensor):
        return OPS.asarray(x, device=device, copy=copy)
    if copy is False:
        raise BufferError("from_dlpack: host memory cannot be used by an OpenCL device "
                          "without a copy (copy=False)")
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack: {type(x).__name__} does not implement __dlpack__")
    try:
        host = np.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError):
        host = np.from_dlpack(x, device="cpu")
    return OPS.asarray(np.array(host, copy=True), dtype=host.dtype, device=device)


def is_pyopencl_array(obj: Any) -> bool:
    return hasattr(obj, "base_data") and hasattr(obj, "queue") and hasattr(obj, "strides")



def from_pyopencl(a: Any, device: Any = None) -> Tensor:
    """A tensor over a ``pyopencl.array.Array``'s memory, without a copy (``clops.native``)."""
    return native.from_pyopencl(a, device)


@register
def to_pyopencl(t: Tensor) -> Any:
    """A ``pyopencl.array.Array`` over this tensor's memory, without a copy
    (``clops.native``)."""
    return native.to_pyopencl(t)
