"""Reductions over leading axes (column sums): a work-item per output element, adjacent
work-items on adjacent outputs, the reduced axes split into parts while they are long; on CPUs
a group's work-items step through the loop together. The GPU path is forced on whatever device
the tests use (``gpu_path``), the CPU path runs where the device is a CPU; against numpy."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops
from clops.compiler import realize
from clops.compiler.kernel import KernelItem, Output
from clops.compiler.lower import lower
from clops.graph import dtypes as dt
from clops.graph import ir
from clops.graph.ir import View


class _Buf:
    pass


def _sum_item(shape, axes, view=None):
    a = ir.load(_Buf(), view or View.contiguous(shape), dt.float32)
    red = ir.reduce("sum", a, axes, dt.float32)
    return KernelItem(shape, axes, [Output(red, _Buf(), View.contiguous(red.shape))],
                      reduced_out=True)


GPU = SimpleNamespace(kind="gpu", probe=lambda what: False)


def test_layout_is_chosen_by_axes_and_strides():
    assert lower(_sum_item((512, 64), (0,)), GPU).col
    assert lower(_sum_item((8, 16, 64), (0, 1)), GPU).col
    assert not lower(_sum_item((512, 64), (1,)), GPU).col  # rows: a work-group each
    assert lower(_sum_item((512, 64), (0,)), SimpleNamespace(kind="cpu")).col  # CPUs too
    assert lower(_sum_item((512, 3), (0,)), GPU).col  # structural: any number of outputs
    # a transposed operand: adjacent outputs are far apart in memory, rows are contiguous
    t = View.contiguous((64, 512)).permute((1, 0))
    assert not lower(_sum_item((512, 64), (0,), t), GPU).col


def test_rendered_forms():
    from clops.compiler.render import CLRenderer

    cpu_dev = SimpleNamespace(kind="cpu")
    cpu = CLRenderer().render(lower(_sum_item((512, 60), (0,)), cpu_dev).key, 1, "k_test")
    # CPUs: the global id is the output (consecutive lanes), the loop steps the whole group
    # together, and the exact launch needs no bounds check
    assert "row = (long)get_global_id(0);" in cpu and "barrier(CLK_LOCAL_MEM_FENCE)" in cpu
    assert "row >= total" not in cpu and "%" not in cpu.split("__kernel")[1]
    # a last axis of a multiple of 8: a strip of outputs per work-item, float8 vectors
    strip = CLRenderer().render(lower(_sum_item((512, 64), (0,)), cpu_dev).key, 1, "k_test")
    assert "row = (long)get_global_id(0) * 64;" in strip and "vload8(7, b0" in strip
    assert "barrier" not in strip.split("__kernel")[1] and "row >= total" not in strip
    gpu = CLRenderer().render(lower(_sum_item((512, 64), (0,)), GPU).key, 1, "k_test")
    assert "row >= total" in gpu and "barrier" not in gpu.split("__kernel")[1]


def _launches(fn):
    before = realize.STATS["launches"]
    out = fn()
    return out, realize.STATS["launches"] - before


@pytest.mark.parametrize("shape,axis,split", [((10000, 300), 0, True), ((50, 40), 0, False),
                                                ((4096, 300), 0, False),
                                                ((33, 257, 64), (0, 1), True)])
def test_column_sums_split_while_long(gpu_path, shape, axis, split):
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x = clops.asarray(a, device=gpu_path).realize()
    got, n = _launches(lambda: np.asarray(clops.sum(x, axis=axis)))
    np.testing.assert_allclose(got, a.sum(axis=axis, dtype=np.float64), rtol=1e-4, atol=1e-4)
    # columns of at least GPU_COL_MIN_SPLIT reduced elements are split, shorter ones not
    assert (n >= 2) if split else (n == 1)


def test_new_shapes_render_nothing_within_a_plan(gpu_path):
    # shapes are launch arguments: short columns stay one kernel (a GPU_COL_MIN_SPLIT rule, not
    # a new layout), and a split's two kernels are rendered once, for its first shape
    from clops.compiler import render

    def run(*shape):
        a = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        got = np.asarray((clops.tanh(clops.asarray(a, device=gpu_path)) * 3).sum(axis=0))
        np.testing.assert_allclose(got, (np.tanh(a) * 3).sum(0), rtol=1e-4, atol=1e-3)

    run(9, 5)
    r0 = render.RENDER_STATS["renders"]
    for shape in [(3, 2), (17, 11), (1, 40), (64, 3), (4000, 7)]:
        run(*shape)
    assert render.RENDER_STATS["renders"] == r0
    run(9000, 3)
    r1 = render.RENDER_STATS["renders"]
    assert r1 == r0 + 2  # stage 1 over the parts, stage 2 over the partial sums
    for shape in [(10000, 5), (12000, 40)]:
        run(*shape)
    assert render.RENDER_STATS["renders"] == r1


_OPS = {"sum": (clops.sum, np.sum), "max": (clops.max, np.max), "min": (clops.min, np.min),
        "prod": (clops.prod, np.prod), "mean": (clops.mean, np.mean),
        "any": (clops.any, np.any), "all": (clops.all, np.all)}


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # the fixture holds
@given(rows=st.integers(1, 700), cols=st.integers(1, 90), lead=st.integers(1, 3),
       op=st.sampled_from(sorted(_OPS)), dtype=st.sampled_from(["float32", "int32", "float16"]),
       both=st.booleans(), seed=st.integers(0, 2**16))
def test_leading_axis_reductions_match_numpy(gpu_path, rows, cols, lead, op, dtype, both,
                                             seed):
    rng = np.random.default_rng(seed)
    shape = (lead, rows, cols)
    if op == "mean" and dtype == "int32":
        dtype = "float32"  # the Array API's mean takes floats only
    if op == "prod":
        a = rng.choice([1, -1, 1, 1], shape).astype(dtype)
    elif op in ("any", "all"):
        a = (rng.random(shape) < 0.97).astype(dtype)
    else:
        a = (rng.standard_normal(shape) * 10).astype(dtype)
    axis = (0, 1) if both else 1
    fn, ref = _OPS[op]
    got = np.asarray(fn(clops.asarray(a, device=gpu_path), axis=axis))
    if op in ("sum", "mean"):
        want = ref(a.astype(np.float64), axis=axis)
        tol = 2e-2 if dtype == "float16" else 1e-4
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol,
                                   atol=tol * np.sqrt(rows * lead) * 10)
    else:
        np.testing.assert_array_equal(got, ref(a, axis=axis))


def test_outputs_along_the_columns(gpu_path):
    # not a reduced output: each column normalized by its own max and sum (softmax over axis 0)
    a = np.random.default_rng(3).standard_normal((700, 96)).astype(np.float32)
    x = clops.asarray(a, device=gpu_path)
    m = clops.max(x, axis=0, keepdims=True)
    e = clops.exp(x - m)
    got = np.asarray(e / clops.sum(e, axis=0, keepdims=True))
    ea = np.exp(a - a.max(0, keepdims=True))
    np.testing.assert_allclose(got, ea / ea.sum(0, keepdims=True), rtol=1e-5, atol=1e-7)
    centered = np.asarray(x - clops.mean(x, axis=0))
    np.testing.assert_allclose(centered, a - a.mean(0), rtol=1e-5, atol=1e-5)


def test_transposed_and_strided_operands(gpu_path):
    a = np.random.default_rng(4).standard_normal((300, 200)).astype(np.float32)
    x = clops.asarray(a, device=gpu_path)
    np.testing.assert_allclose(np.asarray(clops.sum(x.T, axis=0)), a.T.sum(0), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(np.asarray(clops.sum(x[::3, 1::2], axis=0)),
                               a[::3, 1::2].sum(0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(10_000, 40), (9_000, 7), (12_000, 3, 5)])
def test_long_narrow_columns_on_the_device_as_it_is(device, shape):
    # few outputs, long columns: split into parts on CPUs too (lanes of a group step together)
    a = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    x = clops.asarray(a, device=device).realize()
    got, n = _launches(lambda: np.asarray(clops.sum(x, axis=0)))
    np.testing.assert_allclose(got, a.sum(0, dtype=np.float64), rtol=1e-4, atol=1e-3)
    assert n >= 2
    np.testing.assert_array_equal(np.asarray(clops.max(x, axis=0)), a.max(0))


@pytest.mark.parametrize("op", ["sum", "max", "argmax", "var"])
def test_few_short_columns_of_a_large_array_split(gpu_path, op):
    """Columns shorter than GPU_COL_MIN_SPLIT are split where the array is large (few whole
    columns would leave a GPU idle); a reduction inside the column (argmax's max, var's mean)
    is computed first and splits too. NaN and ties included."""
    from clops.compiler import geometry

    cols = max(geometry.column_items(gpu_path) // 2, 1)  # columns for two parts each
    rows = max(-(-geometry.GPU_COL_SPLIT_ELEMENTS // cols), 2 * geometry.GPU_COL_MIN_CHUNK)
    assert rows < geometry.GPU_COL_MIN_SPLIT
    rng = np.random.default_rng(5)
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    a[rows // 3, 0] = a[rows - 1, 0] = 50.0  # a tie: the first row wins
    a[7, min(1, cols - 1)] = np.nan
    x = clops.asarray(a, device=gpu_path).realize()
    fn = {"sum": clops.sum, "max": clops.max, "argmax": clops.argmax, "var": clops.var}[op]
    got, n = _launches(lambda: np.asarray(fn(x, axis=0)))
    assert n >= 2
    if op == "argmax":
        want = np.where(np.isnan(a).any(0), np.argmax(np.isnan(a), 0), a.argmax(0))
        np.testing.assert_array_equal(got, want)
    elif op == "var":
        np.testing.assert_allclose(got, a.astype(np.float64).var(0), rtol=1e-4, atol=1e-6)
    elif op == "max":
        np.testing.assert_array_equal(got, a.max(0))
    else:
        np.testing.assert_allclose(got, a.sum(0, dtype=np.float64), rtol=1e-4, atol=1e-3)
