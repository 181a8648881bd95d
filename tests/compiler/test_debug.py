"""CLOPS_DEBUG=1 prints each kernel's source and launch size; 2 adds the schedule."""

from __future__ import annotations

import numpy as np

import clops
from clops import _config
from clops.compiler import realize as compiler_realize


def _run_with_debug(level: int, monkeypatch, capsys, device) -> str:
    monkeypatch.setenv("CLOPS_DEBUG", str(level))
    _config.reload()
    # a fresh structure so that this run renders its kernel
    monkeypatch.setattr(compiler_realize, "_KERNELS", {})
    try:
        t = clops.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
        np.asarray(clops.cosh(t).sum(axis=1))
    finally:
        monkeypatch.delenv("CLOPS_DEBUG")
        _config.reload()
    return capsys.readouterr().err


def test_debug_1_prints_source_and_launch(monkeypatch, capsys, device):
    err = _run_with_debug(1, monkeypatch, capsys, device)
    assert "__kernel void k_cosh_sum" in err and "[clops] launch k_cosh_sum global=" in err
    assert "[clops] schedule" not in err


def test_debug_2_prints_the_schedule(monkeypatch, capsys, device):
    err = _run_with_debug(2, monkeypatch, capsys, device)
    assert "[clops] schedule: kernel over [2, 3] reduce axes [1]" in err


def test_complex128_where_fp64(device):
    if not device.caps.fp64:
        return
    a = np.array([1 + 2j, -3.5 + 0.25j], np.complex128)
    t = clops.asarray(a, device=device)
    np.testing.assert_allclose(np.asarray(t * t + 1), a * a + 1)
