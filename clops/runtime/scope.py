"""Runtime, the launch seam's scopes: the one record of which launch scopes are open, and what they
ask of the commands the seam enqueues inside them: recorded by a capture, timed by a profiler,
and, always, dependency-tracked. The seam asks it on each enqueue (``capturing()``,
``captures()``, ``profiling()``, ``profilers()``); nothing else keeps this state.

A scope's capture takes the commands of the thread that opened it (a capture is one function's
work, as CUDA graph capture in its thread-local mode); its profiler takes those of every thread
(the device's timeline is the process's, as torch.profiler's device activity).

>>> with clops.launches(capture=True, profile=True) as scope:   # a LaunchScope
...     ...          # this thread's commands in scope.capture, every thread's in scope.profiler
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol


class CaptureSink(Protocol):
    """What the seam hands a capture (``capture.Capture``)."""

    def add(self, device: Any, command: Any) -> None: ...

    def refuse(self, what: str) -> None: ...

    def note_alloc(self, buf: Any) -> None: ...


class ProfileSink(Protocol):
    """What the seam hands a profiler (``profiler.Profiler``)."""

    def add(self, name: str, kind: str, device: str, event: Any, nbytes: int = 0,
            queue: int = 0, **extra: Any) -> None: ...


@dataclass(frozen=True, eq=False)
class LaunchScope:
    """What one ``with`` block asks of the launch seam for the commands (launches, copies,
    writes, provider calls) enqueued inside it: ``capture`` records those this thread enqueues,
    ``profiler`` times those of every thread; either may be ``None``. Scopes nest, in any order
    and on several threads: every open scope gets each command it covers. Leaving the block,
    by an exception too, closes this scope alone. A scope is open at most once at a time.

    ``clops.launches(capture=, profile=)`` makes one; ``clops.profile()`` and the capture of
    ``clops.jit`` open one each.

    >>> with clops.launches(capture=True, profile=True) as scope:
    ...     b = (a * 2).realize()       # a realized before: one launch
    >>> len(scope.capture.commands), scope.profiler.kernel_count, scope.tracked
    (1, 1, True)
    """

    capture: CaptureSink | None = None
    profiler: ProfileSink | None = None

    @property
    def tracked(self) -> bool:
        """Whether the seam tracks the scope's commands as it does outside any scope (each
        waits for the pending work on its buffers and leaves its event there): always true.
        A scope cannot turn tracking off: the buffer pool hands a freed buffer to new work, and
        a read to the host returns, only once the work recorded on the buffer is done; a
        command that left no event would let its buffer be reused or read while the device
        still wrote it, and one that waited for none would race the work before it on another
        queue. The enqueues the seam does not track are a ``LaunchPlan``'s replays, which own
        their buffers on one in-order queue, inside a scope as outside (inside a capture they
        are recorded, and tracked, launch by launch)."""
        return True

    def __enter__(self) -> LaunchScope:
        _OPEN.enter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _OPEN.leave(self)


class _ThisThread(threading.local):
    def __init__(self) -> None:
        self.captures: list[CaptureSink] = []  # innermost last
        self.paused = 0


class _Open:
    """The open scopes: their profilers (every thread's commands), the captures of each thread
    and how many captures are open on any thread (the seam's first test: one integer read)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # NOTE: replaced whole, never changed in place: the seam reads it without the lock
        self.profilers: tuple[ProfileSink, ...] = ()
        self.capture_count = 0
        self.here = _ThisThread()
        # open scope (by identity) -> the capture list of the thread that opened it (None: no
        # capture)
        self.scopes: dict[LaunchScope, list[CaptureSink] | None] = {}

    def enter(self, scope: LaunchScope) -> None:
        with self.lock:
            if scope in self.scopes:
                raise RuntimeError("this launch scope is open already: make another")
            captures = None
            if scope.capture is not None:
                captures = self.here.captures
                captures.append(scope.capture)
                self.capture_count += 1
            if scope.profiler is not None:
                self.profilers = (*self.profilers, scope.profiler)
            self.scopes[scope] = captures

    def leave(self, scope: LaunchScope) -> None:
        with self.lock:
            if scope not in self.scopes:
                return  # never opened, or closed already
            captures = self.scopes.pop(scope)
            if captures is not None:
                _drop(captures, scope.capture)
                self.capture_count -= 1
            if scope.profiler is not None:
                kept = list(self.profilers)
                _drop(kept, scope.profiler)
                self.profilers = tuple(kept)


def _drop(items: list[Any], item: Any) -> None:
    """Remove the last occurrence of ``item`` itself (not of an equal one) from ``items``."""
    for i in range(len(items) - 1, -1, -1):
        if items[i] is item:
            del items[i]
            return


_OPEN = _Open()


# -- what the seam asks ---------------------------------------------------------------------------
def capturing() -> bool:
    """Whether a capture is open on any thread (the cheap test before ``captures()``)."""
    return _OPEN.capture_count > 0


def captures() -> list[CaptureSink]:
    """The captures taking this thread's commands now, innermost last (none while paused)."""
    if not _OPEN.capture_count:
        return []
    here = _OPEN.here
    return list(here.captures) if here.captures and not here.paused else []


def profiling() -> bool:
    """Whether a profiler is open (on any thread: each takes every thread's commands)."""
    return bool(_OPEN.profilers)


def profilers() -> tuple[ProfileSink, ...]:
    """The profilers open now."""
    return _OPEN.profilers


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """This thread's commands inside the block are not captured (work that is not part of the
    captured function: measuring a provider, say); profilers still take them."""
    here = _OPEN.here
    here.paused += 1
    try:
        yield
    finally:
        here.paused -= 1
