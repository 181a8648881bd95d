"""nn's functions, operands on two devices: each refuses a mix with a ValueError naming both
devices (a kernel given another context's buffers crashed Intel's CPU runtime, or never
completes), and the process stays usable afterwards. The pairs of devices are those of the
array layer's test (sub-devices of one; two OpenCL devices, each where present)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import clops
import clops.nn as nn
from clops import CLDevice

from ..array.test_two_devices import two  # noqa: F401 - the fixture

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 64)).astype(np.float32)
W = RNG.standard_normal((32, 64)).astype(np.float32)


def _on(dev: CLDevice, values: Any) -> clops.Tensor:
    return clops.asarray(np.asarray(values), device=dev)


def _heads(dev: CLDevice, n: int = 2) -> clops.Tensor:
    return _on(dev, RNG.standard_normal((n, 2, 16)).astype(np.float32))


# name: f(d0, d1) that mixes the two devices
CASES: dict[str, Callable[[CLDevice, CLDevice], Any]] = {
    "linear x": lambda a, b: nn.linear(_on(b, X), nn.quantized(W, device=a)),
    "linear bias": lambda a, b: nn.linear(_on(a, X), nn.quantized(W, device=a),
                                          _on(b, np.zeros(32, np.float32))),
    "linear quantized": lambda a, b: nn.linear(_on(b, X), nn.quantized(W, "f16", device=a)),
    "embedding": lambda a, b: nn.embedding(_on(b, [1, 2]), nn.quantized(W, device=a)),
    "rms_norm": lambda a, b: nn.rms_norm(_on(a, X), _on(b, np.ones(64, np.float32))),
    "layer_norm": lambda a, b: nn.layer_norm(_on(a, X), _on(a, np.ones(64, np.float32)),
                                             _on(b, np.zeros(64, np.float32))),
    "rope": lambda a, b: nn.rope(_heads(a), _on(b, [0, 1])),
    "attention": lambda a, b: nn.scaled_dot_product_attention(_heads(a), _heads(b), _heads(a)),
    "KVCache.attend": lambda a, b: nn.KVCache(2, 16, 8, device=a).attend(
        _heads(b, 1), _heads(b, 1), _heads(b, 1)),
    "KVCache.append": lambda a, b: nn.KVCache(2, 16, 8, device=a).append(
        _heads(b, 1), _heads(b, 1)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mixing_two_devices_is_a_clear_error(case: str, two: tuple[CLDevice, CLDevice]) -> None:  # noqa: F811
    d0, d1 = two
    with pytest.raises(ValueError, match="different devices") as info:
        CASES[case](d0, d1)
    assert str(d0) in str(info.value) and str(d1) in str(info.value)
    # the process goes on: the same call on one device gives its values
    got = nn.linear(_on(d1, X), nn.quantized(W, device=d1))
    np.testing.assert_allclose(np.asarray(got), X @ W.T, rtol=1e-4, atol=1e-4)


def test_one_device_still_works_for_every_case(two: tuple[CLDevice, CLDevice]) -> None:  # noqa: F811
    d0, _ = two
    for fn in CASES.values():
        fn(d0, d0)  # the same call on one device raises nothing
