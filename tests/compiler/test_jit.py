"""clops.jit: capture once per signature, replay with no graph building, scheduling or
rendering; results equal the eager ones."""

from __future__ import annotations

import numpy as np
import pytest

import clops
from clops.compiler import render
from clops.compiler.jit import JitError


def test_replay_matches_eager_and_does_no_compiler_work(device, monkeypatch):
    @clops.jit
    def step(x, w, b):
        h = clops.tanh(x @ w + b)
        return h, (h * h).sum(axis=-1)

    rng = np.random.default_rng(0)
    w = clops.asarray(rng.standard_normal((8, 4)).astype(np.float32), device=device)
    b = clops.asarray(rng.standard_normal(4).astype(np.float32), device=device)
    first = rng.standard_normal((3, 8)).astype(np.float32)
    step(clops.asarray(first, device=device), w, b)
    r0 = render.RENDER_STATS["renders"]

    import clops.compiler.schedule as sched

    def no_schedule(*a, **k):
        raise AssertionError("replay must not schedule")

    monkeypatch.setattr(sched, "schedule", no_schedule)
    for seed in range(3):
        x = np.random.default_rng(seed + 10).standard_normal((3, 8)).astype(np.float32)
        with clops.profile() as prof:
            h, s = step(clops.asarray(x, device=device), w, b)
        ref = np.tanh(x @ np.asarray(w) + np.asarray(b))
        np.testing.assert_allclose(np.asarray(h), ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(s), (ref * ref).sum(-1), rtol=1e-5, atol=1e-5)
        assert prof.kernel_count == 2
    assert render.RENDER_STATS["renders"] == r0
    assert len(step.plans) == 1


def test_outputs_of_successive_replays_do_not_alias(device):
    f = clops.jit(lambda x: x * 2)
    a = f(clops.asarray([1.0, 2.0], device=device))
    b = f(clops.asarray([3.0, 4.0], device=device))
    c = f(clops.asarray([5.0, 6.0], device=device))
    np.testing.assert_array_equal(np.asarray(b), [6, 8])
    np.testing.assert_array_equal(np.asarray(c), [10, 12])
    np.testing.assert_array_equal(np.asarray(a), [2, 4])


def test_new_signature_captures_again(device):
    f = clops.jit(lambda x: x + 1)
    f(clops.asarray([1.0], device=device))
    f(clops.asarray([1.0, 2.0], device=device))
    f(clops.asarray([1, 2], device=device))
    assert len(f.plans) == 3


def test_host_reads_inside_are_refused(device):
    @clops.jit
    def bad(x):
        return x * float(x.sum())

    with pytest.raises(JitError, match="host"):
        bad(clops.asarray([1.0, 2.0], device=device))
