"""Graph, dtypes: the data types clops knows (names, sizes, kinds, numpy types) and the Array API
promotion table. How a backend spells them is the backend's (``runtime/cltypes.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_PY_SCALAR_TYPES = (bool, int, float, complex)


@dataclass(frozen=True, eq=False)
class DType:
    """An array data type. Compare with ``==`` to another DType, a numpy dtype or a name.

    >>> clops.float32 == "float32"
    True
    """

    name: str
    itemsize: int
    kind: str  # "b" bool, "i" signed, "u" unsigned, "f" real float, "c" complex
    np: np.dtype  # host representation (bfloat16 travels as uint16 bits)
    bits: int

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DType):
            return self.name == other.name
        if isinstance(other, str):
            return self.name == other
        # NOTE: np.dtype(None) and np.dtype(float) are float64, but a dtype must not equal
        # None or a Python scalar type (`dtype == None` is how callers test "no dtype given").
        if other is None or any(other is t for t in _PY_SCALAR_TYPES):
            return False
        # NOTE: ``==`` must never raise: np.dtype raises ValueError, KeyError and others on
        # arbitrary objects (a dict such as {"name": "x"} is read as a record spec).
        try:
            return self.name != "bfloat16" and bool(np.dtype(other) == self.np)  # type: ignore
        except Exception:
            return False

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"clops.{self.name}"

    __str__ = __repr__

    @property
    def dtype(self) -> Any:
        """The numpy dtype of the same values (``np.dtype(clops.float32)`` reads it, as numpy
        reads any object's ``dtype``); bfloat16 has none and raises TypeError."""
        if self.name == "bfloat16":
            raise TypeError("numpy has no bfloat16: convert with astype(clops.float32) first")
        return np.dtype(self.np)

    # numpy's dtype attributes that libraries built on numpy (Dask) read from a chunk's dtype
    @property
    def type(self) -> type:
        return self.dtype.type

    @property
    def char(self) -> str:
        return self.dtype.char

    @property
    def str(self) -> str:
        return self.dtype.str

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_complex(self) -> bool:
        return self.kind == "c"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def needs_fp64(self) -> bool:
        return self.name in ("float64", "complex128")


def _d(name: str, size: int, kind: str, npd: str) -> DType:
    return DType(name, size, kind, np.dtype(npd), size * 8)


bool_ = _d("bool", 1, "b", "bool")
int8 = _d("int8", 1, "i", "int8")
int16 = _d("int16", 2, "i", "int16")
int32 = _d("int32", 4, "i", "int32")
int64 = _d("int64", 8, "i", "int64")
uint8 = _d("uint8", 1, "u", "uint8")
uint16 = _d("uint16", 2, "u", "uint16")
uint32 = _d("uint32", 4, "u", "uint32")
uint64 = _d("uint64", 8, "u", "uint64")
float16 = _d("float16", 2, "f", "float16")
bfloat16 = _d("bfloat16", 2, "f", "uint16")
float32 = _d("float32", 4, "f", "float32")
float64 = _d("float64", 8, "f", "float64")
complex64 = _d("complex64", 8, "c", "complex64")
complex128 = _d("complex128", 16, "c", "complex128")

ALL = (bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, bfloat16,
       float32, float64, complex64, complex128)
BY_NAME = {d.name: d for d in ALL}
_BY_NP = {d.np: d for d in ALL if d is not bfloat16}


def to_dtype(x: object) -> DType:
    """A clops DType from a DType, name, numpy dtype or Python type."""
    if isinstance(x, DType):
        return x
    if x is bool:
        return bool_
    if x is int:
        return int64
    if x is float:
        return float32
    if x is complex:
        return complex64
    if isinstance(x, str) and x in BY_NAME:
        return BY_NAME[x]
    if x == "bool_":
        return bool_
    try:
        npd = np.dtype(x)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"{x!r} is not a data type clops knows; use one of "
                        f"{', '.join(BY_NAME)}") from None
    if npd.name == "bfloat16":
        return bfloat16
    if npd in _BY_NP:
        return _BY_NP[npd]
    raise TypeError(f"numpy dtype {npd} has no clops equivalent; use one of {', '.join(BY_NAME)}")


def real_of(d: DType) -> DType:
    return {"complex64": float32, "complex128": float64}.get(d.name, d)


def complex_of(d: DType) -> DType:
    return complex128 if d.name in ("float64", "complex128") else complex64


# -- promotion (Array API 2024.12, plus float16/bfloat16 mixing as PyTorch does) ----------------
_SIGNED = [int8, int16, int32, int64]
_UNSIGNED = [uint8, uint16, uint32, uint64]


def _promote_pair(a: DType, b: DType) -> DType | None:
    if a == b:
        return a
    ka, kb = a.kind, b.kind
    if ka == "b" or kb == "b":
        return None
    if ka in "iu" and kb in "iu":
        if ka == kb:
            return a if a.itemsize >= b.itemsize else b
        s, u = (a, b) if ka == "i" else (b, a)
        if s.itemsize > u.itemsize:
            return s
        need = u.itemsize * 2
        return next((x for x in _SIGNED if x.itemsize >= need), None)
    if ka in "fc" and kb in "fc":
        if {a.name, b.name} == {"float16", "bfloat16"}:
            return float32
        cplx = "c" in (ka, kb)
        size = max(real_of(a).itemsize, real_of(b).itemsize)
        real = {2: a if a.kind == "f" and a.itemsize == 2 else b, 4: float32, 8: float64}[size]
        return complex_of(real) if cplx else real
    return None  # int with float: not defined by the standard


def promote_types(a: DType, b: DType) -> DType:
    """The result type of a binary operation on arrays of dtypes ``a`` and ``b``."""
    r = _promote_pair(a, b)
    if r is None:
        raise TypeError(f"no type promotion between {a} and {b} in the Array API standard; "
                        f"convert one with clops.astype first")
    return r


def can_promote(a: DType, b: DType) -> bool:
    return _promote_pair(a, b) is not None
