"""Runtime, capture: whether a ``clops.jit`` capture is open, and what it records. The launch
seam asks ``capturing()`` first on its hot path (one integer read while none is open) and hands
each enqueue it may replay to ``record``; an enqueue it cannot replay, to ``refuse``.

>>> with capture() as cap:
...     ...               # every enqueue of this thread is recorded in cap.commands
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .pool import Buffer
    from .protocols import Device


class JitError(RuntimeError):
    """A ``clops.jit`` function did something a replay could not repeat (read a value back to
    the host, made a shape that depends on the data, ...). The message names the op."""


class Capture:
    """What a function enqueued, in order, while it ran once (``with capture() as cap:``).

    ``commands`` holds (device, command) pairs, a command being one of ``plan.Command``.
    ``allocated`` holds the buffers allocated meanwhile (a replay makes its own outputs; every
    other buffer is the same memory on every replay). A command that cannot be recorded
    refuses the capture:
    ``strict`` raises ``JitError`` at once, otherwise ``refused`` says what and the rest of the
    run goes on uncaptured (eager)."""

    def __init__(self, strict: bool = True) -> None:
        self.commands: list[tuple[Any, Any]] = []
        self.allocated: weakref.WeakSet[Buffer] = weakref.WeakSet()
        self.strict = strict
        self.refused: str | None = None

    def add(self, device: Device | None, command: Any) -> None:
        if self.refused is None:
            self.commands.append((device, command))

    def refuse(self, what: str) -> None:
        if self.refused is not None:
            return
        msg = (f"clops.jit cannot capture {what}: a replay could not repeat it. Keep the "
               "function on the device (return tensors and read them after the call), with "
               "shapes that depend only on the arguments' shapes")
        if self.strict:
            raise JitError(msg)
        self.refused = what
        self.commands.clear()


class _State(threading.local):
    def __init__(self) -> None:
        self.captures: list[Capture] = []
        self.paused = 0


_STATE = _State()
# (a one-item list: the functions below change it in place)
_ACTIVE = [0]  # captures open on any thread: the seam's hot path tests this first
_ACTIVE_LOCK = threading.Lock()


def capturing() -> bool:
    """Whether a capture is open on any thread (the cheap test before ``active()``)."""
    return bool(_ACTIVE[0])


def active() -> list[Capture]:
    """The captures recording this thread's enqueues now (innermost last; none while paused)."""
    if not _ACTIVE[0]:
        return []
    st = _STATE
    return st.captures if st.captures and not st.paused else []


def record(device: Device | None, command: Any) -> None:
    """Add ``command`` (enqueued on ``device``) to every capture open here."""
    for cap in active():
        cap.add(device, command)


def refuse(what: str) -> None:
    """Called where an enqueue cannot be replayed: refuses every capture open here."""
    for cap in active():
        cap.refuse(what)


def note_alloc(buf: Buffer) -> None:
    """A buffer allocated during the captures open here (a replay allocates its own)."""
    for cap in active():
        cap.allocated.add(buf)


@contextlib.contextmanager
def capture(strict: bool = True) -> Iterator[Capture]:
    """Record this thread's enqueues (nested captures each record them all)."""
    cap = Capture(strict)
    st = _STATE
    st.captures.append(cap)
    with _ACTIVE_LOCK:
        _ACTIVE[0] += 1
    try:
        yield cap
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE[0] -= 1
        st.captures.remove(cap)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Work that is not part of the captured function (measuring a provider, say)."""
    st = _STATE
    st.paused += 1
    try:
        yield
    finally:
        st.paused -= 1
