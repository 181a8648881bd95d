"""Compiler, device protocol: the little the compiler asks of a device (a runtime backend's
device class satisfies it; ``runtime.CLDevice`` does). Scheduling and lowering read ``kind``,
``caps`` and ``probe``; running a schedule allocates, writes, builds and launches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Caps(Protocol):
    """The capability fields the compiler reads."""

    @property
    def compute_units(self) -> int: ...

    @property
    def max_work_group(self) -> int: ...


class Device(Protocol):
    """A device to schedule for and to run generated kernels on.

    ``kind`` is ``"cpu"``, ``"gpu"`` or ``"accelerator"``; ``probe(what)`` answers a
    capability question by running something on the device once (``"nvidia_ptx"``). Where
    the device has a ``backend`` attribute (``"intel"``, ``"pocl"``, ...), geometry reads it
    for a driver's performance quirks, never for what is computed."""

    kind: str

    @property
    def caps(self) -> Caps: ...

    def probe(self, what: str) -> bool: ...

    def alloc(self, nbytes: int) -> Any: ...

    def write(self, buf: Any, host: Any, offset: int = 0, *, blocking: bool = False) -> Any: ...

    def kernel(self, source: str, name: str, options: Sequence[str] = (),
               arg_types: Sequence[Any] | None = None) -> Any: ...

    def launch(self, kernel: Any, global_size: Sequence[int],
               local_size: Sequence[int] | None, args: Sequence[Any], *,
               reads: Sequence[Any] = (), writes: Sequence[Any] = (),
               name: str | None = None) -> Any: ...
