"""Runtime, the launch seam's commands: what clops enqueues (``Launch``, ``Copy``, ``Write``, a
provider ``Call``) as a capture records and replays them, and ``LaunchPlan`` (launches replayed
with their arguments set once).

Every enqueue clops makes goes through one of ``CLDevice.launch`` / ``copy`` / ``write`` /
``read`` (``launch.py``, ``memory.py``: generated kernels, hand kernels, custom kernels, a CPU
device's native kernels (``nativekernel``), transfers), ``LaunchPlan.replay`` (the LLM's decode
and prompt steps) or ``providers.base.guarded_call`` (vendor libraries). Each of them asks the
open launch scopes (``scope.py``) once: a launch, copy or host-to-device write is recorded by
this thread's captures (``capture.py``, whose names this module also gives); a device-to-host
read, or a provider call that is not recorded as a whole ``Call``, is refused; what ran is
timed by the profilers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from . import program, rawenqueue
from .capture import (  # noqa: F401 - the capture's names, as the layers above import them
    Capture,
    JitError,
    active,
    capture,
    capturing,
    note_alloc,
    paused,
    record,
    refuse,
)
from .nativekernel import NativeKernel
from .pool import Buffer

if TYPE_CHECKING:
    from .events import Event
    from .protocols import Device, Queue


# -- the commands ---------------------------------------------------------------------------------
Sub = Callable[[Any], Any]  # a buffer of the capture -> the buffer of this replay


@dataclass
class Launch:
    """One kernel launch: what it runs, over what geometry, on which buffers."""

    kernel: Any
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    args: list[Any]
    reads: Sequence[Buffer] = ()
    writes: Sequence[Buffer] = ()
    name: str = ""
    queue: Queue | None = None

    def run(self, dev: Device, queue: Queue | None = None,
            wait_for: Sequence[Any] = ()) -> Event:
        """Enqueue now through the device's tracked launch path."""
        return dev.launch(self.kernel, self.global_size, self.local_size, self.args,
                          reads=self.reads, writes=self.writes, queue=queue or self.queue,
                          wait_for=wait_for, name=self.name or None)

    def run_once(self, dev: Device, queue: Queue | None = None) -> Event:
        """``run``, for a launch made to run once and then be dropped (an eager op's): its
        kernel object then goes back to ``program.new_kernel`` for the next such launch,
        saving pyopencl's ~0.1 ms to make one (unless a clops.jit capture is open anywhere:
        the capture keeps the object)."""
        ev = self.run(dev, queue)
        if not capturing():
            program.release_kernel(self.kernel, self.args)
        return ev

    def replay(self, dev: Device, sub: Sub) -> None:
        dev.launch(self.kernel, self.global_size, self.local_size, [sub(a) for a in self.args],
                   reads=[sub(b) for b in self.reads], writes=[sub(b) for b in self.writes],
                   queue=self.queue, name=self.name or None)


@dataclass
class Copy:
    """A device-to-device copy of ``nbytes``."""

    dst: Buffer
    src: Buffer
    nbytes: int
    dst_offset: int = 0
    src_offset: int = 0
    queue: Queue | None = None

    @property
    def writes(self) -> tuple[Buffer]:
        return (self.dst,)

    def replay(self, dev: Device, sub: Sub) -> None:
        dev.copy(sub(self.dst), sub(self.src), self.nbytes, self.dst_offset, self.src_offset,
                 queue=self.queue)


@dataclass
class Write:
    """A host-to-device copy of data fixed at capture (a constant the function made)."""

    buf: Buffer
    host: np.ndarray
    offset: int = 0
    queue: Queue | None = None

    @property
    def writes(self) -> tuple[Buffer]:
        return (self.buf,)

    def replay(self, dev: Device, sub: Sub) -> None:
        dev.write(sub(self.buf), self.host, self.offset, queue=self.queue)


@dataclass
class Call:
    """A call replayed as a whole (a vendor library's op): ``fn(*args, **kwargs)`` with the
    buffers inside the arguments (also inside dataclasses, tuples, lists and dicts) replaced."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    writes: Sequence[Buffer] = ()
    name: str = ""

    def replay(self, dev: Device | None, sub: Sub) -> None:
        call(self.fn, *map_buffers(self.args, sub), writes=map_buffers(self.writes, sub),
             name=self.name, **map_buffers(self.kwargs, sub))


# a capture's commands: what the seam records and a replay enqueues again
Command = Launch | Copy | Write | Call


@dataclass(frozen=True)
class Slot:
    """Stands for a buffer that each replay gives anew: an argument's (``"in"``) or a fresh
    output's (``"out"``)."""

    kind: str
    index: int


def map_buffers(obj: Any, sub: Sub) -> Any:
    """``obj`` with every ``Buffer`` (or ``Slot``) in it replaced by ``sub(buffer)``."""
    if isinstance(obj, Buffer | Slot):
        return sub(obj)
    if isinstance(obj, tuple):
        return tuple(map_buffers(o, sub) for o in obj)
    if isinstance(obj, list):
        return [map_buffers(o, sub) for o in obj]
    if isinstance(obj, dict):
        return {k: map_buffers(v, sub) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changed = {f.name: map_buffers(getattr(obj, f.name), sub)
                   for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changed)
    return obj


def call(fn: Callable[..., Any], *args: Any, writes: Sequence[Buffer] = (), name: str = "",
         **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` now; where a capture is open, record it as one ``Call`` command
    (a replay calls it again on its own buffers) instead of the enqueues it makes."""
    caps = active()
    if not caps:
        return fn(*args, **kwargs)
    command = Call(fn, args, kwargs, tuple(writes), name)
    for cap in caps:
        cap.add(None, command)
    with paused():
        return fn(*args, **kwargs)


# -- launch plans ---------------------------------------------------------------------------------
@dataclass
class LaunchPlan:
    """A fixed list of launches on one in-order queue, with arguments set once.

    ``replay()`` costs one enqueue per launch and nothing else: sizes, positions and sampling
    parameters that change between steps live in device buffers the kernels read. From the
    second replay on, where the device records command buffers, a replay is one enqueue in all
    (a plan replayed once, such as a prompt of a length not seen again, or of one launch, is
    never recorded). A plan owns its buffers: its launches are not dependency-tracked; inside
    a capture they are recorded (and replayed) one by one, tracked.
    """

    device: Device
    launches: list[Launch] = field(default_factory=list)
    _ready: bool = False
    _prepared: Any = None
    _replays: int = 0
    _resized: bool = False

    def add(self, launch: Launch) -> None:
        self.launches.append(launch)
        self._ready = False

    def _prepare(self, recording: bool) -> None:
        for ln in self.launches:
            ln.kernel.set_args(*[a.mem if isinstance(a, Buffer) else a for a in ln.args])
        self._prepared = self.device.prepare_launches(
            [(ln.kernel, ln.global_size, ln.local_size, ln.name) for ln in self.launches],
            record=recording)
        self._ready = True

    @property
    def recorded(self) -> bool:
        """Whether replays go through one command buffer."""
        return self._ready and self._prepared.recorded is not None

    def replay(self) -> None:
        """Enqueue every launch in order on the device's default queue."""
        if active():
            for ln in self.launches:
                ln.run(self.device, queue=self.device.queue)
            return
        # a single launch gains nothing from a recording, nor a plan resized between replays
        worth = len(self.launches) > 1 and not self._resized
        if not self._ready:
            self._prepare(recording=self._replays > 0 and worth)
        elif self._replays == 1 and worth:
            self._prepare(recording=True)
        self._replays += 1
        self.device.enqueue_prepared(self._prepared)

    def resize(self, changes: Sequence[tuple[int, Sequence[tuple[int, Any]], Sequence[int]]]
               ) -> None:
        """Give launches new scalar arguments and global sizes for the next replays: each
        change is (launch index, [(argument position, value)], global size). A batched step
        whose row count changes reuses its plan this way; only the changed arguments are set
        again, and a plan once resized is never recorded (a recording holds its sizes).

        >>> plan.resize([(0, [(3, np.int32(rows))], (rows, 64))])
        """
        self._resized = True
        if self._ready and self._prepared.recorded is not None:
            self._ready = False  # made again, unrecorded, at the next replay
        for index, args, gsize in changes:
            ln = self.launches[index]
            for position, value in args:
                ln.args[position] = value
                if self._ready:
                    if isinstance(value, np.generic) and not isinstance(ln.kernel,
                                                                        NativeKernel):
                        rawenqueue.set_scalar_arg(ln.kernel, position, value)
                    else:
                        ln.kernel.set_arg(position, value.mem if isinstance(value, Buffer)
                                          else value)
            ln.global_size = tuple(gsize)
            if self._ready:
                self._prepared.resize(index, ln.global_size)

    def set_scalar(self, index: int, position: int, value: Any) -> None:
        """Change one argument of one launch (for values fixed per call, not per step)."""
        ln = self.launches[index]
        ln.args[position] = value
        ln.kernel.set_arg(position, value.mem if isinstance(value, Buffer) else value)
        if self._prepared is not None and self._prepared.recorded is not None:
            self._ready = False  # a recording holds the arguments it was made with
