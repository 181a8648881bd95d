"""A result that nothing else holds, read to the host by ``np.asarray``, ``Tensor.get`` or
``clops.asnumpy`` on a device that shares the host's memory, is not copied: a pending one is
computed into memory the host array then owns, a computed one whose buffer nothing else refers
to hands that buffer over. The values are numpy's, the array is the caller's alone (writing it
changes no tensor, no later result), and a tensor, buffer or node still held elsewhere is
copied as before."""

from __future__ import annotations

import numpy as np
import pytest

import clops
from clops.array import tensor as T

N = 1 << 17  # 128 KiB of uint8: past DIRECT_MIN

READS = ["asarray", "get", "asnumpy"]


def _spy(monkeypatch, name: str) -> list[int]:
    served: list[int] = []
    orig = getattr(T, name)

    def spy(t):
        host = orig(t)
        if host is not None:
            served.append(1)
        return host

    monkeypatch.setattr(T, name, spy)
    return served


@pytest.fixture
def direct(monkeypatch):
    """The reads of pending tensors served without a copy."""
    return _spy(monkeypatch, "_compute_to_host")


@pytest.fixture
def handed(monkeypatch):
    """The reads of computed tensors whose buffer was handed over."""
    return _spy(monkeypatch, "_hand_over")


def _pair(device, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(N) * 50).astype(dtype)
    y = (rng.standard_normal(N) * 50).astype(dtype)
    return x, y, clops.asarray(x, device=device), clops.asarray(y, device=device)


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16, np.uint8, np.int64])
def test_a_temporary_result_equals_numpys(device, direct, read, dtype):
    x, y, a, b = _pair(device, dtype)
    # (written out: a helper's argument would hold the tensor)
    host = np.asarray(a + b) if read == "asarray" else (a + b).get() if read == "get" else \
        clops.asnumpy(a + b)
    np.testing.assert_array_equal(host, x + y)
    assert host.dtype == (x + y).dtype and host.flags.writeable and host.flags.c_contiguous
    assert len(direct) == (1 if device.caps.unified_memory else 0)


@pytest.mark.parametrize("read", READS)
def test_writing_the_array_changes_no_tensor(device, direct, read):
    x, y, a, b = _pair(device)
    s = a + b            # held: copied, stays computed
    z = s * 3            # pending, reads s's node
    w = s.reshape((N // 8, 8))
    # a temporary over s's node
    host = np.asarray(s.reshape((N // 2, 2)) - 0) if read == "asarray" else \
        (s.reshape((N // 2, 2)) - 0).get() if read == "get" else \
        clops.asnumpy(s.reshape((N // 2, 2)) - 0)
    host[...] = 999.0
    assert len(direct) == (1 if device.caps.unified_memory else 0)
    np.testing.assert_array_equal(z.get(), (x + y) * 3)
    np.testing.assert_array_equal(np.asarray(w), (x + y).reshape((N // 8, 8)))
    host2 = np.asarray(s + 1) if read == "asarray" else (s + 1).get() if read == "get" else \
        clops.asnumpy(s + 1)
    np.testing.assert_array_equal(host2, x + y + 1)
    host2[:] = -1
    np.testing.assert_array_equal(np.asarray(s), x + y)
    np.testing.assert_array_equal(host, 999.0)  # the first array is still its own


def test_a_held_tensor_is_copied_and_stays_computed(device, direct):
    x, y, a, b = _pair(device)
    c = a + b
    host = np.asarray(c)
    host[:] = 0
    assert not direct
    np.testing.assert_array_equal(c.get(), x + y)
    assert c._node.op == "load"  # computed once, kept


def test_two_arrays_of_one_expression_are_distinct(device):
    x, y, a, b = _pair(device)
    h1 = np.asarray(a * b)
    h2 = np.asarray(a * b)
    h1[:] = 0
    np.testing.assert_array_equal(h2, x * y)


def test_results_after_in_place_writes_of_the_inputs(device, direct):
    x, y, a, b = _pair(device)
    h = np.asarray(a + b)
    a[...] = clops.asarray(y, device=device)
    np.testing.assert_array_equal(h, x + y)
    np.testing.assert_array_equal(np.asarray(a + b), y + y)


def test_orders_and_reductions(device, direct):
    x, y, a, b = _pair(device)
    m = (a + b).reshape((256, N // 256))
    held = m.get(order="F")  # held (m): the copy path
    assert held.flags.f_contiguous and not direct
    f = ((a + b).reshape((256, N // 256))).get(order="F")
    assert f.flags.f_contiguous
    np.testing.assert_array_equal(f, (x + y).reshape((256, N // 256)))
    np.testing.assert_array_equal(held, f)
    assert len(direct) == (1 if device.caps.unified_memory else 0)
    s = np.asarray(clops.sum((a * b).reshape((N // 64, 64, 1)) * 2, axis=2))
    np.testing.assert_array_equal(s, (x * y).reshape((N // 64, 64)) * 2)


def test_a_capture_refuses_the_read(device):
    x, y, a, b = _pair(device)
    with pytest.raises(clops.JitError, match="read of a tensor to the host"):
        with clops.launches(capture=True):
            np.asarray(a + b)
    np.testing.assert_array_equal(np.asarray(a + b), x + y)


@pytest.mark.parametrize("read", READS)
def test_a_computed_temporary_hands_its_buffer_over(device, handed, read):
    x, y, a, b = _pair(device)
    want = np.concatenate([x, y])
    host = np.asarray(clops.concat([a, b])) if read == "asarray" else \
        clops.concat([a, b]).get() if read == "get" else clops.asnumpy(clops.concat([a, b]))
    np.testing.assert_array_equal(host, want)
    assert host.flags.writeable and host.flags.c_contiguous
    assert len(handed) == (1 if device.caps.unified_memory else 0)
    host[:] = 7  # its own memory now: a later result does not see it
    np.testing.assert_array_equal(np.asarray(clops.concat([a, b])), want)


def test_shared_buffers_and_nodes_are_copied(device, handed):
    x, y, a, b = _pair(device)
    # a view of a held tensor (the buffer has two nodes)
    v = np.asarray(a.reshape((N // 4, 4)))
    v[...] = 0
    np.testing.assert_array_equal(a.get(), x)
    # a node that pending work reads
    later = []

    def made():
        c = clops.concat([a, b])
        later.append(c * 2)
        return c

    h = np.asarray(made())
    h[...] = 0
    np.testing.assert_array_equal(later[0].get(), np.concatenate([x, y]) * 2)
    # a buffer held by the caller
    held = []

    def made_held():
        c = clops.concat([a, b])
        held.append(c.buffer)
        return c

    h = np.asarray(made_held())
    h[...] = 0
    back = np.empty(2 * N, np.float32)
    device.read(back, held[0])
    np.testing.assert_array_equal(back, np.concatenate([x, y]))
    assert not handed


def test_moved_views_of_pending_results(device, direct):
    rng = np.random.default_rng(1)
    x = rng.random((256, 512), dtype=np.float32)
    y = rng.random((256, 512), dtype=np.float32)
    a, b = clops.asarray(x, device=device), clops.asarray(y, device=device)
    got = [np.asarray((a + b).reshape((512, 256))), np.asarray((a + b).T),
           np.asarray((a * b)[::2, 1::3]),
           np.asarray(clops.broadcast_to(a[0] + b[0], (256, 512))),
           np.asarray(clops.expand_dims(a + b, axis=0)), np.asarray(clops.flip(a - b, axis=1))]
    want = [(x + y).reshape(512, 256), (x + y).T, (x * y)[::2, 1::3],
            np.broadcast_to(x[0] + y[0], (256, 512)), (x + y)[None], np.flip(x - y, 1)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
        assert g.flags.c_contiguous and g.flags.writeable
    assert len(direct) == (len(want) if device.caps.unified_memory else 0)


def test_reshaped_reductions_launch_one_kernel(device, direct):
    # a reduction's result without its reduced axes (a reshape of the reduce node) is
    # computed straight into the host array's memory, not into a buffer and then copied
    rng = np.random.default_rng(4)
    a = rng.standard_normal((32, 1024, 16)).astype(np.float32)  # results of 128 KiB and more
    a[3, 5, :] = np.nan
    x = clops.asarray(a, device=device).realize()
    cases = [(clops.max, np.max, 2), (clops.min, np.min, -1), (clops.argmax, np.argmax, 2),
             (clops.sum, np.sum, 2), (clops.mean, np.mean, 2)]
    for fn, ref, axis in cases:
        with clops.launches(profile=True) as scope:
            host = np.asarray(fn(x, axis=axis))
        names = [k.name for k in scope.profiler.kernels()]
        assert len(names) == 1 and "k_copy" not in names, names
        np.testing.assert_allclose(host, ref(a, axis=axis), rtol=1e-5, atol=1e-5)
    assert len(direct) == (len(cases) if device.caps.unified_memory else 0)
    s = np.asarray(clops.sum(x.reshape((32, 1024, 4, 4)), axis=(2, 3)))  # several axes
    np.testing.assert_allclose(s, a.sum(axis=2), rtol=1e-5, atol=1e-5)
    y = clops.zeros((32, 1024), device=device)
    y[...] = clops.max(x, axis=2)  # into a tensor's memory: one kernel too
    np.testing.assert_array_equal(np.asarray(y), a.max(axis=2))
