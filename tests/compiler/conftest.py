"""Fixtures of the compiler tests."""

from __future__ import annotations

import pytest

from clops.compiler import realize


@pytest.fixture
def gpu_path(device, monkeypatch):
    """The device taken for a GPU by the compiler (work-group rows, split reductions, the
    GPU's column layout), whatever it is."""
    if device.kind == "cpu":
        monkeypatch.setattr(device, "kind", "gpu")
    realize._KERNELS.clear()
    yield device
    realize._KERNELS.clear()
