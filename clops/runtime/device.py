"""Runtime, devices: ``CLDevice`` (context, queues, pool, program cache, capability probe) and
the tracked launch and copy paths that every kernel and transfer of clops goes through (the
seam of ``plan.py``: capture, dependency tracking and the profiler hook in there)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import pyopencl as cl

from .. import _config
from . import cachefiles, cmdbuf, discovery, nativekernel, plan, profiler, rawenqueue, streams
from .events import Event
from .nativekernel import NativeKernel
from .pool import Buffer, BufferPool
from .program import ProgramCache

_PROBE_LOCK = threading.Lock()
_COMPLETE = cl.command_execution_status.COMPLETE


def cache_dir() -> str:
    """Where program binaries and probe results are kept (``CLOPS_CACHE_DIR``)."""
    return cachefiles.root()


@dataclass(frozen=True)
class DeviceCaps:
    """What a device can do, probed once and cached on disk per device and driver."""

    name: str
    vendor: str
    platform: str
    driver: str
    opencl_version: str
    kind: str
    compute_units: int
    global_mem: int
    max_alloc: int
    local_mem: int
    max_work_group: int
    max_work_item_sizes: tuple[int, ...]
    preferred_vector_width_float: int
    fp64: bool
    fp16_extension: bool
    subgroups: bool
    extensions: tuple[str, ...]
    address_bits: int
    unified_memory: bool
    # fused multiply-add for float reported (CL_FP_FMA): kernels may call fma() for it
    fma: bool = False
    # bytes of a kernel's arguments (CL_DEVICE_MAX_PARAMETER_SIZE; 1024 at least)
    max_parameter_size: int = 1024
    # floats in the vectors the device's arithmetic runs natively (CL_DEVICE_NATIVE_VECTOR_WIDTH_
    # FLOAT: a CPU with AVX-512 16, with AVX2 8, as its runtime compiles for it; 0 unknown)
    native_vector_width_float: int = 0
    # Run-time probes (compile and run a small kernel); None means not yet probed.
    fp16: bool | None = None
    nvidia_ptx: bool | None = None
    builds: bool | None = None


_FP16_PROBE = r"""
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
__kernel void probe(__global const half4 *a, __global half4 *out) {
    size_t i = get_global_id(0);
    half4 x = a[i];
    out[i] = fma(x, x, (half4)(1.0h)) * (half)0.5h;
}
"""

# The PTX forms the NVIDIA paths use outside the tensor-core GEMM (which has its own fallback):
# %laneid, shfl.sync (sm_30, PTX 6.0) and dp4a (sm_61).
_PTX_PROBE = r"""
__kernel void probe(__global uint *out) {
    uint lane, other, one = 1, ones = 0x01010101u, zero = 0;
    int dot;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"
                 : "=r"(other) : "r"(lane), "r"(one));
    asm volatile("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(dot) : "r"(lane), "r"(ones), "r"(zero));
    out[get_global_id(0)] = other * 100 + (uint)dot;
}
"""

_BUILD_PROBE = "__kernel void probe(__global float *a) { a[get_global_id(0)] += 1.0f; }"

# Run in a child process: a driver that crashes on half vectors takes only the child down.
_FP16_CHILD = r"""
import sys, numpy as np, pyopencl as cl
p, d = int(sys.argv[1]), int(sys.argv[2])
dev = cl.get_platforms()[p].get_devices()[d]
ctx = cl.Context([dev]); q = cl.CommandQueue(ctx)
src = sys.stdin.read()
prg = cl.Program(ctx, src).build(cache_dir=False)
a = np.linspace(-2, 2, 64).astype(np.float16)
out = np.empty_like(a)
mf = cl.mem_flags
ba = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
bo = cl.Buffer(ctx, mf.WRITE_ONLY, a.nbytes)
prg.probe(q, (16,), None, ba, bo); cl.enqueue_copy(q, out, bo); q.finish()
ref = ((a.astype(np.float32) ** 2 + 1) * 0.5).astype(np.float16)
print("ok" if np.allclose(out, ref, rtol=1e-2, atol=1e-2) else "wrong")
"""


def _launch_items(launches: Sequence[tuple[cl.Kernel, Sequence[int], Sequence[int] | None, str]]
                  ) -> list[tuple[cl.Kernel, tuple[int, ...], tuple[int, ...] | None, str]]:
    """Launches with their sizes as tuples (what pyopencl's enqueue takes fastest)."""
    return [(k, tuple(g), tuple(loc) if loc is not None else None, name)
            for k, g, loc, name in launches]


@dataclass
class PreparedLaunches:
    """Launches ready for ``CLDevice.enqueue_prepared``: (kernel, global, local, name), where
    the event-free path is used their ctypes form, and where the device records command
    buffers, the recording (on the device's default queue)."""

    items: list[tuple[cl.Kernel, tuple[int, ...], tuple[int, ...] | None, str]]
    raw: list[Any] | None
    recorded: cmdbuf.CommandBuffer | None = None
    # where there are native kernels: how the items replay (nativekernel.chain_items)
    chained: list[Any] | None = None

    def resize(self, index: int, global_size: Sequence[int]) -> None:
        """Launch ``index`` with another global size from now on (not in a recording: a
        plan that resizes has none)."""
        kernel, _, local, name = self.items[index]
        self.items[index] = (kernel, tuple(global_size), local, name)
        if self.raw is not None:
            self.raw[index] = rawenqueue.resized(self.raw[index], global_size)


class CLQueue:
    """A command queue of a device. In-order unless asked otherwise; always profiling-capable."""

    __slots__ = ("device", "cl_queue", "in_order", "index", "__weakref__")

    def __init__(self, device: CLDevice, out_of_order: bool = False, index: int = 0,
                 cl_queue: cl.CommandQueue | None = None) -> None:
        if cl_queue is not None:  # the application's own queue (clops.device(from_pyopencl=))
            self.device, self.cl_queue, self.index = device, cl_queue, index
            self.in_order = not (int(cl_queue.properties) &
                                 int(cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE))
            return
        props: int = cl.command_queue_properties.PROFILING_ENABLE
        if out_of_order:
            props |= cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
        try:
            # The stubs type the flags as an enum; pyopencl takes (and its constants are) ints.
            q = cl.CommandQueue(device.context, device.cl_device,
                                properties=props)  # type: ignore[arg-type]
        except cl.Error as e:
            if not out_of_order:
                raise
            raise RuntimeError(
                f"{device.name} does not support out-of-order queues ({e}); use several "
                "in-order queues instead (device.create_queue())") from None
        self.device = device
        self.cl_queue = q
        self.in_order = not out_of_order
        self.index = index

    def marker(self, wait_for: Sequence[Event] = ()) -> Event:
        """An event that completes when ``wait_for`` (or, if empty, everything before) has."""
        evs = [e.cl_event for e in wait_for if e.cl_event is not None]
        return Event(cl.enqueue_marker(self.cl_queue, wait_for=evs or None), self)

    def barrier(self, wait_for: Sequence[Event] = ()) -> Event:
        """Later commands on this queue wait for ``wait_for`` (or for everything before)."""
        evs = [e.cl_event for e in wait_for if e.cl_event is not None]
        return Event(cl.enqueue_barrier(self.cl_queue, wait_for=evs or None), self)

    def flush(self) -> None:
        self.cl_queue.flush()

    def finish(self) -> None:
        self.cl_queue.finish()

    def __repr__(self) -> str:
        kind = "in-order" if self.in_order else "out-of-order"
        return f"<clops.CLQueue {kind} #{self.index} on {self.device.name}>"


def _wait_list(wait_for: Sequence[Any]) -> list[cl.Event]:
    out: list[cl.Event] = []
    for e in wait_for:
        ev = e.cl_event if isinstance(e, Event) else e
        if ev is not None:
            out.append(ev)
    return out


class CLDevice:
    """One OpenCL device with its own context, default in-order queue, buffer pool and
    program cache.

    >>> dev = clops.device("cpu")
    >>> dev.caps.fp64
    True
    """

    def __init__(self, entry: discovery.DeviceEntry, selector: str,
                 context: cl.Context | None = None,
                 queue: cl.CommandQueue | None = None) -> None:
        self.entry = entry
        self.cl_device: cl.Device = entry.device
        self.platform_name: str = entry.platform.name
        self.platform_version: str = entry.platform.version
        self.driver_version: str = entry.device.driver_version
        self.name: str = entry.device.name.strip()
        self.kind = entry.kind
        self.backend = entry.backend
        self.selector = selector
        # NOTE: a context may be shared with other devices (clops.context, sub-devices) or be
        # the application's (clops.device(from_pyopencl=)); buffers of one context are usable
        # by every device in it
        self.context = context if context is not None else cl.Context([self.cl_device])
        # NOTE: queues other than the default one are held weakly: one that its creator drops
        # goes (pending work still completes; buffers hold the queues of their last events)
        # A WeakValueDictionary drops a dead queue without taking a lock: a queue the garbage
        # collector frees inside a `with self._queue_lock` block must not need that lock.
        self._queues: weakref.WeakValueDictionary[int, CLQueue] = weakref.WeakValueDictionary()
        self._queue_count = 0
        self._queue_lock = threading.Lock()
        # NOTE: set_args and enqueue are two driver calls on one shared kernel object; a second
        # thread launching the same kernel in between would run with the other thread's args.
        self._launch_lock = threading.Lock()
        self._host_copies: collections.deque[cl.Event] = collections.deque()
        self._host_copies_scan_at = 256
        self._host_copies_lock = threading.Lock()
        if queue is not None:
            with self._queue_lock:
                self.queue = CLQueue(self, index=self._queue_count, cl_queue=queue)
                self._queue_count += 1
                self._queues[self.queue.index] = self.queue
        else:
            self.queue = self.create_queue()
        self.pool = BufferPool(self, _config.CONFIG.memory_limit)
        # NVIDIA's driver caches builds on disk itself.
        disk = _config.CONFIG.disk_cache and entry.backend != "nvidia"
        self._kernels: dict[tuple[str, tuple[str, ...], str], cl.Kernel] = {}
        self.programs = ProgramCache(self, os.path.join(cache_dir(), "programs") if disk else None)

    # -- capabilities ----------------------------------------------------------------------------
    def _static_caps(self) -> DeviceCaps:
        d = self.cl_device
        exts = tuple(sorted(d.extensions.split()))
        return DeviceCaps(
            name=self.name, vendor=d.vendor.strip(), platform=self.platform_name,
            driver=self.driver_version, opencl_version=d.version, kind=self.kind,
            compute_units=d.max_compute_units, global_mem=d.global_mem_size,
            max_alloc=d.max_mem_alloc_size, local_mem=d.local_mem_size,
            max_work_group=d.max_work_group_size,
            max_work_item_sizes=tuple(d.max_work_item_sizes),
            preferred_vector_width_float=d.preferred_vector_width_float,
            fp64="cl_khr_fp64" in exts or bool(getattr(d, "double_fp_config", 0)),
            fp16_extension="cl_khr_fp16" in exts,
            subgroups="cl_khr_subgroups" in exts or "cl_intel_subgroups" in exts,
            extensions=exts, address_bits=d.address_bits,
            unified_memory=bool(d.host_unified_memory),
            fma=bool(int(d.single_fp_config) & int(cl.device_fp_config.FMA)),
            max_parameter_size=int(d.max_parameter_size),
            native_vector_width_float=int(d.native_vector_width_float),
        )

    @cached_property
    def caps(self) -> DeviceCaps:
        base = self._static_caps()
        saved: dict[str, Any] = _load_probes().get(self.key, {})
        fields = {k: saved[k] for k in ("fp16", "nvidia_ptx", "builds") if k in saved}
        return replace(base, **fields)

    @property
    def key(self) -> str:
        return f"{self.name}|{self.platform_version}|{self.driver_version}"

    def probe(self, what: str) -> bool:
        """Run (once per device and driver, remembered on disk) a compile-and-run probe:
        ``"fp16"``, ``"nvidia_ptx"`` (inline PTX with %laneid, shfl.sync and dp4a: NVIDIA's
        driver on sm_61 or newer) or ``"builds"``."""
        known = getattr(self.caps, what)
        if known is not None:
            return bool(known)
        with _PROBE_LOCK, plan.paused():  # (no part of a function clops.jit captures)
            result = {"fp16": self._probe_fp16, "nvidia_ptx": self._probe_ptx,
                      "builds": self._probe_builds}[what]()
            update: dict[str, Any] = {what: result}
            self.__dict__["caps"] = replace(self.caps, **update)
            probes = _load_probes()
            probes.setdefault(self.key, {})[what] = result
            _save_probes(probes)
        return result

    def remembered(self, name: str, compute: Callable[[], bool]) -> bool:
        """A probe remembered on disk with this device's others (per device and driver):
        ``compute()`` runs only where no answer for ``name`` is stored yet."""
        saved = _load_probes().get(self.key, {}).get(name)
        if isinstance(saved, bool):
            return saved
        with plan.paused():  # (no part of a function clops.jit captures)
            result = bool(compute())
        with _PROBE_LOCK:
            probes = _load_probes()
            probes.setdefault(self.key, {})[name] = result
            _save_probes(probes)
        return result

    def _platform_device_index(self) -> tuple[int, int]:
        for pi, p in enumerate(cl.get_platforms()):
            for di, d in enumerate(p.get_devices()):
                if d.int_ptr == self.cl_device.int_ptr:
                    return pi, di
        raise LookupError(self.name)

    def _probe_fp16(self) -> bool:
        pi, di = self._platform_device_index()
        try:
            res = subprocess.run([sys.executable, "-c", _FP16_CHILD, str(pi), str(di)],
                                 input=_FP16_PROBE, capture_output=True, text=True, timeout=120)
        except (subprocess.TimeoutExpired, OSError):
            return False
        return res.returncode == 0 and res.stdout.strip() == "ok"

    def _probe_ptx(self) -> bool:
        if self.backend != "nvidia":
            return False
        try:
            prg = cl.Program(self.context, _PTX_PROBE).build(cache_dir=False)  # type: ignore
            out = np.full(64, 99, np.uint32)
            buf = cl.Buffer(self.context, cl.mem_flags.WRITE_ONLY, out.nbytes)
            prg.probe(self.queue.cl_queue, (64,), (64,), buf)
            cl.enqueue_copy(self.queue.cl_queue, out, buf)
            lane = np.arange(64) % 32
            return bool((out == (lane ^ 1) * 100 + lane).all())
        except cl.Error:
            return False

    def _probe_builds(self) -> bool:
        try:
            prg = cl.Program(self.context, _BUILD_PROBE).build(cache_dir=False)  # type: ignore
            a = np.zeros(4, np.float32)
            buf = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                            hostbuf=a)
            prg.probe(self.queue.cl_queue, (4,), None, buf)
            cl.enqueue_copy(self.queue.cl_queue, a, buf)
            return bool((a == 1).all())
        except cl.Error:
            return False

    # -- queues ------------------------------------------------------------------------------------
    def create_queue(self, out_of_order: bool = False) -> CLQueue:
        """A new queue on this device's context (in-order unless ``out_of_order``); it lasts as
        long as its creator holds it."""
        with self._queue_lock:
            q = CLQueue(self, out_of_order, index=self._queue_count)
            self._queue_count += 1
            self._queues[q.index] = q
        return q

    @property
    def queues(self) -> list[CLQueue]:
        """The live queues of this device, the default one first."""
        with self._queue_lock:  # against a create_queue on another thread meanwhile
            return list(self._queues.values())

    # Device fission lives in fission.py; these two methods only forward to it.
    def create_sub_devices(self, n: int | None = None, **how: Any) -> list[CLDevice]:
        """Split this device into sub-devices (see ``fission.create_sub_devices``).

        >>> subs = clops.device("cpu").create_sub_devices(2)
        """
        from .fission import create_sub_devices

        return create_sub_devices(self, n, **how)

    def partition_support(self) -> dict[str, Any]:
        """How this device can be partitioned (see ``fission.partition_support``)."""
        from .fission import partition_support

        return partition_support(self)

    def shares_context(self, other: CLDevice) -> bool:
        """Whether ``other`` is in this device's OpenCL context (buffers move between the two
        by a device-side copy; ``clops.context`` makes such devices)."""
        return bool(self.context.int_ptr == other.context.int_ptr)

    def synchronize(self) -> None:
        for q in self.queues:
            q.finish()
        with self._host_copies_lock:
            self._host_copies.clear()  # all complete now: dropping them cannot block

    def _keep_until_done(self, event: cl.Event) -> None:
        """Hold a non-blocking host copy's event until the copy is complete.

        NOTE: pyopencl's event for such a copy guards the host array and, when its last
        reference goes, waits for the copy without releasing the GIL. Dependency tracking
        drops events as soon as newer work supersedes them, which would stall the host there
        (forever, behind a user event). Held here, an event is dropped only once complete."""
        with self._host_copies_lock:
            held = self._host_copies
            while held and held[0].command_execution_status == _COMPLETE:
                held.popleft()
            held.append(event)
            if len(held) > self._host_copies_scan_at:
                # The oldest is still pending (a long queue, or another queue): sweep them all.
                live = [e for e in held if e.command_execution_status != _COMPLETE]
                self._host_copies = collections.deque(live)
                self._host_copies_scan_at = max(256, 2 * len(live))

    # -- memory ------------------------------------------------------------------------------------
    def alloc(self, nbytes: int, kind: str = "device") -> Buffer:
        """``nbytes`` from the pool, of memory ``kind`` (``"device"``, ``"host"``,
        ``"shared"``: see ``BufferPool.alloc``)."""
        buf = self.pool.alloc(nbytes, kind)
        if plan._ACTIVE[0]:
            plan.note_alloc(buf)  # a jit replay allocates its own
        return buf

    @property
    def memory_kinds(self) -> tuple[str, ...]:
        """The memory kinds this device allocates: ``"device"``, ``"host"`` and, where it has
        shared virtual memory, ``"shared"``."""
        try:
            self.pool._svm_flags()
        except ValueError:
            return ("device", "host")
        return ("device", "host", "shared")

    def wrap_host(self, arr: np.ndarray) -> Buffer:
        """A buffer over the memory of the C-contiguous ``arr`` itself (``CL_MEM_USE_HOST_PTR``;
        it keeps ``arr`` alive), on a device that shares the host's memory; elsewhere the
        driver would work on a copy that ``arr`` does not see, so that is refused."""
        if not self.caps.unified_memory:
            raise BufferError(f"{self.name} has memory of its own: its kernels would work on a "
                              "copy of the array; use copy=True")
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            raise BufferError("only a C-contiguous, writeable array can be used in place")
        u8 = arr.reshape(-1).view(np.uint8)
        mem = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR,
                        hostbuf=u8)
        return Buffer(mem, arr.nbytes, arr.nbytes, None, kind="host", host=u8)

    def memory_stats(self) -> dict[str, Any]:
        return self.pool.stats.as_dict()

    # -- programs ----------------------------------------------------------------------------------
    def build(self, source: str, options: Sequence[str] = ()) -> cl.Program:
        return self.programs.build(source, tuple(options))

    def kernel(self, source: str, name: str, options: Sequence[str] = (),
               arg_types: Sequence[Any] | None = None) -> cl.Kernel:
        """A kernel object of a (cached) program; one object per (source, options, name).
        ``arg_types`` (numpy dtypes of scalar arguments, None for buffers) makes setting
        arguments about 100 times cheaper.
        NOTE: a kernel object holds its arguments, so launches set them each time."""
        key = (source, tuple(options), name)
        k = self._kernels.get(key)
        if k is None:
            k = cl.Kernel(self.build(source, options), name)
            if arg_types is not None:
                k.set_scalar_arg_dtypes(list(arg_types))
            # (threads that made one each at once all get the first one kept)
            k = self._kernels.setdefault(key, k)
        return k

    # -- tracked launches and copies ---------------------------------------------------------------
    def launch(self, kernel: cl.Kernel, global_size: Sequence[int],
               local_size: Sequence[int] | None, args: Sequence[Any],
               reads: Sequence[Buffer] = (), writes: Sequence[Buffer] = (),
               queue: CLQueue | None = None, wait_for: Sequence[Any] = (),
               name: str | None = None) -> Event:
        """Enqueue ``kernel`` after the last writes of ``reads`` and the last writes and reads of
        ``writes`` (plus ``wait_for``); record the new event on those buffers."""
        if plan._ACTIVE[0]:
            plan.record(self, plan.Launch(kernel, tuple(global_size), None if local_size is None
                                    else tuple(local_size), list(args), tuple(reads),
                                    tuple(writes), name or "", queue))
        q = queue or streams.current_queue(self)  # the stream block's queue, if any
        cl_args = [a.mem if isinstance(a, Buffer) else a for a in args]
        gsize = tuple(global_size)
        lsize = tuple(local_size) if local_size is not None else None
        # NOTE: the dependencies are read and the new event recorded under the lock too: two
        # threads launching kernels that write one buffer (the compiler's work-group counter
        # of split reductions, a tensor both update) on different queues would otherwise each
        # read the buffer's last write before the other recorded its own, and run at once.
        with self._launch_lock:
            deps = _wait_list(wait_for) if wait_for else []
            for b in reads:
                lw = b.last_write
                if lw is not None and not (lw[1] is q and q.in_order):
                    deps.append(lw[0])
            for b in writes:
                deps.extend(b.write_deps(q))
            kernel.set_args(*cl_args)
            if isinstance(kernel, NativeKernel):
                ev = kernel.enqueue(q.cl_queue, deps)
            else:
                # PERF: positional (global offset None): keywords cost ~0.3 us a call in
                # pyopencl.
                ev = cl.enqueue_nd_range_kernel(q.cl_queue, kernel, gsize, lsize, None,
                                                deps or None)
            for b in reads:
                b.mark_read(ev, q)
            for b in writes:
                b.mark_write(ev, q)
        if profiler.ACTIVE:
            profiler.record(name or kernel.function_name, "kernel", self.name, ev,
                            queue=q.index, global_size=list(gsize))
        return Event(ev, q)

    def prepare_launches(self, launches: Sequence[tuple[cl.Kernel, Sequence[int],
                                                        Sequence[int] | None, str]],
                         record: bool = True) -> PreparedLaunches:
        """Launches (kernel with its arguments set, global size, local size, name) made ready
        for ``enqueue_prepared``: on GPUs they are also converted for the event-free enqueue
        (``rawenqueue``), which halves the host cost of an enqueue on NVIDIA's driver; where
        the device has ``cl_khr_command_buffer`` and ``record`` holds, they are recorded once,
        so that a replay is one enqueue (``cmdbuf``). A recording the driver refuses leaves
        the other paths."""
        items = _launch_items(launches)
        # (native kernels, where there are any, are enqueued one by one: neither form takes them)
        native = any(isinstance(k, NativeKernel) for k, _, _, _ in items)
        raw = None
        if (self.kind != "cpu" and not native and _config.raw_enqueue()
                and rawenqueue.available()):
            raw = rawenqueue.prepare(items)
        recorded = None
        if record and items and not native and cmdbuf.support(self.queue.cl_queue)[0]:
            try:
                recorded = cmdbuf.CommandBuffer(self.queue.cl_queue,
                                                [(k, g, loc) for k, g, loc, _ in items])
            except RuntimeError as e:
                if _config.debug_level():
                    print(f"clops: launches not recorded ({e})", file=sys.stderr)
        # PERF (Intel's CPU runtime, 2-core EPYC): a 1B decode step's 81 native kernels in a
        # row (products and attention) go to the queue as one
        chained = nativekernel.chain_items(items) if native else None
        return PreparedLaunches(items, raw, recorded, chained)

    def enqueue_prepared(self, launches: PreparedLaunches | Sequence[
                             tuple[cl.Kernel, Sequence[int], Sequence[int] | None, str]],
                         queue: CLQueue | None = None) -> None:
        """Enqueue kernels whose arguments are already set, in order, with no dependency
        tracking: for launch plans that own their buffers on one in-order queue (a decode
        step is then only its enqueues). No events are kept; while profiling, each launch is
        enqueued with its event and recorded."""
        q = queue or self.queue
        if not q.in_order:
            raise ValueError("prepared launches need an in-order queue")
        if not isinstance(launches, PreparedLaunches):
            launches = PreparedLaunches(_launch_items(launches), None)
        cq = q.cl_queue
        # The plan's kernel objects are its own, but hold the launch lock anyway so that no
        # other thread's launch interleaves with a half-enqueued step.
        with self._launch_lock:
            if profiler.ACTIVE:
                for kernel, g, l, name in launches.items:
                    # Sizes are passed as the plan holds them (tuples, for speed); the stubs
                    # want tuple types where any sequence works.
                    ev = (kernel.enqueue(cq) if isinstance(kernel, NativeKernel) else
                          cl.enqueue_nd_range_kernel(cq, kernel, g, l))  # type: ignore[arg-type]
                    profiler.record(name or kernel.function_name, "kernel", self.name, ev,
                                    queue=q.index, global_size=list(g))
                return
            if launches.recorded is not None and launches.recorded.queue is cq:
                try:
                    launches.recorded.enqueue()
                    return
                except RuntimeError as e:
                    # nothing was enqueued: these launches go kernel by kernel from now on
                    launches.recorded = None
                    warnings.warn(f"clops: a recorded launch plan failed to enqueue ({e}); "
                                  "it replays kernel by kernel from now on "
                                  "(CLOPS_COMMAND_BUFFERS=0 skips recording)", RuntimeWarning,
                                  stacklevel=2)
            if launches.raw is not None:
                rawenqueue.enqueue(cq, launches.raw)
                return
            enqueue = cl.enqueue_nd_range_kernel
            items = launches.items
            # (item indices, and native kernels in a row as one nativekernel.Chain)
            order = launches.chained if launches.chained is not None else range(len(items))
            for entry in order:
                if not isinstance(entry, int):
                    entry.enqueue_bare(cq)
                    continue
                kernel, g, l, _ = items[entry]
                if isinstance(kernel, NativeKernel):
                    kernel.enqueue_bare(cq)
                else:
                    enqueue(cq, kernel, g, l)  # type: ignore[arg-type]

    def write(self, buf: Buffer, host: np.ndarray, offset: int = 0,
              queue: CLQueue | None = None, wait_for: Sequence[Any] = (),
              blocking: bool = False) -> Event:
        """Host -> device copy into ``buf`` at byte ``offset``. Non-blocking by default: keep
        ``host`` alive and unchanged until the event completes (the event holds it)."""
        q = queue or streams.current_queue(self)  # the stream block's queue, if any
        host = np.ascontiguousarray(host)
        if host.nbytes == 0:
            return Event(None, q)  # OpenCL rejects zero-byte copies
        if plan._ACTIVE[0]:
            plan.record(self, plan.Write(buf, host.copy(), offset, queue))
        deps = _wait_list(wait_for) + buf.write_deps(q)
        ev = cl.enqueue_copy(q.cl_queue, buf.mem, host, dst_offset=offset,
                             is_blocking=blocking, wait_for=deps or None)
        if not blocking:
            self._keep_until_done(ev)
        buf.mark_write(ev, q)
        if profiler.ACTIVE:
            profiler.record("host_to_device", "copy", self.name, ev, host.nbytes, q.index)
        return Event(ev, q)

    def read(self, host: np.ndarray, buf: Buffer, offset: int = 0,
             queue: CLQueue | None = None, wait_for: Sequence[Any] = (),
             blocking: bool = True) -> Event:
        """Device -> host copy from ``buf`` at byte ``offset`` into the contiguous ``host``."""
        if plan._ACTIVE[0]:
            plan.refuse("a read of device memory to the host")
        q = queue or streams.current_queue(self)  # the stream block's queue, if any
        if host.nbytes == 0:
            return Event(None, q)  # OpenCL rejects zero-byte copies
        deps = _wait_list(wait_for) + buf.read_deps(q)
        ev = cl.enqueue_copy(q.cl_queue, host, buf.mem, src_offset=offset,
                             is_blocking=blocking, wait_for=deps or None)
        if not blocking:
            self._keep_until_done(ev)
        buf.mark_read(ev, q)
        if profiler.ACTIVE:
            profiler.record("device_to_host", "copy", self.name, ev, host.nbytes, q.index)
        return Event(ev, q)

    def copy(self, dst: Buffer, src: Buffer, nbytes: int, dst_offset: int = 0,
             src_offset: int = 0, queue: CLQueue | None = None,
             wait_for: Sequence[Any] = ()) -> Event:
        """Device -> device copy."""
        q = queue or streams.current_queue(self)  # the stream block's queue, if any
        if nbytes == 0:
            return Event(None, q)
        if plan._ACTIVE[0]:
            plan.record(self, plan.Copy(dst, src, nbytes, dst_offset, src_offset, queue))
        deps = _wait_list(wait_for) + src.read_deps(q) + dst.write_deps(q)
        ev = cl.enqueue_copy(q.cl_queue, dst.mem, src.mem, byte_count=nbytes,
                             src_offset=src_offset, dst_offset=dst_offset,
                             wait_for=deps or None)
        src.mark_read(ev, q)
        dst.mark_write(ev, q)
        if profiler.ACTIVE:
            profiler.record("device_to_device", "copy", self.name, ev, 2 * nbytes, q.index)
        return Event(ev, q)

    def __repr__(self) -> str:
        return f"<clops.CLDevice {self.selector!r}: {self.name} ({self.platform_version})>"


    def __str__(self) -> str:
        return f"{self.selector} ({self.name})"


# -- probes on disk -------------------------------------------------------------------------------
def _probe_path() -> str:
    # v2: the nvidia_ptx probe also checks shfl.sync and dp4a
    return os.path.join(cache_dir(), "probes-v2.json")


def _load_probes() -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(cachefiles.read_file(_probe_path(), 1 << 20))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError):  # CacheEntryError is a ValueError
        data = {}
    # Each device's entry is kept only as a table of probe name -> bool; anything else (a list,
    # "yes", garbage) is dropped, so that the probe runs again, and the file is rewritten.
    clean = {key: {k: v for k, v in entry.items() if isinstance(k, str) and type(v) is bool}
             for key, entry in (data.items() if isinstance(data, dict) else ())
             if isinstance(key, str) and isinstance(entry, dict)}
    if clean != data:
        _save_probes(clean)
    return clean


def _save_probes(data: dict[str, dict[str, Any]]) -> None:
    cachefiles.write_file(_probe_path(), json.dumps(data, indent=1).encode())


# -- selection --------------------------------------------------------------------------------
_DEVICES: dict[Any, CLDevice] = {}  # cl_device int_ptr, or a tuple for shared and adopted ones
_DEFAULT: CLDevice | None = None
_LOCK = threading.Lock()


def _canonical_selector(entry: discovery.DeviceEntry) -> str:
    same_kind = [e for e in discovery.entries() if e.kind == entry.kind]
    return f"opencl:{entry.kind}:{same_kind.index(entry)}"


def _wrap(entry: discovery.DeviceEntry) -> CLDevice:
    key = entry.device.int_ptr
    with _LOCK:
        dev = _DEVICES.get(key)
        if dev is None:
            dev = _DEVICES[key] = CLDevice(entry, _canonical_selector(entry))
    return dev


def register(dev: CLDevice, key: Any) -> None:
    """Make ``dev`` one of the devices ``clops.synchronize()`` and ``empty_cache()`` visit (and
    ``from_pyopencl`` finds by context): sub-devices, shared-context and adopted devices."""
    with _LOCK:
        _DEVICES[key] = dev


def devices(selector: str | None = None, *, backend: str | None = None,
            kind: str | None = None) -> list[CLDevice]:
    """Every OpenCL device present (``CLOPS_VISIBLE_DEVICES`` limits them), GPUs first; or
    those a comma-separated selector list names, in its order; filtered by ``backend``
    (``"nvidia"``, ``"pocl"``, ...) and ``kind`` (``"gpu"``, ``"cpu"``, ``"accelerator"``).

    >>> clops.devices(kind="cpu")[0].kind
    'cpu'
    """
    if selector is None:
        found = discovery.entries()
    else:
        found = []
        for sel in discovery.split_selectors(selector):
            for e in discovery.select(sel):
                if e not in found:
                    found.append(e)
    if backend is not None and backend != "opencl" and backend not in discovery.BACKEND_KEYWORDS:
        raise ValueError(f"devices(backend={backend!r}): one of "
                         f"{['opencl', *discovery.BACKEND_KEYWORDS]}")
    if kind is not None and kind not in discovery.KINDS:
        raise ValueError(f"devices(kind={kind!r}): one of {list(discovery.KINDS)}")
    return [_wrap(e) for e in found if (backend in (None, "opencl") or e.backend == backend)
            and (kind is None or e.kind == kind)]


_CONTEXTS = [0]


def context(selected: str | Sequence[str | CLDevice]) -> list[CLDevice]:
    """Devices of one platform in one shared OpenCL context, in the order given (a selector
    list such as ``"cpu,gpu"``, or selectors and devices): a buffer of one is usable by the
    others, so ``t.to_device(other)`` is a device-side copy, not a trip through the host. Each
    returned device has its own queue, pool and program cache.

    >>> cpu0, cpu1 = clops.context("cpu:0,cpu:1")
    """
    items = discovery.split_selectors(selected) if isinstance(selected, str) else list(selected)
    if not items:
        raise ValueError("clops.context needs at least one device")
    bases = [device(i) for i in items]
    ptrs = [b.cl_device.int_ptr for b in bases]
    if len(set(ptrs)) != len(ptrs):
        raise ValueError(f"clops.context: a device is named twice in {items}")
    plats = {b.entry.platform.int_ptr for b in bases}
    if len(plats) > 1:
        names = ", ".join(f"{b} on {b.platform_name}" for b in bases)
        raise ValueError(f"clops.context: devices of several platforms cannot share a context "
                         f"({names}); move tensors between them with to_device (a host copy)")
    ctx = cl.Context([b.cl_device for b in bases])
    _CONTEXTS[0] += 1
    out = []
    for b in bases:
        dev = CLDevice(b.entry, f"{b.selector}@ctx{_CONTEXTS[0]}", context=ctx)
        register(dev, (b.cl_device.int_ptr, ctx.int_ptr))
        out.append(dev)
    return out


def adopt(obj: Any) -> CLDevice:
    """A device over the application's own pyopencl ``CommandQueue`` (its default queue) or
    ``Context`` (its first device, a new queue): clops work and the application's share the
    context, so ``clops.from_pyopencl`` takes its arrays without a copy."""
    if isinstance(obj, cl.CommandQueue):
        try:
            ctx, cl_dev, q = obj.context, obj.device, obj
        except cl.Error as e:
            # NOTE: some drivers (Intel's CPU runtime) invalidate a context whose last
            # application handle was released, although a queue still holds it
            raise ValueError(
                "clops.device(from_pyopencl=queue): the driver no longer knows the queue's "
                f"context ({e}); keep a reference to the pyopencl Context the queue was made "
                "on while the queue is in use") from e
    elif isinstance(obj, cl.Context):
        ctx, cl_dev, q = obj, obj.devices[0], None
    else:
        raise TypeError("clops.device(from_pyopencl=...) takes a pyopencl CommandQueue or "
                        f"Context, not {type(obj).__name__}")
    key = (cl_dev.int_ptr, ctx.int_ptr, q.int_ptr if q is not None else 0)
    with _LOCK:
        got = _DEVICES.get(key)
    if got is not None:
        return got
    entry = next((e for e in discovery.entries() if e.device.int_ptr == cl_dev.int_ptr), None)
    if entry is None:  # not listed (hidden by CLOPS_VISIBLE_DEVICES, or a sub-device)
        plat = cl_dev.platform
        entry = discovery.DeviceEntry(plat, cl_dev, discovery.kind_of(cl_dev),
                                      discovery.backend_of(plat, cl_dev))
    base = _canonical_selector(entry) if entry in discovery.entries() else entry.kind
    dev = CLDevice(entry, f"{base}@app", context=ctx, queue=q)
    register(dev, key)
    return dev


def device(selector: str | CLDevice | None = None, *, from_pyopencl: Any = None) -> CLDevice:
    """Pick a device: a selector string ``[backend][:kind][:index]`` (``"gpu"``, ``"cpu:0"``,
    ``"nvidia"``, ``"pocl"``), else ``CLOPS_DEVICE``, else the first GPU, else the CPU.
    ``from_pyopencl=`` a pyopencl ``CommandQueue`` or ``Context`` adopts the application's own
    (see ``adopt``).

    >>> clops.device("cpu").kind
    'cpu'
    """
    global _DEFAULT
    if from_pyopencl is not None:
        if selector is not None:
            raise ValueError("clops.device: give a selector or from_pyopencl=, not both")
        return adopt(from_pyopencl)
    if isinstance(selector, CLDevice):
        return selector
    if selector is None:
        if _DEFAULT is not None:
            return _DEFAULT
        env = _config.CONFIG.device
        DEFAULT_WHY.clear()
        if env:
            DEFAULT_WHY.append(f"CLOPS_DEVICE={env}")
        _DEFAULT = _pick(discovery.select(env or ""), DEFAULT_WHY)
        return _DEFAULT
    if not isinstance(selector, str):
        raise TypeError(f"device selector must be a string or CLDevice, got {type(selector)}")
    return _pick(discovery.select(selector))


# The CPU runtimes in the order a default prefers them, as measured side by side on the same
# machine by bench/bench_cpu_runtimes.py (README, "CPU runtimes"): Intel's runtime ran float32
# products and LLM prompts 2x faster than PoCL 3.1 (decode even); PoCL 3.1 ran bandwidth-bound
# elementwise work and reductions 1.4-2.7x faster than Intel's; PoCL 3.0 (the pip wheel) was
# slowest and fails the product probe. Newer PoCL before older; any other runtime last.
CPU_RUNTIME_ORDER = ("intel", "pocl")
CPU_RUNTIME_WHY = {
    "intel": "Intel's CPU runtime is preferred among CPU runtimes (products and LLM prompts "
             "2x PoCL 3.1's in bench/bench_cpu_runtimes.py)",
    "pocl": "PoCL is preferred among the CPU runtimes here (the newest first)",
}
# Why the default device is the one it is (``clops info`` prints it).
DEFAULT_WHY: list[str] = []


def cpu_rank(e: discovery.DeviceEntry) -> tuple[int, tuple[int, ...]]:
    """Sort key of a CPU runtime for the default: ``CPU_RUNTIME_ORDER``, newer versions first."""
    order = CPU_RUNTIME_ORDER.index(e.backend) if e.backend in CPU_RUNTIME_ORDER \
        else len(CPU_RUNTIME_ORDER)
    return order, discovery._version_key(e.platform.version)


def _pick(matches: list[discovery.DeviceEntry], why: list[str] | None = None) -> CLDevice:
    # GPUs and accelerators first, in the order listed; then CPU runtimes by cpu_rank. The
    # first that can build and run a kernel (a broken driver is skipped, e.g. a PoCL whose LLVM
    # does not know this CPU) and, for a CPU, whose vectorized product passes its probe (PoCL
    # 3.0 of the pip wheel fails it); else the first that builds. A selector with one match is
    # taken as is. ``why`` receives the reasons.
    why = [] if why is None else why
    if len(matches) == 1:
        why.append("the only device the selector matches")
        return _wrap(matches[0])
    others = [e for e in matches if e.kind != "cpu"]
    ordered = others + sorted((e for e in matches if e.kind == "cpu"), key=cpu_rank)
    first_building = None
    for e in ordered:  # probed in order, as far as needed
        dev = _wrap(e)
        if not dev.probe("builds"):
            why.append(f"{dev.selector} ({e.backend}) skipped: it cannot build and run a kernel")
            continue
        if dev.kind != "cpu":
            why.append(f"a {dev.kind} is preferred over CPUs")
            return dev
        if _cpu_products_work(dev):
            if len(ordered) > len(others) + 1:
                why.append(CPU_RUNTIME_WHY.get(e.backend, "the first CPU runtime that passes "
                                               "the product probe"))
            return dev
        why.append(f"{dev.selector} ({e.backend}) passed over: it fails the gemm_cpu probe")
        first_building = first_building or dev
    if first_building is not None:
        why.append("no CPU runtime passes the product probe: the first that builds")
        return first_building
    why.append("no device builds and runs a kernel: the first listed")
    return _wrap(matches[0])


# What a CPU runtime must pass to be the default: the kernels layer registers its vectorized
# product's probe here when clops is imported (the runtime imports no layer above it).
_CPU_DEFAULT_CHECKS: list[Callable[[CLDevice], bool]] = []


def add_cpu_default_check(check: Callable[[CLDevice], bool]) -> None:
    """Make ``check(device)`` a condition for a CPU runtime to be chosen as the default (where
    another CPU runtime passes every check)."""
    if check not in _CPU_DEFAULT_CHECKS:
        _CPU_DEFAULT_CHECKS.append(check)


def _cpu_products_work(dev: CLDevice) -> bool:
    return all(check(dev) for check in _CPU_DEFAULT_CHECKS)


def set_default_device(selector: str | CLDevice | None) -> CLDevice | None:
    """Make ``selector`` the default device (``None``: back to automatic choice)."""
    global _DEFAULT
    _DEFAULT = None if selector is None else device(selector)
    return _DEFAULT
