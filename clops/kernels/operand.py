"""Kernels, operands: the strided view of a device buffer (``Operand``) that clops' own
relayout and FFT kernels (``layout``, ``fft``) and the vendor bridges (``providers``) take,
and the timing and queue helpers both use. Nothing here sees a Tensor."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..runtime import plan

if TYPE_CHECKING:
    from ..runtime.device import CLDevice, CLQueue
    from ..runtime.pool import Buffer

__all__ = ["ITEMSIZE", "Operand", "contiguous_strides", "dtype_name", "measure", "queue_of"]

# Bytes per element of the dtypes that cross the boundary, by name.
ITEMSIZE: dict[str, int] = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "complex64": 8, "complex128": 16,
}



def dtype_name(dtype: Any) -> str:
    """The name of a clops dtype object, a numpy dtype or a string.

    >>> dtype_name("float32"), dtype_name(numpy.float16)
    ('float32', 'float16')
    """
    if isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    import numpy as np

    return np.dtype(dtype).name


@dataclass(frozen=True)
class Operand:
    """A strided view of a device buffer: the only thing that crosses the provider boundary.

    ``offset`` and ``strides`` count elements of ``dtype`` (a complex64 element is 8 bytes).

    >>> a = Operand.contiguous(dev.alloc(4 * 6), (2, 3), "float32")
    >>> a.strides, a.is_contiguous
    ((3, 1), True)
    """

    buffer: Buffer
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]
    offset: int = 0

    @classmethod
    def contiguous(cls, buffer: Buffer, shape: Sequence[int], dtype: str,
                   offset: int = 0) -> Operand:
        shape = tuple(int(s) for s in shape)
        return cls(buffer, shape, dtype, contiguous_strides(shape), offset)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def byte_offset(self) -> int:
        return self.offset * self.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def is_contiguous(self) -> bool:
        """C-contiguous (dims of size 1 may have any stride)."""
        return all(st == want for st, want, n in
                   zip(self.strides, contiguous_strides(self.shape), self.shape) if n != 1)

    def with_shape(self, shape: Sequence[int], strides: Sequence[int],
                   offset: int | None = None) -> Operand:
        return Operand(self.buffer, tuple(shape), self.dtype, tuple(strides),
                       self.offset if offset is None else offset)

    def __repr__(self) -> str:
        return (f"Operand({self.dtype}, shape={self.shape}, strides={self.strides}, "
                f"offset={self.offset})")


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(out))


# -- timing -----------------------------------------------------------------------------------
def measure(call: Callable[[], Any], device: CLDevice, repeats: int = 3,
            budget_s: float = 0.5) -> float:
    """Seconds one ``call()`` takes once warm: one untimed call (builds, plans), then the best
    of ``repeats`` timed ones (fewer when a call is slower than ``budget_s``), each from enqueue
    to the queue's finish. Use the same function for both sides of a comparison."""
    with plan.paused():  # measuring is not part of a function clops.jit captures
        return _measure(call, device, repeats, budget_s)


def _measure(call: Callable[[], Any], device: CLDevice, repeats: int, budget_s: float) -> float:
    call()
    device.synchronize()
    best = math.inf
    spent = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        device.synchronize()
        dt = time.perf_counter() - t0
        best = min(best, dt)
        spent += dt
        if spent > budget_s:
            break
    return best


def queue_of(device: CLDevice, queue: CLQueue | None = None) -> CLQueue:
    """``queue``, else the queue work on ``device`` goes to now (a ``clops.stream`` block's)."""
    if queue is not None:
        return queue
    try:
        from ..runtime.streams import current_queue
    except ImportError:  # a runtime without streams
        return device.queue
    return current_queue(device)


