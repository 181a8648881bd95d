"""The Array API version switch (``CLOPS_ARRAY_API_VERSION``: 2024.12 by default, or 2025.12)
and what 2025.12 adds, against numpy: isin, broadcast_shapes, linalg.eig and eigvals, a Python
scalar in searchsorted, tuples of axes in expand_dims, and tuples where 2024.12 had lists."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops as xp
from clops.array import set_functions

_SETTINGS = settings(max_examples=30, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


# -- the switch ------------------------------------------------------------------------------------
def test_default_version_is_2024_12_with_lists(clops_env, device):
    clops_env(CLOPS_ARRAY_API_VERSION=None)
    assert xp.__array_api_version__ == "2024.12"
    a, b = xp.asarray([1, 2], device=device), xp.asarray([3], device=device)
    assert type(xp.meshgrid(a, b)) is list
    assert type(xp.broadcast_arrays(a, b)) is list
    assert type(xp.__array_namespace_info__().devices()) is list


def test_2025_12_is_chosen_by_the_environment(clops_env, device):
    clops_env(CLOPS_ARRAY_API_VERSION="2025.12")
    assert xp.__array_api_version__ == "2025.12"
    a, b = xp.asarray([1, 2], device=device), xp.asarray([3], device=device)
    grids = xp.meshgrid(a, b)
    assert type(grids) is tuple
    np.testing.assert_array_equal(grids[0].to_numpy(), np.meshgrid([1, 2], [3])[0])
    assert type(xp.broadcast_arrays(a, b)) is tuple
    assert type(xp.meshgrid()) is tuple
    assert type(xp.__array_namespace_info__().devices()) is tuple
    assert a.__array_namespace__(api_version="2025.12") is xp


def test_unknown_version_is_refused(clops_env):
    with pytest.raises(ValueError, match="CLOPS_ARRAY_API_VERSION='2026.12'.*2024.12, 2025.12"):
        clops_env(CLOPS_ARRAY_API_VERSION="2026.12")
    with pytest.raises(ValueError, match="api_version '2026.12'"):
        xp.asarray([1]).__array_namespace__(api_version="2026.12")


def test_new_names_have_the_spec_signatures():
    def kinds(f):
        return [(p.name, p.kind.name) for p in inspect.signature(f).parameters.values()]

    assert kinds(xp.isin) == [("x1", "POSITIONAL_ONLY"), ("x2", "POSITIONAL_ONLY"),
                              ("invert", "KEYWORD_ONLY")]
    assert kinds(xp.broadcast_shapes) == [("shapes", "VAR_POSITIONAL")]
    assert kinds(xp.linalg.eig) == [("x", "POSITIONAL_ONLY")]
    assert kinds(xp.linalg.eigvals) == [("x", "POSITIONAL_ONLY")]
    # axis may be given by position or by name (2024.12 and 2025.12)
    assert kinds(xp.expand_dims) == [("x", "POSITIONAL_ONLY"), ("axis", "POSITIONAL_OR_KEYWORD")]


# -- isin --------------------------------------------------------------------------------------
_INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def _values(dtype: str) -> st.SearchStrategy[int]:
    info = np.iinfo(dtype)
    return st.integers(-3, 6).filter(lambda v: v >= info.min) | \
        st.sampled_from([int(info.min), int(info.max)])


@_SETTINGS
@given(data=st.data(), d1=st.sampled_from(_INTS), d2=st.sampled_from(_INTS),
       invert=st.booleans(), sorted_path=st.booleans())
def test_isin_of_integers_matches_numpy(data, d1, d2, invert, sorted_path, device,
                                        monkeypatch):
    # small sizes compare every pair; the sorted path (sort x2, search) is forced as well
    monkeypatch.setattr(set_functions, "ISIN_PAIRWISE_MAX", 0 if sorted_path else 1 << 20)
    shape1 = data.draw(st.lists(st.integers(0, 3), max_size=3).map(tuple))
    a = np.array(data.draw(st.lists(_values(d1), min_size=int(np.prod(shape1)),
                                    max_size=int(np.prod(shape1)))), dtype=d1).reshape(shape1)
    b = np.array(data.draw(st.lists(_values(d2), max_size=8)), dtype=d2)
    got = xp.isin(xp.asarray(a, device=device), xp.asarray(b, device=device), invert=invert)
    assert got.dtype == xp.bool and got.shape == a.shape
    np.testing.assert_array_equal(got.to_numpy(), np.isin(a, b, invert=invert))


@pytest.mark.parametrize("x1,x2", [(3, [1, 3]), (4, [1, 3]), ([1, 2, 3], 2), (300, [1])])
def test_isin_with_a_python_int(x1, x2, device):
    a = x1 if isinstance(x1, int) else xp.asarray(np.array(x1, dtype=np.int16), device=device)
    b = x2 if isinstance(x2, int) else xp.asarray(np.array(x2, dtype=np.int8), device=device)
    got = xp.isin(a, b)
    assert got.dtype == xp.bool
    assert got.shape == (() if isinstance(x1, int) else (len(x1),))
    np.testing.assert_array_equal(got.to_numpy(), np.isin(x1, x2))
    np.testing.assert_array_equal(xp.isin(a, b, invert=True).to_numpy(),
                                  np.isin(x1, x2, invert=True))


@pytest.mark.parametrize("sorted_path", [False, True])
def test_isin_of_floats_compares_by_equality(sorted_path, device, monkeypatch):
    monkeypatch.setattr(set_functions, "ISIN_PAIRWISE_MAX", 0 if sorted_path else 1 << 20)
    a = np.array([np.nan, -0.0, 0.5, np.inf, 2.0, 7.0], dtype=np.float32)
    b = np.array([0.0, np.nan, np.inf, 2.0, 3.0], dtype=np.float32)
    got = xp.isin(xp.asarray(a, device=device), xp.asarray(b, device=device))
    np.testing.assert_array_equal(got.to_numpy(), np.isin(a, b))  # NaN is in nothing
    c = np.array([1 + 1j, 2 - 1j, np.nan], dtype=np.complex64)
    got = xp.isin(xp.asarray(c, device=device), xp.asarray(c[:1], device=device))
    np.testing.assert_array_equal(got.to_numpy(), [True, False, False])


def test_isin_refuses_what_has_no_common_type(device):
    with pytest.raises(TypeError, match="no common type"):
        xp.isin(xp.asarray([1], device=device), xp.asarray([1.0], device=device))
    with pytest.raises(TypeError, match="at least one"):
        xp.isin(1, 2)


# -- broadcast_shapes --------------------------------------------------------------------------
@_SETTINGS
@given(shapes=st.lists(st.lists(st.integers(0, 3), max_size=4).map(tuple), max_size=4))
def test_broadcast_shapes_matches_numpy(shapes):
    try:
        want = np.broadcast_shapes(*shapes)
    except ValueError:
        with pytest.raises(ValueError):
            xp.broadcast_shapes(*shapes)
        return
    assert xp.broadcast_shapes(*shapes) == want


def test_broadcast_shapes_of_nothing_and_bad_entries():
    assert xp.broadcast_shapes() == ()
    with pytest.raises(ValueError, match="negative"):
        xp.broadcast_shapes((2, -1))
    with pytest.raises(TypeError, match="not an integer"):
        xp.broadcast_shapes((2, None))


# -- eig, eigvals ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64"])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (1, 1), (0, 0)])
def test_eig_satisfies_the_definition_and_matches_numpy(dtype, shape, device):
    rng = np.random.default_rng(7)
    a = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        a = a + 1j * rng.standard_normal(shape)
    a = a.astype(dtype)
    w, v = xp.linalg.eig(xp.asarray(a, device=device))
    cd = np.result_type(dtype, np.complex64)
    assert w.dtype == xp.asarray(np.zeros(1, cd)).dtype and v.dtype == w.dtype
    assert w.shape == shape[:-1] and v.shape == shape
    wn, vn = w.to_numpy(), v.to_numpy()
    tol = 1e-4 if cd == np.complex64 else 1e-10
    # a v = v diag(w), the columns of v of unit length
    np.testing.assert_allclose(a @ vn, vn * wn[..., None, :], atol=tol * 10)
    if a.size:
        np.testing.assert_allclose(np.linalg.norm(vn, axis=-2), 1, rtol=tol * 10)
    want = np.linalg.eigvals(a)
    # np.sort_complex orders each stack's eigenvalues (along the last axis)
    np.testing.assert_allclose(np.sort_complex(wn), np.sort_complex(want), atol=tol * 10)
    ev = xp.linalg.eigvals(xp.asarray(a, device=device))
    assert ev.dtype == w.dtype
    np.testing.assert_allclose(np.sort_complex(ev.to_numpy()), np.sort_complex(want),
                               atol=tol * 10)


def test_eig_of_a_rotation_has_complex_eigenvalues(device):
    w = xp.linalg.eigvals(xp.asarray([[0.0, -1.0], [1.0, 0.0]], device=device))
    np.testing.assert_allclose(np.sort_complex(w.to_numpy()), [-1j, 1j], atol=1e-6)


def test_eig_refuses_what_is_not_a_square_float_matrix(device):
    with pytest.raises(TypeError, match="floating-point"):
        xp.linalg.eig(xp.asarray([[1, 2], [3, 4]], device=device))
    with pytest.raises(ValueError, match="square"):
        xp.linalg.eigvals(xp.zeros((2, 3), device=device))


# -- searchsorted with a scalar, expand_dims with a tuple --------------------------------------
@_SETTINGS
@given(data=st.data(), dtype=st.sampled_from(["int8", "int32", "uint16", "float32"]),
       side=st.sampled_from(["left", "right"]))
def test_searchsorted_with_a_python_scalar_matches_numpy(data, dtype, side, device):
    lo, hi = (-100, 100) if dtype != "uint16" else (0, 200)
    x1 = np.sort(np.array(data.draw(st.lists(st.integers(lo, hi), min_size=1, max_size=10)),
                          dtype=dtype))
    # ints past the dtype's range as well (an int8 x1 and 1000: after every element)
    v = data.draw(st.integers(-1000, 1000) | (st.floats(-300, 300) if dtype == "float32"
                                              else st.nothing()))
    got = xp.searchsorted(xp.asarray(x1, device=device), v, side=side)
    assert got.shape == () and got.dtype == xp.int64
    assert int(got) == int(np.searchsorted(x1.astype(np.float64), v, side=side))


@pytest.mark.parametrize("axes", [(0,), (0, 1), (-1, 0), (1, 3), (-1, -2)])
def test_expand_dims_with_a_tuple_of_axes_matches_numpy(axes, device):
    a = np.arange(6).reshape(2, 3)
    got = xp.expand_dims(xp.asarray(a, device=device), axis=axes)
    np.testing.assert_array_equal(got.to_numpy(), np.expand_dims(a, axes))
    np.testing.assert_array_equal(xp.expand_dims(xp.asarray(a, device=device), axes).to_numpy(),
                                  np.expand_dims(a, axes))


@pytest.mark.parametrize("axes", [(0, 0), (4,), (-5,)])
def test_expand_dims_refuses_repeated_or_out_of_range_axes(axes, device):
    with pytest.raises((IndexError, ValueError)):
        xp.expand_dims(xp.zeros((2, 3), device=device), axis=axes)

