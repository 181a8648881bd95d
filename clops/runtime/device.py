"""Runtime, devices: ``CLDevice``, the device object users hold, with ``CLQueue``, its queues;
and the choice of devices (``devices``, ``device`` and the default, ``context``, ``adopt``).

A device owns its context, queues, buffer pool and program cache; the work of each other job
is done by its module, which the methods here call: capabilities (``caps``), probes
(``probes``), programs and kernel objects (``program``), launches (``launch``: the seam's
enqueue, with capture, dependency tracking and the profiler), allocations and copies
(``memory``), and fission (``fission``)."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

import numpy as np
import pyopencl as cl

from .. import _config
from . import cachefiles, discovery, fission, launch, memory, probes, registry
from .caps import PROBED, DeviceCaps, static_caps
from .events import Event
from .launch import PreparedLaunches
from .pool import Buffer, BufferPool
from .program import KernelObjects, ProgramCache, target_setting

__all__ = [
    "CPU_RUNTIME_ORDER", "CPU_RUNTIME_WHY", "DEFAULT_WHY", "CLDevice", "CLQueue", "DeviceCaps",
    "PreparedLaunches", "add_cpu_default_check", "adopt", "cache_dir", "context", "cpu_rank",
    "device", "devices", "register", "set_default_device",
]


def cache_dir() -> str:
    """Where program binaries and probe results are kept (``CLOPS_CACHE_DIR``)."""
    return cachefiles.root()


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
        self._host_copies = memory.HostCopies()
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
        self._kernels = KernelObjects()
        self.programs = ProgramCache(self, os.path.join(cache_dir(), "programs") if disk else None)

    # -- capabilities and probes (caps.py, probes.py) ----------------------------------------------
    @cached_property
    def caps(self) -> DeviceCaps:
        base = static_caps(self.cl_device, self.name, self.platform_name, self.driver_version,
                           self.kind)
        saved: dict[str, Any] = probes.load().get(self.key, {})
        return replace(base, **{k: saved[k] for k in PROBED if k in saved})

    @property
    def key(self) -> str:
        """What the remembered probe results are tied to: device, platform, driver and a CPU
        runtime's target setting where one is set (``program.TARGET_ENV``)."""
        key = f"{self.name}|{self.platform_version}|{self.driver_version}"
        target = target_setting()
        return f"{key}|{target}" if target else key

    def probe(self, what: str) -> bool:
        """Run (once per device and driver, remembered on disk) a compile-and-run probe:
        ``"fp16"``, ``"nvidia_ptx"`` (inline PTX with %laneid, shfl.sync and dp4a: NVIDIA's
        driver on sm_61 or newer) or ``"builds"``."""
        known = getattr(self.caps, what)
        if known is not None:
            return bool(known)

        def keep(answer: bool) -> None:
            update: dict[str, Any] = {what: answer}
            self.__dict__["caps"] = replace(self.caps, **update)

        return probes.run_stored(self, what, keep)

    def remembered(self, name: str, compute: Callable[[], bool]) -> bool:
        """A probe remembered on disk with this device's others (per device and driver):
        ``compute()`` runs only where no answer for ``name`` is stored yet."""
        return probes.remembered(self, name, compute)

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

    def synchronize(self) -> None:
        for q in self.queues:
            q.finish()
        self._host_copies.clear()

    def shares_context(self, other: CLDevice) -> bool:
        """Whether ``other`` is in this device's OpenCL context (buffers move between the two
        by a device-side copy; ``clops.context`` makes such devices)."""
        return bool(self.context.int_ptr == other.context.int_ptr)

    # -- fission (fission.py) ----------------------------------------------------------------------
    def create_sub_devices(self, n: int | None = None, **how: Any) -> list[CLDevice]:
        """Split this device into sub-devices (see ``fission.create_sub_devices``).

        >>> subs = clops.device("cpu").create_sub_devices(2)
        """
        return fission.create_sub_devices(self, n, **how)

    def partition_support(self) -> dict[str, Any]:
        """How this device can be partitioned (see ``fission.partition_support``)."""
        return fission.partition_support(self)

    # -- memory (memory.py) ------------------------------------------------------------------------
    def alloc(self, nbytes: int, kind: str = "device") -> Buffer:
        """``nbytes`` from the pool, of memory ``kind`` (``"device"``, ``"host"``,
        ``"shared"``: see ``BufferPool.alloc``)."""
        return memory.alloc(self.pool, nbytes, kind)

    @property
    def memory_kinds(self) -> tuple[str, ...]:
        """The memory kinds this device allocates: ``"device"``, ``"host"`` and, where it has
        shared virtual memory, ``"shared"``."""
        return memory.memory_kinds(self.pool)

    def wrap_host(self, arr: np.ndarray) -> Buffer:
        """A buffer over the memory of the C-contiguous ``arr`` itself (``CL_MEM_USE_HOST_PTR``;
        it keeps ``arr`` alive), on a device that shares the host's memory; elsewhere the
        driver would work on a copy that ``arr`` does not see, so that is refused."""
        return memory.wrap_host(self, arr)

    def memory_stats(self) -> dict[str, Any]:
        return self.pool.stats.as_dict()

    def write(self, buf: Buffer, host: np.ndarray, offset: int = 0,
              queue: CLQueue | None = None, wait_for: Sequence[Any] = (),
              blocking: bool = False) -> Event:
        """Host -> device copy into ``buf`` at byte ``offset``. Non-blocking by default: keep
        ``host`` alive and unchanged until the event completes (the event holds it)."""
        return memory.write(self, self._host_copies, buf, host, offset, queue, wait_for,
                            blocking)

    def read(self, host: np.ndarray, buf: Buffer, offset: int = 0,
             queue: CLQueue | None = None, wait_for: Sequence[Any] = (),
             blocking: bool = True) -> Event:
        """Device -> host copy from ``buf`` at byte ``offset`` into the contiguous ``host``."""
        return memory.read(self, self._host_copies, host, buf, offset, queue, wait_for,
                           blocking)

    def copy(self, dst: Buffer, src: Buffer, nbytes: int, dst_offset: int = 0,
             src_offset: int = 0, queue: CLQueue | None = None,
             wait_for: Sequence[Any] = ()) -> Event:
        """Device -> device copy."""
        return memory.copy(self, dst, src, nbytes, dst_offset, src_offset, queue, wait_for)

    # -- programs (program.py) ---------------------------------------------------------------------
    def build(self, source: str, options: Sequence[str] = ()) -> cl.Program:
        return self.programs.build(source, tuple(options))

    def kernel(self, source: str, name: str, options: Sequence[str] = (),
               arg_types: Sequence[Any] | None = None) -> cl.Kernel:
        """A kernel object of a (cached) program; one object per (source, options, name).
        ``arg_types`` (numpy dtypes of scalar arguments, None for buffers) makes setting
        arguments about 100 times cheaper.
        NOTE: a kernel object holds its arguments, so launches set them each time."""
        return self._kernels.get(self.build, source, name, options, arg_types)

    # -- launches (launch.py) ----------------------------------------------------------------------
    def launch(self, kernel: cl.Kernel, global_size: Sequence[int],
               local_size: Sequence[int] | None, args: Sequence[Any],
               reads: Sequence[Buffer] = (), writes: Sequence[Buffer] = (),
               queue: CLQueue | None = None, wait_for: Sequence[Any] = (),
               name: str | None = None) -> Event:
        """Enqueue ``kernel`` after the last writes of ``reads`` and the last writes and reads of
        ``writes`` (plus ``wait_for``); record the new event on those buffers."""
        return launch.launch(self, self._launch_lock, kernel, global_size, local_size, args,
                             reads, writes, queue, wait_for, name)

    def prepare_launches(self, launches: Sequence[tuple[cl.Kernel, Sequence[int],
                                                        Sequence[int] | None, str]],
                         record: bool = True) -> PreparedLaunches:
        """Launches (kernel with its arguments set, global size, local size, name) made ready
        for ``enqueue_prepared`` (see ``launch.prepare_launches``): on GPUs in the event-free
        form, and where the device has ``cl_khr_command_buffer`` and ``record`` holds,
        recorded once."""
        return launch.prepare_launches(self, launches, record)

    def enqueue_prepared(self, launches: PreparedLaunches | Sequence[
                             tuple[cl.Kernel, Sequence[int], Sequence[int] | None, str]],
                         queue: CLQueue | None = None) -> None:
        """Enqueue kernels whose arguments are already set, in order, with no dependency
        tracking: for launch plans that own their buffers on one in-order queue (a decode
        step is then only its enqueues). No events are kept; while profiling, each launch is
        enqueued with its event and recorded."""
        launch.enqueue_prepared(self, self._launch_lock, launches, queue)

    def __repr__(self) -> str:
        return f"<clops.CLDevice {self.selector!r}: {self.name} ({self.platform_version})>"

    def __str__(self) -> str:
        return f"{self.selector} ({self.name})"


# -- selection --------------------------------------------------------------------------------
# cl_device int_ptr, or a tuple for shared and adopted ones -> the device (registry.py's table)
_DEVICES: dict[Any, CLDevice] = registry.DEVICES
_DEFAULT: CLDevice | None = None
register = registry.register


def _canonical_selector(entry: discovery.DeviceEntry) -> str:
    same_kind = [e for e in discovery.entries() if e.kind == entry.kind]
    return f"opencl:{entry.kind}:{same_kind.index(entry)}"


def _wrap(entry: discovery.DeviceEntry) -> CLDevice:
    dev: CLDevice = registry.get_or_add(
        entry.device.int_ptr, lambda: CLDevice(entry, _canonical_selector(entry)))
    return dev


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
    got: CLDevice | None = registry.lookup(key)
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
