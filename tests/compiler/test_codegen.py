"""Rendering without a device: lowered kernels become OpenCL C with the right loads, stores,
index widths and reduction trees. Buffers here are stand-ins; nothing is built or launched."""

from __future__ import annotations

from types import SimpleNamespace

from clops.compiler.geometry import VECTOR_WIDTH
from clops.compiler.kernel import KernelItem, Output
from clops.compiler.lower import lower
from clops.compiler.render import CLRenderer
from clops.graph import dtypes as dt
from clops.graph import ir
from clops.graph.ir import View


class FakeBuffer:
    """Stands in for a device buffer: lowering only needs its identity."""


def _render(item: KernelItem, local: int = 1) -> str:
    lw = lower(item, SimpleNamespace(kind="cpu"))
    return CLRenderer().render(lw.key, local, "k_test")


def _load(shape, dtype=dt.float32, view=None):
    return ir.load(FakeBuffer(), view or View.contiguous(shape), dtype)


def test_flat_elementwise_has_no_index_math():
    a, b = _load((63,)), _load((63,))
    n = ir.ew("add", [ir.ew("multiply", [a, b], dt.float32), a], dt.float32)
    src = _render(KernelItem((63,), (), [Output(n, FakeBuffer(), View.contiguous((63,)))]))
    assert "b0[o0 + gid]" in src and "%" not in src.split("__kernel")[1]
    # CPUs index flat kernels in 64 bits (PoCL vectorizes long offset + gid, not int)
    assert "long gid" in src
    lw = lower(KernelItem((63,), (), [Output(n, FakeBuffer(), View.contiguous((63,)))]),
               SimpleNamespace(kind="gpu", probe=lambda what: False))
    assert "int gid" in CLRenderer().render(lw.key, 64, "k_test")


def test_contiguous_aligned_elementwise_uses_vector_loads_and_stores():
    a, h = _load((64,)), _load((64,), dt.float16)
    n = ir.cast(ir.ew("add", [a, ir.cast(h, dt.float32)], dt.float32), dt.float16)
    item = KernelItem((64,), (), [Output(n, FakeBuffer(), View.contiguous((64,)))])
    w = VECTOR_WIDTH["gpu"]
    src = CLRenderer().render(lower(item, SimpleNamespace(kind="gpu")).key, 1, "k_test")
    assert f"vload{w}(0, b0 + o0 + base)" in src and f"vload_half{w}(0, b1 + o1 + base)" in src
    assert f"vstore_half{w}_rte(sv0, 0, out0 + oo0 + base)" in src
    # CPUs launch exactly: no bounds check (an early return keeps PoCL from vectorizing)
    assert "return;" not in _render(item)


def test_half_and_bfloat16_are_storage_types():
    h = _load((7,), dt.float16)
    bf = _load((7,), dt.bfloat16)
    n = ir.ew("add", [ir.cast(h, dt.float32), ir.cast(bf, dt.float32)], dt.float32)
    n = ir.cast(n, dt.float16)
    src = _render(KernelItem((7,), (), [Output(n, FakeBuffer(), View.contiguous((7,)))]))
    assert "vload_half(" in src and "clops_bf16_load(" in src and "vstore_half_rte(" in src
    assert "__global const half" in src


def test_wide_indices_past_two_to_the_31():
    big = (3, 2**30)
    n = ir.ew("negative", [_load(big)], dt.float32)
    src = _render(KernelItem(big, (), [Output(n, FakeBuffer(), View.contiguous(big))]))
    assert "long gid" in src and "int gid" not in src


def test_gpu_kernels_check_bounds():
    n = ir.ew("negative", [_load((5, 3))], dt.float32)
    lw = lower(KernelItem((5, 3), (), [Output(n, FakeBuffer(), View.contiguous((5, 3)))]),
               SimpleNamespace(kind="gpu"))
    assert "if (gid >= total) return;" in CLRenderer().render(lw.key, 1, "k_test")


def test_reduction_with_local_tree_and_fused_epilogue():
    x = _load((16, 128))
    red = ir.reduce("sum", ir.ew("multiply", [x, x], dt.float32), (1,))
    root = ir.ew("sqrt", [red], dt.float32)
    item = KernelItem((16, 128), (1,), [Output(root, FakeBuffer(), View.contiguous((16, 1)))],
                      reduced_out=True)
    src = _render(item, local=64)
    assert "__local float scratch0[64]" in src and "barrier(CLK_LOCAL_MEM_FENCE)" in src
    assert "sqrt(" in src and "get_group_id(0)" in src


def test_complex_and_fp64_pragma():
    c = _load((4,), dt.complex128)
    n = ir.ew("multiply", [c, c], dt.complex128)
    src = _render(KernelItem((4,), (), [Output(n, FakeBuffer(), View.contiguous((4,)))]))
    assert "cl_khr_fp64" in src and "double2" in src


def test_same_structure_same_key_new_shape():
    def key(shape):
        a = _load(shape)
        n = ir.ew("exp", [a], dt.float32)
        return lower(KernelItem(shape, (), [Output(n, FakeBuffer(), View.contiguous(shape))]),
                     SimpleNamespace(kind="cpu")).key

    assert key((3, 4)) == key((100, 7))
    assert key((3, 4)) != key((3, 4, 5))


def _softmax_item(shape):
    """Row softmax over the last axis as the scheduler fuses it: one kernel, two reductions."""
    x = _load(shape)
    ax = len(shape) - 1

    def back(red):  # the per-row value (reduced axis kept, size 1) broadcast over the row
        strides = tuple(0 if a == ax else st
                        for a, st in enumerate(View.contiguous(red.shape).strides))
        return ir.Node("view", (red,), View(shape, strides, 0), red.dtype, shape)

    ex = ir.ew("exp", [ir.ew("subtract", [x, back(ir.reduce("max", x, (ax,)))], dt.float32)],
               dt.float32)
    out = ir.ew("divide", [ex, back(ir.reduce("sum", ex, (ax,)))], dt.float32)
    return KernelItem(shape, (ax,), [Output(out, FakeBuffer(), View.contiguous(shape))])


def _gpu(ptx=False):
    return SimpleNamespace(kind="gpu", probe=lambda what: ptx and what == "nvidia_ptx")


def test_gpu_row_reduction_vector_loads_unrolled():
    x = _load((16, 4096))
    item = KernelItem((16, 4096), (1,), [Output(ir.reduce("sum", x, (1,)), FakeBuffer(),
                                                View.contiguous((16, 1)))], reduced_out=True)
    lw = lower(item, _gpu())
    assert lw.vrow == VECTOR_WIDTH["gpu"]
    src = CLRenderer().render(lw.key, 256, "k_test")
    w = VECTOR_WIDTH["gpu"]
    assert f"vload{w}(0, b0 + o0 + base)" in src and "acc3" in src
    # portable finish: the local-memory tree, no inline PTX
    assert "shfl" not in src and "scratch0[256]" in src


def test_gpu_softmax_caches_the_row_and_keeps_the_slow_path():
    lw = lower(_softmax_item((8, 1024)), _gpu())
    src = CLRenderer().render(lw.key, 256, "k_test")
    assert "if (rend - rbeg <=" in src and "} else {" in src
    assert "c0_0 = vload4(0, b0 + o0 + base);" in src
    # loaded once per cache step, all before the first use
    assert src.count("c0_0 = vload4") == 1
    assert "vstore4(sv0, 0, out0 + oo0 + base);" in src


def test_gpu_shuffle_finish_only_with_the_ptx_capability():
    nv = CLRenderer().render(lower(_softmax_item((8, 1024)), _gpu(ptx=True)).key, 256, "k")
    assert "shfl.sync.bfly.b32" in nv and "scratch0[8]" in nv
    # every lane reaches the shuffle: it is never an operand of a (conditional) combine
    assert "float o = clops_shfl_xor_f(acc, s);" in nv and "? acc : clops_shfl" not in nv
    cpu = _render(_softmax_item((8, 1024)), local=1)
    assert "shfl" not in cpu and "barrier" not in cpu


def test_gpu_reduction_keys_are_independent_of_sizes():
    def key(shape):
        return lower(_softmax_item(shape), _gpu()).key

    assert key((8, 1024)) == key((3, 4096)) == key((1000, 64))
    # an odd row length is another layout class (no vectors), still one key for all of them
    assert key((8, 1023)) == key((5, 7)) != key((8, 1024))
