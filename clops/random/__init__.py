"""Random numbers from Philox4x32-10, a counter-based generator: the value of element ``i`` is a
function of (seed, stream, i) only, so results are the same on every device, for every shape
the same elements are drawn in, and for any split of the work.

Custom kernels use the same generator with ``#include "clops/philox.cl"``; ``philox4x32_10``
here is the host (numpy) reference of it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import runtime
from ..array.tensor import Tensor
from ..graph import dtypes as _dt
from ..graph import ir
from ..graph.ir import View
from ..kernels import random as random_kernels

__all__ = ["PHILOX_PATH", "RandomState", "integers", "normal", "philox4x32_10",
           "philox_source", "random_bits", "uniform"]

# (also what ``#include "clops/philox.cl"`` pastes into user kernels and ``kernels/random.cl``)
PHILOX_PATH = Path(__file__).parent.parent / "kernels" / "philox.cl"
_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85


def philox_source() -> str:
    """The OpenCL C of the generator, to prepend to a kernel's source (or ``#include``
    ``"clops/philox.cl"`` in a ``clops.kernel``).

    >>> "philox4x32_10" in clops.random.philox_source()
    True
    """
    return PHILOX_PATH.read_text()


def philox4x32_10(counters: np.ndarray, key: Sequence[int]) -> np.ndarray:
    """Host reference: Philox4x32-10 of ``counters`` (shape (..., 4), uint32) under ``key``
    (two uint32 words); returns uint32 words of the same shape.

    >>> philox4x32_10(np.zeros(4, np.uint32), (0, 0))[0] == 0x6627E8D5
    True
    """
    c = np.array(counters, dtype=np.uint64).reshape(-1, 4)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    mask = np.uint64(0xFFFFFFFF)
    for r in range(10):
        p0 = c[:, 0] * np.uint64(_M0)
        p1 = c[:, 2] * np.uint64(_M1)
        c = np.stack([(p1 >> np.uint64(32)) ^ c[:, 1] ^ k0, p1 & mask,
                      (p0 >> np.uint64(32)) ^ c[:, 3] ^ k1, p0 & mask], axis=1)
        if r < 9:
            k0 = (k0 + np.uint64(_W0)) & mask
            k1 = (k1 + np.uint64(_W1)) & mask
    return c.astype(np.uint32).reshape(np.shape(counters))


def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, int | np.integer) else tuple(int(n) for n in shape)


def _generate(kname: str, per_block: int, shape: int | Sequence[int], d: _dt.DType,
              seed: int, stream: int, device: Any, extra: Sequence[Any]) -> Tensor:
    dev = runtime.device(device)
    s = _shape(shape)
    n = ir.prod(s)
    if d.needs_fp64 and not dev.caps.fp64:
        raise TypeError(f"{d} needs double precision, which {dev.name} does not have")
    buf = dev.alloc(max(n, 1) * d.itemsize)
    out = Tensor(ir.load(buf, View.contiguous(s), d), dev)
    if n:
        random_kernels.generate(dev, kname, buf, n, per_block, seed=seed, stream=stream,
                                extra=extra)
    return out


def random_bits(seed: int, shape: int | Sequence[int], *, stream: int = 0,
                device: Any = None) -> Tensor:
    """Raw 32-bit words (uint32): element ``i`` is word ``i % 4`` of Philox block ``i // 4``.

    >>> clops.random.random_bits(0, 4).to_numpy()[0] == 0x6627E8D5
    True
    """
    return _generate("rng_bits", 4, shape, _dt.uint32, seed, stream, device, ())


def uniform(seed: int, shape: int | Sequence[int], *, low: float = 0.0, high: float = 1.0,
            dtype: Any = None, stream: int = 0, device: Any = None) -> Tensor:
    """Uniform floats in [low, high) (float32: 24 random bits; float64: 53).

    >>> x = clops.random.uniform(42, (2, 3))
    """
    d = _dt.to_dtype(dtype) if dtype is not None else _dt.float32
    if d == _dt.float32:
        return _generate("rng_uniform_f32", 4, shape, d, seed, stream, device,
                         (np.float32(low), np.float32(high - low)))
    if d == _dt.float64:
        return _generate("rng_uniform_f64", 2, shape, d, seed, stream, device,
                         (np.float64(low), np.float64(high - low)))
    raise TypeError(f"uniform makes float32 or float64, not {d}; use astype for others")


def normal(seed: int, shape: int | Sequence[int], *, mean: float = 0.0, std: float = 1.0,
           dtype: Any = None, stream: int = 0, device: Any = None) -> Tensor:
    """Normal floats (Box-Muller on Philox words).

    >>> z = clops.random.normal(0, 1000, std=2.0)
    """
    d = _dt.to_dtype(dtype) if dtype is not None else _dt.float32
    if d == _dt.float32:
        return _generate("rng_normal_f32", 4, shape, d, seed, stream, device,
                         (np.float32(mean), np.float32(std)))
    if d == _dt.float64:
        return _generate("rng_normal_f64", 2, shape, d, seed, stream, device,
                         (np.float64(mean), np.float64(std)))
    raise TypeError(f"normal makes float32 or float64, not {d}; use astype for others")


def integers(seed: int, shape: int | Sequence[int], low: int, high: int | None = None, *,
             dtype: Any = None, stream: int = 0, device: Any = None) -> Tensor:
    """Integers in [low, high) (or [0, low) when ``high`` is None); ``high - low`` at most
    2**32.

    >>> clops.random.integers(7, 10, 0, 6).dtype
    clops.int64
    """
    if high is None:
        low, high = 0, low
    rng = int(high) - int(low)
    if rng <= 0 or rng > 1 << 32:
        raise ValueError(f"integers: need 0 < high - low <= 2**32, got [{low}, {high})")
    d = _dt.to_dtype(dtype) if dtype is not None else _dt.int64
    if d == _dt.int64:
        kname = "rng_integers_i64"
    elif d == _dt.int32:
        if low < -(1 << 31) or high > 1 << 31:
            raise ValueError(f"[{low}, {high}) does not fit int32")
        kname = "rng_integers_i32"
    else:
        raise TypeError(f"integers makes int32 or int64, not {d}")
    return _generate(kname, 4, shape, d, seed, stream, device,
                     (np.int64(low), np.uint64(rng)))


class RandomState:
    """numpy's ``RandomState`` methods on the device, for Dask: with
    ``da.random.RandomState(seed, RandomState=clops.random.RandomState)`` every block of a
    Dask array is drawn on its worker's device (no host generator, no transfer). Dask gives
    each block its own state (an array of uint32 words); the Philox seed and stream are taken
    from its first three words, so blocks differ and a seed repeats its array.

    Floats are float32, clops' default float (numpy's are float64): pass ``dtype`` for
    float64 where the device has it.

    >>> import dask.array as da
    >>> rs = da.random.RandomState(0, RandomState=clops.random.RandomState)
    >>> x = rs.standard_normal((100_000, 64), chunks=(10_000, 64))   # clops blocks
    """

    def __init__(self, seed: Any = None) -> None:
        if seed is None:
            words = np.random.SeedSequence().generate_state(3)
        elif isinstance(seed, int | np.integer):
            words = np.random.SeedSequence(int(seed)).generate_state(3)
        else:
            words = np.asarray(seed, np.uint32).reshape(-1)
            if words.size < 3:
                words = np.random.SeedSequence([int(w) for w in words]).generate_state(3)
        self.seed = int(words[0]) | int(words[1]) << 32
        self.stream = int(words[2])

    def _shape(self, size: Any) -> tuple[int, ...]:
        return () if size is None else _shape(size)

    def standard_normal(self, size: Any = None, dtype: Any = None) -> Tensor:
        return normal(self.seed, self._shape(size), dtype=dtype, stream=self.stream)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: Any = None,
               dtype: Any = None) -> Tensor:
        return normal(self.seed, self._shape(size), mean=float(loc), std=float(scale),
                      dtype=dtype, stream=self.stream)

    def random_sample(self, size: Any = None, dtype: Any = None) -> Tensor:
        return uniform(self.seed, self._shape(size), dtype=dtype, stream=self.stream)

    random = random_sample

    def uniform(self, low: float = 0.0, high: float = 1.0, size: Any = None,
                dtype: Any = None) -> Tensor:
        return uniform(self.seed, self._shape(size), low=float(low), high=float(high),
                       dtype=dtype, stream=self.stream)

    def randint(self, low: int, high: int | None = None, size: Any = None,
                dtype: Any = None) -> Tensor:
        return integers(self.seed, self._shape(size), low, high, dtype=dtype,
                        stream=self.stream)
