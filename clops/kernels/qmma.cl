// The batched engine's int8 rows on NVIDIA's int8 tensor cores: matmul.cl (its QROWS section:
// quantize_rows, the int8 rows' layout, the weight formats) with matmul_qmma after it, so that
// the matmul programs do not change with this kernel. Defines as matmul_qrows' (QROWS 1) with
// QMMA 1, KS, RT and MMA_PTX (below).
#include "clops/matmul.cl"

#if QROWS
#if QMMA
#if WFMT == 5
#error "matmul_qmma reads q4 and q8 weights, not the compact K-quants"
#endif
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
    // A block's operands are loaded one round ahead (QM_LOAD into nxt while cur is summed), so
    // that a warp has two blocks' loads in flight. Where a block has one scale (QM_PAIR), a lane
    // takes k-slots 4t..4t+3 of both mma from words 2t and 2t + 1 of the block (one 8-byte load
    // a row, the batch rows' words the same): the int sum over the block is the same whatever
    // k's order, as long as A and B take the same one.
#if WFMT != 3 && QGROUP != 16
#define QM_PAIR 1
#else
#define QM_PAIR 0
#endif
    uint c_a0l, c_a1l, c_a0h, c_a1h, n_a0l, n_a1l, n_a0h, n_a1h;
    uint c_bl[RT], c_bh[RT], n_bl[RT], n_bh[RT];
    float2 c_x0[RT], c_x1[RT], n_x0[RT], n_x1[RT];
#if WFMT == 3
    WS_T c_sa, c_sb, n_sa, n_sb;
#elif QGROUP == 16
    float c_sal, c_sah, c_sbl, c_sbh, n_sal, n_sah, n_sbl, n_sbh;
#else
    float c_sa, c_sb, n_sa, n_sb;
#endif
#if WFMT == 3
    // q4: byte j of a block holds value j (low nibble) and j + 16 (high); the batch rows in two
    // planes (values 0..15 of every block, then 16..31)
#define QM_LOAD_W(bb) do { \
        const uint m4 = 0x0F0F0F0Fu, ua = wa[(bb) * 4 + t], ub = wb[(bb) * 4 + t]; \
        n_a0l = ua & m4; n_a1l = ub & m4; n_a0h = (ua >> 4) & m4; n_a1h = (ub >> 4) & m4; \
        n_sa = LOAD_WS(na, bb); n_sb = LOAD_WS(nb, bb); } while (0)
#define QM_LOAD_X(r, xr, bb) do { \
        n_bl[r] = xr[(bb) * 4 + t]; n_bh[r] = xr[(NB + (bb)) * 4 + t]; } while (0)
#elif QM_PAIR
#define QM_LOAD_W(bb) do { \
        const uint2 ua = *(__global const uint2 *)(wa + (bb) * 8 + 2 * t); \
        const uint2 ub = *(__global const uint2 *)(wb + (bb) * 8 + 2 * t); \
        n_a0l = ua.x; n_a0h = ua.y; n_a1l = ub.x; n_a1h = ub.y; \
        n_sa = LOAD_SCALE(S, ((size_t)na * QK + (bb) * 32) / QGROUP); \
        n_sb = LOAD_SCALE(S, ((size_t)nb * QK + (bb) * 32) / QGROUP); } while (0)
#define QM_LOAD_X(r, xr, bb) do { \
        const uint2 ux = *(__global const uint2 *)(xr + (bb) * 8 + 2 * t); \
        n_bl[r] = ux.x; n_bh[r] = ux.y; } while (0)
#else
    // scales per 16 values: the first mma takes values 0..15 of the block, the second 16..31
#define QM_LOAD_W(bb) do { \
        n_a0l = wa[(bb) * 8 + t]; n_a1l = wb[(bb) * 8 + t]; \
        n_a0h = wa[(bb) * 8 + 4 + t]; n_a1h = wb[(bb) * 8 + 4 + t]; \
        n_sal = LOAD_SCALE(S, ((size_t)na * QK + (bb) * 32) / 16); \
        n_sah = LOAD_SCALE(S, ((size_t)na * QK + (bb) * 32) / 16 + 1); \
        n_sbl = LOAD_SCALE(S, ((size_t)nb * QK + (bb) * 32) / 16); \
        n_sbh = LOAD_SCALE(S, ((size_t)nb * QK + (bb) * 32) / 16 + 1); } while (0)
#define QM_LOAD_X(r, xr, bb) do { \
        n_bl[r] = xr[(bb) * 8 + t]; n_bh[r] = xr[(bb) * 8 + 4 + t]; } while (0)
#endif
#define QM_LOAD(b) do { \
        const int bb_ = (b) < NB ? (b) : 0; \
        QM_LOAD_W(bb_); \
        _Pragma("unroll") for (int r = 0; r < RT; ++r) { \
            __global const uint *xr = xq + (size_t)ml[r] * (QK / 4); \
            QM_LOAD_X(r, xr, bb_); \
            n_x0[r] = xs[(size_t)mh[r][0] * NB + bb_]; \
            n_x1[r] = xs[(size_t)mh[r][1] * NB + bb_]; \
        } } while (0)
    QM_LOAD(warp);
    for (int b = warp; b < QM_NBP; b += KS) {
        const int live = b < NB;
        c_a0l = live ? n_a0l : 0u; c_a1l = live ? n_a1l : 0u;
        c_a0h = live ? n_a0h : 0u; c_a1h = live ? n_a1h : 0u;
#if WFMT == 3 || QGROUP != 16
        c_sa = n_sa; c_sb = n_sb;
#else
        c_sal = n_sal; c_sah = n_sah; c_sbl = n_sbl; c_sbh = n_sbh;
#endif
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            c_bl[r] = n_bl[r]; c_bh[r] = n_bh[r]; c_x0[r] = n_x0[r]; c_x1[r] = n_x1[r];
        }
        QM_LOAD(b + KS);  // the next round's block (block 0 again past the end: unused)
#pragma unroll
        for (int r = 0; r < RT; ++r) {
#if WFMT == 4 && QGROUP == 16
            int dl[4] = {0, 0, 0, 0}, dh[4] = {0, 0, 0, 0};
            mma_s8(dl, c_a0l, c_a1l, c_bl[r], sc);
            mma_s8(dh, c_a0h, c_a1h, c_bh[r], sc);
#else
            int d[4] = {0, 0, 0, 0};
            mma_s8(d, c_a0l, c_a1l, c_bl[r], sc);
            mma_s8(d, c_a0h, c_a1h, c_bh[r], sc);
#endif
            if (!live) continue;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 xd = (i & 1) ? c_x1[r] : c_x0[r];
#if WFMT == 3
                const WS_T w = i < 2 ? c_sa : c_sb;
                acc[r][i] = fma(w.x * xd.x, (float)d[i], fma(w.y, xd.y, acc[r][i]));
#elif QGROUP == 16
                const float wl = i < 2 ? c_sal : c_sbl, wh = i < 2 ? c_sah : c_sbh;
                acc[r][i] = fma(wh * xd.x, (float)dh[i],
                                fma(wl * xd.x, (float)dl[i], acc[r][i]));
#else
                const float w = i < 2 ? c_sa : c_sb;
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
