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
__kernel void gather_rows(__global float *out, __global const float *x,
                          __global const int *sel, int k) {
    const int j = get_global_id(0), i = get_global_id(1);
    out[(size_t)i * k + j] = x[(size_t)sel[i] * k + j];
}

#ifdef CHUNK
// Decode rows fused (paged_decode_rope): paged_rope_store and the attention of each row over its
// sequence's positions 0 .. rpos[r] in one launch, for a step whose every row is its own
// sequence's one new position. Work-groups of HEAD_DIM work-items take CHUNK positions each of a
// (row, query head); the work-group whose chunk ends at the row's position (the tail) rotates
// the new key itself and reads it, and the new value, from local memory and registers, since
// the other work-groups of the launch may not have stored them yet (nor they this one's); the
// tail of each key-value group's first query head stores them in the pools. The rest of the
// chunk's keys go through a local tile (coalesced loads), a work-item a key for the scores;
// the value sum takes a dimension a work-item, in order of position.
//
//   CHUNK      positions a work-group (S work-groups a (row, head) on axis 0)
//   COMBINE    1: the last work-group of a (row, head) to finish (counted in count [R][H],
//              zero between launches, left zero) combines the partials into out [R][H][D], and
//              a row whose positions fit one chunk writes out directly; 0: every work-group
//              leaves its partial in part [R][H][S][D + 2], numbered from the first chunk that
//              takes part (WINDOW), for a combine launch (attention.cl's paged_attn_combine)
//   PTX_FENCE  1 (NVIDIA): the fence and loads of the combine through PTX (clops/fence.cl,
//              clops/partials.cl)
// Scores, WINDOW, SOFTCAP and SINKS (the sink taken by the first chunk that takes part) as in
// paged_attn; a row's values depend on its own positions alone.
// Work geometry: global (S * D, H, R), local (D, 1, 1).
#if HEAD_DIM & (HEAD_DIM - 1)
#error "paged_decode_rope needs HEAD_DIM a power of two"
#endif
#ifndef COMBINE
#define COMBINE 0
#endif
#ifndef PTX_FENCE
#define PTX_FENCE 0
#endif
#define PARTS_PTX PTX_FENCE
#include "clops/partials.cl"  // combine_parts
#include "clops/fence.cl"     // GLOBAL_FENCE

// key rows a local tile (4096 floats at most), and the floats between two of them there
#define KT_ROWS (HEAD_DIM * HEAD_DIM <= 4096 ? HEAD_DIM : 4096 / HEAD_DIM)
#define KT_LD (HEAD_DIM + 4)

// Element t of a head's row src rotated at position pos: what paged_rope_store writes there.
inline float rope_at(__global const float *src, int t, int pos, __global const float *inv_freq) {
#if ROT_DIM < HEAD_DIM
    if (t >= ROT_DIM) return src[t];
#endif
    const int i = pair_of(t);
    const int2 p = pair_index(i);
    return turn(src[p.x], src[p.y], t, p.x, i, pos, inv_freq);
}

// The largest (is_max) or the sum of the group's values v, through red [HEAD_DIM].
inline float group_reduce(__local float *red, int t, float v, bool is_max) {
    red[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int o = HEAD_DIM / 2; o > 0; o >>= 1) {
        if (t < o) red[t] = is_max ? fmax(red[t], red[t + o]) : red[t] + red[t + o];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float out = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);  // (red free again)
    return out;
}

__kernel __attribute__((reqd_work_group_size(HEAD_DIM, 1, 1)))
void paged_decode_rope(__global float *out, __global float *part, __global int *count,
                       __global const float *qkv, int ld_qkv, __global kv_t *kp,
                       __global kv_t *vp, __global const int *table, int maxb,
                       __global const int *rslot, __global const int *rpos,
                       __global const float *inv_freq, int H, int KV, int BS,
                       float scale SINKS_ARG) {
    __local float qs[HEAD_DIM] __attribute__((aligned(16)));
    __local float kn[HEAD_DIM] __attribute__((aligned(16)));
    __local float kt[KT_ROWS * KT_LD] __attribute__((aligned(16)));
    __local float p[CHUNK], red[HEAD_DIM];
    __local int last;
    const int t = get_local_id(0), s = get_group_id(0), h = get_group_id(1);
    const int r = get_group_id(2), S = get_num_groups(0);
    const int pos = rpos[r], slot = rslot[r];
    const int lo = WINDOW > 0 ? max(0, pos - WINDOW + 1) : 0;  // the first key
    const int s0 = lo / CHUNK, tail = pos / CHUNK, active = tail - s0 + 1;
    if (s < s0 || s > tail) return;  // (the same for the whole work-group)
    const int j0 = max(s * CHUNK, lo), n = min(pos + 1, s * CHUNK + CHUNK) - j0;
    const int n_rep = H / KV, kvh = h / n_rep, rh = r * H + h;
    __global const float *row = qkv + (size_t)r * ld_qkv;
    qs[t] = rope_at(row + h * HEAD_DIM, t, pos, inv_freq) * scale;
    float vn = 0.0f;
    if (s == tail) {
        // (the new key and value as the pools keep them: later steps read them from there)
        const float kr = kv_round(rope_at(row + (H + kvh) * HEAD_DIM, t, pos, inv_freq));
        vn = kv_round(row[(H + KV + kvh) * HEAD_DIM + t]);
        kn[t] = kr;
        if (h == kvh * n_rep) {
            const size_t at = kv_index(table, maxb, slot, pos, kvh, KV, BS);
            KV_PUT(kr, kp + at, t);
            KV_PUT(vn, vp + at, t);
        }
    }
    float mx = -INFINITY;
    for (int b = 0; b < n; b += KT_ROWS) {
        const int rows = min(KT_ROWS, n - b);
        barrier(CLK_LOCAL_MEM_FENCE);  // (qs and kn written; the tile before scored)
        for (int i = t; i < rows * (HEAD_DIM / 4); i += HEAD_DIM) {
            const int j = i / (HEAD_DIM / 4), c = i % (HEAD_DIM / 4), at = j0 + b + j;
            const float4 k4 = at == pos ? vload4(c, kn)
                : KV_LOAD4(c, kp + kv_index(table, maxb, slot, at, kvh, KV, BS));
            vstore4(k4, 0, kt + j * KT_LD + 4 * c);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t < rows) {
            float4 a = (float4)(0.0f);
            for (int d = 0; d < HEAD_DIM / 4; ++d)
                a = mad(vload4(d, kt + t * KT_LD), vload4(d, qs), a);
#ifdef SOFTCAP
            const float sc = SOFTCAP * tanh(((a.x + a.y) + (a.z + a.w)) / SOFTCAP);
#else
            const float sc = (a.x + a.y) + (a.z + a.w);
#endif
            p[b + t] = sc;
            mx = fmax(mx, sc);
        }
    }
    mx = group_reduce(red, t, mx, true);
    float l = 0.0f;
    for (int j = t; j < n; j += HEAD_DIM) {
        const float e = exp(p[j] - mx);
        p[j] = e;
        l += e;
    }
    l = group_reduce(red, t, l, false);  // (its barriers also publish p)
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) {
        const int at = j0 + j;
        const float v = at == pos ? vn
            : KV_GET(vp + kv_index(table, maxb, slot, at, kvh, KV, BS), t);
        acc = mad(p[j], v, acc);
    }
#if SINKS
    if (s == s0) {
        const float sink = sinks[h], m2 = fmax(mx, sink), c = exp(mx - m2);
        l = l * c + exp(sink - m2);
        acc *= c;
        mx = m2;
    }
#endif
#if COMBINE
    if (active == 1) {
        out[(size_t)rh * HEAD_DIM + t] = acc / l;
        return;
    }
#endif
    __global float *pp = part + ((size_t)rh * S + s - s0) * (HEAD_DIM + 2);
    pp[t] = acc;
    if (t == 0) {
        pp[HEAD_DIM] = mx;
        pp[HEAD_DIM + 1] = l;
    }
#if COMBINE
    // the last work-group of the (row, head) to get here combines: each fences its partial
    // before it counts itself
    GLOBAL_FENCE();
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (t == 0) last = atomic_inc(count + rh) == active - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!last) return;
    GLOBAL_FENCE();
    out[(size_t)rh * HEAD_DIM + t] =
        combine_parts(part + (size_t)rh * S * (HEAD_DIM + 2), active, t, true);
    if (t == 0) atomic_xchg(count + rh, 0);
#endif
}
#endif
