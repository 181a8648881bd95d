"""Array layer, provider dispatch: turns Tensors into operands, asks :func:`choose` and runs the
chosen provider (or clops' own FFT kernels), and wraps the results back into Tensors.

``matmul(x1, x2)`` returns ``None`` when the generated kernel should run, so the array layer's
``matmul`` can begin with::

    out = clops.array.dispatch.matmul(x1, x2)
    if out is not None:
        return out

The first call of a shape class measures the provider against ``clops.matmul`` itself (run
inside :func:`generated_only`, so that the measurement does not come back here).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _config
from ..kernels import fft, layout
from ..kernels.operand import Operand, measure, queue_of
from ..providers import registry
from ..providers.base import ProviderError
from ..providers.registry import choose
from ..runtime import plan
from ._ops import OPS
from .creation import zeros
from .tensor import Tensor

if TYPE_CHECKING:
    from ..runtime.device import CLDevice
    from ..runtime.events import Event

_STATE = threading.local()


@contextlib.contextmanager
def generated_only() -> Iterator[None]:
    """Inside this block :func:`matmul` and :func:`fft_rows` never pick a provider (used to time
    the generated side, and by tests)."""
    before = getattr(_STATE, "generated_only", False)
    _STATE.generated_only = True
    try:
        yield
    finally:
        _STATE.generated_only = before


def _generated_only() -> bool:
    return bool(getattr(_STATE, "generated_only", False))


def operand(t: Tensor) -> Operand:
    """The realized tensor as an operand (no copy)."""
    t.realize()
    return Operand(t.buffer, tuple(t.shape), t.dtype.name, tuple(t.strides), int(t.offset))


def tensor(op: Operand, device: CLDevice) -> Tensor:
    """A Tensor over an operand's buffer, shape, strides and offset (no copy)."""
    return Tensor._from_buffer(op.buffer, op.shape, op.dtype, device, strides=op.strides,
                               offset=op.offset)


# -- matmul -------------------------------------------------------------------------------------
MATMUL_DTYPES = ("float32", "float16")


def _matmul_route(x1: Tensor, x2: Tensor) -> tuple[str, tuple[int, ...]] | None:
    """The provider op and shape key for ``x1 @ x2``, or ``None`` for cases left to generated
    code (vector dot products, mixed dtypes)."""
    dt = x1.dtype.name
    if dt != x2.dtype.name or dt not in MATMUL_DTYPES or x1.ndim == 0 or x2.ndim == 0:
        return None
    if x1.ndim == 1 and x2.ndim == 1:
        return None
    if x1.shape[-1] != x2.shape[-1 if x2.ndim == 1 else -2]:
        return None  # the generated path raises the error that names both shapes
    if x1.ndim <= 2 and x2.ndim <= 2:
        if x2.ndim == 1:
            return "gemv", (x1.shape[0], x1.shape[1])
        if x1.ndim == 1:
            return "gemv", (x2.shape[1], x2.shape[0])
        return "gemm", (x1.shape[0], x2.shape[1], x1.shape[1])
    a = x1.shape if x1.ndim > 1 else (1, x1.shape[0])
    b = x2.shape if x2.ndim > 1 else (x2.shape[0], 1)
    batch = np.broadcast_shapes(a[:-2], b[:-2])
    return "gemm_batched", (math.prod(batch), a[-2], b[-1], a[-1])


def matmul(x1: Tensor, x2: Tensor, *,
           generated_cost: Callable[[], float] | None = None) -> Tensor | None:
    """``x1 @ x2`` through a provider when :func:`choose` picks one, else ``None``.

    ``generated_cost`` defaults to timing ``clops.matmul`` on zero tensors of the same shapes.

    >>> out = dispatch.matmul(a, b)
    >>> out = out if out is not None else generated_matmul(a, b)
    """
    dev = x1.device
    dt = x1.dtype.name
    if generated_cost is None:
        def generated_cost() -> float:
            return _generated_matmul_cost(x1.shape, x2.shape, dt, dev)
    return _provided(x1, x2, lambda op, key: choose(op, dev, dt, key, generated_cost))


def forced_matmul(x1: Tensor, x2: Tensor) -> Tensor | None:
    """``x1 @ x2`` through a provider that ``CLOPS_PROVIDERS`` forces (``+NAME``), at any size
    and ahead of clops' own GEMM kernels; ``None`` when none is forced or capable."""
    # PERF: nothing forced (the default): no route or capabilities to work out, 5.7 -> 0.4 us
    # a product (CLOPS_DEBUG=2 asks anyway, for the reasons it prints of providers skipped)
    if not registry.forces_any() and _config.CONFIG.debug < 2:
        return None
    return _provided(x1, x2, lambda op, key: registry.forced(op, x1.device, x1.dtype.name,
                                                             key))


def _provided(x1: Tensor, x2: Tensor,
              pick: Callable[[str, tuple[int, ...]], Any]) -> Tensor | None:
    """``x1 @ x2`` through the provider ``pick(op, shape key)`` names, else ``None``."""
    if _generated_only() or x1.device is not x2.device:
        return None
    route = _matmul_route(x1, x2)
    if route is None:
        return None
    provider = pick(*route)
    return None if provider is None else _run_matmul(provider, route[0], x1, x2)


def _generated_matmul_cost(s1: tuple[int, ...], s2: tuple[int, ...], dtype: str,
                           device: CLDevice) -> float:
    a = zeros(s1, dtype=dtype, device=device)
    b = zeros(s2, dtype=dtype, device=device)
    with generated_only():
        return measure(lambda: OPS.matmul(a, b).realize(), device)


def _run_matmul(provider: Any, op: str, x1: Tensor, x2: Tensor) -> Tensor:
    dev = x1.device
    dt = x1.dtype.name
    a, b = operand(x1), operand(x2)
    if op == "gemv":
        if x2.ndim == 1:
            y = layout.empty(dev, (x1.shape[0],), dt)
            _call(provider, "gemv", dev, a, b, y)
        else:  # x1 @ M = M^T @ x1
            bt = b.with_shape((b.shape[1], b.shape[0]), (b.strides[1], b.strides[0]))
            y = layout.empty(dev, (x2.shape[1],), dt)
            _call(provider, "gemv", dev, bt, a, y)
        return tensor(y, dev)
    if op == "gemm":
        c = layout.empty(dev, (x1.shape[0], x2.shape[1]), dt)
        _call(provider, "gemm", dev, a, b, c)
        return tensor(c, dev)
    # batched: vectors become matrices, batch dims broadcast with stride 0
    if a.ndim == 1:
        a = a.with_shape((1, a.shape[0]), (0, a.strides[0]))
    if b.ndim == 1:
        b = b.with_shape((b.shape[0], 1), (b.strides[0], 0))
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    a = _broadcast(a, batch)
    b = _broadcast(b, batch)
    m, n = a.shape[-2], b.shape[-1]
    c = layout.empty(dev, batch + (m, n), dt)
    _call(provider, "gemm_batched", dev, a, b, c)
    shape = batch + (m, n)
    if x1.ndim == 1:
        shape = batch + (n,)
    elif x2.ndim == 1:
        shape = batch + (m,)
    return tensor(c.with_shape(shape, layout.contiguous_strides(shape)), dev)


def _call(provider: Any, op: str, dev: CLDevice, *operands: Operand, **params: Any) -> Any:
    """``provider.run(op, ...)`` as one step of the launch seam: ``clops.jit`` records it whole
    and calls it again on a replay's buffers (the last operand is the one written)."""
    return plan.call(provider.run, op, dev, *operands, writes=[operands[-1].buffer],
                     name=f"{provider.name} {op}", **params)


def _broadcast(op: Operand, batch: tuple[int, ...]) -> Operand:
    """``op`` (..., R, C) viewed with batch dims ``batch`` (stride 0 where broadcast)."""
    mat_shape, mat_strides = op.shape[-2:], op.strides[-2:]
    own = op.shape[:-2]
    pad = len(batch) - len(own)
    shape = list(batch)
    strides = [0] * len(batch)
    for i, (n, s) in enumerate(zip(own, op.strides[:-2])):
        strides[pad + i] = s if n != 1 else 0
    return op.with_shape(tuple(shape) + tuple(mat_shape), tuple(strides) + tuple(mat_strides))


# -- FFT rows -----------------------------------------------------------------------------------
def fft_rows(op: str, device: CLDevice, x: Operand, y: Operand, *, inverse: bool = False,
             scale: float = 1.0) -> Event:
    """``fft`` / ``rfft`` / ``irfft`` over contiguous (batch, n) rows: by the chosen provider,
    or by clops' own kernels (also when the provider fails at run time)."""
    cdt = x.dtype if op == "irfft" else y.dtype
    if op == "rfft":
        cdt = y.dtype
    rows = y if op == "irfft" else x
    key = (rows.shape[0], rows.shape[1]) if rows.ndim == 2 else (1, rows.shape[0])
    provider = None
    if not _generated_only():
        provider = choose(op, device, cdt, key,
                          lambda: fft.cost(op, device, cdt, key))
    kw: dict[str, Any] = {"scale": scale}
    if op == "fft":
        kw["inverse"] = inverse
    if provider is not None:
        return plan.call(_provider_fft, provider, op, device, x, y, writes=[y.buffer],  # type: ignore[no-any-return]
                         name=f"{provider.name} {op}", **kw)
    return fft.run(op, device, x, y, queue=queue_of(device), **kw)


def _provider_fft(provider: Any, op: str, device: CLDevice, x: Operand, y: Operand,
                  **kw: Any) -> Event:
    """The provider's FFT, or clops' own kernels where the provider fails at run time."""
    try:
        return provider.run(op, device, x, y, **kw)  # type: ignore[no-any-return]
    except ProviderError as e:
        if _config.CONFIG.debug >= 1:
            print(f"clops: {e}; running clops' own FFT kernels instead", file=sys.stderr)
    return fft.run(op, device, x, y, queue=queue_of(device), **kw)
