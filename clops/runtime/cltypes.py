"""Runtime, OpenCL C types: the storage type and the arithmetic type of each clops dtype in
OpenCL C, for the generated-kernel renderer and for hand kernels built with ``-DT=...``."""

from __future__ import annotations

from typing import Any

# dtype name -> OpenCL C type of its elements in memory
STORAGE = {
    "bool": "uchar", "int8": "char", "int16": "short", "int32": "int", "int64": "long",
    "uint8": "uchar", "uint16": "ushort", "uint32": "uint", "uint64": "ulong",
    "float16": "half", "bfloat16": "ushort", "float32": "float", "float64": "double",
    "complex64": "float2", "complex128": "double2",
}
# dtype name -> OpenCL C type arithmetic is done in (half and bfloat16 are storage types;
# bool computes as int)
MATH = {**STORAGE, "bool": "int", "float16": "float", "bfloat16": "float"}


def _name(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else dtype.name


def storage(dtype: Any) -> str:
    """The OpenCL C type of ``dtype``'s elements in a buffer (a DType or its name).

    >>> storage("float16")
    'half'
    """
    return STORAGE[_name(dtype)]


def math(dtype: Any) -> str:
    """The OpenCL C type ``dtype``'s arithmetic is done in (a DType or its name)."""
    return MATH[_name(dtype)]
