"""The array layer's operator table (``array/_ops.py``): filled by the operator modules as the
package is imported, one function a name, refusing a second and naming what is missing."""

import pytest

import clops  # noqa: F401  (imports every operator module: the table is full)
from clops.array import _ops
from clops.array._ops import OPS, register


def test_every_name_tensor_reaches_is_registered():
    # (the names Tensor's methods and the lower modules call through the table)
    for name in ("apply", "asarray", "astype", "reshape", "permute_dims", "squeeze", "getitem",
                 "setitem", "advanced_getitem", "advanced_setitem", "take", "matmul", "sum",
                 "mean", "max", "min", "array_function", "array_ufunc", "reduce_tensor",
                 "host_array", "zero_copy", "dlpack_device", "dlpack", "to_pyopencl",
                 "to_host_future"):
        assert callable(getattr(OPS, name)), name


def test_a_second_function_of_a_name_is_refused():
    with pytest.raises(Exception, match="sum"):
        register(name="sum")(lambda x: x)


def test_a_missing_name_is_named():
    with pytest.raises(AttributeError, match="no_such_operator"):
        OPS.no_such_operator  # noqa: B018


def test_the_table_imports_nothing_of_the_package():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(_ops))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 or node.module not in (None, ""), ast.dump(node)
