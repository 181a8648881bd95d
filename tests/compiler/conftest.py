"""Fixtures of the compiler tests."""

from __future__ import annotations

import pytest

from clops.compiler import realize as R


@pytest.fixture
def gpu_path(device, monkeypatch):
    """The device taken for a GPU by the compiler (work-group rows, split reductions, the
    GPU's column layout), whatever it is."""
    if device.kind == "cpu":
        monkeypatch.setattr(device, "kind", "gpu")
    R._KERNELS.clear()
    yield device
    R._KERNELS.clear()
