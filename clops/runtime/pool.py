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

import numpy as np
import pyopencl as cl

if TYPE_CHECKING:
    from .protocols import Device, Queue

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


Dep = tuple[cl.Event, "Queue"]


class Buffer:
    """A device allocation from the pool with its dependency state. Returned to the pool when
    the last reference goes away."""

    __slots__ = ("mem", "nbytes", "size", "pool", "last_write", "reads", "kind", "host",
                 "__weakref__")

    def __init__(self, mem: cl.Buffer, nbytes: int, size: int, pool: BufferPool | None,
                 last_write: Dep | None = None, reads: list[Dep] | None = None,
                 kind: str = "device", host: Any = None) -> None:
        self.mem = mem
        self.nbytes = nbytes
        self.size = size
        self.pool = pool
        self.last_write = last_write
        self.reads: list[Dep] = reads or []
        # The memory kind ("device", "host", "shared") and, where the host addresses the very
        # memory the device uses, a uint8 numpy view of it (else None, or what keeps the
        # memory alive).
        self.kind = kind
        self.host = host

    # -- dependency tracking -------------------------------------------------------------------
    def read_deps(self, queue: Queue) -> list[cl.Event]:
        """Events a read on ``queue`` must wait for: the last write (unless already ordered by
        the same in-order queue)."""
        lw = self.last_write
        if lw is None or (lw[1] is queue and queue.in_order):
            return []
        return [lw[0]]

    def write_deps(self, queue: Queue) -> list[cl.Event]:
        """Events a write must wait for: the last write and every read since."""
        out = self.read_deps(queue)
        same = queue.in_order
        out.extend(ev for ev, q in self.reads if not (same and q is queue))
        return out

    def mark_read(self, event: cl.Event, queue: Queue) -> None:
        reads = self.reads
        if queue.in_order and reads and reads[-1][1] is queue:
            reads[-1] = (event, queue)  # later on the same in-order queue implies the earlier
        else:
            reads.append((event, queue))
            if len(reads) > 32:
                self.reads = [r for r in reads if r[0].command_execution_status != 0]

    def mark_write(self, event: cl.Event, queue: Queue) -> None:
        self.last_write = (event, queue)
        self.reads = []

    def host_view(self) -> np.ndarray:
        """The buffer's memory as seen by the host (uint8, no copy), once every pending write
        and read of it by the device is done. Raises ``BufferError`` where the host cannot
        address it (device memory; host or shared memory of a device that does not share the
        host's memory)."""
        if self.host is None and self.pool is not None and \
                self.pool.device.caps.unified_memory:
            self.host = self.pool.map_whole(self.mem, self.size)  # kept while the memory lives
        if not isinstance(self.host, np.ndarray):
            raise BufferError(_no_host_view(self))
        pending = self.pending()
        if pending:
            cl.wait_for_events(pending)
        return self.host

    @property
    def host_addressable(self) -> bool:
        """Whether ``host_view`` can give this memory without a copy."""
        return isinstance(self.host, np.ndarray) or (
            self.host is None and self.pool is not None and self.pool.device.caps.unified_memory)

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


KINDS = ("device", "host", "shared")


def _no_host_view(buf: Buffer) -> str:
    if buf.kind == "device":
        return ("this tensor is in device memory, which the host cannot address: make it with "
                "usm_type='host' or 'shared' (on a device that shares the host's memory, such "
                "as a CPU or an integrated GPU) for a view without a copy, or copy it")
    return (f"{buf.kind} memory of a device that does not share the host's memory is not "
            "coherent with the host between maps: copy it (np.array(t), t.to_numpy())")


class _Hidden:
    """Keeps memory alive that the host must not read in place."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr


class _SVMBytes:
    """The bytes of an SVM allocation as a buffer-protocol object (numpy views it in place)."""

    def __init__(self, svm: Any, size: int) -> None:
        self.svm = svm  # NOTE: keeps the allocation alive as long as any view of it
        ptr = svm.svm_ptr
        self.__array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False),
                                    "version": 3}


class BufferPool:
    """Reuses device buffers by size class. Thread-safe. One per context."""

    def __init__(self, device: Device, limit: int | None = None) -> None:
        self.device = device
        self.context = device.context
        self.limit = limit
        # NOTE: reentrant because a Buffer's __del__ (run by the garbage collector on whatever
        # allocation triggers it, possibly one made while this lock is held) gives back here.
        self._lock = threading.RLock()
        # (kind, size class) -> (mem, last write, reads, host view) of cached buffers
        self._free: dict[tuple[str, int], list[tuple[Any, Dep | None, list[Dep], Any]]] = {}
        self.stats = MemoryStats(limit=limit)
        # device addresses of memory this pool holds (lent or cached), by its handle
        # (runtime/tma.py): dropped where the pool lets the memory go
        self.addresses: dict[int, int] = {}

    def alloc(self, nbytes: int, kind: str = "device") -> Buffer:
        """A buffer of at least ``nbytes`` of memory ``kind``: ``"device"`` (the device's own),
        ``"host"`` (host memory the device reads, ``CL_MEM_ALLOC_HOST_PTR``) or ``"shared"``
        (shared virtual memory; ``ValueError`` where the device has none)."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        if kind != "device":
            if kind not in KINDS:
                raise ValueError(f"memory kind {kind!r}: one of {list(KINDS)}")
            if kind == "shared":
                self._svm_flags()  # a clear error before anything is cached or counted
        size = size_class(max(nbytes, 1))
        with self._lock:
            bucket = self._free.get((kind, size))
            entry = bucket.pop() if bucket else None
            st = self.stats
            if entry is not None:
                st.cached -= size
                st.in_use += size
                st.hits += 1
            else:
                st.misses += 1
        if entry is not None:
            mem, lw, reads, host = entry
            return Buffer(mem, nbytes, size, self, lw, reads, kind, host)
        mem, size, host = self._create(size, nbytes, kind)
        return Buffer(mem, nbytes, size, self, kind=kind, host=host)

    def map_whole(self, mem: Any, size: int) -> np.ndarray:
        """``mem`` mapped for reading and writing, for good: on a device that shares the host's
        memory the map is the memory itself, kept coherent by the dependency tracking."""
        rw: Any = cl.map_flags.READ | cl.map_flags.WRITE  # the stubs want one enum member
        mapped: Any = cl.enqueue_map_buffer(self.device.queue.cl_queue, mem, rw, 0, (size,),
                                            np.uint8)
        view, ev = mapped
        ev.wait()
        return view  # type: ignore[no-any-return]

    def _svm_flags(self) -> int:
        caps = int(getattr(self.device.cl_device, "svm_capabilities", 0) or 0)
        svm = cl.device_svm_capabilities
        if caps & svm.FINE_GRAIN_BUFFER:
            return int(cl.svm_mem_flags.READ_WRITE | cl.svm_mem_flags.SVM_FINE_GRAIN_BUFFER)
        if caps & svm.COARSE_GRAIN_BUFFER:
            return int(cl.svm_mem_flags.READ_WRITE)
        raise ValueError(f"{self.device.name} has no shared virtual memory (SVM), so no "
                         "usm_type='shared': use 'host' (host memory the device reads) or "
                         "'device'")

    def _driver_buffer(self, size: int, kind: str) -> tuple[Any, Any]:
        """A new driver buffer of ``kind`` and its host view (None where there is none)."""
        mf = cl.mem_flags
        if kind == "device":
            return cl.Buffer(self.context, mf.READ_WRITE, size), None
        unified = self.device.caps.unified_memory
        if kind == "host":
            buf = cl.Buffer(self.context, mf.READ_WRITE | mf.ALLOC_HOST_PTR, size)
            if not unified:
                return buf, None
            # NOTE: mapped once for the buffer's life: on a device that shares the host's
            # memory the map is the memory itself, kept coherent by the dependency tracking
            return buf, self.map_whole(buf, size)
        flags = self._svm_flags()
        fine = bool(flags & int(cl.svm_mem_flags.SVM_FINE_GRAIN_BUFFER))
        svm = cl.SVMAllocation(self.context, size, 0, flags)
        arr = np.asarray(_SVMBytes(svm, size))  # NOTE: its base holds the allocation
        # a buffer object over the SVM allocation: every kernel and copy takes it as a cl_mem
        buf = cl.Buffer(self.context, mf.READ_WRITE | mf.USE_HOST_PTR, hostbuf=arr)
        # coarse grain on a device with memory of its own needs maps: no host view there
        return buf, (arr if fine or unified else _Hidden(arr))

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

    def _create(self, size: int, nbytes: int, kind: str = "device") -> tuple[Any, int, Any]:
        """A new driver buffer of ``size`` bytes (or of ``nbytes``, see below), counted as in
        use; returns it with the size it really has and its host view."""
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
                    mem, host = self._driver_buffer(size, kind)
                    return mem, size, host
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
            # an odd size (clamped to the device's cap), which no size class can reuse, or
            # over the limit: the driver has it back (and its address is forgotten)
            if buf.size != size_class(buf.size) or (
                    self.limit is not None and st.in_use + st.cached + buf.size > self.limit):
                self.addresses.pop(buf.mem.int_ptr, None)
                return
            st.cached += buf.size
            self._free.setdefault((buf.kind, buf.size), []).append(
                (buf.mem, buf.last_write, buf.reads, buf.host))

    def empty(self) -> int:
        """Release every cached buffer to the driver; returns the bytes released."""
        with self._lock:
            freed = self.stats.cached
            held, self._free = self._free, {}
            self.stats.cached = 0
            for bucket in held.values():
                for entry in bucket:
                    self.addresses.pop(entry[0].int_ptr, None)
        pending = [ev for bucket in held.values() for _, lw, rs, _ in bucket
                   for ev in ([lw[0]] if lw else []) + [r[0] for r in rs]]
        if pending:
            # The driver may not free memory the device still uses: wait, then release.
            cl.wait_for_events(pending)
        held.clear()
        return freed
