"""Benchmark: the hand-written kernels against their peers, same device, same run: GEMM
(float32 and float16, clops.matmul) beside PyTorch (TF32 off) or numpy, also of shapes the
tiled kernels do not take (gemm_any, beside the generated kernel it replaced); GEMV of float16,
Q8_0, Q4_0 and Q4_1 weights (one decode row) beside the copy bandwidth; attention decode and prefill
beside PyTorch's scaled_dot_product_attention. Prints a table and writes JSON.

    python bench/bench_kernels.py [--device gpu] [--size 4096] [--json bench/results/kernels.json]

A lone decode row's expert products (``--only experts``; a Qwen3-30B-A3B layer's, each
``--qx`` geometry beside the launcher's):

    python bench/bench_kernels.py --device gpu --only experts --gemv-kinds Q4_0,Q8_0 \
        --qx "16,32,1,4,1,0;..."

One decode row's fused attention at several positions, with each count of query heads a
work-group (``--only decode_rope``; ``attention.attn_decode_rope``'s NREP):

    python bench/bench_kernels.py --device gpu --only decode_rope --positions 176,4096

The decode products of an 8B body, each quantized row also with other geometries of the GPUs'
int8 path (``--qx``: LSIZE, NCOL, CPT, UNR, CB, PIPE of ``matmul.qx_geometry``):

    python bench/bench_kernels.py --device gpu --only gemv --gemv-kinds Q8_0,Q4_0 \
        --gemv-shapes 6144x4096,4096x4096,28672x4096,4096x14336 --qx "64,16,1,4,1,1;..."

What a large model's prompt and batched steps pay (``--only dequant,rows``): the conversion of
a quantized weight to float16 rows for a prompt chunk's tensor-core product, where its float16
copy is not kept, and the batched engine's row-invariant product of 1-64 rows:

    python bench/bench_kernels.py --device gpu --only dequant,rows --gemv-kinds Q8_0,Q4_0
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from common import (  # noqa: E402
    back_to_back_ms,
    copies_for,
    copy_calls,
    copy_ceiling,
    device_ms,
    environment,
    same_size_copy_ms,
    table,
    torch_back_to_back_ms,
    torch_cuda,
    torch_ms,
    write_json,
)
from standin_gguf import _random_blocks  # noqa: E402

import clops  # noqa: E402
import clops.nn as nn  # noqa: E402
from clops.kernels import attention, gemm, matmul  # noqa: E402
from clops.kernels.launch import LaunchPlan  # noqa: E402

GGML = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_XS": 23,
        "MXFP4": 39}
# the blocks of 256 values: bytes, and where their half (d, dmin) scales lie
K_QUANTS = {"Q4_K": (144, 0, 2), "Q5_K": (176, 0, 2), "Q6_K": (210, 208, None),
            "IQ4_XS": (136, 0, None)}


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def bench_gemm(dev, size: int, dtype: str, torch, repeat: int) -> list[dict]:
    rng = np.random.default_rng(0)
    m = n = k = size
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    ta = clops.asarray(a, device=dev).realize()
    tb = clops.asarray(b, device=dev).realize()
    flops = 2.0 * m * n * k
    rows = []
    variants = [("clops.matmul", lambda: clops.matmul(ta, tb).realize())]
    tc = clops.empty((m, n), dtype=getattr(clops, dtype), device=dev).realize()
    for d in (16, 32):
        if dev.kind == "cpu" or (d == gemm.TILED_DEPTH and not gemm.use_mma(dev, dtype)):
            continue

        def portable(d=d) -> None:
            gemm.gemm(dev, tc.buffer, tc.offset, n, ta.buffer, ta.offset, k, tb.buffer, tb.offset,
                   n, m, n, k, dtype, portable=True, tiled_depth=d)
        variants.append((f"portable kernel, depth {d}", portable))
    if gemm.use_mma(dev, dtype):
        for d in (32, 64):  # the older tensor-core kernel (plain loads, no cp.async)

            def mma(d=d) -> None:
                gemm.gemm(dev, tc.buffer, tc.offset, n, ta.buffer, ta.offset, k, tb.buffer,
                       tb.offset, n, m, n, k, dtype, mma_depth=d)
            variants.append((f"tensor cores, gemm_mma depth {d}", mma))

        def mma_async() -> None:  # the mma.sync kernel fed by cp.async (any NVIDIA since sm_80)
            gemm.gemm(dev, tc.buffer, tc.offset, n, ta.buffer, ta.offset, k, tb.buffer,
                      tb.offset, n, m, n, k, dtype, mma_config=gemm.MMA_CONFIGS[0])
        variants.append(("tensor cores, gemm_mma_async (mma.sync)", mma_async))
    if dtype == "float16" and gemm.use_wgmma(dev):
        tma = gemm.TMA_CONFIGS if gemm.tma_builds(dev) else []
        # Hopper's wgmma, each tile shape and copy; one with producer warps both persistent
        # and a tile a work-group
        cfgs = [c for c0 in tma + gemm.WGMMA_CONFIGS for c in (
            [c0, dict(c0, PERSIST=int(not c0.get("PERSIST")))] if c0.get("WS") else [c0])]
        for cfg in cfgs:
            if m % cfg["BM"] or n % cfg["BN"] or k % cfg["BK"]:
                continue

            def wgmma(cfg=cfg) -> None:
                gemm.gemm(dev, tc.buffer, tc.offset, n, ta.buffer, ta.offset, k, tb.buffer,
                          tb.offset, n, m, n, k, dtype, mma_config=cfg)
            how = ("TMA copies" if cfg.get("TMA") else f"{cfg['WS']} producer warps"
                   if cfg.get("WS") else "no producer warps")
            how += ", persistent" if cfg.get("PERSIST") else ""
            variants.append((f"tensor cores, gemm_wgmma {cfg['BM']}x{cfg['BN']}, {how}", wgmma))
    peer_ms, peer = None, "numpy"
    ref = None
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        xa, xb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        peer_ms = torch_ms(torch, lambda: xa @ xb, repeat)
        peer = "PyTorch" + (" (TF32 off)" if dtype == "float32" else "")
        ref = (xa.double() @ xb.double()).cpu().numpy() if size <= 4096 else None
    else:
        times = []
        for _ in range(max(3, repeat // 2)):
            t0 = time.perf_counter()
            a @ b
            times.append((time.perf_counter() - t0) * 1e3)
        peer_ms = statistics.median(times)
        peer = f"numpy {dtype}"
        ref = a.astype(np.float64) @ b.astype(np.float64) if size <= 2048 else None
    for label, fn in variants:
        ms, wall = device_ms(dev, fn, repeat)
        err = None
        if ref is not None:
            got = clops.matmul(ta, tb) if label == "clops.matmul" else tc
            err = rel_err(np.asarray(got), ref)
        rows.append({"kernel": f"GEMM {dtype} {m}^3 ({label})", "ms": ms, "wall_ms": wall,
                     "tflops": flops / ms / 1e9, "peer": peer, "peer_ms": peer_ms,
                     "peer_tflops": flops / peer_ms / 1e9 if peer_ms else None,
                     "x_peer": peer_ms / ms if peer_ms else None, "rel_err": err})
    return rows


def _weight(dev, kind: str, n: int, k: int):
    rng = np.random.default_rng(1)
    if kind in ("f16", "f32"):
        return nn.quantized(rng.standard_normal((n, k)).astype(np.float32) * 0.05, fmt=kind,
                            device=dev)
    if kind in K_QUANTS:  # random blocks, sane super-block scales
        bb, d_at, dmin_at = K_QUANTS[kind]
        kr = rng.integers(0, 256, (n, k // 256, bb), dtype=np.uint8)
        kr[..., d_at:d_at + 2] = np.full((n, k // 256, 1), 0.001, np.float16).view(np.uint8)
        if dmin_at is not None:
            kr[..., dmin_at:dmin_at + 2] = np.full((n, k // 256, 1), 0.002,
                                                   np.float16).view(np.uint8)
        return nn.quantized(kr.reshape(n, -1), ggml_type=GGML[kind], shape=(n, k), device=dev)
    if kind == "MXFP4":  # random values, exponents of gpt-oss's weights (2^-10 .. 2^-4)
        raw = rng.integers(0, 256, (n * k // 32, 17), dtype=np.uint8)
        raw[:, 0] = rng.integers(118, 125, n * k // 32)
        return nn.quantized(raw.reshape(n, -1), ggml_type=GGML[kind], shape=(n, k), device=dev)
    bsize = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[kind]
    raw = np.frombuffer(_random_blocks(kind, n * k // 32 * bsize, rng), np.uint8)
    return nn.quantized(raw.reshape(n, -1), ggml_type=GGML[kind], shape=(n, k), device=dev)


def bench_gemv(dev, n: int, k: int, kind: str, ceiling: float, b2b_ceiling: float, torch,
               repeat: int, xmode: str = "plain") -> dict:
    """One decode row's product; ``xmode`` as a decode step launches it: ``plain`` x, ``norm``
    (RMSNorm(x) * weight in place of x: QKV, [gate | up]) or ``glu`` (x of 2k values, silu(gate)
    * up in place of x: down), the last two where ``matmul.fused_prologues`` holds."""
    w = _weight(dev, kind, n, k)
    rng = np.random.default_rng(2)
    x = clops.asarray(rng.standard_normal((1, 2 * k if xmode == "glu" else k))
                      .astype(np.float32), device=dev).realize()
    y = clops.empty((1, n), dtype=clops.float32, device=dev).realize()
    kw: dict = {}
    if xmode == "norm":
        nw = clops.asarray(rng.standard_normal(k).astype(np.float32), device=dev).realize()
        kw["norm"] = (nw.buffer, 1e-5)
    elif xmode == "glu":
        kw["glu"] = True
    ln = matmul.matmul(dev, y.buffer, y.offset, n, x.buffer, x.offset, k, w, 1, **kw)
    ms, wall = device_ms(dev, lambda: ln.run(dev), repeat)
    nbytes = w.nbytes + 4 * (n + k)
    label = f"GEMV {kind} {n}x{k}" + ("" if xmode == "plain" else f" {xmode}")
    row = {"kernel": label, "ms": ms, "wall_ms": wall, "gbps": nbytes / ms / 1e6,
           "of_copy": nbytes / ms / 1e6 / ceiling,
           "of_same_size_copy": same_size_copy_ms(dev, nbytes, repeat) / ms}
    # Back to back, as in a decode step: launch plans (no events) over copies of the weights
    # that do not fit in the caches together, beside copy kernels of the same bytes.
    copies = copies_for(w.nbytes)
    plans = []
    for i in range(copies):
        wi = w if i == 0 else _weight(dev, kind, n, k)
        plan = LaunchPlan(dev)
        plan.add(matmul.matmul(dev, y.buffer, y.offset, n, x.buffer, x.offset, k, wi, 1, **kw))
        plans.append((plan, wi))
    b2b = back_to_back_ms(dev, [lambda p=p: p.replay() for p, _ in plans])
    row.update(b2b_ms=b2b, b2b_gbps=nbytes / b2b / 1e6,
               b2b_of_copy=nbytes / b2b / 1e6 / b2b_ceiling,
               b2b_of_same_size_copy=back_to_back_ms(dev, copy_calls(dev, nbytes, copies)) / b2b,
               weight_copies=copies)
    del plans
    if torch is not None:
        wts = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(copies)]
        xt = torch.randn(1, k, device="cuda", dtype=torch.float16)
        F = torch.nn.functional
        pm = torch_ms(torch, lambda: F.linear(xt, wts[0]), repeat)
        pb = torch_back_to_back_ms(torch, [lambda t=t: F.linear(xt, t) for t in wts])
        row.update(peer="PyTorch float16 GEMV, same shape", peer_ms=pm,
                   peer_gbps=(2 * n * k) / pm / 1e6, peer_b2b_ms=pb,
                   peer_b2b_gbps=(2 * n * k) / pb / 1e6)
    return row


def bench_dequant(dev, n: int, k: int, kind: str, ceiling: float, repeat: int) -> dict:
    """``matmul.dequant_half`` of an n x k weight: what a prompt chunk pays for each matrix
    whose float16 copy is not kept (``model.HALF_COPIES_FRACTION``); bytes read and written
    beside the copy bandwidth."""
    w = _weight(dev, kind, n, k)
    if w.layout != "rows":  # (CPUs' layouts: their prompts take no tensor-core product)
        return {"kernel": f"dequant_half {kind} {n}x{k}", "ms": float("nan"),
                "of_copy": float("nan"), "error": f"weights in the {w.layout} layout here"}
    out = dev.alloc(n * k * 2)
    ln = matmul.dequant_half(dev, out, w)
    ms, wall = device_ms(dev, lambda: ln.run(dev), repeat)
    nbytes = w.nbytes + 2 * n * k
    return {"kernel": f"dequant_half {kind} {n}x{k}", "ms": ms, "wall_ms": wall,
            "gbps": nbytes / ms / 1e6, "of_copy": nbytes / ms / 1e6 / ceiling}


def bench_rows(dev, n: int, k: int, kind: str, m: int, ceiling: float, repeat: int,
               route: str = "float") -> dict:
    """The batched engine's product of ``m`` rows: ``float``, ``matmul.matmul`` with
    ``row_invariant`` (float rows); ``int8``, ``matmul.matmul_qrows`` (the rows quantized, then
    int8 products; both launches timed), as ``step.StepBuilder._matmul`` launches them: weight
    bytes a call beside the copy bandwidth, and TFLOP/s."""
    w = _weight(dev, kind, n, k)
    rng = np.random.default_rng(2)
    x = clops.asarray(rng.standard_normal((m, k)).astype(np.float32), device=dev).realize()
    y = clops.empty((m, n), dtype=clops.float32, device=dev).realize()
    if route == "int8":
        lns = matmul.matmul_qrows(dev, y.buffer, y.offset, n, x.buffer, x.offset, k, w, m,
                                  matmul.qrows_scratch(dev, m, k))
    else:
        lns = [matmul.matmul(dev, y.buffer, y.offset, n, x.buffer, x.offset, k, w, m,
                             row_invariant=True)]
    ms, wall = device_ms(dev, lambda: [ln.run(dev) for ln in lns], repeat)
    label = f"rows {kind} {n}x{k} m{m}" + (" int8" if route == "int8" else "")
    if route == "int8":
        mma = matmul.qmma_geometry(dev, w)
        label += (" qmma " + ",".join(map(str, mma)) if mma is not None
                  else " qrows " + ",".join(map(str, matmul.qrows_geometry(dev, w))))
    return {"kernel": label, "ms": ms, "wall_ms": wall,
            "gbps": w.nbytes / ms / 1e6, "of_copy": w.nbytes / ms / 1e6 / ceiling,
            "tflops": 2 * m * n * k / ms / 1e9, "global_size": list(lns[-1].global_size)}


def bench_attention(dev, torch, repeat: int, ceiling: float) -> list[dict]:
    rows = []
    h, kv, d = 32, 8, 64
    for L_ctx in (1024, 4096):
        max_seq = L_ctx
        rng = np.random.default_rng(3)
        kc = rng.standard_normal((kv, max_seq, d)).astype(np.float32)
        vc = rng.standard_normal((kv, max_seq, d)).astype(np.float32)
        q = rng.standard_normal((h, d)).astype(np.float32)
        tk, tv, tq = (clops.asarray(a, device=dev).realize() for a in (kc, vc, q))
        out = clops.empty((h, d), dtype=clops.float32, device=dev).realize()
        part = dev.alloc(attention.part_nbytes(dev, max_seq, h, d))
        state = clops.asarray(np.array([L_ctx - 1, 0], np.int32), device=dev).realize()
        lns = attention.attn_decode(dev, out.buffer, part, tq.buffer, tk.buffer, tv.buffer,
                                    state.buffer, n_heads=h, n_kv=kv, head_dim=d,
                                    max_seq=max_seq, scale=1 / math.sqrt(d))

        def run(lns=lns) -> None:
            for ln in lns:
                ln.run(dev)
        ms, wall = device_ms(dev, run, repeat)
        # reference
        kr, vr = np.repeat(kc, h // kv, 0), np.repeat(vc, h // kv, 0)
        s = np.einsum("hd,hld->hl", q, kr) / math.sqrt(d)
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        err = rel_err(np.asarray(out), np.einsum("hl,hld->hd", p, vr))
        nbytes = 2 * kv * L_ctx * d * 4
        row = {"kernel": f"attention decode H{h}/KV{kv} D{d} L{L_ctx}", "ms": ms,
               "wall_ms": wall, "gbps": nbytes / ms / 1e6, "of_copy": nbytes / ms / 1e6 / ceiling,
               "rel_err": err}
        if torch is not None:
            sdpa = torch.nn.functional.scaled_dot_product_attention
            qt = torch.from_numpy(q).cuda().view(1, h, 1, d)
            kt = torch.from_numpy(kc).cuda().view(1, kv, max_seq, d)
            vt = torch.from_numpy(vc).cuda().view(1, kv, max_seq, d)
            pm = torch_ms(torch, lambda qt=qt, kt=kt, vt=vt, f=sdpa: f(qt, kt, vt, enable_gqa=True),
                          repeat)
            row.update(peer="PyTorch SDPA float32", peer_ms=pm, x_peer=pm / ms)
        rows.append(row)
    # prefill: causal attention over a prompt
    m = 512
    rng = np.random.default_rng(4)
    q = rng.standard_normal((m, h, d)).astype(np.float32)
    k = rng.standard_normal((m, kv, d)).astype(np.float32)
    v = rng.standard_normal((m, kv, d)).astype(np.float32)
    tq, tk, tv = (clops.asarray(a, device=dev).realize() for a in (q, k, v))
    fn = lambda: nn.scaled_dot_product_attention(tq, tk, tv, causal=True).realize()  # noqa: E731
    ms, wall = device_ms(dev, fn, repeat)
    row = {"kernel": f"attention prefill causal M{m} H{h}/KV{kv} D{d}", "ms": ms, "wall_ms": wall,
           "tflops": 2 * 2 * m * m / 2 * h * d / ms / 1e9}
    if torch is not None:
        F = torch.nn.functional
        qt = torch.from_numpy(q).cuda().permute(1, 0, 2)[None]
        kt = torch.from_numpy(k).cuda().permute(1, 0, 2)[None]
        vt = torch.from_numpy(v).cuda().permute(1, 0, 2)[None]
        pm = torch_ms(torch, lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True,
                                                                   enable_gqa=True), repeat)
        row.update(peer="PyTorch SDPA float32", peer_ms=pm, x_peer=pm / ms)
    rows.append(row)
    return rows


# decode attention shapes (query heads, key-value heads, head dim, QK-norm): Qwen3-30B-A3B,
# Llama 3 8B, Qwen3-0.6B, Llama 3.2 1B
ROPE_SHAPES = [(32, 4, 128, True), (32, 8, 128, False), (16, 8, 128, True), (32, 8, 64, False)]


def _put(dev, a: np.ndarray):
    """``a`` on ``dev``, realized."""
    return clops.asarray(a, device=dev).realize()


def bench_decode_rope(dev, repeat: int, positions: list[int], nreps: list[int],
                      shapes=ROPE_SHAPES) -> list[dict]:
    """One decode row's fused attention (``attention.attn_decode_rope``: rotation, the
    float16 cache's store and attention in one launch) as a decode step launches it, back to
    back over copies of a layer's cache, at each row position and each NREP (query heads a
    work-group; 0: the launcher's choice). Every NREP's output is checked against NREP 1's."""
    rows = []
    rng = np.random.default_rng(5)
    for h, kv, d, qk in shapes:
        for L in positions:
            max_seq = max(L + 1, 64)
            span = 1 << max(6, L.bit_length())
            nbytes_kv = 2 * kv * L * d * 2
            copies = copies_for(2 * attention.kv_nbytes(kv, max_seq, d, True), 8)
            layers = []
            for _ in range(copies):
                kc = dev.alloc(attention.kv_nbytes(kv, max_seq, d, True))
                vc = dev.alloc(attention.kv_nbytes(kv, max_seq, d, True))
                for c in (kc, vc):
                    dev.write(c, rng.standard_normal(kv * max_seq * d).astype(np.float16),
                              blocking=True)
                layers.append((kc, vc))
            qkv = _put(dev, rng.standard_normal((h + 2 * kv) * d).astype(np.float32))
            state = _put(dev, np.array([L - 1, 0], np.int32))
            inv_freq = _put(dev, (1e6 ** (-np.arange(0, d, 2) / d)).astype(np.float32))
            wq, wk = (_put(dev, 1 + 0.1 * rng.standard_normal(d).astype(np.float32)) for _ in "qk")
            count = _put(dev, np.zeros(h, np.int32))
            out = clops.empty((h, d), dtype=clops.float32, device=dev).realize()
            part = dev.alloc(attention.part_nbytes(dev, max_seq, h, d))
            ref = None
            for nrep in [1] + [r for r in nreps if r != 1]:
                attention.DECODE_NREP_OVERRIDE = nrep or None
                label = (f"decode rope H{h}/KV{kv} D{d}{' qk' if qk else ''} L{L} "
                         f"nrep {nrep or 'auto'}")
                try:
                    plans = []
                    for kc, vc in layers:
                        plan = LaunchPlan(dev)
                        for ln in attention.attn_decode_rope(
                                dev, out.buffer, part, count.buffer, qkv.buffer, kc, vc,
                                state.buffer, inv_freq.buffer, n_heads=h, n_kv=kv, head_dim=d,
                                max_seq=max_seq, scale=1 / math.sqrt(d), neox=True,
                                positions=span, kv_half=True,
                                qk_norm=(wq.buffer, wk.buffer, 1e-6) if qk else None):
                            plan.add(ln)
                        plans.append(plan)
                except ValueError as e:
                    rows.append({"kernel": label, "error": str(e)[:200]})
                    continue
                finally:
                    attention.DECODE_NREP_OVERRIDE = None
                plans[0].replay()
                got = np.asarray(out).copy()
                if ref is None:
                    ref = got
                ms = back_to_back_ms(dev, [lambda p=p: p.replay() for p in plans])
                rows.append({"kernel": label, "b2b_ms": ms, "gbps": nbytes_kv / ms / 1e6,
                             "rel_err_vs_nrep1": rel_err(got, ref), "cache_copies": copies})
                print(label, f"{ms * 1e3:.1f} us", f"err {rows[-1]['rel_err_vs_nrep1']:.1e}",
                      flush=True)
            del layers
    return rows


def bench_experts(dev, repeat: int, geometries: list[tuple[int, ...]], kind: str = "Q4_0",
                  n_experts: int = 128, ffn: int = 768, dim: int = 2048, k: int = 8) -> list[dict]:
    """A lone decode row's expert products as the decode step launches them (a Qwen3-30B-A3B
    layer's by default): the [gate | up] products of its k slots with the pre-norm and the
    top-k folded in (``route=``), then the down products with the GLU folded in and the
    weighted sum into the residual (``slot_sum=``), back to back over router logits that pick
    other experts each call, at the launcher's geometry of the int8 path and at each of
    ``geometries`` (``matmul.qx_geometry``'s tuple). Each geometry's output is checked against
    the launcher's."""
    E, F = n_experts, ffn
    gu, down = _weight(dev, kind, E * 2 * F, dim), _weight(dev, kind, E * dim, F)
    if not matmul.int8_slots(dev, gu):
        return [{"kernel": f"experts {kind}", "error": "no int8 decode path on this device"}]
    rng = np.random.default_rng(6)
    x, nw = _put(dev, rng.standard_normal(dim).astype(np.float32)), \
        _put(dev, (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
    logits = [_put(dev, rng.standard_normal(E).astype(np.float32)) for _ in range(16)]
    ids, wts = dev.alloc(4 * k), dev.alloc(4 * k)
    count = _put(dev, np.zeros(dim, np.int32))
    gub, yd = dev.alloc(4 * k * 2 * F), dev.alloc(4 * k * dim)
    out = _put(dev, np.zeros(dim, np.float32))
    nbytes = {"gate_up": gu.nbytes // E * k, "down": down.nbytes // E * k}
    rows, ref = [], None
    for g in [None, *geometries]:
        matmul.QX_OVERRIDE = g  # type: ignore[assignment]
        label = f"experts {kind} E{E} k{k} {dim}/{F} qx " + \
            (",".join(map(str, g)) if g else "auto")
        try:
            plans: dict[str, list] = {"gate_up": [], "down": []}
            for lg in logits:
                p1, p2 = LaunchPlan(dev), LaunchPlan(dev)
                p1.add(matmul.matmul(dev, gub, 0, 2 * F, x.buffer, 0, 0, gu, k,
                                     experts=(ids, E), tm=1, norm=(nw.buffer, 1e-6),
                                     route=(lg.buffer, wts, True)))
                p2.add(matmul.matmul(dev, yd, 0, dim, gub, 0, 2 * F, down, k,
                                     experts=(ids, E), tm=1, glu=True,
                                     slot_sum=(out.buffer, wts, count.buffer, False)))
                plans["gate_up"].append(p1)
                plans["down"].append(p2)
            plans["gate_up"][0].replay()
            plans["down"][0].replay()
            got = np.asarray(out).copy()
        except Exception as e:  # noqa: BLE001 - a geometry that does not build or launch
            rows.append({"kernel": label, "error": str(e)[:300]})
            print(label, "error", str(e)[:120], flush=True)
            continue
        finally:
            matmul.QX_OVERRIDE = None
        if ref is None:
            ref = got
        row = {"kernel": label, "qx_geometry": list(g) if g else None,
               "rel_err_vs_auto": rel_err(got, ref)}
        for what, ps in plans.items():
            ms = back_to_back_ms(dev, [lambda p=p: p.replay() for p in ps])
            row[f"{what}_us"] = ms * 1e3
            row[f"{what}_gbps"] = nbytes[what] / ms / 1e6
        rows.append(row)
        print(label, f"gate_up {row['gate_up_us']:.1f} us down {row['down_us']:.1f} us",
              f"err {row['rel_err_vs_auto']:.1e}", flush=True)
    return rows


# a mixture of experts' layer: (label, experts, FFN width, hidden, experts a row)
XMMA_SHAPES = {"qwen3moe-a3b": (128, 768, 2048, 8), "gptoss20b": (32, 2880, 2880, 4)}


def bench_xmma(dev, repeat: int, kinds: list[str], shapes: list[str], m: int = 512,
               variants: list[dict[str, int]] | None = None) -> list[dict]:
    """A prompt chunk's expert products on the float16 tensor cores (``matmul.matmul_xmma``)
    as ``experts.ffn`` launches them for ``m`` rows routed at random: the [gate | up] product
    of the gathered float16 rows with the GLU in its epilogue, then the down product of its
    float16 rows; TFLOP/s of the live rows' products (padding slots not counted). Each of
    ``variants`` (more defines of xmma.cl, ``matmul.XMMA_DEFINES``) measured beside."""
    from clops.kernels import moe

    rows = []
    for shape in shapes:
        E, F, dim, top = XMMA_SHAPES[shape]
        rng = np.random.default_rng(3)
        ids = np.argsort(rng.random((m, E)), axis=1)[:, :top].astype(np.int32)
        t = matmul.XMMA_TILE
        p = moe.padded_rows(m, top, E, t)
        order, tile_e = np.full(p, -1, np.int32), np.full(p // t, -1, np.int32)
        at = 0
        for e in range(E):
            pairs = np.nonzero(ids.reshape(-1) == e)[0].astype(np.int32)
            if not len(pairs):
                continue
            order[at:at + len(pairs)] = pairs
            span = -(-len(pairs) // t) * t
            tile_e[at // t:(at + span) // t] = e
            at += span
        ob, tb = _put(dev, order), _put(dev, tile_e)
        xh = _put(dev, rng.standard_normal((m, dim)).astype(np.float16))
        h = dev.alloc(2 * p * F)
        yd = dev.alloc(4 * p * dim)
        flops = {"gate_up": 2.0 * m * top * 2 * F * dim, "down": 2.0 * m * top * F * dim}
        for kind, extra in ((kd, v) for kd in kinds for v in [{}, *(variants or [])]):
            label = f"xmma {shape} {kind} m{m}" + "".join(f" {d}={v}" for d, v in extra.items())
            matmul.XMMA_DEFINES = extra
            try:
                gu, down = _weight(dev, kind, E * 2 * F, dim), _weight(dev, kind, E * dim, F)
                lns = {"gate_up": matmul.matmul_xmma(dev, h, 0, F, xh.buffer, 0, dim, gu, p,
                                                     ob.buffer, (tb.buffer, E), gather=top,
                                                     glu_out=True, half_in=True),
                       "down": matmul.matmul_xmma(dev, yd, 0, dim, h, 0, F, down, p, ob.buffer,
                                                  (tb.buffer, E), half_in=True)}
            except Exception as e:  # noqa: BLE001 - a format the path does not take
                rows.append({"kernel": label, "error": str(e)[:300]})
                print(label, "error", str(e)[:120], flush=True)
                continue
            finally:
                matmul.XMMA_DEFINES = {}
            row: dict = {"kernel": label, "padded_rows": p}
            for what, ln in lns.items():
                ms = back_to_back_ms(dev, [lambda ln=ln: ln.run(dev)], count=16)
                row[f"{what}_us"] = ms * 1e3
                row[f"{what}_tflops"] = flops[what] / ms / 1e9
            row["ms"] = (row["gate_up_us"] + row["down_us"]) / 1e3
            row["tflops"] = sum(flops.values()) / row["ms"] / 1e9
            rows.append(row)
            print(label, f"gate_up {row['gate_up_us']:.0f} us ({row['gate_up_tflops']:.0f} "
                  f"TFLOP/s), down {row['down_us']:.0f} us ({row['down_tflops']:.0f})",
                  flush=True)
    return rows


# products gemm.cl's tiled kernels do not take, for gemm_any: (m, n, k, dtype, A transposed view)
ANY_SHAPES = [(64, 64, 500_000, "float32", True), (1000, 1000, 1000, "float32", False),
              (3000, 3000, 3000, "float32", False), (100, 4096, 4096, "float32", False),
              (1000, 1000, 1000, "float16", False), (200, 200, 200_000, "float16", True),
              (3000, 3000, 3000, "float16", False), (1536, 4000, 2500, "float16", False),
              (4000, 1000, 5000, "float16", True)]


def bench_gemm_any(dev, torch, repeat: int, shapes=ANY_SHAPES) -> list[dict]:
    """clops.matmul on products gemm.cl's tiled kernels do not take (gemm_any on GPUs; on CPUs
    gemm_cpu with B's columns padded) beside the generated kernel they replaced and PyTorch
    (TF32 off) or numpy; x.T @ x of a tall x reads the transposed view in place on GPUs."""
    rows = []
    rng = np.random.default_rng(0)
    for m, n, k, dtype, trans in shapes:
        a = (rng.standard_normal((k, m) if trans else (m, k)) / 8).astype(dtype)
        b = (rng.standard_normal((k, n)) / 8).astype(dtype)
        ta = clops.asarray(a, device=dev).realize()
        tb = clops.asarray(b, device=dev).realize()
        if trans:
            ta = clops.matrix_transpose(ta)
            a = a.T
        flops = 2.0 * m * n * k
        label = f"GEMM {dtype} {m}x{n}x{k}" + (" (A a transposed view)" if trans else "")
        if torch is not None:
            torch.backends.cuda.matmul.allow_tf32 = False
            xa, xb = torch.from_numpy(np.ascontiguousarray(a.T if trans else a)).cuda(), \
                torch.from_numpy(b).cuda()
            if trans:
                xa = xa.T
            peer_ms, peer = torch_ms(torch, lambda xa=xa, xb=xb: xa @ xb, repeat), "PyTorch"
        else:
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                a @ b
                times.append((time.perf_counter() - t0) * 1e3)
            peer_ms, peer = statistics.median(times), "numpy"
        want = a.astype(np.float64) @ b.astype(np.float64)
        names = ("ANY_MIN_MACS", "CPU_PAD_MIN", "PAD_MIN_MACS")
        saved = tuple(getattr(gemm, v) for v in names)
        never = 1 << 62
        # the generated kernel: neither gemm_any (GPUs) nor gemm_cpu's padded columns (CPUs);
        # and (float16 on tensor cores) gemm_any_mma where the padded copies would serve
        variants = [("clops.matmul", saved), ("generated kernel", (never, never, never))]
        if gemm.padded_shape(dev, dtype, m, n, k) is not None:
            variants.insert(1, ("gemm_any_mma, no padded copies", (saved[0], saved[1], never)))
        if dev.kind == "cpu" and n % gemm.CPU_COLS.get(dtype, 1) == 0:
            variants = variants[:1]  # gemm_cpu took it already: nothing replaced
        for variant, floors in variants:
            for name, v in zip(names, floors):
                setattr(gemm, name, v)
            try:
                ms, wall = device_ms(dev, lambda ta=ta, tb=tb: clops.matmul(ta, tb).realize(),
                                     repeat)
                err = rel_err(np.asarray(clops.matmul(ta, tb)), want)
            finally:
                for name, v in zip(names, saved):
                    setattr(gemm, name, v)
            if dev.kind == "cpu":  # PoCL's profiled kernel times disagree with the clock
                ms = wall
            rows.append({"kernel": f"{label} ({variant})", "ms": ms, "wall_ms": wall,
                         "tflops": flops / ms / 1e9, "peer": peer, "peer_ms": peer_ms,
                         "x_peer": peer_ms / ms, "rel_err": err})
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default=None)
    ap.add_argument("--size", type=int, default=None, help="GEMM size (4096 on GPUs)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", default="bench/results/kernels.json")
    ap.add_argument("--only", default="copy,gemm,gemm_any,gemv,attention")
    ap.add_argument("--gemm-dtypes", default="float32,float16")
    ap.add_argument("--gemv-shapes", default=None, metavar="NxK,...",
                    help="the GEMV rows' shapes (default: 8192x2048,2048x8192,32768x2048 on "
                    "GPUs; an 8B body's are 6144x4096,4096x4096,28672x4096,4096x14336)")
    ap.add_argument("--gemv-kinds", default="f16,Q8_0,Q4_0,Q4_1")
    ap.add_argument("--gemv-x", default="plain", choices=("plain", "norm", "glu"),
                    help="the GEMV rows' input as a decode step gives it: plain, norm "
                    "(RMSNorm folded in: QKV, [gate | up]) or glu (the GLU of 2K values "
                    "folded in: down)")
    ap.add_argument("--qx", default="", metavar="LS,NCOL,CPT,UNR,CB,PIPE;...",
                    help="also time the quantized GEMV rows with each of these geometries of "
                    "the int8 decode path (matmul.qx_geometry; GPUs where it runs)")
    ap.add_argument("--shapes", default=None, metavar="NxK,...",
                    help="the dequant and rows groups' weights (default: a 70B body's "
                    "28672x8192,8192x8192 on GPUs)")
    ap.add_argument("--qrows", default="", metavar="LS,NCOL,CPT,TM,UNR;...",
                    help="also time the rows group's int8 route with each of these geometries "
                    "of matmul_qrows (GPUs where it runs)")
    ap.add_argument("--qmma", default="", metavar="KS,RT;...",
                    help="also time the rows group's int8 route on the tensor cores "
                    "(matmul_qmma) with each of these geometries (GPUs where it runs)")
    ap.add_argument("--rows-m", default="1,2,16,64",
                    help="the rows group's batch rows (default: %(default)s)")
    ap.add_argument("--xmma-shapes", default="qwen3moe-a3b,gptoss20b",
                    help=f"--only xmma: layers of {', '.join(XMMA_SHAPES)}")
    ap.add_argument("--xmma-defines", default="", metavar="NAME=V,...;...",
                    help="--only xmma: each set of xmma.cl defines measured beside")
    ap.add_argument("--positions", default="176,1024,4096,16384",
                    help="the decode_rope group's row positions (default: %(default)s)")
    ap.add_argument("--nrep", default="0,1,2,4,8",
                    help="the decode_rope group's query heads a work-group (0: the launcher's "
                    "choice; default: %(default)s)")
    a = ap.parse_args(argv)
    dev = clops.device(a.device)
    gpu = dev.kind != "cpu"
    torch = torch_cuda() if gpu else None
    only = set(a.only.split(","))
    size = a.size or (4096 if gpu else 512)
    env = environment(dev)
    ceil = copy_ceiling(dev, (1 << 28) if gpu else (1 << 26), a.repeat)
    print(f"device: {env['device']} ({env['platform']}, driver {env['driver']}); "
          f"copy {ceil['gbps']:.0f} GB/s" + (f", PyTorch copy {ceil['torch_gbps']:.0f} GB/s"
                                            if "torch_gbps" in ceil else ""))
    rows: list[dict] = []
    if "gemv" in only:
        shapes = ([(8192, 2048), (2048, 8192), (32768, 2048)] if gpu else [(1536, 576),
                                                                            (2048, 2048)])
        if a.gemv_shapes:
            shapes = [(int(n), int(k)) for n, k in
                      (s.lower().split("x") for s in a.gemv_shapes.split(","))]
        geometries = [tuple(int(v) for v in g.split(",")) for g in a.qx.split(";") if g]
        for kind in a.gemv_kinds.split(","):
            for n, k in shapes:
                rows.append(bench_gemv(dev, n, k, kind, ceil["gbps"], ceil["b2b_gbps"], torch,
                                       a.repeat, a.gemv_x))
                if kind in ("f16", "f32") or not geometries or not gpu:
                    continue
                rows[-1]["qx_geometry"] = list(matmul.qx_geometry(dev, n, k, "q8" if kind ==
                                                                  "Q8_0" else "q4"))
                for g in geometries:  # the same row with another geometry of the int8 path
                    matmul.QX_OVERRIDE = g  # type: ignore[assignment]
                    try:
                        row = bench_gemv(dev, n, k, kind, ceil["gbps"], ceil["b2b_gbps"], None,
                                         a.repeat, a.gemv_x)
                    except Exception as e:  # noqa: BLE001 - a geometry that does not build
                        row = {"kernel": f"GEMV {kind} {n}x{k} {a.gemv_x}", "error": str(e)[:300]}
                    finally:
                        matmul.QX_OVERRIDE = None
                    row["kernel"] += f" qx {','.join(map(str, g))}"
                    row["qx_geometry"] = list(g)
                    rows.append(row)
                    print(row.get("kernel"), row.get("b2b_of_copy", row.get("error")),
                          flush=True)
    shapes8 = [(int(n), int(k)) for n, k in
               (v.lower().split("x") for v in a.shapes.split(","))] if a.shapes else \
        ([(28672, 8192), (8192, 8192)] if gpu else [(1536, 576), (2048, 2048)])
    if "dequant" in only:
        for kind in a.gemv_kinds.split(","):
            if kind in ("Q8_0", "Q4_0", "Q4_1"):
                for n, k in shapes8:
                    rows.append(bench_dequant(dev, n, k, kind, ceil["gbps"], a.repeat))
                    print(rows[-1]["kernel"], f"{rows[-1]['of_copy']:.2f} of copy", flush=True)
    if "rows" in only:
        for kind in a.gemv_kinds.split(","):
            if kind in ("Q8_0", "Q4_0", "Q4_1"):
                for n, k in shapes8:
                    for m in (int(v) for v in a.rows_m.split(",")):
                        routes = ["float"]
                        if matmul.int8_batch(dev, _weight(dev, kind, 32, k)):
                            routes += [None] + [g for g in a.qrows.split(";") if g]
                            routes += ["mma:" + g for g in a.qmma.split(";") if g]
                        for r in routes:
                            mma = r is not None and r.startswith("mma:")
                            geo = tuple(int(v) for v in r.removeprefix("mma:").split(",")) \
                                if r not in ("float", None) else None
                            matmul.QROWS_OVERRIDE = None if mma else geo  # type: ignore
                            matmul.QMMA_OVERRIDE = geo if mma else None  # type: ignore
                            try:
                                rows.append(bench_rows(dev, n, k, kind, m, ceil["gbps"],
                                                       a.repeat, "float" if r == "float"
                                                       else "int8"))
                            except Exception as e:  # noqa: BLE001 - a geometry that fails
                                rows.append({"kernel": f"rows {kind} {n}x{k} m{m} {r}",
                                             "error": str(e)[:300]})
                                print(rows[-1], flush=True)
                                continue
                            finally:
                                matmul.QROWS_OVERRIDE = matmul.QMMA_OVERRIDE = None
                            print(rows[-1]["kernel"], f"{rows[-1]['of_copy']:.2f} of copy",
                                  f"{rows[-1]['tflops']:.1f} TFLOP/s", flush=True)
    if "attention" in only:
        rows += bench_attention(dev, torch, a.repeat, ceil["gbps"])
    if "experts" in only:
        for kind in a.gemv_kinds.split(","):
            if kind in ("Q4_0", "Q8_0"):
                rows += bench_experts(dev, a.repeat, [tuple(int(v) for v in g.split(","))
                                                      for g in a.qx.split(";") if g], kind)
    if "xmma" in only:
        rows += bench_xmma(dev, a.repeat, a.gemv_kinds.split(","), a.xmma_shapes.split(","),
                           variants=[{d: int(v) for d, v in (kv.split("=") for kv in
                                                             g.split(","))}
                                     for g in a.xmma_defines.split(";") if g])
    if "decode_rope" in only:
        rows += bench_decode_rope(dev, a.repeat, [int(v) for v in a.positions.split(",")],
                                  [int(v) for v in a.nrep.split(",")])
    if "gemm_any" in only:
        rows += bench_gemm_any(dev, torch, max(5, a.repeat // 2),
                               ANY_SHAPES if gpu else [(64, 64, 100_000, "float32", True),
                                                       (300, 300, 300, "float32", False),
                                                       (1000, 1000, 1000, "float32", False),
                                                       (257, 130, 1000, "float32", False)])
    # NOTE: last, so that a kernel fault (which ends the OpenCL context) loses nothing else
    if "gemm" in only:
        for dtype in a.gemm_dtypes.split(","):
            try:
                rows += bench_gemm(dev, size, dtype, torch, max(5, a.repeat // 2))
            except Exception as e:  # noqa: BLE001 - report and keep what was measured
                print(f"GEMM {dtype}: {type(e).__name__}: {e}")
                rows.append({"kernel": f"GEMM {dtype} {size}^3", "ms": float("nan"),
                             "error": str(e)})
                break
    print(table(rows, [("kernel", "kernel", ""), ("ms", "ms", ".4f"), ("tflops", "TFLOP/s", ".1f"),
                       ("gbps", "GB/s", ".0f"), ("of_copy", "of copy", ".2f"),
                       ("of_same_size_copy", "of same-size copy", ".2f"),
                       ("b2b_ms", "back-to-back ms", ".4f"), ("b2b_of_copy", "b2b of copy", ".2f"),
                       ("b2b_of_same_size_copy", "b2b of same-size copy", ".2f"),
                       ("peer", "peer", ""), ("peer_ms", "peer ms", ".4f"),
                       ("x_peer", "x peer", ".2f"), ("rel_err", "rel err", ".1e")]))
    write_json(a.json, {"bench": "kernels", "env": env, "ceiling": ceil, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
