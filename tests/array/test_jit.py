"""clops.jit: capture once per signature, replay with no graph building, scheduling or
rendering; results equal the eager ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clops
from clops import JitError
from clops.compiler import render


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
    assert len(step.traces) == 1


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
    assert len(f.traces) == 3


def test_host_reads_inside_are_refused(device):
    @clops.jit
    def bad(x):
        return x * float(x.sum())

    with pytest.raises(JitError, match="host"):
        bad(clops.asarray([1.0, 2.0], device=device))


# -- the corpus: jit against eager, fresh inputs every call -------------------------------------
# A replay that reused anything of the first call (a product, a norm, an FFT) gives that call's
# values again; each call here has new values, so that cannot pass.
CALLS = 4


def _normal(*shape):
    return lambda rng: rng.standard_normal(shape).astype(np.float32)


def _spd(n):
    def make(rng):
        a = rng.standard_normal((n, n))
        return (a @ a.T + n * np.eye(n)).astype(np.float32)
    return make


def _ints(high, *shape):
    return lambda rng: rng.integers(0, high, shape).astype(np.int64)


def _nn_weight(x):
    return clops.nn.quantized(np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32),
                              "f16", device=x.device)


def _inplace(x, y):
    x += y  # into the argument's own memory, as in eager
    x[0] = 7.0
    return x * 2


def _scatter(x, i):
    y = clops.asarray(x, copy=True)
    y[i] = -1.0
    return y


CORPUS = {
    # generated kernels: products small enough to stay generated, fused with their neighbours
    "tanh(x @ w).sum": (lambda x, w: clops.tanh(x @ w).sum(axis=-1), [_normal(8, 16),
                                                                      _normal(16, 8)]),
    "x @ w + 1": (lambda x, w: x @ w + 1, [_normal(5, 7), _normal(7, 3)]),
    "softmax rows": (lambda x: clops.exp(x) / clops.sum(clops.exp(x), axis=1, keepdims=True),
                     [_normal(6, 33)]),
    "column mean": (lambda x: clops.mean(x, axis=0), [_normal(300, 5)]),
    "long sum (split)": (lambda x: clops.sum(x * x), [_normal(1 << 15)]),
    # GEMM kernels (test_the_gemm_kernels_are_what_the_gemm_cases_replay): gemm_cpu on CPUs,
    # gemm.cl (tensor cores for float16) on GPUs, from 2^24 multiply-adds there
    "gemm float32": (lambda x, w: clops.tanh(x @ w), [_normal(256, 256), _normal(256, 256)]),
    "gemm float16": (lambda x, w: clops.astype(x, clops.float16) @ clops.astype(w, clops.float16),
                     [_normal(256, 256), _normal(256, 256)]),
    "gemm batched": (lambda x, w: (x @ w).sum(axis=0), [_normal(2, 256, 256),
                                                         _normal(2, 256, 256)]),
    # clops.nn
    "nn.softmax * 2": (lambda x: clops.nn.softmax(x) * 2, [_normal(64, 64)]),
    "nn.softmax axis 0": (lambda x: clops.nn.softmax(x, axis=0), [_normal(5, 9)]),
    "nn.silu": (lambda x: clops.nn.silu(x), [_normal(3, 50)]),
    "nn.gelu": (lambda x: clops.nn.gelu(x), [_normal(77)]),
    "nn.gelu tanh": (lambda x: clops.nn.gelu(x, approximate="tanh"), [_normal(77)]),
    "nn.rms_norm": (lambda x, w: clops.nn.rms_norm(x, w), [_normal(5, 64), _normal(64)]),
    "nn.rms_norm of a view": (lambda x, w: clops.nn.rms_norm(x[1:, 1:], w[1:]),
                              [_normal(5, 65), _normal(65)]),
    "nn.layer_norm": (lambda x, w, b: clops.nn.layer_norm(x, w, b),
                      [_normal(4, 48), _normal(48), _normal(48)]),
    "nn.linear tensor weight": (lambda x, w, b: clops.nn.linear(x, w, b),
                                [_normal(20, 64), _normal(32, 64), _normal(32)]),
    "nn.linear quantized weight": (lambda x: clops.nn.linear(x, _nn_weight(x)),
                                   [_normal(3, 32)]),
    "nn.embedding": (lambda i: clops.nn.embedding(i, _EMBED[0]), [_ints(64, 2, 3)]),
    "nn.rope": (lambda x, p: clops.nn.rope(x, p), [_normal(4, 2, 16), _ints(100, 4)]),
    "nn.rope list positions": (lambda x: clops.nn.rope(x, [3, 1, 4, 1]), [_normal(4, 2, 16)]),
    "nn.scaled_dot_product_attention": (
        lambda q, k, v: clops.nn.scaled_dot_product_attention(q, k, v),
        [_normal(5, 4, 16), _normal(7, 2, 16), _normal(7, 2, 16)]),
    # fft
    "abs(fft(x))": (lambda x: abs(clops.fft.fft(x)), [_normal(64, 64)]),
    "irfft(rfft(x) * 2)": (lambda x: clops.fft.irfft(clops.fft.rfft(x) * 2, n=30),
                           [_normal(3, 30)]),
    "fftn prime": (lambda x: clops.fft.fftn(clops.astype(x, clops.complex64)), [_normal(7, 13)]),
    # linalg
    "linalg.solve": (lambda a, b: clops.linalg.solve(a, b), [_spd(6), _normal(6, 2)]),
    "linalg.inv": (lambda a: clops.linalg.inv(a), [_spd(5)]),
    "linalg.cholesky": (lambda a: clops.linalg.cholesky(a), [_spd(5)]),
    "linalg.det": (lambda a: clops.linalg.det(a), [_spd(4)]),
    "linalg.qr": (lambda a: tuple(clops.linalg.qr(a)), [_normal(6, 4)]),
    "linalg.eigvalsh": (lambda a: clops.linalg.eigvalsh(a), [_spd(5)]),
    "linalg.svdvals": (lambda a: clops.linalg.svdvals(a), [_normal(5, 3)]),
    "linalg.vector_norm": (lambda a: clops.linalg.vector_norm(a, axis=1), [_normal(5, 3)]),
    # indexing, sorting, scans, in place
    "slices and flips": (lambda x: x[::-2, 1:3] + x[1::2, :2], [_normal(6, 5)]),
    "take": (lambda x, i: clops.take(x, i, axis=1), [_normal(4, 9), _ints(9, 5)]),
    "integer-array gather": (lambda x, i: x[i, 1], [_normal(9, 3), _ints(9, 6)]),
    "integer-array scatter": (_scatter, [_normal(9), _ints(9, 4)]),
    "in place on an argument": (_inplace, [_normal(3, 4), _normal(3, 4)]),
    "sort and argsort": (lambda x: (clops.sort(x, axis=0), clops.argsort(x)), [_normal(17, 3)]),
    "cumulative_sum": (lambda x: clops.cumulative_sum(x, axis=1), [_normal(3, 40)]),
    "searchsorted": (lambda a, v: clops.searchsorted(clops.sort(a), v), [_normal(20),
                                                                         _normal(7)]),
    "constant from the host": (lambda x: x * clops.asarray([1.0, 2.0, 3.0], device=x.device),
                               [_normal(2, 3)]),
    "random with a fixed seed": (lambda x: x + clops.random.normal(3, x.shape, device=x.device),
                                 [_normal(4, 4)]),
}
_EMBED: list = []


def _check_corpus(name, device, calls=CALLS):
    fn, makers = CORPUS[name]
    if not _EMBED or _EMBED[0].device is not device:
        _EMBED[:] = [clops.nn.quantized(np.linspace(-2, 2, 64 * 32, dtype=np.float32)
                                        .reshape(64, 32), "f32", device=device)]
    jitted = clops.jit(fn)
    rng = np.random.default_rng(len(name))
    for call in range(calls):
        host = [make(rng) for make in makers]
        got = jitted(*[clops.asarray(h, device=device) for h in host])
        args = [clops.asarray(h, device=device) for h in host]
        want = fn(*args)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, (name, call)
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name}: call {call}")
    assert len(jitted.traces) == 1 and not isinstance(next(iter(jitted.traces.values())), str)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_jit_gives_the_eager_value_on_every_call(device, name):
    if "fft" in name and not hasattr(clops, "fft"):
        pytest.skip("clops.fft is not available in this installation")
    _check_corpus(name, device)


@pytest.mark.parametrize("dtype,batch", [("float32", ()), ("float16", ()), ("float32", (2,))])
def test_the_gemm_kernels_are_what_the_gemm_cases_replay(device, clops_env, dtype, batch):
    if dtype == "float16" and device.kind == "cpu":
        pytest.skip("CPUs have no float16 GEMM kernel (the product is generated)")
    clops_env(CLOPS_PROVIDERS="none")
    x = clops.asarray(np.ones((*batch, 256, 256), dtype), device=device)
    f = clops.jit(lambda a, b: a @ b)
    f(x, x)
    with clops.profile() as prof:
        got = f(x, x)
    assert [r.name for r in prof.records if r.kind == "kernel"][0].startswith("gemm")
    np.testing.assert_array_equal(np.asarray(got), np.full((*batch, 256, 256), 256.0))


def test_a_probe_first_asked_inside_a_captured_function_is_no_part_of_it(device):
    # (a capability probe, such as the float16 GEMM's, runs once, whenever first asked: its
    # own writes, launches and reads must neither refuse the capture nor be replayed)
    from clops.runtime import probes

    calls = []

    @probes.per_device
    def reads_back(dev):
        buf = dev.alloc(16)
        dev.write(buf, np.arange(4, dtype=np.float32), blocking=True)
        out = np.empty(4, np.float32)
        dev.read(out, buf, blocking=True)
        calls.append(1)
        return float(out.sum())

    @clops.jit
    def f(x):
        assert reads_back(device) == 6.0
        return x * 2

    for v in range(3):
        x = clops.asarray(np.full(3, v, np.float32), device=device)
        np.testing.assert_array_equal(np.asarray(f(x)), np.full(3, 2 * v, np.float32))
    assert calls == [1]


def test_in_place_writes_reach_the_arguments(device):
    f = clops.jit(_inplace)
    for v in range(3):
        x = clops.asarray(np.full((3, 4), v, np.float32), device=device)
        out = f(x, clops.asarray(np.ones((3, 4), np.float32), device=device))
        want = np.full((3, 4), v + 1, np.float32)
        want[0] = 7
        np.testing.assert_array_equal(np.asarray(x), want)
        np.testing.assert_array_equal(np.asarray(out), want * 2)


def test_outside_tensors_updated_in_place_are_read_anew(device):
    acc = clops.zeros(3, device=device)

    @clops.jit
    def step(x):
        acc[...] = acc + x  # an accumulator outside the arguments, updated in place
        return acc * 1

    for i in range(1, 4):
        got = step(clops.asarray(np.full(3, i, np.float32), device=device))
        np.testing.assert_array_equal(np.asarray(got), np.full(3, i * (i + 1) / 2))


@pytest.mark.parametrize("provider,op", [("clblast", "gemm"), ("vkfft", "fft")])
def test_provider_calls_are_replayed_whole(device, clops_env, provider, op):
    from clops import providers

    prov = providers.get(provider)
    if prov.cannot(op, device, "float32" if op == "gemm" else "complex64") is not None:
        pytest.skip(f"{provider} does not serve {device.name} here")
    clops_env(CLOPS_PROVIDERS=f"+{provider}")
    name = "x @ w (provider)" if op == "gemm" else "fft (provider)"
    CORPUS[name] = ((lambda x, w: x @ w, [_normal(130, 130), _normal(130, 130)]) if op == "gemm"
                    else (lambda x: clops.fft.fft(x) * 2, [_normal(4, 64)]))
    try:
        with clops.profile() as prof:
            _check_corpus(name, device)
    finally:
        del CORPUS[name]
    calls = [r for r in prof.records if r.kind == "provider" and r.extra["provider"] == provider]
    assert len(calls) >= 2 * CALLS  # jit (capture and replays) and eager, every call


def test_nested_jit_replays_the_inner_trace(device):
    inner = clops.jit(lambda x: clops.nn.softmax(x) + 1)
    outer = clops.jit(lambda x: inner(x * 2).sum(axis=1))
    rng = np.random.default_rng(1)
    for _ in range(3):
        a = rng.standard_normal((4, 8)).astype(np.float32)
        e = np.exp(2 * a - (2 * a).max(1, keepdims=True))
        want = (e / e.sum(1, keepdims=True) + 1).sum(1)
        np.testing.assert_allclose(np.asarray(outer(clops.asarray(a, device=device))), want,
                                   rtol=1e-5)


def test_refusals_name_the_op(device):
    x = clops.asarray(np.arange(6, dtype=np.float32), device=device)
    cases = [(lambda t: t * float(t.sum()), "host"), (lambda t: clops.nonzero(t)[0], "nonzero"),
             (lambda t: clops.unique_values(t), "unique"), (lambda t: t[t > 2], "boolean mask"),
             (lambda t: clops.repeat(t, clops.asarray([1, 2, 1, 0, 1, 1], device=device)),
              "repeat"),
             (lambda t: clops.nn.KVCache(1, 6, 4, device=device).attend(
                 *(clops.reshape(t, (1, 1, 6)),) * 3), "KVCache")]
    for fn, what in cases:
        with pytest.raises(JitError, match=what):
            clops.jit(fn)(x)
    with pytest.raises(JitError, match="not hashable"):
        clops.jit(lambda t, a: t)(x, np.ones(2))


def test_strict_false_runs_eagerly_where_it_cannot_capture(device, capfd, clops_env):
    clops_env(CLOPS_DEBUG="1")
    f = clops.jit(lambda t: t[t > 1] * 2, strict=False)
    for n in (3, 5, 4):
        got = f(clops.asarray(np.arange(n, dtype=np.float32), device=device))
        np.testing.assert_array_equal(np.asarray(got), np.arange(2, n) * 2)
    assert capfd.readouterr().err.count("runs eagerly") == 3  # once for each signature
    assert all("boolean mask" in why for why in f.traces.values())


def test_argument_trees_and_aliasing_key_the_traces(device):
    f = clops.jit(lambda xs, scale=1.0: xs[0] * scale + xs[1])
    a = clops.asarray(np.ones(3, np.float32), device=device)
    b = clops.asarray(np.full(3, 2.0, np.float32), device=device)
    np.testing.assert_array_equal(np.asarray(f((a, b))), [3, 3, 3])
    np.testing.assert_array_equal(np.asarray(f((a, a))), [2, 2, 2])  # aliased: own trace
    np.testing.assert_array_equal(np.asarray(f([b, a], scale=3.0)), [7, 7, 7])
    np.testing.assert_array_equal(np.asarray(f((b, b))), [4, 4, 4])
    assert len(f.traces) == 3


def test_lazy_work_from_before_the_call_is_not_replayed(device):
    x = clops.asarray(np.ones(4, np.float32), device=device)
    f = clops.jit(lambda t: t + 1)
    f(x)
    pending = x * 5  # lazy, reads x's memory
    f(x)
    np.testing.assert_array_equal(np.asarray(pending), [5, 5, 5, 5])


# -- random compositions of Array API ops ---------------------------------------------------------
# Each op maps (x, y) of shape (n, n) to a new x of that shape, values kept moderate.
_STEPS = {
    "tanh": lambda x, y: clops.tanh(x),
    "sin": lambda x, y: clops.sin(x),
    "abs": lambda x, y: clops.abs(x),
    "neg": lambda x, y: -x,
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
    "max": lambda x, y: clops.maximum(x, y),
    "where": lambda x, y: clops.where(x > 0, x, y),
    "matmul": lambda x, y: (x @ y) / x.shape[0],
    "transpose": lambda x, y: x.mT,
    "flip": lambda x, y: clops.flip(x, axis=0),
    "roll": lambda x, y: clops.roll(x, 3, axis=1),
    "center": lambda x, y: x - clops.mean(x, axis=0, keepdims=True),
    "scale": lambda x, y: x / (clops.max(clops.abs(x), axis=1, keepdims=True) + 1),
    "softmax": lambda x, y: clops.nn.softmax(x),
    "cumsum": lambda x, y: clops.cumulative_sum(x, axis=1) / x.shape[1],
    "sort": lambda x, y: clops.sort(x, axis=1),
    "concat_slice": lambda x, y: clops.concat([x, y], axis=0)[::2],
    "setitem": lambda x, y: _set_row(x, y),
    "fft": lambda x, y: clops.real(clops.fft.fft(clops.astype(x, clops.complex64))) / x.shape[1],
}


def _set_row(x, y):
    x = clops.asarray(x, copy=True)
    x[1] = y[0]
    return x


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(st.sampled_from(sorted(_STEPS)), min_size=1, max_size=5),
       n=st.sampled_from([8, 64]), seed=st.integers(0, 2**16))
def test_random_compositions_jit_equals_eager(device, steps, n, seed):
    def fn(x, y):
        for s in steps:
            x = _STEPS[s](x, y)
        return x, clops.sum(x, axis=0)

    jitted = clops.jit(fn)
    rng = np.random.default_rng(seed)
    for call in range(3):
        a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        got = jitted(clops.asarray(a, device=device), clops.asarray(b, device=device))
        want = fn(clops.asarray(a, device=device), clops.asarray(b, device=device))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5,
                                       equal_nan=True, err_msg=f"{steps}: call {call}")


def test_outputs_made_by_the_call_are_new_every_call(device):
    f = clops.jit(lambda x: (clops.empty(3, device=x.device), x + 1))
    x = clops.asarray(np.zeros(3, np.float32), device=device)
    (e1, _), (e2, _) = f(x), f(x)
    assert e1.buffer is not e2.buffer
