// decode_layers: NL consecutive decoder layers of a decode step (one row) in one launch. A
// persistent kernel: its G work-groups all run at once (kernels/layer.py launches no more than
// its probe found resident) and meet at grid barriers between the phases of each layer:
//   A  qkv = Wqkv . (RMSNorm(x) * anw), as is (not rotated)
//   B  attention over chunks of LS positions, a key-value head's query heads together (or a
//      query head a unit where that leaves work-groups idle): q and the new key rotated by pos
//      as they are read, the new key and value stored in the cache; the last work-group of a
//      key-value head to finish combines its chunks' partials -> attn
//   C  x += Wo . attn
//   D  h = silu(Wg . n(x)) * (Wu . n(x)), n(x) = RMSNorm(x) * fnw ([gate | up] rows of Wgu)
//   E  x += Wd . h
// and between E and the next layer's A (the last layer's: the launch boundary). Each phase's
// rows are dealt to the warps of all work-groups, R rows a warp (a task), and a warp's rows of
// the phase's first task are loaded into registers between the two halves of the grid barrier
// that opens the phase: the weights stream while the work-groups wait. Each phase's input
// vector is read by every work-group that has rows in it and quantized into local memory (int8,
// a scale per 32 values, the sums of the int8 values per 32 for q4's minimums); the weights (q4:
// 16 nibble bytes and a (scale, min) pair per 32; q8: 32 bytes and a scale per 32; half or float
// scales) meet it through 4-byte integer dot products.
// Compile-time: NL (1 to 8), DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, QKMAX (the longest input: max
// of DIM, HEADS * HEAD_DIM, FFN), WF_QKV, WF_O, WF_GU, WF_D (3 q4, 4 q8), SH_QKV, SH_O, SH_GU,
// SH_D (1: half scales, 0: float), R_QKV, R_O, R_GU (pairs of a gate and an up row), R_D (rows
// a task, kernels/layer.py's rows_per_task), ROPE_NEOX, PTX (NVIDIA: dp4a, shfl.sync, fences
// and atomics of the PTX memory model), SPIN_LIMIT, PHASES (a bitmask of the phases A..E that
// run, for timing them apart: default all), QUERY_UNITS (B's units: -1 by the positions, 1 a
// query head's, 0 a key-value head's), KV_HALF (1: float16 caches, clops/kv.cl).
// Work geometry: global (G * LS), local (LS).
#define LS 256
#define NW (LS / 32)
#define D HEAD_DIM
#define N_REP (HEADS / KV_HEADS)
#define NQKV ((HEADS + 2 * KV_HEADS) * HEAD_DIM)
// attention: float4 groups of a head, sets of positions of a chunk
#define DG (HEAD_DIM / 4)
#define PS (LS / DG)
// (row, block of 32) pairs a work-item holds in registers: q4 one uint4 each, q8 two
#ifndef SLOTS
#define SLOTS 16
#endif
#ifndef PHASES
#define PHASES 31
#endif
#ifndef QUERY_UNITS
#define QUERY_UNITS (-1)
#endif
#ifndef SPIN_LIMIT
#define SPIN_LIMIT (1 << 26)
#endif
// PERF (H100, 1B Q4_0, B alone, where a work-item reads its key row by itself): kv_row4's
// 8-byte loads took attention from 9.1 to 4.2 us a layer at 191 positions, 16.9 -> 10.9 at 4001
// (decode at 128 positions 1318 -> 1394 tok/s)
#define KV_PTX PTX
#include "clops/kv.cl"  // KV_HALF: the caches' element type
#if 64 % HEAD_DIM || HEAD_DIM % 4
#error "decode_layers: HEAD_DIM must divide 64 (a multiple of 4)"
#endif

#if PTX
inline int dot4(uint a, uint b, int c) {
    int d;
    asm volatile("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
#include "clops/ptx.cl"  // shfl_xor
#else
inline int dot4(uint a, uint b, int c) {
    const int4 p = convert_int4(as_char4(a)) * convert_int4(as_char4(b));
    return c + (p.x + p.y) + (p.z + p.w);
}
#endif

typedef volatile __global const float *vin;  // written by other work-groups of this launch

// Four floats written by other work-groups of this launch: from L2 (NVIDIA's L1 is not
// coherent between multiprocessors), not reordered across the grid barriers.
inline float4 load4_fresh(__global const float *p) {
#if PTX
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
#else
    const vin q = (vin)p;
    return (float4)(q[0], q[1], q[2], q[3]);
#endif
}

// The sum of v over each warp, in its lane 0 (every work-item of the group calls it).
inline float warp_total(float v, __local float *red) {
#if PTX
    for (int o = 16; o > 0; o >>= 1) v += shfl_xor(v, o);
    return v;
#else
    const int t = get_local_id(0);
    red[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    float s = 0.0f;
    if ((t & 31) == 0)
        for (int i = 0; i < 32; ++i) s += red[t + i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return s;
#endif
}

// The sum (max: the largest) of v over the work-group, in every work-item.
inline float group_reduce(float v, __local float *red, bool max_of) {
    const int t = get_local_id(0);
    red[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LS / 2; s > 0; s >>= 1) {
        if (t < s) red[t] = max_of ? fmax(red[t], red[t + s]) : red[t] + red[t + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// The sums (max_of: the largest) of v[r], r < nr <= N_REP, over the work-group, into v[] of
// every work-item.
inline void reduce_rep(float *v, int nr, bool max_of, __local float *redn) {
    const int t = get_local_id(0);
#if PTX
    const int w = t >> 5;
#pragma unroll
    for (int r = 0; r < N_REP; ++r) {
        if (r >= nr) break;
        float x = v[r];
        for (int o = 16; o > 0; o >>= 1) {
            const float u = shfl_xor(x, o);
            x = max_of ? fmax(x, u) : x + u;
        }
        if ((t & 31) == 0) redn[r * NW + w] = x;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int r = 0; r < N_REP; ++r) {
        if (r >= nr) break;
        float x = redn[r * NW];
        for (int i = 1; i < NW; ++i) x = max_of ? fmax(x, redn[r * NW + i]) : x + redn[r * NW + i];
        v[r] = x;
    }
#else
    for (int r = 0; r < nr; ++r) redn[r * LS + t] = v[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LS / 2; s > 0; s >>= 1) {
        if (t < s)
            for (int r = 0; r < nr; ++r) {
                const float a = redn[r * LS + t], b = redn[r * LS + t + s];
                redn[r * LS + t] = max_of ? fmax(a, b) : a + b;
            }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int r = 0; r < nr; ++r) v[r] = redn[r * LS];
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
}

// The grid barrier: bar[0] counts the arrivals of every work-group at every barrier, launch
// after launch, and never goes back; a barrier is met when the count reaches the work-group's
// target, G more than at the one before. A launch's first target: the count at its start
// rounded down to a multiple of G (every barrier before it was met, and none of this launch's
// can be until this work-group arrives) plus G. bar[2]: set by a work-group that gave up
// waiting (not all resident: say so rather than hang). Work-item 0 of each group keeps the
// target. The PTX path counts in 64 bits, arriving with a release add and waiting on relaxed
// loads and an acquire fence (about 1 us a barrier of 132 work-groups on an H100, where a
// membar.gl and a count reset by the last to arrive took 1.8); the portable path counts in 32
// (work-groups run one at a time on CPUs: tests only). ACQUIRE() also fences the chunks'
// combine in B.
#if PTX
typedef ulong count_t;
inline count_t count_now(__global int *bar) {
    ulong v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(bar) : "memory");
    return v;
}
inline void arrive(__global int *bar) {
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" :: "l"(bar) : "memory");
}
#define ACQUIRE() asm volatile("fence.acq_rel.gpu;" ::: "memory")
#else
typedef uint count_t;
inline count_t count_now(__global int *bar) { return (uint)((volatile __global int *)bar)[0]; }
inline void arrive(__global int *bar) {
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    atomic_inc(bar);
}
#define ACQUIRE() mem_fence(CLK_GLOBAL_MEM_FENCE)
#endif

inline count_t grid_start(__global int *bar) {
    const count_t v = count_now(bar), g = get_num_groups(0);
    return v - v % g;
}

// A grid barrier in two halves: grid_arrive once the work-group's writes of the phase are done,
// grid_wait before it reads the others'. Between them a work-group issues the loads of the
// next phase's weights: they stream while it waits (a release before them would wait for them).
inline void grid_arrive(__global int *bar, count_t *target) {
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) {
        *target += get_num_groups(0);
        arrive(bar);
    }
}

inline void grid_wait(__global int *bar, count_t target) {
    if (get_local_id(0) == 0) {
        int spins = 0;
        while (count_now(bar) < target)
            if (++spins > SPIN_LIMIT) {
                ((volatile __global int *)bar)[2] = 1;
                break;
            }
        ACQUIRE();
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

inline void grid_sync(__global int *bar, count_t *target) {
    grid_arrive(bar, target);
    grid_wait(bar, *target);
}

// [p, p + bytes) into L2, shared by the work-items of the launch (a hint: nothing waits on it).
inline void l2_prefetch(__global const uchar *p, size_t bytes) {
#if PTX
    for (size_t i = get_global_id(0) * 128; i < bytes; i += get_global_size(0) * 128)
        asm volatile("prefetch.global.L2 [%0];" :: "l"(p + i));
#endif
}

// The largest (max_of) or the sum of v over the 8 work-items of an aligned group of 8.
inline float eight(float v, bool max_of, __local float *red) {
#if PTX
    for (int o = 1; o < 8; o <<= 1) {
        const float u = shfl_xor(v, o);
        v = max_of ? fmax(v, u) : v + u;
    }
    return v;
#else
    const int t = get_local_id(0), g = t & ~7;
    red[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    float r = red[g];
    for (int i = 1; i < 8; ++i) r = max_of ? fmax(r, red[g + i]) : r + red[g + i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
#endif
}
// The work-group quantizes v[i] = src[i] * (nw ? nw[i] : 1), i < K, into xq (int8, 4 a uint,
// block b of 32 values at xq[8 b ..]), xd (per block: amax / 127) and xs (per block: the sum of
// its int8 values), and returns this work-item's part of the sum of squares of src (the RMS of
// a norm: int8 values are the same for any scale of v, so 1 / RMS multiplies the sums after).
// Eight work-items a block, four values each; every round's loads are issued before any is
// used (one memory latency, not one a round), and every work-item runs every round (the
// shuffles and barriers of eight()).
#define QR ((QKMAX / 4 + LS - 1) / LS)
inline float quantize(__global const float *src, int K, __global const float *nw,
                      __local uint *xq, __local float *xd, __local int *xs, __local float *red) {
    const int t = get_local_id(0);
    float4 v[QR];
    float ss = 0.0f;
#pragma unroll
    for (int r = 0; r < QR; ++r) {
        const int i = r * LS + t;
        v[r] = r * LS < K / 4 && i < K / 4 ? load4_fresh(src + 4 * i) : (float4)(0.0f);
    }
#pragma unroll
    for (int r = 0; r < QR; ++r) {
        if (r * LS >= K / 4) break;  // (the same for every work-item)
        const int i = r * LS + t;
        const bool in = i < K / 4;
        ss += dot(v[r], v[r]);
        const float4 u = in && nw ? v[r] * vload4(i, nw) : v[r];
        const float amax = eight(fmax(fmax(fabs(u.x), fabs(u.y)), fmax(fabs(u.z), fabs(u.w))),
                                 true, red);
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        const int4 q = convert_int4_rte(u * id);
        const float sum = eight((float)(q.x + q.y + q.z + q.w), false, red);
        if (in) {
            xq[i] = (uint)(q.x & 0xff) | (uint)(q.y & 0xff) << 8 | (uint)(q.z & 0xff) << 16 |
                    (uint)(q.w & 0xff) << 24;
            if ((t & 7) == 0) {
                xd[i >> 3] = amax / 127.0f;
                xs[i >> 3] = (int)sum;
            }
        }
    }
    return ss;
}

// After quantize() of a norm's input: 1 / RMS (eps inside the root) in every work-item; its
// reduction's barriers also publish the quantized x.
inline float rms_after(float ss, int K, float eps, __local float *red) {
    return rsqrt(group_reduce(ss, red, false) / K + eps);
}

// After quantize() without a norm: publish the quantized x.
inline void quantized(void) { barrier(CLK_LOCAL_MEM_FENCE); }

// ---- a warp's rows ----
// Blocks of 32 in a row of K, and a lane's share of them (blocks lane, lane + 32, ...).
#define NB(K) ((K) / 32)
#define KB(K) ((NB(K) + 31) / 32)
// bytes of a block's scales: q4 a (scale, min) pair, q8 a scale; half (sh) or float
#define SCALE_BYTES(fmt, sh) (((fmt) == 3 ? 2 : 1) * ((sh) ? 2 : 4))

// Loads rows[0 .. R) of W [N][K] (format fmt), this lane's blocks, into slots e * KB(K) + i:
// q4 a uint4 of nibbles and (scale, min) in d; q8 two uint4 in a and b, the scale in d.x.
inline void fetch(const int fmt, const int sh, __global const uchar *W,
                  __global const half *S, const int K,
                  const int *rows, const int R, const int lane, uint4 *a, uint4 *b,
                  float2 *d) {
#pragma unroll
    for (int e = 0; e < R; ++e)
#pragma unroll
        for (int i = 0; i < KB(K); ++i) {
            const int blk = lane + 32 * i, s = e * KB(K) + i;
            const size_t n = (size_t)rows[e];
            a[s] = b[s] = (uint4)(0u);
            d[s] = (float2)(0.0f);
            if (blk < NB(K)) {
                if (fmt == 3) {
                    a[s] = ((__global const uint4 *)(W + n * (K / 2)))[blk];
                    d[s] = sh ? vload_half2(n * NB(K) + blk, S)
                              : vload2(n * NB(K) + blk, (__global const float *)S);
                } else {
                    __global const uint4 *wr = (__global const uint4 *)(W + n * K);
                    a[s] = wr[2 * blk];
                    b[s] = wr[2 * blk + 1];
                    d[s].x = sh ? vload_half(n * NB(K) + blk, S)
                                : ((__global const float *)S)[n * NB(K) + blk];
                }
            }
        }
}

// The sums over the warp of the fetched rows . the quantized x, in r[0 .. R) (lane 0).
inline void dots(const int fmt, const int K, const int R, const int lane, const uint4 *a,
                 const uint4 *b, const float2 *d, __local const uint *xq,
                 __local const float *xd, __local const int *xs, __local float *red,
                 float *r) {
    const uint M = 0x0f0f0f0fu;
#pragma unroll
    for (int e = 0; e < R; ++e) r[e] = 0.0f;
#pragma unroll
    for (int i = 0; i < KB(K); ++i) {
        const int blk = min(lane + 32 * i, NB(K) - 1);  // (past the row: zero weights)
        const uint4 x0 = vload4(2 * blk, xq), x1 = vload4(2 * blk + 1, xq);
        const float dx = xd[blk], sx = dx * (float)xs[blk];
#pragma unroll
        for (int e = 0; e < R; ++e) {
            const int s = e * KB(K) + i;
            int p;
            if (fmt == 3) {
                p = dot4(a[s].x & M, x0.x, 0);
                p = dot4(a[s].y & M, x0.y, p);
                p = dot4(a[s].z & M, x0.z, p);
                p = dot4(a[s].w & M, x0.w, p);
                p = dot4((a[s].x >> 4) & M, x1.x, p);
                p = dot4((a[s].y >> 4) & M, x1.y, p);
                p = dot4((a[s].z >> 4) & M, x1.z, p);
                p = dot4((a[s].w >> 4) & M, x1.w, p);
                r[e] = mad(d[s].x * dx, (float)p, mad(d[s].y, sx, r[e]));
            } else {
                p = dot4(a[s].x, x0.x, 0);
                p = dot4(a[s].y, x0.y, p);
                p = dot4(a[s].z, x0.z, p);
                p = dot4(a[s].w, x0.w, p);
                p = dot4(b[s].x, x1.x, p);
                p = dot4(b[s].y, x1.y, p);
                p = dot4(b[s].z, x1.z, p);
                p = dot4(b[s].w, x1.w, p);
                r[e] = mad(d[s].x * dx, (float)p, r[e]);
            }
        }
    }
#pragma unroll
    for (int e = 0; e < R; ++e) r[e] = warp_total(r[e], red);
}

// The rows of task k of a phase of N rows, R a task, for warp w of work-group grp: task
// (k * G + grp) * NW + w, rows from R times that on (past N: row N - 1, its sums dropped).
// Work-groups loop over k while their first warp's task has rows (the same in all its warps:
// warp_total's barriers on portable devices).
#define TASK0(k, R) ((((k) * get_num_groups(0) + get_group_id(0)) * NW) * (R))
inline void task_rows(int k, const int R, const int N, int w, int *rows) {
    const int n0 = TASK0(k, R) + w * R;
#pragma unroll
    for (int e = 0; e < R; ++e) rows[e] = min(n0 + e, N - 1);
}

// The phase's y[n] (+)= total * f for the task's rows below N (lane 0); accumulating reads y
// from L2 (written by other work-groups earlier in the launch).
inline void task_store(int k, const int R, const int N, int w, int lane, const float *r,
                       float f, __global float *y, bool accum) {
    const int n0 = TASK0(k, R) + w * R;
    if (lane == 0)
#pragma unroll
        for (int e = 0; e < R; ++e)
            if (n0 + e < N) y[n0 + e] = accum ? ((vin)y)[n0 + e] + r[e] * f : r[e] * f;
}

// Element t of the head at v (raw, written in A by other work-groups) turned by pos.
inline float rotated(__global const float *v, int t, int pos, __global const float *inv_freq) {
#if ROPE_NEOX
    const int i = t < D / 2 ? t : t - D / 2, a = i, b = i + D / 2;
#else
    const int i = t >> 1, a = 2 * i, b = 2 * i + 1;
#endif
    float c, sn = sincos((float)pos * inv_freq[i], &c);
    const float va = ((vin)v)[a], vb = ((vin)v)[b];
    return t == a ? va * c - vb * sn : va * sn + vb * c;
}

#define PARTS_PTX PTX
#include "clops/partials.cl"  // combine_parts: a head's chunks' partials, combined

// The rows of a [gate | up] task: pair e is gate row j and up row FFN + j, j = the task's e-th.
inline void pair_rows(int k, int w, int *rows) {
    const int j0 = TASK0(k, R_GU) + w * R_GU;
#pragma unroll
    for (int e = 0; e < R_GU; ++e) {
        rows[2 * e] = min(j0 + e, FFN - 1);
        rows[2 * e + 1] = FFN + rows[2 * e];
    }
}

// A layer's arguments (suffix i: the launch's i-th layer) and the one of layer l among them.
#define LAYER_ARGS(i)                                                                          \
    __global const float *anw##i, __global const uchar *wqkv##i, __global const half *sqkv##i, \
        __global kv_t *kc##i, __global kv_t *vc##i, __global const float *inv_freq##i,         \
        __global const uchar *wo##i, __global const half *so##i, __global const float *fnw##i, \
        __global const uchar *wgu##i, __global const half *sgu##i, __global const uchar *wd##i, \
        __global const half *sd##i
#if NL > 1
#define L1(n, l) : (l) == 1 ? n##1
#else
#define L1(n, l)
#endif
#if NL > 2
#define L2(n, l) : (l) == 2 ? n##2
#else
#define L2(n, l)
#endif
#if NL > 3
#define L3(n, l) : (l) == 3 ? n##3
#else
#define L3(n, l)
#endif
#if NL > 4
#define L4(n, l) : (l) == 4 ? n##4
#else
#define L4(n, l)
#endif
#if NL > 5
#define L5(n, l) : (l) == 5 ? n##5
#else
#define L5(n, l)
#endif
#if NL > 6
#define L6(n, l) : (l) == 6 ? n##6
#else
#define L6(n, l)
#endif
#if NL > 7
#define L7(n, l) : (l) == 7 ? n##7
#else
#define L7(n, l)
#endif
#if NL > 8
#error "decode_layers: at most 8 layers a launch"
#endif
#define SEL(n, l) ((l) == 0 ? n##0 L1(n, l) L2(n, l) L3(n, l) L4(n, l) L5(n, l) L6(n, l) \
                       L7(n, l) : n##0)

// NL consecutive decoder layers (the same formats), one after another, a grid barrier between.
__kernel __attribute__((reqd_work_group_size(LS, 1, 1)))
void decode_layers(__global float *x, __global float *qkv, __global const int *state,
                   __global float *attn, __global float *part, __global int *count,
                   __global float *h, __global int *bar, int max_seq, float eps, float scale,
                   LAYER_ARGS(0)
#if NL > 1
                   , LAYER_ARGS(1)
#endif
#if NL > 2
                   , LAYER_ARGS(2)
#endif
#if NL > 3
                   , LAYER_ARGS(3)
#endif
#if NL > 4
                   , LAYER_ARGS(4)
#endif
#if NL > 5
                   , LAYER_ARGS(5)
#endif
#if NL > 6
                   , LAYER_ARGS(6)
#endif
#if NL > 7
                   , LAYER_ARGS(7)
#endif
                   ) {
    __local uint xq[QKMAX / 4];
    __local float xd[QKMAX / 32];
    __local int xs[QKMAX / 32];
    __local float red[LS], pl[N_REP * LS], y[N_REP * D], kn[D], vn[D], redn[N_REP * LS];
    __local float4 red4[LS];
    __local int last;
    const int t = get_local_id(0), w = t >> 5, lane = t & 31;
    const int grp = get_group_id(0), G = get_num_groups(0);
    const int pos = state[0], L = pos + 1;
    count_t target = 0;
    if (t == 0) target = grid_start(bar);
    uint4 wa[SLOTS], wb[SLOTS];
    float2 wdd[SLOTS];
    int rows[SLOTS];
    float r[SLOTS];
    const bool has_a = (PHASES & 1) && TASK0(0, R_QKV) < NQKV;
    if (has_a) {
        task_rows(0, R_QKV, NQKV, w, rows);
        fetch(WF_QKV, SH_QKV, wqkv0, sqkv0, DIM, rows, R_QKV, lane, wa, wb, wdd);
    }
    for (int l = 0; l < NL; ++l) {
        __global const float *anw = SEL(anw, l), *inv_freq = SEL(inv_freq, l), *fnw = SEL(fnw, l);
        __global const uchar *wqkv = SEL(wqkv, l), *wo = SEL(wo, l), *wgu = SEL(wgu, l),
                             *wd = SEL(wd, l);
        __global const half *sqkv = SEL(sqkv, l), *so = SEL(so, l), *sgu = SEL(sgu, l),
                            *sd = SEL(sd, l);
        __global kv_t *kc = SEL(kc, l), *vc = SEL(vc, l);

        // ---- A: qkv = Wqkv . n(x) (the first task's rows loaded before) ----
        if (has_a) {
            const float fa = rms_after(quantize(x, DIM, anw, xq, xd, xs, red), DIM, eps, red);
            for (int k = 0; TASK0(k, R_QKV) < NQKV; ++k) {
                if (k > 0) {
                    task_rows(k, R_QKV, NQKV, w, rows);
                    fetch(WF_QKV, SH_QKV, wqkv, sqkv, DIM, rows, R_QKV, lane, wa, wb, wdd);
                }
                dots(WF_QKV, DIM, R_QKV, lane, wa, wb, wdd, xq, xd, xs, red, r);
                task_store(k, R_QKV, NQKV, w, lane, r, fa, qkv, false);
            }
        }
        grid_arrive(bar, &target);
        // the GLU's and the down projection's weights into L2 while attention reads little
        if (PHASES & 8) {
            l2_prefetch(wgu, (size_t)2 * FFN * DIM / (WF_GU == 3 ? 2 : 1));
            l2_prefetch((__global const uchar *)sgu,
                        (size_t)2 * FFN * NB(DIM) * SCALE_BYTES(WF_GU, SH_GU));
        }
        if (PHASES & 16) {
            l2_prefetch(wd, (size_t)DIM * FFN / (WF_D == 3 ? 2 : 1));
            l2_prefetch((__global const uchar *)sd,
                        (size_t)DIM * NB(FFN) * SCALE_BYTES(WF_D, SH_D));
        }
        grid_wait(bar, target);

        // ---- B: attention ----
        // (key-value head, chunk of LS positions) units: the chunk's keys and values are loaded
        // once, all at once (a work-item's key: position t; its values: positions t / DG + PS i,
        // dimensions 4 (t % DG) ..; the new position's from kn and vn), for the N_REP query heads
        // that read them; the last work-group of a key-value head to finish combines its chunks
        if (PHASES & 2) {
            // (where a key-value head's units would leave most work-groups idle, its query heads
            // take a unit each: QS units read the chunk; QUERY_UNITS 0 or 1 decides for tests)
            const int S = (L + LS - 1) / LS;
#if QUERY_UNITS < 0
            const int QS = HEADS * S <= G ? N_REP : 1;
#else
            const int QS = QUERY_UNITS ? N_REP : 1;
#endif
            const int nr = N_REP / QS;
            for (int u = grp; u < KV_HEADS * S * QS; u += G) {
                const int kvh = u / (S * QS), s = u / QS % S, h0 = kvh * N_REP + u % QS * nr;
                const int j0 = s * LS, n = min(L - j0, LS);
                const bool newest = s == S - 1;  // pos is its last position, n - 1
                const int nc = newest ? n - 1 : n, g4 = t % DG;
                float4 kr[D / 4], vr[DG];
                __global const kv_t *kp = kc + ((size_t)kvh * max_seq + j0 + t) * D;
#pragma unroll
                for (int d = 0; d < D / 4; ++d) kr[d] = t < nc ? kv_row4(d, kp) : (float4)(0.0f);
                __global const kv_t *vp = vc + ((size_t)kvh * max_seq + j0) * D;
#pragma unroll
                for (int i = 0; i < DG; ++i) {
                    const int j = t / DG + PS * i;
                    vr[i] = j < nc ? kv_row4((size_t)j * DG + g4, vp) : (float4)(0.0f);
                }
                for (int c = t; c < nr * D; c += LS)
                    y[c] = rotated(qkv + (h0 + c / D) * D, c % D, pos, inv_freq) * scale;
                if (newest && t < D) {  // (as the cache keeps them)
                    kn[t] = kv_round(rotated(qkv + (HEADS + kvh) * D, t, pos, inv_freq));
                    vn[t] = kv_round(((vin)qkv)[(HEADS + KV_HEADS + kvh) * D + t]);
                }
                barrier(CLK_LOCAL_MEM_FENCE);
                float sc[N_REP], mx[N_REP];
#pragma unroll
                for (int r = 0; r < N_REP; ++r) {
                    float4 a = (float4)(0.0f);
                    if (r < nr)
#pragma unroll
                        for (int d = 0; d < D / 4; ++d)
                            a = mad(vload4(d, y + r * D), t < nc ? kr[d] : vload4(d, kn), a);
                    sc[r] = mx[r] = t < n ? (a.x + a.y) + (a.z + a.w) : -INFINITY;
                }
                reduce_rep(mx, nr, true, redn);
#pragma unroll
                for (int r = 0; r < N_REP; ++r) {
                    sc[r] = t < n && r < nr ? exp(sc[r] - mx[r]) : 0.0f;
                    pl[r * LS + t] = sc[r];
                }
                reduce_rep(sc, nr, false, redn);  // (the sums; its barriers publish pl)
                for (int r = 0; r < nr; ++r) {
                    __local const float *pr = pl + r * LS;
                    float4 acc = (float4)(0.0f);
#pragma unroll
                    for (int i = 0; i < DG; ++i)
                        acc = mad((float4)(pr[t / DG + PS * i]), vr[i], acc);
                    if (newest && t / DG == (n - 1) % PS)
                        acc = mad((float4)(pr[n - 1]), vload4(g4, vn), acc);
                    red4[t] = acc;
                    barrier(CLK_LOCAL_MEM_FENCE);
                    if (t < DG) {
                        for (int q = 1; q < PS; ++q) acc += red4[q * DG + t];
                        if (S == 1) {
                            vstore4(acc / sc[r], (h0 + r) * DG + t, attn);
                        } else {
                            __global float *pp = part + ((size_t)(h0 + r) * S + s) * (D + 2);
                            vstore4(acc, t, pp);
                            if (t == 0) {
                                pp[D] = mx[r];
                                pp[D + 1] = sc[r];
                            }
                        }
                    }
                    barrier(CLK_LOCAL_MEM_FENCE);
                }
                if (S > 1) {  // the last of the key-value head's units combines its chunks
                    ACQUIRE();
                    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
                    if (t == 0) last = atomic_inc(count + kvh) == S * QS - 1;
                    barrier(CLK_LOCAL_MEM_FENCE);
                    if (last) {
                        ACQUIRE();
                        for (int c = t; c < N_REP * D; c += LS) {
                            const int hh = kvh * N_REP + c / D;
                            attn[hh * D + c % D] =
                                combine_parts(part + (size_t)hh * S * (D + 2), S, c % D, true);
                        }
                        if (t == 0) atomic_xchg(count + kvh, 0);
                    }
                }
                // the cache at pos (read from kn and vn in this launch)
                if (newest && h0 == kvh * N_REP && t < D) {
                    const size_t at = ((size_t)kvh * max_seq + pos) * D + t;
                    KV_PUT(kn[t], kc, at);
                    KV_PUT(vn[t], vc, at);
                }
                barrier(CLK_LOCAL_MEM_FENCE);
            }
        }
        grid_arrive(bar, &target);
        const bool has_c = (PHASES & 4) && TASK0(0, R_O) < DIM;
        if (has_c) {
            task_rows(0, R_O, DIM, w, rows);
            fetch(WF_O, SH_O, wo, so, HEADS * D, rows, R_O, lane, wa, wb, wdd);
        }
        grid_wait(bar, target);

        // ---- C: x += Wo . attn ----
        if (has_c) {
            quantize(attn, HEADS * D, 0, xq, xd, xs, red);
            quantized();
            for (int k = 0; TASK0(k, R_O) < DIM; ++k) {
                if (k > 0) {
                    task_rows(k, R_O, DIM, w, rows);
                    fetch(WF_O, SH_O, wo, so, HEADS * D, rows, R_O, lane, wa, wb, wdd);
                }
                dots(WF_O, HEADS * D, R_O, lane, wa, wb, wdd, xq, xd, xs, red, r);
                task_store(k, R_O, DIM, w, lane, r, 1.0f, x, true);
            }
        }
        grid_arrive(bar, &target);
        const bool has_d = (PHASES & 8) && TASK0(0, R_GU) < FFN;
        if (has_d) {
            pair_rows(0, w, rows);
            fetch(WF_GU, SH_GU, wgu, sgu, DIM, rows, 2 * R_GU, lane, wa, wb, wdd);
        }
        grid_wait(bar, target);

        // ---- D: h = silu(gate) * up ----
        if (has_d) {
            const float fd = rms_after(quantize(x, DIM, fnw, xq, xd, xs, red), DIM, eps, red);
            for (int k = 0; TASK0(k, R_GU) < FFN; ++k) {
                if (k > 0) {
                    pair_rows(k, w, rows);
                    fetch(WF_GU, SH_GU, wgu, sgu, DIM, rows, 2 * R_GU, lane, wa, wb, wdd);
                }
                dots(WF_GU, DIM, 2 * R_GU, lane, wa, wb, wdd, xq, xd, xs, red, r);
                const int j0 = TASK0(k, R_GU) + w * R_GU;
                if (lane == 0)
#pragma unroll
                    for (int e = 0; e < R_GU; ++e) {
                        const float g = r[2 * e] * fd, v = r[2 * e + 1] * fd;
                        if (j0 + e < FFN) h[j0 + e] = g / (1.0f + exp(-g)) * v;
                    }
            }
        }
        grid_arrive(bar, &target);
        const bool has_e = (PHASES & 16) && TASK0(0, R_D) < DIM;
        if (has_e) {
            task_rows(0, R_D, DIM, w, rows);
            fetch(WF_D, SH_D, wd, sd, FFN, rows, R_D, lane, wa, wb, wdd);
        }
        grid_wait(bar, target);

        // ---- E: x += Wd . h ----
        if (has_e) {
            quantize(h, FFN, 0, xq, xd, xs, red);
            quantized();
            for (int k = 0; TASK0(k, R_D) < DIM; ++k) {
                if (k > 0) {
                    task_rows(k, R_D, DIM, w, rows);
                    fetch(WF_D, SH_D, wd, sd, FFN, rows, R_D, lane, wa, wb, wdd);
                }
                dots(WF_D, FFN, R_D, lane, wa, wb, wdd, xq, xd, xs, red, r);
                task_store(k, R_D, DIM, w, lane, r, 1.0f, x, true);
            }
        }
        if (l + 1 < NL) {  // the next layer's first QKV rows stream while the groups meet
            grid_arrive(bar, &target);
            if (has_a) {
                const int m = l + 1;
                task_rows(0, R_QKV, NQKV, w, rows);
                fetch(WF_QKV, SH_QKV, SEL(wqkv, m), SEL(sqkv, m), DIM, rows, R_QKV, lane, wa, wb,
                      wdd);
            }
            grid_wait(bar, target);
        }
    }
}

// The probe: G work-groups meet at `rounds` grid barriers, each adding its id to a sum after
// every one; a work-group that spun past SPIN_LIMIT sets bar[2].
__kernel __attribute__((reqd_work_group_size(LS, 1, 1)))
void grid_probe(__global int *bar, __global int *sums, int rounds) {
    count_t target = 0;
    if (get_local_id(0) == 0) target = grid_start(bar);
    for (int r = 0; r < rounds; ++r) {
        if (get_local_id(0) == 0) atomic_add(&sums[r], (int)get_group_id(0) + 1);
        grid_sync(bar, &target);
        // every work-group sees every other's addition of this round
        if (get_local_id(0) == 0 && ((volatile __global int *)sums)[r] !=
                (int)(get_num_groups(0) * (get_num_groups(0) + 1) / 2))
            atomic_or(&bar[2], 2);
    }
}
