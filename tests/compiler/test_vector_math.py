"""Flat float32 kernels of slow scalar math (sin, log, pow, ...) run on n-wide vectors on
CPUs, each function only where the device's vector form agrees with its scalar form (a runtime
probe), or clops has its own vector form (sin, cos, tan: test_trig.py; pow, taken on PoCL:
below): values against numpy, special values included, on sizes that take the vector path, and
the choice following the probe."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import clops
from clops.compiler import geometry
from clops.compiler.kernel import OWN_VECTOR_MATH, VECTOR_MATH
from clops.runtime import probes

NP = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
      "acosh": "arccosh", "atanh": "arctanh", "atan2": "arctan2", "pow": "power"}
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 7.25,
           1e-4, 88.0, -88.0, 1e30, -1e30, 1e-40, 0.999]


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    spread = rng.choice([-1.0, 1.0], 236) * 10.0 ** rng.uniform(-40, 30, 236)
    return np.concatenate([SPECIAL, spread]).astype(np.float32)  # 256: every width divides it


def _second() -> np.ndarray:
    """Second operands for ``_values()``: half of them those values shuffled (every special
    value against others), half exponents a program raises to (integers, halves, small)."""
    rng = np.random.default_rng(1)
    moderate = np.concatenate([rng.integers(-6, 7, 64) / 2.0, rng.uniform(-8, 8, 64)])
    return np.concatenate([rng.permutation(_values())[:128], moderate]).astype(np.float32)


def _kernel_keys(t: clops.Tensor) -> list:
    return [s.key for s in clops.compiler.schedule_of(t).entries if hasattr(s, "key")]


@pytest.mark.parametrize("fn", sorted(VECTOR_MATH))
def test_vector_math_gives_numpys_values(fn: str, device: clops.CLDevice) -> None:
    x = _values()
    t = clops.asarray(x, device=device)
    operands = (x, _second()) if fn in probes.BINARY_MATH else (x,)
    expr = getattr(clops, fn)(t * 1.0, *(clops.asarray(o, device=device) for o in operands[1:])
                              ) * 2.0 - 0.5
    (key,) = _kernel_keys(expr)
    agrees = probes.vector_math_agrees(device, fn)
    own = geometry.own_vector_math(device, fn)
    faster = fn in geometry.OWN_FASTER.get(getattr(device, "backend", ""), ())
    assert own == (fn in OWN_VECTOR_MATH and (fn != "pow" or device.caps.fp64) and
                   (not agrees or faster))
    assert key.vmath == (device.kind == "cpu" and (agrees or own))
    assert key.own_math == ((fn,) if key.vmath and own else ())
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        want = getattr(np, NP.get(fn, fn))(*operands) * np.float32(2.0) - np.float32(0.5)
    got = np.asarray(expr)
    np.testing.assert_allclose(got, want, rtol=4e-6, atol=1e-30, equal_nan=True)
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]))


POW_SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, 1e-30, -1e-40,
               1e30, -1e30, 200.0, -200.0, 0.999, 1.001, np.inf, -np.inf, np.nan, 1e-45]


@pytest.mark.parametrize("forced", [False, True])
def test_own_pow_gives_numpys_special_values(device: clops.CLDevice,
                                             monkeypatch: pytest.MonkeyPatch, forced: bool
                                             ) -> None:
    """pow of every pair of special values (signed zeros, +-1, odd and even integers, halves,
    infinities, nan, subnormals, overflow and underflow) and of random pairs past float32's
    range either way: numpy's float32 power, the sign of every zero and infinity included;
    clops' own vector form where the device takes it, else the runtime's (``forced``: clops'
    own wherever the device has float64)."""
    if forced:
        monkeypatch.setitem(geometry.OWN_FASTER, getattr(device, "backend", ""),
                            frozenset({"pow"}))
    x, y = (a.ravel().astype(np.float32) for a in np.meshgrid(POW_SPECIAL, POW_SPECIAL))
    rng = np.random.default_rng(5)
    x = np.concatenate([x, rng.uniform(-40, 40, 2048).astype(np.float32),
                        (10.0 ** rng.uniform(-44, 38, 2048)).astype(np.float32)])
    y = np.concatenate([y, rng.integers(-40, 41, 2048).astype(np.float32),
                        rng.uniform(-12, 12, 2048).astype(np.float32)])
    pad = (-len(x)) % 64 + 64 * forced  # (another size: another form, another schedule)
    x = np.concatenate([x, np.ones(pad, np.float32)])
    y = np.concatenate([y, np.ones(pad, np.float32)])
    t, u = clops.asarray(x, device=device), clops.asarray(y, device=device)
    expr = clops.pow(t * 1.0, u)
    (key,) = _kernel_keys(expr)
    assert ("pow" in key.own_math) == (device.kind == "cpu" and
                                       geometry.own_vector_math(device, "pow"))
    if device.kind == "cpu" and device.caps.fp64 and (
            forced or getattr(device, "backend", "") == "pocl"):
        assert "pow" in key.own_math
    got = np.asarray(expr)
    with np.errstate(all="ignore"):
        want = np.power(x, y)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    exact = np.isinf(want) | (want == 0)
    np.testing.assert_array_equal(got[exact], want[exact])  # (infinities and zeros)
    np.testing.assert_array_equal(np.signbit(got[exact]), np.signbit(want[exact]))
    finite = ~exact & ~np.isnan(want)
    # (atol: a unit of the subnormals' spacing, 2^-149: numpy's own float32 power on AVX-512
    # CPUs is one unit off there, e.g. 31296.86^-8.732876 = 5.5125191e-40 exactly, numpy
    # 5.5125120e-40, the correctly rounded 5.5125260e-40)
    np.testing.assert_allclose(got[finite], want[finite], rtol=3e-7, atol=2.0 ** -149)


def test_a_function_whose_vector_form_disagrees_stays_scalar(device: clops.CLDevice,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    if device.kind != "cpu":
        pytest.skip("vector math is a CPU path")
    t = clops.asarray(_values(), device=device)
    agrees = probes.vector_math_agrees
    monkeypatch.setattr(probes, "vector_math_agrees", lambda dev, fn: fn != "log" and
                        agrees(dev, fn))
    (key,) = _kernel_keys(clops.log(t) + clops.atan(t))
    assert not key.vmath and key.flat == 1
    if agrees(device, "atan"):
        (key,) = _kernel_keys(clops.atan(t) + 1.0)
        assert key.vmath and key.flat == 16


def test_the_probe_refuses_what_it_does_not_know(device: clops.CLDevice) -> None:
    assert not probes.vector_math_agrees(device, "sqrt")  # not a candidate
    assert not probes.vector_math_agrees(device, "no_such_function")


def test_sizes_that_no_width_divides_stay_scalar(device: clops.CLDevice) -> None:
    x = _values()[:250]  # 250: not a multiple of 4
    t = clops.asarray(x, device=device)
    (key,) = _kernel_keys(clops.log1p(t))
    assert not key.vmath
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(np.asarray(clops.log1p(t)), np.log1p(x), rtol=4e-6,
                                   equal_nan=True)
