"""The on-device sampler: argmax, and draws whose frequencies follow the filtered distribution
(temperature, top-k, top-p, min-p, repetition penalty), repeatable by seed."""

from __future__ import annotations

import numpy as np
import pytest

from clops.kernels import sample

DRAWS = 3000


def _draw(device, logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, penalty=1.0,
          seed=1, seen=None, draws=DRAWS):
    v = logits.size
    dev = device

    def up(a):
        b = dev.alloc(max(a.nbytes, 4))
        dev.write(b, a, blocking=True)
        return b

    tokens = up(np.zeros(draws + 2, np.int32))
    state = up(np.zeros(4, np.int32))
    seen_b = up(np.zeros(v, np.uint8) if seen is None else seen.astype(np.uint8))
    lg = up(logits.astype(np.float32))
    z = dev.alloc(v * 4)
    ln = sample.sample(dev, tokens, state, seen_b, lg, 0, z, vocab=v, advance=1,
                       temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       penalty=penalty, seed=seed)
    for _ in range(draws):
        ln.run(dev)
        if penalty == 1.0 and seen is None:
            continue
        dev.write(seen_b, np.zeros(v, np.uint8) if seen is None else seen.astype(np.uint8),
                  blocking=True)
    out = np.empty(draws + 2, np.int32)
    dev.read(out, tokens)
    return out[1:draws + 1]


def _freq(ids, v):
    return np.bincount(ids, minlength=v) / ids.size


LOGITS = np.array([2.0, 1.0, 0.5, 3.0, -1.0, 0.0, 2.5, -3.0, 1.5, 0.2] * 3, np.float32)
LOGITS[10:] -= 2.0


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def test_greedy_is_first_argmax(device):
    lg = np.zeros(1000, np.float32)
    lg[[17, 500]] = 5.0
    ids = _draw(device, lg, temperature=0.0, draws=3)
    assert (ids == 17).all()


def _first_argmax_ignoring_nan(lg: np.ndarray) -> int:
    """The sampler's greedy choice: the first index of the largest value that is not NaN
    (-inf counts), the last index where every value is NaN."""
    ok = ~np.isnan(lg)
    if not ok.any():
        return lg.size - 1
    return int(np.flatnonzero(ok & (lg == lg[ok].max()))[0])


@pytest.mark.parametrize("v", [1, 7, 255, 257, 4099, 49152, 151936])
@pytest.mark.parametrize("kind", ["normal", "ties", "special", "penalty"])
def test_greedy_matches_numpy(device, v, kind):
    rng = np.random.default_rng(v)
    lg = (rng.standard_normal(v) * 4).astype(np.float32)
    seen, penalty = None, 1.0
    if kind == "ties":
        lg = np.minimum(np.round(lg), 2).astype(np.float32)  # the largest tied: the first wins
    elif kind == "special":
        lg[rng.random(v) < 0.3] = np.nan
        lg[rng.random(v) < 0.3] = -np.inf
        if v == 7:
            lg[:] = np.nan
        elif v == 255:
            lg[::2] = np.nan
            lg[1::2] = -np.inf
    elif kind == "penalty":
        seen = rng.random(v) < 0.5
        penalty = 1.7
    ref = lg.copy()
    if seen is not None:
        ref[seen] = np.where(ref[seen] > 0, ref[seen] / penalty, ref[seen] * penalty)
    got = _draw(device, lg, temperature=0.0, penalty=penalty, seen=seen, draws=1)
    assert got[0] == _first_argmax_ignoring_nan(ref)


@pytest.mark.parametrize("v", [4099, 49152])
def test_greedy_row_at_an_offset_moves_state_on(device, v):
    """The argmax over several work-groups of the logits row at l_off goes to tokens[state[0] +
    advance]; state[0] moves on by advance and the work-groups' ticket (state[3]) is left zero,
    launch after launch."""
    rng = np.random.default_rng(v)
    rows = (rng.standard_normal((3, v)) * 4).astype(np.float32)
    dev = device
    lg = dev.alloc(rows.nbytes)
    dev.write(lg, rows, blocking=True)
    tokens = dev.alloc(64 * 4)
    dev.write(tokens, np.full(64, -1, np.int32), blocking=True)
    state = dev.alloc(16)
    dev.write(state, np.array([5, 0, 0, 0], np.int32), blocking=True)
    seen = dev.alloc(v)
    dev.write(seen, np.zeros(v, np.uint8), blocking=True)
    z = dev.alloc(v * 4)
    ln = sample.sample(dev, tokens, state, seen, lg, 2 * v, z, vocab=v, advance=3,
                       temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, penalty=1.0, seed=0)
    if device.caps.compute_units >= 2:  # (several work-groups: the greedy kernel)
        assert ln.name == "greedy" and ln.global_size[0] > ln.local_size[0]
    for _ in range(4):
        ln.run(dev)
    got, st = np.empty(64, np.int32), np.empty(4, np.int32)
    dev.read(got, tokens)
    dev.read(st, state)
    assert st.tolist() == [5 + 4 * 3, 0, 0, 0]
    assert got[[8, 11, 14, 17]].tolist() == [int(np.argmax(rows[2]))] * 4


def test_temperature_top_k(device):
    p = _softmax(LOGITS / 0.7)
    keep = np.nonzero(LOGITS >= np.sort(LOGITS)[-5])[0]  # ties with the 5th stay
    want = np.zeros_like(p)
    want[keep] = p[keep] / p[keep].sum()
    got = _freq(_draw(device, LOGITS, temperature=0.7, top_k=5), LOGITS.size)
    assert got[np.setdiff1d(np.arange(LOGITS.size), keep)].sum() == 0
    np.testing.assert_allclose(got, want, atol=0.035)


def test_top_p_and_min_p(device):
    p = _softmax(LOGITS)
    order = np.argsort(-p)
    n = int(np.searchsorted(np.cumsum(p[order]), 0.6) + 1)
    keep = order[:n]
    got = _freq(_draw(device, LOGITS, top_p=0.6), LOGITS.size)
    assert set(np.nonzero(got)[0]) <= set(keep)
    want = np.zeros_like(p)
    want[keep] = p[keep] / p[keep].sum()
    np.testing.assert_allclose(got, want, atol=0.035)
    got = _freq(_draw(device, LOGITS, min_p=0.3), LOGITS.size)
    assert set(np.nonzero(got)[0]) <= set(np.nonzero(p >= 0.3 * p.max())[0])


def test_repetition_penalty_and_seed(device):
    lg = np.array([3.0, 2.9, -1.0, 0.5], np.float32)
    seen = np.array([1, 0, 0, 0])
    assert (_draw(device, lg, temperature=0.0, penalty=1.3, seen=seen, draws=2) == 1).all()
    a = _draw(device, LOGITS, seed=5, draws=50)
    b = _draw(device, LOGITS, seed=5, draws=50)
    c = _draw(device, LOGITS, seed=6, draws=50)
    assert (a == b).all() and (a != c).any()


@pytest.mark.parametrize("v", [49152])
def test_large_vocabulary_top_k(device, v):
    rng = np.random.default_rng(0)
    lg = rng.standard_normal(v).astype(np.float32) * 3
    ids = _draw(device, lg, temperature=1.0, top_k=20, draws=200)
    assert set(ids) <= set(np.argsort(-lg)[:20])


def _row_stats(dev, logits):
    rows, v = logits.shape
    lg = dev.alloc(logits.nbytes)
    dev.write(lg, np.ascontiguousarray(logits, np.float32), blocking=True)
    st = dev.alloc(rows * 12)
    sample.row_stats(dev, st, lg, rows=rows, vocab=v).run(dev)
    out = np.empty((rows, 3), np.float32)
    dev.read(out, st)
    return out[:, 0].copy().view(np.int32), out[:, 1], out[:, 2]


@pytest.mark.parametrize("v", [1, 7, 1000, 49152])
def test_row_stats_are_numpys_argmax_max_and_logsumexp(device, v):
    rng = np.random.default_rng(v)
    x = (rng.standard_normal((5, v)) * 8).astype(np.float32)
    x[1] = np.round(x[1])  # many ties: the first index wins, as numpy's argmax
    x[2, v // 2:] = x[2].max()  # the largest value repeated to the end
    x[3] = -3e38  # one value everywhere, huge
    x[4, : v // 3] = -np.inf
    arg, mx, lse = _row_stats(device, x)
    ref = x.astype(np.float64)
    assert arg.tolist() == np.argmax(x, axis=1).tolist()
    assert mx.tolist() == x.max(axis=1).tolist()
    top = ref.max(axis=1, keepdims=True)
    want = top[:, 0] + np.log(np.exp(ref - top).sum(axis=1))
    np.testing.assert_allclose(lse, want, rtol=1e-6, atol=1e-5)


def test_row_stats_flag_rows_the_host_must_read(device):
    x = np.zeros((2, 300), np.float32)
    x[0, 17] = np.nan
    x[1] = -np.inf
    arg, _, lse = _row_stats(device, x)
    assert np.isnan(lse[0])  # a NaN logit: the row is read and chosen on the host
    assert arg[1] == 300 and not np.isfinite(lse[1])  # no finite logit: no argmax


def _head_case(device, v, k, *, norm, penalty=1.0, seen=None, rng, w=None, x=None,
               groups=None, ptx=None, advance=1, start=0):
    """head_greedy on random float16 weights [v, k] and a row x: (logits, token, state)."""
    from clops.nn.quant import DeviceWeight

    dev = device
    if w is None:
        w = (rng.standard_normal((v, k)) * 0.5).astype(np.float16)
    if x is None:
        x = rng.standard_normal(k).astype(np.float32)
    nw = (rng.random(k) + 0.5).astype(np.float32)

    def up(a):
        b = dev.alloc(max(a.nbytes, 4))
        dev.write(b, np.ascontiguousarray(a), blocking=True)
        return b

    wb = DeviceWeight.from_buffer(dev, up(w), "f16", v, k)
    xs = np.concatenate([rng.standard_normal(k).astype(np.float32), x])  # (row at x_off k)
    xb, nwb = up(xs), up(nw)
    tokens = up(np.full(16, -1, np.int32))
    state = up(np.array([start, 0, 0, 0], np.int32))
    seen_b = up(np.zeros(v, np.uint8) if seen is None else seen.astype(np.uint8))
    logits = up(np.full(v + 8, 7.0, np.float32))
    z = dev.alloc(v * 4)
    ln = sample.head_greedy(dev, tokens, state, seen_b, logits, 8, z, xb, k, wb,
                            (nwb, 1e-5) if norm else None, advance=advance, penalty=penalty,
                            groups=groups, ptx=ptx)
    ln.run(dev)
    got, tok, st = np.empty(v + 8, np.float32), np.empty(16, np.int32), np.empty(4, np.int32)
    dev.read(got, logits)
    dev.read(tok, tokens)
    dev.read(st, state)
    assert (got[:8] == 7.0).all()  # (nothing written before l_off)
    xr = x.astype(np.float64)
    if norm:
        xr = xr * nw / np.sqrt(np.mean(xr * xr) + 1e-5)
    with np.errstate(invalid="ignore"):  # (inf - inf: a NaN row, as the kernel's)
        ref = w.astype(np.float64) @ xr
    return got[8:], ref, tok, st


def _ptx_choices(device):
    from clops.kernels import launch

    return [False] + ([True] if not launch.is_cpu(device) and device.probe("nvidia_ptx") else [])


@pytest.mark.parametrize("v,k,groups", [(64, 256, None), (1000, 512, 3), (4099, 256, None),
                                        (49152, 2048, None), (5000, 2048, 1), (3000, 4096, 5)])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.standin  # (head_greedy: GPUs' kernel; a CPU runs it here as their stand-in)
def test_head_greedy_logits_and_token(device, v, k, groups, norm):
    """The LM head kernel's logits match float64 numpy, and its token is the first argmax of
    the logits it wrote, at tokens[state[0] + advance]; the ticket state[3] is left zero."""
    for ptx in _ptx_choices(device):
        rng = np.random.default_rng(v + k)
        got, ref, tok, st = _head_case(device, v, k, norm=norm, rng=rng, groups=groups,
                                       ptx=ptx, advance=2, start=3)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
        assert tok[5] == _first_argmax_ignoring_nan(got)
        assert st.tolist() == [5, 0, 0, 0]


@pytest.mark.parametrize("kind", ["ties", "penalty", "nan"])
@pytest.mark.standin
def test_head_greedy_ties_penalty_and_nan(device, kind):
    """First index on ties (rows in different work-groups), the repetition penalty as
    ``greedy`` applies it, and a NaN logit never chosen."""
    v, k = 3000, 256
    for ptx in _ptx_choices(device):
        rng = np.random.default_rng(7)
        w = (rng.standard_normal((v, k)) * 0.1).astype(np.float16)
        x = np.abs(rng.standard_normal(k)).astype(np.float32)
        seen, penalty = None, 1.0
        if kind == "ties":
            w[[40, 1500, 2990]] = np.float16(1.0)  # (the largest logits, equal)
        elif kind == "penalty":
            w[[40, 2990]] = np.float16(1.0)
            w[1500] = np.float16(0.9)
            seen, penalty = np.zeros(v, bool), 1.5
            seen[40] = seen[2990] = True  # (penalized below row 1500)
        else:
            w[40, 0] = np.float16(np.inf)
            w[40, 1] = np.float16(-np.inf)  # (row 40: NaN)
            w[900] = np.float16(1.0)
        got, ref, tok, _ = _head_case(device, v, k, norm=False, rng=rng, w=w, x=x,
                                      seen=seen, penalty=penalty, groups=7, ptx=ptx)
        want = {"ties": 40, "penalty": 1500, "nan": 900}[kind]
        assert tok[1] == want
        if kind == "nan":
            assert np.isnan(got[40])
