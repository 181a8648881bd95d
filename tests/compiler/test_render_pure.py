"""Rendering is a function of the key: a renderer holds no state of a render, so threads that
render the same keys at once get the sources, argument types and parameters of one render at a
time; and the arguments a launch passes are the parameters the rendered kernel declares, in
its order (``KernelKey.params``, written once), checked here against the source's signature
read back parameter by parameter."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import clops
from clops.compiler import realize
from clops.compiler.kernel import KernelKey
from clops.compiler.lower import scalar_arg
from clops.compiler.render import CLRenderer, RenderedKernel
from clops.compiler.schedule import KernelRun, schedule
from clops.graph import dtypes as dt
from clops.graph import ir
from clops.graph.ir import View, contiguous_strides
from tests.compiler.test_backend_seam import FakeBuffer, FakeDevice
from tests.threads import run_threads


def _expressions(device: Any) -> dict[str, Any]:
    """Tensors whose plans hold kernels of many kinds: flat (vector and scalar), strided,
    views inside the kernel, constants of several types, row, column and split reductions."""
    rng = np.random.default_rng(0)

    def put(x: np.ndarray) -> Any:
        return clops.asarray(x, device=device)

    a, b = put(rng.random((64, 96), dtype=np.float32)), put(rng.random((64, 96), dtype=np.float32))
    h = put(rng.random((8, 6, 40)).astype(np.float16))
    i = put(rng.integers(0, 9, (64, 96)).astype(np.int32))
    v = put(rng.random(300_000, dtype=np.float32))
    shifted = clops.exp(a - clops.max(a, axis=1, keepdims=True))
    return {
        "flat": a * b + 1.5, "sin": clops.sin(a), "strided": a.T * 2.0,
        "slices": a[:, ::2] + b[:, 1::2], "view": clops.reshape(a.T, (-1,))[:50] + 1.0,
        "rows": clops.sum(a * b, axis=1), "columns": clops.sum(a, axis=0),
        "softmax": shifted / clops.sum(shifted, axis=1, keepdims=True),
        "long row": clops.sum(v), "two axes": clops.sum(h, axis=(0, 2)),
        "where": clops.where(i > 3, a, b), "int const": i * 3 + 1,
        "cast": clops.astype(i, clops.float32) * 0.5,
    }


def _steps(device: Any) -> list[KernelRun]:
    steps = []
    for t in _expressions(device).values():
        steps += clops.compiler.schedule_of(t).kernels
    return steps


@pytest.fixture(params=["as is", "gpu"])
def steps(request: pytest.FixtureRequest, device: Any,
          monkeypatch: pytest.MonkeyPatch) -> list[KernelRun]:
    """The kernels of ``_expressions``, planned for the device as it is and taken for a GPU
    (work-group rows, vector rows, the register cache, split rows finished in one kernel)."""
    if request.param == "gpu":
        monkeypatch.setattr(device, "kind", "gpu")
    return _steps(device)


def _local(step: KernelRun) -> int:
    return step.geometry.local if step.geometry is not None else 0


def test_a_renderer_holds_no_state():
    renderer = CLRenderer()
    with pytest.raises(AttributeError):
        renderer.render_state = 1  # type: ignore[attr-defined]
    assert not hasattr(renderer, "__dict__")


def test_threads_rendering_the_same_keys_at_once_get_one_render_each(device, steps):
    # One renderer for every thread, as the compiler uses it: each thread renders every key
    # (in an order of its own) while the others do, and gets what a render alone gives.
    keys = [(s.key, _local(s), s.name) for s in steps]
    assert len({k for k, _, _ in keys}) >= 10
    want = [CLRenderer().render_kernel(*k) for k in keys]
    shared = CLRenderer()
    got: dict[int, list[RenderedKernel]] = {}

    def work(t: int) -> None:
        order = [(j + t) % len(keys) for j in range(len(keys))]
        for _ in range(3):
            for j in order:
                got.setdefault(t, []).append(shared.render_kernel(*keys[j]))
                assert got[t][-1] == want[j], (t, keys[j][2])

    run_threads(work)
    assert sum(len(g) for g in got.values()) == 3 * len(keys) * len(got)


def _signature(source: str, name: str) -> list[str]:
    """The parameter declarations of kernel ``name`` in ``source``, in order."""
    start = source.index(f" {name}(\n") + len(name) + 2
    return [d.strip() for d in source[start:source.index(")\n{", start)].split(",\n")]


def _expected(param: str, lw: Any) -> Any:
    """What a launch of ``lw`` must pass for the parameter named ``param``, read from its name
    alone (a second reading of the names ``KernelKey.params`` gives)."""
    m = re.fullmatch(r"([a-z]+?)(\d*)(?:_(\d+))?", param)
    assert m is not None, param
    stem, k, j = m.group(1), int(m.group(2) or 0), int(m.group(3) or 0)
    full, raxes = lw.full, lw.raxes
    rn = ir.prod([full[a] for a in raxes])
    chunk = -(-rn // lw.chunks)
    if lw.vrow:
        chunk = -(-chunk // lw.vrow) * lw.vrow
    total = ir.prod([n for a, n in enumerate(full) if a not in raxes]) if raxes else \
        ir.prod(full) // max(lw.flat, 1)
    table = {
        "out": lambda: lw.out_buffers[k], "oo": lambda: lw.out_views[k].offset,
        "os": lambda: lw.out_views[k].strides[j],
        "b": lambda: lw.leaf_buffers[k], "o": lambda: lw.leaf_views[k].offset,
        "s": lambda: lw.leaf_views[k].strides[j],
        "vo": lambda: lw.view_args[k][0].offset, "vs": lambda: lw.view_args[k][0].strides[j],
        "vq": lambda: lw.view_args[k][1][j],
        "vp": lambda: contiguous_strides(lw.view_args[k][1])[j],
        "c": lambda: scalar_arg(*lw.const_values[k]), "n": lambda: full[k],
        "total": lambda: total, "rn": lambda: rn, "nchunks": lambda: lw.chunks,
        "chunk": lambda: chunk, "count": lambda: lw.combine[0], "fin": lambda: lw.combine[1],
        "fo": lambda: lw.combine[2].offset,
    }
    return table[stem]()


def _check_launch(step: KernelRun) -> set[str]:
    """Check one kernel's launch arguments against its rendered signature; its roles."""
    lw = step.lowered
    rendered = CLRenderer().render_kernel(lw.key, _local(step), step.name)
    decls = _signature(rendered.source, step.name)
    names = [d.split()[-1].lstrip("*") for d in decls]
    assert names == [p.name for p in rendered.params] == [p.name for p in lw.key.params()]
    assert len(rendered.arg_types) == len(decls)
    args = realize.launch_args(lw, lambda b: b, rendered.params)
    assert len(args) == len(decls), step.name
    index = np.int64 if lw.wide else np.int32
    for decl, name, arg, arg_type in zip(decls, names, args, rendered.arg_types):
        want = _expected(name, lw)
        if "*" in decl:  # a buffer, passed as it is
            assert arg is want and arg_type is None, (step.name, decl)
        elif not re.fullmatch(r"c\d+", name):  # an index, of the kernel's index type
            assert decl.split()[0] == ("long" if lw.wide else "int"), (step.name, decl)
            assert type(arg) is index and arg == want and arg_type == np.dtype(index), decl
        else:  # a constant, of its math type
            assert type(arg) is type(want) and np.array(arg).tobytes() == \
                np.array(want).tobytes(), (step.name, decl)
            assert arg_type is None or arg_type == np.array(arg).dtype, (step.name, decl)
    return {p.role for p in rendered.params}


def test_launch_arguments_are_the_rendered_parameters_in_order(device, steps):
    roles: set[str] = set()
    for step in steps:
        roles |= _check_launch(step)
    # the kernels above cover these parameters (a split row finished in one kernel on a GPU)
    assert {"out", "out_offset", "out_stride", "leaf", "leaf_offset", "leaf_stride",
            "view_offset", "view_stride", "view_shape", "view_pitch", "const", "size",
            "total", "rn", "nchunks", "chunk"} <= roles
    if device.kind == "gpu":
        assert {"count", "fin", "fin_offset"} <= roles


def test_every_parameter_role_has_a_launch_value():
    # a role the launch path does not know would fail at the first launch of such a kernel
    roles = {"out", "out_offset", "out_stride", "leaf", "leaf_offset", "leaf_stride",
             "view_offset", "view_stride", "view_shape", "view_pitch", "const", "size",
             "total", "rn", "nchunks", "chunk", "count", "fin", "fin_offset"}
    assert set(realize._ARG_VALUES) == roles
    key = KernelKey(rank=2, raxes=(1,), chunked=True, combine="float32", reduced_out=True,
                    flat=0, wide=False, leaves=(), views=(), consts=(), reductions=(),
                    instrs=(), outputs=(), guard=True, vrow=0, cache=0, shfl=False, col=False)
    assert {p.role for p in key.params()} <= roles


def test_a_plan_launches_the_parameters_its_kernels_declare():
    # through realize.run on a device that records what it is given (no OpenCL)
    device = FakeDevice()
    bufs = [FakeBuffer() for _ in range(2)]
    a, b = (ir.load(buf, View.contiguous((64, 1000)), dt.float32) for buf in bufs)
    t = ir.load(bufs[0], View((1000, 64), (1, 1000), 0), dt.float32)  # a transposed view
    outs = [ir.reduce("sum", ir.ew("multiply", [a, b], dt.float32), (1,), dt.float32),
            ir.ew("add", [t, ir.const(2.0, dt.float32, (1000, 64))], dt.float32)]
    plan = schedule([(o, None, None) for o in outs], device)
    assert len(plan.kernels) == 2
    try:
        realize.run(plan, device)
    finally:
        for step in plan.kernels:
            realize._KERNELS.pop((id(device), CLRenderer, step.key, _local(step)), None)
    built = dict(device.built)
    assert len(device.launches) == 2
    for (_kernel, _global, _local_size, nargs, name) in device.launches:
        assert nargs == len(_signature(built[name], name)), name
