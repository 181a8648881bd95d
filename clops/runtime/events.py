"""Runtime, events: a completion handle for enqueued work that can be waited on, polled, turned
into a ``concurrent.futures.Future`` or awaited in asyncio."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any

import pyopencl as cl

_COMPLETE = cl.command_execution_status.COMPLETE


class _Watcher:
    """One background thread that waits on events whose callbacks cannot be registered (or are
    known to be unreliable on a driver) and resolves their futures in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._todo: list[tuple[cl.Event, Callable[[], None]]] = []
        self._thread: threading.Thread | None = None

    def add(self, event: cl.Event, callback: Callable[[], None]) -> None:
        with self._cv:
            self._todo.append((event, callback))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="clops-events", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._todo:
                    if not self._cv.wait(timeout=5.0):
                        self._thread = None
                        return
                event, callback = self._todo.pop(0)
            try:
                event.wait()
            except cl.Error:
                pass  # a failed command is still finished; its owner sees the status
            try:
                callback()
            except Exception:  # noqa: BLE001 - one bad callback must not stop the others
                pass


_WATCHER = _Watcher()
# Drivers whose completion callbacks are not to be trusted get the watcher instead.
CALLBACKS_UNRELIABLE: set[str] = set()


# Driver callbacks registered and not yet run. pyopencl runs each on a thread of its own that
# takes the GIL; one that fires once the interpreter is finalizing ends that thread inside
# C++ code that may not be unwound, and the process aborts (seen with Intel's CPU runtime and
# a foreign queue's fill completing at exit). Exit therefore waits for them a little.
_PENDING: dict[int, threading.Event] = {}
_PENDING_LOCK = threading.Lock()
_EXIT_WAIT_S = 5.0
_EXIT_HOOK = [False]  # whether _drain_callbacks is registered with atexit


def _drain_callbacks(timeout: float = _EXIT_WAIT_S) -> int:
    """Wait up to ``timeout`` seconds for the pending driver callbacks to run; the number
    still pending (work that never completes, such as a user event never set)."""
    end = time.monotonic() + timeout
    while True:
        with _PENDING_LOCK:
            waiting = list(_PENDING.values())
        if not waiting:
            return 0
        left = end - time.monotonic()
        if left <= 0:
            return len(waiting)
        waiting[0].wait(min(left, 0.05))


def _register(key: int, fired: threading.Event) -> None:
    with _PENDING_LOCK:
        if not _EXIT_HOOK[0]:
            atexit.register(_drain_callbacks)
            _EXIT_HOOK[0] = True
        _PENDING[key] = fired


def _resolve(future: concurrent.futures.Future[Any], value: Any) -> None:
    if not future.done():
        try:
            future.set_result(value() if callable(value) else value)
        except BaseException as e:  # noqa: BLE001 - handed to the future's owner
            future.set_exception(e)


class Event:
    """Completion of enqueued device work.

    >>> ev = clops.device().queue.marker()
    >>> ev.wait(); ev.done
    True
    """

    __slots__ = ("cl_event", "queue", "_future")

    def __init__(self, cl_event: cl.Event | None, queue: Any = None) -> None:
        self.cl_event = cl_event
        self.queue = queue  # the CLQueue it was enqueued on, for flushing
        self._future: concurrent.futures.Future[Any] | None = None

    def wait(self) -> Event:
        if self.cl_event is not None:
            self.cl_event.wait()
        return self

    @property
    def done(self) -> bool:
        if self.cl_event is None:
            return True
        status = self.cl_event.command_execution_status
        if status < 0:
            raise RuntimeError(f"device work failed with OpenCL status {status}")
        return status == _COMPLETE

    def future(self, value: Any = None) -> concurrent.futures.Future[Any]:
        """A future that completes with ``value`` (or ``value()``, called then) once the device
        work is done. The queue is flushed so that the work really starts."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self.cl_event is None:
            _resolve(fut, value)
            return fut
        when_done(self, lambda: _resolve(fut, value))
        return fut

    def __await__(self) -> Generator[Any, None, Event]:
        yield from asyncio.wrap_future(self.future()).__await__()
        return self

    def profile_ns(self) -> tuple[int, int, int]:
        """(queued, start, end) device timestamps in ns; needs a profiling queue."""
        if self.cl_event is None:
            raise ValueError("this event stands for no device work and has no timestamps")
        p = self.cl_event.profile
        return p.queued, p.start, p.end

    def __repr__(self) -> str:
        return f"<clops.Event {'done' if self.done else 'pending'}>"


def when_done(event: Event, callback: Callable[[], None]) -> None:
    """Call ``callback`` (on some thread) once ``event`` completes."""
    ev = event.cl_event
    if ev is None:
        callback()
        return
    platform = event.queue.device.platform_name if event.queue is not None else ""
    fired = threading.Event()
    key = id(fired)

    started = [False]

    def once(_status: int = 0) -> None:
        with _PENDING_LOCK:
            if started[0]:
                return
            started[0] = True
        try:
            callback()
        finally:
            with _PENDING_LOCK:
                _PENDING.pop(key, None)
            fired.set()

    if platform in CALLBACKS_UNRELIABLE:
        _WATCHER.add(ev, once)
    else:
        _register(key, fired)
        try:
            ev.set_callback(_COMPLETE, once)
        except (cl.Error, AttributeError):
            with _PENDING_LOCK:
                _PENDING.pop(key, None)
            _WATCHER.add(ev, once)
    # NOTE: without a flush, some drivers never submit the command and the callback never fires.
    if event.queue is not None:
        event.queue.flush()


def wait_all(events: Iterable[Event | None]) -> None:
    """Wait for every event (``None`` and work-less events are skipped), on any devices."""
    evs = [e.cl_event for e in events if e is not None and e.cl_event is not None]
    if not evs:
        return
    try:
        cl.wait_for_events(evs)
    except cl.LogicError:
        # One clWaitForEvents call takes events of one context only: events of several
        # devices are waited for one at a time.
        for ev in evs:
            ev.wait()


def gather(*events: Event) -> concurrent.futures.Future[list[Event]]:
    """One future for several events."""
    fut: concurrent.futures.Future[list[Event]] = concurrent.futures.Future()
    remaining = [len(events)]
    lock = threading.Lock()
    if not events:
        fut.set_result([])
        return fut

    def one() -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            _resolve(fut, list(events))

    for e in events:
        when_done(e, one)
    return fut
