"""Array layer, namespace: everything ``import clops as xp`` exports for the Array API."""

from __future__ import annotations

import math as _math

from ..graph.dtypes import (
    DType,
    bfloat16,
    complex64,
    complex128,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    uint8,
    uint16,
    uint32,
    uint64,
)
from ..graph.dtypes import bool_ as bool  # noqa: A001
from . import elementwise as _ew
from .advanced_indexing import take, take_along_axis
from .arguments import check_namespace
from .creation import (
    arange,
    asarray,
    empty,
    empty_like,
    eye,
    full,
    full_like,
    linspace,
    meshgrid,
    ones,
    ones_like,
    tril,
    triu,
    zeros,
    zeros_like,
)
from .data_types import __array_namespace_info__, can_cast, finfo, iinfo, isdtype, result_type
from .elementwise import clip, where
from .interop import from_dlpack
from .linalg_core import einsum, matmul, tensordot, vecdot
from .manipulation import (
    astype,
    broadcast_arrays,
    broadcast_shapes,
    broadcast_to,
    concat,
    expand_dims,
    flip,
    matrix_transpose,
    moveaxis,
    permute_dims,
    repeat,
    reshape,
    roll,
    squeeze,
    stack,
    tile,
    unstack,
)
from .searching import argmax, argmin, count_nonzero, nonzero, searchsorted
from .set_functions import isin, unique_all, unique_counts, unique_inverse, unique_values
from .sorting import argsort, sort
from .statistics import (
    all,
    any,
    cumulative_prod,
    cumulative_sum,
    diff,
    max,
    mean,
    min,
    std,
    sum,
    var,
)
from .statistics import prod_ as prod
from .tensor import Tensor, realize

e = _math.e
pi = _math.pi
inf = _math.inf
nan = _math.nan
newaxis = None

for _name in _ew.TABLE:
    globals()[_name] = getattr(_ew, _name)

__all__ = [
    "__array_namespace_info__", "argmax", "argmin", "argsort", "broadcast_shapes", "can_cast",
    "count_nonzero", "einsum", "isin",
    "cumulative_prod", "cumulative_sum", "diff", "finfo", "from_dlpack", "iinfo", "isdtype",
    "moveaxis", "nonzero", "repeat", "result_type", "roll", "searchsorted", "sort", "take",
    "take_along_axis", "tensordot", "tile", "unique_all",
    "unique_counts", "unique_inverse", "unique_values", "unstack", "vecdot",
    "DType", "Tensor", "all", "any", "arange", "asarray", "astype", "bfloat16", "bool",
    "broadcast_arrays", "broadcast_to", "clip", "complex64", "complex128", "concat", "e",
    "empty", "empty_like", "expand_dims", "eye", "flip", "float16", "float32", "float64", "full",
    "full_like", "inf", "int8", "int16", "int32", "int64", "linspace", "matmul",
    "matrix_transpose", "max", "mean", "meshgrid", "min", "nan", "newaxis", "ones", "ones_like",
    "permute_dims", "pi", "prod", "realize", "reshape", "squeeze", "stack", "std", "sum", "tril",
    "triu", "uint8", "uint16", "uint32", "uint64", "var", "where", "zeros", "zeros_like",
    *_ew.TABLE,
]

# Every function here that takes arrays refuses anything else by name (see arguments.py).
check_namespace(globals(), __all__)
