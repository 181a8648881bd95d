"""Array, elementwise: the standard's special cases for complex transcendental functions (C99
Annex G: infinite, NaN and signed-zero parts) and for floor division with infinite operands,
written out from the 2024.12 specification's tables; finite complex values against numpy."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops

INF, NAN, PI = math.inf, math.nan, math.pi
ANY = None  # a component whose value the standard leaves open (only checked for NaN-ness)


class PM:
    """A component whose magnitude is fixed but whose sign the standard leaves unspecified."""

    def __init__(self, v: float) -> None:
        self.v = v


# (function, input (re, im), expected (re, im)); 2.5 stands for "a (positive) finite number",
# -1.5 for a negative one. Expected zeros are signed: 0.0 is +0, -0.0 is -0.
COMPLEX_CASES: list[tuple[str, tuple[float, float], tuple[object, object]]] = [
    # acos
    ("acos", (0.0, 0.0), (PI / 2, -0.0)), ("acos", (-0.0, 0.0), (PI / 2, -0.0)),
    ("acos", (0.0, NAN), (PI / 2, NAN)), ("acos", (-0.0, NAN), (PI / 2, NAN)),
    ("acos", (2.5, INF), (PI / 2, -INF)), ("acos", (-1.5, INF), (PI / 2, -INF)),
    ("acos", (2.5, NAN), (NAN, NAN)),
    ("acos", (-INF, 2.5), (PI, -INF)), ("acos", (INF, 2.5), (0.0, -INF)),
    ("acos", (-INF, INF), (3 * PI / 4, -INF)), ("acos", (INF, INF), (PI / 4, -INF)),
    ("acos", (INF, NAN), (NAN, PM(INF))), ("acos", (-INF, NAN), (NAN, PM(INF))),
    ("acos", (NAN, 2.5), (NAN, NAN)), ("acos", (NAN, INF), (NAN, -INF)),
    ("acos", (NAN, NAN), (NAN, NAN)),
    # acosh
    ("acosh", (0.0, 0.0), (0.0, PI / 2)), ("acosh", (-0.0, 0.0), (0.0, PI / 2)),
    ("acosh", (2.5, INF), (INF, PI / 2)), ("acosh", (-1.5, INF), (INF, PI / 2)),
    ("acosh", (2.5, NAN), (NAN, NAN)), ("acosh", (0.0, NAN), (NAN, PM(PI / 2))),
    ("acosh", (-INF, 2.5), (INF, PI)), ("acosh", (INF, 2.5), (INF, 0.0)),
    ("acosh", (-INF, INF), (INF, 3 * PI / 4)), ("acosh", (INF, INF), (INF, PI / 4)),
    ("acosh", (INF, NAN), (INF, NAN)), ("acosh", (-INF, NAN), (INF, NAN)),
    ("acosh", (NAN, 2.5), (NAN, NAN)), ("acosh", (NAN, INF), (INF, NAN)),
    ("acosh", (NAN, NAN), (NAN, NAN)),
    # asinh
    ("asinh", (0.0, 0.0), (0.0, 0.0)), ("asinh", (2.5, INF), (INF, PI / 2)),
    ("asinh", (2.5, NAN), (NAN, NAN)), ("asinh", (INF, 2.5), (INF, 0.0)),
    ("asinh", (INF, INF), (INF, PI / 4)), ("asinh", (NAN, 0.0), (NAN, 0.0)),
    ("asinh", (NAN, 2.5), (NAN, NAN)), ("asinh", (NAN, INF), (PM(INF), NAN)),
    ("asinh", (NAN, NAN), (NAN, NAN)),
    # atanh
    ("atanh", (0.0, 0.0), (0.0, 0.0)), ("atanh", (0.0, NAN), (0.0, NAN)),
    ("atanh", (1.0, 0.0), (INF, 0.0)), ("atanh", (2.5, INF), (0.0, PI / 2)),
    ("atanh", (2.5, NAN), (NAN, NAN)), ("atanh", (INF, 2.5), (0.0, PI / 2)),
    ("atanh", (INF, INF), (0.0, PI / 2)), ("atanh", (INF, NAN), (0.0, NAN)),
    ("atanh", (NAN, 2.5), (NAN, NAN)), ("atanh", (NAN, INF), (PM(0.0), PI / 2)),
    ("atanh", (NAN, NAN), (NAN, NAN)),
    # cosh
    ("cosh", (0.0, 0.0), (1.0, 0.0)), ("cosh", (0.0, INF), (NAN, PM(0.0))),
    ("cosh", (0.0, NAN), (NAN, PM(0.0))), ("cosh", (2.5, INF), (NAN, NAN)),
    ("cosh", (2.5, NAN), (NAN, NAN)), ("cosh", (INF, 0.0), (INF, 0.0)),
    ("cosh", (INF, 2.5), (INF * math.cos(2.5), INF * math.sin(2.5))),
    ("cosh", (INF, INF), (PM(INF), NAN)), ("cosh", (INF, NAN), (INF, NAN)),
    ("cosh", (NAN, 0.0), (NAN, PM(0.0))), ("cosh", (NAN, -0.0), (NAN, PM(0.0))),
    ("cosh", (NAN, 2.5), (NAN, NAN)), ("cosh", (NAN, NAN), (NAN, NAN)),
    # sinh
    ("sinh", (0.0, 0.0), (0.0, 0.0)), ("sinh", (0.0, INF), (PM(0.0), NAN)),
    ("sinh", (0.0, NAN), (PM(0.0), NAN)), ("sinh", (2.5, INF), (NAN, NAN)),
    ("sinh", (2.5, NAN), (NAN, NAN)), ("sinh", (INF, 0.0), (INF, 0.0)),
    ("sinh", (INF, 2.5), (INF * math.cos(2.5), INF * math.sin(2.5))),
    ("sinh", (INF, INF), (PM(INF), NAN)), ("sinh", (INF, NAN), (PM(INF), NAN)),
    ("sinh", (NAN, 0.0), (NAN, 0.0)), ("sinh", (NAN, 2.5), (NAN, NAN)),
    ("sinh", (NAN, NAN), (NAN, NAN)),
    # tanh
    ("tanh", (0.0, 0.0), (0.0, 0.0)), ("tanh", (2.5, INF), (NAN, NAN)),
    ("tanh", (0.0, INF), (0.0, NAN)), ("tanh", (2.5, NAN), (NAN, NAN)),
    ("tanh", (0.0, NAN), (0.0, NAN)), ("tanh", (INF, 2.5), (1.0, 0.0)),
    ("tanh", (INF, INF), (1.0, PM(0.0))), ("tanh", (INF, NAN), (1.0, PM(0.0))),
    ("tanh", (NAN, 0.0), (NAN, 0.0)), ("tanh", (NAN, 2.5), (NAN, NAN)),
    ("tanh", (NAN, NAN), (NAN, NAN)),
    # exp
    ("exp", (0.0, 0.0), (1.0, 0.0)), ("exp", (-0.0, 0.0), (1.0, 0.0)),
    ("exp", (2.5, INF), (NAN, NAN)), ("exp", (2.5, NAN), (NAN, NAN)),
    ("exp", (INF, 0.0), (INF, 0.0)),
    ("exp", (-INF, 2.5), (0.0 * math.cos(2.5), 0.0 * math.sin(2.5))),
    ("exp", (INF, 2.5), (INF * math.cos(2.5), INF * math.sin(2.5))),
    ("exp", (-INF, INF), (PM(0.0), PM(0.0))), ("exp", (INF, INF), (PM(INF), NAN)),
    ("exp", (-INF, NAN), (PM(0.0), PM(0.0))), ("exp", (INF, NAN), (PM(INF), NAN)),
    ("exp", (NAN, 0.0), (NAN, 0.0)), ("exp", (NAN, 2.5), (NAN, NAN)),
    ("exp", (NAN, NAN), (NAN, NAN)),
    # expm1
    ("expm1", (0.0, 0.0), (0.0, 0.0)), ("expm1", (-0.0, 0.0), (0.0, 0.0)),
    ("expm1", (2.5, INF), (NAN, NAN)), ("expm1", (2.5, NAN), (NAN, NAN)),
    ("expm1", (INF, 0.0), (INF, 0.0)),
    ("expm1", (-INF, 2.5), (0.0 * math.cos(2.5) - 1, 0.0 * math.sin(2.5))),
    ("expm1", (INF, 2.5), (INF * math.cos(2.5), INF * math.sin(2.5))),
    ("expm1", (-INF, INF), (-1.0, PM(0.0))), ("expm1", (INF, INF), (PM(INF), NAN)),
    ("expm1", (-INF, NAN), (-1.0, PM(0.0))), ("expm1", (INF, NAN), (PM(INF), NAN)),
    ("expm1", (NAN, 0.0), (NAN, 0.0)), ("expm1", (NAN, 2.5), (NAN, NAN)),
    ("expm1", (NAN, NAN), (NAN, NAN)),
    # sqrt (the +-infinity rows as corrected upstream, data-apis/array-api#987: C99's)
    ("sqrt", (0.0, 0.0), (0.0, 0.0)), ("sqrt", (-0.0, 0.0), (0.0, 0.0)),
    ("sqrt", (2.5, INF), (INF, INF)), ("sqrt", (NAN, INF), (INF, INF)),
    ("sqrt", (-INF, INF), (INF, INF)), ("sqrt", (2.5, NAN), (NAN, NAN)),
    ("sqrt", (-INF, 2.5), (0.0, INF)), ("sqrt", (INF, 2.5), (INF, 0.0)),
    ("sqrt", (-INF, NAN), (NAN, PM(INF))), ("sqrt", (INF, NAN), (INF, NAN)),
    ("sqrt", (NAN, 2.5), (NAN, NAN)), ("sqrt", (NAN, NAN), (NAN, NAN)),
    # log
    ("log", (-0.0, 0.0), (-INF, PI)), ("log", (0.0, 0.0), (-INF, 0.0)),
    ("log", (2.5, INF), (INF, PI / 2)), ("log", (2.5, NAN), (NAN, NAN)),
    ("log", (-INF, 2.5), (INF, PI)), ("log", (INF, 2.5), (INF, 0.0)),
    ("log", (-INF, INF), (INF, 3 * PI / 4)), ("log", (INF, INF), (INF, PI / 4)),
    ("log", (INF, NAN), (INF, NAN)), ("log", (NAN, 2.5), (NAN, NAN)),
    ("log", (NAN, INF), (INF, NAN)), ("log", (NAN, NAN), (NAN, NAN)),
]


def _complex_dtypes(device) -> list[str]:
    have = clops.__array_namespace_info__().dtypes(device=device, kind="complex floating")
    return [name for name in ("complex64", "complex128") if name in have]


def _check_component(got: float, want: object, what: str) -> None:
    if isinstance(want, PM):
        want_v = want.v
        assert abs(got) == abs(want_v) or math.isclose(abs(got), abs(want_v), rel_tol=1e-6), what
        return
    assert isinstance(want, float)
    if math.isnan(want):
        assert math.isnan(got), what
    elif want == 0 or math.isinf(want):
        assert got == want and math.copysign(1, got) == math.copysign(1, want), what
    else:
        assert math.isclose(got, want, rel_tol=1e-6), what


@pytest.mark.parametrize("fn,z,want", COMPLEX_CASES,
                         ids=[f"{f}({z[0]}{z[1]:+}j)" for f, z, _ in COMPLEX_CASES])
def test_complex_special_case(fn, z, want, device):
    for dtype in _complex_dtypes(device):
        x = clops.asarray(np.array([complex(*z)], dtype=dtype), device=device)
        got = complex(np.asarray(getattr(clops, fn)(x))[0])
        what = f"{fn}({complex(*z)}) [{dtype}] = {got}, want {want}"
        _check_component(got.real, want[0], what)
        _check_component(got.imag, want[1], what)


# special components on a grid; the standard asks f(conj z) == conj(f(z)) of all of these and
# asinh(-z) == -asinh(z), atanh(-z) == -atanh(z); sin, cos, tan, asin, atan are their
# hyperbolic twins at iz (sin z = -i sinh(iz), cos z = cosh(iz), ...)
PARTS = [0.0, -0.0, 0.5, -2.5, 1.0, 30.0, -30.0, INF, -INF, NAN]
GRID = np.array([complex(a, b) for a in PARTS for b in PARTS], dtype=np.complex128)
CONJ_SYMMETRIC = ["acos", "acosh", "asinh", "atanh", "cosh", "sinh", "tanh", "exp", "expm1",
                  "sqrt", "log", "sin", "cos", "tan", "asin", "atan"]


def _same(got: np.ndarray, want: np.ndarray, z: np.ndarray) -> None:
    """Equal componentwise, NaN matching NaN, and zeros and infinities matching in sign, except
    beside a NaN, in the input ``z`` or the result: there the standard leaves those signs
    unspecified (cosh(0 + inf j) = NaN ± 0j, asinh(NaN + inf j) = ±inf + NaN j,
    atanh(NaN + inf j) = ±0 + π/2 j), and a NaN's sign bit does not carry them reliably
    (NVIDIA's driver differs from PoCL)."""
    signed = ~(np.isnan(z.real) | np.isnan(z.imag) | np.isnan(want.real) | np.isnan(want.imag))
    for part in (np.real, np.imag):
        g, w = part(got), part(want)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        ok = ~np.isnan(w)
        np.testing.assert_array_equal(np.abs(g[ok]), np.abs(w[ok]))
        np.testing.assert_array_equal(g[ok & signed], w[ok & signed])
        zero = ok & signed & (w == 0)
        np.testing.assert_array_equal(np.signbit(g[zero]), np.signbit(w[zero]))


@pytest.mark.parametrize("fn", CONJ_SYMMETRIC)
def test_conj_symmetry_on_special_values(fn, device):
    dtype = _complex_dtypes(device)[-1]
    z = GRID.astype(dtype)
    f = getattr(clops, fn)
    got = np.asarray(f(clops.asarray(np.conj(z), device=device)))
    want = np.conj(np.asarray(f(clops.asarray(z, device=device))))
    _same(got, want, z)


def _parts(re: np.ndarray, im: np.ndarray) -> np.ndarray:
    """re + i im built componentwise (numpy's 1j * inf would make a NaN real part)."""
    out = np.empty(re.shape, dtype=np.result_type(re.dtype, np.complex64))
    out.real, out.imag = re, im
    return out


@pytest.mark.parametrize("fn,twin,how", [
    ("sin", "sinh", "-i f(iz)"), ("cos", "cosh", "f(iz)"), ("tan", "tanh", "-i f(iz)"),
    ("asin", "asinh", "-i f(iz)"), ("atan", "atanh", "-i f(iz)"),
    ("asinh", "asinh", "-f(-z)"), ("atanh", "atanh", "-f(-z)")])
def test_identities_on_special_values(fn, twin, how, device):
    dtype = _complex_dtypes(device)[-1]
    z = GRID.astype(dtype)
    got = np.asarray(getattr(clops, fn)(clops.asarray(z, device=device)))
    g = getattr(clops, twin)
    if how == "-f(-z)":
        want = -np.asarray(g(clops.asarray(-z, device=device)))
    else:
        w = np.asarray(g(clops.asarray(_parts(-z.imag, z.real), device=device)))
        want = w if how == "f(iz)" else _parts(w.imag, -w.real)
    _same(got, want, z)


FINITE = ["exp", "expm1", "sqrt", "log", "log1p", "sin", "cos", "tan", "sinh", "cosh", "tanh",
          "asin", "acos", "atan", "asinh", "acosh", "atanh"]
NP_NAME = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
           "acosh": "arccosh", "atanh": "arctanh"}
_part = st.floats(-60, 60, allow_nan=False, width=32) | st.floats(-2.0**-10, 2.0**-10, width=32)


@pytest.mark.parametrize("fn", FINITE)
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.tuples(_part, _part), min_size=1, max_size=64))
def test_complex_finite_values_match_numpy(fn, parts, device):
    z = np.array([complex(a, b) for a, b in parts], dtype=np.complex64)
    got = np.asarray(getattr(clops, fn)(clops.asarray(z, device=device)))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        z64 = z.astype(np.complex128)
        want = getattr(np, NP_NAME.get(fn, fn))(z64)
        if fn == "log1p":  # numpy's complex log1p is log(1 + z): use the series near 0
            want = np.where(np.abs(z64) < 1e-8, z64 - z64 * z64 / 2, want)
    ok = np.isfinite(want) & (np.abs(want) < 1e37)  # beyond float32 range: not compared
    scale = np.maximum(np.abs(want[ok]), 1e-30)
    err = np.abs(got[ok] - want[ok]) / scale
    assert err.max(initial=0) < 4e-6, (fn, z[ok][np.argmax(err)], got[ok][np.argmax(err)])


# floor division: the standard's table at infinite operands is floor(x1 / x2), where numpy
# gives NaN for inf // finite and -1 for a finite over an infinity of the other sign
FLOOR_DIVIDE_CASES = [
    (INF, 2.5, INF), (INF, -1.5, -INF), (-INF, 2.5, -INF), (-INF, -1.5, INF),
    (2.5, INF, 0.0), (2.5, -INF, -0.0), (-1.5, INF, -0.0), (-1.5, -INF, 0.0),
    (INF, INF, NAN), (-INF, INF, NAN), (0.0, INF, 0.0), (-0.0, INF, -0.0), (0.0, -INF, -0.0),
    (7.0, 2.0, 3.0), (-7.0, 2.0, -4.0), (7.0, -2.0, -4.0), (1.0, 0.0, INF), (-1.0, 0.0, -INF),
    (0.0, 0.0, NAN), (NAN, 1.0, NAN), (0.0, 2.0, 0.0), (-0.0, 2.0, -0.0), (0.0, -2.0, -0.0),
]


def _float_dtypes(device) -> list[str]:
    have = clops.__array_namespace_info__().dtypes(device=device, kind="real floating")
    return [name for name in ("float32", "float64") if name in have]


@pytest.mark.parametrize("how", ["function", "operator", "inplace", "scalar"])
def test_floor_divide_follows_the_standard_at_infinities(how, device):
    a = np.array([c[0] for c in FLOOR_DIVIDE_CASES])
    b = np.array([c[1] for c in FLOOR_DIVIDE_CASES])
    want = np.array([c[2] for c in FLOOR_DIVIDE_CASES])
    for dtype in _float_dtypes(device):
        x1 = clops.asarray(a.astype(dtype), device=device)
        x2 = clops.asarray(b.astype(dtype), device=device)
        if how == "function":
            got = np.asarray(clops.floor_divide(x1, x2))
        elif how == "operator":
            got = np.asarray(x1 // x2)
        elif how == "inplace":
            x1 //= x2
            got = np.asarray(x1)
        else:  # a Python scalar on either side
            got = np.array([float(np.asarray(clops.asarray(np.array([p], dtype), device=device)
                                             // q)[0]) for p, q in zip(a, b)])
            got2 = np.array([float(np.asarray(p // clops.asarray(np.array([q], dtype),
                                                                 device=device))[0])
                             for p, q in zip(a, b)])
            np.testing.assert_array_equal(got2, want)
            np.testing.assert_array_equal(np.signbit(got2[want == 0]), np.signbit(want[want == 0]))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0]))
