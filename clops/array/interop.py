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
