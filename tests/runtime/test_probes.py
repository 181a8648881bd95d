"""Capability probes: memoised per device (held weakly) and arguments, nothing stored on the
device object."""

from __future__ import annotations

import gc

from clops.runtime import probes, program


class _Dev:
    pass


def test_per_device_runs_once_per_device_and_arguments():
    calls = []

    @probes.per_device
    def builds(dev, flavour="plain"):
        calls.append((dev, flavour))
        return flavour == "plain"

    a, b = _Dev(), _Dev()
    assert builds(a) and builds(a) and not builds(a, "mma") and not builds(a, "mma")
    assert builds(b)
    assert calls == [(a, "plain"), (a, "mma"), (b, "plain")]
    assert vars(a) == {}  # nothing on the device


def test_answers_go_with_the_device():
    seen = []

    @probes.per_device
    def probe(dev):
        seen.append(1)
        return True

    d = _Dev()
    probe(d)
    del d
    gc.collect()
    probe(_Dev())
    assert len(seen) == 2


def test_remembered_answers_are_kept_apart_by_the_target_setting(device, clops_env, tmp_path):
    # A CPU runtime told to compile for another CPU (CL_CONFIG_CPU_TARGET_ARCH=core-avx2 on an
    # AVX-512 machine) reports the same device: a verdict on its code is not the machine's own.
    clops_env(CLOPS_CACHE_DIR=str(tmp_path), **{v: None for v in program.TARGET_ENV})
    plain = device.key
    calls = []

    def answer(value):
        calls.append(value)
        return value

    assert probes.remembered(device, "target-test", lambda: answer(True)) is True
    clops_env(CL_CONFIG_CPU_TARGET_ARCH="core-avx2")
    assert device.key == plain + "|CL_CONFIG_CPU_TARGET_ARCH=core-avx2"
    assert probes.remembered(device, "target-test", lambda: answer(False)) is False
    assert probes.remembered(device, "target-test", lambda: answer(True)) is False
    clops_env(CL_CONFIG_CPU_TARGET_ARCH=None)
    assert device.key == plain
    assert probes.remembered(device, "target-test", lambda: answer(False)) is True
    assert calls == [True, False]
