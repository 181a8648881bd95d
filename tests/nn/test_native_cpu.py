"""The native CPU products (``kernels/native_cpu.c``: quantized weights in the CPU layout meet
int8 rows of x through AVX-512 VNNI or AVX2) against numpy: called on host arrays wherever the
library builds for this machine, and through a CPU device's queue where the device runs them."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from clops.kernels import attention, matmul, native_cpu
from clops.nn.quant import (
    DeviceWeight,
    PackedWeight,
    concat,
    interleave_rows,
    interleave_split,
    pack_float,
    q4_symmetric,
)
from clops.runtime import nativekernel
from clops.runtime.plan import LaunchPlan

from .test_cpu_layout import _packed, _up

RNG = np.random.default_rng(5)
KINDS = ["Q4_0", "Q4_1", "Q4_K", "Q8_0", "Q6_K"]


@pytest.fixture(scope="module")
def lib():
    got = native_cpu.library()
    if got is None:
        pytest.skip("the native CPU products do not build here (no C compiler, not x86-64 "
                    "Linux, or a CPU with neither AVX2 nor AVX-512 VNNI)")
    return got


def _exact_rows(m: int, k: int) -> np.ndarray:
    """Rows whose int8 quantization is exact: whole numbers, each 32-value block's largest
    magnitude 127."""
    x = RNG.integers(-127, 128, (m, k)).astype(np.float32)
    x[:, ::32] = np.where(RNG.random((m, k // 32)) < 0.5, -127.0, 127.0)
    return x


def _host(lib, p, x, *, accum=None, bias=None, norm=None, glu=False, threads=2, split=False):
    """y of the native product on host arrays (the entry the queue calls, called directly);
    ``split``: a K-quant's scales as its file holds them (``interleave_split``)."""
    sym = q4_symmetric(p)
    data, scales = interleave_rows(p, sym)
    if split:
        scales = interleave_split(p)
        assert scales is not None
    m, k = x.shape
    n_out = p.n // 2 if glu else p.n
    y = np.zeros((m, n_out), np.float32) if accum is None else accum.copy()
    keep = [data, scales, x, y] + [a for a in (bias, norm and norm[0]) if a is not None]
    a = native_cpu._Args(
        y=y.ctypes.data, x=x.ctypes.data, w=data.ctypes.data,
        s=scales.ctypes.data if scales is not None else None,
        bias=bias.ctypes.data if bias is not None else None,
        nw=norm[0].ctypes.data if norm else None, y_off=0, ldy=n_out, x_off=0, ldx=k, m=m,
        n=p.n, k=k, fmt={"f16": 1, "q4": 3, "q8": 4}[p.fmt], scale_half=int(p.scale_half),
        q4_sym=int(sym), qgroup=p.group, accum=int(accum is not None), glu=int(glu),
        has_bias=int(bias is not None), norm=int(norm is not None), threads=threads,
        eps=norm[1] if norm else 0.0, ksplit=int(split))
    lib.clops_native_matmul(ctypes.byref(a))
    del keep
    return y


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 2, 3, 7, 13, 17])
def test_exact_rows_give_the_exact_sums(lib, kind, m):
    # 40 columns: two blocks of 16 and a block cut short; k past one run of cached groups
    # (q4: 64 groups, q8: 32)
    p, ref = _packed(kind, 40, 2304 if kind.startswith("Q4") else 1280)
    x = _exact_rows(m, p.k)
    want = x.astype(np.float64) @ ref.T
    np.testing.assert_allclose(_host(lib, p, x), want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("kind", KINDS)
def test_bias_accumulation_norm_and_glu(lib, kind):
    m, n, k = 5, 64, 512
    p, ref = _packed(kind, n, k)
    x = RNG.standard_normal((m, p.k)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    y0 = RNG.standard_normal((m, n)).astype(np.float32)
    nw = (RNG.random(p.k) + 0.5).astype(np.float32)
    xd = x.astype(np.float64)
    xn = xd / np.sqrt((xd ** 2).mean(1, keepdims=True) + 1e-5) * nw
    lin = xd @ ref.T + bias
    cases = [
        (dict(bias=bias), lin),
        (dict(accum=y0), xd @ ref.T + y0),
        (dict(norm=(nw, 1e-5)), xn @ ref.T),
    ]
    for kw, want in cases:
        got = _host(lib, p, x, **kw)
        # int8 rows: about 1/254 of each block's largest value per value
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 2e-2, (list(kw), err)
    # the GLU of the same sums (the int8 rows' error, squared by the GLU, is the case above's)
    s = _host(lib, p, x, bias=bias).astype(np.float64)
    h = n // 2
    with np.errstate(over="ignore"):  # silu of large negative sums: 0
        glu = s[:, :h] / (1 + np.exp(-s[:, :h])) * s[:, h:]
    np.testing.assert_allclose(_host(lib, p, x, glu=True, bias=bias), glu, rtol=1e-5,
                               atol=1e-6 * np.abs(glu).max())


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("m", [1, 3, 6, 13])
def test_k_quant_scales_as_the_file_holds_them_give_the_same_sums(lib, kind, m):
    # the scales as halves per 256 values times bytes per group (quant.Split) against the
    # float scales: the same values, so the same sums bit for bit; 40 columns (a block cut
    # short: zero rows), k past one run of cached groups, with bias, norm, accumulation and the
    # GLU; a fused pair of weights (concat) keeps its parts' split
    p, ref = _packed(kind, 40, 2304 if kind == "Q4_K" else 1280)
    assert p.split is not None
    xs = [_exact_rows(m, p.k), RNG.standard_normal((m, p.k)).astype(np.float32)]
    bias = RNG.standard_normal(p.n).astype(np.float32)
    nw = (RNG.random(p.k) + 0.5).astype(np.float32)
    y0 = RNG.standard_normal((m, p.n)).astype(np.float32)
    for x in xs:
        for kw in (dict(), dict(bias=bias), dict(norm=(nw, 1e-5)), dict(accum=y0)):
            want = _host(lib, p, x, **kw)
            assert np.array_equal(_host(lib, p, x, split=True, **kw), want), list(kw)
    np.testing.assert_allclose(_host(lib, p, xs[0], split=True), xs[0].astype(np.float64) @ ref.T,
                               rtol=1e-5, atol=1e-5 * np.abs(xs[0] @ ref.T).max())
    q, _ = _packed(kind, 48, p.k)
    pair = concat([q, q])
    assert pair is not None and pair.split is not None
    x = xs[1]
    assert np.array_equal(_host(lib, pair, x, glu=True, split=True), _host(lib, pair, x, glu=True))


def test_k_quant_split_scales_are_the_float_scales():
    # scale = sup * sub and min = -(sup * sub) in float32: the packer's float scales exactly
    for kind in ("Q4_K", "Q6_K"):
        p, _ = _packed(kind, 24, 512)
        sp = p.split
        assert sp is not None and p.scales is not None
        sup = np.repeat(sp.sup.astype(np.float32), 256 // p.group, axis=1)
        got = sup * sp.sub.astype(np.float32)
        if kind == "Q4_K":
            got[..., 1] = -got[..., 1]
            assert np.array_equal(got.view(np.uint32), p.scales.view(np.uint32))
        else:
            assert np.array_equal(got[..., 0], p.scales)


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
def test_a_rows_sums_do_not_depend_on_the_other_rows(lib, kind):
    p, _ = _packed(kind, 48, 256)
    x = RNG.standard_normal((13, p.k)).astype(np.float32)
    batch = _host(lib, p, x)
    for i in (0, 5, 12):
        assert np.array_equal(_host(lib, p, x[i:i + 1].copy())[0], batch[i])


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 13])
def test_float16_weights_meet_float_rows(lib, m):
    # products of float16 weights (native_cpu.takes_float) against float64: up to 4 rows (a
    # decode step) a row at a time, more in tiles of rows (5: a tile of 4 and one row; 13: tiles
    # of 6 (AVX2) or 8 (AVX-512), then of 4, 2 and 1 as they fit); 72 columns (four blocks of
    # 16 in pairs and one cut short alone) with bias, accumulation and norm; the GLU of 2 x 48
    # columns; a row's sums whatever the other rows (alone, for a decode step's rows; in the
    # rows reversed, in another place of the tiles, for more); k: the tiles' runs of 2048 and 32
    k = 2080
    x = RNG.standard_normal((m, k)).astype(np.float32)
    xd = x.astype(np.float64)
    nw = (RNG.random(k) + 0.5).astype(np.float32)
    xn = xd / np.sqrt((xd ** 2).mean(1, keepdims=True) + 1e-5) * nw
    for n in (72, 96):
        p = pack_float(RNG.standard_normal((n, k)).astype(np.float32), "f16")
        ref = p.dequantize().astype(np.float64)
        bias = RNG.standard_normal(n).astype(np.float32)
        y0 = RNG.standard_normal((m, n)).astype(np.float32)
        lin = xd @ ref.T + bias
        if n == 72:
            cases = [(dict(), xd @ ref.T), (dict(bias=bias), lin),
                     (dict(accum=y0), xd @ ref.T + y0), (dict(norm=(nw, 1e-5)), xn @ ref.T)]
        else:
            h = n // 2
            cases = [(dict(glu=True, bias=bias),
                      lin[:, :h] / (1 + np.exp(-lin[:, :h])) * lin[:, h:])]
        for kw, want in cases:
            got = _host(lib, p, x, **kw)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max(),
                                       err_msg=str(list(kw)))
            if m > 4:
                rev = {a: (b[::-1].copy() if a == "accum" else b) for a, b in kw.items()}
                assert np.array_equal(_host(lib, p, x[::-1].copy(), **rev)[::-1], got)
                continue
            for i in range(m):
                one = {a: (b[i:i + 1].copy() if a == "accum" else b) for a, b in kw.items()}
                assert np.array_equal(_host(lib, p, x[i:i + 1].copy(), **one)[0], got[i])


def _queue_device(device):
    if not native_cpu.available(device):
        pytest.skip(f"{device.name} does not run the native products (runtimes "
                    f"{native_cpu.RUNTIMES}, a C compiler and AVX2 or AVX-512 VNNI)")
    return device


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_through_the_queue_in_a_plan_resized_to_other_rows(device, kind):
    dev = _queue_device(device)
    p, ref = _packed(kind, 40, 256)
    w = DeviceWeight(dev, p, layout="rb16")
    x = _exact_rows(9, p.k)
    xb, yb = _up(dev, x), _up(dev, np.zeros((9, 40), np.float32))
    ln = matmul.matmul(dev, yb, 0, 40, xb, 0, p.k, w, 9, accum=True)
    assert isinstance(ln.kernel, native_cpu.MatmulKernel)
    plan = LaunchPlan(dev)
    plan.add(ln)
    want = x.astype(np.float64) @ ref.T
    got = np.empty((9, 40), np.float32)
    for rows, times in ((9, 2), (4, 3)):
        dev.write(yb, np.zeros((9, 40), np.float32), blocking=True)
        plan.resize([(0, [(9, np.int32(rows))], (1,))])
        for _ in range(times):
            plan.replay()
        dev.read(got, yb)
        np.testing.assert_allclose(got[:rows], times * want[:rows], rtol=1e-5,
                                   atol=1e-5 * np.abs(want).max())
        assert not got[rows:].any()


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_k_quants_read_their_split_scales_through_the_queue(device, kind):
    # a K-quant in the CPU layout keeps its scales as the file holds them beside the float
    # ones; the native product reads those (ksplit), the same sums as on the host from the
    # float scales, bit for bit
    dev = _queue_device(device)
    p, _ = _packed(kind, 40, 512)
    w = DeviceWeight(dev, p, layout="rb16")
    assert w.kscales is not None
    x = RNG.standard_normal((3, p.k)).astype(np.float32)
    xb, yb = _up(dev, x), _up(dev, np.zeros((3, 40), np.float32))
    ln = matmul.matmul(dev, yb, 0, 40, xb, 0, p.k, w, 3)
    assert isinstance(ln.kernel, native_cpu.MatmulKernel) and ln.kernel.fixed["ksplit"] == 1
    assert w.kscales in ln.reads and w.scales not in ln.reads
    ln.run(dev)
    got = np.empty((3, 40), np.float32)
    dev.read(got, yb)
    assert np.array_equal(got, _host(native_cpu.library(), p, x))


def test_float16_weights_natively_where_chosen(device):
    # the native float16 products serve outside the batch engine's row-invariant plans: up to
    # FLOAT_ROWS rows where built for AVX-512 (a prompt's rows keep matmul_cpu.cl there), any
    # number where built for AVX2; the row-invariant plans keep matmul_cpu.cl
    dev = _queue_device(device)
    many = native_cpu.isa() == "avx2"
    n, k = 48, 256
    w = RNG.standard_normal((n, k)).astype(np.float32)
    p = pack_float(w, "f16")
    dw = DeviceWeight(dev, p, layout="rb16")
    x = RNG.standard_normal((8, k)).astype(np.float32)
    xb, yb = _up(dev, x), _up(dev, np.zeros((8, n), np.float32))
    for m, invariant, native in ((1, False, True), (native_cpu.FLOAT_ROWS, False, True),
                                 (native_cpu.FLOAT_ROWS + 1, False, many), (8, False, many),
                                 (1, True, False)):
        ln = matmul.matmul(dev, yb, 0, n, xb, 0, k, dw, m, row_invariant=invariant)
        assert isinstance(ln.kernel, native_cpu.MatmulKernel) == native, (m, invariant)
        assert not matmul.int8_rows(dev, m, dw)
        ln.run(dev)
        got = np.empty((8, n), np.float32)
        dev.read(got, yb)
        want = x[:m].astype(np.float64) @ p.dequantize().astype(np.float64).T
        np.testing.assert_allclose(got[:m], want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_products_in_a_row_go_as_one_command_in_a_resized_plan(device):
    # two products into one y (q4, then q8 accumulating) chained in a launch plan, replayed,
    # resized to fewer rows (the chain takes the new row count) and replayed again
    dev = _queue_device(device)
    p4, r4 = _packed("Q4_0", 40, 256)
    p8, r8 = _packed("Q8_0", 40, 256)
    w4, w8 = DeviceWeight(dev, p4, layout="rb16"), DeviceWeight(dev, p8, layout="rb16")
    x = _exact_rows(9, 256)
    xb, yb = _up(dev, x), _up(dev, np.zeros((9, 40), np.float32))
    plan = LaunchPlan(dev)
    plan.add(matmul.matmul(dev, yb, 0, 40, xb, 0, 256, w4, 9))
    plan.add(matmul.matmul(dev, yb, 0, 40, xb, 0, 256, w8, 9, accum=True))
    want = x.astype(np.float64) @ (r4 + r8).T
    got = np.empty((9, 40), np.float32)
    for rows in (9, 4):
        dev.write(yb, np.zeros((9, 40), np.float32), blocking=True)
        plan.resize([(i, [(9, np.int32(rows))], (1,)) for i in range(2)])
        plan.replay()
        dev.read(got, yb)
        np.testing.assert_allclose(got[:rows], want[:rows], rtol=1e-5,
                                   atol=1e-5 * np.abs(want).max())
        assert not got[rows:].any()
    chained = plan._prepared.chained
    assert len(chained) == 1 and isinstance(chained[0], nativekernel.Chain)


def test_float_rows_where_asked(device):
    # a quantized weight whose products keep float rows
    # (clops.llm.load(int8_activations=False)) takes matmul_cpu.cl's kernel even where the
    # native products run
    p, _ = _packed("Q4_0", 32, 64)
    w = DeviceWeight(device, p)
    assert native_cpu.takes(device, w) == (w.layout == "rb16" and native_cpu.available(device))
    w.int8 = False
    assert not native_cpu.takes(device, w)
    assert not matmul.int8_rows(device, 1, w)


def test_the_glu_over_the_float_range(lib):
    # silu(gate) * up with the gate values carried by the bias (zero weights): the vector
    # exp of the native GLU against float64, from -inf through the overflow of e^-x to +inf
    n = 32
    zero = PackedWeight("q8", 2 * n, 32, np.zeros((2 * n, 32), np.int8),
                        np.ones((2 * n, 1), np.float16))
    gates = np.concatenate([np.linspace(-120, 120, 4801), [0.0, -0.0, 1e-30, -1e-30, 88.7,
                                                           -88.7, -89.5, -103.0, np.inf,
                                                           -np.inf]]).astype(np.float32)
    gates = np.concatenate([gates, np.zeros(-len(gates) % n, np.float32)])
    for g in gates.reshape(-1, n):
        bias = np.concatenate([g, np.full(n, 2.0, np.float32)])
        got = _host(lib, zero, np.zeros((1, 32), np.float32), bias=bias, glu=True)[0]
        gd = g.astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            want = 2.0 * gd / (1.0 + np.exp(-gd))
        want[g == -np.inf] = np.nan  # -inf * sigmoid(-inf), as PyTorch's silu gives
        normal = np.isfinite(want) & (np.abs(want) > 1e-30)
        np.testing.assert_allclose(got[normal], want[normal], rtol=1e-6)
        assert np.array_equal(got[np.isinf(want)], want[np.isinf(want)])
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert (np.abs(got[~normal & np.isfinite(want)]) <= 1e-30).all()


def test_a_forked_child_starts_its_own_workers(lib):
    # the pool's workers are threads of the parent: a child made by fork() after the parent
    # used them would wait for them forever without the library's fork handler
    import multiprocessing as mp

    p, ref = _packed("Q4_0", 48, 256)
    x = _exact_rows(3, p.k)
    _host(lib, p, x)  # the parent's workers exist now
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=lambda: q.put(_host(lib, p, x).tolist()))
    child.start()
    child.join(120)  # a product of microseconds: only a hang comes near this
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child's product never finished")
    got = np.array(q.get(timeout=10), np.float32)
    np.testing.assert_allclose(got, x.astype(np.float64) @ ref.T, rtol=1e-5,
                               atol=1e-5 * np.abs(got).max())


def test_more_threads_than_before(lib):
    # workers made for a call with more threads than the calls before it start at that call
    # (not at a task that has gone)
    p, ref = _packed("Q8_0", 96, 256)
    x = _exact_rows(6, p.k)
    want = x.astype(np.float64) @ ref.T
    for threads in (2, 3, 5, 2, 5):
        got = _host(lib, p, x, threads=threads)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_the_first_product_inside_a_jit_capture(device, monkeypatch):
    # the device's check product runs outside the capture: made inside it, its read-back was
    # refused and the native products were turned off for the process
    import weakref

    import clops
    from clops import nn

    dev = _queue_device(device)
    monkeypatch.setattr(native_cpu, "_CHECKED", weakref.WeakKeyDictionary())
    p, ref = _packed("Q8_0", 48, 256)
    w = DeviceWeight(dev, p, layout="rb16")

    @clops.jit
    def f(x):
        return nn.linear(x, w)

    x = _exact_rows(3, p.k)
    got = np.asarray(f(clops.asarray(x, device=dev)))
    assert native_cpu._CHECKED[dev] is True
    want = x.astype(np.float64) @ ref.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _attention_reference(qkv, kc, vc, pos, inv_freq, h, kv, d, scale, neox):
    """Decode attention of one row in float64: out [H][D] and the caches with the new
    position."""
    q = qkv[:h * d].reshape(h, d).astype(np.float64)
    k = qkv[h * d:(h + kv) * d].reshape(kv, d).astype(np.float64)
    v = qkv[(h + kv) * d:].reshape(kv, d).astype(np.float64)
    ang = pos * inv_freq.astype(np.float64)
    c, s = np.cos(ang), np.sin(ang)

    def rot(x):
        x = x.copy()
        i0, i1 = (slice(0, d // 2), slice(d // 2, d)) if neox else (slice(0, d, 2),
                                                                   slice(1, d, 2))
        a, b = x[:, i0].copy(), x[:, i1].copy()
        x[:, i0], x[:, i1] = a * c - b * s, a * s + b * c
        return x

    kcache, vcache = kc.astype(np.float64), vc.astype(np.float64)
    kcache[:, pos], vcache[:, pos] = rot(k), v
    q = rot(q) * scale
    out = np.empty((h, d))
    for i in range(h):
        g = i // (h // kv)
        sc = kcache[g, :pos + 1] @ q[i]
        p = np.exp(sc - sc.max())
        out[i] = p @ vcache[g, :pos + 1] / p.sum()
    return out, kcache, vcache


@pytest.mark.parametrize("h,kv,d,pos,neox", [(32, 8, 64, 0, True), (32, 8, 64, 37, True),
                                             (4, 4, 128, 100, False), (6, 2, 16, 16, True),
                                             (9, 3, 32, 15, False), (2, 1, 256, 300, True)])
def test_decode_attention(lib, h, kv, d, pos, neox):
    # positions 0, around a block of 16 scores and past several; grouped and plain heads
    ms = 320
    qkv = RNG.standard_normal((h + 2 * kv) * d).astype(np.float32)
    kc = RNG.standard_normal((kv, ms, d)).astype(np.float32)
    vc = RNG.standard_normal((kv, ms, d)).astype(np.float32)
    inv = (1.0 / 10000 ** (np.arange(0, d, 2) / d)).astype(np.float32)
    state = np.array([pos], np.int32)
    out = np.zeros((h, d), np.float32)
    want, kw, vw = _attention_reference(qkv, kc, vc, pos, inv, h, kv, d, 0.125, neox)
    lib.clops_native_attention(ctypes.byref(_attention_args(out, qkv, kc, vc, state, inv, h,
                                                            kv, d, ms, neox)))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    # (the new key's rotation at float32 angles: pos * inv_freq rounded)
    np.testing.assert_allclose(kc, kw, rtol=1e-4, atol=1e-4)
    assert np.array_equal(vc, vw.astype(np.float32))


def test_decode_attention_through_the_queue_as_the_opencl_kernel(device):
    dev = _queue_device(device)
    h, kv, d, ms, pos = 32, 8, 64, 128, 70
    qkv = RNG.standard_normal((h + 2 * kv) * d).astype(np.float32)
    caches = RNG.standard_normal((2, kv, ms, d)).astype(np.float32)
    inv = (1.0 / 500000 ** (np.arange(0, d, 2) / d)).astype(np.float32)
    outs = []
    for make in (native_cpu.attention, attention.attn_decode_cpu):
        bufs = [_up(dev, a) for a in (qkv, caches[0], caches[1], np.array([pos], np.int32),
                                      inv, np.zeros((h, d), np.float32))]
        ln = make(dev, bufs[5], *bufs[:5], n_heads=h, n_kv=kv, head_dim=d, max_seq=ms,
                  scale=0.125, neox=True)
        ln.run(dev)
        got = [np.empty((h, d), np.float32), np.empty((kv, ms, d), np.float32),
               np.empty((kv, ms, d), np.float32)]
        for arr, b in zip(got, (bufs[5], bufs[1], bufs[2])):
            dev.read(arr, b)
        outs.append(got)
    assert isinstance(native_cpu.attention(dev, *bufs[:6], n_heads=h, n_kv=kv, head_dim=d,
                                           max_seq=ms, scale=0.125, neox=True).kernel,
                      native_cpu.AttentionKernel)
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-6)
    assert np.array_equal(outs[0][2], outs[1][2])


def _attention_args(out, qkv, kc, vc, state, inv, h, kv, d, ms, neox, m=1):
    return native_cpu._AttnArgs(out=out.ctypes.data, qkv=qkv.ctypes.data, kc=kc.ctypes.data,
                                vc=vc.ctypes.data, state=state.ctypes.data,
                                inv_freq=inv.ctypes.data, max_seq=ms, n_rep=h // kv, H=h,
                                KV=kv, D=d, neox=int(neox), threads=2, scale=0.125, m=m)


@pytest.mark.parametrize("h,kv,d,pos,m,neox", [(32, 8, 64, 0, 64, True), (32, 8, 64, 37, 20, True),
                                               (9, 3, 32, 15, 33, False), (2, 1, 256, 3, 2, True)])
def test_prompt_attention_rows_are_decode_rows(lib, h, kv, d, pos, m, neox):
    # m rows at once give each row what a decode row at its position gives, bit for bit, and
    # the same caches (rows one at a time, each after the one before it)
    ms = 160
    qkv = RNG.standard_normal((m, (h + 2 * kv) * d)).astype(np.float32)
    caches = RNG.standard_normal((2, kv, ms, d)).astype(np.float32)
    inv = (1.0 / 10000 ** (np.arange(0, d, 2) / d)).astype(np.float32)
    kc, vc = caches[0].copy(), caches[1].copy()
    out = np.zeros((m, h, d), np.float32)
    state = np.array([pos], np.int32)
    lib.clops_native_attention(ctypes.byref(_attention_args(out, qkv, kc, vc, state, inv, h,
                                                            kv, d, ms, neox, m)))
    kc1, vc1 = caches[0].copy(), caches[1].copy()
    for i in range(m):
        row, one = np.ascontiguousarray(qkv[i]), np.zeros((h, d), np.float32)
        state1 = np.array([pos + i], np.int32)
        lib.clops_native_attention(ctypes.byref(_attention_args(one, row, kc1, vc1, state1, inv,
                                                                h, kv, d, ms, neox)))
        assert np.array_equal(out[i], one), i
    assert np.array_equal(kc, kc1) and np.array_equal(vc, vc1)
    # and the last row against the float64 reference (the rows before it in the caches)
    kw, vw = kc.copy(), vc.copy()
    want, _, _ = _attention_reference(qkv[-1], kw, vw, pos + m - 1, inv, h, kv, d, 0.125, neox)
    np.testing.assert_allclose(out[-1], want, rtol=1e-4, atol=1e-5)


def test_prompt_attention_through_the_queue_as_the_opencl_kernels(device):
    # the native launch of a prompt's rows against rope_store then attn_prefill (causal)
    dev = _queue_device(device)
    h, kv, d, ms, pos, m = 32, 8, 64, 128, 5, 40
    qkv = RNG.standard_normal((m, (h + 2 * kv) * d)).astype(np.float32)
    caches = RNG.standard_normal((2, kv, ms, d)).astype(np.float32)
    inv = (1.0 / 500000 ** (np.arange(0, d, 2) / d)).astype(np.float32)
    outs = []
    for native in (True, False):
        bufs = [_up(dev, a) for a in (qkv, caches[0], caches[1], np.array([pos], np.int32),
                                      inv, np.zeros((m, h, d), np.float32),
                                      np.zeros((m, h, d), np.float32))]
        qb, kb, vb, sb, ib, ob, rq = bufs
        common = dict(n_heads=h, n_kv=kv, head_dim=d, scale=0.125)
        if native:
            ln = native_cpu.attention(dev, ob, qb, kb, vb, sb, ib, max_seq=ms, neox=True, m=m,
                                      **common)
            assert isinstance(ln.kernel, native_cpu.AttentionKernel)
            ln.run(dev)
        else:
            attention.rope_store(dev, rq, qb, (h + 2 * kv) * d, kb, vb, sb, ib, m=m,
                                 n_heads=h, n_kv=kv, head_dim=d, max_seq=ms,
                                 neox=True).run(dev)
            attention.attn_prefill(dev, ob, rq, 0, h * d, kb, vb, 0, 0, ms * d, sb, pos_add=0,
                                   causal=True, n_keys=ms, m=m, **common).run(dev)
        got = [np.empty((m, h, d), np.float32), np.empty((kv, ms, d), np.float32),
               np.empty((kv, ms, d), np.float32)]
        for arr, b in zip(got, (ob, kb, vb)):
            dev.read(arr, b)
        outs.append(got)
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-5)
    assert np.array_equal(outs[0][2], outs[1][2])


def test_a_prompts_norm_folds_into_native_products(device):
    # the native products normalize their rows themselves for any row count: a prompt's norm
    # goes into them (matmul.fused_norm), and the product with norm= matches the norm first
    dev = _queue_device(device)
    p, ref = _packed("Q4_K", 32, 256)
    w = DeviceWeight(dev, p, layout="rb16")
    assert matmul.fused_norm(dev, w, 64) and matmul.fused_norm(dev, w, 1)
    w.int8 = False  # (not native: matmul_cpu.cl folds the norm in for one row only)
    assert not matmul.fused_norm(dev, w, 64) and matmul.fused_norm(dev, w, 1)
    w.int8 = True
    x = RNG.standard_normal((9, p.k)).astype(np.float32)
    nw = (RNG.random(p.k) + 0.5).astype(np.float32)
    yb = _up(dev, np.zeros((9, 32), np.float32))
    matmul.matmul(dev, yb, 0, 32, _up(dev, x), 0, p.k, w, 9, norm=(_up(dev, nw), 1e-5)).run(dev)
    got = np.empty((9, 32), np.float32)
    dev.read(got, yb)
    xd = x.astype(np.float64)
    want = (xd / np.sqrt((xd ** 2).mean(1, keepdims=True) + 1e-5) * nw) @ ref.T
    assert np.abs(got - want).max() < 2e-2 * np.abs(want).max()
