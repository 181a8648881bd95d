// A paged KV cache for batched decoding (clops.llm.batch): the sequences of a batch own blocks
// of BS positions in one pool per layer, kp and vp [blocks][KV][BS][D] of kv_t, and
// table[slot * maxb + j] is the pool block holding positions j*BS .. j*BS + BS - 1 of the
// sequence in slot `slot`. A step runs R rows in any mix of sequences: row r is position
// rpos[r] of the sequence in slot rslot[r] (one row for a decoding sequence, a run of rows for
// a chunk of a prompt). Every row's result depends on that row (and its sequence's cache)
// alone, never on the other rows of the step, so that a sequence gets the same values batched
// as alone.
//
//   HEAD_DIM  D, a multiple of 4
//   ROPE_NEOX 1: rotate split halves (i, i + ROT_DIM/2); 0: adjacent pairs (2i, 2i + 1)
//   ROT_DIM   the rotated dimensions of a head (default HEAD_DIM): the rest pass unrotated
//   LS        work-items per (row, head) in paged_attn, splitting the positions
//   WINDOW    keys (pos - WINDOW, pos] only, a sliding window (paged_attn; default 0: all)
//   SOFTCAP   scores become SOFTCAP * tanh(score / SOFTCAP) (paged_attn; a float literal)
//   KV_HALF   1: the pools hold float16 values (clops/kv.cl), else float32
//   SINKS     1: a sink logit a query head, sinks[h] (paged_attn's last argument; float32 [H]):
//             one more term exp(sinks[h]) in the softmax's denominator, with no value (gpt-oss)

#ifndef ROPE_NEOX
#define ROPE_NEOX 1
#endif
#ifndef ROT_DIM
#define ROT_DIM HEAD_DIM
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#if ROT_DIM % 2 || ROT_DIM > HEAD_DIM
#error "ROT_DIM must be even and at most HEAD_DIM"
#endif
#ifndef LS
#define LS 1
#endif
#if HEAD_DIM % 4
#error "the paged cache's kernels need HEAD_DIM a multiple of 4"
#endif
#include "clops/kv.cl"

#include "clops/rope.cl"  // pair_index

inline size_t kv_index(__global const int *table, int maxb, int slot, int pos, int kvh, int KV,
                       int BS) {
    const int blk = table[slot * maxb + pos / BS];
    return (((size_t)blk * KV + kvh) * BS + pos % BS) * HEAD_DIM;
}

// After the fused QKV projection (rows [q (H*D) | k (KV*D) | v (KV*D)], ld_qkv apart): rotate
// the first ROT_DIM dimensions of q and k by each row's position (work-items i >= ROT_DIM / 2
// copy a pair of the rest), write q to q_out [R][H][D] and k, v into the cache. A layer
// without rotary takes inv_freq of zeros (angle 0: the values as they are).
// QKNORM 1: each head of q and k is RMS-normed first (Qwen3's QK-norm; weights wq, wk
// [HEAD_DIM] and eps, the last three arguments; HEAD_DIM a power of two), a work-group a head.
// Work geometry: global (D/2, H + 2*KV, R); QKNORM: local (D/2, 1, 1).
#ifndef QKNORM
#define QKNORM 0
#endif
// Picked by paged.rope_store: every batched step's rows (llm/step.py) but a lone row's plan
__kernel void paged_rope_store(__global float *q_out, __global const float *qkv, int ld_qkv,
                               __global kv_t *kp, __global kv_t *vp,
                               __global const int *table, int maxb, __global const int *rslot,
                               __global const int *rpos, __global const float *inv_freq,
                               int H, int KV, int BS
#if QKNORM
                               , __global const float *wq, __global const float *wk, float eps
#endif
                               ) {
#if QKNORM
    __local float red[HEAD_DIM / 2];
#endif
    const int i = get_global_id(0), h = get_global_id(1), r = get_global_id(2);
    const int pos = rpos[r], slot = rslot[r];
    __global const float *row = qkv + (size_t)r * ld_qkv;
    const int2 p = pair_index(i);
    const int d = ROT_DIM + 2 * (i - ROT_DIM / 2);  // (past ROT_DIM: the pair of the rest)
    if (h < H + KV) {  // (the same for the whole work-group)
        __global const float *src = row + h * HEAD_DIM;
#if QKNORM
        // (this work-item's two values: a rotation pair, or a pair of the rest)
        const int2 e = i < ROT_DIM / 2 ? p : (int2)(d, d + 1);
        const float ex = src[e.x], ey = src[e.y];
        red[i] = ex * ex + ey * ey;
        for (int o = HEAD_DIM / 4; o > 0; o >>= 1) {
            barrier(CLK_LOCAL_MEM_FENCE);
            if (i < o) red[i] += red[i + o];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        __global const float *w = h < H ? wq : wk;
        const float rr = rsqrt(red[0] / HEAD_DIM + eps);
#define NORMED(d, v) ((v) * rr * w[d])
#else
#define NORMED(d, v) (v)
#endif
#if ROT_DIM < HEAD_DIM
        if (i >= ROT_DIM / 2) {  // partial rotary: the rest of the head passes
            const float v0 = NORMED(d, src[d]), v1 = NORMED(d + 1, src[d + 1]);
            if (h < H) {
                __global float *dst = q_out + ((size_t)r * H + h) * HEAD_DIM;
                dst[d] = v0;
                dst[d + 1] = v1;
            } else {
                __global kv_t *dst = kp + kv_index(table, maxb, slot, pos, h - H, KV, BS);
                KV_PUT(v0, dst, d);
                KV_PUT(v1, dst, d + 1);
            }
            return;
        }
#endif
        float c, s = sincos((float)pos * inv_freq[i], &c);
        const float a = NORMED(p.x, src[p.x]), b = NORMED(p.y, src[p.y]);
#undef NORMED
        if (h < H) {
            __global float *dst = q_out + ((size_t)r * H + h) * HEAD_DIM;
            dst[p.x] = a * c - b * s;
            dst[p.y] = a * s + b * c;
        } else {
            __global kv_t *dst = kp + kv_index(table, maxb, slot, pos, h - H, KV, BS);
            KV_PUT(a * c - b * s, dst, p.x);
            KV_PUT(a * s + b * c, dst, p.y);
        }
    } else {
        const int kvh = h - H - KV;
        __global const float *src = row + (H + KV + kvh) * HEAD_DIM;
        __global kv_t *dst = vp + kv_index(table, maxb, slot, pos, kvh, KV, BS);
        KV_PUT(src[2 * i], dst, 2 * i);
        KV_PUT(src[2 * i + 1], dst, 2 * i + 1);
    }
}

// Causal grouped-query attention of each row over its own sequence's positions 0 .. rpos[r]
// (the last WINDOW of them where WINDOW > 0): out [R][H][D] = softmax(cap(q k^T * scale)) v
// (cap: the soft cap where SOFTCAP is defined). Each of the LS work-items of a (row, head) keeps a
// running softmax over positions lid, lid + LS, ...; their partial results are then combined.
// Work geometry: global (LS, H, R), local (LS, 1, 1).
// Picked by paged.attention where neither split_attention nor (uncapped) cpu_decode holds
__kernel void paged_attn(__global float *out, __global const float *q,
                         __global const kv_t *kp, __global const kv_t *vp,
                         __global const int *table, int maxb, __global const int *rslot,
                         __global const int *rpos, int H, int KV, int BS,
                         float scale SINKS_ARG) {
    const int lid = get_local_id(0), h = get_group_id(1), r = get_group_id(2);
    const int pos = rpos[r], slot = rslot[r], kvh = h / (H / KV);
    __global const float *qr = q + ((size_t)r * H + h) * HEAD_DIM;
    // PERF: 4-wide loads of the query, keys and values (H100, 16 rows of SmolLM2 at about
    // 100 positions: scalar loads took 27 us a layer)
    float4 qv[HEAD_DIM / 4], acc[HEAD_DIM / 4];
    for (int d = 0; d < HEAD_DIM / 4; ++d) {
        qv[d] = vload4(d, qr);
        acc[d] = (float4)(0.0f);
    }
    float mx = -INFINITY, l = 0.0f;
#if SINKS
    if (lid == 0) {  // (the sink once: in the first work-item's part)
        mx = sinks[h];
        l = 1.0f;
    }
#endif
    const int first = WINDOW > 0 ? max(0, pos - WINDOW + 1) : 0;
    for (int p = first + lid; p <= pos; p += LS) {
        const size_t at = kv_index(table, maxb, slot, p, kvh, KV, BS);
        __global const kv_t *k = kp + at;
        __global const kv_t *v = vp + at;
        float4 t = qv[0] * KV_LOAD4(0, k);
        for (int d = 1; d < HEAD_DIM / 4; ++d) t = fma(qv[d], KV_LOAD4(d, k), t);
#ifdef SOFTCAP
        const float s = SOFTCAP * tanh(((t.x + t.y) + (t.z + t.w)) * scale / SOFTCAP);
#else
        const float s = ((t.x + t.y) + (t.z + t.w)) * scale;
#endif
        const float m2 = fmax(mx, s);
        const float c = exp(mx - m2), e = exp(s - m2);
        l = l * c + e;
        for (int d = 0; d < HEAD_DIM / 4; ++d)
            acc[d] = fma((float4)(e), KV_LOAD4(d, v), acc[d] * c);
        mx = m2;
    }
    __global float *o = out + ((size_t)r * H + h) * HEAD_DIM;
#if LS == 1
    const float inv = 1.0f / l;
    for (int d = 0; d < HEAD_DIM / 4; ++d) vstore4(acc[d] * inv, d, o);
#else
    // the work-items' parts meet at the largest max: each scales its own sums once
    __local float lm[LS], ll[LS], la[LS * HEAD_DIM];
    lm[lid] = mx;
    barrier(CLK_LOCAL_MEM_FENCE);
    float m = -INFINITY;
    for (int j = 0; j < LS; ++j) m = fmax(m, lm[j]);
    const float c = mx == -INFINITY ? 0.0f : exp(mx - m);  // (no position: no part)
    ll[lid] = l * c;
    for (int d = 0; d < HEAD_DIM / 4; ++d) vstore4(acc[d] * c, lid * (HEAD_DIM / 4) + d, la);
    barrier(CLK_LOCAL_MEM_FENCE);
    float total = 0.0f;
    for (int j = 0; j < LS; ++j) total += ll[j];
    const float inv = 1.0f / total;
    for (int d = lid; d < HEAD_DIM; d += LS) {
        float s = 0.0f;
        for (int j = 0; j < LS; ++j) s += la[j * HEAD_DIM + d];
        o[d] = s * inv;
    }
#endif
}

// out[i, :] = x[sel[i], :] (k values a row): the rows whose logits a step needs.
// Work geometry: global (k, n).
// Picked by paged.gather_rows: the rows a step's logits are made for
__kernel void gather_rows(__global float *out, __global const float *x,
                          __global const int *sel, int k) {
    const int j = get_global_id(0), i = get_global_id(1);
    out[(size_t)i * k + j] = x[(size_t)sel[i] * k + j];
}
