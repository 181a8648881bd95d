"""Providers, interface: what a vendor library declares (ops, dtypes, layouts, devices, cost) and
how one of its calls borrows clops' queue, waits for the buffers it touches and hands back an
event that joins clops' dependency tracking.

A provider never sees a Tensor. It is given :class:`Operand`\\ s (a runtime ``Buffer`` with an
element offset, a shape and element strides) and a device, and returns a clops ``Event``.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .. import _config
from ..runtime import interop, plan, profiler
from ..runtime.events import Event

if TYPE_CHECKING:
    from ..runtime import NativeEvent
    from ..runtime.device import CLDevice, CLQueue
    from ..runtime.pool import Buffer

# Bytes per element of the dtypes that cross the boundary, by name.
ITEMSIZE: dict[str, int] = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "complex64": 8, "complex128": 16,
}


class ProviderError(RuntimeError):
    """A provider call failed (the library returned an error status)."""


class ProviderUnavailableError(RuntimeError):
    """A provider was asked for work it cannot do here (library missing, device, dtype)."""


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



@functools.cache
def source(name: str) -> str:
    """The text of the OpenCL source ``clops/providers/<name>``, read once."""
    with open(os.path.join(os.path.dirname(__file__), name)) as f:
        return f.read()

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


@dataclass(frozen=True)
class OpSpec:
    """One op a provider implements: the dtypes it takes, the device extensions a dtype needs,
    and (in words) the layouts it takes without a relayout."""

    op: str
    dtypes: frozenset[str]
    layout: str
    needs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class Provider(ABC):
    """A vendor library behind clops' ops.

    Subclasses declare ``name``, ``specs`` (one :class:`OpSpec` per op) and ``backends`` (the
    device backends they serve, ``None`` for all), and implement :meth:`load` (import or open
    the library; raise with the reason when it is missing), :meth:`estimate` (seconds, from a
    simple model), :meth:`scratch_call` (a call on scratch buffers, for measuring) and the op
    methods themselves. Every op method takes the device, operands and keyword parameters and
    returns an ``Event``; it never copies through the host.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    specs: ClassVar[tuple[OpSpec, ...]] = ()
    backends: ClassVar[tuple[str, ...] | None] = None
    # (backend, driver-version prefix) -> why the provider does not serve it.
    known_bad_drivers: ClassVar[Mapping[tuple[str, str], str]] = {}

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded = False
        self._why_unavailable: str | None = None

    # -- availability ---------------------------------------------------------------------------
    @abstractmethod
    def load(self) -> None:
        """Open the library. Raise (any exception) with a message saying what is missing."""

    def unavailable_reason(self) -> str | None:
        """``None`` when the library is usable, else why not (checked once)."""
        with self._lock:
            if not self._loaded:
                try:
                    self.load()
                except Exception as e:  # noqa: BLE001 - the reason is the answer
                    self._why_unavailable = f"{type(e).__name__}: {e}" if str(e) else repr(e)
                self._loaded = True
        return self._why_unavailable

    @property
    def available(self) -> bool:
        return self.unavailable_reason() is None

    def spec(self, op: str) -> OpSpec | None:
        for s in self.specs:
            if s.op == op:
                return s
        return None

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(s.op for s in self.specs)

    def serves(self, device: CLDevice) -> str | None:
        """``None`` when this provider serves ``device`` (its backend and driver), else why not."""
        if self.backends is not None and device.backend not in self.backends:
            return f"{self.name} does not serve {device.backend} devices"
        for (backend, prefix), why in self.known_bad_drivers.items():
            if device.backend == backend and device.driver_version.startswith(prefix):
                return why
        return None

    def cannot(self, op: str, device: CLDevice, dtype: str) -> str | None:
        """``None`` when this provider can run ``op`` on ``dtype`` on ``device``, else why not:
        library, op, dtype, device extensions, backend and driver, in that order."""
        why = self.unavailable_reason()
        if why is not None:
            return f"{self.name} is unavailable ({why})"
        s = self.spec(op)
        if s is None:
            return f"{self.name} does not implement {op}"
        if dtype not in s.dtypes:
            return f"{self.name} {op} takes {sorted(s.dtypes)}, not {dtype}"
        exts = device.caps.extensions
        for ext in s.needs.get(dtype, ()):
            if ext not in exts:
                return f"{self.name} {op} on {dtype} needs {ext}, which {device.name} lacks"
        return self.serves(device)

    def cannot_shape(self, op: str, shape_key: tuple[int, ...]) -> str | None:
        """``None`` when the library takes a call of this shape, else why not."""
        return None

    def accepts(self, op: str, role: str, operand: Operand) -> bool:
        """Whether ``operand`` can be passed as ``role`` of ``op`` as it is; when not, the caller
        relayouts it to a contiguous one on the device. The default takes contiguous ones."""
        return operand.is_contiguous

    # -- cost -----------------------------------------------------------------------------------
    @abstractmethod
    def estimate(self, op: str, device: CLDevice, dtype: str, shape_key: tuple[int, ...]) -> float:
        """Seconds a call should take, from a model (used to rank providers unmeasured)."""

    @abstractmethod
    def scratch_call(self, op: str, device: CLDevice, dtype: str,
                     shape_key: tuple[int, ...]) -> Callable[[], Event]:
        """A call on scratch buffers of ``shape_key``, to be timed by :func:`measure`."""

    def measure(self, op: str, device: CLDevice, dtype: str, shape_key: tuple[int, ...]) -> float:
        """Seconds one call takes on this device (warm, best of a few)."""
        return measure(self.scratch_call(op, device, dtype, shape_key), device)

    def run(self, op: str, device: CLDevice, *operands: Operand, **params: Any) -> Event:
        """Run ``op`` by name: ``provider.run("gemm", dev, a, b, c)``."""
        if self.spec(op) is None:
            raise ProviderUnavailableError(f"{self.name} does not implement {op}")
        return getattr(self, op)(device, *operands, **params)

    def __repr__(self) -> str:
        why = self.unavailable_reason()
        state = "available" if why is None else f"unavailable: {why}"
        return f"<clops provider {self.name} ({state})>"


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


class _Span:
    """What the profiler reads of an event, for work between two markers (a library that
    returns no event): it starts when the first marker ends and ends when the second does."""

    def __init__(self, first: NativeEvent, last: NativeEvent) -> None:
        self.first, self.last = first, last

    def wait(self) -> None:
        self.last.wait()

    @property
    def profile(self) -> Any:
        from types import SimpleNamespace

        a, b = self.first.profile, self.last.profile
        return SimpleNamespace(queued=a.queued, start=a.end, end=b.end)


# -- the guarded call -------------------------------------------------------------------------
def guarded_call(device: CLDevice, enqueue: Callable[[CLQueue], NativeEvent | None], *,
                 reads: Iterable[Buffer] = (), writes: Iterable[Buffer] = (),
                 queue: CLQueue | None = None, name: str, provider: str, op: str,
                 nbytes: int = 0, flops: float = 0.0, wait_for: Sequence[Event] = ()) -> Event:
    """Run a library call that takes no wait list on clops' queue, inside clops' dependency
    tracking.

    Before: a barrier on the queue waits for the last writes of ``reads`` and the last writes
    and reads of ``writes`` (only when some are pending elsewhere). The call: ``enqueue(queue)``
    returns the library's event, or ``None`` when it gives none (a marker then stands for its
    work). After: the event is recorded on the buffers and in the profiler.
    """
    if plan._ACTIVE[0]:
        # a library's enqueue cannot be replayed alone: providers run as whole recorded steps
        # (``plan.call``, as ``dispatch`` does)
        plan.refuse(f"a {provider} {op} call made outside a recorded provider step")
    q = queue_of(device, queue)
    reads = list(reads)
    writes = list(writes)
    deps: list[NativeEvent] = [e.cl_event for e in wait_for if e.cl_event is not None]
    for b in reads:
        deps.extend(b.read_deps(q))
    for b in writes:
        deps.extend(b.write_deps(q))
    if deps:
        seen: set[int] = set()
        unique = []
        for dep in deps:
            handle = interop.event_handle(dep)
            if handle not in seen:
                seen.add(handle)
                unique.append(dep)
        interop.enqueue_barrier(q, wait_for=unique)
    before = interop.enqueue_marker(q) if profiler.ACTIVE else None
    ev = enqueue(q)
    timed: Any = ev
    if ev is None:
        # NOTE: a marker with no wait list completes after everything enqueued before it.
        ev = interop.enqueue_marker(q)
        timed = _Span(before, ev) if before is not None else ev
    for b in reads:
        b.mark_read(ev, q)
    for b in writes:
        b.mark_write(ev, q)
    if profiler.ACTIVE:
        profiler.record(name, "provider", device.name, timed, nbytes, q.index,
                        provider=provider, op=op, flops=flops)
    if _config.CONFIG.debug >= 2:
        print(f"clops: provider call {name} ({provider} {op}) on {device.name}",
              file=sys.stderr)
    return Event(ev, q)
