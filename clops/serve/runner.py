"""serve, runner: one thread drives the model's ``BatchEngine`` step after step; requests from the
asyncio side are queued to it and get their tokens back through per-request asyncio queues.

Everything that touches the engine (adding, cancelling, embedding, advancing a constraint
after its token) runs on that thread between steps, so the engine needs no locking of its own
and a cancelled request's slot and cache blocks are free before the next step begins.

The thread outlives any one request: a request that fails (its constraint, its sampling) fails
alone; a step that fails fails the requests in it and the thread goes on. Should the thread
itself die (an error outside any request), every waiting caller hears of it at once, ``health``
says so, and ``on_death`` is called (``clops serve`` then exits non-zero).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..llm.batch import BatchEngine, SamplingParams, StepOutput

# A step that has not ended after this long while work waits: the engine is reported stalled.
STALL_SECONDS = 120.0
# Steps failed one after another before the engine is reported unable to serve (one failed
# step is a request's bad luck; several in a row, a device that no longer works)
FAILED_STEPS_DOWN = 3


def _put_all(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for q, item in items:
        q.put_nowait(item)


class QueueFull(Exception):
    """More requests are waiting than the server takes (HTTP 429)."""


class EngineDown(RuntimeError):
    """The engine's thread has stopped: nothing more can be generated (HTTP 503)."""


@dataclass
class Handle:
    """A sequence in flight: its outputs arrive on ``queue`` (a StepOutput, or an Exception)."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    seq: int = -1
    on_token: Callable[[int], None] | None = None  # called on the engine thread per token
    done: bool = False


@dataclass
class Stats:
    requests: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    disconnects: int = 0
    failed_steps: int = 0
    tokens_window: deque = field(default_factory=lambda: deque(maxlen=256))

    def rate(self) -> float:
        """Generated tokens per second over the last 10 s."""
        now = time.monotonic()
        recent = [(t, n) for t, n in self.tokens_window if now - t <= 10.0]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1e-3)
        return sum(n for _, n in recent) / span


class Runner:
    """The engine's thread. ``queue_limit`` sequences may wait for a slot; past it ``submit``
    raises ``QueueFull``. ``on_death(error)`` is called (on the engine thread) if the thread
    ever stops for an error."""

    def __init__(self, engine: BatchEngine, queue_limit: int = 64,
                 on_death: Callable[[BaseException], None] | None = None) -> None:
        self.engine = engine
        self.queue_limit = queue_limit
        self.on_death = on_death
        self.stats = Stats()
        self.failure: BaseException | None = None  # why the thread stopped, if it did
        self.last_step_error: str | None = None  # the last step's error, until one succeeds
        self.failed_in_row = 0
        # jobs for the thread, and a flag raised with each (the thread waits on it when idle).
        # PERF: a deque read without a lock between steps, not a queue.Queue whose empty get
        # took its lock and raised queue.Empty every step (1.1 us hot, on the path from a
        # step's tokens to the next step)
        self._jobs: deque[tuple[Future, Callable[[], Any]]] = deque()
        self._jobs_flag = threading.Event()
        self._life = threading.Lock()  # a job is queued only while the thread serves
        self._handles: dict[int, Handle] = {}
        self._stop = False
        self._step_started: float | None = None  # monotonic time of the step running now
        self._thread = threading.Thread(target=self._main, name="clops-serve-engine",
                                        daemon=True)
        self._thread.start()

    # -- called from the asyncio side -----------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.failure is None

    def health(self) -> tuple[bool, str]:
        """(serving, why not): the thread runs, no step has run past ``STALL_SECONDS``, and
        the last ``FAILED_STEPS_DOWN`` steps have not all failed."""
        if not self.alive:
            why = f"{type(self.failure).__name__}: {self.failure}" if self.failure else \
                "stopped"
            return False, f"the engine thread has stopped ({why})"
        started = self._step_started
        if started is not None and time.monotonic() - started > STALL_SECONDS:
            return False, (f"the engine's step has run for {time.monotonic() - started:.0f} s "
                           "(stalled)")
        if self.failed_in_row >= FAILED_STEPS_DOWN:
            return False, (f"the last {self.failed_in_row} steps failed ({self.last_step_error})")
        return True, ""

    def _call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on the engine's thread between steps. A future cancelled before its turn
        (its caller gone) is skipped; one whose ``fn`` already runs is left to finish."""
        fut: Future = Future()
        with self._life:
            if not self.alive:
                fut.set_exception(self._down())
            else:
                self._jobs.append((fut, fn))
                self._jobs_flag.set()
        return fut

    def _down(self) -> EngineDown:
        return EngineDown(self.health()[1] or "the engine thread has stopped")

    async def submit(self, ids: list[int], params: SamplingParams, max_new: int,
                     mask: Callable[[int], np.ndarray | None] | None = None,
                     on_token: Callable[[int], None] | None = None) -> Handle:
        """Queue a sequence; its StepOutputs arrive on the handle's queue."""
        if not self.alive:
            raise self._down()
        # (not engine.stats(): it waits for the engine's lock, which a step holds, and this
        # runs on the event loop that streams every other request's tokens)
        waiting = self.engine.waiting() + len(self._jobs)
        if waiting >= self.queue_limit:
            raise QueueFull(f"{waiting} requests are already waiting for a slot (the "
                            f"limit is {self.queue_limit}): retry later")
        loop = asyncio.get_running_loop()
        h = Handle(loop, asyncio.Queue(), on_token=on_token)

        def add() -> int:
            seq = self.engine.add(ids, params, max_new, mask)
            h.seq = seq
            if h.done:  # cancelled meanwhile (see below): never let it run
                self.engine.cancel(seq)
            else:
                self._handles[seq] = h
            return seq

        fut = self._call(add)
        try:
            # shielded: a caller that goes away must not leave ``add`` half done; its
            # sequence is dropped instead, by the job queued after it
            await asyncio.shield(asyncio.wrap_future(fut))
        except asyncio.CancelledError:
            self.cancel(h)
            raise
        return h

    def cancel(self, h: Handle) -> None:
        """Drop the sequence (client gone, stop token or string seen); idempotent."""
        if h.done:
            return
        h.done = True

        def drop() -> None:
            if h.seq >= 0:
                self._handles.pop(h.seq, None)
                self.engine.cancel(h.seq)

        self._call(drop)

    async def embed(self, ids: list[int]) -> np.ndarray:
        return await asyncio.wrap_future(self._call(lambda: self.engine.embed(ids)))

    async def engine_stats(self, timeout: float = 30.0) -> dict[str, int]:
        """The engine's counters, read between steps; ``EngineDown`` if the thread has
        stopped or does not answer within ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self._call(self.engine.stats)),
                                          timeout)
        except TimeoutError:
            raise EngineDown(f"the engine did not answer within {timeout:.0f} s") from None

    def close(self) -> None:
        self._stop = True
        self._jobs_flag.set()
        self._thread.join(timeout=30)

    # -- the engine's thread -----------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - the thread is ending: say why, everywhere
            with self._life:
                self.failure = e
            print("clops serve: the engine thread stopped:", file=sys.stderr)
            traceback.print_exception(e, file=sys.stderr)
            self._fail_all(EngineDown(f"the engine thread has stopped ({type(e).__name__}: "
                                      f"{e})"))
            self._fail_jobs()
            if self.on_death is not None:
                try:
                    self.on_death(e)
                except Exception:  # noqa: BLE001 - nothing more to do on a dying thread
                    traceback.print_exc()

    def _loop(self) -> None:
        while not self._stop:
            if not self._jobs and not self.engine.has_work():
                self._jobs_flag.wait()
            # (lowered before the jobs are read: one queued after it raises it again)
            self._jobs_flag.clear()
            while self._jobs:  # every queued job before the next step
                _run(*self._jobs.popleft())
            if self._stop or not self.engine.has_work():
                continue
            self._step_started = time.monotonic()
            try:
                outs = self.engine.step()
            except Exception as e:  # noqa: BLE001 - every request in the step hears of it
                self.stats.failed_steps += 1
                self.failed_in_row += 1
                self.last_step_error = f"{type(e).__name__}: {e}"
                self._fail_all(e)
                continue
            finally:
                self._step_started = None
            self.last_step_error, self.failed_in_row = None, 0
            if outs:
                self.stats.tokens_window.append((time.monotonic(), len(outs)))
            # one wake-up of each event loop for the step's tokens, not one per token
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
            for o in outs:
                self._deliver(o, by_loop)
            self._hand_over(by_loop)

    def _hand_over(self, by_loop: dict[asyncio.AbstractEventLoop,
                                       list[tuple[asyncio.Queue, Any]]]) -> None:
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that event loop is closed: its requests are gone
                for q in {id(q): q for q, _ in items}.values():
                    self._forget_queue(q)

    def _forget_queue(self, q: asyncio.Queue) -> None:
        for seq, h in list(self._handles.items()):
            if h.queue is q:
                self._handles.pop(seq, None)
                self.engine.cancel(seq)

    def _deliver(self, o: StepOutput,
                 by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]],
                 ) -> None:
        h = self._handles.get(o.seq)
        if h is None:
            return
        items = by_loop.setdefault(h.loop, [])
        if o.error is not None:  # this sequence failed alone (the engine let it go)
            self._handles.pop(o.seq, None)
            items.append((h.queue, o.error))
            return
        if h.on_token is not None and not o.finished:
            try:
                h.on_token(o.token)
            except Exception as e:  # noqa: BLE001 - a constraint that cannot go on
                self._handles.pop(o.seq, None)
                self.engine.cancel(o.seq)
                items += [(h.queue, o), (h.queue, e)]
                return
        if o.finished:
            self._handles.pop(o.seq, None)
        items.append((h.queue, o))

    def _fail_all(self, e: BaseException) -> None:
        for seq, h in list(self._handles.items()):
            try:
                self.engine.cancel(seq)
            except Exception:  # noqa: BLE001 - the engine may be what failed
                pass
            try:
                h.loop.call_soon_threadsafe(h.queue.put_nowait, e)
            except RuntimeError:  # its event loop is closed
                pass
        self._handles.clear()

    def _fail_jobs(self) -> None:
        """Jobs still queued when the thread stops: their callers hear why, not nothing."""
        while True:
            try:
                fut, _ = self._jobs.popleft()
            except IndexError:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(self._down())


def _run(fut: Future, fn: Callable[[], Any]) -> None:
    """One job: skipped if its caller cancelled it while it waited."""
    if not fut.set_running_or_notify_cancel():
        return
    try:
        result = fn()
    except BaseException as e:  # noqa: BLE001 - handed to the caller
        fut.set_exception(e)
    else:
        fut.set_result(result)
