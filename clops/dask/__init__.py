"""dask: clops tensors as the chunks of Dask arrays, and a Dask cluster of one worker per OpenCL
device. Needs Dask: ``pip install 'clops-opencl[dask]'``.

Importing this module registers clops with Dask:

- Dask's array lookups (``concatenate``, ``tensordot``, ``einsum``, ``take``, ``empty``,
  element counts) for the tensor type, as Dask does for CuPy, so that Dask's own algorithms
  run on tensor chunks (the tensor's NumPy protocols, ``clops.array.numpy_protocols``, take
  the rest);
- the size of a tensor chunk (its bytes) for Dask's memory accounting; a chunk still pending
  (a lazy result) is computed as Dask measures it, when a worker stores it, so that what Dask
  counts is what the chunk holds: a pending chunk holds its inputs' device memory (a
  column product of a tall chunk, 64 by 64, would hold the whole chunk); under Dask's local
  schedulers (threads, sync), which measure nothing, a task's pending result is computed as
  the task finishes, for the same reason;
- a ``dask_serialize`` family for tensors: the device's bytes go to the wire as one frame (one
  copy from the device, one to the receiving worker's device), with dtype, shape and memory
  kind in the header.

>>> import dask.array as da, clops, clops.dask
>>> x = da.from_array(clops.ones((4096, 512)), chunks=(1024, 512), asarray=False)
>>> float((x * 2).sum().compute())
4194304.0
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

try:
    import dask.array as _da  # noqa: F401 - Dask must be there
    from dask.array import dispatch as _dispatch
except ImportError as e:  # pragma: no cover - a clear message, not a traceback in Dask
    raise ImportError("clops.dask needs Dask: pip install 'clops-opencl[dask]'") from e

from ..array.numpy_protocols import rebuild_tensor
from ..array.tensor import Tensor
from .cluster import LocalCluster, device_selectors, worker_specs

__all__ = ["LocalCluster", "device_selectors", "from_numpy_chunks", "worker_specs"]


def _xp() -> Any:
    import clops

    return clops


def _concatenate(arrays: Any, axis: int = 0) -> Any:
    return np.concatenate(arrays, axis=axis)  # Tensor.__array_function__ takes it


def _tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
    return np.tensordot(a, b, axes=axes)


def _take(a: Any, indices: Any, axis: int = 0) -> Any:
    xp = _xp()
    idx = xp.asarray(np.asarray(indices), device=a.device)
    return xp.take(a, idx, axis=axis)


def _empty(shape: Any, dtype: Any = None, **kw: Any) -> Any:
    return _xp().empty(shape, dtype=dtype)


def _numel(x: Any, **kwargs: Any) -> Any:
    """The number of elements a reduction of ``x`` counts (Dask's mean and moments), as a
    small host array: a tensor's operators take host arrays as they take scalars."""
    shape, axis = x.shape, kwargs.get("axis")
    keepdims, dtype = kwargs.get("keepdims", False), kwargs.get("dtype", np.float64)
    if axis is None:
        n = math.prod(shape)
        return np.full((1,) * len(shape), n, dtype) if keepdims else np.asarray(n, dtype)
    axes = {a % len(shape) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}
    n = math.prod(shape[a] for a in axes)
    out = tuple(1 if i in axes else s for i, s in enumerate(shape)) if keepdims else \
        tuple(s for i, s in enumerate(shape) if i not in axes)
    return np.full(out, n, dtype)


def _register_lookups() -> None:
    _dispatch.concatenate_lookup.register(Tensor, _concatenate)
    _dispatch.tensordot_lookup.register(Tensor, _tensordot)
    _dispatch.einsum_lookup.register(Tensor, lambda *a, **k: np.einsum(*a, **k))
    _dispatch.take_lookup.register(Tensor, _take)
    _dispatch.empty_lookup.register(Tensor, _empty)
    _dispatch.numel_lookup.register(Tensor, _numel)
    _dispatch.nannumel_lookup.register(Tensor, _numel)


def _register_sizeof() -> None:
    from dask.sizeof import sizeof

    def _sizeof(t: Tensor) -> int:
        # What a chunk holds (device memory), for Dask's memory accounting and scheduling.
        # A distributed worker measures each result it stores, in the task's thread: a
        # pending result is computed there (its launch enqueued), so that it stops holding
        # its inputs, which Dask has counted as released once their consumers ran.
        t.realize()
        return int(t.nbytes)

    sizeof.register(Tensor, _sizeof)


def _register_realize_on_finish() -> None:
    from dask.callbacks import Callback

    class _Realize(Callback):
        # dask.local calls it with each task's result, in the thread that gathers them
        def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker: Any) -> None:
            for t in result if isinstance(result, tuple | list) else (result,):
                if isinstance(t, Tensor):
                    t.realize()

    _Realize().register()


def _register_serialization() -> None:
    try:
        from distributed.protocol import dask_deserialize, dask_serialize
    except ImportError:  # dask.array without distributed: nothing goes over a wire
        return

    @dask_serialize.register(Tensor)
    def _serialize(t: Tensor) -> tuple[dict, list]:
        host = np.ascontiguousarray(np.asarray(t))  # the one copy from the device
        header = {"dtype": t.dtype.name, "shape": list(t.shape), "kind": t.usm_type}
        return header, [host.data.cast("B") if host.size else b""]

    @dask_deserialize.register(Tensor)
    def _deserialize(header: dict, frames: list) -> Tensor:
        # (frames may be split in transit; joined only then)
        data = frames[0] if len(frames) == 1 else b"".join(bytes(f) for f in frames)
        return rebuild_tensor(data, header["dtype"], tuple(header["shape"]), header["kind"])


def from_numpy_chunks(x: Any) -> Any:
    """A Dask array of numpy chunks as one of clops tensors on each worker's device."""
    return x.map_blocks(lambda b: _xp().asarray(b), dtype=x.dtype,
                        meta=_xp().empty((0,) * x.ndim, dtype=_xp().asarray(
                            np.zeros(0, x.dtype)).dtype))


_register_lookups()
_register_sizeof()
_register_realize_on_finish()
_register_serialization()
