"""CPU serial rows on vectors (``lower.serial_vector``: stage 1 of split sums, max and min along
a contiguous last axis in float8 vector accumulators) and arg reductions (``argmax``/``argmin``
of float32 along the last axis in one pass, a best value and position per lane) against numpy,
with special values (NaN, inf, -0.0, ties), odd lengths (vector remainders), views and fused
bodies."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import clops
from clops.compiler.geometry import geometry, row_batch
from clops.compiler.kernel import KernelItem, Output
from clops.compiler.lower import arg_reduce_native, arg_row_chunks, lower
from clops.compiler.render import CLRenderer
from clops.graph import dtypes as dt
from clops.graph import ir
from clops.graph.ir import View

CPU = SimpleNamespace(kind="cpu")
GPU = SimpleNamespace(kind="gpu", probe=lambda what: False)


class _Buf:
    pass


def _item(shape, axes, op="sum", dtype=dt.float32, out=None, chunks=2):
    """Stage 1 of a split reduction (``chunks`` > 1) or a whole one."""
    a = ir.load(_Buf(), View.contiguous(shape), dtype)
    red = ir.reduce(op, a, axes, out or dtype)
    return KernelItem(shape, axes, [Output(red, _Buf(), View.contiguous(red.shape))],
                      reduced_out=True, chunks=chunks)


def test_layout_class():
    assert lower(_item((64, 100), (1,)), CPU).key.vser == 8
    assert lower(_item((4, 64, 100), (1, 2)), CPU).key.vser == 8  # runs of the last axis
    assert lower(_item((64, 100), (1,), op="max"), CPU).key.vser == 8
    assert lower(_item((64, 100), (1,), op="prod"), CPU).key.vser == 0
    assert lower(_item((64, 100), (1,), dtype=dt.float64), CPU).key.vser == 0
    assert lower(_item((64, 100), (0,)), CPU).key.vser == 0  # a column layout
    assert lower(_item((64, 100), (1,)), GPU).key.vser == 0
    assert lower(_item((64, 100), (1,), chunks=1), CPU).key.vser == 8  # whole rows too
    assert lower(_item((4, 64, 100), (2,), op="min", chunks=1), CPU).key.vser == 8
    assert lower(_item((64, 100), (1,), dtype=dt.float64, chunks=1), CPU).key.vser == 0
    assert lower(_item((64, 100), (1,), chunks=1), GPU).key.vser == 0
    assert lower(_item((64, 100), (1,), op="argmax", out=dt.int64, chunks=1),
                 CPU).key.vser == 8
    assert arg_reduce_native(CPU, dt.float32, (5, 7), 1)
    assert not arg_reduce_native(GPU, dt.float32, (5, 7), 1)
    assert not arg_reduce_native(CPU, dt.float64, (5, 7), 1)
    assert arg_reduce_native(CPU, dt.float32, (5, 8), 0)  # a column strip
    assert not arg_reduce_native(CPU, dt.float32, (5, 7), 0)  # no strip width divides 7
    assert not arg_reduce_native(GPU, dt.float32, (5, 8), 0)


def test_long_rows_in_chunks():
    cpu2 = SimpleNamespace(kind="cpu", caps=SimpleNamespace(compute_units=2))
    assert arg_row_chunks(cpu2, 1, 1 << 24) == 8  # 4 work-groups a core
    assert arg_row_chunks(cpu2, 3, 1 << 20) == 4
    assert arg_row_chunks(cpu2, 1, (1 << 20) + 8) == 8
    assert arg_row_chunks(cpu2, 1, (1 << 20) + 2) == 2
    assert arg_row_chunks(cpu2, 1, (1 << 20) + 1) == 0  # no power of two divides it
    assert arg_row_chunks(cpu2, 8, 1 << 22) == 0  # rows enough
    assert arg_row_chunks(cpu2, 1, 1 << 19) == 0  # short
    assert arg_row_chunks(GPU, 1, 1 << 24) == 0


def test_sources():
    src = CLRenderer().render(lower(_item((64, 100), (1,)), CPU).key, 1, "k_test")
    assert "vload8" in src and "vacc3" in src
    src = CLRenderer().render(lower(_item((64, 100), (1,), op="argmax", out=dt.int64,
                                          chunks=1), CPU).key, 1, "k_test")
    assert "islessequal" in src and "select(vi0, cur, t)" in src and "vm3" in src
    src = CLRenderer().render(lower(_item((64, 100), (1,)), GPU).key, 256, "k_test")
    assert "vacc" not in src


def test_rows_in_runs():
    # whole rows on vectors (not split, not scalar): runs of adjacent rows a work-item, as
    # many as the global size leaves each; GPUs keep a work-group a row
    cpu2 = SimpleNamespace(kind="cpu", caps=SimpleNamespace(compute_units=2))
    assert lower(_item((64, 100), (1,), chunks=1), CPU).key.batch
    assert lower(_item((64, 100), (1,), op="argmax", out=dt.int64, chunks=1), CPU).key.batch
    assert not lower(_item((64, 100), (1,)), CPU).key.batch  # stage 1 of a split
    assert not lower(_item((64, 100), (1,), op="prod", chunks=1), CPU).key.batch  # scalar
    assert not lower(_item((64, 100), (1,), chunks=1), GPU).key.batch
    assert row_batch(cpu2, 8192, 64) == 64
    assert row_batch(cpu2, 1000, 64) == 31  # 16 work-items a core at least
    assert row_batch(cpu2, 100, 64) == 3
    assert row_batch(cpu2, 4096, 4096) == 1
    assert row_batch(cpu2, 5, 3) == 1
    lw = lower(_item((64, 128, 64), (2,), chunks=1), cpu2)
    assert geometry(cpu2, lw).global_size == (64 * 128 // 64,)
    lw = lower(_item((1000, 64), (1,), chunks=1), cpu2)
    assert geometry(cpu2, lw).global_size == (33,)  # the last work-item takes 8 rows
    gpu = SimpleNamespace(kind="gpu", probe=lambda what: False,
                          caps=SimpleNamespace(compute_units=2, max_work_group=1024))
    g = geometry(gpu, lower(_item((1000, 64), (1,), chunks=1), gpu))
    assert g.global_size == (1000 * 256,) and g.local_size == (256,)


def test_row_sources():
    src = CLRenderer().render(lower(_item((64, 100), (1,), op="max", chunks=1), CPU).key, 1,
                              "k_test")
    assert "get_global_size(0)" in src and "for (long row = row0; row < rowend; row++)" in src
    assert "float4 vf4" in src and "float2 vf2" in src and "vacc3" in src
    assert "vnan |= isnan(v0_v)" in src and "if (any(vnan))" in src  # NaN beside the extreme
    src = CLRenderer().render(lower(_item((64, 100), (1,), chunks=1), CPU).key, 1, "k_test")
    assert "vnan" not in src
    assert "return;" not in src
    for op in ("sum", "max", "min"):
        for chunks in (1, 2):
            src = CLRenderer().render(lower(_item((64, 100), (1,), op=op, chunks=chunks),
                                            GPU).key, 256, "k_test")
            assert "get_global_size" not in src and "vf4" not in src and "row0" not in src
            assert "get_group_id(0)" in src


LENGTHS = [1, 7, 8, 9, 31, 32, 33, 100, 1000, 4099, 20_011]  # the last: split on CPUs


def _special(rng, shape):
    a = rng.standard_normal(shape).astype(np.float32)
    flat = a.reshape(-1)
    flat[rng.integers(0, flat.size, max(1, flat.size // 13))] = -0.0
    return a


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_rows_match_numpy(device, op, n):
    rng = np.random.default_rng(n)
    a = _special(rng, (5, n))
    if op in ("max", "min") and n > 3:
        a[1, n // 2] = np.nan
        a[2, n // 3] = np.inf
        a[3, :] = -np.inf
    x = clops.asarray(a, device=device)
    fn, ref = getattr(clops, op), getattr(np, op)
    for got, want in [(fn(x, axis=1), ref(a, axis=1)), (fn(x[0]), ref(a[0])),
                      (fn(x, axis=None), ref(a, axis=None))]:
        if op in ("max", "min"):
            np.testing.assert_array_equal(np.asarray(got), want)
        else:
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * n)


def test_long_row_sum_is_accurate(device):
    # 2^22 float32 of one sign: as close to the float64 sum as numpy's pairwise sum
    a = np.random.default_rng(3).random(1 << 22).astype(np.float32)
    got = float(np.asarray(clops.sum(clops.asarray(a, device=device))))
    exact = a.astype(np.float64).sum()
    assert abs(got - exact) <= max(4 * abs(float(a.sum()) - exact), 1e-6 * exact)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_rows_match_numpy(device, op, n):
    rng = np.random.default_rng(n + 1)
    cases = [rng.standard_normal((4, n)).astype(np.float32),
             np.round(rng.standard_normal((4, n)) * 2).astype(np.float32),  # ties
             np.full((3, n), -np.inf, np.float32), np.full((3, n), np.inf, np.float32),
             np.full((3, n), np.nan, np.float32),
             np.where(rng.random((3, n)) < 0.5, np.float32(0.0), np.float32(-0.0))]
    a = rng.standard_normal((3, n)).astype(np.float32)
    a[0, n // 2] = np.nan
    a[0, n - 1] = np.nan
    a[1, n - 1] = np.inf
    a[2, 0] = -np.inf
    cases.append(a)
    fn, ref = getattr(clops, op), getattr(np, op)
    for c in cases:
        x = clops.asarray(c, device=device)
        np.testing.assert_array_equal(np.asarray(fn(x, axis=-1)), ref(c, axis=-1))
        np.testing.assert_array_equal(np.asarray(fn(x)), ref(c))
        np.testing.assert_array_equal(np.asarray(fn(x, axis=-1, keepdims=True)),
                                      ref(c, axis=-1, keepdims=True))


def test_arg_views_and_fused_bodies(device):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((40, 67)).astype(np.float32)
    b = rng.standard_normal((40, 67)).astype(np.float32)
    x, y = clops.asarray(a, device=device), clops.asarray(b, device=device)
    for op in ("argmax", "argmin"):
        fn, ref = getattr(clops, op), getattr(np, op)
        np.testing.assert_array_equal(np.asarray(fn(x * y - 0.5 * x, axis=1)),
                                      ref(a * b - np.float32(0.5) * a, axis=1))
        np.testing.assert_array_equal(np.asarray(fn(clops.permute_dims(x, (1, 0)), axis=1)),
                                      ref(a.T, axis=1))
        np.testing.assert_array_equal(np.asarray(fn(x[:, 3::2], axis=1)), ref(a[:, 3::2], 1))
        np.testing.assert_array_equal(np.asarray(fn(x[5:, 1:])), ref(a[5:, 1:]))
        np.testing.assert_array_equal(np.asarray(fn(x, axis=0)), ref(a, axis=0))
