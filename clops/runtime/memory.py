"""Runtime, memory: a device's allocations (from its pool, or over a host array) and the tracked
copies between host and device and within a device: each waits on exactly the buffers' pending
work, records its event on them, and passes the captures and profilers of the open launch
scopes, as launches do (``launch.py``). ``CLDevice.alloc`` / ``write`` / ``read`` / ``copy``
are these functions."""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from . import profiler
from .capture import note_alloc, record, refuse
from .events import Event
from .launch import current_queue, wait_list
from .plan import Copy, Write
from .pool import Buffer, BufferPool
from .scope import capturing, profiling

if TYPE_CHECKING:
    from .protocols import Device, Queue

_COMPLETE = cl.command_execution_status.COMPLETE


# -- allocations ----------------------------------------------------------------------------------
def alloc(pool: BufferPool, nbytes: int, kind: str = "device") -> Buffer:
    """``nbytes`` from ``pool``, of memory ``kind`` (``"device"``, ``"host"``, ``"shared"``:
    see ``BufferPool.alloc``); noted by an open capture (a jit replay allocates its own)."""
    buf = pool.alloc(nbytes, kind)
    if capturing():
        note_alloc(buf)
    return buf


def memory_kinds(pool: BufferPool) -> tuple[str, ...]:
    """The memory kinds ``pool``'s device allocates: ``"device"``, ``"host"`` and, where it
    has shared virtual memory, ``"shared"``."""
    try:
        pool._svm_flags()
    except ValueError:
        return ("device", "host")
    return ("device", "host", "shared")


def wrap_host(dev: Device, arr: np.ndarray) -> Buffer:
    """A buffer over the memory of the C-contiguous ``arr`` itself (``CL_MEM_USE_HOST_PTR``;
    it keeps ``arr`` alive), on a device that shares the host's memory; elsewhere the driver
    would work on a copy that ``arr`` does not see, so that is refused."""
    if not dev.caps.unified_memory:
        raise BufferError(f"{dev.name} has memory of its own: its kernels would work on a "
                          "copy of the array; use copy=True")
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise BufferError("only a C-contiguous, writeable array can be used in place")
    u8 = arr.reshape(-1).view(np.uint8)
    mem = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR,
                    hostbuf=u8)
    return Buffer(mem, arr.nbytes, arr.nbytes, None, kind="host", host=u8)


# -- host copies in flight ------------------------------------------------------------------------
class HostCopies:
    """The events of a device's non-blocking host copies, each held until the copy is complete.

    NOTE: pyopencl's event for such a copy guards the host array and, when its last reference
    goes, waits for the copy without releasing the GIL. Dependency tracking drops events as
    soon as newer work supersedes them, which would stall the host there (forever, behind a
    user event). Held here, an event is dropped only once complete."""

    def __init__(self) -> None:
        self._held: collections.deque[cl.Event] = collections.deque()
        self._scan_at = 256
        self._lock = threading.Lock()

    def keep(self, event: cl.Event) -> None:
        """Hold ``event`` until its copy is complete."""
        with self._lock:
            held = self._held
            while held and held[0].command_execution_status == _COMPLETE:
                held.popleft()
            held.append(event)
            if len(held) > self._scan_at:
                # The oldest is still pending (a long queue, or another queue): sweep them all.
                live = [e for e in held if e.command_execution_status != _COMPLETE]
                self._held = collections.deque(live)
                self._scan_at = max(256, 2 * len(live))

    def clear(self) -> None:
        """Drop every event (all complete: the device's queues have finished)."""
        with self._lock:
            self._held.clear()  # all complete now: dropping them cannot block


# -- tracked copies -------------------------------------------------------------------------------
def write(dev: Device, held: HostCopies, buf: Buffer, host: np.ndarray, offset: int = 0,
          queue: Queue | None = None, wait_for: Sequence[Any] = (),
          blocking: bool = False) -> Event:
    """Host -> device copy into ``buf`` at byte ``offset``. Non-blocking by default: keep
    ``host`` alive and unchanged until the event completes (the event holds it)."""
    q = queue or current_queue(dev)  # the stream block's queue, if any
    host = np.ascontiguousarray(host)
    if host.nbytes == 0:
        return Event(None, q)  # OpenCL rejects zero-byte copies
    if capturing():
        record(dev, Write(buf, host.copy(), offset, queue))
    deps = wait_list(wait_for) + buf.write_deps(q)
    ev = cl.enqueue_copy(q.cl_queue, buf.mem, host, dst_offset=offset,
                         is_blocking=blocking, wait_for=deps or None)
    if not blocking:
        held.keep(ev)
    buf.mark_write(ev, q)
    if profiling():
        profiler.record("host_to_device", "copy", dev.name, ev, host.nbytes, q.index)
    return Event(ev, q)


def read(dev: Device, held: HostCopies, host: np.ndarray, buf: Buffer, offset: int = 0,
         queue: Queue | None = None, wait_for: Sequence[Any] = (),
         blocking: bool = True) -> Event:
    """Device -> host copy from ``buf`` at byte ``offset`` into the contiguous ``host``."""
    if capturing():
        refuse("a read of device memory to the host")
    q = queue or current_queue(dev)  # the stream block's queue, if any
    if host.nbytes == 0:
        return Event(None, q)  # OpenCL rejects zero-byte copies
    deps = buf.read_deps(q)
    if wait_for:
        deps = wait_list(wait_for) + deps
    if blocking and dev.kind == "cpu" and host.nbytes >= MAP_READ_MIN and \
            host.flags.c_contiguous and host.flags.writeable:
        ev = _read_mapped(q, host, buf, offset, deps)
        buf.mark_read(ev, q)
        if profiling():
            profiler.record("device_to_host", "copy", dev.name, ev, host.nbytes, q.index)
        return Event(ev, q)
    ev = cl.enqueue_copy(q.cl_queue, host, buf.mem, src_offset=offset,
                         is_blocking=blocking, wait_for=deps or None)
    if not blocking:
        held.keep(ev)
    buf.mark_read(ev, q)
    if profiling():
        profiler.record("device_to_host", "copy", dev.name, ev, host.nbytes, q.index)
    return Event(ev, q)


# PERF (2-core EPYC, 64 MiB float32 to the host): Intel's CPU runtime reads 24-46 ms by a copy,
# 8-22 ms by mapping the buffer (the device's memory is the host's) and copying with numpy; PoCL
# 3.1 the same either way from 16 MiB, 0.38 against 0.59 ms at 2 MiB, slower mapped at 16 KiB.
MAP_READ_MIN = 1 << 20


def _read_mapped(q: Queue, host: np.ndarray, buf: Buffer, offset: int,
                 deps: list[Any]) -> Any:
    """A blocking read on a CPU device: map ``buf`` for reading, copy, unmap; the unmap's event
    (what a later write of ``buf`` waits for)."""
    mapped: Any
    mapped, _ = cl.enqueue_map_buffer(  # type: ignore[type-var, misc]
        q.cl_queue, buf.mem, cl.map_flags.READ, offset, (host.nbytes,), np.dtype(np.uint8),
        wait_for=deps or None, is_blocking=True)
    try:
        np.copyto(host.reshape(-1).view(np.uint8), mapped)
    finally:
        ev = mapped.base.release(q.cl_queue)
    return ev


def copy(dev: Device, dst: Buffer, src: Buffer, nbytes: int, dst_offset: int = 0,
         src_offset: int = 0, queue: Queue | None = None,
         wait_for: Sequence[Any] = ()) -> Event:
    """Device -> device copy."""
    q = queue or current_queue(dev)  # the stream block's queue, if any
    if nbytes == 0:
        return Event(None, q)
    if capturing():
        record(dev, Copy(dst, src, nbytes, dst_offset, src_offset, queue))
    deps = wait_list(wait_for) + src.read_deps(q) + dst.write_deps(q)
    ev = cl.enqueue_copy(q.cl_queue, dst.mem, src.mem, byte_count=nbytes,
                         src_offset=src_offset, dst_offset=dst_offset,
                         wait_for=deps or None)
    src.mark_read(ev, q)
    dst.mark_write(ev, q)
    if profiling():
        profiler.record("device_to_device", "copy", dev.name, ev, 2 * nbytes, q.index)
    return Event(ev, q)
