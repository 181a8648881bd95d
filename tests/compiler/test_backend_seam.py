"""The backend seam: a device that only satisfies the compiler's ``Device`` protocol (no
OpenCL anywhere) and a renderer subclass that changes spellings. Scheduling, lowering,
rendering and running a plan go through that interface alone, and the source uses the
subclass's spellings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clops.compiler import realize
from clops.compiler.device import Device
from clops.compiler.render import CLRenderer
from clops.compiler.schedule import schedule
from clops.graph import dtypes as dt
from clops.graph import ir
from clops.graph.ir import View
from clops.runtime import cltypes


class FakeBuffer:
    def __init__(self, nbytes: int = 0) -> None:
        self.nbytes = nbytes


@dataclass
class FakeCaps:
    compute_units: int = 8
    max_work_group: int = 256


@dataclass
class FakeDevice:
    """Records what the compiler asks of it."""

    kind: str = "gpu"
    caps: FakeCaps = field(default_factory=FakeCaps)
    built: list[tuple[str, str]] = field(default_factory=list)
    launches: list[tuple[Any, ...]] = field(default_factory=list)
    allocs: list[int] = field(default_factory=list)

    def probe(self, what: str) -> bool:
        return False

    def alloc(self, nbytes: int) -> Any:
        self.allocs.append(nbytes)
        return FakeBuffer(nbytes)

    def write(self, buf: Any, host: Any, offset: int = 0, *, blocking: bool = False) -> Any:
        return None

    def kernel(self, source: str, name: str, options: Any = (), arg_types: Any = None) -> Any:
        self.built.append((name, source))
        return ("kernel", name)

    def launch(self, kernel: Any, global_size: Any, local_size: Any, args: Any, *,
               reads: Any = (), writes: Any = (), name: str | None = None) -> Any:
        self.launches.append((kernel, tuple(global_size), local_size, len(args), name))
        return None


class ToyRenderer(CLRenderer):
    """Another language's spellings, changed by class attributes only."""

    kernel_prefix = "KERNEL void"
    global_ptr = "GLOBAL"
    local_decl = "SHARED"
    group_id = "block_index()"
    local_id = "thread_index()"
    barrier = "sync_threads();"
    storage_types = {**cltypes.STORAGE, "float32": "f32"}
    math_types = {**cltypes.MATH, "float32": "f32"}
    ew_table = {**CLRenderer.ew_table, "add": {"f": "add_f32({a}, {b})"},
                "multiply": {"f": "mul_f32({a}, {b})"}}
    reduce_combine = {**CLRenderer.reduce_combine, "sum": {"f": "add_f32({a}, {b})"}}
    prelude_file = "cl/prelude.cl"

    def prelude(self) -> str:
        return "// toy prelude"


def _graph() -> tuple[ir.Node, list[FakeBuffer]]:
    bufs = [FakeBuffer() for _ in range(3)]
    a, b, c = (ir.load(buf, View.contiguous((64, 1000)), dt.float32) for buf in bufs)
    y = ir.ew("add", [ir.ew("multiply", [a, b], dt.float32), c], dt.float32)
    return ir.reduce("sum", y, (1,), dt.float32), bufs


def test_fake_device_satisfies_the_protocol():
    device: Device = FakeDevice()  # checked by mypy where the tests are type-checked
    assert device.kind == "gpu"


def test_a_renderer_subclass_spells_the_kernel(monkeypatch):
    def no_opencl(*a, **k):
        raise AssertionError("an OpenCL call")

    import pyopencl as cl

    for name in ("Program", "Kernel", "Buffer", "enqueue_nd_range_kernel", "enqueue_copy"):
        monkeypatch.setattr(cl, name, no_opencl)
    device = FakeDevice()
    out, _ = _graph()
    plan = schedule([(out, None, None)], device)
    (step,) = plan.kernels
    assert step.key.raxes == (1,) and step.geometry is not None
    src = ToyRenderer().render(step.key, step.geometry.local, step.name)
    assert "// toy prelude" in src
    assert "KERNEL void k_multiply_add_sum(" in src
    assert "GLOBAL const f32 *b0" in src and "GLOBAL f32 *out0" in src
    assert "mul_f32(" in src and "add_f32(" in src and "SHARED f32 scratch0" in src
    assert "sync_threads();" in src and "block_index()" in src
    for cl_word in ("__kernel", "__global", "__local", "barrier(", "float"):
        assert cl_word not in src, cl_word
    # the OpenCL renderer spells the same key in OpenCL C
    cl_src = CLRenderer().render(step.key, step.geometry.local, step.name)
    assert "__kernel void k_multiply_add_sum(" in cl_src and "__global const float *b0" in cl_src

    # running the plan goes through the protocol alone: alloc, kernel build, launch
    key = (id(device), ToyRenderer, step.key, step.geometry.local)
    try:
        realize.run(plan, device, ToyRenderer())
    finally:
        realize._KERNELS.pop(key, None)
    assert device.allocs == [64 * 4]
    assert [name for name, _ in device.built] == [step.name]
    assert "KERNEL void" in device.built[0][1]
    (launch,) = device.launches
    assert launch[1] == step.geometry.global_size and launch[4] == step.name
    assert isinstance(out.resolve().arg[0], FakeBuffer)  # the output's new buffer


def test_rendering_needs_no_device_state():
    out, _ = _graph()
    cpu = FakeDevice(kind="cpu")
    (step,) = schedule([(out, None, None)], cpu).kernels
    src = ToyRenderer().render(step.key, step.geometry.local, step.name)
    assert "KERNEL void" in src and "add_f32(" in src
    assert not cpu.allocs and not cpu.launches and not cpu.built
