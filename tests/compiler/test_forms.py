"""The schedule cache: a graph of a form that ran before reruns its recorded launches with its own
buffers and constants, and gives what a new schedule gives (numpy's values)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clops
from clops.compiler import form, realize


def _hits() -> int:
    return realize.FORMS.hits


def test_a_graph_of_a_known_form_reruns_with_its_own_buffers(device: clops.CLDevice) -> None:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((64, 48)).astype(np.float32) for _ in range(2))
    c, d = (rng.standard_normal((64, 48)).astype(np.float32) for _ in range(2))
    x, y = clops.asarray(a, device=device), clops.asarray(b, device=device)
    np.testing.assert_allclose(np.asarray(clops.sum(x * y + 1.5, axis=1)),
                               (a * b + 1.5).sum(axis=1), rtol=1e-5, atol=1e-4)
    before = _hits()
    u, v = clops.asarray(c, device=device), clops.asarray(d, device=device)
    got = np.asarray(clops.sum(u * v + 1.5, axis=1))
    assert _hits() == before + 1
    np.testing.assert_allclose(got, (c * d + 1.5).sum(axis=1), rtol=1e-5, atol=1e-4)


def test_constants_are_the_new_graphs(device: clops.CLDevice) -> None:
    a = np.linspace(-3, 3, 1000, dtype=np.float32)
    x = clops.asarray(a, device=device)
    for lo, hi in [(-1.0, 1.0), (-2.0, 0.5), (0.0, -0.0), (-0.0, 2.5)]:
        got = np.asarray(clops.clip(x, lo, hi) * hi + lo)
        want = np.clip(a, np.float32(lo), np.float32(hi)) * np.float32(hi) + np.float32(lo)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_one_constant_object_in_two_nodes_is_kept_by_its_value(device: clops.CLDevice) -> None:
    """Two constant nodes holding one object cannot be told apart in the kernel's arguments:
    the cached schedule is reused only for the same value (here -0.0 against 0.0 too)."""
    a = np.linspace(-2, 2, 512, dtype=np.float32)
    x = clops.asarray(a, device=device)
    for value in (0.0, -0.0, 0.0, 3.0, 3.0):
        got = np.asarray(x * value + value)
        want = a * np.float32(value) + np.float32(value)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_repeated_buffers_are_part_of_the_form(device: clops.CLDevice) -> None:
    a = np.arange(1000, dtype=np.float32)
    b = a[::-1].copy()
    x, y = clops.asarray(a, device=device), clops.asarray(b, device=device)
    np.testing.assert_array_equal(np.asarray(x + x), a + a)
    np.testing.assert_array_equal(np.asarray(x + y), a + b)
    np.testing.assert_array_equal(np.asarray(y + y), b + b)
    np.testing.assert_array_equal(np.asarray(y + x), b + a)


def test_views_are_part_of_the_form(device: clops.CLDevice) -> None:
    a = np.arange(4096, dtype=np.float32).reshape(64, 64)
    x = clops.asarray(a, device=device)
    for sl in [np.s_[1:, :], np.s_[:-1, 1:], np.s_[::2, ::3], np.s_[3:40:5, 7:]]:
        np.testing.assert_array_equal(np.asarray(clops.sum(x[sl], axis=0)),
                                      a[sl].sum(axis=0))
        np.testing.assert_array_equal(np.asarray(x[sl] * 2.0), a[sl] * 2)
    np.testing.assert_array_equal(np.asarray(clops.permute_dims(x, (1, 0)) + 1.0), a.T + 1)


def test_in_place_updates_rerun(device: clops.CLDevice) -> None:
    a = np.arange(100, dtype=np.float32)
    x = clops.asarray(a, device=device)
    want = a.copy()
    for k in range(5):
        x += float(k)
        want += np.float32(k)
        np.testing.assert_array_equal(np.asarray(x), want)


def test_split_reductions_rerun(device: clops.CLDevice) -> None:
    """Few long rows: a two-stage (or one-kernel, counted) split reduction, whose partials and
    counter are the schedule's temporaries."""
    rng = np.random.default_rng(1)
    for _ in range(3):
        a = rng.standard_normal(1 << 18).astype(np.float32)
        x = clops.asarray(a, device=device)
        assert abs(float(clops.sum(x)) - float(a.astype(np.float64).sum())) < 1e-2
        assert float(clops.max(x)) == a.max()
        b = a.reshape(2, -1)
        y = clops.asarray(b, device=device)
        np.testing.assert_allclose(np.asarray(clops.sum(y, axis=1)),
                                   b.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-2)


def test_threads_rerun_one_form(device: clops.CLDevice) -> None:
    rng = np.random.default_rng(2)
    data = [rng.standard_normal((32, 40)).astype(np.float32) for _ in range(8)]
    errors: list[BaseException] = []

    def work(a: np.ndarray) -> None:
        try:
            x = clops.asarray(a, device=device)
            for _ in range(10):
                got = np.asarray(clops.sum(clops.exp(x) * 0.5, axis=0))
                np.testing.assert_allclose(got, (np.exp(a) * 0.5).sum(axis=0), rtol=1e-5)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(a,)) for a in data]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_device_taken_for_a_gpu_is_another_form(device: clops.CLDevice,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.arange(3000, dtype=np.float32).reshape(3, 1000)
    x = clops.asarray(a, device=device)
    np.testing.assert_array_equal(np.asarray(clops.sum(x, axis=1)), a.sum(axis=1))
    kept = len(realize.FORMS)
    monkeypatch.setattr(device, "kind", "gpu" if device.kind == "cpu" else "cpu")
    realize._KERNELS.clear()
    np.testing.assert_array_equal(np.asarray(clops.sum(x, axis=1)), a.sum(axis=1))
    assert len(realize.FORMS) == kept + 1
    monkeypatch.undo()
    realize._KERNELS.clear()


def test_forms_leave_values_out() -> None:
    x = clops.asarray(np.ones(10, np.float32))
    y = clops.asarray(np.ones(10, np.float32))
    f1 = form.form_of([((x * 2.0 + y)._node, None, None)])
    f2 = form.form_of([((y * 7.0 + x)._node, None, None)])
    f3 = form.form_of([((x * 2.0 + x)._node, None, None)])
    assert f1 is not None and f2 is not None and f3 is not None
    assert f1.key == f2.key
    assert f1.key != f3.key  # one buffer read twice
    assert [c.arg for c in f2.consts] == [7.0]


def test_the_cache_keeps_its_bound(device: clops.CLDevice, monkeypatch: pytest.MonkeyPatch
                                   ) -> None:
    monkeypatch.setattr(form, "MAX_FORMS", 4)
    x = clops.asarray(np.ones((8, 8), np.float32), device=device)
    for n in range(1, 8):
        np.testing.assert_array_equal(np.asarray(x[:n] + 1.0), np.full((n, 8), 2, np.float32))
    assert len(realize.FORMS) == 4


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       axis=st.integers(-1, 2), step=st.integers(1, 3), c=st.floats(-4, 4, width=32),
       seed=st.integers(0, 2**16))
def test_reruns_equal_numpy(shape: list[int], axis: int, step: int, c: float,
                            seed: int) -> None:
    """The same form three times over new data and constants: each time numpy's values."""
    ax = None if axis < 0 or axis >= len(shape) else axis
    rng = np.random.default_rng(seed)
    full = [n * step for n in shape]
    for k in range(3):
        a = rng.standard_normal(full).astype(np.float32)
        b = rng.standard_normal(shape).astype(np.float32)
        sl = tuple(slice(None, None, step) for _ in shape)
        x, y = clops.asarray(a), clops.asarray(b)
        cc = np.float32(c + k)
        got = np.asarray(clops.sum(x[sl] * y - float(cc), axis=ax))
        want = (a[sl] * b - cc).sum(axis=ax, dtype=np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
