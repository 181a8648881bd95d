"""Runtime, staging: pinned (mapped ``ALLOC_HOST_PTR``) host buffers that host<->device copies
go through, so that a copy is a DMA the device runs on its own while kernels run on another
queue. Pageable numpy memory makes most drivers copy synchronously through a bounce buffer.

A block is mapped once and stays mapped; it is reused only once the copy that used it has
completed. Copies go through ``CLDevice.write``/``read``, so they take part in dependency
tracking and profiling like any other copy."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from .events import Event
from .pool import Buffer, size_class

if TYPE_CHECKING:
    from .device import CLDevice, CLQueue

_COMPLETE = cl.command_execution_status.COMPLETE
DEFAULT_LIMIT = 1 << 30  # pinned bytes a device's staging pool holds before it waits instead


class PinnedBlock:
    """A mapped host-visible buffer: ``host`` is a uint8 numpy view of its memory."""

    __slots__ = ("cl_buffer", "host", "size", "event")

    def __init__(self, cl_buffer: cl.Buffer, host: np.ndarray, size: int) -> None:
        self.cl_buffer = cl_buffer
        self.host = host
        self.size = size
        self.event: cl.Event | None = None  # the last copy that used it

    @property
    def idle(self) -> bool:
        ev = self.event
        return ev is None or ev.command_execution_status == _COMPLETE


class StagingPool:
    """Pinned blocks of one device, by size class. Thread-safe.

    >>> pool = staging_pool(clops.device())
    >>> blk = pool.acquire(4096); pool.release(blk)
    """

    def __init__(self, device: CLDevice, limit: int = DEFAULT_LIMIT) -> None:
        self.device = device
        self.limit = limit
        self.held = 0  # bytes of pinned memory mapped
        self._free: list[PinnedBlock] = []
        self._lock = threading.Lock()
        # NOTE: maps and unmaps go to a queue of their own: a blocking map on a queue with
        # pending work would wait for that work (forever, behind a user event).
        self._map_queue = cl.CommandQueue(device.context, device.cl_device)

    def _new(self, size: int) -> PinnedBlock:
        mf = cl.mem_flags
        ctx = self.device.context
        buf = cl.Buffer(ctx, mf.READ_WRITE | mf.ALLOC_HOST_PTR, size)
        # NOTE: mapped once and kept mapped; the mapped pointer is pinned memory that copies
        # from and to it use directly (the pattern NVIDIA's OpenCL guide gives for overlap).
        flags: Any = cl.map_flags.READ | cl.map_flags.WRITE
        mapped: Any = cl.enqueue_map_buffer(self._map_queue, buf, flags, 0, (size,),
                                            np.dtype(np.uint8), is_blocking=True)
        host = mapped[0]
        self.held += size
        return PinnedBlock(buf, host, size)

    def acquire(self, nbytes: int) -> PinnedBlock:
        """A block of at least ``nbytes`` no copy is using; the caller owns it until
        ``release``."""
        size = size_class(max(nbytes, 1))
        with self._lock:
            best = None
            for blk in self._free:
                if blk.size >= size and blk.size <= 2 * size and blk.idle:
                    if best is None or blk.size < best.size:
                        best = blk
            if best is not None:
                self._free.remove(best)
                return best
            if self.held + size > self.limit and self._free:
                # Over the limit: wait for the oldest block and reuse or drop it.
                old = self._free.pop(0)
                if old.event is not None:
                    old.event.wait()
                if old.size >= size:
                    return old
                self._drop(old)
            return self._new(size)

    def release(self, block: PinnedBlock, event: Event | cl.Event | None = None) -> None:
        """Give ``block`` back; it is reused once ``event`` (the copy using it) completes."""
        ev = event.cl_event if isinstance(event, Event) else event
        block.event = ev
        with self._lock:
            self._free.append(block)

    def _drop(self, block: PinnedBlock) -> None:
        if block.event is not None:
            block.event.wait()
        base: Any = block.host.base
        try:
            base.release(self._map_queue)  # unmap
        except (AttributeError, cl.Error):
            pass
        self.held -= block.size

    def empty(self) -> int:
        """Unmap and free every idle-or-finished block; returns the bytes released."""
        with self._lock:
            blocks, self._free = self._free, []
            freed = 0
            for b in blocks:
                self._drop(b)
                freed += b.size
        return freed


_POOLS: dict[int, StagingPool] = {}
_POOLS_LOCK = threading.Lock()


def staging_pool(device: CLDevice) -> StagingPool:
    """The staging pool of a device (made on first use)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(id(device))
        if pool is None:
            pool = _POOLS[id(device)] = StagingPool(device)
        return pool


def upload(device: CLDevice, buf: Buffer, host: np.ndarray, offset: int = 0,
           queue: CLQueue | None = None, wait_for: Sequence[Any] = ()) -> Event:
    """Host -> device through a pinned block: ``host`` is copied into pinned memory at once
    (so the caller may reuse it when this returns) and the device copies it in the background.

    >>> ev = upload(dev, buf, np.ones(1024, np.float32))
    """
    src = np.ascontiguousarray(host)
    n = src.nbytes
    if n == 0:
        return Event(None, queue)
    pool = staging_pool(device)
    blk = pool.acquire(n)
    view = blk.host[:n]
    np.copyto(view, src.reshape(-1).view(np.uint8))
    ev = device.write(buf, view, offset, queue=queue, wait_for=wait_for)
    pool.release(blk, ev)
    return ev


def download(device: CLDevice, buf: Buffer, nbytes: int, offset: int = 0,
             queue: CLQueue | None = None, wait_for: Sequence[Any] = ()
             ) -> tuple[Event, PinnedBlock]:
    """Device -> host into a pinned block, without blocking. Read ``block.host[:nbytes]`` once
    the event completes, then ``staging_pool(device).release(block)``.

    >>> ev, blk = download(dev, buf, 4096); ev.wait(); data = blk.host[:4096].copy()
    """
    pool = staging_pool(device)
    blk = pool.acquire(nbytes)
    if nbytes == 0:
        return Event(None, queue), blk
    ev = device.read(blk.host[:nbytes], buf, offset, queue=queue, wait_for=wait_for,
                     blocking=False)
    return ev, blk
