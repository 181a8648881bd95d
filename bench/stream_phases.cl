// bench/stream_phases.py's kernels (NVIDIA, PTX). Streaming of a persistent grid (a work-group a
// multiprocessor) in P phases of NP parts
// of PART bytes (phase p's parts at W + p * NP * PART), warp gw of the grid taking parts gw,
// gw + G NW, ..., a grid barrier between phases (release add, relaxed polls, acquire load).
// phases_regs: STAGES register stages, PRE parts of the next phase loaded between the
//   barrier's arrive and wait (as layer.cl's pipelined phases);
// phases_tma: a ring of S slots of PART bytes a warp in local memory, filled by cp.async.bulk
//   (lane 0), running on across the barriers.
#define NW (LS / 32)
#define U (PART / 512)
#ifndef PRE
#define PRE (STAGES - 1)
#endif
#ifndef HIDE
#define HIDE "//@@"  // (sm_90a's copies, uncommented in the PTX by the script)
#endif
#ifndef BARRIERS
#define BARRIERS 1  // 0: the phases run on without meeting
#endif

inline uint4 nc_load(__global const uint4 *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
inline uint fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

inline void arrive(__global ulong *bar, ulong *target) {
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) {
        *target += get_num_groups(0);
        asm volatile("red.release.gpu.global.add.u64 [%0], 1;" :: "l"(bar) : "memory");
    }
}
inline void await(__global ulong *bar, ulong target) {
    if (get_local_id(0) == 0) {
        ulong v;
        int spins = 0;
        do {
            asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(bar) : "memory");
        } while (v < target && ++spins < (1 << 26));
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(bar) : "memory");
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
inline ulong start(__global ulong *bar) {
    ulong v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(bar) : "memory");
    return v - v % get_num_groups(0);
}

#define PART_AT(p, i) (W + ((size_t)(p) * NP + (i)) * (PART / 16))

__kernel __attribute__((reqd_work_group_size(LS, 1, 1)))
void phases_regs(__global const uint4 *W, int NP, int P, __global ulong *bar,
                 __global uint *out) {
    const int lane = get_local_id(0) & 31, w = get_local_id(0) >> 5;
    const int gw = get_group_id(0) * NW + w, step = get_num_groups(0) * NW;
    const int np = gw < NP ? (NP - gw + step - 1) / step : 0;
    ulong target = 0;
    if (get_local_id(0) == 0) target = start(bar);
    uint4 a[STAGES][U];
    uint acc = 0;
#pragma unroll
    for (int s = 0; s < PRE; ++s)
        if (s < np)
#pragma unroll
            for (int u = 0; u < U; ++u) a[s][u] = nc_load(PART_AT(0, gw + s * step) + u * 32 + lane);
    for (int p = 0; p < P; ++p) {
        for (int c = 0; c < np; c += STAGES)
#pragma unroll
            for (int j = 0; j < STAGES; ++j) {
                const int nx = c + j + STAGES - 1, sn = (j + STAGES - 1) % STAGES;
                if (nx < np && nx >= PRE)
#pragma unroll
                    for (int u = 0; u < U; ++u)
                        a[sn][u] = nc_load(PART_AT(p, gw + nx * step) + u * 32 + lane);
                if (c + j < np)
#pragma unroll
                    for (int u = 0; u < U; ++u) acc ^= fold(a[j][u]);
            }
        if (lane == 0) out[get_global_id(0)] = acc;  // (a store, as a phase's results)
        if (BARRIERS) arrive(bar, &target);
        // (the next phase's first parts load while the groups meet)
        if (p + 1 < P)
#pragma unroll
            for (int s = 0; s < PRE; ++s)
                if (s < np)
#pragma unroll
                    for (int u = 0; u < U; ++u)
                        a[s][u] = nc_load(PART_AT(p + 1, gw + s * step) + u * 32 + lane);
        if (BARRIERS) await(bar, target);
    }
    out[get_global_id(0)] = acc;
}

#ifdef S
inline uint smem_addr(__local const void *p) {
    uint r;
    asm volatile("{ .reg .pred q; .reg .u64 s; isspacep.shared q, %1; cvta.to.shared.u64 s, %1;"
                 " selp.u64 s, s, %1, q; cvt.u32.u64 %0, s; }"
                 : "=r"(r) : "l"((ulong)p));
    return r;
}
inline void mbar_init(uint bar, uint count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
inline void mbar_wait(uint bar, uint parity) {
    uint done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared.b64 p, [%1], %2;"
                     " selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// the warp's k-th part (over all phases) into slot k % S (lane 0)
inline void issue(__global const uint4 *W, int NP, int gw, int step, int np, int k, uint rb,
                  uint bb) {
    const int s = k % S, p = k / np, i = k % np;
    asm volatile("{ .reg .b64 st; " HIDE "mbarrier.arrive.expect_tx.shared.b64 st, [%0], %1;"
                 "\n}" :: "r"(bb + 8 * s), "r"(PART) : "memory");
    asm volatile(HIDE "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n"
                 :: "r"(rb + s * PART), "l"((ulong)PART_AT(p, gw + i * step)), "r"(PART),
                    "r"(bb + 8 * s) : "memory");
}

__kernel __attribute__((reqd_work_group_size(LS, 1, 1)))
void phases_tma(__global const uint4 *W, int NP, int P, __global ulong *bar,
                __global uint *out) {
    __local uint4 ring[NW * S * (PART / 16)] __attribute__((aligned(128)));
    __local ulong bars[NW * S];
    const int lane = get_local_id(0) & 31, w = get_local_id(0) >> 5;
    const int gw = get_group_id(0) * NW + w, step = get_num_groups(0) * NW;
    const int np = gw < NP ? (NP - gw + step - 1) / step : 0, total = np * P;
    ulong target = 0;
    if (get_local_id(0) == 0) target = start(bar);
    const uint rb = smem_addr(ring) + w * S * PART, bb = smem_addr(bars) + w * S * 8;
    if (lane == 0)
        for (int s = 0; s < S; ++s) mbar_init(bb + 8 * s, 1);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("bar.warp.sync 0xffffffff;" ::: "memory");
    if (lane == 0)
        for (int k = 0; k < S && k < total; ++k) issue(W, NP, gw, step, np, k, rb, bb);
    uint acc = 0;
    __local const uint4 *mine = ring + w * S * (PART / 16);
    int k = 0;
    for (int p = 0; p < P; ++p) {
        for (int i = 0; i < np; ++i, ++k) {
            const int s = k % S;
            mbar_wait(bb + 8 * s, (k / S) & 1);
#pragma unroll
            for (int u = 0; u < U; ++u) acc ^= fold(mine[s * (PART / 16) + u * 32 + lane]);
            asm volatile("bar.warp.sync 0xffffffff;" ::: "memory");
            if (lane == 0 && k + S < total) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                issue(W, NP, gw, step, np, k + S, rb, bb);
            }
        }
        if (lane == 0) out[get_global_id(0)] = acc;
        if (BARRIERS) {
            arrive(bar, &target);
            await(bar, target);
        }
    }
    out[get_global_id(0)] = acc;
}
#endif
