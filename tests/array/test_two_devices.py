"""Array layer, operands on two devices: every function that takes several tensors refuses a
mix with a ValueError naming both devices (indexing, take, searchsorted and linalg.solve used to
launch a kernel given another context's buffers, which never completed), and the process stays
usable afterwards. Two devices: sub-devices of one (same context) and two OpenCL devices (two
contexts, e.g. the two PoCL platforms), each where present."""

from __future__ import annotations

import faulthandler
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import clops
from clops import CLDevice

# A missing check hangs (the kernel never completes): end the run with a traceback instead.
HANG_DEADLINE_S = 300


def _pair(kind: str) -> tuple[CLDevice, CLDevice]:
    if kind == "sub-devices":
        dev = clops.device()
        if dev.partition_support()["max_sub_devices"] < 2:
            pytest.skip(f"{dev} cannot be split into sub-devices")
        d0, d1 = dev.create_sub_devices(2)
        return d0, d1
    # a runtime whose compiler cannot target this machine (clops info: builds=NO) is no pair
    devs = [d for d in clops.devices() if d.probe("builds")]
    if len(devs) < 2:
        pytest.skip("needs two OpenCL devices that build kernels")
    return devs[0], devs[1]


@pytest.fixture(params=["sub-devices", "two devices"])
def two(request: pytest.FixtureRequest) -> Iterator[tuple[CLDevice, CLDevice]]:
    faulthandler.dump_traceback_later(HANG_DEADLINE_S, exit=True, file=sys.__stderr__)
    try:
        yield _pair(request.param)
    finally:
        faulthandler.cancel_dump_traceback_later()


def _on(dev: CLDevice, values: Any, dtype: Any = None) -> clops.Tensor:
    return clops.asarray(np.asarray(values), dtype=dtype, device=dev)


# name: f(d0, d1) that mixes the two devices
CASES: dict[str, Callable[[CLDevice, CLDevice], Any]] = {
    "getitem int array": lambda a, b: _on(a, np.arange(5))[_on(b, [1, 2])],
    "getitem 0-d index": lambda a, b: _on(a, np.arange(5))[_on(b, 1)],
    "getitem int arrays on two axes": lambda a, b: _on(a, np.ones((3, 3)))[
        _on(a, [0, 1]), _on(b, [1, 2])],
    "getitem bool mask": lambda a, b: _on(a, np.arange(5))[_on(b, [True, False] * 2 + [True])],
    "setitem int array": lambda a, b: _on(a, np.arange(5)).__setitem__(_on(b, [1, 2]), 7),
    "setitem value": lambda a, b: _on(a, np.arange(5)).__setitem__(_on(a, [1, 2]),
                                                                  _on(b, [7, 8])),
    "setitem basic value": lambda a, b: _on(a, np.arange(5)).__setitem__(slice(0, 2),
                                                                        _on(b, [7, 8])),
    "setitem bool mask": lambda a, b: _on(a, np.arange(5)).__setitem__(
        _on(b, [True, False] * 2 + [True]), 0),
    "take": lambda a, b: clops.take(_on(a, np.arange(5)), _on(b, [1, 2])),
    "take_along_axis": lambda a, b: clops.take_along_axis(_on(a, np.arange(5)), _on(b, [1, 2])),
    "searchsorted": lambda a, b: clops.searchsorted(_on(a, [1.0, 2.0]), _on(b, [1.5])),
    "searchsorted sorter": lambda a, b: clops.searchsorted(_on(a, [2.0, 1.0]), _on(a, [1.5]),
                                                           sorter=_on(b, [1, 0])),
    "linalg.solve": lambda a, b: clops.linalg.solve(_on(a, np.eye(2), "float32"),
                                                    _on(b, [1.0, 2.0])),
    "linalg.solve complex": lambda a, b: clops.linalg.solve(_on(a, np.eye(2), "complex64"),
                                                            _on(b, [1.0, 2.0], "complex64")),
    "linalg.outer": lambda a, b: clops.linalg.outer(_on(a, [1.0]), _on(b, [2.0])),
    "linalg.cross": lambda a, b: clops.linalg.cross(_on(a, [1.0, 0, 0]), _on(b, [0, 1.0, 0])),
    "linalg.pinv rtol": lambda a, b: clops.linalg.pinv(_on(a, np.eye(2), "float32"),
                                                       rtol=_on(b, 0.1, "float32")),
    "matmul": lambda a, b: _on(a, np.eye(2)) @ _on(b, np.eye(2)),
    "tensordot": lambda a, b: clops.tensordot(_on(a, np.eye(2)), _on(b, np.eye(2))),
    "vecdot": lambda a, b: clops.vecdot(_on(a, [1.0]), _on(b, [2.0])),
    "add": lambda a, b: _on(a, [1]) + _on(b, [2]),
    "where": lambda a, b: clops.where(_on(b, [True]), _on(a, [1]), 0),
    "clip": lambda a, b: clops.clip(_on(a, [1, 5]), min=_on(b, 2)),
    "concat": lambda a, b: clops.concat([_on(a, [1]), _on(b, [2])]),
    "stack": lambda a, b: clops.stack([_on(a, [1]), _on(b, [2])]),
    "diff append": lambda a, b: clops.diff(_on(a, [1, 4]), append=_on(b, [9])),
    "repeat counts": lambda a, b: clops.repeat(_on(a, [1, 2]), _on(b, [2, 1])),
    "broadcast_arrays": lambda a, b: clops.broadcast_arrays(_on(a, [1]), _on(b, [2])),
    "meshgrid": lambda a, b: clops.meshgrid(_on(a, [1]), _on(b, [2])),
    "isin": lambda a, b: clops.isin(_on(a, [1, 2]), _on(b, [2])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mixing_two_devices_is_a_clear_error(case: str, two: tuple[CLDevice, CLDevice]) -> None:
    d0, d1 = two
    with pytest.raises(ValueError, match="different devices") as info:
        CASES[case](d0, d1)
    assert str(d0) in str(info.value) and str(d1) in str(info.value)
    # the process goes on: work on each device, and a move between them, still completes
    x0 = _on(d0, np.arange(6))
    x1 = _on(d1, [1, 2])
    np.testing.assert_array_equal(x0[x1.to_device(d0)].to_numpy(), [1, 2])
    np.testing.assert_array_equal((x1 * 3).to_numpy(), [3, 6])


def test_one_device_still_works_for_every_case(two: tuple[CLDevice, CLDevice]) -> None:
    d0, _ = two
    for fn in CASES.values():
        fn(d0, d0)  # the same call on one device raises nothing
    got = _on(d0, np.arange(5))
    got[_on(d0, [True, False] * 2 + [True])] = 0
    np.testing.assert_array_equal(got.to_numpy(), [0, 1, 0, 3, 0])
