"""Runtime, memory: the per-context buffer pool every device allocation comes from, and the
dependency tracking (last write, pending reads) that makes reuse and concurrency safe.

Invariants:
- a cached buffer belongs to no ``Buffer`` handle; an in-use one to exactly one;
- a reused buffer keeps the events of its previous owner's last write and reads, so the new
  owner's first write waits for them (reuse never races with the device);
- ``in_use + cached`` is what the pool holds from the driver, and never passes the limit.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyopencl as cl

if TYPE_CHECKING:
    from .device import CLDevice, CLQueue

MIN_BLOCK = 256  # bytes; also the alignment every sub-buffer offset can rely on
CLASSES_PER_OCTAVE_LOG2 = 3  # 8 size classes per power of two: rounding waste < 12.5%


def size_class(nbytes: int) -> int:
    """Round a request up to its size class: multiples of 1/8 of its power of two.

    >>> size_class(1000), size_class(1025), size_class(1 << 20)
    (1024, 1152, 1048576)
    """
    if nbytes <= MIN_BLOCK:
        return MIN_BLOCK
    step = 1 << max((nbytes - 1).bit_length() - 1 - CLASSES_PER_OCTAVE_LOG2, 0)
    return (nbytes + step - 1) // step * step


@dataclass
class MemoryStats:
    in_use: int = 0
    cached: int = 0
    peak: int = 0
    hits: int = 0
    misses: int = 0
    limit: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"in_use": self.in_use, "cached": self.cached, "peak": self.peak,
                "hits": self.hits, "misses": self.misses, "limit": self.limit}


Dep = tuple[cl.Event, "CLQueue"]


class Buffer:
    """A device allocation from the pool with its dependency state. Returned to the pool when
    the last reference goes away."""

    __slots__ = ("mem", "nbytes", "size", "pool", "last_write", "reads", "__weakref__")

    def __init__(self, mem: cl.Buffer, nbytes: int, size: int, pool: BufferPool | None,
                 last_write: Dep | None = None, reads: list[Dep] | None = None) -> None:
        self.mem = mem
        self.nbytes = nbytes
        self.size = size
        self.pool = pool
        self.last_write = last_write
        self.reads: list[Dep] = reads or []

    # -- dependency tracking -------------------------------------------------------------------
    def read_deps(self, queue: CLQueue) -> list[cl.Event]:
        """Events a read on ``queue`` must wait for: the last write (unless already ordered by
        the same in-order queue)."""
        lw = self.last_write
        if lw is None or (lw[1] is queue and queue.in_order):
            return []
        return [lw[0]]

    def write_deps(self, queue: CLQueue) -> list[cl.Event]:
        """Events a write must wait for: the last write and every read since."""
        out = self.read_deps(queue)
        same = queue.in_order
        out.extend(ev for ev, q in self.reads if not (same and q is queue))
        return out

    def mark_read(self, event: cl.Event, queue: CLQueue) -> None:
        reads = self.reads
        if queue.in_order and reads and reads[-1][1] is queue:
            reads[-1] = (event, queue)  # later on the same in-order queue implies the earlier
        else:
            reads.append((event, queue))
            if len(reads) > 32:
                self.reads = [r for r in reads if r[0].command_execution_status != 0]

    def mark_write(self, event: cl.Event, queue: CLQueue) -> None:
        self.last_write = (event, queue)
        self.reads = []

    def pending(self) -> list[cl.Event]:
        out = [ev for ev, _ in self.reads]
        if self.last_write is not None:
            out.append(self.last_write[0])
        return out

    def __del__(self) -> None:
        pool = self.pool
        if pool is not None:
            self.pool = None
            try:
                pool._give_back(self)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass

    def __repr__(self) -> str:
        return f"<clops.Buffer {self.nbytes} bytes (class {self.size})>"


class BufferPool:
    """Reuses device buffers by size class. Thread-safe. One per context."""

    def __init__(self, device: CLDevice, limit: int | None = None) -> None:
        self.device = device
        self.context = device.context
        self.limit = limit
        # NOTE: reentrant because a Buffer's __del__ (run by the garbage collector on whatever
        # allocation triggers it, possibly one made while this lock is held) gives back here.
        self._lock = threading.RLock()
        self._free: dict[int, list[tuple[cl.Buffer, Dep | None, list[Dep]]]] = {}
        self.stats = MemoryStats(limit=limit)

    def alloc(self, nbytes: int) -> Buffer:
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        size = size_class(max(nbytes, 1))
        with self._lock:
            bucket = self._free.get(size)
            entry = bucket.pop() if bucket else None
            st = self.stats
            if entry is not None:
                st.cached -= size
                st.in_use += size
                st.hits += 1
            else:
                st.misses += 1
        if entry is not None:
            mem, lw, reads = entry
            return Buffer(mem, nbytes, size, self, lw, reads)
        mem, size = self._create(size, nbytes)
        return Buffer(mem, nbytes, size, self)

    def _fits(self, size: int) -> bool:
        st = self.stats
        return self.limit is None or st.in_use + st.cached + size <= self.limit

    def _reserve(self, size: int) -> bool:
        # Counted before the driver call, so that two threads cannot both pass the limit.
        with self._lock:
            if not self._fits(size):
                return False
            st = self.stats
            st.in_use += size
            st.peak = max(st.peak, st.in_use + st.cached)
            return True

    def _create(self, size: int, nbytes: int) -> tuple[cl.Buffer, int]:
        """A new driver buffer of ``size`` bytes (or of ``nbytes``, see below), counted as in
        use; returns it with the size it really has."""
        max_alloc = self.device.caps.max_alloc
        if nbytes > max_alloc:
            raise MemoryError(
                f"cannot allocate {nbytes} bytes on {self.device.name}: the device's largest "
                f"single allocation is {max_alloc} bytes; split the array")
        if size > max_alloc:
            size = nbytes  # a request just under the device's cap is not rounded past it
        released = 0
        error: Exception | None = None
        for attempt in range(2):
            if self._reserve(size):
                try:
                    return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size), size
                except (cl.MemoryError, cl.RuntimeError, cl.LogicError) as e:
                    with self._lock:
                        self.stats.in_use -= size
                    error = e
            if attempt == 0:
                released = self.empty()  # free the cache and retry once
        why = f" ({error})" if error is not None else ""
        raise self._oom(nbytes, released, why) from error

    def _oom(self, nbytes: int, released: int, why: str) -> MemoryError:
        st = self.stats
        lim = f", limit {st.limit} bytes (CLOPS_MEMORY_LIMIT)" if st.limit is not None else ""
        return MemoryError(
            f"out of device memory on {self.device.name}: requested {nbytes} bytes, "
            f"{st.in_use} bytes in use, {st.cached + released} bytes cached{lim}{why}. "
            f"The cache ({released} bytes) was emptied and the allocation retried; free "
            "tensors or raise the limit.")

    def _give_back(self, buf: Buffer) -> None:
        with self._lock:
            st = self.stats
            st.in_use -= buf.size
            if buf.size != size_class(buf.size):
                return  # an odd size (clamped to the device's cap): no size class can reuse it
            if self.limit is not None and st.in_use + st.cached + buf.size > self.limit:
                return  # over the limit: let the driver have it back
            st.cached += buf.size
            self._free.setdefault(buf.size, []).append((buf.mem, buf.last_write, buf.reads))

    def empty(self) -> int:
        """Release every cached buffer to the driver; returns the bytes released."""
        with self._lock:
            freed = self.stats.cached
            held, self._free = self._free, {}
            self.stats.cached = 0
        pending = [ev for bucket in held.values() for _, lw, rs in bucket
                   for ev in ([lw[0]] if lw else []) + [r[0] for r in rs]]
        if pending:
            # The driver may not free memory the device still uses: wait, then release.
            cl.wait_for_events(pending)
        held.clear()
        return freed
