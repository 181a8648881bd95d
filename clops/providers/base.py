"""Providers, interface: what a vendor library declares (ops, dtypes, layouts, devices, cost) and
how one of its calls borrows clops' queue, waits for the buffers it touches and hands back an
event that joins clops' dependency tracking.

A provider never sees a Tensor. It is given :class:`Operand`\\ s (a runtime ``Buffer`` with an
element offset, a shape and element strides) and a device, and returns a clops ``Event``.
"""

from __future__ import annotations

import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .. import _config
from ..kernels.operand import Operand, measure, queue_of
from ..runtime import interop, plan, profiler, scope
from ..runtime.events import Event

if TYPE_CHECKING:
    from ..runtime import NativeEvent
    from ..runtime.device import CLDevice, CLQueue
    from ..runtime.pool import Buffer

class ProviderError(RuntimeError):
    """A provider call failed (the library returned an error status)."""


class ProviderUnavailableError(RuntimeError):
    """A provider was asked for work it cannot do here (library missing, device, dtype)."""


@dataclass(frozen=True)
class OpSpec:
    """One op a provider implements: the dtypes it takes, the device extensions a dtype needs,
    (in words) the layouts it takes without a relayout, and the dtypes it takes only when
    ``CLOPS_PROVIDERS`` forces it (``+NAME``), each with why the automatic choice leaves it
    out (a result that would differ from clops' own and numpy's)."""

    op: str
    dtypes: frozenset[str]
    layout: str
    needs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    forced_only: Mapping[str, str] = field(default_factory=dict)


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
    if plan.capturing():
        # a library's enqueue cannot be replayed alone: providers run as whole recorded
        # commands (``plan.call``, as ``dispatch`` does)
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
    before = interop.enqueue_marker(q) if scope.profiling() else None
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
    if scope.profiling():
        profiler.record(name, "provider", device.name, timed, nbytes, q.index,
                        provider=provider, op=op, flops=flops)
    if _config.CONFIG.debug >= 2:
        print(f"clops: provider call {name} ({provider} {op}) on {device.name}",
              file=sys.stderr)
    return Event(ev, q)
