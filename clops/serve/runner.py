"""serve, runner: one thread drives the model's ``BatchEngine`` step after step; requests from the
asyncio side are queued to it and get their tokens back through per-request asyncio queues.

Everything that touches the engine (adding, cancelling, embedding, advancing a constraint
after its token) runs on that thread between steps, so the engine needs no locking of its own
and a cancelled request's slot and cache blocks are free before the next step begins.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..llm.batch import BatchEngine, SamplingParams, StepOutput


def _put_all(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for q, item in items:
        q.put_nowait(item)


class QueueFull(Exception):
    """More requests are waiting than the server takes (HTTP 429)."""


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
    raises ``QueueFull``."""

    def __init__(self, engine: BatchEngine, queue_limit: int = 64) -> None:
        self.engine = engine
        self.queue_limit = queue_limit
        self.stats = Stats()
        self._jobs: queue.Queue[Callable[[], None]] = queue.Queue()
        self._handles: dict[int, Handle] = {}
        self._stop = False
        self._waiting = 0  # sequences submitted and not yet given a token (approximate)
        self._thread = threading.Thread(target=self._loop, name="clops-serve-engine",
                                        daemon=True)
        self._thread.start()

    # -- called from the asyncio side -----------------------------------------------------------
    def _call(self, fn: Callable[[], Any]) -> Future:
        fut: Future = Future()

        def job() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

        self._jobs.put(job)
        return fut

    async def submit(self, ids: list[int], params: SamplingParams, max_new: int,
                     mask: Callable[[int], np.ndarray | None] | None = None,
                     on_token: Callable[[int], None] | None = None) -> Handle:
        """Queue a sequence; its StepOutputs arrive on the handle's queue."""
        # (not engine.stats(): it waits for the engine's lock, which a step holds, and this
        # runs on the event loop that streams every other request's tokens)
        waiting = self.engine.waiting() + self._jobs.qsize()
        if waiting >= self.queue_limit:
            raise QueueFull(f"{waiting} requests are already waiting for a slot (the "
                            f"limit is {self.queue_limit}): retry later")
        loop = asyncio.get_running_loop()
        h = Handle(loop, asyncio.Queue(), on_token=on_token)

        def add() -> int:
            seq = self.engine.add(ids, params, max_new, mask)
            h.seq = seq
            self._handles[seq] = h
            return seq

        await asyncio.wrap_future(self._call(add))
        return h

    def cancel(self, h: Handle) -> None:
        """Drop the sequence (client gone, stop token or string seen); idempotent."""
        if h.done:
            return
        h.done = True

        def drop() -> None:
            self._handles.pop(h.seq, None)
            self.engine.cancel(h.seq)

        self._call(drop)

    async def embed(self, ids: list[int]) -> np.ndarray:
        return await asyncio.wrap_future(self._call(lambda: self.engine.embed(ids)))

    async def engine_stats(self) -> dict[str, int]:
        return await asyncio.wrap_future(self._call(self.engine.stats))

    def close(self) -> None:
        self._stop = True
        self._jobs.put(lambda: None)
        self._thread.join(timeout=30)

    # -- the engine's thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop:
            block = not self.engine.has_work()
            try:
                job = self._jobs.get(block=block, timeout=None if block else 0)
                job()
                while True:  # every queued job before the next step
                    self._jobs.get_nowait()()
            except queue.Empty:
                pass
            if self._stop or not self.engine.has_work():
                continue
            try:
                outs = self.engine.step()
            except Exception as e:  # noqa: BLE001 - every request in flight hears of it
                self._fail_all(e)
                continue
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
            loop.call_soon_threadsafe(_put_all, items)

    def _deliver(self, o: StepOutput,
                 by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]],
                 ) -> None:
        h = self._handles.get(o.seq)
        if h is None:
            return
        items = by_loop.setdefault(h.loop, [])
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

    def _fail_all(self, e: Exception) -> None:
        for seq, h in list(self._handles.items()):
            self.engine.cancel(seq)
            h.loop.call_soon_threadsafe(h.queue.put_nowait, e)
        self._handles.clear()
