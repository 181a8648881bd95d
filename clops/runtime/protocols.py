"""Runtime, protocols: what the runtime's lower modules (pool, programs, probes, the launch seam,
memory, fission) ask of a device and of a queue. ``CLDevice`` and ``CLQueue`` satisfy them, so
that none of those modules imports the device module that imports them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pyopencl as cl

if TYPE_CHECKING:
    from .caps import DeviceCaps
    from .discovery import DeviceEntry


class Queue(Protocol):
    """A command queue of a device (``CLQueue``)."""

    @property
    def cl_queue(self) -> cl.CommandQueue: ...

    @property
    def in_order(self) -> bool: ...

    @property
    def index(self) -> int: ...


class Device(Protocol):
    """One OpenCL device with its context and default queue (``CLDevice``)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def backend(self) -> str: ...

    @property
    def selector(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def entry(self) -> DeviceEntry: ...

    @property
    def context(self) -> cl.Context: ...

    @property
    def cl_device(self) -> cl.Device: ...

    @property
    def platform_version(self) -> str: ...

    @property
    def driver_version(self) -> str: ...

    @property
    def queue(self) -> Queue: ...

    @property
    def caps(self) -> DeviceCaps: ...

    def launch(self, kernel: Any, global_size: Sequence[int],
               local_size: Sequence[int] | None, args: Sequence[Any],
               reads: Sequence[Any] = (), writes: Sequence[Any] = (), queue: Any = None,
               wait_for: Sequence[Any] = (), name: str | None = None) -> Any: ...

    def copy(self, dst: Any, src: Any, nbytes: int, dst_offset: int = 0,
             src_offset: int = 0, queue: Any = None, wait_for: Sequence[Any] = ()) -> Any: ...

    def write(self, buf: Any, host: Any, offset: int = 0, queue: Any = None,
              wait_for: Sequence[Any] = (), blocking: bool = False) -> Any: ...

    def prepare_launches(self, launches: Sequence[Any], record: bool = True) -> Any: ...

    def enqueue_prepared(self, launches: Any, queue: Any = None) -> None: ...
