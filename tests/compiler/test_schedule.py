"""Scheduling before running: ``clops.compiler.schedule_of`` tells which kernels realizing would
launch (name, key, geometry, inputs, outputs, temporaries) without allocating, rendering or
launching anything, and leaves the tensors pending; running that schedule gives numpy's
values."""

from __future__ import annotations

import numpy as np

import clops
from clops.compiler import realize
from clops.compiler.kernel import KernelKey, Temp
from clops.compiler.render import RENDER_STATS
from clops.runtime import BUILD_STATS


def _counters(device):
    stats = device.memory_stats()
    return (realize.STATS["launches"], RENDER_STATS["renders"], BUILD_STATS["builds"],
            stats["hits"], stats["misses"], stats["in_use"])


def test_schedule_allocates_and_launches_nothing_then_runs(device):
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((6, 50)).astype(np.float32) for _ in range(3))
    x, y, z = (clops.asarray(v, device=device).realize() for v in (a, b, c))
    out = (x * y + z).sum(axis=1)
    before = _counters(device)
    p = clops.compiler.schedule_of(out)
    assert _counters(device) == before
    assert out._node.resolve().op != "load"  # still pending: scheduling changed no node
    (k,) = p.kernels  # one fused kernel
    assert isinstance(k.key, KernelKey) and k.key.raxes == (1,) and k.key.reduced_out
    assert k.name.startswith("k_") and "sum" in k.name
    assert k.geometry is not None and k.geometry.global_size
    assert [t.nbytes for t in p.temps] == [6 * 4]  # the new output buffer, a placeholder
    assert k.outputs == p.temps and all(isinstance(t, Temp) for t in k.outputs)
    assert len(k.inputs) == 3 and not any(isinstance(i, Temp) for i in k.inputs)
    assert "alloc" in str(p) and k.name in str(p)
    hash(k.key)  # the program-cache key
    # running the inspected schedule launches exactly its kernels and computes the value
    realize.run(p, device)
    assert realize.STATS["launches"] == before[0] + 1
    np.testing.assert_allclose(np.asarray(out), (a * b + c).sum(axis=1), rtol=1e-5)


def test_schedule_of_a_split_reduction_lists_its_temporaries(device):
    a = np.random.default_rng(1).standard_normal(1 << 17).astype(np.float32)
    x = clops.asarray(a, device=device).realize()
    s = clops.exp(x).sum() * 2
    before = _counters(device)
    p = clops.compiler.schedule_of(s)
    assert _counters(device) == before
    temps = p.temps
    # a long single row is split: stage 1 writes partials that stage 2 (or the last
    # work-group of stage 1, on GPUs) adds up
    assert any("partials" in t.label or t.counter for t in temps)
    stage1 = p.kernels[0]
    assert stage1.key.chunked and any(o is t for o in stage1.outputs for t in temps)
    # scheduling again gives the same kernels: nothing was realized in between
    assert [k.key for k in clops.compiler.schedule_of(s).kernels] == [k.key for k in p.kernels]
    realize.run(p, device)
    assert realize.STATS["launches"] == before[0] + len(p.kernels)
    np.testing.assert_allclose(float(s), np.exp(a.astype(np.float64)).sum() * 2, rtol=1e-5)


def test_schedule_of_realized_tensors_is_empty(device):
    x = clops.asarray(np.ones(4, np.float32), device=device).realize()
    assert clops.compiler.schedule_of(x).entries == []
