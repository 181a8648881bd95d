"""Capability probes: memoised per device (held weakly) and arguments, nothing stored on the
device object."""

from __future__ import annotations

import gc

from clops.runtime import probes


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
