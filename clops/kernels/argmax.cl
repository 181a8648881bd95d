// The argmax kernels of choosing a token: greedy (temperature <= 0: the argmax of the
// penalized logits over several work-groups), head_greedy (a float16 LM head's logits and
// that argmax in one launch) and row_stats (a batch's rows' argmax, max and log-sum-exp).
// They live apart from sample.cl's sampler: building them does not build it (Intel's CPU
// compiler aborted now and then while building that kernel).

#include "clops/fence.cl"  // GLOBAL_FENCE (choose.cl's)
#include "clops/choose.cl"  // penalized, reduce_sum, reduce_argmax, greedy_choose

// Greedy choice (sample at temperature <= 0) over NG work-groups of NT work-items: the argmax
// (first index on ties) of the penalized logits, each work-group's then the last one's
// (greedy_choose), writing the id as sample does.
// PERF (H100, vocab 49152, kernel time a decode step under profiling, 2026-11-27): 24
// work-groups of 512 8.6-8.9 us (three machines), sample's one work-group 16.5-16.6 (two).
// Work geometry: global (NG * NT), local (NT).
__kernel void greedy(__global int *tokens, __global int *state, __global uchar *restrict seen,
                     __global const float *restrict logits, int l_off, __global float *z, int V,
                     int advance, float penalty) {
    __local float redf[NT];
    __local int redi[NT];
    __local int last;
    const int lid = get_local_id(0), g = get_group_id(0), NG = get_num_groups(0);
    __global const float *lg = logits + l_off;
    float best = -INFINITY;
    int bi = V;
#pragma unroll 4
    for (int v = g * NT + lid; v < V; v += NG * NT) {
        const float l = penalized(lg, seen, v, penalty);
        if (l > best || (l == best && v < bi)) {
            best = l;
            bi = v;
        }
    }
    greedy_choose(best, bi, tokens, state, seen, z, V, advance, redf, redi, &last);
}

#ifdef HK
#if HPTX
#include "clops/ptx.cl"  // shfl_xor, ld_stream, half2_floats
#define HLOAD(p) ld_stream(p)
#else
#define HLOAD(p) (*(p))
#endif
// The sum of v over this work-item's team of 32 (a warp), on every work-item of it; every
// work-item of the group calls it (the portable path meets at barriers).
inline float team32_sum(float v, __local float *red, int lid) {
#if HPTX
    for (int o = 16; o > 0; o >>= 1) v += shfl_xor(v, o);
    return v;
#else
    barrier(CLK_LOCAL_MEM_FENCE);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = 16; s > 0; s >>= 1) {
        if ((lid & 31) < s) red[lid] += red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return red[lid & ~31];
#endif
}

#define HCH (HK / 256)  // a lane's 16-byte chunks of a row (8 values each)

// the two float16 values of v (the low half first)
#if HPTX
inline float2 halves(uint v) { return half2_floats(v); }
#else
inline float2 halves(uint v) { return vload_half2(0, (const __private half *)&v); }
#endif

// the dot product of a chunk's 8 float16 values with a, b
inline float chunk8(uint4 u, float4 a, float4 b) {
    const float2 p = halves(u.x), q = halves(u.y), r = halves(u.z), s = halves(u.w);
    return dot((float4)(p, q), a) + dot((float4)(r, s), b);
}
#ifndef HRB
#define HRB 2  // rows a team loads at a time
#endif

// lane's chunks of rows r .. r + HRB - 1 (at most r1 - 1; chunk c: values 8 (32 c + lane) ..)
inline void head_load(__global const uint4 *W, int r, int r1, int lane, uint4 *u) {
#pragma unroll
    for (int j = 0; j < HRB; ++j) {
        __global const uint4 *row = W + (size_t)min(r + j, r1 - 1) * (HK / 8);
#pragma unroll
        for (int c = 0; c < HCH; ++c) u[j * HCH + c] = HLOAD(row + 32 * c + lane);
    }
}

// rows r .. r + HRB - 1's logits from the lane's chunks u (their sums over the team), stored
// where below r1, and the work-item's argmax of the penalized logits (lane 0's rows) updated
inline void head_use(const uint4 *u, int r, int r1, int lane, int lid, __local const float4 *xa,
                     __local const float4 *xb, float inv, __local float *red,
                     __global float *logits, __global const uchar *seen, float penalty,
                     float *best, int *bi) {
#pragma unroll
    for (int j = 0; j < HRB; ++j) {
        float acc = 0.0f;
#pragma unroll
        for (int c = 0; c < HCH; ++c)
            acc += chunk8(u[j * HCH + c], xa[32 * c + lane], xb[32 * c + lane]);
        acc = team32_sum(acc, red, lid);
        if (lane == 0 && r + j < r1) {
            float l = acc * inv;
            logits[r + j] = l;
            if (penalty != 1.0f && seen[r + j]) l = l > 0.0f ? l / penalty : l * penalty;
            // (rows rise: the first index of a tie stays; without a branch: PoCL lost the
            // branch's updates of these, live across the loop's barriers)
            const bool up = l > *best;
            *bi = up ? r + j : *bi;
            *best = fmax(l, *best);
        }
    }
}

// The LM head of one row with float16 weights w [V][HK] (row-major), and the greedy token:
// logits[l_off + v] = rsqrt(mean(x^2) + eps) * sum_i x[i] nw[i] w[v][i] where NORM (else
// x . w[v]), then the argmax of the logits as `greedy` penalizes them, chosen as it does
// (greedy_choose: state[3] zero before and after). The teams of 32 work-items take HRB rows at
// a time, the work-groups' teams in turn (all of them read neighbouring rows at once); a team's
// next rows are loaded before those it has are used, its first ones before x is staged (the
// kernel saves the logits' round trip through memory and greedy's launch).
// PERF (H100, the 1B F16 body's head of 49152 x 2048, kernel time a decode step under
// profiling, runs of one machine, 2026-11-27): 74.4-75.0 us (76.1 in a later run, once its
// loop met its barriers unconditionally) against the product's 71.7-72.1 and greedy's 8.1-8.3;
// decode tok/s 1103-1117 against 1103-1111 (within the runs' spread).
// Loads through L1 78.2-78.6 (then each work-group a range of rows of its own rather than the
// teams in turn, 81-83, against 81-82); 2 / 4 work-groups a compute unit 77.2 / 81.9 against
// 75.0 with one; a team's 2 rows at a time 74.5, 1 75.0, 3 (through L1, registers spilled)
// 221; float16 values by vload_half8 of a chunk rather than by pairs 74.9 (81.0 against 78.2
// through L1). The first 4096 / 8192 rows (16 / 32 MB) loaded with an L2 evict_last cache
// policy (createpolicy, ld.global.L2::cache_hint), so that they might stay in L2 from one step
// to the next: decode tok/s 1132-1137 / 1131-1133 against 1147-1150 (2026-11-27, alternately
// in one process).
// Work geometry: global (NG * NT), local (NT); NT a multiple of 32, NG <= V.
__kernel void head_greedy(__global int *tokens, __global int *state, __global uchar *restrict seen,
                          __global float *restrict logits, int l_off, __global float *z,
                          int V, int advance, float penalty, __global const float *restrict x,
                          int x_off, __global const float *restrict nw, float eps,
                          __global const uint4 *restrict w) {
    __local float4 xa[HK / 8], xb[HK / 8];  // (chunk q's values 8 q .. 8 q + 3, + 4 .. + 7)
    __local float redf[NT];
    __local int redi[NT];
    __local int last;
    const int lid = get_local_id(0), lane = lid & 31, NWG = NT / 32, wi = lid >> 5;
    const int g = get_group_id(0), NG = get_num_groups(0);
    const int r0 = (g * NWG + wi) * HRB, r1 = V;  // (the team's first row)
    const int step = NG * NWG * HRB, its = (V + step - 1) / step;  // (uniform: the barriers)
    uint4 ua[HRB * HCH], ub[HRB * HCH];
    head_load(w, r0, r1, lane, ua);
    if (its > 1) head_load(w, r0 + step, r1, lane, ub);
    __global const float *xr = x + x_off;
    float inv = 1.0f;
#if NORM
    float ss = 0.0f;
    for (int i = lid; i < HK; i += NT) ss = mad(xr[i], xr[i], ss);
    inv = rsqrt(reduce_sum(ss, redf, lid) / HK + eps);
#endif
    for (int q = lid; q < HK / 8; q += NT) {
        float4 a = vload4(2 * q, xr), b = vload4(2 * q + 1, xr);
#if NORM
        a *= vload4(2 * q, nw);
        b *= vload4(2 * q + 1, nw);
#endif
        xa[q] = a;
        xb[q] = b;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    __global float *lg = logits + l_off;
    float best = -INFINITY;
    int bi = V;
    // (every team calls head_use, and so meets its barriers, the same number of times: an odd
    // its' last call is for rows past V, which store nothing)
    for (int it = 0; it < its; it += 2) {
        const int ra = r0 + it * step, rb = ra + step;
        head_use(ua, ra, r1, lane, lid, xa, xb, inv, redf, lg, seen, penalty, &best, &bi);
        if (it + 2 < its) head_load(w, rb + step, r1, lane, ua);
        head_use(ub, rb, r1, lane, lid, xa, xb, inv, redf, lg, seen, penalty, &best, &bi);
        if (it + 3 < its) head_load(w, rb + 2 * step, r1, lane, ub);
    }
    barrier(CLK_LOCAL_MEM_FENCE);  // (team32_sum's last reads of redf)
    greedy_choose(best, bi, tokens, state, seen, z, V, advance, redf, redi, &last);
}
#endif

// Per row of logits [R][V] (a work-group of NT work-items per row): the argmax (first index on
// ties, as numpy's), the max and the log-sum-exp, so that a greedy batched step reads 12 bytes
// a row instead of the row. stats[r] = (argmax as float bits, max, lse). A NaN logit makes the
// lse NaN, and a row of -inf gives argmax V: the host then reads the row itself.
// Work geometry: global (NT, R), local (NT, 1).
__kernel void row_stats(__global float *restrict stats, __global const float *restrict logits,
                        int V) {
    __local float redf[NT];
    __local int redi[NT];
    const int lid = get_local_id(0), r = get_group_id(1);
    __global const float *lg = logits + (size_t)r * V;
    float best = -INFINITY;
    int bi = V;
    for (int v = lid; v < V; v += NT) {
        const float l = lg[v];
        if (l > best) {  // (v rises: the first index of a tie stays)
            best = l;
            bi = v;
        }
    }
    int am;
    const float mx = reduce_argmax(best, bi, redf, redi, lid, &am);
    float acc = 0.0f;
    for (int v = lid; v < V; v += NT) acc += exp(lg[v] - mx);
    const float total = reduce_sum(acc, redf, lid);  // (it waits for every read of redf)
    if (lid == 0) {
        stats[3 * r] = as_float(am);
        stats[3 * r + 1] = mx;
        stats[3 * r + 2] = mx + log(total);
    }
}
