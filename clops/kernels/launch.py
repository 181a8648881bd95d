"""Kernels, launching: loads ``.cl`` sources, builds them per device and compile-time parameters,
and replays recorded launch lists (a decode step is one replay: only its enqueues)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from ..runtime import CLDevice, Event
from ..runtime.pool import Buffer


@functools.cache
def source(name: str) -> str:
    """The text of ``clops/kernels/<name>.cl``."""
    return resources.files(__package__).joinpath(f"{name}.cl").read_text()


def _options(defines: dict[str, Any]) -> tuple[str, ...]:
    opts = ["-cl-fast-relaxed-math"] if defines.pop("_fast", False) else []
    opts += [f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in sorted(defines.items())]
    return tuple(opts)


def program(dev: CLDevice, name: str, **defines: Any) -> Any:
    """The built program of ``name.cl`` with ``-D`` ``defines`` (cached by the device)."""
    return dev.build(source(name), _options(dict(defines)))


def kernel(dev: CLDevice, name: str, function: str, **defines: Any) -> Any:
    """A new kernel object (its own argument slots) for ``function`` in ``name.cl``.

    NOTE: every launch recorded in a plan gets its own kernel object, so that its arguments are
    set once and a replay only enqueues.
    """
    prg = program(dev, name, **defines)
    for k in prg.all_kernels():
        if k.function_name == function:
            return k
    raise LookupError(f"no kernel {function!r} in {name}.cl")


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

    def run(self, dev: CLDevice) -> Event:
        """Enqueue now through the device's tracked launch path."""
        return dev.launch(self.kernel, self.global_size, self.local_size, self.args,
                          reads=self.reads, writes=self.writes, name=self.name or None)


@dataclass
class LaunchPlan:
    """A fixed list of launches on one in-order queue, with arguments set once.

    ``replay()`` costs one enqueue per launch and nothing else: sizes, positions and sampling
    parameters that change between steps live in device buffers the kernels read. From the
    second replay on, where the device records command buffers, a replay is one enqueue in all
    (a plan replayed once, such as a prompt of a length not seen again, or of one launch, is
    never recorded).
    """

    device: CLDevice
    launches: list[Launch] = field(default_factory=list)
    _ready: bool = False
    _prepared: Any = None
    _replays: int = 0

    def add(self, launch: Launch) -> None:
        self.launches.append(launch)
        self._ready = False

    def _prepare(self, record: bool) -> None:
        for ln in self.launches:
            ln.kernel.set_args(*[a.mem if isinstance(a, Buffer) else a for a in ln.args])
        self._prepared = self.device.prepare_launches(
            [(ln.kernel, ln.global_size, ln.local_size, ln.name) for ln in self.launches],
            record=record)
        self._ready = True

    @property
    def recorded(self) -> bool:
        """Whether replays go through one command buffer."""
        return self._ready and self._prepared.recorded is not None

    def replay(self) -> None:
        """Enqueue every launch in order on the device's default queue."""
        # a single launch gains nothing from a recording
        if not self._ready:
            self._prepare(record=self._replays > 0 and len(self.launches) > 1)
        elif self._replays == 1 and len(self.launches) > 1:
            self._prepare(record=True)
        self._replays += 1
        self.device.enqueue_prepared(self._prepared)

    def set_scalar(self, index: int, position: int, value: Any) -> None:
        """Change one argument of one launch (for values fixed per call, not per step)."""
        ln = self.launches[index]
        ln.args[position] = value
        ln.kernel.set_arg(position, value.mem if isinstance(value, Buffer) else value)
        if self._prepared is not None and self._prepared.recorded is not None:
            self._ready = False  # a recording holds the arguments it was made with


def i32(v: int) -> np.int32:
    return np.int32(v)


def f32(v: float) -> np.float32:
    return np.float32(v)
