// The batched engine's int8 rows on NVIDIA's int8 tensor cores: matmul.cl (its QROWS section:
// quantize_rows, the int8 rows' layout, the weight formats) with matmul_qmma after it, so that
// the matmul programs do not change with this kernel. Defines as matmul_qrows' (QROWS 1) with
// QMMA 1, KS, RT and MMA_PTX (below).
#include "clops/matmul.cl"

#if QROWS
#if QMMA
// ---- int8 rows on tensor cores: matmul_qmma ----
// The same product as matmul_qrows from the same int8 rows (quantize_rows), each 32-value block
// of a weight row met by 8 rows at once through mma m16n8k16 (s8 inputs, s32 sums: a block's
// int sum exact, as dp4a's): a warp takes 16 columns and RT tiles of 8 rows, its KS warps
// (the work-group) every KS-th block of the row, and the warps' sums are added in warp order.
// A row's sums are added in one order whatever M and its place in the batch. MMA_PTX 0 (CPUs,
// tests): the instruction emulated through local memory, by its fragment layout.
// Work geometry: global (ceil(N / 16) * 32 * KS, ceil(M / (8 * RT))), local (32 * KS, 1).
#define QM_NBP (((NB + KS - 1) / KS) * KS)  // blocks, padded to a multiple of KS (uniform loops)

#if MMA_PTX
#include "clops/ptx.cl"
// d (row g: columns 2t, 2t + 1; row g + 8 the same) += A . B: A 16 x 16 (a0: row g, k 4t ..
// 4t + 3; a1: row g + 8), B 16 x 8 (b0: k 4t .. 4t + 3 of column g); g = lane / 4, t = lane % 4
inline void mma_s8(int *d, uint a0, uint a1, uint b0, __local uint *sc) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 "
                 "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}
#else
inline void mma_s8(int *d, uint a0, uint a1, uint b0, __local uint *sc) {
    const int lane = get_local_id(0) % 32, g = lane / 4, t = lane % 4;
    sc[lane] = a0;
    sc[32 + lane] = a1;
    sc[64 + lane] = b0;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < 4; ++i) {
        const int r = g + (i >= 2 ? 8 : 0), c = 2 * t + (i & 1);
        int acc = 0;
        for (int k = 0; k < 16; ++k) {
            // A[r][k]: byte k % 4 of a0 (r < 8) or a1 of lane (r % 8) * 4 + k / 4; B[k][c]:
            // byte k % 4 of b0 of lane c * 4 + k / 4
            const uint aw = sc[(r >= 8 ? 32 : 0) + (r % 8) * 4 + k / 4];
            const uint bw = sc[64 + c * 4 + k / 4];
            acc += (int)as_char4(aw >> (8 * (k % 4))).x * (int)as_char4(bw >> (8 * (k % 4))).x;
        }
        d[i] += acc;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

__kernel __attribute__((reqd_work_group_size(32 * KS, 1, 1)))
void matmul_qmma(__global float *y, int y_off, int ldy, __global const uint *xq,
                 __global const float2 *xs, __global const float *ss,
                 __global const W_T *W, __global const SCALE_T *S,
                 __global const float *bias, int M, int N, int K, float eps) {
    __local float red[(KS > 1 ? KS - 1 : 1) * 32 * 4 * RT];
    __local uint sc_all[KS * 96];
    const int lane = get_local_id(0) % 32, warp = get_local_id(0) / 32;
    __local uint *sc = sc_all + warp * 96;
    const int g = lane / 4, t = lane % 4;
    const int n0 = get_group_id(0) * 16, m0 = get_group_id(1) * 8 * RT;
    // the weight rows (columns of y) this lane loads, the batch rows it loads and those it holds
    const int na = min(n0 + g, N - 1), nb = min(n0 + g + 8, N - 1);
    __global const uint *wa = (__global const uint *)W + (size_t)na * (QK / (WFMT == 3 ? 8 : 4));
    __global const uint *wb = (__global const uint *)W + (size_t)nb * (QK / (WFMT == 3 ? 8 : 4));
    int ml[RT], mh[RT][2];
    for (int r = 0; r < RT; ++r) {
        ml[r] = min(m0 + 8 * r + g, M - 1);
        mh[r][0] = min(m0 + 8 * r + 2 * t, M - 1);
        mh[r][1] = min(m0 + 8 * r + 2 * t + 1, M - 1);
    }
    float acc[RT][4];
    for (int r = 0; r < RT; ++r)
        for (int i = 0; i < 4; ++i) acc[r][i] = 0.0f;
    for (int b = warp; b < QM_NBP; b += KS) {
        const int live = b < NB, bb = live ? b : 0;
        uint a0l, a1l, a0h, a1h;
#if WFMT == 3
        // q4: byte j of a block holds value j (low nibble) and j + 16 (high)
        const uint m4 = 0x0F0F0F0Fu, ua = wa[bb * 4 + t], ub = wb[bb * 4 + t];
        a0l = ua & m4; a1l = ub & m4; a0h = (ua >> 4) & m4; a1h = (ub >> 4) & m4;
        const WS_T sa = LOAD_WS(na, bb), sb = LOAD_WS(nb, bb);
#else
        a0l = wa[bb * 8 + t]; a1l = wb[bb * 8 + t];
        a0h = wa[bb * 8 + 4 + t]; a1h = wb[bb * 8 + 4 + t];
#if QGROUP == 16
        const float sal = LOAD_SCALE(S, ((size_t)na * QK + bb * 32) / 16);
        const float sah = LOAD_SCALE(S, ((size_t)na * QK + bb * 32) / 16 + 1);
        const float sbl = LOAD_SCALE(S, ((size_t)nb * QK + bb * 32) / 16);
        const float sbh = LOAD_SCALE(S, ((size_t)nb * QK + bb * 32) / 16 + 1);
#else
        const float sa = LOAD_SCALE(S, ((size_t)na * QK + bb * 32) / QGROUP);
        const float sb = LOAD_SCALE(S, ((size_t)nb * QK + bb * 32) / QGROUP);
#endif
#endif
        if (!live) a0l = a1l = a0h = a1h = 0u;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            // the 32 int8 values of batch row ml[r]'s block: q4 rows in two planes (values
            // 0..15 of every block, then 16..31), q8 rows in order
            __global const uint *xr = xq + (size_t)ml[r] * (QK / 4);
#if WFMT == 3
            const uint bl = xr[bb * 4 + t], bh = xr[(NB + bb) * 4 + t];
#else
            const uint bl = xr[bb * 8 + t], bh = xr[bb * 8 + 4 + t];
#endif
#if WFMT == 4 && QGROUP == 16
            int dl[4] = {0, 0, 0, 0}, dh[4] = {0, 0, 0, 0};
            mma_s8(dl, a0l, a1l, bl, sc);
            mma_s8(dh, a0h, a1h, bh, sc);
#else
            int d[4] = {0, 0, 0, 0};
            mma_s8(d, a0l, a1l, bl, sc);
            mma_s8(d, a0h, a1h, bh, sc);
#endif
            if (!live) continue;
            const float2 x0 = xs[(size_t)mh[r][0] * NB + bb];
            const float2 x1 = xs[(size_t)mh[r][1] * NB + bb];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 xd = (i & 1) ? x1 : x0;
#if WFMT == 3
                const WS_T w = i < 2 ? sa : sb;
                acc[r][i] = fma(w.x * xd.x, (float)d[i], fma(w.y, xd.y, acc[r][i]));
#elif QGROUP == 16
                const float wl = i < 2 ? sal : sbl, wh = i < 2 ? sah : sbh;
                acc[r][i] = fma(wh * xd.x, (float)dh[i],
                                fma(wl * xd.x, (float)dl[i], acc[r][i]));
#else
                const float w = i < 2 ? sa : sb;
                acc[r][i] = fma(w * xd.x, (float)d[i], acc[r][i]);
#endif
            }
        }
    }
#if KS > 1
    if (warp > 0)
        for (int r = 0; r < RT; ++r)
            for (int i = 0; i < 4; ++i)
                red[(((warp - 1) * RT + r) * 4 + i) * 32 + lane] = acc[r][i];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (warp > 0) return;
    for (int w = 1; w < KS; ++w)
        for (int r = 0; r < RT; ++r)
            for (int i = 0; i < 4; ++i)
                acc[r][i] += red[(((w - 1) * RT + r) * 4 + i) * 32 + lane];
#endif
    for (int r = 0; r < RT; ++r)
        for (int i = 0; i < 4; ++i) {
            const int n = n0 + g + (i >= 2 ? 8 : 0), m = m0 + 8 * r + 2 * t + (i & 1);
            if (n >= N || m >= M) continue;
            float v = acc[r][i];
#if XMODE == 1
            v *= rsqrt(ss[m] / K + eps);
#endif
#if HAS_BIAS
            v += bias[n];
#endif
            __global float *yp = y + y_off + (size_t)m * ldy + n;
#if ACCUM
            *yp += v;
#else
            *yp = v;
#endif
        }
}
#endif
#endif
