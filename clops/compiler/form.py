"""Compiler, forms and the schedule cache. A pending graph's *form* is the graph with its values
left out: its ops, dtypes, shapes and views, which of its loads read one buffer, and where its
targets go. Two graphs of one form get the same schedule (scheduling and lowering read nothing
else: constants and buffers are kernel arguments), so a schedule that ran is kept by its form as
what it launched: each kernel with its sizes and arguments, buffers and constants as slots of the
form. A graph of a known form then runs without scheduling, lowering or resolving arguments: its
own buffers and constants fill the slots (a repeated call's host cost; a 1024x512 ``sum`` spent
180 us scheduling and 150 launching, of 450, on a 2-core CPU).

A constant whose kernel argument cannot be told apart from another constant's (two constant
nodes holding one Python object) is checked instead: the cached schedule is reused only while it
has the same value."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..graph.dtypes import DType
from ..graph.ir import Node, View
from .kernel import BUFFER_ROLES, Param, Temp
from .lower import scalar_arg
from .schedule import Alloc, Schedule

# graphs of more nodes than this are scheduled every time (their form costs as much to find as
# a schedule saves)
MAX_FORM_NODES = 512
# forms kept per process (the oldest dropped first)
MAX_FORMS = 1024


@dataclass
class Form:
    """A graph's ``key`` (hashable, values left out) with the values it leaves out: the
    buffers of its loads and targets (slot order), its constant nodes (walk order) and every
    node (walk order; ``index``: node id -> position)."""

    key: tuple[Any, ...]
    buffers: list[Any]
    consts: list[Node]
    nodes: list[Node]
    index: dict[int, int]


def form_of(targets: list[tuple[Node, Any, View | None]]) -> Form | None:
    """The form of ``targets`` as ``schedule`` sees them (each node resolved), or None for a
    graph the cache does not take (an op it does not know, more than ``MAX_FORM_NODES``)."""
    key: list[Any] = []
    buffers: list[Any] = []
    slots: dict[int, int] = {}
    consts: list[Node] = []
    nodes: list[Node] = []
    index: dict[int, int] = {}
    # PERF: one walk, each node's sources resolved once and no closures or generators:
    # 4.8 -> 2.6 us for ``a + b`` (2-core EPYC); the walk is part of every call's host cost
    for root, buf, view in targets:
        root = root.resolve()
        # post-order without recursion: (node, its resolved sources once they are pushed)
        stack: list[tuple[Node, list[Node] | None]] = [(root, None)]
        while stack:
            n, srcs = stack.pop()
            if n.id in index:
                continue
            if srcs is None and n.srcs:
                resolved = [s.resolve() for s in n.srcs]
                stack.append((n, resolved))
                for s in reversed(resolved):
                    if s.id not in index:
                        stack.append((s, None))
                continue
            op = n.op
            entry: tuple[Any, ...]
            if op == "load":
                b, v = n.arg
                slot = slots.get(id(b))
                if slot is None:
                    slot = slots[id(b)] = len(buffers)
                    buffers.append(b)
                # (a View's fields, not the View: a frozen dataclass hashes in Python)
                entry = ("load", slot, v.shape, v.strides, v.offset, n.dtype)
            elif op == "const":
                entry = ("const", n.dtype, n.shape)
                consts.append(n)
            else:
                assert srcs is not None or not n.srcs
                ins = tuple([index[s.id] for s in srcs]) if srcs else ()
                if op == "view":
                    v = n.arg
                    entry = (op, v.shape, v.strides, v.offset, n.dtype, ins)
                elif op == "ew" or op == "iota" or op == "reduce":
                    entry = (op, n.arg, n.dtype, n.shape, ins)
                elif op == "cast":
                    entry = (op, n.dtype, ins)
                else:
                    return None
            index[n.id] = len(nodes)
            nodes.append(n)
            key.append(entry)
            if len(nodes) > MAX_FORM_NODES:
                return None
        slot = None
        if buf is not None:
            slot = slots.get(id(buf))
            if slot is None:
                slot = slots[id(buf)] = len(buffers)
                buffers.append(buf)
        key.append(("target", index[root.id], slot,
                    None if view is None else (view.shape, view.strides, view.offset)))
    return Form(tuple(key), buffers, consts, nodes, index)


# -- what a schedule launched, by slots ------------------------------------------------------------
@dataclass(frozen=True)
class _Buf:
    slot: int  # the form's buffer


@dataclass(frozen=True)
class _Tmp:
    index: int  # the schedule's temporary


@dataclass(frozen=True)
class _Const:
    index: int  # the form's constant node
    dtype: DType


_SLOTS = (_Buf, _Tmp, _Const)


@dataclass
class _Launch:
    kernel: Any
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    args: list[Any]  # values, or _Buf / _Tmp / _Const
    reads: list[Any]  # _Buf / _Tmp
    writes: list[Any]
    name: str
    # positions in ``args`` of the slots a run fills (the other arguments are the same each run)
    filled: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.filled = tuple(i for i, a in enumerate(self.args) if type(a) in _SLOTS)


@dataclass
class _Bind:
    node: int  # the form's node
    buffer: Any  # _Buf / _Tmp
    view: View
    dtype: DType
    reduce: tuple[str, tuple[int, ...], DType] | None


@dataclass
class Recorded:
    """A schedule as it ran, by the slots of its graph's form."""

    device: Any
    temps: list[tuple[int, bool]]  # (bytes, the work-group counter)
    launches: list[_Launch]
    bindings: list[_Bind]
    checked: list[tuple[int, Any]]  # constants the schedule is kept for: (index, value)


class _NotKept(Exception):
    """A schedule the cache cannot keep (a buffer or constant that is not the form's)."""


def record(sched: Schedule, form: Form, device: Any,
           kernels: list[tuple[Any, tuple[Param, ...]]],
           values: dict[str, Any]) -> Recorded | None:
    """``sched``, which ran, as slots of ``form``: ``kernels`` are the built kernels and
    parameters of its launching runs in order, ``values`` the compiler's parameter roles ->
    value functions (``realize._ARG_VALUES``). None where it cannot be kept."""
    temps: dict[int, int] = {}
    temp_list: list[tuple[int, bool]] = []
    for entry in sched.entries:
        if isinstance(entry, Alloc):
            temps[id(entry.temp)] = len(temp_list)
            temp_list.append((entry.temp.nbytes, entry.temp.counter))
    slots = {id(b): i for i, b in enumerate(form.buffers)}

    def ref(b: Any) -> Any:
        if isinstance(b, Temp):
            return _Tmp(temps[id(b)])
        s = slots.get(id(b))
        if s is None:
            raise _NotKept
        return _Buf(s)

    by_value: dict[int, list[int]] = {}
    for i, c in enumerate(form.consts):
        by_value.setdefault(id(c.arg), []).append(i)
    checked: dict[int, Any] = {}
    launches: list[_Launch] = []
    try:
        runs = sched.kernels
        if len(runs) != len(kernels):
            return None
        for kr, (kernel, params) in zip(runs, kernels):
            lw = kr.lowered
            index = np.int64 if lw.wide else np.int32
            args: list[Any] = []
            for p in params:
                if p.role == "const":
                    value, dtype = lw.const_values[p.slot]
                    found = by_value.get(id(value))
                    if not found:
                        raise _NotKept
                    if len(found) > 1:  # one object in several nodes: keep it as it is
                        for i in found:
                            checked[i] = form.consts[i].arg
                    args.append(_Const(found[0], dtype))
                elif p.role in BUFFER_ROLES:
                    args.append(values[p.role](lw, p, ref))
                else:
                    args.append(index(values[p.role](lw, p, ref)))
            geo = kr.geometry
            assert geo is not None
            launches.append(_Launch(kernel, tuple(geo.global_size),
                                    None if geo.local_size is None else tuple(geo.local_size),
                                    args, [ref(b) for b in lw.reads],
                                    [ref(b) for b in lw.writes], kr.name))
        bindings = []
        for b in sched.bindings:
            at = form.index.get(b.node.id)
            if at is None:
                raise _NotKept
            bindings.append(_Bind(at, ref(b.buffer), b.view, b.dtype, b.reduce))
    except _NotKept:
        return None
    return Recorded(device, temp_list, launches, bindings, sorted(checked.items()))


def _same(a: Any, b: Any) -> bool:
    """One constant value: the same type and the same bits (so -0.0 is not 0.0)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(np.asarray(a).tobytes() == np.asarray(b).tobytes())
    except (TypeError, ValueError):
        return False


class FormCache:
    """Recorded schedules by (device, form key), the oldest kept dropped past ``MAX_FORMS``."""

    def __init__(self) -> None:
        self._kept: dict[tuple[Any, ...], Recorded] = {}
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, device: Any, form: Form) -> Recorded | None:
        rec = self._kept.get((id(device), device.kind, form.key))
        if rec is None or rec.device is not device:
            return None
        if rec.checked and any(not _same(form.consts[i].arg, v) for i, v in rec.checked):
            return None
        self.hits += 1  # (a count for tests and benchmarks; a lost update does no harm)
        return rec

    def put(self, device: Any, form: Form, rec: Recorded) -> None:
        k = (id(device), device.kind, form.key)
        with self._lock:
            self._kept.pop(k, None)
            self._kept[k] = rec
            while len(self._kept) > MAX_FORMS:
                del self._kept[next(iter(self._kept))]

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self.hits = 0

    def __len__(self) -> int:
        return len(self._kept)


def launch_values(rec: Recorded, form: Form, temps: list[Any]
                  ) -> list[tuple[_Launch, list[Any], list[Any], list[Any]]]:
    """Each launch of ``rec`` with the arguments, reads and writes of ``form``'s values and the
    run's temporaries ``temps``."""
    bufs = form.buffers
    consts = form.consts

    def value(a: Any) -> Any:
        t = type(a)
        if t is _Buf:
            return bufs[a.slot]
        if t is _Tmp:
            return temps[a.index]
        if t is _Const:
            return scalar_arg(consts[a.index].arg, a.dtype)
        return a

    out = []
    for ln in rec.launches:
        args = ln.args.copy()
        for i in ln.filled:
            args[i] = value(args[i])
        out.append((ln, args, [value(b) for b in ln.reads], [value(b) for b in ln.writes]))
    return out


def bound(rec: Recorded, form: Form, temps: list[Any]) -> list[tuple[Node, Any, _Bind]]:
    """What ``rec``'s run leaves realized: (node of ``form``, buffer, binding)."""
    out = []
    for b in rec.bindings:
        buf = form.buffers[b.buffer.slot] if isinstance(b.buffer, _Buf) else \
            temps[b.buffer.index]
        out.append((form.nodes[b.node], buf, b))
    return out
