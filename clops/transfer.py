"""Array layer, transfers: host<->device copies that do not block the host and go through
pinned staging memory, so that they overlap with kernels running on another queue.

``from_host_async`` returns a tensor at once (its value is ready when the copy is);
``to_host_future`` returns a ``concurrent.futures.Future`` of the numpy value, which asyncio
code can ``await`` through ``asyncio.wrap_future``."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import runtime
from .array.creation import to_host_bits
from .array.tensor import Tensor
from .graph import dtypes as _dt
from .graph import ir
from .graph.ir import View
from .runtime import staging


def _host_value(raw: np.ndarray, d: _dt.DType) -> np.ndarray:
    if d.name == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if d.kind == "b":
        return raw.astype(bool)
    return raw


def from_host_async(host: Any, *, dtype: Any = None, device: Any = None,
                    queue: runtime.CLQueue | None = None, wait_for: Sequence[Any] = (),
                    pinned: bool = True) -> Tensor:
    """A tensor whose value is being copied from ``host`` in the background (through pinned
    memory unless ``pinned=False``). ``host`` may be changed as soon as this returns.

    >>> x = clops.from_host_async(np.arange(1 << 20, dtype=np.float32))
    >>> y = (x * 2).realize()          # waits on the copy on the device, not on the host
    """
    dev = runtime.device(device) if queue is None else queue.device
    if device is not None and queue is not None and runtime.device(device) is not dev:
        raise ValueError(f"from_host_async: queue is on {dev}, device is {device}")
    arr = np.asarray(host)
    d = _dt.to_dtype(dtype) if dtype is not None else _dt.to_dtype(arr.dtype)
    bits = to_host_bits(arr, d)
    buf = dev.alloc(bits.nbytes)
    if bits.nbytes:
        if pinned:
            staging.upload(dev, buf, bits, queue=queue, wait_for=wait_for)
        else:
            # NOTE: the tracked path keeps its own reference to ``bits`` until the copy is done.
            dev.write(buf, bits, queue=queue, wait_for=wait_for)
    return Tensor(ir.load(buf, View.contiguous(arr.shape), d), dev)


def to_host_future(t: Tensor, *, queue: runtime.CLQueue | None = None,
                   wait_for: Sequence[Any] = (), pinned: bool = True
                   ) -> concurrent.futures.Future[np.ndarray]:
    """Start a non-blocking device->host copy of ``t`` (through pinned memory unless
    ``pinned=False``); the future resolves to a new numpy array.

    >>> fut = clops.to_host_future(clops.ones(4))
    >>> fut.result()
    array([1., 1., 1., 1.], dtype=float32)
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"to_host_future takes a Tensor, not {type(t).__name__}")
    d = t.dtype
    src = t.contiguous()
    buf, v = src._load.arg
    nbytes = t.size * d.itemsize
    if nbytes == 0 or not pinned:
        if not pinned and nbytes:
            host = np.empty(t.shape, d.np)
            ev = t.device.read(host, buf, v.offset * d.itemsize, queue=queue,
                               wait_for=wait_for, blocking=False)
            return ev.future(lambda: _host_value(host, d))
        fut: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        fut.set_result(_host_value(np.empty(t.shape, d.np), d))
        return fut
    dev = t.device
    ev, blk = staging.download(dev, buf, nbytes, v.offset * d.itemsize, queue=queue,
                               wait_for=wait_for)
    shape = t.shape

    def value() -> np.ndarray:
        try:
            out = blk.host[:nbytes].view(d.np).reshape(shape).copy()
        finally:
            staging.staging_pool(dev).release(blk)
        return _host_value(out, d)

    return ev.future(value)
