"""Fixtures of the provider tests: a private cache directory for measured choices, and helpers
to move numpy arrays to operands and back."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

import clops
from clops import providers
from clops.kernels import layout
from clops.providers import Operand


@pytest.fixture(autouse=True)
def private_choices(tmp_path, monkeypatch) -> Iterator[None]:
    """Each test measures and remembers choices in its own cache directory."""
    monkeypatch.setenv("CLOPS_CACHE_DIR", str(tmp_path))
    providers.clear_choices()
    yield
    providers.clear_choices()


@pytest.fixture
def up(device: clops.CLDevice) -> Callable[..., Operand]:
    """``up(array, strides=None, offset=0)``: a device copy of ``array`` as an operand; with
    ``strides``/``offset`` (elements) the operand is that view of the copied buffer."""

    def make(a: np.ndarray, shape=None, strides=None, offset: int = 0) -> Operand:
        a = np.ascontiguousarray(a)
        buf = device.alloc(a.nbytes)
        device.write(buf, a)
        op = Operand.contiguous(buf, a.shape, a.dtype.name)
        if shape is not None:
            op = op.with_shape(shape, strides, offset)
        return op

    return make


@pytest.fixture
def down(device: clops.CLDevice) -> Callable[[Operand], np.ndarray]:
    """The values of an operand (any strides) as a numpy array."""

    def read(op: Operand) -> np.ndarray:
        full = layout.contiguous(device, op)
        out = np.empty(op.shape, np.dtype(op.dtype))
        device.read(out, full.buffer)
        return out

    return read
