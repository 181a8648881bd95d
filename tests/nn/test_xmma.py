"""A mixture of experts' grouped products of a prompt's rows on the float16 tensor cores
(``matmul.matmul_xmma``, ``xmma.cl``), forced on whatever device the tests use (the
instruction emulated by its fragment layout where the device has no NVIDIA PTX): against
numpy's product of the same float16-rounded rows and weights, for every weight format, with
the gathered rows (``order``), the GLU folded in, biases, padding slots and tiles, and column
counts that are not multiples of a work-group's."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from clops.kernels import launch, matmul
from clops.nn import quant
from clops.nn.quant import DeviceWeight

from . import test_functional, test_moe
from .test_moe import _packed, _read, _up

# (a GPU path run on the CPU device: .ci/run's second pass leaves it out)
pytestmark = pytest.mark.standin

RNG = np.random.default_rng(7)
T = matmul.XMMA_TILE


@pytest.fixture(autouse=True)
def _seeded(request, monkeypatch):
    """Each test's random values from a seed of its own id (the weights' helpers of test_moe and
    test_functional draw from their modules' generators): the same values alone as in a run
    of the whole module."""
    seed = zlib.crc32(request.node.nodeid.encode())
    monkeypatch.setattr(test_moe, "RNG", np.random.default_rng(seed + 1))
    monkeypatch.setattr(test_functional, "RNG", np.random.default_rng(seed + 2))
    global RNG
    RNG = np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def _gpu(monkeypatch):
    monkeypatch.setattr(launch, "is_cpu", lambda dev: False)
    monkeypatch.setattr(quant, "layout_for", lambda dev: "rows")
    monkeypatch.setattr(matmul, "XMMA_OVERRIDE", True)


def _half(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


def _slots(counts):
    """order and tile_e for experts with ``counts`` rows (pairs numbered in slot order, each
    expert's pairs then padding to whole tiles; an expert of no rows has no tile), and a
    padding tile at the end."""
    order, tile_e, v = [], [], 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        span = -(-c // T) * T
        order += list(range(v, v + c)) + [-1] * (span - c)
        tile_e += [e] * (span // T)
        v += c
    order += [-1] * T
    tile_e += [-1]
    return np.array(order, np.int32), np.array(tile_e, np.int32), v


def _product(dev, w, wv, n_e, x, order, tile_e, *, gather=0, glu=False, bias=None):
    """matmul_xmma's y [p, N] and numpy's, the padding slots' rows left out."""
    p, n = len(order), w.n // n_e
    k = w.k
    if glu:
        a = x[:, :k] / (1 + np.exp(-x[:, :k].astype(np.float64))) * x[:, k:]
    else:
        a = x.astype(np.float64)
    yb = _up(dev, np.full((p, n), np.nan, np.float32))
    ob, tb = _up(dev, order), _up(dev, tile_e)
    bb = _up(dev, bias) if bias is not None else None
    ln = matmul.matmul_xmma(dev, yb, 0, n, _up(dev, x), 0, x.shape[1], w, p, ob, (tb, n_e),
                            gather=gather, glu=glu, bias=bb, name="experts")
    assert ln.kernel.function_name == "matmul_xmma"
    ln.run(dev)
    got = _read(dev, yb, (p, n))
    want = np.zeros((p, n))
    live = order >= 0
    for s in np.nonzero(live)[0]:
        e = tile_e[s // T]
        row = a[order[s] // gather] if gather else a[s]
        want[s] = _half(wv[e * n:(e + 1) * n]) @ _half(row)
        if bias is not None:
            want[s] += bias[e * n:(e + 1) * n]
    return got[live], want[live], got[~live & (np.repeat(tile_e, T) >= 0)]


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


KINDS = ["f32", "f16", "bf16", "Q4_0", "Q4_1", "Q8_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_XS", "MXFP4", "IQ4_NL", "Q5_0", "Q3_K"]


def _weight(dev, kind, rows, k):
    if kind in ("Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL", "Q3_K"):
        from .test_functional import ggml_weight

        w, ref = ggml_weight(dev, kind, rows, k, RNG)
        return w, ref.astype(np.float64)
    packed, ref = _packed(kind, rows, k)
    return DeviceWeight(dev, packed), ref


@pytest.mark.parametrize("kind", KINDS)
def test_experts_rows_against_numpy(device, kind, n_e=3, n=48, k=256):
    w, wv = _weight(device, kind, n_e * n, k)
    assert w.layout == "rows"
    # expert 0: two tiles (the second with rows in its first 16 slots alone), 1: none, 2: a
    # tile with rows in its first 32 slots
    order, tile_e, pairs = _slots([T + 5, 0, 20])
    x = RNG.standard_normal((len(order), k)).astype(np.float32)
    got, want, pad = _product(device, w, wv, n_e, x, order, tile_e)
    _close(got, want)
    assert np.isfinite(pad).all()


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K", "f16"])
@pytest.mark.parametrize("n", [16, 160, 256])
def test_experts_rows_gathered_with_bias(device, kind, n, n_e=2, k=256, top=2):
    """Rows gathered through order (a pair v is row v // top of x), biases per expert, and
    column counts under, over and at whole work-groups."""
    w, wv = _weight(device, kind, n_e * n, k)
    order, tile_e, pairs = _slots([17, T])
    x = RNG.standard_normal((-(-pairs // top), k)).astype(np.float32)
    bias = RNG.standard_normal(n_e * n).astype(np.float32)
    got, want, _ = _product(device, w, wv, n_e, x, order, tile_e, gather=top, bias=bias)
    _close(got, want)


@pytest.mark.parametrize("kind", ["Q4_0", "MXFP4"])
def test_experts_rows_take_the_glu(device, kind, n_e=2, n=32, k=128):
    w, wv = _weight(device, kind, n_e * n, k)
    order, tile_e, _ = _slots([3, 40])
    x = RNG.standard_normal((len(order), 2 * k)).astype(np.float32)
    got, want, _ = _product(device, w, wv, n_e, x, order, tile_e, glu=True)
    # (the GLU made in float32 on the device, then rounded to float16: a value near a tie of
    # two float16 values may round the other way than numpy's float64 GLU, a float16 step of
    # that term)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2.0 ** -10 * np.abs(want).max())


def test_experts_rows_need_whole_tiles(device):
    w, _ = _weight(device, "Q8_0", 2 * 16, 64)
    buf = device.alloc(4096)
    with pytest.raises(ValueError, match="tm="):
        matmul.matmul_xmma(device, buf, 0, 16, buf, 0, 64, w, T + 1, buf, (buf, 2))



@pytest.mark.parametrize("kind,f,limit", [
    ("Q4_0", 32, 0.0), ("Q4_0", 96, 0.0), ("Q8_0", 128, 0.0), ("Q5_1", 96, 0.0),
    ("MXFP4", 32, 0.0), ("Q4_K", 256, 0.0), ("MXFP4", 64, 0.5)])
def test_experts_rows_glu_out_then_half_in(device, kind, f, limit, n_e=3, dim=64, top=2):
    """The [gate | up] product of float16 rows gathered through the slots' order, with the
    GLU in its epilogue (float16 rows act(gate) * up; ``limit``: gpt-oss's clamped GLU, a
    limit that most values cross) and biases per expert, then the down product reading those
    float16 rows as they are: the two products of a prompt's experts, against numpy."""
    k = 256 if kind == "Q4_K" else dim
    gu, guv = _weight(device, kind, n_e * 2 * f, k)
    down, downv = _weight(device, kind, n_e * k, f)
    order, tile_e, pairs = _slots([20, 0, T + 3])
    x = RNG.standard_normal((-(-pairs // top), k)).astype(np.float32)
    bias = RNG.standard_normal(n_e * 2 * f).astype(np.float32)
    p = len(order)
    hb = _up(device, np.full((p, f), np.nan, np.float16))
    ob, tb = _up(device, order), _up(device, tile_e)
    # (the gathered rows as float16, as the prompt's [gate | up] products read them)
    matmul.matmul_xmma(device, hb, 0, f, _up(device, x.astype(np.float16)), 0, k, gu, p, ob,
                       (tb, n_e), gather=top, bias=_up(device, bias), glu_out=True,
                       half_in=True, limit=limit, alpha=1.702).run(device)
    h = _read(device, hb, (p, f), np.float16).astype(np.float64)
    yb = _up(device, np.full((p, k), np.nan, np.float32))
    matmul.matmul_xmma(device, yb, 0, k, hb, 0, f, down, p, ob, (tb, n_e),
                       half_in=True).run(device)
    y = _read(device, yb, (p, k))
    live = np.nonzero(order >= 0)[0]
    want_h = np.zeros((p, f))
    for s in live:
        e = tile_e[s // T]
        rows = guv[e * 2 * f:(e + 1) * 2 * f]
        v = _half(rows) @ _half(x[order[s] // top]) + bias[e * 2 * f:(e + 1) * 2 * f]
        if limit:  # (as activation.glu's glu_clamp)
            g, u = np.minimum(v[:f], limit), np.clip(v[f:], -limit, limit)
            want_h[s] = (u + 1) * g / (1 + np.exp(-1.702 * g))
            assert (np.abs(v) > limit).mean() > 0.5  # (the clamp matters)
        else:
            want_h[s] = v[:f] / (1 + np.exp(-v[:f])) * v[f:]
    # (h rounded to float16 once: within one float16 step of numpy's value)
    np.testing.assert_allclose(h[live], want_h[live], rtol=2.0 ** -10,
                               atol=1e-6 * np.abs(want_h).max())
    want_y = np.stack([_half(downv[tile_e[s // T] * k:(tile_e[s // T] + 1) * k]) @ h[s]
                       for s in live])
    _close(y[live], want_y)


def test_experts_rows_clamp_goes_with_glu_out(device):
    w, _ = _weight(device, "MXFP4", 2 * 32, 64)
    buf = device.alloc(1 << 16)
    with pytest.raises(ValueError, match="limit"):
        matmul.matmul_xmma(device, buf, 0, 32, buf, 0, 64, w, T, buf, (buf, 2), limit=7.0,
                           alpha=1.702)


def test_experts_rows_half_in_refuses_the_glu_and_unaligned_rows(device):
    w, _ = _weight(device, "Q8_0", 2 * 16, 64)
    buf = device.alloc(1 << 16)
    for bad in (dict(glu=True), dict(ldx=68)):
        with pytest.raises(ValueError, match="half_in"):
            matmul.matmul_xmma(device, buf, 0, 16, buf, 0, bad.pop("ldx", 64), w, T, buf,
                               (buf, 2), half_in=True, **bad)


def test_mxfp4_values_reach_the_tensor_cores_rounded_once(device, n=32, k=64):
    """MXFP4's values become float16 in the kernel (straight from their table where the
    instruction runs, XQ 5) as the float values rounded once to float16 are, through
    float16's subnormals and below them: one-hot rows read each weight back exactly."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    from clops.nn.quant import pack_ggml

    rng = np.random.default_rng(11)
    raw = rng.integers(0, 256, (n * k // 32, 17), dtype=np.uint8)
    # exponents 2^-31 .. 2^12 (float16's subnormals start at 2^-14, end at 2^-24), each row's
    # groups spread over them; no group so large that a value overflows float16
    raw[:, 0] = 128 + np.tile(np.arange(-31, 13), -(-len(raw) // 44))[:len(raw)]
    w = DeviceWeight(device, pack_ggml(raw.reshape(n, -1), int(Q.MXFP4), n, k))
    ref = quants.dequantize(raw.reshape(n, -1), Q.MXFP4).reshape(n, k)
    order = np.arange(T, dtype=np.int32)
    order[k:] = -1
    tile_e = np.array([0], np.int32)
    x = np.zeros((T, k), np.float32)
    x[np.arange(k), np.arange(k)] = 1.0
    yb = _up(device, np.full((T, n), np.nan, np.float32))
    ln = matmul.matmul_xmma(device, yb, 0, n, _up(device, x), 0, k, w, T, _up(device, order),
                            (_up(device, tile_e), 1))
    ln.run(device)
    got = _read(device, yb, (T, n))[:k]
    want = ref.T.astype(np.float16).astype(np.float32)
    assert (want != 0).any() and (np.abs(want[want != 0]) < 2.0 ** -14).any()
    np.testing.assert_array_equal(got, want)
