"""The compiler from many threads at once: threads that each build new fused kernels (a key
none of them has built yet) get numpy's results, one renderer serves every thread, split
reductions sharing the device's work-group counter from threads on their own queues add up, and
threads whose graphs share a pending tensor each plan against the graph as it is."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import numpy as np

import clops
from clops.compiler.kernel import KernelItem, Output
from clops.compiler.lower import lower
from clops.compiler.render import CLRenderer
from clops.graph import dtypes as dt
from clops.graph import ir
from clops.graph.ir import View
from tests.threads import JOIN_S, THREADS, run_threads

# Per thread a rank and a dtype of its own, so that no two threads build the same key.
RANKS = (1, 2, 3, 1, 2, 3, 2, 1)
DTYPES = ("float32", "float64", "int32", "float32", "int64", "float32", "float64", "int16")
OPS = 8  # per thread: every one a new structure (a new kernel)


def expression(xp: Any, i: int, a: Any, b: Any, c: Any) -> Any:
    """Op ``i`` of a thread: one of five forms, repeated 1 + i // 5 times (so each ``i`` is a
    structure of its own), half of them summed over the last axis."""
    form, reps = i % 5, 1 + i // 5
    x = a
    for j in range(reps):
        if form == 0:
            x = x * b + c
        elif form == 1:
            x = xp.where(x > b, x - c, x + c)
        elif form == 2:
            x = xp.abs(x - b) * c
        elif form == 3:  # casts
            to = xp.float32 if j % 2 else xp.float64
            x = xp.astype(x, to) * xp.astype(c, to) + xp.astype(b, to)
        else:
            x = xp.maximum(x, b) - xp.minimum(x, c)
    if form == 3 and reps == 1:
        x = xp.exp(xp.astype(x, xp.float32) * 0.125) - xp.astype(b, xp.float32)
    return xp.sum(x, axis=-1) if i % 2 else x


def inputs(t: int, i: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 * t + i)
    shape = tuple(int(n) for n in rng.integers(2, 9, RANKS[t]))
    return [rng.integers(1, 20, shape).astype(DTYPES[t]) for _ in range(3)]


def test_threads_building_new_kernels_at_once_get_numpy_results(device):
    # Every op of every thread is a new kernel: each thread renders and builds while the
    # others do. The renderer used to keep one render's state on a shared instance, and a
    # thread read another's argument types (or source) from it.
    failed: list[tuple[int, int, Exception]] = []
    each_op = threading.Barrier(THREADS)  # every op starts on all threads at once

    def work(t: int) -> None:
        for i in range(OPS):
            each_op.wait(timeout=JOIN_S)
            a, b, c = inputs(t, i)
            want = expression(np, i, a, b, c)
            try:
                got = np.asarray(expression(clops, i, *(clops.asarray(v, device=device)
                                                         for v in (a, b, c))))
                assert got.shape == want.shape
                np.testing.assert_allclose(got, want, rtol=1e-5)
            except Exception as e:  # noqa: BLE001 - counted below; the thread goes on
                failed.append((t, i, e))

    run_threads(work)
    if failed:
        t, i, e = failed[0]
        raise AssertionError(f"{len(failed)} of {THREADS * OPS} ops failed; thread {t}, op {i}: "
                             f"{e!r}") from e


def _load(shape: tuple[int, ...], dtype: dt.DType) -> ir.Node:
    return ir.load(object(), View.contiguous(shape), dtype)


def _keys() -> list[Any]:
    """Structural keys of several kinds of kernel (flat, strided, casts, row reductions)."""
    cpu, gpu = SimpleNamespace(kind="cpu"), SimpleNamespace(kind="gpu", probe=lambda w: False)
    keys = []
    for shape, dtype in [((63,), dt.float32), ((5, 7), dt.int32), ((3, 4, 5), dt.float64),
                         ((64,), dt.float16)]:
        a, b = _load(shape, dtype), _load(shape, dtype)
        n = ir.ew("add", [ir.ew("multiply", [a, b], dtype), a], dtype)
        n = ir.cast(n, dt.float32)
        item = KernelItem(shape, (), [Output(n, object(), View.contiguous(shape))])
        keys += [lower(item, cpu).key, lower(item, gpu).key]
    for shape in [(16, 128), (4, 6, 32)]:
        x = _load(shape, dt.float32)
        ax = len(shape) - 1
        red = ir.reduce("sum", ir.ew("multiply", [x, x], dt.float32), (ax,))
        root = ir.ew("sqrt", [red], dt.float32)
        out = shape[:-1] + (1,)
        item = KernelItem(shape, (ax,), [Output(root, object(), View.contiguous(out))],
                          reduced_out=True)
        keys += [lower(item, cpu).key, lower(item, gpu).key]
    return keys


def test_one_renderer_renders_for_many_threads():
    # (no device: rendering alone) each thread's sources equal those rendered one at a time
    renderer = CLRenderer()
    keys = _keys()
    want = [CLRenderer().render(k, 64, f"k{j}") for j, k in enumerate(keys)]

    def work(t: int) -> None:
        for r in range(20):
            j = (t + r) % len(keys)
            assert renderer.render(keys[j], 64, f"k{j}") == want[j], (t, j)

    run_threads(work)


def test_render_kernel_gives_each_call_its_argument_types():
    renderer = CLRenderer()
    keys = _keys()
    want = [CLRenderer().render_kernel(k, 64, f"k{j}") for j, k in enumerate(keys)]
    assert all(w.source == CLRenderer().render(k, 64, f"k{j}")
               for j, (k, w) in enumerate(zip(keys, want)))

    def work(t: int) -> None:
        for r in range(20):
            j = (t + r) % len(keys)
            got = renderer.render_kernel(keys[j], 64, f"k{j}")
            assert got.source == want[j].source and got.arg_types == want[j].arg_types, (t, j)

    run_threads(work)


def test_split_reductions_on_threads_own_queues(gpu_path):
    # One-kernel split reductions (the GPU path, forced) count finished work-groups in one
    # buffer per device; threads on queues of their own must not run two such kernels at once.
    n = 200_003
    data = [np.random.default_rng(t).integers(-50, 50, n).astype(np.int32)
            for t in range(THREADS)]
    xs = [clops.asarray(a, device=gpu_path).realize() for a in data]

    def work(t: int) -> None:
        with clops.stream(device=gpu_path):
            for r in range(4):
                y = xs[t] * (r + 1)
                assert int(clops.sum(y)) == int(data[t].astype(np.int64).sum()) * (r + 1), \
                    (t, r)

    run_threads(work)


def test_threads_computing_from_one_pending_tensor(device):
    # The threads' graphs share the nodes of ``w`` (not computed yet): planning one thread's
    # kernels takes ``w``'s nodes as computed for a while, which the others must not see.
    rng = np.random.default_rng(5)
    base = rng.integers(-9, 9, (6, 40)).astype(np.float32)
    wv = np.exp(base * 0.25).sum(axis=0)

    for _ in range(3):
        w = clops.sum(clops.exp(clops.asarray(base, device=device) * 0.25), axis=0)

        def work(t: int, w: Any = w) -> None:
            x = np.arange(40, dtype=np.float32) * (t + 1)
            got = np.asarray(clops.max(w * clops.asarray(x, device=device) - (t + 1)))
            np.testing.assert_allclose(got, (wv * x - (t + 1)).max(), rtol=1e-5,
                                       err_msg=f"thread {t}")

        run_threads(work)
