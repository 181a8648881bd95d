"""Array layer, arguments of the wrong kind: a list where an array is required, a float index,
an axis that is not an int. Each used to fail deep inside with an AttributeError or an
unrelated comparison error; each is now the TypeError or IndexError numpy gives (the Array
API's way where numpy converts: arrays are required, ``asarray`` converts), naming what was
wrong and what to do."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import clops
import clops.array.api
import clops.fft
import clops.linalg
from clops.array.arguments import array_parameters

NAMESPACES = {"clops": clops.array.api, "clops.linalg": clops.linalg, "clops.fft": clops.fft}


def _array_functions() -> list[tuple[str, str]]:
    return [(ns, name) for ns, mod in NAMESPACES.items() for name in mod.__all__
            if inspect.isfunction(getattr(mod, name))
            and array_parameters(inspect.unwrap(getattr(mod, name)))]


ARRAY_FUNCTIONS = _array_functions()


def test_the_checked_functions_are_the_ones_that_take_arrays():
    names = {name for _, name in ARRAY_FUNCTIONS}
    assert {"sum", "mean", "max", "argmax", "sort", "concat", "stack", "reshape", "sin",
            "where", "take", "einsum", "det", "fft", "broadcast_arrays", "meshgrid"} <= names
    # functions that take scalars or shapes are left alone
    assert not names & {"asarray", "zeros", "arange", "add", "multiply", "matmul", "from_dlpack",
                        "result_type", "broadcast_shapes", "fftfreq"}


@pytest.mark.parametrize("namespace, name", ARRAY_FUNCTIONS)
@pytest.mark.parametrize("given, described", [([1.0, 2.0], "a list"),
                                              (np.ones(2), "numpy.ndarray")])
def test_every_function_that_takes_arrays_refuses_a_non_array(namespace, name, given,
                                                              described):
    fn = getattr(NAMESPACES[namespace], name)
    i, param, kind = array_parameters(inspect.unwrap(fn))[0]
    args = ["i->"] * i  # (einsum: the subscripts come first)
    if kind == "one":
        args.append(given)
        where = param
    else:
        x = clops.ones(2)
        args += [[x, given]] if kind == "sequence" else [x, given]
        where = f"{param}[1]"
    with pytest.raises(TypeError) as info:
        fn(*args)
    msg = str(info.value)
    assert msg.startswith(f"{name}: {where} must be an array") and described in msg, msg
    assert "clops.asarray" in msg, msg


def test_sum_of_a_list(device):
    with pytest.raises(TypeError, match=r"^sum: x must be an array \(a clops Tensor\), not a "
                                        r"list; convert it first with clops\.asarray"):
        clops.sum([1, 2, 3])
    assert int(clops.sum(clops.asarray([1, 2, 3], device=device))) == 6


def test_sequences_of_arrays(device):
    x = clops.ones(3, device=device)
    with pytest.raises(TypeError, match=r"concat: arrays must be a tuple or list of arrays "
                                        r".*not a single array"):
        clops.concat(x)
    with pytest.raises(TypeError, match=r"stack: arrays\[0\] must be an array .*not int"):
        clops.stack((1, x))
    assert clops.concat((x, x)).shape == (6,) and clops.stack([x, x]).shape == (2, 3)


def test_elementwise_without_an_array_says_to_convert(device):
    with pytest.raises(TypeError, match=r"add needs at least one clops Tensor operand, got "
                                        r"list, list; .*clops\.asarray"):
        clops.add([1], [2])
    with pytest.raises(TypeError, match=r"unsupported operand type list.*clops\.asarray"):
        clops.add(clops.ones(2, device=device), [1, 2])
    # Python scalars beside an array stay valid (Array API 2024.12)
    assert clops.add(clops.ones(2, device=device), 1).to_numpy().tolist() == [2.0, 2.0]


@pytest.mark.parametrize("key", [0.5, (0, 0.5), "a", (slice(None), 1.0), {0}])
def test_non_integer_index_is_an_index_error_like_numpy(key, device):
    xh = np.arange(6.0).reshape(2, 3)
    x = clops.asarray(xh, device=device)
    with pytest.raises(IndexError):  # the reference
        xh[key]
    with pytest.raises(IndexError, match=r"only integers, slices \(`:`\), ellipsis"):
        x[key]
    with pytest.raises(IndexError, match=r"only integers, slices \(`:`\), ellipsis"):
        x[key] = 1.0
    np.testing.assert_array_equal(x.to_numpy(), xh)  # nothing was written


def test_valid_indices_still_work(device):
    xh = np.arange(6.0).reshape(2, 3)
    x = clops.asarray(xh, device=device)
    for key in (1, np.int64(1), (1, -1), (Ellipsis, 0), (None, 1), slice(0, 1), [1, 0],
                xh > 2, (True,)):
        np.testing.assert_array_equal(x[key].to_numpy(), xh[key])


AXIS_CALLS = {
    "sum": lambda x, a: clops.sum(x, axis=a), "prod": lambda x, a: clops.prod(x, axis=a),
    "mean": lambda x, a: clops.mean(x, axis=a), "max": lambda x, a: clops.max(x, axis=a),
    "min": lambda x, a: clops.min(x, axis=a), "std": lambda x, a: clops.std(x, axis=a),
    "var": lambda x, a: clops.var(x, axis=a), "all": lambda x, a: clops.all(x, axis=a),
    "any": lambda x, a: clops.any(x, axis=a), "argmax": lambda x, a: clops.argmax(x, axis=a),
    "argmin": lambda x, a: clops.argmin(x, axis=a), "sort": lambda x, a: clops.sort(x, axis=a),
    "argsort": lambda x, a: clops.argsort(x, axis=a),
    "cumulative_sum": lambda x, a: clops.cumulative_sum(x, axis=a),
    "count_nonzero": lambda x, a: clops.count_nonzero(x, axis=a),
    "concat": lambda x, a: clops.concat([x, x], axis=a),
    "stack": lambda x, a: clops.stack([x, x], axis=a),
    "unstack": lambda x, a: clops.unstack(x, axis=a),
    "flip": lambda x, a: clops.flip(x, axis=a), "roll": lambda x, a: clops.roll(x, 1, axis=a),
    "squeeze": lambda x, a: clops.squeeze(x, axis=a),
    "expand_dims": lambda x, a: clops.expand_dims(x, axis=a),
    "take": lambda x, a: clops.take(x, clops.asarray([0], device=x.device), axis=a),
    "diff": lambda x, a: clops.diff(x, axis=a),
    "vecdot": lambda x, a: clops.vecdot(x, x, axis=a),
    "vector_norm": lambda x, a: clops.linalg.vector_norm(x, axis=a),
    "cross": lambda x, a: clops.linalg.cross(x, x, axis=a),
    "fft": lambda x, a: clops.fft.fft(x, axis=a),
    "method sum": lambda x, a: x.sum(axis=a),
}


@pytest.mark.parametrize("fn", list(AXIS_CALLS))
@pytest.mark.parametrize("axis", ["0", 0.5, True, [0, "1"], None.__class__])
def test_axis_that_is_not_an_int_is_a_type_error(fn, axis, device):
    x = clops.ones((3, 3), device=device)
    with pytest.raises(TypeError, match=r"axis must be an int or a tuple of ints, not "):
        AXIS_CALLS[fn](x, axis)


def test_numpy_refuses_the_same_axes():
    for axis in ("0", 0.5, True):
        with pytest.raises(TypeError):
            np.sum(np.ones((3, 3)), axis=axis)


def test_integer_axes_still_work(device):
    xh = np.arange(9.0).reshape(3, 3)
    x = clops.asarray(xh, device=device)
    for axis in (0, -1, np.int64(1), (0, 1), [1]):
        np.testing.assert_allclose(clops.sum(x, axis=axis).to_numpy(),
                                   xh.sum(axis=tuple(axis) if isinstance(axis, list) else axis))
    assert clops.argmax(x, axis=np.int32(0)).to_numpy().tolist() == [2, 2, 2]
