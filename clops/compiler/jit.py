"""Compiler, jit: capture the kernels and buffers of a call once, then replay the launch plan
on new inputs of the same signature with no graph building, scheduling or lookups."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# While capturing: every launch appends (kernel, gsize, lsize, args, reads, writes, name).
RECORDING: list[list[tuple[Any, ...]]] = []


class JitError(RuntimeError):
    """A function cannot be captured (it reads values back to the host, say)."""


def check_not_recording(what: str) -> None:
    if RECORDING:
        raise JitError(f"{what} inside a clops.jit function: a captured function must stay on "
                       "the device (return tensors and read them after the call)")


@dataclass
class Plan:
    launches: list[tuple[Any, ...]]
    n_inputs: int
    outputs: list[tuple[Any, Any, Any]]  # (source marker, View, dtype) per output
    structure: Any  # how outputs nest: None for a single tensor, else a tuple/list length
    device: Any
    out_sizes: dict[int, int] = field(default_factory=dict)


def _flatten(out: Any) -> tuple[list[Any], Any]:
    from ..array.tensor import Tensor

    if isinstance(out, Tensor):
        return [out], None
    if isinstance(out, tuple | list) and all(isinstance(o, Tensor) for o in out):
        return list(out), (type(out), len(out))
    raise JitError("a clops.jit function must return a Tensor or a tuple/list of Tensors")


def jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Capture ``fn``'s kernels on the first call for each signature (shapes, dtypes, strides,
    offsets of tensor arguments, and the other arguments' values) and replay them afterwards.

    >>> @clops.jit
    ... def step(x, y):
    ...     return (x * y + 1).sum(axis=1)
    """
    plans: dict[Any, Plan] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        from ..array.tensor import Tensor

        tensors = [a for a in args if isinstance(a, Tensor)]
        for t in tensors:
            t.realize()
        sig = tuple((a.shape, a.dtype.name, a.strides, a.offset, id(a.device))
                    if isinstance(a, Tensor) else ("py", a) for a in args)
        plan = plans.get(sig)
        if plan is None:
            plan, result = _capture(fn, args, tensors)
            plans[sig] = plan
            return result
        return _replay(plan, tensors)

    wrapper.plans = plans  # type: ignore[attr-defined]
    return wrapper


def _capture(fn: Callable[..., Any], args: tuple[Any, ...], tensors: list[Any]
             ) -> tuple[Plan, Any]:
    from ..array.tensor import realize

    rec: list[tuple[Any, ...]] = []
    RECORDING.append(rec)
    try:
        result = fn(*args)
        outs, structure = _flatten(result)
        realize(*outs)
    finally:
        RECORDING.remove(rec)
    in_ids = {id(t.buffer): i for i, t in enumerate(tensors)}
    out_ids: dict[int, int] = {}
    outputs = []
    out_sizes: dict[int, int] = {}
    for t in outs:
        buf = t.buffer
        if id(buf) in in_ids:
            src = ("in", in_ids[id(buf)])
        elif any(w is buf for r in rec for w in r[5]):
            j = out_ids.setdefault(id(buf), len(out_ids))
            out_sizes[j] = buf.nbytes
            src = ("out", j)
        else:
            src = ("keep", buf)
        outputs.append((src, t._load.arg[1], t.dtype))

    def mark(b: Any) -> Any:
        if id(b) in in_ids:
            return ("in", in_ids[id(b)])
        if id(b) in out_ids:
            return ("out", out_ids[id(b)])
        return ("keep", b)

    from ..runtime import Buffer

    launches = []
    for kernel, g, l, largs, reads, writes, name in rec:
        margs = [mark(a) if isinstance(a, Buffer) else ("val", a) for a in largs]
        launches.append((kernel, g, l, margs, [mark(b) for b in reads],
                         [mark(b) for b in writes], name))
    dev = tensors[0].device if tensors else None
    if dev is None and outs:
        dev = outs[0].device
    plan = Plan(launches, len(tensors), outputs, structure, dev, out_sizes)
    return plan, result


def _replay(plan: Plan, tensors: list[Any]) -> Any:
    from ..array.tensor import Tensor
    from ..graph import ir

    dev = plan.device
    ins = [t.buffer for t in tensors]
    outs = {j: dev.alloc(n) for j, n in plan.out_sizes.items()}

    def get(m: tuple[str, Any]) -> Any:
        kind, v = m
        if kind == "in":
            return ins[v]
        if kind == "out":
            return outs[v]
        return v

    for kernel, g, l, margs, reads, writes, name in plan.launches:
        dev.launch(kernel, g, l, [get(m) for m in margs], reads=[get(m) for m in reads],
                   writes=[get(m) for m in writes], name=name)
    results = [Tensor(ir.load(get(src), view, dtype), dev) for src, view, dtype in plan.outputs]
    if plan.structure is None:
        return results[0]
    return plan.structure[0](results)
