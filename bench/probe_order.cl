// bench/probe_order.py's kernel (NVIDIA, PTX; sm_90a by the script's PTX patch): does a load of
// a line held in L2 wait behind the loads a multiprocessor has in flight? Every work-group (one a
// multiprocessor) issues N 16-byte pieces of cold W a work-item (MODE 1: ld.global.nc, 2:
// cp.async into local memory, 3: one cp.async.bulk a warp, 4: prefetch.global.L2, 0: none),
// then work-item 0 reads its line of `hot` (HOT 0: ld.relaxed.gpu, 1: atom.add 0, 2: a 16-byte
// cp.async.bulk copy) and times it. out[3 g ..]: the hot read's clocks, the work-item's own
// first cold piece's (MODE 1), all of the group's.
#define NW (LS / 32)
#ifndef HIDE
#define HIDE "//@@"  // (sm_90a's instructions, uncommented in the PTX by the script)
#endif

inline ulong clk(void) {
    ulong c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) :: "memory");
    return c;
}
// (a value stored to local memory: its load has come back before the clock after it is read)
inline void sink(uint v, uint a) {
    asm volatile("st.volatile.shared.u32 [%0], %1;" :: "r"(a), "r"(v) : "memory");
}
inline uint smem_addr(__local const void *p) {
    uint r;
    asm volatile("{ .reg .pred q; .reg .u64 s; isspacep.shared q, %1; cvta.to.shared.u64 s, %1;"
                 " selp.u64 s, s, %1, q; cvt.u32.u64 %0, s; }"
                 : "=r"(r) : "l"((ulong)p));
    return r;
}
inline void bulk(uint dst, __global const void *src, uint bytes, uint mbar) {
    asm volatile("{ .reg .b64 st; " HIDE "mbarrier.arrive.expect_tx.shared.b64 st, [%0], %1;\n}"
                 :: "r"(mbar), "r"(bytes) : "memory");
    asm volatile(HIDE "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n"
                 :: "r"(dst), "l"((ulong)src), "r"(bytes), "r"(mbar) : "memory");
}
inline void bulk_wait(uint mbar) {
    uint done = 0;
    do {
        asm volatile("{ .reg .pred p; " HIDE "mbarrier.test_wait.parity.shared.b64 p, [%1], 0;\n"
                     " selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(mbar) : "memory");
    } while (!done);
}

__kernel __attribute__((reqd_work_group_size(LS, 1, 1)))
void probe(__global const uint4 *W, __global uint *hot, __global ulong *out, int base) {
    __local uint4 sm[LS * N] __attribute__((aligned(128)));
    __local uint hb[4] __attribute__((aligned(16)));
    __local ulong mb[NW + 1];
    __local uint sunk[2];
    const int t = get_local_id(0), lane = t & 31, w = t >> 5, g = get_group_id(0);
    __global const uint4 *my = W + (size_t)base + (size_t)g * LS * N;
    const uint sb = smem_addr(sm), bb = smem_addr(mb), hbar = bb + 8 * NW;
    uint4 a[N];
    uint acc = 0;
    if (lane == 0) asm volatile(HIDE "mbarrier.init.shared.b64 [%0], 1;\n" :: "r"(bb + 8 * w) : "memory");
    if (t == 0) asm volatile(HIDE "mbarrier.init.shared.b64 [%0], 1;\n" :: "r"(hbar) : "memory");
    asm volatile(HIDE "fence.proxy.async.shared::cta;\n" ::: "memory");
    barrier(CLK_LOCAL_MEM_FENCE);
    const ulong t0 = clk();
#pragma unroll
    for (int i = 0; i < N; ++i) {
        __global const uint4 *p = my + i * LS + t;
        if (MODE == 1)
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(a[i].x), "=r"(a[i].y), "=r"(a[i].z), "=r"(a[i].w) : "l"(p));
        else if (MODE == 2)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                         :: "r"(sb + 16 * (i * LS + t)), "l"((ulong)p) : "memory");
        else if (MODE == 4)
            asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
    }
    if (MODE == 2) asm volatile("cp.async.commit_group;" ::: "memory");
    if (MODE == 3 && lane == 0) bulk(sb + w * 512 * N, my + w * 32 * N, 512 * N, bb + 8 * w);
    barrier(CLK_LOCAL_MEM_FENCE);  // (every warp's loads issued)
    ulong th = 0, tc = 0;
    if (t == 0) {
        const ulong t1 = clk();
        __global uint *hp = hot + 64 * g;
        uint v;
        if (HOT == 0) {
            asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(hp) : "memory");
        } else if (HOT == 1) {
            asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 0;"
                         : "=r"(v) : "l"(hp) : "memory");
        } else {
            bulk(smem_addr(hb), hp, 16, hbar);
            bulk_wait(hbar);
            v = hb[0];
        }
        sink(v, smem_addr(sunk));
        th = clk() - t1;
        if (MODE == 1) {
            sink(a[0].x, smem_addr(sunk) + 4);
            tc = clk() - t0;
        }
    }
    if (MODE == 1)
#pragma unroll
        for (int i = 0; i < N; ++i) acc ^= a[i].x ^ a[i].y ^ a[i].z ^ a[i].w;
    if (MODE == 2) asm volatile("cp.async.wait_all;" ::: "memory");
    if (MODE == 3) bulk_wait(bb + 8 * w);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (MODE == 2 || MODE == 3) acc ^= sm[t].x;
    const ulong tall = clk() - t0;
    if (t == 0) {
        out[3 * g] = th;
        out[3 * g + 1] = tc;
        out[3 * g + 2] = tall;
    }
    if (acc == 0x12345u) hot[1] = acc;  // (keeps the loads)
}
