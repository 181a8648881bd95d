"""Runtime, default device: GPUs first, then CPU runtimes in the measured order (Intel's, then
PoCL, newest first), skipping one that cannot build and passing over one that fails the CPU
product probe; the reasons are kept for ``clops info``."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from clops.runtime.discovery import DeviceEntry

device_mod = importlib.import_module("clops.runtime.device")


def _entry(backend: str, kind: str, version: str) -> DeviceEntry:
    return DeviceEntry(SimpleNamespace(version=version), SimpleNamespace(name=backend), kind,
                       backend)


POCL30 = _entry("pocl", "cpu", "OpenCL 3.0 PoCL 3.0-rc2  Linux")
POCL31 = _entry("pocl", "cpu", "OpenCL 3.0 PoCL 3.1+debian  Linux")
INTEL = _entry("intel", "cpu", "OpenCL 3.1 LINUX")
OTHER = _entry("opencl", "cpu", "OpenCL 3.0 Something 9.9")
GPU = _entry("nvidia", "gpu", "OpenCL 3.0 CUDA 13.0")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    """Devices that build unless named in ``broken``, products that work unless in ``slow``."""
    state = SimpleNamespace(broken=[], slow=[])

    def wrap(e):
        return SimpleNamespace(entry=e, kind=e.kind, selector=f"{e.backend}:{e.platform.version}",
                               probe=lambda what: e not in state.broken)

    monkeypatch.setattr(device_mod, "_wrap", wrap)
    monkeypatch.setattr(device_mod, "_cpu_products_work", lambda d: d.entry not in state.slow)
    return state


def test_cpu_runtimes_rank_by_measurement_not_by_listing():
    ranked = sorted([OTHER, POCL30, POCL31, INTEL], key=device_mod.cpu_rank)
    assert ranked == [INTEL, POCL31, POCL30, OTHER]


def test_a_gpu_comes_before_every_cpu(fake):
    why: list[str] = []
    assert device_mod._pick([POCL31, INTEL, GPU], why).entry is GPU
    assert why == ["a gpu is preferred over CPUs"]


def test_intel_before_pocl_whatever_the_listing_order(fake):
    why: list[str] = []
    assert device_mod._pick([POCL30, POCL31, INTEL], why).entry is INTEL
    assert "Intel's CPU runtime is preferred" in why[0]


def test_a_runtime_failing_the_probe_is_passed_over(fake):
    fake.slow = [INTEL, POCL31, POCL30]
    why: list[str] = []
    # none passes: the first that builds, in rank order
    assert device_mod._pick([POCL30, POCL31, INTEL], why).entry is INTEL
    fake.slow = [INTEL]
    why.clear()
    assert device_mod._pick([POCL30, POCL31, INTEL], why).entry is POCL31
    assert "fails the gemm_cpu probe" in why[0] and "PoCL is preferred" in why[1]


def test_a_runtime_that_cannot_build_is_skipped(fake):
    fake.broken = [INTEL]
    why: list[str] = []
    assert device_mod._pick([INTEL, POCL30, POCL31], why).entry is POCL31
    assert "cannot build" in why[0]


def test_a_selector_with_one_match_is_taken_as_is(fake):
    fake.broken = [POCL30]
    why: list[str] = []
    assert device_mod._pick([POCL30], why).entry is POCL30
    assert why == ["the only device the selector matches"]
