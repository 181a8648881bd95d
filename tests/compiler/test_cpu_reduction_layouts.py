"""CPU reduction layouts against numpy: column strips (a work-item per strip of the last axis,
float8 vectors) and rows over several reduced axes walked a run at a time, with special values
(nan, inf, -0, large), empty and split reductions; and the GPU forms left as they were."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import clops
from clops.compiler.kernel import KernelItem, Output
from clops.compiler.lower import lower
from clops.compiler.render import CLRenderer
from clops.graph import dtypes as dt
from clops.graph import ir
from clops.graph.ir import View
from clops.runtime import probes

CPU = SimpleNamespace(kind="cpu")
GPU = SimpleNamespace(kind="gpu", probe=lambda what: False)


class _Buf:
    pass


def _item(shape, axes, op="sum", dtype=dt.float32):
    a = ir.load(_Buf(), View.contiguous(shape), dtype)
    red = ir.reduce(op, a, axes, dtype)
    return KernelItem(shape, axes, [Output(red, _Buf(), View.contiguous(red.shape))],
                      reduced_out=True)


def test_layout_classes():
    assert lower(_item((512, 64), (0,)), CPU).strip == 64
    assert lower(_item((512, 40), (0,)), CPU).strip == 8
    assert lower(_item((9, 512, 16), (0, 1)), CPU).strip == 16
    assert lower(_item((512, 60), (0,)), CPU).strip == 0  # no width divides the last axis
    assert lower(_item((512, 64), (0,), dtype=dt.int32), CPU).strip == 0
    assert lower(_item((512, 64), (0,), op="prod"), CPU).strip == 0
    assert lower(_item((512, 64), (0,)), GPU).strip == 0
    assert lower(_item((64, 64), (0, 1)), CPU).key.runs
    assert not lower(_item((64, 64), (1,)), CPU).key.runs
    assert not lower(_item((64, 64), (0, 1)), GPU).key.runs


def test_gpu_sources_have_neither():
    for item in (_item((512, 64), (0,)), _item((64, 64), (0, 1)), _item((8, 16, 64), (0, 1))):
        src = CLRenderer().render(lower(item, GPU).key, 256, "k_test")
        assert "vload8" not in src and "rstop" not in src


def _special(rng, shape):
    a = (rng.standard_normal(shape) * 100).astype(np.float32)
    flat = a.reshape(-1)
    n = flat.size
    flat[rng.integers(0, n, max(1, n // 97))] = -0.0
    flat[rng.integers(0, n, max(1, n // 4000))] = 1e37  # large (sums may reach inf)
    return a


def _check(got, want, op, reduced):
    if op in ("max", "min"):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * np.sqrt(reduced) * 100)


OPS = {"sum": (clops.sum, np.sum), "max": (clops.max, np.max), "min": (clops.min, np.min),
       "mean": (clops.mean, np.mean), "var": (clops.var, np.var)}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("shape,axis", [((300, 64), 0), ((77, 40), 0), ((5, 33, 16), (0, 1)),
                                        ((6, 7, 128), 1), ((20_000, 8), 0), ((3, 4096, 64), 1),
                                        ((40, 50), None), ((7, 9, 11), (1, 2)),
                                        ((9, 300, 70), (0, 2)), ((3, 5000, 13), None)])
def test_reductions_match_numpy(device, op, shape, axis):
    rng = np.random.default_rng(len(shape) * 1000 + shape[-1])
    a = _special(rng, shape)
    if op not in ("mean", "var"):  # nan and -inf in some columns
        flat = a.reshape(-1)
        flat[rng.integers(0, flat.size, 3)] = np.nan
        flat[rng.integers(0, flat.size, 3)] = -np.inf
    fn, ref = OPS[op]
    x = clops.asarray(a, device=device)
    with np.errstate(over="ignore", invalid="ignore"):
        # sums against float64 (then rounded), mean as numpy's float32 mean (its sum overflows)
        want = ref(a.astype(np.float64), axis=axis).astype(np.float32) if op == "sum" \
            else ref(a, axis=axis)
    reduced = a.size // np.asarray(want).size
    _check(np.asarray(fn(x, axis=axis)), want, op, reduced)


@pytest.mark.parametrize("shape,axis", [((0, 64), 0), ((4, 0, 16), (0, 1)), ((0, 8), None),
                                        ((3, 0, 5), (1, 2))])
def test_empty(device, shape, axis):
    x = clops.asarray(np.ones(shape, np.float32), device=device)
    want = np.ones(shape, np.float32).sum(axis=axis)
    np.testing.assert_array_equal(np.asarray(clops.sum(x, axis=axis)), want)


def test_fused_column_chain_and_offsets(device):
    # the body fused into a strip (arithmetic, constants), an operand at an offset, mean's
    # divide after the reduction; and -0 columns (max of -0 and 0 compares equal)
    rng = np.random.default_rng(7)
    a = rng.standard_normal((257, 96)).astype(np.float32)
    b = rng.standard_normal((258, 96)).astype(np.float32)
    x, y = clops.asarray(a, device=device), clops.asarray(b, device=device)[1:]
    got = np.asarray(clops.sum(x * y - 0.5 * x, axis=0))
    np.testing.assert_allclose(got, (a * b[1:] - np.float32(0.5) * a).sum(0), rtol=1e-4,
                               atol=1e-3)
    np.testing.assert_allclose(np.asarray(clops.mean(x * 2, axis=0)), (a * 2).mean(0),
                               rtol=1e-5, atol=1e-6)
    z = np.full((33, 16), -0.0, np.float32)
    np.testing.assert_array_equal(np.asarray(clops.max(clops.asarray(z, device=device),
                                                       axis=0)), z.max(0))


def _arg_item(shape, axes, op="argmax"):
    a = ir.load(_Buf(), View.contiguous(shape), dt.float32)
    red = ir.reduce(op, a, axes, dt.int64)
    return KernelItem(shape, axes, [Output(red, _Buf(), View.contiguous(red.shape))],
                      reduced_out=True)


def test_arg_strip_layout_and_sources():
    assert lower(_arg_item((512, 64), (0,)), CPU).strip == 64
    assert lower(_arg_item((9, 512, 40), (1,), op="argmin"), CPU).strip == 8
    assert lower(_arg_item((512, 60), (0,)), CPU).strip == 0
    assert lower(_arg_item((512, 64), (0,)), GPU).strip == 0
    src = CLRenderer().render(lower(_arg_item((512, 64), (0,)), CPU).key, 1, "k_test")
    assert "islessequal" in src and "convert_long8" in src and "vstore8(v" in src


@pytest.mark.parametrize("shape,axis", [((64, 128, 64), 0), ((64, 128, 64), 1),
                                        ((300, 40), 0), ((3, 700, 8), 1)])
def test_logsumexp_strips(device, shape, axis):
    """exp and log on a strip's vectors where the device's vector forms agree with its scalar
    ones (``lower.STRIP_MATH``): numpy's values, and the strip taken."""
    rng = np.random.default_rng(shape[-1])
    a = (rng.standard_normal(shape) * 10).astype(np.float32)
    a.reshape(-1)[rng.integers(0, a.size, 5)] = -np.inf
    x = clops.asarray(a, device=device)
    m = clops.max(x, axis=axis, keepdims=True)
    t = clops.log(clops.sum(clops.exp(x - m), axis=axis, keepdims=True)) + m
    keys = [s.key for s in clops.compiler.schedule_of(t).entries if hasattr(s, "key")]
    if device.kind == "cpu" and probes.vector_math_agrees(device, "exp") and \
            probes.vector_math_agrees(device, "log"):
        assert any(k.strip for k in keys)
    mn = a.max(axis=axis, keepdims=True)
    want = np.log(np.exp(a - mn).sum(axis=axis, keepdims=True)) + mn
    np.testing.assert_allclose(np.asarray(t), want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("shape,axis", [((37, 1001), 1), ((64, 128, 64), 2), ((70001,), None),
                                        ((3, 50000), None), ((5, 7), 1)])
def test_logsumexp_serial_rows(device, shape, axis):
    """exp on the vectors of serial rows (the last axis, and stage 1 of a split reduction over
    all) where the device's vector exp agrees with its scalar one: numpy's values (-inf
    elements; a row of -inf alone: NaN, as numpy's), and the vectors taken."""
    rng = np.random.default_rng(sum(shape))
    a = (rng.standard_normal(shape) * 10).astype(np.float32)
    a.reshape(-1)[rng.integers(0, a.size, 7)] = -np.inf
    if axis is not None:
        a.reshape(-1, shape[-1])[1] = -np.inf
    x = clops.asarray(a, device=device)
    m = clops.max(x, axis=axis, keepdims=True)
    t = clops.log(clops.sum(clops.exp(x - m), axis=axis, keepdims=True)) + m
    keys = [s.key for s in clops.compiler.schedule_of(t).entries if hasattr(s, "key")]
    if device.kind == "cpu" and probes.vector_math_agrees(device, "exp"):
        assert any(k.vser for k in keys if "exp" in repr(k))
    mn = a.max(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        want = np.log(np.exp(a - mn).sum(axis=axis, keepdims=True)) + mn
    got = np.asarray(t)
    if axis is not None:
        assert np.isnan(got.reshape(-1)[1]) and np.isnan(want.reshape(-1)[1])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
