"""Array layer, data type functions: can_cast, finfo, iinfo, isdtype, result_type, and the
namespace inspection object (``__array_namespace_info__``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import runtime
from ..graph import dtypes as _dt
from ..graph.dtypes import DType
from .tensor import MAX_DIMS, Tensor, spec_sequence

_STANDARD = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float32", "float64", "complex64", "complex128")


def _dtype_of(x: Any) -> DType:
    return x.dtype if isinstance(x, Tensor) else _dt.to_dtype(x)


def can_cast(from_: DType | Tensor, to: DType, /) -> bool:
    """Whether ``from_`` converts to ``to`` under the type promotion rules.

    >>> clops.can_cast(clops.int8, clops.int32)
    True
    """
    a, b = _dtype_of(from_), _dt.to_dtype(to)
    return _dt.can_promote(a, b) and _dt.promote_types(a, b) == b


@dataclass(frozen=True)
class finfo_object:
    """Machine limits of a floating-point dtype."""

    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: DType


@dataclass(frozen=True)
class iinfo_object:
    """Machine limits of an integer dtype."""

    bits: int
    max: int
    min: int
    dtype: DType


def finfo(type: DType | Tensor, /) -> finfo_object:
    """Limits of a floating-point dtype (of the real dtype for complex ones).

    >>> clops.finfo(clops.float32).bits
    32
    """
    d = _dtype_of(type)
    if d.kind not in "fc":
        raise TypeError(f"finfo takes a floating-point dtype, not {d}")
    r = _dt.real_of(d)
    if r.name == "bfloat16":
        return finfo_object(16, 2.0 ** -7, float(np.float32(3.3895314e38)),
                            -float(np.float32(3.3895314e38)), 2.0 ** -126, r)
    fi = np.finfo(r.np)
    return finfo_object(int(fi.bits), float(fi.eps), float(fi.max), float(fi.min),
                        float(fi.smallest_normal), r)


def iinfo(type: DType | Tensor, /) -> iinfo_object:
    """Limits of an integer dtype.

    >>> clops.iinfo(clops.int8).max
    127
    """
    d = _dtype_of(type)
    if d.kind not in "iu":
        raise TypeError(f"iinfo takes an integer dtype, not {d}")
    ii = np.iinfo(d.np)
    return iinfo_object(int(ii.bits), int(ii.max), int(ii.min), d)


_KINDS = {
    "bool": "b", "signed integer": "i", "unsigned integer": "u", "integral": "iu",
    "real floating": "f", "complex floating": "c", "numeric": "iufc",
}


def isdtype(dtype: DType, kind: DType | str | tuple[DType | str, ...]) -> bool:
    """Whether ``dtype`` is of ``kind`` (a kind name, a dtype, or a tuple of those).

    >>> clops.isdtype(clops.float32, "real floating")
    True
    """
    if not isinstance(dtype, DType):
        raise TypeError(f"isdtype takes a clops dtype, not {type(dtype).__name__}")
    if isinstance(kind, tuple):
        return any(isdtype(dtype, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"unknown dtype kind {kind!r}; use one of {', '.join(_KINDS)}")
        return dtype.kind in _KINDS[kind]
    if isinstance(kind, DType):
        return dtype == kind
    raise TypeError(f"isdtype: kind must be a str, a dtype or a tuple, not {kind!r}")


def result_type(*arrays_and_dtypes: DType | Tensor | bool | int | float | complex) -> DType:
    """The dtype of an operation on the given arrays, dtypes and Python scalars.

    >>> clops.result_type(clops.int8, clops.uint8)
    clops.int16
    """
    typed = [a for a in arrays_and_dtypes if not isinstance(a, bool | int | float | complex)]
    scalars = [a for a in arrays_and_dtypes if isinstance(a, bool | int | float | complex)]
    if not typed:
        raise ValueError("result_type needs at least one array or dtype")
    d = _dtype_of(typed[0])
    for a in typed[1:]:
        d = _dt.promote_types(d, _dtype_of(a))
    for s in scalars:
        if isinstance(s, bool):
            if d.kind != "b":
                raise TypeError(f"result_type: a Python bool does not combine with {d}")
        elif isinstance(s, int):
            if d.kind == "b":
                raise TypeError(f"result_type: a Python int does not combine with {d}")
        elif isinstance(s, float):
            if d.kind not in "fc":
                raise TypeError(f"result_type: a Python float does not combine with {d}")
        elif d.kind != "c":
            if d.kind != "f":
                raise TypeError(f"result_type: a Python complex does not combine with {d}")
            d = _dt.complex_of(d)
    return d


class Info:
    """What this namespace supports (``clops.__array_namespace_info__()``).

    >>> clops.__array_namespace_info__().default_dtypes()["real floating"]
    clops.float32
    """

    __module__ = "clops"

    def capabilities(self) -> dict[str, Any]:
        return {"boolean indexing": True, "data-dependent shapes": True,
                "max dimensions": MAX_DIMS}

    def default_device(self) -> runtime.CLDevice:
        return runtime.device()

    def default_dtypes(self, *, device: Any = None) -> dict[str, DType]:
        return {"real floating": _dt.float32, "complex floating": _dt.complex64,
                "integral": _dt.int64, "indexing": _dt.int64}

    def dtypes(self, *, device: Any = None, kind: str | tuple[str, ...] | None = None
               ) -> dict[str, DType]:
        dev = runtime.device(device)
        out = {}
        for name in _STANDARD:
            d = _dt.BY_NAME[name]
            if d.needs_fp64 and not dev.caps.fp64:
                continue
            if kind is None or isdtype(d, kind):
                out[name] = d
        return out

    def devices(self) -> list[runtime.CLDevice] | tuple[runtime.CLDevice, ...]:
        """The devices clops sees: a list, or a tuple from Array API version 2025.12 on."""
        return spec_sequence(runtime.devices())


def __array_namespace_info__() -> Info:
    """The inspection object of this namespace.

    >>> "float32" in clops.__array_namespace_info__().dtypes()
    True
    """
    return Info()
