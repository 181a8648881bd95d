"""clops tensors as Dask chunks: the operations Dask runs on them against numpy, on the threaded
scheduler and on a two-worker distributed cluster of CPU sub-devices, pickling and Dask's
serialization, and a worker killed mid-computation."""

from __future__ import annotations

import os
import pickle
import signal
import time

import numpy as np
import pytest

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import clops  # noqa: E402
import clops.dask  # noqa: E402

A = np.random.default_rng(0).standard_normal((2048, 48)).astype(np.float32)
SCALE = "__kernel void axpb(__global float *y, long yo, __global const float *x, long xo) " \
        "{ size_t i = get_global_id(0); y[yo + i] = 2.0f * x[xo + i] + 1.0f; }"


def _axpb(block):
    if isinstance(block, np.ndarray):  # the numpy reference
        return 2.0 * block + 1.0
    k = clops.kernel(SCALE, "axpb")
    src = block.contiguous()
    out = clops.empty(src.shape, dtype=src.dtype, device=src.device)
    k(src.size, None, out, src).wait()
    return out


OPS = {
    "chain": (lambda x: ((x * 2.0 + 1.0) ** 2 - x).sum(axis=0), 1e-3),
    "sum": (lambda x: x.sum(axis=0), 1e-4),
    "mean": (lambda x: x.mean(), 1e-6),
    "std": (lambda x: x.std(axis=0), 1e-5),
    "max": (lambda x: x.max(axis=1), 0),
    "argmax": (lambda x: x.argmax(axis=0), 0),
    "matmul": (lambda x: x.T @ x, 1e-3),
    "tensordot": (lambda x: da.tensordot(x, x[:, :8], axes=([0], [0])), 1e-3),
    "einsum": (lambda x: da.einsum("ij,ik->jk", x, x[:, :8]), 1e-3),
    "rechunk": (lambda x: x.rechunk((300, 16)).sum(axis=1), 1e-4),
    "slicing": (lambda x: x[100:1900:3, 5:40].max(axis=0), 0),
    "map_blocks_kernel": (lambda x: x.map_blocks(_axpb, dtype=x.dtype).sum(axis=0), 1e-3),
}


def _tensor_chunks():
    return da.from_array(clops.asarray(A), chunks=(512, 48), asarray=False)


def _check(name, got, want):
    tol = OPS[name][1]
    got = np.asarray(got, dtype=np.float64)
    if tol == 0:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("name", list(OPS))
def test_threaded_scheduler_gives_numpys_results_on_the_device(name):
    x = _tensor_chunks()
    assert isinstance(x._meta, clops.Tensor)
    fn = OPS[name][0]
    with dask.config.set(scheduler="threads"):
        got = fn(x).compute()
    want = fn(da.from_array(A, chunks=(512, 48))).compute()
    if name not in ("argmax",):  # (argmax combines (value, index) records on the host)
        assert isinstance(got, clops.Tensor), type(got)
    _check(name, got, want)


def test_tall_skinny_qr_and_svd():
    x = _tensor_chunks()[:, :16]
    with dask.config.set(scheduler="threads"):
        q, r = dask.compute(*da.linalg.tsqr(x))
        s = da.linalg.svd(x)[1].compute()
    assert isinstance(q, clops.Tensor)
    np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), A[:, :16], atol=1e-4)
    np.testing.assert_allclose(np.asarray(q).T @ np.asarray(q), np.eye(16), atol=1e-4)
    np.testing.assert_allclose(np.asarray(s), np.linalg.svd(A[:, :16], compute_uv=False),
                               rtol=1e-4)


def test_da_random_draws_blocks_on_the_device():
    rs = lambda seed: da.random.RandomState(seed, RandomState=clops.random.RandomState)  # noqa: E731
    x = rs(0).standard_normal((40_000, 16), chunks=(5_000, 16))
    assert isinstance(x._meta, clops.Tensor) and x.dtype == np.float32
    with dask.config.set(scheduler="threads"):
        block = x.blocks[3].compute()
        whole = np.asarray(x.compute())
        again = np.asarray(rs(0).standard_normal((40_000, 16), chunks=(5_000, 16)).compute())
        other = np.asarray(rs(1).standard_normal((40_000, 16), chunks=(5_000, 16)).compute())
        u = np.asarray(rs(2).uniform(-2, 3, size=(10_000,), chunks=1_000).compute())
        k = np.asarray(rs(3).randint(5, 9, size=(10_000,), chunks=1_000).compute())
    assert isinstance(block, clops.Tensor) and block.shape == (5_000, 16)
    np.testing.assert_array_equal(np.asarray(block), whole[15_000:20_000])
    np.testing.assert_array_equal(whole, again)  # a seed repeats its array
    assert not np.array_equal(whole, other)
    blocks = whole.reshape(8, 5_000, 16)
    assert all(not np.array_equal(blocks[0], b) for b in blocks[1:])  # each block its own
    assert abs(whole.mean()) < 0.02 and abs(whole.std() - 1) < 0.02
    assert -2 <= u.min() and u.max() < 3 and abs(u.mean() - 0.5) < 0.1
    assert set(np.unique(k)) == {5, 6, 7, 8}


def test_pickle_keeps_values_dtype_shape_and_memory_kind():
    for t in (clops.asarray(A[:5]), clops.asarray(np.arange(7, dtype=np.uint8)),
              clops.asarray(np.array([True, False])), clops.asarray(A[:3], usm_type="host"),
              clops.asarray(np.zeros((0, 3), np.float32))):
        for proto in (4, 5):
            r = pickle.loads(pickle.dumps(t, protocol=proto))
            assert (r.dtype, r.shape, r.usm_type) == (t.dtype, t.shape, t.usm_type)
            np.testing.assert_array_equal(np.asarray(r), np.asarray(t))
    frames: list = []
    data = pickle.dumps(clops.asarray(A), protocol=5, buffer_callback=frames.append)
    assert len(frames) == 1 and len(data) < 200  # the values travel out of band


def test_dask_counts_a_chunks_bytes():
    from dask.sizeof import sizeof

    assert sizeof(clops.asarray(A)) == A.nbytes


def test_a_pending_chunk_is_computed_when_dask_counts_it():
    # A worker measures each result it stores; a pending one (a column sum of a chunk) would
    # hold its whole input's device memory while Dask counted a row of it.
    import gc

    from dask.sizeof import sizeof

    x = clops.asarray(A)
    g = x.sum(axis=0) * 2.0
    del x
    gc.collect()
    assert g._node.resolve().op != "load"
    held = clops.memory_stats()["in_use"]
    assert sizeof(g) == A.shape[1] * 4
    assert g._node.resolve().op == "load"
    gc.collect()
    # the input was let go (the result's own buffer, 256 bytes, came in)
    assert clops.memory_stats()["in_use"] <= held - A.nbytes + 1024
    np.testing.assert_allclose(np.asarray(g), 2 * A.sum(axis=0), rtol=1e-4, atol=1e-3)


def test_a_local_scheduler_computes_each_pending_result():
    # Dask's threaded scheduler measures nothing: a pending chunk (a column sum of a chunk) it
    # keeps for later tasks would hold its whole input until then
    x = da.from_array(A, chunks=(A.shape[0] // 4, A.shape[1]), asarray=False)
    sums = x.map_blocks(lambda b: clops.asarray(b).sum(axis=0, keepdims=True) * 2.0,
                        dtype=A.dtype, chunks=(1, A.shape[1]))
    (kept,) = dask.persist(sums, scheduler="threads", optimize_graph=False)
    chunks = list(kept.__dask_graph__().values())
    assert len(chunks) == 4 and all(isinstance(c, clops.Tensor) for c in chunks)
    assert all(c._node.resolve().op == "load" for c in chunks)
    np.testing.assert_allclose(np.asarray(kept.sum(axis=0).compute(scheduler="threads")),
                               2 * A.sum(axis=0), rtol=1e-4, atol=1e-3)


def test_dask_serialization_is_one_frame():
    from distributed.protocol import deserialize, serialize

    t = clops.asarray(A)
    header, frames = serialize(t, serializers=("dask",))
    assert header["serializer"] == "dask" and len(frames) == 1
    assert memoryview(frames[0]).nbytes == A.nbytes
    r = deserialize(header, frames)
    assert isinstance(r, clops.Tensor)
    np.testing.assert_array_equal(np.asarray(r), A)


def test_one_worker_per_listed_device():
    from clops.dask import device_selectors

    assert device_selectors() == [clops.device().selector]
    # the CPU runtimes OpenCL lists drive the same cores: one worker, on clops' pick
    assert device_selectors("cpu") == [clops.device("cpu").selector]
    assert device_selectors(["opencl:cpu:0", "cpu:0"]) == ["opencl:cpu:0"]
    with pytest.raises(LookupError, match="no OpenCL device"):
        device_selectors("gpu:42")


def test_a_worker_per_gpu_on_a_multi_gpu_host(monkeypatch):
    class FakeGPU:
        def __init__(self, i):
            self.selector = f"opencl:gpu:{i}"
            self.builds = True

        def probe(self, what):
            assert what == "builds"
            return self.builds

    listed = [FakeGPU(i) for i in range(4)]
    asked = []

    def devices(text=None):
        asked.append(text)
        want = [s.strip().removeprefix("opencl:") for s in (text or "").split(",")]
        if want == ["gpu"]:
            return list(listed)
        return [d for d in listed if d.selector.removeprefix("opencl:") in want]

    monkeypatch.setattr(clops, "devices", devices)
    assert clops.dask.device_selectors("gpu") == [f"opencl:gpu:{i}" for i in range(4)]
    assert clops.dask.device_selectors(["gpu:1", "gpu:3"]) == ["opencl:gpu:1", "opencl:gpu:3"]
    specs = clops.dask.worker_specs("gpu", env={"CLOPS_MEMORY_LIMIT": "1GB"})
    assert list(specs) == ["clops-0", "clops-1", "clops-2", "clops-3"]
    opts = [w["options"] for w in specs.values()]
    assert [o["env"]["CLOPS_DEVICE"] for o in opts] == [f"opencl:gpu:{i}" for i in range(4)]
    assert all(o["env"]["CLOPS_MEMORY_LIMIT"] == "1GB" and "CLOPS_DASK_SUBDEVICE" not in o["env"]
               and o["resources"] == {"OPENCL": 1} and o["nthreads"] == 1 for o in opts)
    assert asked[0] == "gpu"
    # a listed device whose runtime cannot build a kernel gets no worker; none left: refused
    listed[2].builds = False
    assert clops.dask.device_selectors("gpu") == ["opencl:gpu:0", "opencl:gpu:1", "opencl:gpu:3"]
    with pytest.raises(LookupError, match="can build a kernel: opencl:gpu:2"):
        clops.dask.device_selectors("gpu:2")


def test_a_split_the_device_cannot_give_is_refused_before_workers_start():
    cu = clops.device("cpu").caps.compute_units
    with pytest.raises(ValueError, match=f"at most {cu} sub-devices"):
        clops.dask.LocalCluster(devices="cpu", split=cu + 1)
    with pytest.raises(ValueError, match="2 or more"):
        clops.dask.LocalCluster(split=1)


def _gpus() -> list:
    try:
        return clops.devices("gpu")
    except LookupError:
        return []


@pytest.mark.skipif(len(_gpus()) < 2, reason="needs a host with two GPUs or more")
def test_a_worker_per_gpu_computes_on_its_own_gpu():
    # the chunks start on the client's default device and reach each worker's GPU through Dask
    gpus = _gpus()
    with clops.dask.LocalCluster(devices="gpu") as c, distributed.Client(c) as client:
        where = client.run(lambda: (os.environ["CLOPS_DEVICE"], clops.device().selector))
        assert len(where) == len(gpus)
        assert sorted(w[0] for w in where.values()) == sorted(d.selector for d in gpus)
        assert all(env == sel for env, sel in where.values())
        for name in ("chain", "matmul", "rechunk", "argmax"):
            fn = OPS[name][0]
            got = client.compute(fn(_tensor_chunks())).result(timeout=120)
            want = fn(da.from_array(A, chunks=(512, 48))).compute(scheduler="threads")
            _check(name, got, want)
        many = da.from_array(clops.asarray(A), chunks=(128, 48), asarray=False)
        got = client.compute(many.sum(axis=0)).result(timeout=120)
        np.testing.assert_allclose(np.asarray(got), A.sum(axis=0), rtol=1e-4, atol=1e-3)
        used = client.run(lambda: clops.memory_stats()["peak"])
        assert all(v > 0 for v in used.values())  # every GPU took chunks of the 16


@pytest.fixture(scope="module")
def cluster():
    # the CPU in two sub-devices (where the default device is a GPU too)
    with clops.dask.LocalCluster(devices="cpu", split=2) as c, distributed.Client(c) as client:
        yield c, client


def test_two_sub_device_workers(cluster):
    c, client = cluster
    devs = client.run(lambda: clops.device().name)
    assert len(devs) == 2
    units = client.run(lambda: clops.device().caps.compute_units)
    assert all(u < clops.device("cpu").caps.compute_units for u in units.values())
    res = client.run(lambda: os.environ["CLOPS_DASK_SUBDEVICE"])
    assert sorted(res.values()) == ["0/2", "1/2"]


@pytest.mark.parametrize("name", ["chain", "std", "matmul", "rechunk", "map_blocks_kernel"])
def test_distributed_gives_numpys_results(cluster, name):
    _, client = cluster
    fn = OPS[name][0]
    got = client.compute(fn(_tensor_chunks())).result(timeout=120)
    want = fn(da.from_array(A, chunks=(512, 48))).compute(scheduler="threads")
    _check(name, got, want)


def test_a_worker_stores_computed_chunks(cluster):
    _, client = cluster

    def lazy() -> object:
        return clops.asarray(A).sum(axis=0) * 2.0  # pending when the task returns

    def stored(dask_worker) -> list:
        return [v._node.resolve().op for v in dask_worker.data.values()
                if isinstance(v, clops.Tensor)]

    fut = client.submit(lazy, pure=False)
    distributed.wait(fut, timeout=60)  # stored, not yet fetched (fetching computes it)
    ops = [op for v in client.run(stored).values() for op in v]
    assert ops and set(ops) == {"load"}
    np.testing.assert_allclose(np.asarray(fut.result(timeout=60)), 2 * A.sum(axis=0),
                               rtol=1e-4, atol=1e-3)
    del fut


def test_a_killed_worker_is_survived(cluster):
    c, client = cluster
    before = client.run(lambda: clops.memory_stats()["in_use"])

    def slow(block):
        time.sleep(0.3)
        return block * 2.0

    x = _tensor_chunks().rechunk((128, 48)).map_blocks(slow, dtype=np.float32).sum(axis=0)
    fut = client.compute(x)
    time.sleep(1.0)
    os.kill(c.workers["clops-0"].process.pid, signal.SIGKILL)  # the worker, not its nanny
    got = fut.result(timeout=180)
    np.testing.assert_allclose(np.asarray(got), 2 * A.sum(axis=0), rtol=1e-4, atol=1e-3)
    del fut, got
    deadline = time.monotonic() + 60
    while len(client.scheduler_info()["workers"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)  # the nanny restarts the killed worker
    # a survivor holds no more device memory than before, once Dask has released the
    # results (it tells workers so asynchronously)
    def leaked() -> dict:
        after = client.run(lambda: clops.memory_stats()["in_use"])
        return {a: (n, before[a]) for a, n in after.items() if a in before and n > before[a]}

    deadline = time.monotonic() + 60
    while leaked() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leaked()
