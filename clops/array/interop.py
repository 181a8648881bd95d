"""Array layer, interop: DLPack (copies to the host for numpy), host futures, and pyopencl
arrays in and out without copies."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import numpy as np

from .tensor import Tensor

kDLCPU = 1
kDLOpenCL = 4


def dlpack_device(t: Tensor) -> tuple[int, int]:
    """DLPack device of a tensor: OpenCL, with the index of the device among clops.devices()."""
    from .. import runtime

    devs = runtime.devices()
    idx = next((i for i, d in enumerate(devs) if d is t.device), 0)
    return (kDLOpenCL, idx)


def dlpack(t: Tensor, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
           copy: bool | None = None) -> Any:
    """A DLPack capsule. No DLPack consumer reads OpenCL memory directly, so the data is copied
    to the host (``dl_device=(kDLCPU, 0)``, or a consumer on the CPU such as numpy); asking for
    the OpenCL device without a copy raises BufferError."""
    if copy is False:
        raise BufferError("clops tensors live in OpenCL device memory; DLPack export needs a "
                          "copy to the host (copy=None or True, dl_device=(1, 0))")
    if dl_device is not None and tuple(dl_device) != (kDLCPU, 0):
        raise BufferError(f"DLPack export to device {dl_device} is not supported; use "
                          "dl_device=(1, 0) for a host copy")
    host = t.to_numpy()
    if max_version is None:
        return host.__dlpack__()
    return host.__dlpack__(max_version=max_version)


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
    from .creation import asarray

    if isinstance(x, Tensor):
        return asarray(x, device=device, copy=copy)
    if copy is False:
        raise BufferError("from_dlpack: host memory cannot be used by an OpenCL device "
                          "without a copy (copy=False)")
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack: {type(x).__name__} does not implement __dlpack__")
    try:
        host = np.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError):
        host = np.from_dlpack(x, device="cpu")
    return asarray(np.array(host, copy=True), dtype=host.dtype, device=device)


def is_pyopencl_array(obj: Any) -> bool:
    return hasattr(obj, "base_data") and hasattr(obj, "queue") and hasattr(obj, "strides")



def from_pyopencl(a: Any, device: Any = None) -> Tensor:
    """A tensor over a ``pyopencl.array.Array``'s memory, without a copy (``clops.native``)."""
    from .. import native

    return native.from_pyopencl(a, device)


def to_pyopencl(t: Tensor) -> Any:
    """A ``pyopencl.array.Array`` over this tensor's memory, without a copy
    (``clops.native``)."""
    from .. import native

    return native.to_pyopencl(t)
