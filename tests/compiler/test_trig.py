"""sin, cos and tan of float32 in flat kernels on CPUs, on n-wide vectors: the runtime's vector
forms where they agree with its scalar ones, clops' own (``cl/trig.cl``) where they do not
(PoCL 3.1). Values in units in the last place against float64 rounded to float32, beside
numpy's float32, with special values, a hypothesis sweep of every float32 bit pattern, and
fused chains; the own forms are also forced on every CPU device, so each runtime runs them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops
from clops.compiler import render
from clops.compiler.kernel import OWN_VECTOR_MATH
from clops.runtime import probes

FNS = sorted(OWN_VECTOR_MATH - {"pow"})  # (pow: test_vector_math.py)
# Units in the last place: measured over every float32 of [0.5, 2^18] (and a sample of the
# rest) the own forms are within 1.56 (sin, cos) and 3.0 (tan); past 2^18 they take the
# runtime's scalar function (Intel 2.2, PoCL 3.7 for tan). numpy's float32 loops: 1-4.
ULP = 4.0
HALF_PI = np.pi / 2
SPECIAL = [
    0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754942e-38, 1.1754944e-38, 1e-30, -1e-30,
    1e-10, 2.4e-4, -1e-3, 1e-3, 0.5, 0.785398, 0.7853982, 1.0, -1.0, 1.5707963, 1.5707964,
    -1.5707964, 3.1415925, 3.1415927, -3.1415927, 4.712389, 6.2831855, 10.0, 100.0, 1e4,
    -1e4, 1e5, 1e6, -1e6, 1e20, 3.4e38, -3.4e38, 3.4028235e38, np.inf, -np.inf, np.nan,
    # worst cases of the own forms found by the exhaustive sweep (close to multiples of pi/2)
    55798.078125, 1227.0419921875, 110733.2890625, 65447.48046875, 200947.265625,
    # around the limit of the own forms' reduction (2^18) and past it
    262143.98, 262144.0, 262144.03, -262144.03, 8197131.0, 4329992.5, 6737529.5, 5.87e21]


def _values() -> np.ndarray:
    rng = np.random.default_rng(1)
    k = np.arange(-200, 201, dtype=np.float64)
    near_poles = np.concatenate([np.nextafter((k * HALF_PI).astype(np.float32), np.float32(d))
                                 for d in (-np.inf, np.inf)])  # floats next to n pi/2
    near_poles = np.concatenate([near_poles, (k * HALF_PI).astype(np.float32),
                                 (k * 1e4 * HALF_PI).astype(np.float32)])
    spread = rng.choice([-1.0, 1.0], 2048) * 10.0 ** rng.uniform(-45, 38.5, 2048)
    x = np.concatenate([SPECIAL, near_poles, spread]).astype(np.float32)
    return np.concatenate([x, np.zeros((-len(x)) % 16, np.float32)])


def ulp_error(got: np.ndarray, x: np.ndarray, fn: str) -> np.ndarray:
    """|got - f(x)| in units of the float32 spacing at f(x) (f in float64); 0 where both are NaN
    or equal (infinities), inf where one is NaN and the other not."""
    with np.errstate(all="ignore"):
        ref = getattr(np, fn)(x.astype(np.float64))
        spacing = np.spacing(np.abs(ref.astype(np.float32))).astype(np.float64)
        err = np.abs(got.astype(np.float64) - ref) / spacing
    err[np.isnan(got) & np.isnan(ref)] = 0.0
    err[got.astype(np.float64) == ref] = 0.0
    err[np.isnan(got) != np.isnan(ref)] = np.inf
    return err


def _check(got: np.ndarray, x: np.ndarray, fn: str, exact_tiny: bool = True) -> None:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        numpys = getattr(np, fn)(x)  # numpy's float32, for the report and the signs of zero
    err = ulp_error(got, x, fn)
    bad = np.flatnonzero(err > ULP)
    assert not len(bad), (
        f"{fn}: {len(bad)} values past {ULP} ulp, e.g. x={x[bad[:4]].tolist()} "
        f"got={got[bad[:4]].tolist()} numpy={numpys[bad[:4]].tolist()} "
        f"ulp={err[bad[:4]].tolist()} (numpy's: {ulp_error(numpys, x, fn)[bad[:4]].tolist()})")
    zero = numpys == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(numpys[zero]))
    if not exact_tiny:
        return
    tiny = np.abs(x) < 2**-13  # sin x = tan x = x (rounded), cos x = 1
    if fn == "cos":
        np.testing.assert_array_equal(got[tiny], np.float32(1.0))
    else:
        np.testing.assert_array_equal(got[tiny], x[tiny])


@pytest.fixture(params=["runtime", "own"])
def form(request: pytest.FixtureRequest, device: clops.CLDevice,
         monkeypatch: pytest.MonkeyPatch) -> str:
    """Which vector forms a CPU device uses: as its probes decide, or clops' own forced (the
    probes answer that the runtime's vector sin, cos and tan disagree)."""
    if device.kind != "cpu":
        pytest.skip("vector math is a CPU path")
    if request.param == "own":
        agrees = probes.vector_math_agrees
        monkeypatch.setattr(probes, "vector_math_agrees",
                            lambda dev, fn: fn not in FNS and agrees(dev, fn))
    return request.param


def _key(t: clops.Tensor):  # noqa: ANN202 - KernelKey
    (key,) = [s.key for s in clops.compiler.schedule_of(t).entries if hasattr(s, "key")]
    return key


def _apply(fn: str, t: clops.Tensor) -> tuple[np.ndarray, bool]:
    """``fn`` of ``t``, and whether clops' own form computed it (then sin x = tan x = x and
    cos x = 1 exactly for tiny x; a runtime's vector form may be an ulp off there: Intel's
    vector cos gives 1 - 2^-24)."""
    r = getattr(clops, fn)(t)
    own = fn in _key(r).own_math
    return np.asarray(r), own


def _assert_fast_path(t: clops.Tensor, device: clops.CLDevice, fns: list[str]) -> None:
    """The kernel of ``t`` runs on vectors, each of ``fns`` in clops' own form exactly where the
    runtime's vector form disagrees (so never through the scalar path)."""
    key = _key(t)
    assert key.vmath and key.flat in (4, 8, 16)
    native = device.caps.native_vector_width_float
    if key.own_math and native >= 4:  # (own forms: no wider than the CPU's float vectors)
        assert key.flat <= native
    src = render.CLRenderer().render(key, 0, "k")
    for fn in fns:
        own = not probes.vector_math_agrees(device, fn)
        assert (fn in key.own_math) == own
        assert (f"clops_{fn}(" in src) == own


@pytest.mark.parametrize("fn", FNS)
def test_sin_cos_tan_within_4_ulp_of_float64(fn: str, device: clops.CLDevice, form: str
                                             ) -> None:
    x = _values()
    t = getattr(clops, fn)(clops.asarray(x, device=device))
    _assert_fast_path(t, device, [fn])
    own = fn in _key(t).own_math
    assert own or form == "runtime"
    _check(np.asarray(t), x, fn, exact_tiny=own)


def test_pocl_takes_the_own_forms(device: clops.CLDevice) -> None:
    """PoCL 3.1's vector sin, cos and tan give 0.008-0.014 below about 1e-3: its probes fail,
    so its kernels take clops' own forms (vectorized), not the scalar path."""
    if "PoCL" not in device.platform_version or device.kind != "cpu":
        pytest.skip("a PoCL CPU device")
    t = clops.asarray(np.full(64, 1e-30, np.float32), device=device)
    for fn in FNS:
        r = getattr(clops, fn)(t)
        if not probes.vector_math_agrees(device, fn):
            assert fn in _key(r).own_math
        assert np.asarray(r)[0] == (np.float32(1.0) if fn == "cos" else np.float32(1e-30))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bits=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=200),
       fn=st.sampled_from(FNS))
def test_every_bit_pattern(bits: list[int], fn: str, device: clops.CLDevice, form: str) -> None:
    b = np.array(bits + [0] * ((-len(bits)) % 16), np.uint32)
    x = b.view(np.float32)
    got, own = _apply(fn, clops.asarray(x, device=device))
    _check(got, x, fn, own)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=st.lists(st.floats(-3e5, 3e5, width=32), min_size=16, max_size=256))
def test_ordinary_range(x: list[float], device: clops.CLDevice, form: str) -> None:
    a = np.array(x + [0.0] * ((-len(x)) % 16), np.float32)
    t = clops.asarray(a, device=device)
    for fn in FNS:
        got, own = _apply(fn, t)
        _check(got, a, fn, own)


def test_dense_sweep_near_multiples_of_half_pi(device: clops.CLDevice, form: str) -> None:
    """256 floats on each side of n pi/2 for n up to 2^17 in steps (the own forms' hardest
    inputs: their reduction cancels there)."""
    n = np.arange(1, 2**17, 4099, dtype=np.float64)
    c = (n * HALF_PI).astype(np.float32).view(np.int32)
    x = (c[:, None] + np.arange(-128, 128, dtype=np.int32)).ravel().view(np.float32)
    t = clops.asarray(x, device=device)
    for fn in FNS:
        got, own = _apply(fn, t)
        _check(got, x, fn, own)


@pytest.mark.parametrize("expr", [
    "sin(x) * cos(x) + 1", "tan(x) - sin(x) * 0.5", "cos(x * 3.0 + 1.0) * y", "sin(cos(x))",
    "sin(x) * sin(x) + cos(x) * cos(x)"])
def test_fused_chains(expr: str, device: clops.CLDevice, form: str) -> None:
    rng = np.random.default_rng(2)
    xs = rng.uniform(-20, 20, 4096).astype(np.float32)
    xs[:16] = [0.0, -0.0, 1e-30, -1e-40, np.pi, -np.pi / 2, 1e4, 1e6, np.inf, np.nan, 3e38,
               -3e38, 0.5, 2.0, 1e-3, -1e-3]
    ys = rng.uniform(-2, 2, 4096).astype(np.float32)
    env = {"sin": clops.sin, "cos": clops.cos, "tan": clops.tan,
           "x": clops.asarray(xs, device=device), "y": clops.asarray(ys, device=device)}
    t = eval(expr, {}, env)  # noqa: S307 - the test's own expressions
    _assert_fast_path(t, device, [f for f in FNS if f + "(" in expr])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        # float64 reference of each function rounded to float32, the arithmetic in float32
        ref = eval(expr, {}, {**{f: (lambda v, f=f: getattr(np, f)(v.astype(np.float64))
                                     .astype(np.float32)) for f in FNS}, "x": xs, "y": ys})
    got = np.asarray(t)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6, equal_nan=True)
