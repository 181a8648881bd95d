"""Elementwise operands: the quick paths (tensors of one dtype and shape; a tensor and a Python
int or float of its dtype) give the nodes, device and dtype the general promotion gives."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import clops
from clops.array import elementwise
from clops.graph import ir

DTYPES = ["bool", "int8", "uint8", "int32", "int64", "uint64", "float16", "bfloat16", "float32",
          "complex64"]


def _shape_of(n: ir.Node) -> tuple[Any, ...]:
    """A node as the compiler sees it: op, dtype, shape, value or view, and its sources."""
    arg: Any = n.arg
    if n.op == "load":
        arg = (id(arg[0]), arg[1])
    elif n.op == "const":
        arg = (type(arg), arg)
    return (n.op, n.dtype.name, n.shape, arg, tuple(_shape_of(s) for s in n.srcs))


def _same(args: tuple[Any, ...], device: clops.CLDevice) -> None:
    quick = elementwise._operands(args, "add")
    general = elementwise._promoted(args, "add")
    assert [_shape_of(n) for n in quick[0]] == [_shape_of(n) for n in general[0]]
    assert quick[1] is general[1] is device
    assert quick[2] == general[2]


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensors_of_one_dtype(device: clops.CLDevice, dtype: str) -> None:
    a = clops.zeros((3, 4), dtype=dtype, device=device)
    b = clops.ones((3, 4), dtype=dtype, device=device)
    _same((a, b), device)
    _same((a,), device)
    _same((a[1:], b[:2]), device)  # views
    pending = clops.Tensor(ir.ew("identity", [a._node], a.dtype), device)
    _same((pending, b), device)
    _same((a, clops.ones((4,), dtype=dtype, device=device)), device)  # broadcast: general


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [0, 2, -3, 255, 2**40, 1.5, -0.0, True])
def test_a_tensor_and_a_python_scalar(device: clops.CLDevice, dtype: str, value: Any) -> None:
    a = clops.ones((5,), dtype=dtype, device=device)
    for args in ((a, value), (value, a)):
        try:
            want = elementwise._promoted(args, "add")
        except (OverflowError, TypeError) as e:
            with pytest.raises(type(e)):
                elementwise._operands(args, "add")
            continue
        _same(args, device)
        assert want[2] == elementwise._operands(args, "add")[2]


def test_results_agree_with_numpy(device: clops.CLDevice) -> None:
    x = np.arange(12, dtype=np.int16).reshape(3, 4)
    t = clops.asarray(x, device=device)
    np.testing.assert_array_equal(np.asarray(t + t), x + x)
    np.testing.assert_array_equal(np.asarray(7 - t), 7 - x)
    np.testing.assert_array_equal(np.asarray(t * 2.5), x * np.float32(2.5))
    with pytest.raises(OverflowError):
        t + 2**20
