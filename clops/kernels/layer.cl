// decode_layers: NL consecutive decoder layers of a decode step (one row) in one launch. A
// persistent kernel: its G work-groups all run at once (kernels/layer.py launches no more than
// its probe found resident) and meet at grid barriers between the phases of each layer:
//   A  qkv = Wqkv . (RMSNorm(x) * anw), as is (not rotated)
//   B  attention, a key-value head's query heads together, over splits of its positions (a
//      work-group each; its warps take tiles of them in turn, each with a running softmax):
//      q and the new key rotated by pos as they are read (RMS-normed a head first: QKNORM),
//      the new key and value stored in the cache; the last work-group of a key-value head to
//      finish combines its splits' partials -> attn
//   C  x += Wo . attn
//   D  h = silu(Wg . n(x)) * (Wu . n(x)), n(x) = RMSNorm(x) * fnw ([gate | up] rows of Wgu)
//   E  x += Wd . h (DFUSE, float16 layers on NVIDIA: inside D, with no grid barrier between)
// and between E and the next layer's A (the last layer's: the launch boundary). Each phase's
// rows are dealt to the warps of all work-groups, R rows a warp (a task), and a warp's rows of
// the phase's first task are loaded into registers between the two halves of the grid barrier
// that opens the phase: the weights stream while the work-groups wait. Each phase's input
// vector is read by every work-group that has rows in it and quantized into local memory (int8,
// a scale per 32 values, the sums of the int8 values per 32 for q4's minimums); the weights (q4:
// 16 nibble bytes and a (scale, min) pair per 32; q8: 32 bytes and a scale per 32; half or float
// scales) meet it through 4-byte integer dot products. Float16 weights (f16) meet it as float16
// values in local memory (normalized first where a norm leads the phase), summed in float32
// (NVIDIA: on tensor cores). Compile-time: NL (1 to 16), DIM, HEADS, KV_HEADS, HEAD_DIM, FFN,
// QKMAX (the longest input: max of DIM, HEADS * HEAD_DIM, FFN), WF_QKV, WF_O, WF_GU, WF_D (3 q4, 4
// q8, 5 f16), SH_QKV, SH_O, SH_GU, SH_D (1: half scales, 0: float; q4 2: a half scale alone,
// the min -8 times it, Q4_0), R_QKV, R_O, R_GU (pairs of a gate and an up row), R_D (rows a
// task, kernels/layer.py's rows_per_task), ROPE_NEOX, PTX
// (NVIDIA: dp4a, shfl.sync, mma.sync, fences and atomics of the PTX memory model), SPIN_LIMIT,
// PHASES (a bitmask of the phases A..E that run, for timing them apart: default all), SPLITS_MAX
// (B's splits of a key-value head's positions at most), SPLIT_MIN (positions a split takes at
// least), KV_HALF (1: float16 caches, clops/kv.cl), TRACE (1: the groups' times at each grid
// barrier, for profiling; see stamp), EMB (1: x is the float16 embedding row of tokens[state[0]],
// emb [vocab][DIM], read here: no launch before this one), PAGED (1: the caches are pools of
// blocks of BS positions, [block][KV_HEADS][BS][HEAD_DIM] (clops/kernels/paged.cl's), the row's
// blocks table[slots[0] * maxb ..], its position state[0] and its token tokens[0]: the batched
// engine's lone decode row; else [KV_HEADS][max_seq][HEAD_DIM]), QKNORM (1: q and k RMS-normed a
// head before the rotation, weights qnw, knw a layer). HEAD_DIM divides 64 or is 128.
// Work geometry: global (G * LS), local (LS).
#define LS 256
#define NW (LS / 32)
#define D HEAD_DIM
#define N_REP (HEADS / KV_HEADS)
#define NQKV ((HEADS + 2 * KV_HEADS) * HEAD_DIM)
// (row, block) pairs a work-item holds in registers: q4 one uint4 each (a block of 32 values),
// q8 two (32 values), f16 two (16 values)
#ifndef SLOTS
#define SLOTS 16
#endif
#ifndef PHASES
#define PHASES 31
#endif
#ifndef EMB
#define EMB 0
#endif
#ifndef SPIN_LIMIT
#define SPIN_LIMIT (1 << 26)
#endif
#ifndef PAGED
#define PAGED 0
#endif
// The cache row of key-value head kvh at position p, and where a row's cache is found (kv_at:
// the sequence's blocks, or the rows a head of the contiguous cache has)
#if PAGED
#define KV_AT_T __global const int *
#define KV_ROW(kvh, p, at) (((size_t)(at)[(p) / BS] * KV_HEADS + (kvh)) * BS + (p) % BS)
#else
#define KV_AT_T int
#define KV_ROW(kvh, p, at) ((size_t)(kvh) * (at) + (p))
#endif
// PERF (H100, 1B Q4_0, B alone, where a work-item reads its key row by itself): 8-byte loads
// of float16 keys (kv4_load) took attention from 9.1 to 4.2 us a layer at 191 positions, 16.9
// -> 10.9 at 4001 (decode at 128 positions 1318 -> 1394 tok/s)
#define KV_PTX PTX
#include "clops/kv.cl"  // KV_HALF: the caches' element type
#if (64 % HEAD_DIM || HEAD_DIM % 4) && HEAD_DIM != 128
#error "decode_layers: HEAD_DIM must divide 64 (a multiple of 4), or be 128"
#endif
// QKNORM 1: q's heads and the new key RMS-normed a head before the rotation (weights qnw, knw
// [HEAD_DIM] a layer; eps the layers' norms': Qwen3's QK-norm)
#ifndef QKNORM
#define QKNORM 0
#endif
// a phase of float16 weights: its input is kept in local memory as float16 values, two a uint
// (twice the int8 values' bytes)
#define F16 5
// PIPE (NVIDIA): the float16 [gate | up] and down phases pipelined (pipe_phase), in GU_STAGES
// and D_STAGES stages; PIPE 0 as the other phases are
#ifndef PIPE
#define PIPE 1
#endif
#ifndef GU_STAGES
#define GU_STAGES 2
#endif
#ifndef D_STAGES
#define D_STAGES 2
#endif
// CSKIP: the output phase's rows dealt to the work-groups without an attention unit first
#ifndef CSKIP
#define CSKIP 1
#endif
// GUEARLY: a work-group without output rows loads its first [gate | up] weights while attention
// runs (on NVIDIA kernels/layer.py sets it where it packs the output rows into as few work-groups
// as the registers allow); GUWAIT (NVIDIA): the work-groups without an attention unit issue those
// loads, and the output phase's work-groups their output rows', once attention has read its
// inputs (bar[3]: the count, low 32 bits, of the barrier before the latest attention phase that
// has); XEARLY: an accumulating task reads x's values at its rows before its sums.
// PERF (H100, decode tok/s after 128 positions, runs of one machine): 1B F16 975 -> 989-994
// with CSKIP, 978 -> 1009-1014 with CSKIP and XEARLY; GUEARLY without GUWAIT 1009-1013 against
// 1043-1046 with it (attention 9.0 against 6.7 us a layer: the loads held its reads back); the
// packing with GUEARLY and GUWAIT against neither (CSKIP and XEARLY on in both): F16 970 ->
// 1040-1046, Q4_0 1885 -> 1912-1915, Q8_0 1424 -> 1480-1482 (and after 4096 positions 842 ->
// 861-862, 1379 -> 1424-1447, 1191 -> 1184-1188). Prefetching the first [gate | up] rows into
// L2 instead (prefetch.global.L2) was no faster: 968-978 tok/s. Copying each warp's last 1 / 2 /
// 3 [gate | up] pairs into local memory (cp.async, 64 KB a pair a work-group) while attention
// ran, every work-group once it was free, and reading them back at the phase's end: the same
// logits, 1036 / 1021 / 933 against 1038-1042 tok/s (2026-11-27; at 2: attention 7.8 -> 9.7 us,
// the output phase 1.9 -> 3.3, gate/up only 21.3 -> 20.4, the down phase, which reads no local
// copies, 13.1 -> 14.8: the loads in flight held the latency-bound phases back, and the local
// memory taken from L1 slowed the streaming ones).
// PERF (H100, decode tok/s after 128 positions, runs of one machine, 2026-11-27): the output
// phase's work-groups waiting for attention's inputs too (they had loaded their rows at once)
// 1B F16 997-1006 -> 1032-1040; attention's tile loads then came back sooner (traced: inputs
// read 2.0 -> 1.3 us after the barrier). Signalling once attention had used its tiles instead
// of read its inputs: 957-983 (the groups idle longer). Dealing the [gate | up] pairs unevenly
// (the output phase's work-groups a pair a warp fewer, the others more, as they had loaded
// theirs during attention): 1046-1051 against 1043-1051. Every stage of gate/up or down loaded
// while the groups meet before it (not all but one): 991-1001 against 1000-1008. The down
// phase's input loads issued before its second stage's (so that they come back while those are
// on the way): the phase 14.6 -> 14.1 us, 996-1007 against 992-999 tok/s. Warp 0 (whose work-item
// 0 polls the barrier's count) issuing its loads only after the barrier: 978-986 against
// 1007-1023 (a work-group's loads come back in order: a poll waits behind every warp's loads,
// not its own warp's alone). The weights' loads with an L2 evict_first cache policy: 1024-1026
// against 1028-1033 (the .L2::evict_first qualifier itself takes 256-bit loads only here).
#ifndef GUEARLY
#define GUEARLY 1
#endif
#ifndef XEARLY
#define XEARLY 1
#endif
#ifndef GUWAIT
#define GUWAIT 1
#endif
#define PIPE_GU (PIPE && PTX && WF_GU == F16)
#define PIPE_D (PIPE && PTX && WF_D == F16)
#if (PIPE_GU && GU_STAGES < 2) || (PIPE_D && D_STAGES < 2)
#error "decode_layers: a pipelined phase takes 2 stages or more"
#endif
#if (PIPE_GU && R_GU != 1) || (PIPE_D && R_D != 1)
#error "decode_layers: a pipelined phase takes a pair or a row a task (R_GU, R_D 1)"
#endif
#define ANY_F16 (WF_QKV == F16 || WF_O == F16 || WF_GU == F16 || WF_D == F16)

#define DOT4_PTX PTX
#include "clops/vec.cl"  // dot4: dp4a on NVIDIA
#if PTX
#include "clops/ptx.cl"  // shfl_xor, ld_stream, half2_floats
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

// A float written by other work-groups of this launch (as load4_fresh; NVIDIA: a volatile load
// is a system-scope one there, this one goes no further than L2).
inline float load_fresh(__global const float *p) {
#if PTX
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
#else
    return *(vin)p;
#endif
}

// The sum of v over the lanes of the warp whose index matches this one's modulo s (a power of
// two), in the first s lanes (every work-item of the group calls it); s 1: over the warp, in
// lane 0.
inline float lanes_total(float v, const int s, __local float *red) {
#if PTX
    for (int o = 16; o >= s; o >>= 1) v += shfl_xor(v, o);
    return v;
#else
    const int t = get_local_id(0);
    red[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    float r = 0.0f;
    if ((t & 31) < s)
        for (int i = 0; i < 32; i += s) r += red[t + i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
#endif
}

// The sum (max: the largest) of v over the work-group, in every work-item (NVIDIA: over each
// warp by shuffles, then the warps' results: two barriers, not a tree's nine).
inline float group_reduce(float v, __local float *red, bool max_of) {
    const int t = get_local_id(0);
#if PTX
    for (int o = 16; o > 0; o >>= 1) {
        const float u = shfl_xor(v, o);
        v = max_of ? fmax(v, u) : v + u;
    }
    if ((t & 31) == 0) red[t >> 5] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    float r = red[0];
    for (int i = 1; i < NW; ++i) r = max_of ? fmax(r, red[i]) : r + red[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
#else
    red[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LS / 2; s > 0; s >>= 1) {
        if (t < s) red[t] = max_of ? fmax(red[t], red[t + s]) : red[t] + red[t + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
#endif
}

// The grid barrier: bar[0] counts the arrivals of every work-group at every barrier, launch
// after launch, and never goes back; a barrier is met when the count reaches the work-group's
// target, G more than at the one before. A launch's first target: the count at its start
// rounded down to a multiple of G (every barrier before it was met, and none of this launch's
// can be until this work-group arrives) plus G. bar[2]: set by a work-group that gave up
// waiting (not all resident: say so rather than hang). Work-item 0 of each group keeps the
// target. The PTX path counts in 64 bits, arriving with a release add and waiting on relaxed
// loads, then one acquire load (about 1 us a barrier of 132 work-groups on an H100, where a
// membar.gl and a count reset by the last to arrive took 1.8); the portable path counts in 32
// (work-groups run one at a time on CPUs: tests only). ACQUIRE() fences the splits' combine in
// B. Polling with acquire loads instead (no acquire load after): the same times (1039-1040
// against 1034-1044 tok/s, 2026-11-27).
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
// (an acquire load: later loads wait for it, earlier ones (the next phase's weights, issued
// while the groups meet) need not have landed, as a fence would make them)
inline void acquired(__global int *bar) {
    ulong v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(bar) : "memory");
}
#define ACQUIRE() asm volatile("fence.acq_rel.gpu;" ::: "memory")
#else
#include "clops/fence.cl"  // GLOBAL_FENCE (no PTX_FENCE here: OpenCL C's mem_fence)
typedef uint count_t;
inline count_t count_now(__global int *bar) { return (uint)((volatile __global int *)bar)[0]; }
inline void arrive(__global int *bar) {
    GLOBAL_FENCE();
    atomic_inc(bar);
}
#define ACQUIRE() GLOBAL_FENCE()
inline void acquired(__global int *bar) { ACQUIRE(); }
#endif

inline count_t grid_start(__global int *bar) {
    const count_t v = count_now(bar), g = get_num_groups(0);
    return v - v % g;
}

// A grid barrier in two halves: grid_arrive once the work-group's writes of the phase are done,
// grid_wait before it reads the others'. Between them a work-group issues the loads of the
// next phase's weights: they stream while it waits (a release before them would wait for them,
// and so would an acquire fence after the wait: the wait ends with an acquire load instead).
// PERF (H100, 1B Q4_0 decode tok/s at 128 / 16384 positions, the former attention units, one
// run): a fence after the wait 1434 / 618, the acquire load 1490 / 627; and with the GLU's and
// the down projection's weights prefetched into L2 during attention, as the kernel did, 1439 /
// 613 (their 25 MB a layer held attention's reads back).
// TRACE 1 (NVIDIA, profiling): work-item 0 of each group writes the GPU's clock (ns) as it
// arrives at grid barrier b and as it leaves it, at trace[2 (b % TRACE_RING) + {0, 1}][group]
// (trace: the ulongs after bar's four ints; b the barrier's number since the count began,
// target / G - 1; kernels/layer.py's read_trace)
#ifndef TRACE
#define TRACE 0
#endif
#define TRACE_RING 256
#if TRACE && PTX
inline void stamp(__global int *bar, count_t target, int leaving) {
    ulong now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    const ulong b = target / get_num_groups(0) - 1;
    ((__global ulong *)(bar + 4))[(2 * (b % TRACE_RING) + leaving) * get_num_groups(0) +
                                  get_group_id(0)] = now;
}
// and inside attention (B), work-item 0 of a work-group's first unit of layer l (of the launch)
// writes the clock at its points k (ATT_POINTS: inputs read, tiles used, warps' results in
// local memory, results stored) at trace[2 TRACE_RING G + (l ATT_POINTS + k) G + group]
// (kernels/layer.py's read_attention_trace)
#define ATT_POINTS 4
inline void att_stamp(__global int *bar, int l, int k) {
    if (get_local_id(0) == 0) {
        ulong now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        const int G = get_num_groups(0);
        ((__global ulong *)(bar + 4))[2 * TRACE_RING * G + (l * ATT_POINTS + k) * G +
                                      get_group_id(0)] = now;
    }
}
#else
#define stamp(bar, target, leaving)
#define att_stamp(bar, l, k)
#endif

inline void grid_arrive(__global int *bar, count_t *target) {
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) {
        *target += get_num_groups(0);
        stamp(bar, *target, 0);
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
        acquired(bar);
        stamp(bar, target, 1);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

inline void grid_sync(__global int *bar, count_t *target) {
    grid_arrive(bar, target);
    grid_wait(bar, *target);
}

// The largest (max_of) or the sum of v over the n work-items (a power of two, at most 32) of an
// aligned group of n, in each of them (every work-item of the group calls it).
inline float lanes_all(float v, bool max_of, const int n, __local float *red) {
#if PTX
    for (int o = 1; o < n; o <<= 1) {
        const float u = shfl_xor(v, o);
        v = max_of ? fmax(v, u) : v + u;
    }
    return v;
#else
    const int t = get_local_id(0), g = t & ~(n - 1);
    red[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    float r = red[g];
    for (int i = 1; i < n; ++i) r = max_of ? fmax(r, red[g + i]) : r + red[g + i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
#endif
}

// lanes_all over an aligned group of 8 (warp_all: over the warp)
inline float eight(float v, bool max_of, __local float *red) {
    return lanes_all(v, max_of, 8, red);
}
// The work-group quantizes v[i] = src[i] * (nw ? nw[i] : 1), i < K, into xq (int8, 4 a uint,
// block b of 32 values at xq[8 b ..]), xd (per block: amax / 127) and xs (per block: the sum of
// its int8 values), and returns this work-item's part of the sum of squares of src (the RMS of
// a norm: int8 values are the same for any scale of v, so 1 / RMS multiplies the sums after).
// Eight work-items a block, four values each; every round's loads are issued before any is
// used (one memory latency, not one a round), and every work-item runs every round (the
// shuffles and barriers of eight()).
#define QR ((QKMAX / 4 + LS - 1) / LS)
// A work-group's K values of src (hsrc where given: float16 values, an embedding row), this
// work-item's four a round (zero past K), all loads issued at once.
inline void load_rounds(__global const float *src, __global const half *hsrc, int K, float4 *v) {
    const int t = get_local_id(0);
#pragma unroll
    for (int r = 0; r < QR; ++r) {
        const int i = r * LS + t;
        const bool in = r * LS < K / 4 && i < K / 4;
        v[r] = in ? (hsrc ? vload_half4(i, hsrc) : load4_fresh(src + 4 * i)) : (float4)(0.0f);
    }
}

inline float quantize(__global const float *src, __global const half *hsrc, int K,
                      __global const float *nw, __local uint *xq, __local float *xd,
                      __local int *xs, __local float *red) {
    const int t = get_local_id(0);
    float4 v[QR];
    float ss = 0.0f;
    load_rounds(src, hsrc, K, v);
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

// A phase of float16 weights: the work-group stores v[i] = src[i] (nw: RMSNorm(src)[i] * nw[i],
// eps inside the root) as float16 values into xh (two a uint, the first in its low half: the
// order of a float16 row's values), publishes them, and returns 1 (the factor quantize's
// phases apply after their sums). The loads as quantize's.
// PERF (H100, 1B F16 body, decode tok/s, one machine, 2026-11-27): the norm's weights loaded
// with src (they had been loaded after group_reduce's barriers, a second memory latency before
// the phase's arithmetic) and group_reduce by shuffles (two barriers, not nine): after 128
// positions 1060 -> 1076-1084, after 1024 949 -> 984-991; traced, the QKV phase 4.4 -> 3.6 us
// a layer (its input staged 1.9 us after the barrier before, then 1.0).
inline float stage_half(__global const float *src, __global const half *hsrc, int K,
                        __global const float *nw, float eps, __local uint *xh,
                        __local float *red) {
    const int t = get_local_id(0);
    float4 v[QR], g[QR];
    float ss = 0.0f;
    load_rounds(src, hsrc, K, v);
    // (the norm's weights loaded with the values, not after the sum's barriers: one memory
    // latency before the phase's arithmetic, not two)
#pragma unroll
    for (int r = 0; r < QR; ++r) {
        const int i = r * LS + t;
        g[r] = nw && r * LS < K / 4 && i < K / 4 ? vload4(i, nw) : (float4)(1.0f);
    }
#pragma unroll
    for (int r = 0; r < QR; ++r) ss += dot(v[r], v[r]);
    const float f = nw ? rms_after(ss, K, eps, red) : 1.0f;
#pragma unroll
    for (int r = 0; r < QR; ++r) {
        const int i = r * LS + t;
        if (r * LS >= K / 4) break;
        if (i < K / 4) {
            const float4 u = nw ? v[r] * g[r] * f : v[r];
#if PTX
            xh[2 * i] = half2_bits(u.x, u.y);
            xh[2 * i + 1] = half2_bits(u.z, u.w);
#else
            vstore_half4(u, i, (__local half *)xh);
#endif
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return 1.0f;
}

// A phase's input into local memory for weights of format fmt: quantized (q4, q8; nw: the
// returned 1 / RMS multiplies the sums) or float16 values (f16: normalized, returns 1). hsrc
// where given: the input's float16 values, read instead of src.
inline float stage(const int fmt, __global const float *src, __global const half *hsrc, int K,
                   __global const float *nw, float eps, __local uint *xq, __local float *xd,
                   __local int *xs, __local float *red) {
    if (fmt == F16) return stage_half(src, hsrc, K, nw, eps, xq, red);
    const float ss = quantize(src, hsrc, K, nw, xq, xd, xs, red);
    if (nw) return rms_after(ss, K, eps, red);
    quantized();
    return 1.0f;
}

// ---- a warp's rows ----
// Blocks in a row of K (32 values, f16 16: 32 bytes), and a lane's share of them (blocks lane,
// lane + 32, ...; f16: as many, of two chunks each, as fetch deals them).
#define NB(fmt, K) ((K) / ((fmt) == F16 ? 16 : 32))
#define KB(fmt, K) ((NB(fmt, K) + 31) / 32)
// bytes of a block's scales: q4 a (scale, min) pair (sh 2: the scale alone), q8 a scale; half
// (sh) or float; f16 none
#define SCALE_BYTES(fmt, sh) \
    ((fmt) == F16 ? 0 : ((fmt) == 3 && (sh) != 2 ? 2 : 1) * ((sh) ? 2 : 4))
// f16 rows: the first of the two 16-byte chunks (8 values) of a row in a lane's slot i, the
// second 32 chunks further on (a warp's load reads 512 consecutive bytes)
#define F16_CHUNK(lane, i) ((lane) + 64 * (i))
// bytes of a row of K
#define ROW_BYTES(fmt, K) ((fmt) == 3 ? (K) / 2 : (fmt) == F16 ? 2 * (K) : (K))

// A 16-byte chunk of float16 or 4-bit weights: NVIDIA, by the non-coherent path without a place
// in L1 (read once a step).
// PERF (H100, 1B F16 body, decode tok/s after 128 positions, runs of one machine): plain loads
// 858-861, these 893, ld.global.cs 890, ld.global.nc.L1::no_allocate.L2::256B 864; with the
// pipelined phases plain loads 932-933 (825 after 4096 positions), these 985 (862). 1B Q4_0
// after 128 / 4096 positions 1762-1765 / 1386-1388 against 1733-1736 / 1373-1375; 1B Q8_0's
// blocks (two chunks a lane) slower, 1386-1388 / 1167-1171 against 1430-1431 / 1212-1214.
// A multiprocessor's loads come back in the order they were issued (bench/probe_order.py, H100,
// 2026-11-27): with 32 KB of a work-group's 16-byte weight loads in flight, a load of a line
// held in L2 issued after them took 3100-3200 clocks against 400 alone (behind as many cp.async
// copies 3300-4300, prefetch.global.L2 870-1010), an atomic or a cp.async.bulk copy of that line
// as long: whatever a phase reads after its weights' loads (its input, a barrier's count) waits
// for them. Behind the same bytes loaded by cp.async.bulk copies it took 870-1020. Yet in this
// kernel (1B F16 body, decode tok/s after 128 / 1024 positions, runs of one machine,
// 2026-11-27) the pipelined phases' first part loaded by cp.async.bulk into 64 KB of local
// memory while the groups met (read into the registers once the phase's input was staged; the
// same logits) gave 1021-1027 / 971-978 against 1085-1089 / 991-999, with the QKV phase's first
// rows too (96 KB) 1000-1001 / 958-964: every phase and barrier release traced longer (the
// release after attention 1.0 -> 2.0 us). Those weights prefetched into L2 instead and loaded
// after the input: 1053-1056 / 973-978, with QKV's 1018-1019 / 960-964 (QKV 3.6 -> 6.7 us a
// layer). 64 KB of local memory taken and left unused changed nothing (1082-1085 / 996-1001).
// Weights loaded with an L2 eviction policy (createpolicy.fractional and ld.global.nc's
// L2::cache_hint; its plain L2::evict_first qualifier takes 256-bit loads alone), 2 / 3 / 4
// chunks of 256 KB of every 64 MB evict_last (17 / 25 / 34 MB of the 1B F16 body's 2.1 GB a
// token, the LM head's rows too: that they might stay in L2 from one step to the next) and the
// others evict_first: 1021-1028 / 990-1006 / 1013-1036 tok/s against 1139-1153 after 128
// positions (H100, 2026-11-27, the same tokens); the others with no policy (3 chunks) 1036-1053.
inline uint4 wload(__global const uint4 *p) {
#if PTX
    return ld_stream(p);
#else
    return *p;
#endif
}

// part p (slots p * spr ..) of rows[0 .. n) of f16 W [..][K] into a, b (slot e * spr + i)
inline void fetch_part(__global const uchar *W, const int K, const int *rows, const int n,
                       const int spr, const int p, const int lane, uint4 *a, uint4 *b) {
#pragma unroll
    for (int e = 0; e < n; ++e) {
        __global const uint4 *wr = (__global const uint4 *)(W + (size_t)rows[e] * ROW_BYTES(F16, K));
#pragma unroll
        for (int i = 0; i < spr; ++i) {
            const int s = e * spr + i, u0 = F16_CHUNK(lane, p * spr + i);
            a[s] = u0 < K / 8 ? wload(wr + u0) : (uint4)(0u);
            b[s] = u0 + 32 < K / 8 ? wload(wr + u0 + 32) : (uint4)(0u);
        }
    }
}

// Loads rows[0 .. R) of W [N][K] (format fmt), this lane's blocks, into slots e * KB + i: q4 a
// uint4 of nibbles and (scale, min) in d; q8 two uint4 in a and b, the scale in d.x; f16 the
// row's 16-byte chunks lane + 64 i and lane + 64 i + 32 (8 values each), so that a warp's load
// reads 512 consecutive bytes.
// PERF (H100, 1B F16 body, decode tok/s after 128 positions, CLOPS_LAYER_KERNEL_F16=1, one
// machine): a lane's 32 consecutive bytes (the two chunks of a q8 block: each load of the warp
// touching half of each 32-byte sector of 1 KB) 782-800, these 859-860 (the per-layer plan 880).
// A bulk prefetch a row (cp.async.bulk.prefetch.L2) for ahead() took the down projection from
// 16.0 to 13.4 us but 867 tok/s in all (1B Q4_0: 1742-1750 -> 1656-1684); the gate/up phase's
// first rows prefetched into L2 while the groups met after attention slowed attention (6.9 ->
// 9.2 us; 859 tok/s), the down projection's while the last gate/up task ran gave 857. A ring of
// RING units (4 KB of a row) a warp in local memory, filled by cp.async in the order the tasks
// take them and running on through the grid barriers (each lane reading back its own chunks,
// the unit RING on issued once a unit's values were used): the same logits, but 822 / 795 /
// 734 tok/s at RING 4 / 5 / 6 (128 KB / 160 KB / 192 KB) against 860, 710 / 695 / 658 against
// 769 after 4096 positions; units L2-prefetched further on made it slower still (363-420).
inline void fetch(const int fmt, const int sh, __global const uchar *W,
                  __global const half *S, const int K,
                  const int *rows, const int R, const int lane, uint4 *a, uint4 *b,
                  float2 *d) {
    if (fmt == F16) {  // (no scales: d is not read)
        fetch_part(W, K, rows, R, KB(F16, K), 0, lane, a, b);
        return;
    }
#pragma unroll
    for (int e = 0; e < R; ++e)
#pragma unroll
        for (int i = 0; i < KB(fmt, K); ++i) {
            const int blk = lane + 32 * i, s = e * KB(fmt, K) + i, nb = NB(fmt, K);
            const size_t n = (size_t)rows[e];
            __global const uint4 *wr = (__global const uint4 *)(W + n * ROW_BYTES(fmt, K));
            a[s] = b[s] = (uint4)(0u);
            d[s] = (float2)(0.0f);
            if (blk < nb) {
                if (fmt == 3) {
                    a[s] = wload(wr + blk);
                    if (sh == 2) {  // (Q4_0: the min is -8 times the scale, exactly)
                        d[s].x = vload_half(n * nb + blk, S);
                        d[s].y = -8.0f * d[s].x;
                    } else {
                        d[s] = sh ? vload_half2(n * nb + blk, S)
                                  : vload2(n * nb + blk, (__global const float *)S);
                    }
                } else {
                    a[s] = wr[2 * blk];
                    b[s] = wr[2 * blk + 1];
                    d[s].x = sh ? vload_half(n * nb + blk, S)
                                : ((__global const float *)S)[n * nb + blk];
                }
            }
        }
}

// Rows[0 .. R) of W (format fmt) and their scales into L2 (a hint: nothing waits on it), the
// lanes of the warp taking a row's lines in turn: a phase's next task's rows, while the warp
// works on the one it holds.
// PERF (H100, decode tok/s, one run): 1B Q4_0 after 128 / 1024 / 4096 / 16384 positions 1594 /
// 1373 / 1196 / 924 without, 1589-1596 / 1381-1398 / 1215-1229 / 935-940 with; 1B Q8_0 (more
// rounds a phase) after 128 / 4096 1274 / 1046 -> 1311 / 1068
inline void rows_l2(const int fmt, const int sh, __global const uchar *W,
                    __global const half *S, const int K, const int *rows, const int R,
                    const int lane) {
#if PTX
    const int rb = ROW_BYTES(fmt, K), sb = NB(fmt, K) * SCALE_BYTES(fmt, sh);
#pragma unroll
    for (int e = 0; e < R; ++e) {
        for (int b = 128 * lane; b < rb; b += 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" :: "l"(W + (size_t)rows[e] * rb + b));
        for (int b = 128 * lane; b < sb; b += 32 * 128)
            asm volatile("prefetch.global.L2 [%0];"
                         :: "l"((__global const uchar *)S + (size_t)rows[e] * sb + b));
    }
#endif
}

// The values of x that meet a lane's slots i of an f16 row (fetch): the row's 16-byte chunks
// F16_CHUNK and 32 further on (past the row: the last, met by zero weights).
inline void f16_x(const int K, int lane, int i, __local const uint *xq, uint4 *x0, uint4 *x1) {
    *x0 = vload4(min(F16_CHUNK(lane, i), K / 8 - 1), xq);
    *x1 = vload4(min(F16_CHUNK(lane, i) + 32, K / 8 - 1), xq);
}

// Dots of f16 rows: each lane's blocks of a row . the same blocks of x, summed over the warp.
// NVIDIA: on tensor cores (converting each float16 value to float32 takes an instruction of a
// quarter of the arithmetic rate): an m16n8k16 product whose A row g (k 2c, 2c + 1, 2c + 8, 2c + 9)
// and B column g (the same k) are both lane (g, c)'s, four values of x and of the row, so that its
// diagonal D[g][g] gathers lanes (g, 0 .. 3)'s products (float32 accumulators; the other entries
// are not read); a lane's diagonal entry (lane (g, g / 2), element g % 2) then goes to the sum over
// the warp (mma_part, then mma_sums).
#if PTX
// part p of n f16 rows (spr slots a row from slot p * spr on: fetch_part) . the same values of
// x, added to dm[4 e ..] (row e's m16n8k16 accumulators)
inline void mma_part(const int K, const int n, const int spr, const int p, const int lane,
                     const uint4 *a, const uint4 *b, __local const uint *xq, float *dm) {
#pragma unroll
    for (int i = 0; i < spr; ++i) {
        uint4 x0, x1;
        f16_x(K, lane, p * spr + i, xq, &x0, &x1);
        const uint q0[4] = {x0.x, 0u, x0.y, 0u}, q1[4] = {x0.z, 0u, x0.w, 0u},
                   q2[4] = {x1.x, 0u, x1.y, 0u}, q3[4] = {x1.z, 0u, x1.w, 0u};
#pragma unroll
        for (int e = 0; e < n; ++e) {
            const int s = e * spr + i;
            mma16816(dm + 4 * e, q0, a[s].x, a[s].y);
            mma16816(dm + 4 * e, q1, a[s].z, a[s].w);
            mma16816(dm + 4 * e, q2, b[s].x, b[s].y);
            mma16816(dm + 4 * e, q3, b[s].z, b[s].w);
        }
    }
}

// rows[0 .. n)'s sums from their accumulators (mma_part), in r (lane 0)
inline void mma_sums(const int n, const int lane, const float *dm, float *r) {
    const int g = lane >> 2;
#pragma unroll
    for (int e = 0; e < n; ++e)
        r[e] = lanes_total((lane & 3) == g >> 1 ? dm[4 * e + (g & 1)] : 0.0f, 1, 0);
}
#endif

inline void dots_f16(const int K, const int R, const int lane, const uint4 *a, const uint4 *b,
                     __local const uint *xq, __local float *red, float *r) {
#if PTX
    float dm[4 * SLOTS];
#pragma unroll
    for (int e = 0; e < 4 * R; ++e) dm[e] = 0.0f;
    mma_part(K, R, KB(F16, K), 0, lane, a, b, xq, dm);
    mma_sums(R, lane, dm, r);
    return;
#else
#pragma unroll
    for (int e = 0; e < R; ++e) r[e] = 0.0f;
#pragma unroll
    for (int i = 0; i < KB(F16, K); ++i) {
        uint4 x0, x1;
        f16_x(K, lane, i, xq, &x0, &x1);
        const float4 f0 = half4_f(x0.xy), f1 = half4_f(x0.zw), f2 = half4_f(x1.xy),
                     f3 = half4_f(x1.zw);
#pragma unroll
        for (int e = 0; e < R; ++e) {
            const int s = e * KB(F16, K) + i;
            const float4 q = mad(half4_f(a[s].xy), f0, half4_f(a[s].zw) * f1) +
                             mad(half4_f(b[s].xy), f2, half4_f(b[s].zw) * f3);
            r[e] += (q.x + q.y) + (q.z + q.w);
        }
    }
#endif
#pragma unroll
    for (int e = 0; e < R; ++e) r[e] = lanes_total(r[e], 1, red);
}

// The sums over the warp of the fetched rows . the staged x (quantized; f16: float16 values),
// in r[0 .. R) (lane 0).
inline void dots(const int fmt, const int K, const int R, const int lane, const uint4 *a,
                 const uint4 *b, const float2 *d, __local const uint *xq,
                 __local const float *xd, __local const int *xs, __local float *red,
                 float *r) {
    if (fmt == F16) {
        dots_f16(K, R, lane, a, b, xq, red, r);
        return;
    }
    const uint M = 0x0f0f0f0fu;
#pragma unroll
    for (int e = 0; e < R; ++e) r[e] = 0.0f;
#pragma unroll
    for (int i = 0; i < KB(fmt, K); ++i) {
        const int blk = min(lane + 32 * i, NB(fmt, K) - 1);  // (past the row: zero weights)
        const uint4 x0 = vload4(2 * blk, xq), x1 = vload4(2 * blk + 1, xq);
        const float dx = xd[blk], sx = dx * (float)xs[blk];
#pragma unroll
        for (int e = 0; e < R; ++e) {
            const int s = e * KB(fmt, K) + i;
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
    for (int e = 0; e < R; ++e) r[e] = lanes_total(r[e], 1, red);
}

// The rows of task k of a phase of N rows, R a task, for warp w of work-group grp: task
// (k * G + grp) * NW + w, rows from R times that on (past N: row N - 1, its sums dropped).
// Work-groups loop over k while their first warp's task has rows (the same in all its warps:
// lanes_total's barriers on portable devices).
// g: the work-group's place in the phase's order (the output phase's puts attention's last).
#define TASK0(k, R, g) ((((k) * get_num_groups(0) + (g)) * NW) * (R))
#define GRP get_group_id(0)
inline void task_rows(int k, const int R, const int N, int g, int w, int *rows) {
    const int n0 = TASK0(k, R, g) + w * R;
#pragma unroll
    for (int e = 0; e < R; ++e) rows[e] = min(n0 + e, N - 1);
}

// The phase's y[n] (+)= total * f for the task's rows below N (lane 0); accumulating adds to
// old[e] where given (task_old: y's values read before), else reads y from L2 (written by
// other work-groups earlier in the launch); y2 where given: the values stored there too.
// (task_store_at: at rows n0 .. n0 + R, wherever a deal put them)
inline void task_store_at(const int n0, const int R, const int N, int lane, const float *r,
                          float f, __global float *y, bool accum, const float *old,
                          __global float *y2) {
    if (lane == 0)
#pragma unroll
        for (int e = 0; e < R; ++e)
            if (n0 + e < N) {
                const float v =
                    accum ? (old ? old[e] : load_fresh(y + n0 + e)) + r[e] * f : r[e] * f;
                y[n0 + e] = v;
                if (y2) y2[n0 + e] = v;
            }
}
inline void task_store(int k, const int R, const int N, int g, int w, int lane, const float *r,
                       float f, __global float *y, bool accum, const float *old,
                       __global float *y2) {
    task_store_at(TASK0(k, R, g) + w * R, R, N, lane, r, f, y, accum, old, y2);
}

// y's values at the task's rows (lane 0; the others 0), read ahead of the task's accumulating
// store, while its weights stream: no trip to L2 after the sums (XEARLY).
// (task_old_at: at rows n0 .. n0 + R)
inline void task_old_at(const int n0, const int R, const int N, int lane,
                        __global const float *y, float *old) {
#pragma unroll
    for (int e = 0; e < R; ++e) old[e] = lane == 0 && n0 + e < N ? load_fresh(y + n0 + e) : 0.0f;
}
inline void task_old(int k, const int R, const int N, int g, int w, int lane,
                     __global const float *y, float *old) {
    task_old_at(TASK0(k, R, g) + w * R, R, N, lane, y, old);
}

#define ROT_DIM HEAD_DIM
#include "clops/rope.cl"  // pair_of, pair_index, turn

// Element t of the head at v (raw, written in A by other work-groups) turned by pos.
inline float rotated(__global const float *v, int t, int pos, __global const float *inv_freq) {
    const int i = pair_of(t);
    const int2 p = pair_index(i);
    return turn(load_fresh(v + p.x), load_fresh(v + p.y), t, p.x, i, pos, inv_freq);
}

#if QKNORM
// Element t of the head at v (raw, in local memory) RMS-normed (1 / RMS rr, weights nw) and
// turned by pos.
inline float normed_rotated(__local const float *v, int t, int pos,
                            __global const float *inv_freq, float rr, __global const float *nw) {
    const int i = pair_of(t);
    const int2 p = pair_index(i);
    return turn(v[p.x] * rr * nw[p.x], v[p.y] * rr * nw[p.y], t, p.x, i, pos, inv_freq);
}

// 1 / RMS (eps inside the root) of each of the N_REP + 1 heads of D values at v, into r; every
// work-item of the group calls it (NVIDIA: a warp a head, by shuffles; elsewhere a work-item a
// head).
inline void head_norms(__local const float *v, __local float *r, float eps, __local float *red) {
    const int t = get_local_id(0);
#if PTX
    const int w = t >> 5, lane = t & 31;
    for (int hh = w; hh <= N_REP; hh += NW) {
        float s = 0.0f;
        for (int i = lane; i < D; i += 32) s = mad(v[hh * D + i], v[hh * D + i], s);
        s = lanes_total(s, 1, red);  // (every lane: the shuffles' butterfly)
        if (lane == 0) r[hh] = rsqrt(s / D + eps);
    }
#else
    if (t <= N_REP) {
        float s = 0.0f;
        for (int i = 0; i < D; ++i) s = mad(v[t * D + i], v[t * D + i], s);
        r[t] = rsqrt(s / D + eps);
    }
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

// ---- attention (phase B) ----
// A unit is a split of a key-value head's positions: its work-group's warps take tiles of TP
// consecutive positions in turn (tile i of the split: warp i % NW), each warp keeping its own
// running softmax for the N_REP query heads that read the key-value head, and the warps' results
// are combined in local memory at the end; the splits' partials are combined by the last
// work-group of the key-value head to finish. Keys: lane l holds position l of its tile, the
// whole row; values: lane (g, c) = (l / LPR, l % LPR) holds dimensions VD c .. of the tile's
// rows RPI i + g (a load instruction of the warp reads RPI whole rows). A work-group's first
// tile is loaded while the groups meet at the barrier before attention.
// PERF (H100, 1B Q4_0, decode tok/s after 128 / 1024 / 4096 / 16384 positions, one run):
//   the former units (a chunk of 256 positions, a position a work-item)  1518 / 1340 / 1124 / 629
//   these tiles                                                           1480 / 1404 / 1260 / 924
//   the per-layer plan                                                     928 /  906 /  894 / 797
// Loading a warp's next tile while it used the last one (twice the registers, 253 of them) was
// slower at every length (1232 / 1191 / 982 / 811), and prefetching a split's later tiles into
// L2 changed nothing: at 16384 positions attention takes about 28 us a layer, 1.2 TB/s, bound by
// the tiles' arithmetic rather than by memory. Units of a query head where a single split
// leaves most work-groups idle (short spans) were no faster at 128 positions (1594 against
// 1587 tok/s), and the runtime head counts they need made every longer span 4-8% slower. Keys
// laid out as the values are (a warp's load reading four whole rows, 8 lanes a row) with the
// partial scores summed over a row's lanes by halving exchanges (28 shuffles a tile) were
// slower at every span: 1459-1576 / 1317-1394 / 1181-1239 / 855-898 tok/s against 1639-1641 /
// 1476-1485 / 1220-1315 / 1018-1045, so the key loads' lines are not what bounds the tiles.
#define TP 32
#define VD (HEAD_DIM >= 32 ? HEAD_DIM / 8 : 4)
#define LPR (HEAD_DIM / VD)
#define RPI (32 / LPR)
#define KU (HEAD_DIM / 4)
#define VU (LPR * VD / 4)
// tile_use's score loop unrolled this many times (0: fully; kernels/layer.py's SHORT_FUSED)
#ifndef SCORE_UNROLL
#define SCORE_UNROLL 0
#endif
// positions a split takes at least (short spans: fewer, fuller units)
#ifndef SPLIT_MIN
#define SPLIT_MIN 64
#endif

// splits of a key-value head at most (kernels/layer.py: the work-groups a key-value head)
#ifndef SPLITS_MAX
#define SPLITS_MAX 1
#endif

// lanes_all over the warp
inline float warp_all(float v, bool max_of, __local float *red) {
    return lanes_all(v, max_of, 32, red);
}


// Local memory written by a warp and then read by its other lanes (portable: the group's
// barrier, which every work-item reaches).
inline void warp_local_sync(void) {
#if PTX
    asm volatile("bar.warp.sync 0xffffffff;" ::: "memory");
#else
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
}

// A warp's tile of key-value head kvh's cache rows at positions p0 .. p0 + TP (of the caches kc
// and vc, rows found through `at`: KV_ROW), the first n of them (n <= 0: none; the others zero):
// keys k[KU] (lane l: position p0 + l), values v[VU] (lane (g, c): positions p0 + RPI i + g,
// dimensions VD c ..).
inline void tile_load(__global const kv_t *kc, __global const kv_t *vc, int kvh, int p0,
                      KV_AT_T at, int n, int lane, kv4_t *k, kv4_t *v) {
    const int g = lane / LPR, c = lane % LPR;
    // (a lane past n reads no row, and finds none: its position may lie past the sequence's
    // blocks, and past the table's row; position 0's is the sequence's first block)
    const size_t rk = KV_ROW(kvh, lane < n ? p0 + lane : 0, at);
#if KV_HALF && HEAD_DIM % 8 == 0
    // (16-byte loads, two groups of four a load: a warp's load instruction touches a line per
    // row it reads, and a lane's key row is a row of its own)
    // PERF (H100, 1B Q4_0 decode tok/s after 128 / 1024 / 4096 / 16384 positions, one run):
    // 8-byte loads 1531-1544 / 1420-1430 / 1256-1260 / 952-955, 16-byte 1587 / 1425 / 1261 /
    // 1002
    __global const uint4 *kr = (__global const uint4 *)(kc + rk * HEAD_DIM);
#pragma unroll
    for (int d = 0; d < KU / 2; ++d) {
        const uint4 u = lane < n ? kr[d] : (uint4)(0u);
        k[2 * d] = u.xy;
        k[2 * d + 1] = u.zw;
    }
#else
#pragma unroll
    for (int d = 0; d < KU; ++d)
        k[d] = lane < n ? kv4_load(kc + rk * HEAD_DIM, d) : kv4_zero();
#endif
#pragma unroll
    for (int i = 0; i < LPR; ++i) {
        const int j = RPI * i + g;
        const size_t rv = KV_ROW(kvh, j < n ? p0 + j : 0, at);
#if KV_HALF && VD == 8
        const uint4 u = j < n ? *(__global const uint4 *)(vc + rv * HEAD_DIM + VD * c)
                              : (uint4)(0u);
        v[2 * i] = u.xy;
        v[2 * i + 1] = u.zw;
#else
#pragma unroll
        for (int e = 0; e < VD / 4; ++e)
            v[i * (VD / 4) + e] = j < n ? kv4_load(vc + rv * HEAD_DIM + VD * c, e)
                                        : kv4_zero();
#endif
    }
}

// A warp's tile at positions base .. base + TP into its running softmax: m (largest score) and
// l (this lane's share of the weights' sum) a query head, acc (lane (g, c): the weighted sum of
// dimensions VD c .. of its rows) a query head's VD; positions from `end` on are left out,
// position pos (the step's own, not in the cache yet) is read from kn and vn. y: the query
// heads (rotated, scaled); pw: the warp's N_REP * TP floats of local memory. Query heads r0 ..
// r1 only (the others' m, l and acc left as they are: a warp of a head split, see HSPLIT): every
// head's arithmetic runs, without branches, and the others' weights are 0.
// PERF (H100, decode tok/s, runs of one machine, 2026-11-27; the output phase's groups waiting
// for attention's inputs in both): a branch per head around the arithmetic (HSPLIT's heads) ->
// without, 1B F16 1031-1039 -> 1059-1062 after 128 positions, 1007-1014 -> 1017 after 300;
// with that wait too, against neither, 1B Q4_0 1698-1719 -> 1986-2010 after 128 and 1229-1244
// -> 1460-1468 after 4096, Q8_0 1392 -> 1567-1572 and 1100-1104 -> 1232, SmolLM2 1669-1672 ->
// 2180-2184 and 1481 -> 1894-1902; logits identical. Traced (F16, 128 positions): a warp's
// tile 5.7 -> 2.9 us, attention 9.2 -> 6.1. The kernel takes all 255 registers, and in the
// branches each local load's value was used at once (a load's latency each, one warp on its
// scheduler); a tile is still that much longer than its arithmetic: the loads of y and pw
// wait in turn. pw laid out a position's heads side by side (one 16-byte load of a position's
// weights instead of N_REP) gave the same: 1060-1061 tok/s against this layout's 1061-1067
// after 128 positions, 954-960 against 950-954 after 1024 (F16), Q4_0 1936-1940 against
// 1935-1947 (2026-11-27). The scores and the weighted values on tensor cores instead (mma.sync:
// m16n8k16 with float16 queries for the scores, m16n8k8 tf32 for the values, the keys and
// values loaded as the fragments want them): logits within 0.017 of 5.8, but a tile no shorter
// (traced 2.9 -> 3.0 us; only the warps' combine shorter, 1.4 -> 0.8) and 1080-1083 -> 1090 tok/s
// after 128 positions, 979-984 -> 969-978 after 1024, Q4_0 the same or slower; with the other
// phases left out (PHASES=2) a tile still takes 2.0-2.3 us of one warp's dependent instructions
// either way, so the arithmetic is not what the tile waits on.
// The score loop unrolled twice rather than fully (SCORE_UNROLL; the tile's keys then sit in a
// stack frame), H100, 1B F16 body, decode tok/s alternately in one process, 2026-11-27, the same
// tokens: after 128 positions 1164-1170 (4 times 1164-1166, 8 times 1158-1162) against
// 1139-1153, after 300 1086-1087 against 1045-1064, after 700 and 1000 the same within the
// runs' spread (1017-1024 against 1018-1035). Traced after 128: a warp's tile longer (tiles used
// 4.9 -> 5.6 us after the barrier) but the warps' results combined sooner (6.7 -> 6.2), and the
// gate/up phase with the down projection 35.8 -> 34.6 us of wall time: the whole kernel's
// registers are allocated otherwise. Slower in the kernel of 8 slots (after 1024 positions
// 968-1020 against 1026-1039) and in Q4_0's (after 128 1936-1982 against 1987-2010): there the
// loop stays unrolled (kernels/layer.py's SHORT_FUSED). The value loop unrolled twice or 4 times
// as well: 1151-1154 against 1164-1165.
#if PTX
inline void tile_use(const kv4_t *k, const kv4_t *v, int base, int end, int pos, int lane,
                     __local const float *y, __local const float *kn, __local const float *vn,
                     __local float *pw, float *m, float *l, float *acc, __local float *red,
                     const int r0, const int r1) {
    const int j = base + lane;
    float4 a[N_REP];
#pragma unroll
    for (int r = 0; r < N_REP; ++r) a[r] = (float4)(0.0f);
#if SCORE_UNROLL == 2
#pragma unroll 2
#elif SCORE_UNROLL == 4
#pragma unroll 4
#elif SCORE_UNROLL == 0
#pragma unroll
#else
#error "decode_layers: SCORE_UNROLL takes 0, 2 or 4"
#endif
    for (int d = 0; d < KU; ++d) {
        const float4 kk = j == pos ? vload4(d, kn) : kv4_f(k[d]);
#pragma unroll
        for (int r = 0; r < N_REP; ++r) a[r] = mad(vload4(d, y + r * HEAD_DIM), kk, a[r]);
    }
    // (every query head's arithmetic, without branches: a warp runs alone on its scheduler
    // here, and the loads of local memory of one head meet the next's only where no branch
    // stands between them; another warp's heads (r0 .. r1) get weight 0 and keep m, l, acc)
    float corr[N_REP];
#pragma unroll
    for (int r = 0; r < N_REP; ++r) {
        const bool in = j < end && r >= r0 && r < r1;
        const float s = in ? (a[r].x + a[r].y) + (a[r].z + a[r].w) : -INFINITY;
        const float mn = fmax(m[r], warp_all(s, true, red));
        corr[r] = mn == -INFINITY ? 1.0f : exp(m[r] - mn);
        const float p = in ? exp(s - mn) : 0.0f;
        l[r] = mad(l[r], corr[r], p);
        m[r] = mn;
        pw[r * TP + lane] = p;
    }
#pragma unroll
    for (int i = 0; i < N_REP * VD; ++i) acc[i] *= corr[i / VD];
    warp_local_sync();
    const int g = lane / LPR, c = lane % LPR;
#pragma unroll
    for (int i = 0; i < LPR; ++i) {
        const int jj = RPI * i + g;
        const bool own = base + jj == pos;
#pragma unroll
        for (int e = 0; e < VD / 4; ++e) {
            const float4 vv = own ? vload4(VD / 4 * c + e, vn) : kv4_f(v[i * (VD / 4) + e]);
#pragma unroll
            for (int r = 0; r < N_REP; ++r) {
                const float p = pw[r * TP + jj];
                acc[r * VD + 4 * e] = mad(p, vv.x, acc[r * VD + 4 * e]);
                acc[r * VD + 4 * e + 1] = mad(p, vv.y, acc[r * VD + 4 * e + 1]);
                acc[r * VD + 4 * e + 2] = mad(p, vv.z, acc[r * VD + 4 * e + 2]);
                acc[r * VD + 4 * e + 3] = mad(p, vv.w, acc[r * VD + 4 * e + 3]);
            }
        }
    }
    warp_local_sync();
}
#else
// (portable devices: the arithmetic in a branch a head, as it was; Intel's CPU compiler aborted
// now and then building the branch-free form: in 3 of 8 runs of the one-group tests with no
// cached programs, against none of 3 with this one; once since, a build of this one ran past
// 10 minutes with another run beside it)
inline void tile_use(const kv4_t *k, const kv4_t *v, int base, int end, int pos, int lane,
                     __local const float *y, __local const float *kn, __local const float *vn,
                     __local float *pw, float *m, float *l, float *acc, __local float *red,
                     const int r0, const int r1) {
    const int j = base + lane;
    float4 a[N_REP];
#pragma unroll
    for (int r = 0; r < N_REP; ++r) a[r] = (float4)(0.0f);
#pragma unroll
    for (int d = 0; d < KU; ++d) {
        const float4 kk = j == pos ? vload4(d, kn) : kv4_f(k[d]);
#pragma unroll
        for (int r = 0; r < N_REP; ++r)
            if (r >= r0 && r < r1) a[r] = mad(vload4(d, y + r * HEAD_DIM), kk, a[r]);
    }
#pragma unroll
    for (int r = 0; r < N_REP; ++r) {
        if (r < r0 || r >= r1) continue;
        const float s = j < end ? (a[r].x + a[r].y) + (a[r].z + a[r].w) : -INFINITY;
        const float mn = fmax(m[r], warp_all(s, true, red));
        const float corr = mn == -INFINITY ? 1.0f : exp(m[r] - mn);
        const float p = j < end ? exp(s - mn) : 0.0f;
        l[r] = mad(l[r], corr, p);
        m[r] = mn;
        pw[r * TP + lane] = p;
#pragma unroll
        for (int e = 0; e < VD; ++e) acc[r * VD + e] *= corr;
    }
    warp_local_sync();
    const int g = lane / LPR, c = lane % LPR;
#pragma unroll
    for (int i = 0; i < LPR; ++i) {
        const int jj = RPI * i + g;
        const bool own = base + jj == pos;
#pragma unroll
        for (int e = 0; e < VD / 4; ++e) {
            const float4 vv = own ? vload4(VD / 4 * c + e, vn) : kv4_f(v[i * (VD / 4) + e]);
#pragma unroll
            for (int r = 0; r < N_REP; ++r) {
                if (r < r0 || r >= r1) continue;
                const float p = pw[r * TP + jj];
                acc[r * VD + 4 * e] = mad(p, vv.x, acc[r * VD + 4 * e]);
                acc[r * VD + 4 * e + 1] = mad(p, vv.y, acc[r * VD + 4 * e + 1]);
                acc[r * VD + 4 * e + 2] = mad(p, vv.z, acc[r * VD + 4 * e + 2]);
                acc[r * VD + 4 * e + 3] = mad(p, vv.w, acc[r * VD + 4 * e + 3]);
            }
        }
    }
    warp_local_sync();
}
#endif

// The positions of each split of a key-value head's L positions (a multiple of TP; the last
// split may hold fewer, none is empty): one split while one round of the work-group's warps
// covers them (no partials to combine), else SPLIT_MIN positions at least and SPLITS_MAX splits
// at most.
inline int split_len(int L) {
    const int most = L <= NW * TP ? 1 : min(SPLITS_MAX, (L + SPLIT_MIN - 1) / SPLIT_MIN);
    const int per = (L + most - 1) / most;
    return (per + TP - 1) / TP * TP;
}

// PERF (H100, 1B F16 decode tok/s after 128 positions, 2026-11-27): split_len's one split up to
// 128 or 64 positions instead of 256 (the splits of 129 to 256 positions then take two warps a
// tile, HSPLIT) 830-998 / 992-996 against 1005-1007.
// HSPLIT (NVIDIA): where a unit's tiles fill half of the work-group's warps at most, each tile
// is taken by two warps, each for half of the query heads (the arithmetic of a tile is a chain
// of one warp's; portable devices: their warp sums meet the work-group's barriers, every
// work-item at each). The split (1 or 2) of a unit of positions start .. end.
// PERF (H100, decode tok/s after 300 positions, units of two tiles, one machine, 2026-11-27):
// 1B Q4_0 1455-1473 -> 1560-1565, F16 957-962 -> 974-988, SmolLM2 1465-1473 -> 1470-1472;
// after 128 positions (one unit of five tiles a key-value head: no split) the same within the
// runs' spread. Logits identical. (Since tile_use's arithmetic went branch-free each warp of a
// split computes every head's scores and weighs only its own, so the split no longer shortens a
// warp's arithmetic; not measured apart since.)
#ifndef HSPLIT
#define HSPLIT 1
#endif
inline int head_split(int start, int end) {
#if PTX && HSPLIT && N_REP % 2 == 0
    return (end - start + TP - 1) / TP <= NW / 2 ? 2 : 1;
#else
    return 1;
#endif
}

#define PARTS_PTX PTX
#include "clops/partials.cl"  // combine_parts: a head's chunks' partials, combined

// silu(g) * v: the GLU of a gate and an up value
inline float glu(const float g, const float v) { return g / (1.0f + exp(-g)) * v; }

// The rows of a [gate | up] task: pair e is gate row j and up row FFN + j, j = the task's e-th.
inline void pair_rows(int k, int w, int *rows) {
    const int j0 = TASK0(k, R_GU, GRP) + w * R_GU;
#pragma unroll
    for (int e = 0; e < R_GU; ++e) {
        rows[2 * e] = min(j0 + e, FFN - 1);
        rows[2 * e + 1] = FFN + rows[2 * e];
    }
}

#if PIPE_GU || PIPE_D
// Pipelined float16 phases (PIPE): a warp's tasks, a [gate | up] pair or a row each (task k: pair
// or row TASK0(k, 1, GRP) + w), go in parts of a stage of the registers (st stages of SLOTS / st
// slots), and part c + st - 1's loads are issued before part c is used, so that a warp always
// has loads in flight; the loads of the first st - 1 parts are issued while the groups meet.
// A part holds spr slots of each of its rows (rows of K: cpt = KB / spr parts a task).
// PERF (H100, 1B F16 body, decode tok/s after 128 / 4096 positions): the phases as the others
// are (a task of two pairs, or a row, fetched whole and then used, its next one's rows
// prefetched into L2) 888 / 786 against 976-979 / 852-853 in one run; in 2 stages 981 / 854, 3
// 913 / 808, 4 957 / 836 in another (4 stages of the down phase and 2 of gate/up 970-973 / 847-
// 848). A layer's gate/up phase then streams its 67 MB in 24.5 us (2.7 TB/s), the down phase
// 34 MB in 14.6. The slowest work-group of these phases takes 1.3-1.6 us more than the median
// one (some SMs read slower, the same ones layer after layer); warps taking their tasks after
// the first from a counter, a task ahead, were far slower (671 against 1042 tok/s, every phase
// slower, QKV's too: the build as a whole, not the counter alone). The work-groups slowest in
// these phases (2026-11-27: the output phase's, whose first gate/up loads start later; gate/up
// median 20.3 us, slowest 21.1; down 11.6 and 12.8) given the places with the fewest rows, from
// a traced step: 1031-1033 against 1032-1039 tok/s.
#define GU_SPR min(KB(F16, DIM), SLOTS / GU_STAGES / 2)  // (2 rows a part)
#define GU_CPT ((KB(F16, DIM) + GU_SPR - 1) / GU_SPR)
#define D_SPR min(KB(F16, FFN), SLOTS / D_STAGES)
#define D_CPT ((KB(F16, FFN) + D_SPR - 1) / D_SPR)
#define PIPE_GU_ARGS(l) GU_STAGES, GU_CPT, GU_SPR, true, DIM, FFN, SEL(wgu, l), gu_dl
#define PIPE_D_ARGS(l) D_STAGES, D_CPT, D_SPR, false, FFN, DIM, SEL(wd, l), d_dl

// GU_DEAL (GUEARLY): the [gate | up] phase's pairs dealt as the other phases' rows (a pair a
// warp, the groups in turn) for the rounds that fill every warp, and the rest (less than a
// round) to the work-groups that loaded their first pairs while attention ran first, a pair a
// warp, then to the output phase's (which load theirs after their output rows), spread over
// them (gu_deal). dl: (the full rounds, -1: every task as the other phases' deal; the first of
// the group's pairs after them; the group's warps that take one).
// PERF (H100, 1B F16 body, one machine, 2026-11-27): traced per work-group, the output phase's
// groups were the gate/up phase's slowest, 2.0-2.3 us behind the median one in every layer
// (their first pairs load after their output rows), and the down phase's after them, 0.6-1.0 us
// (their first rows load last, as they arrive last); with this deal 1080-1085 -> 1089-1092 tok/s
// after 128 positions, 982-987 -> 985-989 after 1024, the same logits (one trace: the gate/up
// phase's slowest group 22.7 us against 21.6 without, its median 19.4 against 19.7). The early
// loaders' next pairs prefetched into L2 while attention ran as well (2 / 4 / 6 pairs a warp
// past the registers' stages, the groups without an attention unit): 1066-1074 / 1022-1028 /
// 1006-1014 against 1080-1089 tok/s (attention traced 8.2 -> 13.3 us at 4: the prefetches held
// its reads back); issued only once a unit had used its tiles (a second signal after GUWAIT's,
// 2026-11-27), 1 / 2 / 4 pairs: 1132-1135 / 1033-1092 / 1083 against 1143-1146 (traced at 2: a
// unit's tiles used 6.8 us after the barrier against 5.1; the first unit's signal let the
// prefetches go while the others still used theirs). The rest to the early loaders alone (a
// second pair each for some of them, none to the output phase's groups), as until 2026-11-27:
// traced by class of work-group, the early loaders with two more pairs were the slowest
// (gate/up 21.3 us, the output phase's 19.2); dealt as now the classes 19.5-20.2 us, and
// 1086-1092 -> 1104-1109 tok/s after 128 positions, after 1024 991-993 -> 989-995; the same
// logits. Runs with every early loader a pair fewer
// (GU_ROUNDS, the full rounds 6 or 5 rather than 7, the rest to the early loaders): 1049-1064.
// The output phase's share (256 pairs) a pair for each warp of 32 of its work-groups, against
// spread over the warps of all 64 (GU_SPREAD): 1092-1095 against 1094-1102 tok/s after 128
// positions, 991-996 against 992 after 1024; the slowest of those groups' class 22.0 against 21.8
// us (median over layers), the same logits. The rest dealt instead to the work-groups in the
// order they had finished their full rounds in the layer before (each group's clock stored after
// them; 2026-11-27): 1051-1093 against 1106-1114 tok/s after 128 positions, 990-996 against
// 994-1000 after 1024, the output phase's groups slower still (their class's slowest 22.0 against
// 21.3 us); the same logits. In the float16 layers' kernel (DFUSE) with attention's score loop
// unrolled twice (tile_use), at spans under 1024 (kernels/layer.py's SHORT_FUSED), GU_DEAL 0:
// 1176-1191 against 1160-1168 tok/s after 128 positions, 1118-1122 against 1085-1093 after 300
// (H100, 2026-11-27, alternately in one process, the same tokens; with the loop fully unrolled
// 1139-1153); after 1024 (8 slots) 1025-1036 against 1036, and 1B Q4_0 after 128 1993-2011
// against 2007-2009: there it stays 1.
#ifndef GU_DEAL
#define GU_DEAL 1
#endif
// E_DEAL: the down phase's rows past its full rounds dealt as GU_DEAL deals the pairs (the
// work-groups that finish gate/up last, the output phase's, take fewer), else (0) as the other
// phases' rows, in the order of the work-groups.
// PERF (H100, 1B F16 body, decode tok/s after 128 / 1024 positions, runs of one machine,
// 2026-11-27): 1101-1111 / 990-997 dealt, 1109-1113 / 992 not; the same logits.
#ifndef E_DEAL
#define E_DEAL 0
#endif
inline int deal_task(const int k, const int w, const int4 dl) {
    if (dl.x < 0 || k < dl.x) return TASK0(k, 1, GRP) + w;  // (the other phases' deal)
    return k == dl.x && w < dl.z ? dl.y + w : 1 << 30;
}

// GU_DEAL's dl for this work-group in a phase of N pairs or rows (place gc of G; the output
// phase's work-groups: gc < ncg): the early loaders' places first, a task for each of their
// warps, then the output phase's, the rest spread over them (GU_SPREAD: the fewest warps a
// group, else a task for each warp)
#ifndef GU_SPREAD
#define GU_SPREAD 1
#endif
inline int4 gu_deal(const int N, const int gc, const int ncg, const int G) {
    const int rounds = N / (G * NW), base = rounds * G * NW, rem = N - base;
    if (gc >= ncg) {  // (an early loader)
        const int at = (gc - ncg) * NW;
        return (int4)(rounds, base + at, clamp(rem - at, 0, NW), 0);
    }
    const int e = min(rem, (G - ncg) * NW), r2 = rem - e;
    const int per = GU_SPREAD ? min(NW, (r2 + ncg - 1) / ncg) : NW, at = e + gc * per;
    return (int4)(rounds, base + at, clamp(rem - at, 0, per), 0);
}

// Whether a phase dealt by dl (R rows a task where dl.x < 0) gives this work-group a task.
inline bool dealt_any(const int4 dl, const int R, const int N) {
    return dl.x < 0 ? TASK0(0, R, GRP) < N : dl.x > 0 || dl.z > 0;
}

// the parts of warp w's tasks in a phase of N rows or pairs (dl.x < 0: the group's first
// warp's, tasks while TASK0(k, 1, GRP) < N; else while deal_task(k, w, dl) < N)
inline int pipe_parts(const int cpt, const int N, const int4 dl, const int w) {
    const int first = get_group_id(0) * NW, round = get_num_groups(0) * NW;
    if (dl.x < 0) return (N - first + round - 1) / round * cpt;
    return (dl.x + (deal_task(dl.x, w, dl) < N)) * cpt;
}

// part c of nc into a, b (where c < nc); pairs: the gate row j and the up row FFN + j
inline void pipe_fetch(const int c, const int nc, const int cpt, const int spr, const bool pairs,
                       const int K, const int N, __global const uchar *W, const int4 dl,
                       const int w, const int lane, uint4 *a, uint4 *b) {
    if (c < nc) {
        const int j = min(deal_task(c / cpt, w, dl), N - 1);
        const int rows[2] = {j, FFN + j};
        fetch_part(W, K, rows, pairs ? 2 : 1, spr, c % cpt, lane, a, b);
    }
}

// part c (in a, b) into dm, and at a task's last part its sums stored (pairs: silu(gate) * up
// into out; else added to out)
// PERF (H100, 1B F16 body, decode tok/s after 128 / 1024 positions, runs of one machine,
// 2026-11-27): the gate/up phase's values stored as float16 (rounded as stage_half rounds them)
// and copied by the down phase into local memory as they are (half the bytes of its input read
// after the barrier; the same logits): 1099 / 994-995 against 1085-1089 / 995-998 in one run,
// 1084-1086 against 1094-1098 after 128 in the next. No gain: left out.
inline void pipe_use(const int c, const int cpt, const int spr, const bool pairs, const int K,
                     const int N, const int4 dl, const int w, const int lane, const uint4 *a,
                     const uint4 *b,
                     __local const uint *xq, float *dm, const float f, __global float *out,
                     float *old) {
    const int n = pairs ? 2 : 1, p = c % cpt;
    if (p == 0) {
#pragma unroll
        for (int e = 0; e < 8; ++e) dm[e] = 0.0f;
        if (XEARLY && !pairs) task_old_at(deal_task(c / cpt, w, dl), 1, N, lane, out, old);
    }
    mma_part(K, n, spr, p, lane, a, b, xq, dm);
    if (p == cpt - 1) {
        float r[2];
        mma_sums(n, lane, dm, r);
        const int j = deal_task(c / cpt, w, dl);
        if (!pairs)
            task_store_at(j, 1, N, lane, r, f, out, true, XEARLY ? old : 0, 0);
        else if (lane == 0 && j < N)
            out[j] = glu(r[0] * f, r[1] * f);
    }
}

// a pipelined phase's first pre parts (st - 1, or st where the registers are free longer
// before the phase), each into its stage
inline void pipe_start(const int st, const int cpt, const int spr, const bool pairs,
                       const int K, const int N, __global const uchar *W, const int4 dl,
                       const int w, const int lane, uint4 *a, uint4 *b, const int pre) {
    const int nc = pipe_parts(cpt, N, dl, w), hs = SLOTS / st;
#pragma unroll
    for (int j = 0; j < st; ++j)
        if (j < pre)
            pipe_fetch(j, nc, cpt, spr, pairs, K, N, W, dl, w, lane, a + j * hs, b + j * hs);
}

// a pipelined phase (pipe_start's pre parts loaded before): part c in stage c % st
inline void pipe_phase(const int st, const int cpt, const int spr, const bool pairs,
                       const int K, const int N, __global const uchar *W, const int4 dl,
                       const int w, const int lane, uint4 *a, uint4 *b, const int pre,
                       __local const uint *xq, const float f, __global float *out) {
    const int nc = pipe_parts(cpt, N, dl, w), hs = SLOTS / st;
    float dm[8], old[1];
    for (int c = 0; c < nc; c += st)
#pragma unroll
        for (int j = 0; j < st; ++j) {
            const int jn = (j + st - 1) % st;  // (the stage of the part used before)
            if (c + j + st - 1 >= pre)
                pipe_fetch(c + j + st - 1, nc, cpt, spr, pairs, K, N, W, dl, w, lane,
                           a + jn * hs, b + jn * hs);
            if (c + j < nc)
                pipe_use(c + j, cpt, spr, pairs, K, N, dl, w, lane, a + j * hs, b + j * hs, xq,
                         dm, f, out, old);
        }
}
#endif

// DFUSE (NVIDIA; float16 [gate | up] and down weights, rows of 2048 values at most): the down
// projection inside the [gate | up] phase, with no grid barrier and no input staged between
// them. A warp puts its pairs' h_j = silu(gate_j) up_j in local memory (hg) and counts them
// (hdone); after its pairs it streams the down weights' columns j of the work-group's pairs (wd
// holds them as rows of DIM values: kernels/layer.py's down_cols), warp w taking the values
// DIM / NW w .. of every column (a lane's 16 bytes of each) once the warps' counts cover that
// part's pairs, and adds its sums of h_j Wd[:, j] into x by atomic additions. x takes them while
// the phase runs, so the phase reads its input from h, where the output phase stores x's rows
// as well. The additions' order varies from run to run, and so may x's last bits.
// PERF (H200, 1B F16 body, decode tok/s after 128 positions, runs of one machine, 2026-11-27;
// the same tokens in each): 1261-1274 against the phases apart, 1298-1317 with a barrier of the
// work-group before the down parts (1326-1330 without the atomic additions: a wrong x), 1324-1352
// with the counts. With the counts, the work-groups' additions spread over 4 vectors (x and 3
// more, summed by the next QKV phase and gathered into x by the output phase) 1131-1160, spread
// without the gathering (a wrong x) 1360-1381. Each warp summing whole columns in registers (64
// sums a lane: 660-681 against 1030-1033 on an H100) or in local memory by atomic additions
// (1061-1073) was slower. On an H100 (one machine): 1076-1145 against 1106-1108 apart, and a
// warp's sums added into x after each down part instead of once (four times the additions,
// spread over the phase) 987-988. Where the span is long (8 register slots: a pair in two
// parts), H100 after 4096 positions: 952-971 against 898-929 apart.
#ifndef DFUSE
#define DFUSE 0
#endif
#if DFUSE
#if !(PIPE_GU && WF_D == F16 && GU_STAGES == 2 && DIM <= 8 * LS && (PHASES & 28) == 28)
#error "decode_layers: DFUSE takes pipelined float16 phases C to E, rows of 8 LS values at most"
#endif
// a down part: a lane's 16-byte chunk of DF_RP columns (a stage's registers); DF_T (kernels/
// layer.py): a warp's pairs at most
#define DF_RP (SLOTS / GU_STAGES * 2)

// the column of the work-group's pair q (pair q / NW of warp q % NW), or -1 where there is none
inline int df_task(const int q, const int4 dl) {
    const int j = deal_task(q / NW, q % NW, dl);
    return q < DF_T * NW && j < FFN ? j : -1;
}

// part c into a, b: a warp's [gate | up] pairs' parts (c < ng), nothing up to the most parts a
// warp of the work-group takes (ngm: parts of none), then the down parts (part ngm + i: the
// columns of pairs DF_RP i .., zeros for none)
inline void fuse_fetch(const int c, const int ng, const int ngm, const int nc,
                       __global const uchar *Wgu, __global const uchar *Wdc, const int4 dl,
                       const int w, const int lane, uint4 *a, uint4 *b) {
    if (c < ng) {
        pipe_fetch(c, ng, GU_CPT, GU_SPR, true, DIM, FFN, Wgu, dl, w, lane, a, b);
    } else if (c >= ngm && c < nc) {
        const int q0 = (c - ngm) * DF_RP, u = w * 32 + lane;  // (the chunk: columns 8 u ..)
#pragma unroll
        for (int r = 0; r < DF_RP; ++r) {
            const int j = df_task(q0 + r, dl);
            const uint4 v = j >= 0 && u < DIM / 8
                ? wload((__global const uint4 *)(Wdc + (size_t)j * ROW_BYTES(F16, DIM)) + u)
                : (uint4)(0u);
            if (r < DF_RP / 2) a[r] = v;
            else b[r - DF_RP / 2] = v;
        }
    }
}

// acc[0 .. 8) += h * the 8 float16 values of v
inline void axpy8(float *acc, const uint4 v, const float h) {
    const uint u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 p = half2_floats(u[k]);
        acc[2 * k] = mad(h, p.x, acc[2 * k]);
        acc[2 * k + 1] = mad(h, p.y, acc[2 * k + 1]);
    }
}

// the pairs that every warp of the work-group has put in hg (hdone: each warp's count)
inline int df_ready(__local const int *hdone) {
    int n = ((volatile __local const int *)hdone)[0];
#pragma unroll
    for (int i = 1; i < NW; ++i) n = min(n, ((volatile __local const int *)hdone)[i]);
    return n;
}

// part c (in a, b): a pair's part summed into dm, at its last the pair's h into hg and the
// warp's count into hdone (tm, the most pairs a warp takes, after its last pair); or a down
// part's products added to acc, once every warp has put that part's pairs' h in hg
inline void fuse_use(const int c, const int ng, const int ngm, const int4 dl, const int w,
                     const int lane, const uint4 *a, const uint4 *b, __local const uint *xq,
                     const float f, __local float *hg, __local int *hdone, float *dm,
                     float *acc) {
    const int tm = ngm / GU_CPT;
    if (c < ng) {
        const int p = c % GU_CPT, k = c / GU_CPT;
        if (p == 0)
#pragma unroll
            for (int e = 0; e < 8; ++e) dm[e] = 0.0f;
        mma_part(DIM, 2, GU_SPR, p, lane, a, b, xq, dm);
        if (p == GU_CPT - 1) {
            float r[2];
            mma_sums(2, lane, dm, r);
            if (lane == 0) {
                if (deal_task(k, w, dl) < FFN) hg[k * NW + w] = glu(r[0] * f, r[1] * f);
                mem_fence(CLK_LOCAL_MEM_FENCE);
                ((volatile __local int *)hdone)[w] = c + 1 == ng ? tm : k + 1;
            }
        }
    } else if (c >= ngm) {
        const int q0 = (c - ngm) * DF_RP;
        // (the part's pairs: q0 / NW .. (q0 + DF_RP - 1) / NW of each warp)
        const int need = min((q0 + DF_RP - 1) / NW + 1, tm);
        while (df_ready(hdone) < need) {
            // (the other warps' pairs: they are at most a part behind)
        }
        mem_fence(CLK_LOCAL_MEM_FENCE);
#pragma unroll
        for (int r = 0; r < DF_RP; ++r)  // (no pair: zeros in hg and in the part)
            axpy8(acc, r < DF_RP / 2 ? a[r] : b[r - DF_RP / 2], hg[min(q0 + r, DF_T * NW - 1)]);
    }
}

// the fused phase (pipe_start's pre parts loaded before; hg and hdone zero, ordered before by
// a barrier of the work-group): x += Wd . h, the work-group's share
inline void fuse_phase(__global const uchar *Wgu, __global const uchar *Wdc, const int4 dl,
                       const int w, const int lane, uint4 *a, uint4 *b, const int pre,
                       __local const uint *xq, const float f, __local float *hg,
                       __local int *hdone, __global float *x) {
    // (warp 0 takes the most pairs of the work-group's warps)
    const int ng = pipe_parts(GU_CPT, FFN, dl, w), ngm = pipe_parts(GU_CPT, FFN, dl, 0);
    const int nc = ngm + (ngm / GU_CPT * NW + DF_RP - 1) / DF_RP, hs = SLOTS / GU_STAGES;
    const int have = min(pre, ng);  // (the parts pipe_start loaded: pairs' alone)
    float acc[8], dm[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    if (ng == 0 && lane == 0) ((volatile __local int *)hdone)[w] = ngm / GU_CPT;  // (no pairs)
    for (int c = 0; c < nc; c += GU_STAGES)
#pragma unroll
        for (int j = 0; j < GU_STAGES; ++j) {
            const int jn = (j + GU_STAGES - 1) % GU_STAGES, cn = c + j + GU_STAGES - 1;
            if (cn >= have)
                fuse_fetch(cn, ng, ngm, nc, Wgu, Wdc, dl, w, lane, a + jn * hs, b + jn * hs);
            if (c + j < nc)
                fuse_use(c + j, ng, ngm, dl, w, lane, a + j * hs, b + j * hs, xq, f, hg, hdone,
                         dm, acc);
        }
    __global float *xc = x + 8 * (w * 32 + lane);
    if (w * 32 + lane < DIM / 8) {
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                     :: "l"(xc), "f"(acc[0]), "f"(acc[1]), "f"(acc[2]), "f"(acc[3]) : "memory");
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                     :: "l"(xc + 4), "f"(acc[4]), "f"(acc[5]), "f"(acc[6]), "f"(acc[7])
                     : "memory");
    }
}
#endif

// The rows of task k of a phase (pairs: the [gate | up] phase's pairs), and how many.
inline int phase_rows(int k, const int R, const int N, const bool pairs, int g, int w,
                      int *rows) {
    if (pairs) {
        pair_rows(k, w, rows);
        return 2 * R;
    }
    task_rows(k, R, N, g, w, rows);
    return R;
}

// A phase's weights: format, scale kind, rows a task, rows (pairs), inputs, values, scales.
#define PH_QKV(l) WF_QKV, SH_QKV, R_QKV, NQKV, false, DIM, SEL(wqkv, l), SEL(sqkv, l)
#define PH_O(l) WF_O, SH_O, R_O, DIM, false, HEADS * D, SEL(wo, l), SEL(so, l)
#define PH_GU(l) WF_GU, SH_GU, R_GU, FFN, true, DIM, SEL(wgu, l), SEL(sgu, l)
#define PH_D(l) WF_D, SH_D, R_D, DIM, false, FFN, SEL(wd, l), SEL(sd, l)

// Into L2, while the warp works on task k of a phase (PH_*), the rows of its next task (where
// it has one). Task 0's is issued before the phase's input is staged: the weights stream while
// the work-group reads and quantizes its input.
// PERF (H100, decode tok/s, runs of one machine): the first rows of the phase after a phase's
// last task prefetched too (what its warps load while the groups meet) were slower: 1B Q4_0
// 1628-1630 against 1737-1738 after 128 positions, 999 against 1050 after 16384; 1B F16 762-766
// against 795 (the phases' own streams held back)
inline void ahead(int k, const int fmt, const int sh, const int R, const int N,
                  const bool pairs, const int K, __global const uchar *W,
                  __global const half *S, int g, int w, int lane, int *rows) {
    if (TASK0(k + 1, R, g) < N) {
        const int n = phase_rows(k + 1, R, N, pairs, g, w, rows);
        rows_l2(fmt, sh, W, S, K, rows, n, lane);
    }
}

// A layer's arguments (suffix i: the launch's i-th layer) and the one of layer l among them.
#define LAYER_ARGS(i)                                                                          \
    __global const float *anw##i, __global const uchar *wqkv##i, __global const half *sqkv##i, \
        __global kv_t *kc##i, __global kv_t *vc##i, __global const float *inv_freq##i,         \
        __global const uchar *wo##i, __global const half *so##i, __global const float *fnw##i, \
        __global const uchar *wgu##i, __global const half *sgu##i, __global const uchar *wd##i, \
        __global const half *sd##i QKN_ARGS(i)
#if QKNORM
#define QKN_ARGS(i) , __global const float *qnw##i, __global const float *knw##i
#else
#define QKN_ARGS(i)
#endif
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
#define L8(n, l) : (l) == 8 ? n##8
#else
#define L8(n, l)
#endif
#if NL > 9
#define L9(n, l) : (l) == 9 ? n##9
#else
#define L9(n, l)
#endif
#if NL > 10
#define L10(n, l) : (l) == 10 ? n##10
#else
#define L10(n, l)
#endif
#if NL > 11
#define L11(n, l) : (l) == 11 ? n##11
#else
#define L11(n, l)
#endif
#if NL > 12
#define L12(n, l) : (l) == 12 ? n##12
#else
#define L12(n, l)
#endif
#if NL > 13
#define L13(n, l) : (l) == 13 ? n##13
#else
#define L13(n, l)
#endif
#if NL > 14
#define L14(n, l) : (l) == 14 ? n##14
#else
#define L14(n, l)
#endif
#if NL > 15
#define L15(n, l) : (l) == 15 ? n##15
#else
#define L15(n, l)
#endif
#if NL > 16
#error "decode_layers: at most 16 layers a launch"
#endif
#define SEL(n, l)                                                                              \
    ((l) == 0 ? n##0 L1(n, l) L2(n, l) L3(n, l) L4(n, l) L5(n, l) L6(n, l) L7(n, l) L8(n, l)    \
         L9(n, l) L10(n, l) L11(n, l) L12(n, l) L13(n, l) L14(n, l) L15(n, l) : n##0)

// NL consecutive decoder layers (the same formats), one after another, a grid barrier between.
// Picked by the decode plan (llm/step.py) where every layer passes layer.takes (NVIDIA GPUs)
__kernel __attribute__((reqd_work_group_size(LS, 1, 1)))
void decode_layers(__global float *x, __global float *qkv, __global const int *state,
                   __global float *attn, __global float *part, __global int *count,
                   __global float *h, __global int *bar, int max_seq, float eps, float scale,
#if EMB
                   __global const int *tokens, __global const half *emb, int vocab,
#endif
#if PAGED
                   __global const int *table, int maxb, __global const int *slots,
#endif
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
#if NL > 8
                   , LAYER_ARGS(8)
#endif
#if NL > 9
                   , LAYER_ARGS(9)
#endif
#if NL > 10
                   , LAYER_ARGS(10)
#endif
#if NL > 11
                   , LAYER_ARGS(11)
#endif
#if NL > 12
                   , LAYER_ARGS(12)
#endif
#if NL > 13
                   , LAYER_ARGS(13)
#endif
#if NL > 14
                   , LAYER_ARGS(14)
#endif
#if NL > 15
                   , LAYER_ARGS(15)
#endif
                   ) {
    __local uint xq[ANY_F16 ? QKMAX / 2 : QKMAX / 4];  // (f16: float16 values)
    __local float xd[QKMAX / 32];
    __local int xs[QKMAX / 32];
    __local float red[LS], y[N_REP * D], kn[D], vn[D];
    // attention: a warp's weights of its tile, the warps' (unnormalized) outputs, largest
    // scores and sums of weights
    __local float pwl[NW * N_REP * TP], ow[NW * N_REP * D], mw[NW * N_REP], lw[NW * N_REP];
    __local int last;
#if QKNORM
    __local float qkr[N_REP + 1];  // (1 / RMS of the unit's query heads and its new key)
#endif
#if DFUSE
    __local float hg[DF_T * NW];  // (the work-group's [gate | up] pairs' values)
    __local int hdone[NW];
#endif
    const int t = get_local_id(0), w = t >> 5, lane = t & 31;
    const int grp = get_group_id(0), G = get_num_groups(0);
    const int pos = state[0], L = pos + 1;
#if PAGED
    KV_AT_T kv_at = table + (size_t)slots[0] * maxb;  // (the row's blocks)
    const int tok_at = 0;
#else
    KV_AT_T kv_at = max_seq;
    const int tok_at = pos;
#endif
    count_t target = 0;
    if (t == 0) target = grid_start(bar);
    uint4 wa[SLOTS], wb[SLOTS];
    float2 wdd[SLOTS];
    int rows[SLOTS];
    float r[SLOTS], xo[SLOTS];  // (xo: x's values at an accumulating task's rows, XEARLY)
    kv4_t ka[KU], va[VU];  // a warp's tile of keys and values
    // attention's splits of a key-value head's positions (the same in every layer)
    const int per = split_len(L), NS = (L + per - 1) / per;
    // the output phase's order of the work-groups: attention's units' groups last (CSKIP), so
    // that where the others cover its rows those groups take none (their rows' loads would
    // wait for attention: their loads are issued while the groups meet after it)
    const int U = KV_HEADS * NS, gc = CSKIP && U < G ? (grp + G - U) % G : grp;
    const bool has_a = (PHASES & 1) && TASK0(0, R_QKV, grp) < NQKV;
    const bool has_c = (PHASES & 4) && TASK0(0, R_O, gc) < DIM;
    // a work-group without output rows loads its first [gate | up] weights as soon as it has
    // left attention (GUEARLY), the registers of both stages of a pipelined phase
    const bool gu_early = GUEARLY && !has_c;
#if PIPE_GU || PIPE_D
    // (GU_DEAL, E_DEAL: the output phase's work-groups are places gc < ncg)
    const int ncg = (PHASES & 4) ? (DIM + NW * R_O - 1) / (NW * R_O) : 0;
    const bool deal = GUEARLY && ncg > 0 && ncg < G;
#endif
#if PIPE_GU
    const int4 gu_dl = GU_DEAL && deal ? gu_deal(FFN, gc, ncg, G) : (int4)(-1, 0, 1, 0);
    const bool has_d = (PHASES & 8) && dealt_any(gu_dl, R_GU, FFN);
#else
    const bool has_d = (PHASES & 8) && TASK0(0, R_GU, grp) < FFN;
#endif
#if PIPE_D
    const int4 d_dl = E_DEAL && deal ? gu_deal(DIM, gc, ncg, G) : (int4)(-1, 0, 1, 0);
    const bool has_e = (PHASES & 16) && dealt_any(d_dl, R_D, DIM);
#else
    const bool has_e = (PHASES & 16) && TASK0(0, R_D, grp) < DIM;
#endif
#if PIPE_GU
    const int gu_pre = gu_early ? GU_STAGES : GU_STAGES - 1;
#define gu_first(l) \
    if (has_d) pipe_start(PIPE_GU_ARGS(l), w, lane, wa, wb, gu_pre)
#else
#define gu_first(l)                                                                         \
    if (has_d) {                                                                            \
        pair_rows(0, w, rows);                                                              \
        fetch(WF_GU, SH_GU, SEL(wgu, l), SEL(sgu, l), DIM, rows, 2 * R_GU, lane, wa, wb, wdd); \
    }
#endif
    if (has_a) {
        task_rows(0, R_QKV, NQKV, grp, w, rows);
        fetch(WF_QKV, SH_QKV, wqkv0, sqkv0, DIM, rows, R_QKV, lane, wa, wb, wdd);
    }
#if EMB
    // x: the embedding row of the step's token (tokens[state[0]]), float16 values; the first
    // layer's norm reads the row itself, work-group 0 stores x (read after the barriers)
    __global const half *erow = emb + (size_t)clamp(tokens[tok_at], 0, vocab - 1) * DIM;
    if (grp == 0)
        for (int i = t; i < DIM / 4; i += LS) vstore4(vload_half4(i, erow), i, x);
#else
    __global const half *erow = 0;
#endif
    for (int l = 0; l < NL; ++l) {
        __global const float *anw = SEL(anw, l), *inv_freq = SEL(inv_freq, l), *fnw = SEL(fnw, l);
        __global const uchar *wqkv = SEL(wqkv, l), *wo = SEL(wo, l), *wgu = SEL(wgu, l),
                             *wd = SEL(wd, l);
        __global const half *sqkv = SEL(sqkv, l), *so = SEL(so, l), *sgu = SEL(sgu, l),
                            *sd = SEL(sd, l);
        __global kv_t *kc = SEL(kc, l), *vc = SEL(vc, l);

        // ---- A: qkv = Wqkv . n(x) (the first task's rows loaded before) ----
        if (has_a) {
            ahead(0, PH_QKV(l), grp, w, lane, rows);
            // PERF (H100, 1B F16 body, decode tok/s after 128 positions, alternately in one
            // process, 2026-11-27): an attention unit's first tile prefetched into L2 here (its
            // loads at the barrier after this phase then L2 hits) 1133-1151 against 1143-1154.
            const float fa = stage(WF_QKV, x, l == 0 ? erow : 0, DIM, anw, eps, xq, xd, xs, red);
            for (int k = 0; TASK0(k, R_QKV, grp) < NQKV; ++k) {
                if (k > 0) {
                    task_rows(k, R_QKV, NQKV, grp, w, rows);
                    fetch(WF_QKV, SH_QKV, wqkv, sqkv, DIM, rows, R_QKV, lane, wa, wb, wdd);
                    ahead(k, PH_QKV(l), grp, w, lane, rows);
                }
                dots(WF_QKV, DIM, R_QKV, lane, wa, wb, wdd, xq, xd, xs, red, r);
                task_store(k, R_QKV, NQKV, grp, w, lane, r, fa, qkv, false, 0, 0);
            }
        }
        // PERF (H100, decode tok/s after 128 positions, alternately in one process,
        // 2026-11-27): attention's units waiting for their key-value head's QKV rows alone (a
        // count a head, added with release semantics by each task's storing lane, read by an
        // acquire load) instead of this barrier: 1B F16 1138-1143 against 1149-1156 (relaxed
        // polls and one acquire: 1139-1142 against 1143-1146), Q4_0 1966-1985 against
        // 1986-2008, F16 after 4000 positions 973-996 against 1008-1020; the logits identical.
        grid_arrive(bar, &target);
        // the first tile of this work-group's first attention unit streams while they meet
        if ((PHASES & 2) && grp < KV_HEADS * NS) {
            const int s0 = grp % NS, e0 = min(L, s0 * per + per);
            const int b0 = s0 * per + w % (NW / head_split(s0 * per, e0)) * TP;
            tile_load(kc, vc, grp / NS, b0, kv_at, min(e0, pos) - b0, lane, ka, va);
        }
        grid_wait(bar, target);

        // ---- B: attention ----
        // (key-value head, split of its positions) units, a work-group each in turn; q and the
        // new key rotated by pos as they are read; the new key and value stored in the cache
        // by the unit of the last split
        if (PHASES & 2) {
            for (int u = grp; u < KV_HEADS * NS; u += G) {
                const int li = l;  // (l: the softmax sums below)
                const int kvh = u / NS, s = u % NS, h0 = kvh * N_REP;
                const int start = s * per, end = min(L, start + per), stored = min(end, pos);
                // (a warp's tiles: wt, wt + nwt, ...; its query heads r0 .. r0 + N_REP / hs)
                const int hs = head_split(start, end), nwt = NW / hs, wt = w % nwt;
                const int r0 = w / nwt * (N_REP / hs), r1 = r0 + N_REP / hs;
                const int rounds = ((end - start + TP - 1) / TP + nwt - 1) / nwt;
                if (u != grp)
                    tile_load(kc, vc, kvh, start + wt * TP, kv_at, stored - start - wt * TP, lane,
                              ka, va);
#if QKNORM
                // (the raw query heads and new key in ow, free until the warps' outputs)
                for (int c = t; c < (N_REP + 1) * D; c += LS)
                    ow[c] = load_fresh(qkv + (c < N_REP * D ? h0 * D + c
                                                            : (HEADS + kvh - N_REP) * D + c));
                barrier(CLK_LOCAL_MEM_FENCE);
                head_norms(ow, qkr, eps, red);
                __global const float *qnw = SEL(qnw, li), *knw = SEL(knw, li);
                for (int c = t; c < N_REP * D; c += LS)
                    y[c] = normed_rotated(ow + c / D * D, c % D, pos, inv_freq, qkr[c / D],
                                          qnw) * scale;
                if (t < D) {  // (as the cache keeps them)
                    kn[t] = kv_round(normed_rotated(ow + N_REP * D, t, pos, inv_freq,
                                                    qkr[N_REP], knw));
                    vn[t] = kv_round(load_fresh(qkv + (HEADS + KV_HEADS + kvh) * D + t));
                }
#else
                for (int c = t; c < N_REP * D; c += LS)
                    y[c] = rotated(qkv + (h0 + c / D) * D, c % D, pos, inv_freq) * scale;
                if (t < D) {  // (as the cache keeps them)
                    kn[t] = kv_round(rotated(qkv + (HEADS + kvh) * D, t, pos, inv_freq));
                    vn[t] = kv_round(load_fresh(qkv + (HEADS + KV_HEADS + kvh) * D + t));
                }
#endif
                barrier(CLK_LOCAL_MEM_FENCE);
                if (u == grp) att_stamp(bar, li, 0);
#if PTX && GUWAIT
                // (its inputs read: the work-groups waiting to load weights may go)
                if ((PHASES & 2) && t == 0 && u == grp) atomic_xchg(bar + 3, (int)(uint)target);
#endif
                float m[N_REP], l[N_REP], acc[N_REP * VD];
#pragma unroll
                for (int i = 0; i < N_REP; ++i) {
                    m[i] = -INFINITY;
                    l[i] = 0.0f;
                }
#pragma unroll
                for (int i = 0; i < N_REP * VD; ++i) acc[i] = 0.0f;
                __local float *pw = pwl + w * N_REP * TP;
                for (int i = 0; i < rounds; ++i) {
                    const int b0 = start + (i * nwt + wt) * TP;
                    if (i > 0) tile_load(kc, vc, kvh, b0, kv_at, stored - b0, lane, ka, va);
                    tile_use(ka, va, b0, end, pos, lane, y, kn, vn, pw, m, l, acc, red, r0, r1);
                }
                if (u == grp) att_stamp(bar, li, 1);
                // the warps' outputs combined: the unit's attention (one split) or its partial
                // (a warp's other query heads: m -inf, weight 0)
#pragma unroll
                for (int i = 0; i < N_REP; ++i)
                    if (PTX || (i >= r0 && i < r1)) l[i] = warp_all(l[i], false, red);
#pragma unroll
                for (int i = 0; i < N_REP * VD; ++i)  // (over the lanes of a dimension)
                    if (PTX || (i / VD >= r0 && i / VD < r1))
                        acc[i] = lanes_total(acc[i], LPR, red);
                if (lane < LPR)
#pragma unroll
                    for (int i = 0; i < N_REP * VD; ++i)
                        ow[(w * N_REP + i / VD) * D + VD * lane + i % VD] = acc[i];
                if (lane == 0)
#pragma unroll
                    for (int i = 0; i < N_REP; ++i) {
                        mw[w * N_REP + i] = m[i];
                        lw[w * N_REP + i] = l[i];
                    }
                barrier(CLK_LOCAL_MEM_FENCE);
                if (u == grp) att_stamp(bar, li, 2);
                for (int c = t; c < N_REP * D; c += LS) {
                    const int hr = c / D, d = c % D;
                    float mx = -INFINITY, num = 0.0f, den = 0.0f;
                    for (int q = 0; q < NW; ++q) mx = fmax(mx, mw[q * N_REP + hr]);
                    for (int q = 0; q < NW; ++q) {  // (a warp of no positions: weight 0)
                        const float f = exp(mw[q * N_REP + hr] - mx);
                        num = mad(f, ow[(q * N_REP + hr) * D + d], num);
                        den = mad(f, lw[q * N_REP + hr], den);
                    }
                    if (NS == 1) {
                        attn[(h0 + hr) * D + d] = num / den;
                    } else {
                        __global float *pp = part + ((size_t)(h0 + hr) * NS + s) * (D + 2);
                        pp[d] = num;
                        if (d == 0) {
                            pp[D] = mx;
                            pp[D + 1] = den;
                        }
                    }
                }
                if (NS > 1) {  // the last of the key-value head's units combines its splits
                    ACQUIRE();
                    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
                    if (t == 0) last = atomic_inc(count + kvh) == NS - 1;
                    barrier(CLK_LOCAL_MEM_FENCE);
                    if (last) {
                        ACQUIRE();
                        for (int c = t; c < N_REP * D; c += LS) {
                            const int hh = h0 + c / D;
                            attn[hh * D + c % D] =
                                combine_parts(part + (size_t)hh * NS * (D + 2), NS, c % D, true);
                        }
                        if (t == 0) atomic_xchg(count + kvh, 0);
                    }
                }
                // the cache at pos (read from kn and vn in this launch)
                if (s == NS - 1 && t < D) {
                    const size_t at = KV_ROW(kvh, pos, kv_at) * D + t;
                    KV_PUT(kn[t], kc, at);
                    KV_PUT(vn[t], vc, at);
                }
                if (u == grp) att_stamp(bar, li, 3);
                barrier(CLK_LOCAL_MEM_FENCE);
            }
        }
        grid_arrive(bar, &target);
#if PTX && GUWAIT && (PHASES & 2)
        // (a work-group without an attention unit that loads weights here waits until attention
        // has read its inputs: its loads would hold back those reads)
        if ((has_c || gu_early) && grp >= U) {
            if (t == 0) {
                const uint want = (uint)(target - G);
                int spins = 0;
                while ((int)((uint)((volatile __global int *)bar)[3] - want) < 0 &&
                       ++spins < SPIN_LIMIT)
                    asm volatile("nanosleep.u32 64;");
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
#endif
        if (has_c) {
            task_rows(0, R_O, DIM, gc, w, rows);
            fetch(WF_O, SH_O, wo, so, HEADS * D, rows, R_O, lane, wa, wb, wdd);
            if (XEARLY) task_old(0, R_O, DIM, gc, w, lane, x, xo);
        } else if (gu_early) {
            gu_first(l);
        }
        grid_wait(bar, target);

        // ---- C: x += Wo . attn ----
        // PERF (H100, 1B F16 body, decode tok/s after 128 positions, alternately in one
        // process, 2026-11-27): the output projection inside attention instead (no barrier
        // between B and C: OC work-groups a key-value head each running its attention and adding
        // Wo's rows of the group at that head's columns times its values into x and h by atomic
        // additions), the same tokens: 128 units, their rows loaded while the tiles were used,
        // 1019-1029 against 1126-1157 (traced: the tiles 3.9 -> 6.1 us with those rows held in
        // registers through them; the units' [gate | up] loads at the barrier after, its release
        // 5.6 us); the rows prefetched into L2 and loaded after the tiles, the units a stage of
        // [gate | up] 1041-1048 against 1144-1149 (attention with the output 12.4 us of wall time
        // against 12.9 for B and C, but the gate/up phase 4.6 us longer and QKV 1.5: fewer weights
        // loaded while attention ran, and h copied from x during QKV); 64 units (two
        // rounds of rows, the others loading [gate | up] meanwhile) 1007-1009 against 1146-1148
        // (the tiles 7.1 us: every load in flight holds attention's chain back).
        if (has_c) {
            ahead(0, PH_O(l), gc, w, lane, rows);
            stage(WF_O, attn, 0, HEADS * D, 0, eps, xq, xd, xs, red);
            for (int k = 0; TASK0(k, R_O, gc) < DIM; ++k) {
                if (k > 0) {
                    task_rows(k, R_O, DIM, gc, w, rows);
                    fetch(WF_O, SH_O, wo, so, HEADS * D, rows, R_O, lane, wa, wb, wdd);
                    if (XEARLY) task_old(k, R_O, DIM, gc, w, lane, x, xo);
                    ahead(k, PH_O(l), gc, w, lane, rows);
                }
                dots(WF_O, HEADS * D, R_O, lane, wa, wb, wdd, xq, xd, xs, red, r);
                // (DFUSE: into h too, the [gate | up] phase's input)
                task_store(k, R_O, DIM, gc, w, lane, r, 1.0f, x, true, XEARLY ? xo : 0,
                           DFUSE ? h : 0);
            }
        }
        grid_arrive(bar, &target);
        if (!gu_early) gu_first(l);
        grid_wait(bar, target);

        // ---- D: h = silu(gate) * up ----
        if (has_d) {
#if DFUSE
            for (int i = t; i < DF_T * NW; i += LS) hg[i] = 0.0f;  // (stage's barriers follow)
            if (t < NW) hdone[t] = 0;
            const float fd = stage(WF_GU, h, 0, DIM, fnw, eps, xq, xd, xs, red);
            fuse_phase(wgu, wd, gu_dl, w, lane, wa, wb, gu_pre, xq, fd, hg, hdone, x);
#elif PIPE_GU
            const float fd = stage(WF_GU, x, 0, DIM, fnw, eps, xq, xd, xs, red);
            pipe_phase(PIPE_GU_ARGS(l), w, lane, wa, wb, gu_pre, xq, fd, h);
#else
            ahead(0, PH_GU(l), grp, w, lane, rows);
            const float fd = stage(WF_GU, x, 0, DIM, fnw, eps, xq, xd, xs, red);
            for (int k = 0; TASK0(k, R_GU, grp) < FFN; ++k) {
                if (k > 0) {
                    pair_rows(k, w, rows);
                    fetch(WF_GU, SH_GU, wgu, sgu, DIM, rows, 2 * R_GU, lane, wa, wb, wdd);
                    ahead(k, PH_GU(l), grp, w, lane, rows);
                }
                dots(WF_GU, DIM, 2 * R_GU, lane, wa, wb, wdd, xq, xd, xs, red, r);
                const int j0 = TASK0(k, R_GU, grp) + w * R_GU;
                if (lane == 0)
#pragma unroll
                    for (int e = 0; e < R_GU; ++e) {
                        if (j0 + e < FFN) h[j0 + e] = glu(r[2 * e] * fd, r[2 * e + 1] * fd);
                    }
            }
#endif
        }
#if !DFUSE
        grid_arrive(bar, &target);
        if (has_e) {
#if PIPE_D
            pipe_start(PIPE_D_ARGS(l), w, lane, wa, wb, D_STAGES - 1);
#else
            task_rows(0, R_D, DIM, grp, w, rows);
            fetch(WF_D, SH_D, wd, sd, FFN, rows, R_D, lane, wa, wb, wdd);
            if (XEARLY) task_old(0, R_D, DIM, grp, w, lane, x, xo);
#endif
        }
        grid_wait(bar, target);

        // ---- E: x += Wd . h ----
        if (has_e) {
#if PIPE_D
            stage(WF_D, h, 0, FFN, 0, eps, xq, xd, xs, red);
            pipe_phase(PIPE_D_ARGS(l), w, lane, wa, wb, D_STAGES - 1, xq, 1.0f, x);
#else
            ahead(0, PH_D(l), grp, w, lane, rows);
            stage(WF_D, h, 0, FFN, 0, eps, xq, xd, xs, red);
            for (int k = 0; TASK0(k, R_D, grp) < DIM; ++k) {
                if (k > 0) {
                    task_rows(k, R_D, DIM, grp, w, rows);
                    fetch(WF_D, SH_D, wd, sd, FFN, rows, R_D, lane, wa, wb, wdd);
                    if (XEARLY) task_old(k, R_D, DIM, grp, w, lane, x, xo);
                    ahead(k, PH_D(l), grp, w, lane, rows);
                }
                dots(WF_D, FFN, R_D, lane, wa, wb, wdd, xq, xd, xs, red, r);
                task_store(k, R_D, DIM, grp, w, lane, r, 1.0f, x, true, XEARLY ? xo : 0, 0);
            }
#endif
        }
#endif
        if (l + 1 < NL) {  // the next layer's first QKV rows stream while the groups meet
            grid_arrive(bar, &target);
            if (has_a) {
                const int m = l + 1;
                task_rows(0, R_QKV, NQKV, grp, w, rows);
                fetch(WF_QKV, SH_QKV, SEL(wqkv, m), SEL(sqkv, m), DIM, rows, R_QKV, lane, wa, wb,
                      wdd);
            }
            grid_wait(bar, target);
        }
    }
}

// The probe: G work-groups meet at `rounds` grid barriers, each adding its id to a sum after
// every one; a work-group that spun past SPIN_LIMIT sets bar[2].
// Launched by layer.grid_barriers_work (the resident_groups probe), no plan
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
