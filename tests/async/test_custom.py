"""Custom kernels: the argument convention (tensor -> pointer + offset), scalar conversion,
read/write inference from ``const``, wait lists, and the elementwise, reduction and scan
builders against numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest

import clops
from clops.custom import kernel_params, parse_params
from clops.runtime import CLDevice

from ..conftest import Gate

AXPY = """
// y = a x + y
__kernel void axpy(float a, __global const float *x, long xo, __global float *y, int yo) {
    size_t i = get_global_id(0);
    y[yo + i] += a * x[xo + i];
}
"""


def test_parse_params() -> None:
    ps = kernel_params(AXPY, "axpy")
    assert [(p.name, p.type, p.pointer, p.const) for p in ps] == [
        ("a", "float", False, False), ("x", "float", True, True), ("xo", "long", False, False),
        ("y", "float", True, False), ("yo", "int", False, False)]
    ps = parse_params("__global float * const restrict p, const unsigned int n, local int *s")
    assert [(p.type, p.const, p.space) for p in ps] == [
        ("float", False, "global"), ("unsigned int", True, "private"), ("int", False, "local")]


def test_kernel_on_tensor_views(device: CLDevice) -> None:
    k = clops.kernel(AXPY, "axpy")
    xh = np.arange(20, dtype=np.float32)
    x = clops.asarray(xh, device=device)
    y = clops.zeros(20, device=device)
    ev = k(10, None, 2, x[5:15], y[10:])   # offsets 5 and 10 go in as arguments
    assert isinstance(ev, clops.Event)
    want = np.zeros(20, np.float32)
    want[10:] = 2 * xh[5:15]
    np.testing.assert_array_equal(y.to_numpy(), want)


def test_kernel_errors(device: CLDevice) -> None:
    k = clops.kernel(AXPY, "axpy")
    x = clops.ones(4, device=device)
    with pytest.raises(TypeError, match="were not given"):
        k(4, None, 1.0, x)
    with pytest.raises(TypeError, match="no parameter left"):
        k(4, None, 1.0, x, x, 3)
    with pytest.raises(TypeError, match="pointer"):
        k(4, None, 1.0, 2.0, 0, x)
    with pytest.raises(ValueError, match="no kernel named"):
        clops.kernel(AXPY, "nope")
    bad = clops.kernel("__kernel void f(__global float *x, float o) {}", "f")
    with pytest.raises(TypeError, match="integer offset"):
        bad(1, None, x)


FILL = "__kernel void fill(__global float *x, long o, float v) { x[o + get_global_id(0)] = v; }"


def _no_enqueue(device: CLDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on a launch that reaches the device fails the test (an out-of-bounds one
    could crash it)."""
    def launch(*a: object, **k: object) -> None:
        raise AssertionError("the kernel was enqueued")
    monkeypatch.setattr(type(device), "launch", launch)


def test_declared_extent_refuses_before_enqueueing(device: CLDevice,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A global size past a declared argument's end is refused by name, not enqueued (Intel's
    CPU runtime takes the process down)."""
    k = clops.kernel(FILL, "fill", per_work_item={"x": 1})
    x = clops.zeros(8, device=device).realize()
    _no_enqueue(device, monkeypatch)
    cases = [((9,), x, "a Tensor of 8 elements", "(9,)", 8),
             ((5,), x[4:], "a Tensor of 4 elements", "(5,)", 4),
             ((3, 3), x, "a Tensor of 8 elements", "(3, 3)", 8),
             ((9,), device.alloc(32), "a buffer of 32 bytes, 8 floats", "(9,)", 8),
             ((1,), None, "a null pointer", "(1,)", 0)]
    for gsize, arg, size, shown, most in cases:
        args = (arg, 2.0) if isinstance(arg, clops.Tensor) else (arg, 0, 2.0)
        with pytest.raises(ValueError) as info:
            k(gsize, None, *args)
        msg = str(info.value)
        assert f"fill: argument x is {size}" in msg and f"global size {shown}" in msg, msg
        assert f"at most {most} work-items" in msg, msg
    # declared per launch: 3 elements a work-item
    plain = clops.kernel(FILL, "fill")
    with pytest.raises(ValueError, match=r"global size \(3,\) \(3 work-items, 3 elements each"):
        plain(3, None, x, 2.0, per_work_item={"x": 3})


def test_declared_extent_in_bounds_runs(device: CLDevice) -> None:
    k = clops.kernel(FILL, "fill", per_work_item={"x": 1})
    x = clops.zeros(8, device=device)
    k(4, None, x[4:], 2.0).wait()
    np.testing.assert_array_equal(x.to_numpy(), [0, 0, 0, 0, 2, 2, 2, 2])


@pytest.mark.parametrize("declared, words", [
    ({"v": 1}, "'v', which is not a __global pointer parameter of the kernel (['x'])"),
    ({"y": 1}, "'y', which is not a __global pointer"),
    ({"x": 0}, "expected a whole number >= 1"),
    ({"x": 1.5}, "expected a whole number >= 1"),
])
def test_bad_extent_declaration(declared: dict, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        clops.kernel(FILL, "fill", per_work_item=declared)


def test_kernel_waits_and_tracks(device: CLDevice, gate: Gate) -> None:
    k = clops.kernel(AXPY, "axpy")
    x = clops.ones(64, device=device).realize()
    y = clops.zeros(64, device=device).realize()
    ev = k(64, None, 3.0, x, y, wait_for=[gate.event])
    z = (y + 1).realize()            # generated kernel after the custom one (y is written)
    fut = clops.to_host_future(z)
    assert not ev.done and not fut.done()
    gate.open()
    np.testing.assert_array_equal(fut.result(timeout=30), np.full(64, 4, np.float32))


def test_write_flushes_lazy_readers(device: CLDevice) -> None:
    k = clops.kernel(AXPY, "axpy")
    x = clops.ones(8, device=device).realize()
    y = clops.zeros(8, device=device).realize()
    lazy = y * 10                       # not computed yet; reads y's old contents
    k(8, None, 1.0, x, y)
    np.testing.assert_array_equal(lazy.to_numpy(), np.zeros(8, np.float32))
    np.testing.assert_array_equal(y.to_numpy(), np.ones(8, np.float32))


def test_reads_writes_override(device: CLDevice, gate: Gate) -> None:
    src = ("__kernel void cp(__global float *a, long ao, __global float *b, long bo)"
           "{ size_t i = get_global_id(0); b[bo + i] = a[ao + i]; }")
    k = clops.kernel(src, "cp")
    a = clops.ones(16, device=device).realize()
    b = clops.zeros(16, device=device).realize()
    k(16, None, a, b, writes=[b], wait_for=[gate.event])
    assert a.buffer.last_write is None or a.buffer.last_write[0] is not b.buffer.last_write[0]
    assert len(a.buffer.reads) == 1     # a counted as read only
    gate.open()
    np.testing.assert_array_equal(b.to_numpy(), np.ones(16, np.float32))


def test_local_memory_and_include(device: CLDevice) -> None:
    src = """
#include "clops/philox.cl"
__kernel void bits(__global uint *out, long o, __local uint *tmp) {
    size_t i = get_global_id(0);
    tmp[get_local_id(0)] = philox4x32_10((uint4)(i, 0, 0, 0), (uint2)(7, 0)).x;
    barrier(CLK_LOCAL_MEM_FENCE);
    out[o + i] = tmp[get_local_id(0)];
}"""
    k = clops.kernel(src, "bits")
    out = clops.empty(8, dtype=clops.uint32, device=device)
    k(8, 4, out, clops.local_memory(16))
    ctr = np.zeros((8, 4), np.uint32)
    ctr[:, 0] = np.arange(8)
    want = clops.random.philox4x32_10(ctr, (7, 0))[:, 0]
    np.testing.assert_array_equal(out.to_numpy(), want)


def test_elementwise_kernel(device: CLDevice) -> None:
    lin = clops.ElementwiseKernel("float a, __global const float *x, __global float *y",
                                  "y[i] = a * x[i] + y[i]", "axpy_ew")
    xh = np.random.default_rng(0).standard_normal(1001).astype(np.float32)
    x = clops.asarray(xh, device=device)
    y = clops.ones(1001, device=device)
    lin(2.0, x, y)
    np.testing.assert_allclose(y.to_numpy(), 2 * xh + 1, rtol=1e-6)
    xs = clops.asarray(np.arange(10, dtype=np.float32), device=device)[::2]  # strided read
    y2 = clops.zeros(5, device=device)
    lin(1.0, xs, y2)
    np.testing.assert_array_equal(y2.to_numpy(), np.arange(0, 10, 2, dtype=np.float32))
    with pytest.raises(TypeError, match="takes 3 arguments"):
        lin(1.0, x)


@pytest.mark.parametrize("n", [1, 7, 1000, 100_003])
def test_reduction_kernel(device: CLDevice, n: int) -> None:
    rng = np.random.default_rng(n)
    xh = rng.standard_normal(n).astype(np.float32)
    yh = rng.standard_normal(n).astype(np.float32)
    dot = clops.ReductionKernel(np.float32, "0", "a + b", "x[i] * y[i]",
                                "__global const float *x, __global const float *y", name="dot")
    x, y = clops.asarray(xh, device=device), clops.asarray(yh, device=device)
    r = dot(x, y)
    assert r.shape == () and r.dtype == clops.float32
    assert float(r) == pytest.approx(float(np.dot(xh.astype(np.float64), yh)), rel=1e-4,
                                     abs=1e-3)
    mx = clops.ReductionKernel("int", "INT_MIN", "max(a, b)", "v[i]", "__global const int *v",
                               name="imax")
    vh = rng.integers(-1000, 1000, n).astype(np.int32)
    assert int(mx(clops.asarray(vh, device=device))) == vh.max()


@pytest.mark.parametrize("n", [1, 5, 4097])
def test_scan_kernel(device: CLDevice, n: int) -> None:
    vh = np.random.default_rng(n).integers(0, 10, n).astype(np.int32)
    cumsum = clops.ScanKernel("int", "__global const int *x, __global int *y, __global int *z",
                              "x[i]", "a + b", "y[i] = item; z[i] = prev_item", "0")
    x = clops.asarray(vh, device=device)
    y = clops.empty(n, dtype=clops.int32, device=device)
    z = clops.empty(n, dtype=clops.int32, device=device)
    ev = cumsum(x, y, z)
    ev.wait()
    np.testing.assert_array_equal(y.to_numpy(), np.cumsum(vh))
    np.testing.assert_array_equal(z.to_numpy(), np.cumsum(vh) - vh)
    cmax = clops.ScanKernel(np.float32, "__global const float *x, __global float *y", "x[i]",
                            "fmax(a, b)", "y[i] = item", "-INFINITY", name="cummax")
    fh = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    yf = clops.empty(n, device=device)
    cmax(clops.asarray(fh, device=device), yf)
    np.testing.assert_array_equal(yf.to_numpy(), np.maximum.accumulate(fh))


def test_mixed_devices_error(device: CLDevice) -> None:
    if device.partition_support()["max_sub_devices"] < 2:
        pytest.skip("needs sub-devices")
    a, b = device.create_sub_devices(2)
    k = clops.kernel(AXPY, "axpy")
    with pytest.raises(ValueError, match="different devices"):
        k(4, None, 1.0, clops.ones(4, device=a), clops.ones(4, device=b))


def test_include_lines() -> None:
    """An include line may end in a comment; clops' internal headers (PTX helpers) are for its
    own kernels, not user sources."""
    from clops.kernels.launch import expand_includes

    assert "philox" in expand_includes('#include "clops/philox.cl"  // the generator\n')
    assert "shfl_xor" in expand_includes('#include "clops/ptx.cl"\n', internal=True)
    with pytest.raises(FileNotFoundError, match="clops has no ptx.cl"):
        expand_includes('#include "clops/ptx.cl"\n')
