// Rotary embeddings, the KV cache, and scaled-dot-product attention (causal, grouped-query).
//
//   HEAD_DIM  D, a multiple of 4
//   ROPE_NEOX 1: rotate split halves (i, i + D/2) as Hugging Face Llama/Qwen2 do;
//             0: rotate adjacent pairs (2i, 2i + 1) as GGUF llama weights expect
//
//   ROT_DIM   the rotated dimensions of a head (rope_store; default HEAD_DIM): the rest pass
//   SOFTCAP   scores become SOFTCAP * tanh(score / SOFTCAP) (attend, chunk_scores; a float
//             literal)
//   WINDOW    keys (pos - WINDOW, pos] only, a sliding window (attn_decode, attn_prefill, the
//             paged kernels)
//   CPU_VEC   1: the CPU kernels (attn_decode_cpu; attn_prefill 16-wide)
//   KV_HALF   1: the cache holds float16 values (clops/kv.cl), else float32
//   TILE_REGS 0 (CPUs): the work-group decode kernels copy key and value tiles straight into
//             local memory, not through registers (default 1; see tile_copy)
//   SINKS     1: each query head h has a learned sink logit sinks[h] (gpt-oss; the kernel's
//             last argument, float32 [H]): one more term exp(sinks[h]) in the softmax's
//             denominator, with no value. The running softmax of a head's first (or only)
//             part begins with it, so that a combine of parts counts it once (attn_decode,
//             attn_decode_wg, attn_prefill and its GPU kernels, the paged kernels)
//
// The KV cache of a layer is k[KV][max_seq][D] and v[KV][max_seq][D] of kv_t.
// state[0] is the position of the first row of the current batch, on the device, so that a
// decode step needs no argument changed from the host.

#ifndef ROPE_NEOX
#define ROPE_NEOX 1
#endif
#ifndef ROT_DIM
#define ROT_DIM HEAD_DIM
#endif
#ifndef CPU_VEC
#define CPU_VEC 0
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#ifndef PAGED  // (attn_decode_rope: 1, the caches are a paged cache's pools)
#define PAGED 0
#endif
#define D4 (HEAD_DIM / 4)
#include "clops/kv.cl"

// The first key a query at position pos attends to, of keys [0, pos].
inline int first_key(int pos) { return WINDOW > 0 ? max(0, pos - WINDOW + 1) : 0; }

#include "clops/rope.cl"  // pair_index

inline float2 rotate(float a, float b, float ang) {
    float c, s = sincos(ang, &c);
    return (float2)(a * c - b * s, a * s + b * c);
}

// After the fused QKV projection: rotate q and k, write q to q_out [M][H][D] and k, v into the
// cache at their positions. qkv rows are [q (H*D) | k (KV*D) | v (KV*D)], ld_qkv apart.
// HEADS_PER_ITEM (default 1; CPUs: all H + 2*KV) heads a work-item, one after another: the
// angle's sine and cosine are made once for them. SLICES > 1: qkv holds a product split over
// k, [SLICES][M][ld_qkv] partial sums, added up here in order (as split_sum does) as they are
// read.
// Work geometry: global (D/2, (H + 2*KV) / HEADS_PER_ITEM, M).
#ifndef HEADS_PER_ITEM
#define HEADS_PER_ITEM 1
#endif
#ifndef SLICES
#define SLICES 1
#endif

// element i of a row of rope_store's qkv (p: its place in the first slice, slices `slice`
// floats apart)
inline float qkv_at(__global const float *p, size_t slice, int i) {
#if SLICES > 1
    float v = 0.0f;
#pragma unroll
    for (int s = 0; s < SLICES; ++s) v += p[s * slice + i];
    return v;
#else
    return p[i];
#endif
}
inline void put_row(__global float *q, __global kv_t *k, int i, float v) {
    if (q)
        q[i] = v;
    else
        KV_PUT(v, k, i);
}
// Picked by Model._attention for a prompt's rows, and for a decode row attn_decode takes
__kernel void rope_store(__global float *q_out, __global const float *qkv, int ld_qkv,
                         __global kv_t *kc, __global kv_t *vc, __global const int *state,
                         __global const float *inv_freq, int H, int KV, int max_seq) {
    const int i = get_global_id(0), h0 = get_global_id(1) * HEADS_PER_ITEM;
    const int m = get_global_id(2);
    const int pos = state[0] + m;
    __global const float *row = qkv + (size_t)m * ld_qkv;
    const size_t slice = (size_t)get_global_size(2) * ld_qkv;
    const int2 p = pair_index(i);
#if ROT_DIM < HEAD_DIM
    const bool rotated = i < ROT_DIM / 2;
    const int d = ROT_DIM + 2 * (i - ROT_DIM / 2);  // (the pair of the rest this one copies)
    float c = 1.0f, s = 0.0f;
    if (rotated) s = sincos((float)pos * inv_freq[i], &c);
#else
    float c, s = sincos((float)pos * inv_freq[i], &c);
#endif
    for (int h = h0; h < h0 + HEADS_PER_ITEM; ++h) {
        if (h < H + KV) {
            __global const float *src = row + h * HEAD_DIM;
            // (a query head's row goes to q_out, a key head's to the cache)
            __global float *qd = h < H ? q_out + ((size_t)m * H + h) * HEAD_DIM : 0;
            __global kv_t *kd = h < H ? 0 : kc + ((size_t)(h - H) * max_seq + pos) * HEAD_DIM;
#if ROT_DIM < HEAD_DIM
            if (!rotated) {  // partial rotary: the rest of the head passes
                put_row(qd, kd, d, qkv_at(src, slice, d));
                put_row(qd, kd, d + 1, qkv_at(src, slice, d + 1));
                continue;
            }
#endif
            const float a = qkv_at(src, slice, p.x), b = qkv_at(src, slice, p.y);
            put_row(qd, kd, p.x, a * c - b * s);
            put_row(qd, kd, p.y, a * s + b * c);
        } else {
            const int kvh = h - H - KV;
            __global const float *src = row + (H + KV + kvh) * HEAD_DIM;
            __global kv_t *dst = vc + ((size_t)kvh * max_seq + pos) * HEAD_DIM;
            KV_PUT(qkv_at(src, slice, 2 * i), dst, 2 * i);
            KV_PUT(qkv_at(src, slice, 2 * i + 1), dst, 2 * i + 1);
        }
    }
}

// In-place rotation of x [M][heads][D] (rows ld apart) at positions pos[m].
// Work geometry: global (D/2, heads, M).
// Picked by nn.functional.rope (no model plan)
__kernel void rope(__global float *x, int x_off, int ld, __global const int *pos,
                   __global const float *inv_freq) {
    const int i = get_global_id(0), h = get_global_id(1), m = get_global_id(2);
    __global float *v = x + x_off + (size_t)m * ld + h * HEAD_DIM;
    const int2 p = pair_index(i);
    float2 r = rotate(v[p.x], v[p.y], (float)pos[m] * inv_freq[i]);
    v[p.x] = r.x;
    v[p.y] = r.y;
}

// One query row (qv, scaled) against keys and values kb, vb at positions [j0, j1) (rows
// HEAD_DIM apart) with an online softmax: acc gathers the weighted values, *mx and *l the
// running max and sum of the weights.
inline void attend(const float4 *qv, float4 *acc, float *mx, float *l,
                   __global const kv_t *kb, __global const kv_t *vb, int j0, int j1) {
    for (int j = j0; j < j1; ++j) {
        float4 t = (float4)(0.0f);
        for (int d = 0; d < D4; ++d) t = mad(qv[d], KV_LOAD4(d, kb + (size_t)j * HEAD_DIM), t);
#ifdef SOFTCAP
        const float sc = SOFTCAP * tanh((t.x + t.y + t.z + t.w) / SOFTCAP);
#else
        const float sc = t.x + t.y + t.z + t.w;
#endif
        const float nm = fmax(*mx, sc);
        const float corr = exp(*mx - nm), e = exp(sc - nm);
        *l = *l * corr + e;
        for (int d = 0; d < D4; ++d)
            acc[d] = mad((float4)(e), KV_LOAD4(d, vb + (size_t)j * HEAD_DIM), acc[d] * corr);
        *mx = nm;
    }
}

// CPU kernels (CPU_VEC): 16-wide vectors (HEAD_DIM a multiple of 16), compiled only where asked
// for: a runtime without them (PoCL 3.0 of the pip wheel) would drop the whole program. QV, NQ,
// VLOADQ, VSTOREQ and ATTEND: a query's vectors and its attention, 16-wide there, else 4-wide.
#if CPU_VEC
#if HEAD_DIM % 16
#error "CPU_VEC needs HEAD_DIM a multiple of 16"
#endif
#define D16 (HEAD_DIM / 16)
#include "clops/vec.cl"  // hsum16

inline float dot16(const float16 *qv, const float *k) {
    float16 t = qv[0] * vload16(0, k);
    for (int d = 1; d < D16; ++d) t = mad(qv[d], vload16(d, k), t);
    return hsum16(t);
}

// attend (above) with one exp per key: the larger of the running max and the score keeps
// weight 1
inline void attend_cpu(const float16 *qv, float16 *acc, float *mx, float *l,
                       __global const kv_t *kb, __global const kv_t *vb, int j0, int j1) {
    for (int j = j0; j < j1; ++j) {
        __global const kv_t *kj = kb + (size_t)j * HEAD_DIM;
        float16 t = qv[0] * KV_LOAD16(0, kj);
        for (int d = 1; d < D16; ++d) t = mad(qv[d], KV_LOAD16(d, kj), t);
        const float sc = hsum16(t);
        __global const kv_t *vj = vb + (size_t)j * HEAD_DIM;
        if (sc > *mx) {
            const float corr = exp(*mx - sc);
            *mx = sc;
            *l = *l * corr + 1.0f;
            for (int d = 0; d < D16; ++d) acc[d] = mad(acc[d], (float16)(corr), KV_LOAD16(d, vj));
        } else {
            const float e = exp(sc - *mx);
            *l += e;
            for (int d = 0; d < D16; ++d) acc[d] = mad((float16)(e), KV_LOAD16(d, vj), acc[d]);
        }
    }
}

#define QV float16
#define NQ D16
#define VLOADQ vload16
#define VSTOREQ vstore16
#define ATTEND attend_cpu
#ifdef SOFTCAP
#error "CPU_VEC does not cap scores (attend_cpu): the capped kernels take attend"
#endif
#else
#define QV float4
#define NQ D4
#define VLOADQ vload4
#define VSTOREQ vstore4
#define ATTEND attend
#endif

// Decode, one query row, split over the KV length (flash-decoding): work-item (s, h) attends
// to positions [s*chunk, (s+1)*chunk) and leaves its unnormalized output, running max and sum
// in part [H][S][D + 2]. Work geometry: global (S, H).
// Picked by attention.attn_decode for capped or windowed scores, or where !fused_decode
__kernel void attn_decode(__global float *part, __global const float *q,
                          __global const kv_t *kc, __global const kv_t *vc,
                          __global const int *state, int max_seq, int chunk, int n_rep,
                          float scale SINKS_ARG) {
    const int s = get_global_id(0), h = get_global_id(1), S = get_global_size(0);
    const int L = state[0] + 1;
    __global float *out = part + ((size_t)h * S + s) * (HEAD_DIM + 2);
    const int j0 = max(s * chunk, first_key(L - 1)), j1 = min(L, s * chunk + chunk);
    if (j0 >= j1) {  // before the window, or past the end: weight 0 in attn_combine
        for (int d = 0; d < HEAD_DIM; ++d) out[d] = 0.0f;
        out[HEAD_DIM] = -INFINITY;
        out[HEAD_DIM + 1] = 0.0f;
        return;
    }
    const int kvh = h / n_rep;
    float4 qv[D4], acc[D4];
    for (int d = 0; d < D4; ++d) {
        qv[d] = vload4(d, q + h * HEAD_DIM) * scale;
        acc[d] = (float4)(0.0f);
    }
    float mx = -INFINITY, l = 0.0f;
#if SINKS
    if (s == first_key(L - 1) / chunk) {  // (the head's first split that takes part)
        mx = sinks[h];
        l = 1.0f;
    }
#endif
    attend(qv, acc, &mx, &l, kc + (size_t)kvh * max_seq * HEAD_DIM,
           vc + (size_t)kvh * max_seq * HEAD_DIM, j0, j1);
    for (int d = 0; d < D4; ++d) vstore4(acc[d], d, out);
    out[HEAD_DIM] = mx;
    out[HEAD_DIM + 1] = l;
}

#ifndef PTX_FENCE
#define PTX_FENCE 0
#endif
#define PARTS_PTX PTX_FENCE
#include "clops/partials.cl"  // combine_parts

#ifdef CHUNK
// The softmax numerators of a chunk's scores p[0, n), in place: exp(p - max), by the HEAD_DIM
// work-items of a group, each bringing the max of the scores it wrote. Returns (max, sum).
inline float2 chunk_softmax(__local float *p, __local float *red, int t, int n, float mx) {
    red[t] = mx;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int o = HEAD_DIM / 2; o > 0; o >>= 1) {
        if (t < o) red[t] = fmax(red[t], red[t + o]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    mx = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float l = 0.0f;
    for (int j = t; j < n; j += HEAD_DIM) {
        const float e = exp(p[j] - mx);
        p[j] = e;
        l += e;
    }
    red[t] = l;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int o = HEAD_DIM / 2; o > 0; o >>= 1) {
        if (t < o) red[t] += red[t + o];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return (float2)(mx, red[0]);
}

#if SINKS
// A chunk's (max, sum) ms and value sum acc with the head's sink folded in (its first chunk)
inline void sink_fold(float2 *ms, float *acc, float sink) {
    const float m = fmax(ms->x, sink), c = exp(ms->x - m);
    *ms = (float2)(m, ms->y * c + exp(sink - m));
    *acc *= c;
}
#endif

// rows a local tile of keys or values (no more rows than a head's work-items)
#define TJ (HEAD_DIM <= 64 ? HEAD_DIM : 4096 / HEAD_DIM)

// Row j of a chunk of keys or values: kb + j * HEAD_DIM, or where blocks (not 0) is a paged
// cache's table (kernels/paged.cl), position j0 + j of key-value head kvh in the pool kb.
// (pool_row: where position at of key-value head kvh starts in a paged pool, the row's
// blocks in blocks)
inline size_t pool_row(__global const int *blocks, int at, int BS, int KV, int kvh) {
    return (((size_t)blocks[at / BS] * KV + kvh) * BS + at % BS) * HEAD_DIM;
}
inline __global const kv_t *row_at(__global const kv_t *kb, int j,
                                    __global const int *blocks, int j0, int BS, int KV,
                                    int kvh) {
    if (!blocks) return kb + (size_t)j * HEAD_DIM;
    return kb + pool_row(blocks, j0 + j, BS, KV, kvh);
}

// NREP query heads a work-group (attn_decode_rope): their HEAD_DIM work-items each, hr the
// head of this one.
#ifndef NREP
#define NREP 1
#endif
#define KROW (HEAD_DIM + 4)                     // floats a key row in the local tile
#define TILE4 (TJ * HEAD_DIM / 4)               // float4s a tile
#define TILE_PER ((TILE4 + NREP * HEAD_DIM - 1) / (NREP * HEAD_DIM))  // a work-item's

// A tile in two halves, so that its trip to memory overlaps the work on the tile before: rows
// [0, rows) (TJ at most) of a chunk's keys or values from row j1 into the registers v, float4
// loads by all NREP * HEAD_DIM work-items of the group (lid), all issued before any is used
// (tile_fetch); then from v into the local tile dst, rows ld floats apart (tile_put).
inline void tile_fetch(float4 *v, __global const kv_t *kb, int j1, int rows, int lid,
                       __global const int *blocks, int j0, int BS, int KV, int kvh) {
#pragma unroll
    for (int u = 0; u < TILE_PER; ++u) {
        const int i = lid + u * NREP * HEAD_DIM, r = i / D4;
        if (i < TILE4 && r < rows)
            v[u] = KV_LOAD4(i % D4, row_at(kb, j1 + r, blocks, j0, BS, KV, kvh));
    }
}

inline void tile_put(__local float *dst, int ld, const float4 *v, int rows, int lid) {
#pragma unroll
    for (int u = 0; u < TILE_PER; ++u) {
        const int i = lid + u * NREP * HEAD_DIM, r = i / D4;
        if (i < TILE4 && r < rows) vstore4(v[u], 0, dst + r * ld + 4 * (i % D4));
    }
}

// TILE_REGS 1 (GPUs): a tile goes through registers (tile_fetch, then tile_put after the
// barrier), so that the next tile's trip to memory overlaps the work on this one. 0 (CPUs,
// which gain nothing from that): each tile is copied straight into local memory between two
// barriers (tile_copy). Intel's CPU runtime gave other values from run to run with the
// registers' array live across a barrier (heads of 64: 16 float4s a work-item).
#ifndef TILE_REGS
#define TILE_REGS 1
#endif

#if !TILE_REGS
inline void tile_copy(__local float *dst, int ld, __global const kv_t *kb, int j1, int rows,
                      int lid, __global const int *blocks, int j0, int BS, int KV, int kvh) {
    for (int i = lid; i < TILE4; i += NREP * HEAD_DIM) {
        const int r = i / D4;
        if (r < rows)
            vstore4(KV_LOAD4(i % D4, row_at(kb, j1 + r, blocks, j0, BS, KV, kvh)), 0,
                    dst + r * ld + 4 * (i % D4));
    }
}
#endif

// sum_j p[j] * row_at(vb, j, ...)[t] for j < n, in order: the value rows through the local
// tile vt (TJ rows of HEAD_DIM) a tile at a time.
inline float value_sum(__local const float *p, __local float *vt, __global const kv_t *vb,
                       int n, int t, int lid, __global const int *blocks, int j0, int BS,
                       int KV, int kvh) {
    float acc = 0.0f;
#if TILE_REGS
    float4 v[TILE_PER];
    tile_fetch(v, vb, 0, min(TJ, n), lid, blocks, j0, BS, KV, kvh);
#endif
    for (int j1 = 0; j1 < n; j1 += TJ) {
        const int rows = min(TJ, n - j1);
        barrier(CLK_LOCAL_MEM_FENCE);  // (the tile before is used up)
#if TILE_REGS
        tile_put(vt, HEAD_DIM, v, rows, lid);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (j1 + TJ < n)  // (the next tile on its way during the work on this one)
            tile_fetch(v, vb, j1 + TJ, min(TJ, n - j1 - TJ), lid, blocks, j0, BS, KV, kvh);
#else
        tile_copy(vt, HEAD_DIM, vb, j1, rows, lid, blocks, j0, BS, KV, kvh);
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        for (int r = 0; r < rows; ++r) acc = mad(p[j1 + r], vt[r * HEAD_DIM + t], acc);
    }
    return acc;
}

// The scores of a chunk's positions [0, n) into p (q in qs, scaled): the keys of rows below nc
// from the cache (kb), rows nc .. n - 1 (the new key, where nc = n - 1) from kn. Returns the
// largest score this work-item wrote. The key rows go through the local tile kt (TJ rows KROW
// apart) a tile at a time; then each work-item scores its row from there (float4 reads of rows
// KROW apart hit all banks).
// PERF (H200, Llama-3.2-1B body, 32 query heads over 8 key-value heads): a key row read by its
// own work-item, 16 loads of 16 bytes scattered across the work-group, took about 75% of the
// attention at 16k positions (186 us a layer; 46 us with the keys' loads left out); through
// local memory, 198 -> 68 us a layer at 16k positions and 92 -> 35 at 4k. Tiles loaded eight
// rows a round left a layer's attention at 17 us at 190 positions, mostly trips to memory.
inline float chunk_scores(__local float *p, __local const float *qs, __local float *kt,
                          __global const kv_t *kb, __local const float *kn, int n, int nc,
                          int t, int lid, __global const int *blocks, int j0, int BS, int KV,
                          int kvh) {
    float mx = -INFINITY;
#if TILE_REGS
    float4 v[TILE_PER];
    tile_fetch(v, kb, 0, min(TJ, nc), lid, blocks, j0, BS, KV, kvh);
#endif
    for (int j1 = 0; j1 < n; j1 += TJ) {
        barrier(CLK_LOCAL_MEM_FENCE);  // (the tile before is scored)
#if TILE_REGS
        tile_put(kt, KROW, v, min(TJ, nc - j1), lid);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (j1 + TJ < nc)  // (the next tile on its way during the work on this one)
            tile_fetch(v, kb, j1 + TJ, min(TJ, nc - j1 - TJ), lid, blocks, j0, BS, KV, kvh);
#else
        tile_copy(kt, KROW, kb, j1, min(TJ, nc - j1), lid, blocks, j0, BS, KV, kvh);
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        const int j = j1 + t;
        if (t < TJ && j < n) {
            float4 a = (float4)(0.0f);
            __local const float *kr = j < nc ? kt + t * KROW : kn;
            for (int d = 0; d < D4; ++d) a = mad(vload4(d, kr), vload4(d, qs), a);
#ifdef SOFTCAP
            const float sc = SOFTCAP * tanh(((a.x + a.y) + (a.z + a.w)) / SOFTCAP);
#else
            const float sc = (a.x + a.y) + (a.z + a.w);
#endif
            p[j] = sc;
            mx = fmax(mx, sc);
        }
    }
    return mx;
}

// attn_decode for GPUs: a work-group of D work-items per (split, head) and CHUNK positions.
// Scores go one position per work-item, the softmax of the chunk through local memory, then
// the value sum one dimension per work-item (coalesced rows). Same output as attn_decode.
// Work geometry: global (S * D, H), local (D, 1).
// Picked by attention.attn_decode where fused_decode holds, scores uncapped, unwindowed
__kernel void attn_decode_wg(__global float *part, __global const float *q,
                             __global const kv_t *kc, __global const kv_t *vc,
                             __global const int *state, int max_seq, int chunk, int n_rep,
                             float scale SINKS_ARG) {
    __local float qs[HEAD_DIM] __attribute__((aligned(16))), p[CHUNK], red[HEAD_DIM];
    __local float kt[TJ * KROW] __attribute__((aligned(16)));
    const int t = get_local_id(0), s = get_group_id(0), h = get_global_id(1);
    const int S = get_num_groups(0);
    const int L = state[0] + 1;
    __global float *out = part + ((size_t)h * S + s) * (HEAD_DIM + 2);
    const int j0 = s * CHUNK, n = min(L - j0, CHUNK);
    if (n <= 0) {  // the same for the whole work-group
        if (t == 0) {
            out[HEAD_DIM] = -INFINITY;
            out[HEAD_DIM + 1] = 0.0f;
        }
        return;
    }
    const int kvh = h / n_rep;
    qs[t] = q[h * HEAD_DIM + t] * scale;
    barrier(CLK_LOCAL_MEM_FENCE);
    __global const kv_t *kb = kc + ((size_t)kvh * max_seq + j0) * HEAD_DIM;
    __global const kv_t *vb = vc + ((size_t)kvh * max_seq + j0) * HEAD_DIM;
    __global const int *flat = 0;  // (rows HEAD_DIM apart)
    const float mx = chunk_scores(p, qs, kt, kb, qs, n, n, t, t, flat, 0, 0, 0, 0);
#if SINKS
    float2 ms = chunk_softmax(p, red, t, n, mx);
    float acc = value_sum(p, kt, vb, n, t, t, flat, 0, 0, 0, 0);
    if (s == 0) sink_fold(&ms, &acc, sinks[h]);
#else
    const float2 ms = chunk_softmax(p, red, t, n, mx);
    const float acc = value_sum(p, kt, vb, n, t, t, flat, 0, 0, 0, 0);
#endif
    out[t] = acc;
    if (t == 0) {
        out[HEAD_DIM] = ms.x;
        out[HEAD_DIM + 1] = ms.y;
    }
}

// One element of a head's row rotated at position pos (what rope_store writes at t); where w
// is given, the row RMS-normed first (1 / RMS rr, weights w [HEAD_DIM]: QKNORM).
inline float rope_at(__global const float *src, int t, int pos, __global const float *inv_freq,
                     float rr, __global const float *w) {
    const int i = pair_of(t);
    const int2 p = pair_index(i);
    const float va = w ? src[p.x] * rr * w[p.x] : src[p.x];
    const float vb = w ? src[p.y] * rr * w[p.y] : src[p.y];
    return turn(va, vb, t, p.x, i, pos, inv_freq);
}
inline float rope_elem(__global const float *src, int t, int pos, __global const float *inv_freq) {
    return rope_at(src, t, pos, inv_freq, 1.0f, 0);
}

#ifndef COMBINE
#define COMBINE 0
#endif
#include "clops/fence.cl"  // GLOBAL_FENCE

#if COMBINE
// The partials part_h [active][D + 2] of a (row,) head's work-groups, each left by its own
// work-group before it calls this: the last of them to arrive (counted in *cnt, zero between
// launches, left zero) combines them into o [D], a work-item a dimension (t).
// (With NREP heads a work-group, cnt counts the group's work-groups and work-item t of head
// hr combines o and part_h of its head: the caller offsets them; lid is the work-item's index
// in the group.)
inline void combine_last(__global float *o, __global const float *part_h, __global int *cnt,
                         int active, int t, int lid, __local int *last) {
    GLOBAL_FENCE();
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (lid == 0) *last = atomic_inc(cnt) == active - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!*last) return;
    GLOBAL_FENCE();
    o[t] = combine_parts(part_h, active, t, true);
    if (lid == 0) atomic_xchg(cnt, 0);
}
#endif

#ifndef QKNORM
#define QKNORM 0
#endif
#if QKNORM
// 1 / RMS of a head's values v (work-item t of HEAD_DIM, a power of two, holding value t),
// summed in r [HEAD_DIM] of local memory (free again when this returns); every work-item of
// the work-group calls it.
inline float head_rms(__local float *r, float v, int t, float eps) {
    r[t] = v * v;
    for (int s = HEAD_DIM / 2; s > 0; s >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t < s) r[t] += r[t + s];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const float q = rsqrt(r[0] / HEAD_DIM + eps);
    barrier(CLK_LOCAL_MEM_FENCE);
    return q;
}
#endif

// Decode attention of one row straight from the QKV projection: rope_store, attn_decode_wg
// and (COMBINE) attn_combine in one launch. QKNORM 1: q and k are RMS-normed a head first
// (weights wq, wk [HEAD_DIM], eps: Qwen3's QK-norm; the kernel's last three arguments). Each
// work-group rotates its heads' q itself; the work-group whose chunk holds the new position
// (the last one) rotates k, uses the new k and v from local memory and registers, and the
// first head of each KV group stores them in the cache. A work-group serves NREP query heads of one key-value head (NREP 1: one head; n_rep:
// all of them, so that each key row is read once for them), HEAD_DIM work-items a head. With
// COMBINE the work-groups of a head (NREP > 1: of a key-value head) count themselves in
// count[h] (count[kvh]; zero between launches) and the last to finish combines the partials
// into out [H][D]; a head whose positions fit one chunk writes out directly. Without COMBINE
// every work-group leaves its partial, as attn_decode_wg does, for attn_combine.
// Work geometry: global (S * D * NREP, H / NREP), local (D * NREP, 1).
// (the work-group's size given: NVIDIA's compiler otherwise holds a work-item to the registers
// of a work-group of 1024)
// Picked by Model._attention for a decode row it calls plain, where fused_decode holds
__kernel __attribute__((reqd_work_group_size(HEAD_DIM * NREP, 1, 1)))
void attn_decode_rope(__global float *out, __global float *part, __global int *count,
                      __global const float *qkv, __global kv_t *kc, __global kv_t *vc,
                      __global const int *state, __global const float *inv_freq, int max_seq,
                      int n_rep, int H, int KV, float scale
#if PAGED
                      , __global const int *table, int maxb, __global const int *slots, int BS
#endif
#if QKNORM
                      , __global const float *wq, __global const float *wk, float eps
#endif
                      SINKS_ARG) {
    __local float qs[NREP * HEAD_DIM] __attribute__((aligned(16)));
    __local float kn[HEAD_DIM] __attribute__((aligned(16))), p[NREP * CHUNK], red[NREP * HEAD_DIM];
    __local float kt[TJ * KROW] __attribute__((aligned(16)));
    __local int last;
    const int lid = get_local_id(0), t = lid % HEAD_DIM, hr = lid / HEAD_DIM;
    const int s = get_group_id(0), h = get_group_id(1) * NREP + hr;
    const int S = get_num_groups(0);
    const int pos = state[0], L = pos + 1;
    const int s0 = first_key(pos) / CHUNK;  // the first chunk that takes part (WINDOW)
    const int active = (L + CHUNK - 1) / CHUNK - s0;  // work-groups with positions
    const int j0 = max(s * CHUNK, first_key(pos)), n = min(L, s * CHUNK + CHUNK) - j0;
    if (s < s0 || n <= 0) return;  // the same for the whole work-group
    const int kvh = h / n_rep;
    const bool tail = s == s0 + active - 1;  // its chunk ends with the new position
#if PAGED
    __global const int *blocks = table + (size_t)slots[0] * maxb;  // (the row's blocks)
    const int bs = BS;
#else
    __global const int *blocks = 0;  // (rows HEAD_DIM apart)
    const int bs = 0;
#endif
    __local float *qh = qs + hr * HEAD_DIM, *ph = p + hr * CHUNK;
#if QKNORM
    const float rq = head_rms(red + hr * HEAD_DIM, qkv[h * HEAD_DIM + t], t, eps);
    qh[t] = rope_at(qkv + h * HEAD_DIM, t, pos, inv_freq, rq, wq) * scale;
#else
    qh[t] = rope_elem(qkv + h * HEAD_DIM, t, pos, inv_freq) * scale;
#endif
    float vn = 0.0f;
    if (tail) {
        // (the new key and value as the cache keeps them: later steps read them from there)
#if QKNORM
        const float rk = head_rms(red + hr * HEAD_DIM, qkv[(H + kvh) * HEAD_DIM + t], t, eps);
        const float kr = kv_round(rope_at(qkv + (H + kvh) * HEAD_DIM, t, pos, inv_freq, rk,
                                          wk));
#else
        const float kr = kv_round(rope_elem(qkv + (H + kvh) * HEAD_DIM, t, pos, inv_freq));
#endif
        vn = kv_round(qkv[(H + KV + kvh) * HEAD_DIM + t]);
        if (hr == 0) kn[t] = kr;
        if (h == kvh * n_rep) {
#if PAGED
            const size_t at = pool_row(blocks, pos, BS, KV, kvh) + t;
#else
            const size_t at = ((size_t)kvh * max_seq + pos) * HEAD_DIM + t;
#endif
            KV_PUT(kr, kc, at);
            KV_PUT(vn, vc, at);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // (a paged row's key and value rows are found through its blocks from j0 on)
    const size_t kv0 = PAGED ? 0 : ((size_t)kvh * max_seq + j0) * HEAD_DIM;
    __global const kv_t *kb = kc + kv0, *vb = vc + kv0;
    const int nc = tail ? n - 1 : n;  // positions read from the cache
    float mx = chunk_scores(ph, qh, kt, kb, kn, n, nc, t, lid, blocks, j0, bs, KV, kvh);
    float2 ms = chunk_softmax(ph, red + hr * HEAD_DIM, t, n, mx);
    float acc = value_sum(ph, kt, vb, nc, t, lid, blocks, j0, bs, KV, kvh);
    if (tail) acc = mad(ph[n - 1], vn, acc);
#if SINKS
    if (s == s0) sink_fold(&ms, &acc, sinks[h]);  // (the head's first chunk that takes part)
#endif
    mx = ms.x;
    const float l = ms.y;
#if COMBINE
    if (active == 1) {
        out[h * HEAD_DIM + t] = acc / l;
        return;
    }
#endif
    __global float *pp = part + ((size_t)h * S + s - s0) * (HEAD_DIM + 2);
    pp[t] = acc;
    if (t == 0) {
        pp[HEAD_DIM] = mx;
        pp[HEAD_DIM + 1] = l;
    }
#if COMBINE
    combine_last(out + h * HEAD_DIM, part + (size_t)h * S * (HEAD_DIM + 2),
                 count + get_group_id(1), active, t, lid, &last);
#endif
}

// Batched decode on GPUs over a paged cache (clops.llm.batch; kernels/paged.cl spells out the
// pool, table, rslot and rpos): attn_decode_rope's work-groups for row r of a step and query
// head h, over that row's sequence's positions 0 .. rpos[r], CHUNK of them a work-group (each
// position's block looked up in the table), q already rotated ([R][H][D]). A row's values
// depend on its own positions alone. With COMBINE the last work-group of a (row, head)
// to finish combines the partials into out [R][H][D] (count [R][H], zero between launches);
// a row whose positions fit one chunk writes out directly. Without COMBINE, every work-group
// leaves its partial in part [R][H][S][D + 2]. With WINDOW the row's positions are the last
// WINDOW of them: chunks wholly before them take no part, and the partials are numbered from
// the first chunk that does.
// Work geometry: global (S * D, H, R), local (D, 1, 1).
inline int first_chunk(int pos) { return first_key(pos) / CHUNK; }

// Picked by paged.attention_split (a batch's rows, llm/step.py) where fused_decode holds
__kernel void paged_attn_wg(__global float *out, __global float *part, __global int *count,
                            __global const float *q, __global const kv_t *kp,
                            __global const kv_t *vp, __global const int *table, int maxb,
                            __global const int *rslot, __global const int *rpos, int H, int KV,
                            int BS, float scale SINKS_ARG) {
    __local float qs[HEAD_DIM] __attribute__((aligned(16))), p[CHUNK], red[HEAD_DIM];
    __local float kt[TJ * KROW] __attribute__((aligned(16)));
    __local int last;
    const int t = get_local_id(0), s = get_group_id(0), h = get_group_id(1);
    const int r = get_group_id(2), S = get_num_groups(0);
    const int L = rpos[r] + 1, s0 = first_chunk(L - 1);
    const int active = (L + CHUNK - 1) / CHUNK - s0;  // the chunks that take part
    const int j0 = max(s * CHUNK, first_key(L - 1)), n = min(L, s * CHUNK + CHUNK) - j0;
    if (s < s0 || n <= 0) return;  // the same for the whole work-group
    const int kvh = h / (H / KV), rh = r * H + h;
    __global const int *blocks = table + rslot[r] * maxb;
    qs[t] = q[(size_t)rh * HEAD_DIM + t] * scale;
    barrier(CLK_LOCAL_MEM_FENCE);
    const float mx = chunk_scores(p, qs, kt, kp, qs, n, n, t, t, blocks, j0, BS, KV, kvh);
#if SINKS
    float2 ms = chunk_softmax(p, red, t, n, mx);
    float acc = value_sum(p, kt, vp, n, t, t, blocks, j0, BS, KV, kvh);
    if (s == s0) sink_fold(&ms, &acc, sinks[h]);
#else
    const float2 ms = chunk_softmax(p, red, t, n, mx);
    const float acc = value_sum(p, kt, vp, n, t, t, blocks, j0, BS, KV, kvh);
#endif
#if COMBINE
    if (active == 1) {
        out[(size_t)rh * HEAD_DIM + t] = acc / ms.y;
        return;
    }
#endif
    __global float *pp = part + ((size_t)rh * S + s - s0) * (HEAD_DIM + 2);
    pp[t] = acc;
    if (t == 0) {
        pp[HEAD_DIM] = ms.x;
        pp[HEAD_DIM + 1] = ms.y;
    }
#if COMBINE
    combine_last(out + (size_t)rh * HEAD_DIM, part + (size_t)rh * S * (HEAD_DIM + 2), count + rh,
                 active, t, t, &last);
#endif
}
#endif

// Combine the splits of attn_decode: out [H][D]. Work geometry: global (D, H).
// Picked by attention.attn_decode, and attn_decode_rope where !decode_combines
__kernel void attn_combine(__global float *out, __global const float *part,
                           __global const int *state, int chunk, int S) {
    const int d = get_global_id(0), h = get_global_id(1);
    const int L = state[0] + 1;
    out[h * HEAD_DIM + d] = combine_parts(part + (size_t)h * S * (HEAD_DIM + 2),
                                          min(S, (L + chunk - 1) / chunk), d, false);
}

#ifdef CHUNK
// Combine the partials of paged_attn_wg without COMBINE (part [R][H][S][D + 2]): out
// [R][H][D]. Work geometry: global (D, H, R).
// Picked by paged.attention_split where !decode_combines
__kernel void paged_attn_combine(__global float *out, __global const float *part,
                                 __global const int *rpos, int S) {
    const int d = get_global_id(0), h = get_global_id(1), r = get_global_id(2);
    const size_t rh = (size_t)r * get_global_size(1) + h;
    out[rh * HEAD_DIM + d] = combine_parts(part + rh * S * (HEAD_DIM + 2),
                                           (rpos[r] + CHUNK) / CHUNK - first_chunk(rpos[r]), d,
                                           false);
}
#endif

// Many query rows (prefill, or attention over given tensors): work-item (m, h) attends with an
// online softmax to keys [0, state[0] + pos_add + m] when causal, else to [0, n_keys).
// q rows are ld_q apart with heads D apart; k/v heads kv_stride apart, positions D apart;
// out [M][H][D]. Work geometry: global (M, H); CPU_VEC (16-wide, one exp per key): local (1, 1).
// Picked by attention.attn_prefill for capped/windowed scores, CPUs, and GPUs where D % 8 != 0
__kernel void attn_prefill(__global float *out, __global const float *q, int q_off, int ld_q,
                           __global const kv_t *kc, __global const kv_t *vc, int k_off,
                           int v_off, int kv_stride, __global const int *state, int pos_add,
                           int causal, int n_keys, int n_rep, float scale SINKS_ARG) {
    const int m = get_global_id(0), h = get_global_id(1), H = get_global_size(1);
    const int kvh = h / n_rep;
    const int L = causal ? min(n_keys, state[0] + pos_add + m + 1) : n_keys;
    QV qv[NQ], acc[NQ];
    __global const float *qr = q + q_off + (size_t)m * ld_q + h * HEAD_DIM;
    for (int d = 0; d < NQ; ++d) {
        qv[d] = VLOADQ(d, qr) * scale;
        acc[d] = (QV)(0.0f);
    }
    float mx = -INFINITY, l = 0.0f;
#if SINKS
    mx = sinks[h];
    l = 1.0f;
#endif
    ATTEND(qv, acc, &mx, &l, kc + k_off + (size_t)kvh * kv_stride,
           vc + v_off + (size_t)kvh * kv_stride,
           causal ? first_key(state[0] + pos_add + m) : 0, L);
    __global float *o = out + ((size_t)m * H + h) * HEAD_DIM;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int d = 0; d < NQ; ++d) VSTOREQ(acc[d] * inv, d, o);
}

#ifdef PREFILL_WG
// attn_prefill for GPUs, the same output: a work-group of 128 work-items per 16 query rows of
// a head. Tiles of 32 keys and values go through local memory once for the 16 rows. Work-item
// (r, c) of the 16 x 8 serves row r: its scores at positions c, c + 8, .. of each tile, and the
// dimensions c * DPT .. c * DPT + DPT - 1 of the output, with an online softmax across tiles.
// Needs HEAD_DIM % 8 == 0. Work geometry: global (ceil(M / 16) * 128, H), local (128, 1).
#define PQ 16
#define PK 32
#define DPT (HEAD_DIM / 8)
#define KROW (HEAD_DIM + 4)  // 8 rows read at once (one per c) fall in different banks
// Picked by attention.attn_prefill on GPUs (D % 8 == 0), uncapped, unwindowed, not tensor cores'
__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void attn_prefill_wg(__global float *out, __global const float *q, int q_off, int ld_q,
                     __global const kv_t *kc, __global const kv_t *vc, int k_off, int v_off,
                     int kv_stride, __global const int *state, int pos_add, int causal,
                     int n_keys, int n_rep, float scale, int M SINKS_ARG) {
    __local float qs[PQ * HEAD_DIM] __attribute__((aligned(16)));
    __local float ks[PK * KROW] __attribute__((aligned(16)));
    __local float vs[PK * HEAD_DIM] __attribute__((aligned(16)));
    __local float ps[PQ * PK];
    const int t = get_local_id(0), r = t >> 3, c = t & 7;
    const int h = get_group_id(1), H = get_num_groups(1);
    const int m0 = get_group_id(0) * PQ, m = m0 + r;
    const int base = state[0] + pos_add;
    // keys [0, lm) for row m; [0, lmax) for the group
    const int lm = m >= M ? 0 : causal ? min(n_keys, base + m + 1) : n_keys;
    const int lmax = causal ? min(n_keys, base + min(m0 + PQ, M)) : n_keys;
    for (int i = t; i < PQ * HEAD_DIM; i += 128) {
        const int rr = i / HEAD_DIM, d = i % HEAD_DIM;
        qs[i] = m0 + rr < M ? q[q_off + (size_t)(m0 + rr) * ld_q + h * HEAD_DIM + d] * scale
                            : 0.0f;
    }
    __global const kv_t *kb = kc + k_off + (size_t)(h / n_rep) * kv_stride;
    __global const kv_t *vb = vc + v_off + (size_t)(h / n_rep) * kv_stride;
    float acc[DPT];
    for (int d = 0; d < DPT; ++d) acc[d] = 0.0f;
    float mx = -INFINITY, l = 0.0f;
#if SINKS
    mx = sinks[h];
    l = 1.0f;
#endif
    for (int j0 = 0; j0 < lmax; j0 += PK) {
        barrier(CLK_LOCAL_MEM_FENCE);  // the last tile is used up (and the q tile written)
        for (int i = t; i < PK * HEAD_DIM; i += 128) {
            const int jj = i / HEAD_DIM, d = i % HEAD_DIM;
            const bool in = j0 + jj < lmax;
            ks[jj * KROW + d] = in ? KV_GET(kb, (size_t)(j0 + jj) * HEAD_DIM + d) : 0.0f;
            vs[i] = in ? KV_GET(vb, (size_t)(j0 + jj) * HEAD_DIM + d) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int u = 0; u < PK / 8; ++u) {
            const int jj = c + 8 * u;
            float4 a = (float4)(0.0f);
            for (int d = 0; d < D4; ++d)
                a = mad(vload4(d, qs + r * HEAD_DIM), vload4(d, ks + jj * KROW), a);
            ps[r * PK + jj] = j0 + jj < lm ? (a.x + a.y) + (a.z + a.w) : -INFINITY;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        float tmax = -INFINITY;
        for (int jj = 0; jj < PK; ++jj) tmax = fmax(tmax, ps[r * PK + jj]);
        const float nm = fmax(mx, tmax);
        if (nm == -INFINITY) continue;  // nothing to attend yet (no barrier below this)
        const float corr = exp(mx - nm);
        float sum = 0.0f;
        for (int d = 0; d < DPT; ++d) acc[d] *= corr;
        for (int jj = 0; jj < PK; ++jj) {
            const float e = exp(ps[r * PK + jj] - nm);
            sum += e;
            for (int d = 0; d < DPT; ++d) acc[d] = mad(e, vs[jj * HEAD_DIM + c * DPT + d], acc[d]);
        }
        l = l * corr + sum;
        mx = nm;
    }
    if (m >= M) return;
    __global float *o = out + ((size_t)m * H + h) * HEAD_DIM + c * DPT;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int d = 0; d < DPT; ++d) o[d] = acc[d] * inv;
}
#endif

#ifdef PREFILL_MMA
#include "clops/ptx.cl"
// attn_prefill on NVIDIA tensor cores (mma.sync: float16 inputs, float32 sums), the same output
// within float16's rounding of q, k, v and the weights: a work-group of 4 warps per 64 query
// rows of a head, a warp 16 of them. Tiles of 64 keys and values go to local memory as float16
// rows [key][d] (B fragments of the scores: pairs along d of a key; of the value sums: two
// keys' halves of a dimension). A warp's scores, their online softmax (base 2: q carries
// log2 e) and its output rows stay in registers; a row's sums over its 4 lanes by shuffles.
// Needs HEAD_DIM % 16 == 0; no cap, no window. HALF_OUT 1: out takes float16 values.
// Work geometry: global (ceil(M / 64) * 128, H), local (128, 1).
#define FQ 64
#define FK 64
#define FROW (HEAD_DIM + 8)  // halves a row in local memory: fragment reads hit all banks
#define FND (HEAD_DIM / 8)   // 8-column tiles of a warp's output
#define FKD (HEAD_DIM / 16)  // 16-deep steps of a score
// Picked by attention.attn_prefill for half, uncapped rows (windowed ones causal) where
// prefill_mma holds
__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void attn_prefill_mma(__global float *out, __global const float *q, int q_off, int ld_q,
                      __global const kv_t *kc, __global const kv_t *vc, int k_off, int v_off,
                      int kv_stride, __global const int *state, int pos_add, int causal,
                      int n_keys, int n_rep, float scale, int M SINKS_ARG) {
    __local ushort ks[FK * FROW] __attribute__((aligned(16)));
    __local ushort vs[FK * FROW] __attribute__((aligned(16)));
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int h = get_group_id(1), H = get_num_groups(1);
    const int m0 = get_group_id(0) * FQ, r0 = m0 + 16 * warp + g, r1 = r0 + 8;
    const int base = state[0] + pos_add;
    // keys [0, l0) for row r0, [0, l1) for r1, [0, lw) for the warp, [0, lmax) for the group
    const int l0 = r0 >= M ? 0 : causal ? min(n_keys, base + r0 + 1) : n_keys;
    const int l1 = r1 >= M ? 0 : causal ? min(n_keys, base + r1 + 1) : n_keys;
    const int lw = causal ? min(n_keys, base + min(m0 + 16 * warp + 16, M)) : n_keys;
    const int lmax = causal ? min(n_keys, base + min(m0 + FQ, M)) : n_keys;
    // (WINDOW, causal rows only: keys [f0, l0) for r0, [f1, l1) for r1; the warp's first row's
    // first key fw, the group's fg: tiles wholly before them skipped)
    const int f0 = first_key(base + r0), f1 = first_key(base + r1);
    const int fw = first_key(base + m0 + 16 * warp), fg = first_key(base + m0);
    const float qscale = scale * 1.44269504088896f;
    __global const float *q0 = q + q_off + (size_t)min(r0, M - 1) * ld_q + h * HEAD_DIM + 2 * t;
    __global const float *q1 = q + q_off + (size_t)min(r1, M - 1) * ld_q + h * HEAD_DIM + 2 * t;
    uint qa[FKD][4];
#pragma unroll
    for (int kd = 0; kd < FKD; ++kd) {
        const float2 a = vload2(0, q0 + 16 * kd) * qscale, b = vload2(0, q1 + 16 * kd) * qscale;
        const float2 c = vload2(0, q0 + 16 * kd + 8) * qscale;
        const float2 d = vload2(0, q1 + 16 * kd + 8) * qscale;
        qa[kd][0] = half2_bits(a.x, a.y);
        qa[kd][1] = half2_bits(b.x, b.y);
        qa[kd][2] = half2_bits(c.x, c.y);
        qa[kd][3] = half2_bits(d.x, d.y);
    }
    __global const kv_t *kb = kc + k_off + (size_t)(h / n_rep) * kv_stride;
    __global const kv_t *vb = vc + v_off + (size_t)(h / n_rep) * kv_stride;
    float o[FND][4];
#pragma unroll
    for (int j = 0; j < FND; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mx0 = -INFINITY, mx1 = -INFINITY, s0 = 0.0f, s1 = 0.0f;
#if SINKS
    // the sink as a score of weight 1 at the start (base 2, as the scores); the row's sum is
    // its 4 lanes' parts added, so one lane holds it
    mx0 = mx1 = sinks[h] * 1.44269504088896f;
    s0 = s1 = t == 0 ? 1.0f : 0.0f;
#endif
    for (int j0 = fg / FK * FK; j0 < lmax; j0 += FK) {
        barrier(CLK_LOCAL_MEM_FENCE);  // the last tile is used up
        // (every load of the tile issued before any is stored: one memory latency a tile)
        // PERF (H100, 1B F16 body, a prompt chunk of 128 rows, device time of its 16 layers'
        // launches, runs alternated): 497-543 us with a loop of 4 values a step (each load's
        // value stored before the next load), 480-487 with these
#pragma unroll
        for (int u = 0; u < FK * HEAD_DIM / 8 / 128; ++u) {
            const int i = tid + 128 * u, jj = i / (HEAD_DIM / 8), d = (i % (HEAD_DIM / 8)) * 8;
            const bool in = j0 + jj < lmax;
            const size_t at = (size_t)(j0 + jj) * HEAD_DIM + d;
#if KV_HALF  // (the cache's float16 values as they are)
            const uint4 kk = in ? *(__global const uint4 *)(kb + at) : (uint4)(0u);
            const uint4 vv = in ? *(__global const uint4 *)(vb + at) : (uint4)(0u);
            *(__local uint4 *)(ks + jj * FROW + d) = kk;
            *(__local uint4 *)(vs + jj * FROW + d) = vv;
#else
            const float4 k0 = in ? KV_LOAD4(0, kb + at) : (float4)(0.0f);
            const float4 k1 = in ? KV_LOAD4(1, kb + at) : (float4)(0.0f);
            const float4 v0 = in ? KV_LOAD4(0, vb + at) : (float4)(0.0f);
            const float4 v1 = in ? KV_LOAD4(1, vb + at) : (float4)(0.0f);
            vstore_half4(k0, 0, (__local half *)(ks + jj * FROW + d));
            vstore_half4(k1, 1, (__local half *)(ks + jj * FROW + d));
            vstore_half4(v0, 0, (__local half *)(vs + jj * FROW + d));
            vstore_half4(v1, 1, (__local half *)(vs + jj * FROW + d));
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (j0 >= lw || j0 + FK <= fw) continue;  // the warp's rows attend to none of these
        float p[FK / 8][4];
#pragma unroll
        for (int n = 0; n < FK / 8; ++n) {
            p[n][0] = p[n][1] = p[n][2] = p[n][3] = 0.0f;
            __local const ushort *kr = ks + (8 * n + g) * FROW + 2 * t;
#pragma unroll
            for (int kd = 0; kd < FKD; ++kd)
                mma16816(p[n], qa[kd], *(__local const uint *)(kr + 16 * kd),
                         *(__local const uint *)(kr + 16 * kd + 8));
        }
        float t0 = -INFINITY, t1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < FK / 8; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = j0 + 8 * n + 2 * t + e;
                if (j >= l0 || j < f0) p[n][e] = -INFINITY;
                if (j >= l1 || j < f1) p[n][2 + e] = -INFINITY;
                t0 = fmax(t0, p[n][e]);
                t1 = fmax(t1, p[n][2 + e]);
            }
        t0 = fmax(t0, shfl_xor(t0, 1));
        t0 = fmax(t0, shfl_xor(t0, 2));
        t1 = fmax(t1, shfl_xor(t1, 1));
        t1 = fmax(t1, shfl_xor(t1, 2));
        const float n0 = fmax(mx0, t0), n1 = fmax(mx1, t1);
        // a row with no key yet keeps weight 0 for all (its -inf minus a base of 0)
        const float c0 = n0 == -INFINITY ? 1.0f : exp2(mx0 - n0);
        const float c1 = n1 == -INFINITY ? 1.0f : exp2(mx1 - n1);
        const float b0 = n0 == -INFINITY ? 0.0f : n0, b1 = n1 == -INFINITY ? 0.0f : n1;
        mx0 = n0;
        mx1 = n1;
        float e0 = 0.0f, e1 = 0.0f;
#pragma unroll
        for (int n = 0; n < FK / 8; ++n) {
            p[n][0] = exp2(p[n][0] - b0);
            p[n][1] = exp2(p[n][1] - b0);
            p[n][2] = exp2(p[n][2] - b1);
            p[n][3] = exp2(p[n][3] - b1);
            e0 += p[n][0] + p[n][1];
            e1 += p[n][2] + p[n][3];
        }
        s0 = s0 * c0 + e0;  // this work-item's part of the row's sum
        s1 = s1 * c1 + e1;
#pragma unroll
        for (int j = 0; j < FND; ++j) {
            o[j][0] *= c0;
            o[j][1] *= c0;
            o[j][2] *= c1;
            o[j][3] *= c1;
        }
#pragma unroll
        for (int kk = 0; kk < FK / 16; ++kk) {
            // the scores' fragments are the A fragment of the weights (keys 16 kk ..)
            const uint pa[4] = {half2_bits(p[2 * kk][0], p[2 * kk][1]),
                                half2_bits(p[2 * kk][2], p[2 * kk][3]),
                                half2_bits(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                                half2_bits(p[2 * kk + 1][2], p[2 * kk + 1][3])};
            __local const ushort *vr = vs + (16 * kk + 2 * t) * FROW + g;
#pragma unroll
            for (int j = 0; j < FND; ++j) {
                __local const ushort *v = vr + 8 * j;
                mma16816(o[j], pa, (uint)v[0] | ((uint)v[FROW] << 16),
                         (uint)v[8 * FROW] | ((uint)v[9 * FROW] << 16));
            }
        }
    }
    s0 += shfl_xor(s0, 1);
    s0 += shfl_xor(s0, 2);
    s1 += shfl_xor(s1, 1);
    s1 += shfl_xor(s1, 2);
    const float i0 = s0 > 0.0f ? 1.0f / s0 : 0.0f, i1 = s1 > 0.0f ? 1.0f / s1 : 0.0f;
#if HALF_OUT  // (out holds float16 rows: the output product's input as it reads it)
#define OUT_PAIR(v, at) vstore_half2(v, 0, (__global half *)out + (at))
#else
#define OUT_PAIR(v, at) vstore2(v, 0, out + (at))
#endif
#pragma unroll
    for (int j = 0; j < FND; ++j) {
        const int d = 8 * j + 2 * t;
        if (r0 < M)
            OUT_PAIR((float2)(o[j][0], o[j][1]) * i0, ((size_t)r0 * H + h) * HEAD_DIM + d);
        if (r1 < M)
            OUT_PAIR((float2)(o[j][2], o[j][3]) * i1, ((size_t)r1 * H + h) * HEAD_DIM + d);
    }
}
#endif

// Write k, v rows [M][KV][D] into the cache at positions pos0 + m. Work geometry: (D, KV, M).
// Picked by nn.functional.KVCache.append (no model plan)
__kernel void kv_store(__global kv_t *kc, __global kv_t *vc, __global const float *k,
                       int k_off, __global const float *v, int v_off, int pos0, int max_seq) {
    const int d = get_global_id(0), h = get_global_id(1), m = get_global_id(2);
    const int KV = get_global_size(1);
    const size_t src = ((size_t)m * KV + h) * HEAD_DIM + d;
    const size_t dst = ((size_t)h * max_seq + pos0 + m) * HEAD_DIM + d;
    KV_PUT(k[k_off + src], kc, dst);
    KV_PUT(v[v_off + src], vc, dst);
}

#if CPU_VEC
// The rotation of the head at src (position pos) into dst, both HEAD_DIM floats: four pairs
// at a time (vector sincos). Whole-head rotary (ROT_DIM == HEAD_DIM).
inline void rotate_head(__private float *dst, __global const float *src, float pos,
                        __global const float *inv_freq) {
    for (int c = 0; c < HEAD_DIM / 8; ++c) {
        float4 cs, sn = sincos(pos * vload4(c, inv_freq), &cs);
#if ROPE_NEOX
        const float4 a = vload4(c, src), b = vload4(c, src + HEAD_DIM / 2);
        vstore4(a * cs - b * sn, c, dst);
        vstore4(a * sn + b * cs, c, dst + HEAD_DIM / 2);
#else
        const float8 v = vload8(c, src);
        const float4 r0 = v.even * cs - v.odd * sn, r1 = v.even * sn + v.odd * cs;
        vstore8((float8)(r0.x, r1.x, r0.y, r1.y, r0.z, r1.z, r0.w, r1.w), c, dst);
#endif
    }
}

// Decode on CPUs, one launch a layer: work-item h (a query head) rotates its query and its
// key-value head's new key (from the QKV projection of the row at position state[0]), the first
// query head of each key-value head stores the new key and value in the cache, and each
// attends to the cache's earlier positions and to the new key and value from registers (so no
// work-item reads what another writes in this launch). out [H][D]. Work geometry: global (H),
// local (1). Whole-head rotary, no cap, no window.
// Picked by Model._attention for a plain decode row where cpu_decode holds, no native kernel
__kernel void attn_decode_cpu(__global float *out, __global const float *qkv,
                              __global kv_t *kc, __global kv_t *vc,
                              __global const int *state, __global const float *inv_freq,
                              int max_seq, int n_rep, int H, int KV, float scale) {
    const int h = get_global_id(0), kvh = h / n_rep, pos = state[0];
    float qr[HEAD_DIM], kr[HEAD_DIM];
    rotate_head(qr, qkv + h * HEAD_DIM, (float)pos, inv_freq);
    rotate_head(kr, qkv + (H + kvh) * HEAD_DIM, (float)pos, inv_freq);
#if KV_HALF
    // (the new key and value as the cache keeps them: later steps read them from there)
    float vn[HEAD_DIM];
    for (int d = 0; d < HEAD_DIM; ++d) {
        kr[d] = kv_round(kr[d]);
        vn[d] = kv_round(qkv[(H + KV + kvh) * HEAD_DIM + d]);
    }
#else
    __global const float *vn = qkv + (H + KV + kvh) * HEAD_DIM;
#endif
    __global kv_t *kb = kc + (size_t)kvh * max_seq * HEAD_DIM;
    __global kv_t *vb = vc + (size_t)kvh * max_seq * HEAD_DIM;
    if (h % n_rep == 0)
        for (int d = 0; d < D4; ++d) {
            KV_STORE4(vload4(d, kr), d, kb + (size_t)pos * HEAD_DIM);
            KV_STORE4(vload4(d, vn), d, vb + (size_t)pos * HEAD_DIM);
        }
    float16 qv[D16], acc[D16];
    for (int d = 0; d < D16; ++d) qv[d] = vload16(d, qr) * scale;
    // the new key first (its score is the running max to begin with), then the cache's
    float mx = dot16(qv, kr), l = 1.0f;
    for (int d = 0; d < D16; ++d) acc[d] = vload16(d, vn);
    attend_cpu(qv, acc, &mx, &l, kb, vb, 0, pos);
    const float inv = 1.0f / l;
    for (int d = 0; d < D16; ++d) vstore16(acc[d] * inv, d, out + h * HEAD_DIM);
}

// Batched decode on CPUs over a paged cache (clops.llm.batch; kernels/paged.cl spells out the
// pool, table, rslot and rpos): work-item (h, r) attends query head h of row r, the position
// rpos[r] of the sequence in slot rslot[r], to that sequence's keys 0..rpos[r], block by
// block (a block's positions lie HEAD_DIM apart), 16-wide with one exp per key (the last
// WINDOW positions only where WINDOW > 0; no SOFTCAP: paged.cl's paged_attn caps). q and out
// [R][H][D]. Work geometry: global (1, H, R), local (1, 1, 1) (paged_attn's axes).
// Picked by paged.attention (a batch's rows, llm/step.py) where cpu_decode holds, uncapped
__kernel void paged_attn_cpu(__global float *out, __global const float *q,
                             __global const kv_t *kp, __global const kv_t *vp,
                             __global const int *table, int maxb, __global const int *rslot,
                             __global const int *rpos, int H, int KV, int BS,
                             float scale SINKS_ARG) {
    const int h = get_global_id(1), r = get_global_id(2);
    const int pos = rpos[r], slot = rslot[r], kvh = h / (H / KV);
    __global const float *qr = q + ((size_t)r * H + h) * HEAD_DIM;
    float16 qv[D16], acc[D16];
    for (int d = 0; d < D16; ++d) {
        qv[d] = vload16(d, qr) * scale;
        acc[d] = (float16)(0.0f);
    }
    // (the first key's score exceeds -INFINITY: acc * 0 + v, l = 0 * 0 + 1)
    float mx = -INFINITY, l = 0.0f;
#if SINKS
    mx = sinks[h];
    l = 1.0f;
#endif
    const int first = first_key(pos);
    for (int j = first / BS; j * BS <= pos; ++j) {
        const size_t at = ((size_t)table[slot * maxb + j] * KV + kvh) * BS * HEAD_DIM;
        attend_cpu(qv, acc, &mx, &l, kp + at, vp + at, max(0, first - j * BS),
                   min(BS, pos + 1 - j * BS));
    }
    const float inv = 1.0f / l;
    __global float *o = out + ((size_t)r * H + h) * HEAD_DIM;
    for (int d = 0; d < D16; ++d) vstore16(acc[d] * inv, d, o);
}
#endif
