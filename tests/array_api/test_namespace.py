"""The Array API 2024.12 namespace: every name present, spec signatures, inspection object and
data type functions against numpy."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import clops as xp

FUNCTIONS = """
abs acos acosh add all any arange argmax argmin argsort asarray asin asinh astype atan atan2
atanh bitwise_and bitwise_invert bitwise_left_shift bitwise_or bitwise_right_shift bitwise_xor
broadcast_arrays broadcast_to can_cast ceil clip concat conj copysign cos cosh count_nonzero
cumulative_prod cumulative_sum diff divide empty empty_like equal exp expand_dims expm1 eye
finfo flip floor floor_divide from_dlpack full full_like greater greater_equal hypot iinfo imag
isdtype isfinite isinf isnan less less_equal linspace log log10 log1p log2 logaddexp logical_and
logical_not logical_or logical_xor matmul matrix_transpose max maximum mean meshgrid min minimum
moveaxis multiply negative nextafter nonzero not_equal ones ones_like permute_dims positive pow
prod real reciprocal remainder repeat reshape result_type roll round searchsorted sign signbit
sin sinh sort sqrt square squeeze stack std subtract sum take take_along_axis tan tanh tensordot
tile tril triu trunc unique_all unique_counts unique_inverse unique_values unstack var vecdot
where zeros zeros_like __array_namespace_info__
""".split()
CONSTANTS = ["e", "inf", "nan", "newaxis", "pi"]
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float32", "float64", "complex64", "complex128"]
LINALG = """cholesky cross det diagonal eigh eigvalsh inv matmul matrix_norm matrix_power
matrix_rank matrix_transpose outer pinv qr slogdet solve svd svdvals tensordot trace vecdot
vector_norm""".split()
METHODS = """__abs__ __add__ __and__ __array_namespace__ __bool__ __complex__ __dlpack__
__dlpack_device__ __eq__ __float__ __floordiv__ __ge__ __getitem__ __gt__ __index__ __int__
__invert__ __le__ __lshift__ __lt__ __matmul__ __mod__ __mul__ __ne__ __neg__ __or__ __pos__
__pow__ __rshift__ __setitem__ __sub__ __truediv__ __xor__ to_device dtype device mT ndim shape
size T""".split()


def test_every_name_is_present() -> None:
    assert xp.__array_api_version__ == "2024.12"
    missing = [n for n in FUNCTIONS + CONSTANTS + DTYPES if not hasattr(xp, n)]
    assert not missing
    assert not [n for n in LINALG if not hasattr(xp.linalg, n)]
    assert not [n for n in METHODS if not hasattr(xp.Tensor, n)]


# (function, positional-only names, keyword-only names) from the 2024.12 signatures
SIGNATURES = [
    ("sort", ["x"], ["axis", "descending", "stable"]),
    ("argsort", ["x"], ["axis", "descending", "stable"]),
    ("argmax", ["x"], ["axis", "keepdims"]),
    ("searchsorted", ["x1", "x2"], ["side", "sorter"]),
    ("cumulative_sum", ["x"], ["axis", "dtype", "include_initial"]),
    ("take", ["x", "indices"], ["axis"]),
    ("take_along_axis", ["x", "indices"], ["axis"]),
    ("unique_all", ["x"], []),
    ("diff", ["x"], ["axis", "n", "prepend", "append"]),
    ("moveaxis", ["x", "source", "destination"], []),
    ("tensordot", ["x1", "x2"], ["axes"]),
    ("vecdot", ["x1", "x2"], ["axis"]),
    ("tile", ["x", "repetitions"], []),
    ("unstack", ["x"], ["axis"]),
    ("can_cast", ["from_", "to"], []),
    ("from_dlpack", ["x"], ["device", "copy"]),
    ("count_nonzero", ["x"], ["axis", "keepdims"]),
    ("expand_dims", ["x"], []),  # axis is positional-or-keyword: expand_dims(x, /, axis)
    ("where", ["condition", "x1", "x2"], []),
    ("clip", ["x"], []),
    ("astype", ["x", "dtype"], ["copy", "device"]),
]


@pytest.mark.parametrize("name,pos,kw", SIGNATURES, ids=[s[0] for s in SIGNATURES])
def test_signature(name: str, pos: list[str], kw: list[str]) -> None:
    params = inspect.signature(getattr(xp, name)).parameters
    for p in pos:
        assert params[p].kind is inspect.Parameter.POSITIONAL_ONLY, p
    for k in kw:
        assert params[k].kind is inspect.Parameter.KEYWORD_ONLY, k


def test_inspection_object(device: xp.CLDevice) -> None:
    info = xp.__array_namespace_info__()
    caps = info.capabilities()
    assert caps["boolean indexing"] and caps["data-dependent shapes"]
    assert info.default_dtypes()["real floating"] == xp.float32
    assert info.default_dtypes()["indexing"] == xp.int64
    dts = info.dtypes(device=device)
    assert ("float64" in dts) == device.caps.fp64
    assert set(info.dtypes(kind="integral")) == {"int8", "int16", "int32", "int64", "uint8",
                                                 "uint16", "uint32", "uint64"}
    assert device in info.devices() or any(d.name == device.name for d in info.devices())


@pytest.mark.parametrize("a", DTYPES)
def test_can_cast_and_result_type_match_numpy(a: str) -> None:
    for b in DTYPES:
        da, db = getattr(xp, a), getattr(xp, b)
        mixed = {da.kind, db.kind}
        if "b" in mixed and len(mixed) > 1 or (mixed & {"i", "u"} and mixed & {"f", "c"}):
            assert not xp.can_cast(da, db) or da == db
            continue
        if "uint64" in (a, b) and {da.kind, db.kind} == {"i", "u"}:
            with pytest.raises(TypeError):
                xp.result_type(da, db)
            continue
        assert xp.result_type(da, db) == np.result_type(np.dtype(a if a != "bool" else "?"),
                                                        np.dtype(b if b != "bool" else "?"))
        assert xp.can_cast(da, db) == np.can_cast(da.np, db.np, casting="safe")


def test_result_type_python_scalars() -> None:
    assert xp.result_type(xp.int8, 1) == xp.int8
    assert xp.result_type(xp.float32, 1.0, 2) == xp.float32
    assert xp.result_type(xp.float64, 1j) == xp.complex128
    with pytest.raises(TypeError):
        xp.result_type(xp.int8, 1.0)


def test_finfo_iinfo_isdtype() -> None:
    for name in ("float32", "float64"):
        fi, ref = xp.finfo(getattr(xp, name)), np.finfo(name)
        assert (fi.bits, fi.eps, fi.max, fi.min, fi.smallest_normal) == \
            (ref.bits, ref.eps, ref.max, ref.min, ref.smallest_normal)
    assert xp.finfo(xp.complex64).dtype == xp.float32
    for name in DTYPES[1:9]:
        ii, ref = xp.iinfo(getattr(xp, name)), np.iinfo(name)
        assert (ii.bits, ii.min, ii.max) == (ref.bits, ref.min, ref.max)
    assert xp.isdtype(xp.int8, "signed integer") and not xp.isdtype(xp.uint8, "signed integer")
    assert xp.isdtype(xp.float32, ("integral", "real floating"))
    assert xp.isdtype(xp.complex64, "numeric") and not xp.isdtype(xp.bool, "numeric")
    assert xp.isdtype(xp.int16, xp.int16)
    with pytest.raises(ValueError):
        xp.isdtype(xp.int8, "nonsense")


def test_extensions_are_attributes() -> None:
    import array_api_compat

    t = xp.asarray([1.0])
    assert array_api_compat.array_namespace(t) is xp
    assert t.__array_namespace__(api_version="2024.12") is xp
    assert xp.linalg.__name__ == "clops.linalg"


def test_fft_extension_is_a_lazy_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    fake = types.ModuleType("clops.fft")
    monkeypatch.setitem(sys.modules, "clops.fft", fake)
    saved = vars(xp).pop("fft", None)
    try:
        assert xp.fft is fake
    finally:
        vars(xp).pop("fft", None)
        if saved is not None:
            xp.fft = saved  # type: ignore[attr-defined]
