"""Elementwise functions against numpy over dtypes, broadcasting, Python scalars and special
values (nan, inf, signed zero)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis.extra import numpy as hnp

import clops

SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, np.inf, -np.inf, np.nan, 1e-30, 7.25],
                   dtype=np.float32)

FLOAT_UNARY = ["abs", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "sin", "cos",
               "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh",
               "arccosh", "arctanh", "ceil", "floor", "trunc", "rint", "negative", "positive",
               "square", "reciprocal", "sign", "signbit", "isnan", "isinf", "isfinite"]
NP_TO_API = {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh",
             "arccosh": "acosh", "arctanh": "atanh", "rint": "round"}


def _np(fn, *args):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return getattr(np, fn)(*args)


@pytest.mark.parametrize("fn", FLOAT_UNARY)
def test_float_unary_special_values(fn, device):
    x = clops.asarray(SPECIAL, device=device)
    got = np.asarray(getattr(clops, NP_TO_API.get(fn, fn))(x))
    want = _np(fn, SPECIAL)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30, equal_nan=True)
    if want.dtype.kind == "f":  # signed zeros agree too
        z = want == 0
        np.testing.assert_array_equal(np.signbit(got[z]), np.signbit(want[z]))


FLOAT_BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "arctan2",
                "hypot", "copysign", "power", "logaddexp", "floor_divide", "remainder",
                "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
                "nextafter"]
BIN_API = {"arctan2": "atan2", "power": "pow"}


@pytest.mark.parametrize("fn", FLOAT_BINARY)
def test_float_binary_special_values(fn, device):
    a = np.repeat(SPECIAL, SPECIAL.size)
    b = np.tile(SPECIAL, SPECIAL.size)
    got = np.asarray(getattr(clops, BIN_API.get(fn, fn))(clops.asarray(a, device=device),
                                                          clops.asarray(b, device=device)))
    want = _np(fn, a, b)
    if fn == "floor_divide":  # the standard's table, not numpy's: floor(a / b) at infinities
        want = np.where(np.isinf(a) | np.isinf(b), _np("floor", _np("divide", a, b)), want)
    np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-37, equal_nan=True)


INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_ops(dtype, device):
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -100), min(info.max, 100)
    a = rng.integers(lo, hi, 64).astype(dtype)
    b = rng.integers(lo, hi, 64).astype(dtype)
    b[b == 0] = 1
    ta, tb = clops.asarray(a, device=device), clops.asarray(b, device=device)
    with np.errstate(all="ignore"):
        for fn, want in [("add", a + b), ("subtract", a - b), ("multiply", a * b),
                         ("floor_divide", a // b), ("remainder", a % b),
                         ("bitwise_and", a & b), ("bitwise_or", a | b), ("bitwise_xor", a ^ b),
                         ("maximum", np.maximum(a, b)), ("less", a < b), ("equal", a == b)]:
            np.testing.assert_array_equal(np.asarray(getattr(clops, fn)(ta, tb)), want, fn)
        np.testing.assert_array_equal(np.asarray(clops.abs(ta)), np.abs(a))
        np.testing.assert_array_equal(np.asarray(~ta), ~a)
        np.testing.assert_array_equal(np.asarray(clops.sign(ta)), np.sign(a))
    # integer division by zero gives 0 instead of trapping the device
    z = clops.asarray(np.zeros(4, dtype), device=device)
    np.testing.assert_array_equal(np.asarray(ta[:4] // z), np.zeros(4, dtype))


@settings(max_examples=40, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=4,
                                                  max_side=4))
def test_broadcasting_chain(shapes):
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in shapes.input_shapes)
    ta, tb, tc = (clops.asarray(x) for x in (a, b, c))
    got = np.asarray(ta * tb + tc * 0.5 - clops.exp(tb) / (tc * tc + 1))
    want = a * b + c * np.float32(0.5) - np.exp(b) / (c * c + 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_python_scalar_promotion(device):
    x = clops.asarray(np.array([1, 2, 3], np.int8), device=device)
    assert (x + 1).dtype == clops.int8
    assert (x * 1.5).dtype == clops.float32
    f = clops.asarray(np.array([1.0], np.float16), device=device)
    assert (f + 1.0).dtype == clops.float16
    assert (f + 1j).dtype == clops.complex64
    with pytest.raises(OverflowError):
        x + 1000


def test_promotion_table(device):
    a = clops.asarray(np.array([1], np.uint8), device=device)
    b = clops.asarray(np.array([1], np.int8), device=device)
    assert (a + b).dtype == clops.int16
    c = clops.asarray(np.array([1], np.float32), device=device)
    with pytest.raises(TypeError, match="promotion"):
        a + c


def test_half_and_bfloat16_storage(device):
    a = np.linspace(-3, 3, 37).astype(np.float32)
    for dt, tol in [("float16", 2e-3), ("bfloat16", 1.6e-2)]:
        t = clops.asarray(a, dtype=dt, device=device)
        assert t.dtype == dt and t.nbytes == a.size * 2
        got = np.asarray((t * 2 + 1).astype(clops.float32))
        np.testing.assert_allclose(got, a * 2 + 1, rtol=tol, atol=tol)
        s = float(t.sum())  # accumulates in float32
        assert abs(s - a.sum()) < 0.1


def test_complex_arithmetic(device):
    rng = np.random.default_rng(3)
    a = (rng.standard_normal(16) + 1j * rng.standard_normal(16)).astype(np.complex64)
    b = (rng.standard_normal(16) + 1j * rng.standard_normal(16)).astype(np.complex64)
    ta, tb = clops.asarray(a, device=device), clops.asarray(b, device=device)
    for got, want in [(ta * tb, a * b), (ta / tb, a / b), (ta - tb, a - b),
                      (clops.conj(ta), np.conj(a)), (clops.abs(ta), np.abs(a)),
                      (clops.real(ta), a.real), (clops.imag(ta), a.imag),
                      (clops.exp(ta), np.exp(a)), (clops.sqrt(ta), np.sqrt(a)),
                      (clops.log(ta), np.log(a)), (ta.sum(), a.sum())]:
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "int64", "float32"])
def test_real_and_imag_of_real_dtypes(device, dtype):
    # the real part is the value, the imaginary part zero of its dtype (a kernel op has no
    # integer form: imag of an integer array once failed only when it was computed)
    a = np.arange(-3, 4).astype(dtype) if dtype[0] != "u" else np.arange(7).astype(dtype)
    t = clops.asarray(a, device=device)
    for got, want in [(clops.real(t), a.real), (clops.imag(t), np.imag(a)),
                      (clops.imag(t) + t, a)]:
        assert got.dtype.name == dtype
        np.testing.assert_array_equal(np.asarray(got), want)
    with pytest.raises(TypeError, match="numeric"):
        clops.imag(clops.asarray(np.array([True]), device=device))


def test_bool_scalars_next_to_numeric_arrays_are_one_and_zero(device):
    x = clops.asarray(np.array([1, 2], np.int16), device=device)
    assert (x + True).dtype == clops.int16
    np.testing.assert_array_equal(np.asarray(x + True), [2, 3])
    np.testing.assert_array_equal(np.asarray(x * False), [0, 0])


def test_float64_where_supported(device):
    if not device.caps.fp64:
        with pytest.raises(TypeError, match="double precision"):
            clops.asarray(np.ones(2), device=device)
        return
    a = np.array([1e-300, 1.0 / 3.0, 2.0 ** 60])
    t = clops.asarray(a, device=device)
    assert t.dtype == clops.float64
    np.testing.assert_array_equal(np.asarray(t * 3), a * 3)


def test_where_and_clip(device):
    a = np.arange(-5, 5, dtype=np.float32)
    t = clops.asarray(a, device=device)
    np.testing.assert_array_equal(np.asarray(clops.where(t > 0, t, 0.0)), np.where(a > 0, a, 0))
    np.testing.assert_array_equal(np.asarray(clops.clip(t, -2, 3)), np.clip(a, -2, 3))


def test_bool_ops(device):
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])
    ta, tb = clops.asarray(a, device=device), clops.asarray(b, device=device)
    np.testing.assert_array_equal(np.asarray(clops.logical_and(ta, tb)), a & b)
    np.testing.assert_array_equal(np.asarray(clops.logical_xor(ta, tb)), a ^ b)
    np.testing.assert_array_equal(np.asarray(~ta), ~a)
    np.testing.assert_array_equal(np.asarray(clops.logical_not(ta)), ~a)
