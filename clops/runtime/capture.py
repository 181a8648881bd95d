"""Runtime, capture: what a capture records (``Capture``), and the seam's calls into the captures
open on this thread (``scope.py`` keeps which are open). The launch seam asks ``capturing()``
first on its hot path (one integer read while none is open) and hands each enqueue it may replay
to ``record``; an enqueue it cannot replay, to ``refuse``.

>>> with capture() as cap:
...     ...               # every enqueue of this thread is recorded in cap.commands
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from . import scope
from .scope import capturing, paused  # noqa: F401 - the capture's names, as the seam imports them

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

    def note_alloc(self, buf: Buffer) -> None:
        self.allocated.add(buf)

    def refuse(self, what: str) -> None:
        if self.refused is not None:
            return
        msg = (f"a capture (clops.jit, clops.launches(capture=True)) cannot record {what}: "
               "a replay could not repeat it. Keep the captured work on the device (return "
               "tensors and read them after the call or block), with shapes that depend only "
               "on the arguments' shapes")
        if self.strict:
            raise JitError(msg)
        self.refused = what
        self.commands.clear()


def active() -> list[Capture]:
    """The captures recording this thread's enqueues now (innermost last; none while paused)."""
    return cast(list[Capture], scope.captures())


def record(device: Device | None, command: Any) -> None:
    """Add ``command`` (enqueued on ``device``) to every capture open here."""
    for cap in scope.captures():
        cap.add(device, command)


def refuse(what: str) -> None:
    """Called where an enqueue cannot be replayed: refuses every capture open here."""
    for cap in scope.captures():
        cap.refuse(what)


def note_alloc(buf: Buffer) -> None:
    """A buffer allocated during the captures open here (a replay allocates its own)."""
    for cap in scope.captures():
        cap.note_alloc(buf)


@contextlib.contextmanager
def capture(strict: bool = True) -> Iterator[Capture]:
    """Record this thread's enqueues (nested captures each record them all): a launch scope
    with a capture alone (``clops.launches(capture=True)``), which this yields."""
    cap = Capture(strict)
    with scope.LaunchScope(capture=cap):
        yield cap
