// A mixture of experts' grouped products of many rows (a prompt's) on NVIDIA's tensor cores:
// matmul.cl (its weight formats: load_group) with matmul_xmma after it, so that the matmul
// programs do not change with this kernel. Defines as matmul's with EXPERTS 1, XMMA 1, XG, KP
// and MMA_PTX (below).
#include "clops/matmul.cl"

#if XMMA
#if QX || QROWS || !EXPERTS || XMODE == 1
#error "matmul_xmma takes EXPERTS, and neither QX, QROWS nor XMODE 1"
#endif
// ---- experts' rows on tensor cores: matmul_xmma ----
// y[s, n] = sum_k a[s, k] W_e[n, k] (+ bias_e[n]) for the M rows s of moe.align's slots, each
// tile of XT rows meeting the weights of its expert e (tile_e, experts.cl). A work-group of 4
// warps takes a tile's XT rows and XN weight rows (columns of y), XK values of k a step: the
// rows and the weights are rounded to float16 into local memory (the weights as load_group
// dequantizes them, as dequant_half makes the dense prompt's), and mma.sync m16n8k16 (float32
// sums) meets them, each warp 32 of the columns. A row's sums are added in one order whatever
// its place: steps of XK in order, each step's products in the instruction's.
//   XG 1: row s is row order[s] / KP of x (the gathered rows: moe.gather folded in); 0: row s
//         of x. Slots with order[s] < 0 (padding) read zeros.
//   XMODE 2: act(x[s, k]) * x[s, K + k] (the GLU of [gate | up] rows, ldx >= 2K) in place of x.
// align puts an expert's pairs before its padding, so a tile whose slot 16 is padding holds
// rows in its first 16 slots alone: it skips the second half's instructions (and stores zeros
// there). MMA_PTX 0 (CPUs, tests): the instruction emulated through local memory, by its
// fragment layout.
// Arguments: y, y_off, ldy, x, x_off, ldx, W, S, bias, M (a multiple of XT), N, K, order, then
// EXPERT_ARGS. Work geometry: global (ceil(N / XN) * 128, M / XT), local (128, 1).
#ifndef XG
#define XG 0
#endif
#ifndef KP
#define KP 1
#endif
#define XT 32        // rows of a tile (moe.align's tile)
#define XN 128       // weight rows (columns of y) a work-group: one a work-item
#define XK 32        // values of k a step: one 32-value group of a weight row
#define XR (XK + 8)  // halves a row of local memory: 80 bytes, so fragment reads hit all banks

#if MMA_PTX
#include "clops/ptx.cl"  // mma16816, half2_bits
#define XH2(a, b) half2_bits((a), (b))
#define XMMA_OP(d, a, b0, b1) mma16816((d), (a), (b0), (b1))
#else
// a and b rounded to float16 (to nearest, as cvt.rn), packed (a in the low half)
inline uint xh2(float a, float b) {
    ushort2 h;
    vstore_half2_rte((float2)(a, b), 0, (__private half *)&h);
    return as_uint(h);
}
#define XH2(a, b) xh2((a), (b))
// mma16816's d += A B through the warp's 192 words of local memory sc: A[r][k] is half k % 2 of
// a[(r >= 8) + 2 (k >= 8)] of lane (r % 8) * 4 + (k % 8) / 2; B[k][c] half k % 2 of b0
// (k < 8) or b1 of lane c * 4 + (k % 8) / 2
inline void xmma_emulated(float *d, const uint *a, uint b0, uint b1, __local uint *sc) {
    const int lane = get_local_id(0) % 32, g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) sc[32 * i + lane] = a[i];
    sc[128 + lane] = b0;
    sc[160 + lane] = b1;
    barrier(CLK_LOCAL_MEM_FENCE);
    __local const half *h = (__local const half *)sc;
    for (int i = 0; i < 4; ++i) {
        const int r = g + (i >= 2 ? 8 : 0), c = 2 * t + (i & 1);
        float acc = 0.0f;
        for (int k = 0; k < 16; ++k) {
            const int wa = 32 * ((r >= 8) + 2 * (k >= 8)) + (r % 8) * 4 + (k % 8) / 2;
            const int wb = 128 + 32 * (k >= 8) + c * 4 + (k % 8) / 2;
            acc += vload_half(2 * wa + k % 2, h) * vload_half(2 * wb + k % 2, h);
        }
        d[i] += acc;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#define XMMA_OP(d, a, b0, b1) xmma_emulated((d), (a), (b0), (b1), sc)
#endif

// The A fragment of mma16816 from a local [row][k] tile (rows XR halves apart), p at row g and
// k-pair 2t of the fragment: rows g and g + 8, k-pairs 2t and 2t + 8.
inline void xfrag_a(uint *a, __local const ushort *p) {
    a[0] = *(__local const uint *)p;
    a[1] = *(__local const uint *)(p + 8 * XR);
    a[2] = *(__local const uint *)(p + 8);
    a[3] = *(__local const uint *)(p + 8 * XR + 8);
}

inline uint4 xh8(float4 a, float4 b) {
    return (uint4)(XH2(a.x, a.y), XH2(a.z, a.w), XH2(b.x, b.y), XH2(b.z, b.w));
}

__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void matmul_xmma(__global float *y, int y_off, int ldy, __global const float *x, int x_off,
                 int ldx, __global const W_T *W, __global const SCALE_T *S,
                 __global const float *bias, int M, int N, int K, __global const int *order
                 EXPERT_ARGS) {
    __local ushort As[XT * XR] __attribute__((aligned(16)));  // As[s][k]
    __local ushort Bs[XN * XR] __attribute__((aligned(16)));  // Bs[n][k]
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = get_group_id(1) * XT, n0 = get_group_id(0) * XN;
#if !MMA_PTX
    __local uint sc_all[4 * 192];
    __local uint *sc = sc_all + warp * 192;
#endif
    TAKE_EXPERT(get_group_id(1));
    const int upper = order[m0 + 16] >= 0;  // (tile-uniform) slots 16 .. 31 hold rows
    // this work-item's 8 values of a row of the tile a step (row tid / 4, k (tid % 4) * 8 ..),
    // and its weight row (one 32-value group a step)
    const int ar = tid >> 2, ac = (tid & 3) * 8;
    const int slot = order[m0 + ar];
    const int live = slot >= 0;
#if XG
    __global const float *xr = x + x_off + (size_t)(live ? slot / KP : 0) * ldx + ac;
#else
    __global const float *xr = x + x_off + (size_t)(m0 + ar) * ldx + ac;
#endif
    const int nb = min(n0 + tid, N - 1);
    float4 xa0 = (float4)(0.0f), xa1 = (float4)(0.0f), wv[8];
#if XMODE == 2
#define XLOAD(k0) do { if (live) { \
        xa0 = glu_act4(vload4(0, xr + (k0))) * vload4(0, xr + K + (k0)); \
        xa1 = glu_act4(vload4(1, xr + (k0))) * vload4(1, xr + K + (k0)); } } while (0)
#else
#define XLOAD(k0) do { if (live) { xa0 = vload4(0, xr + (k0)); xa1 = vload4(1, xr + (k0)); } \
    } while (0)
#endif
    XLOAD(0);
    load_group(W, S, K, nb, 0, wv);
    float acc[2][4][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j)
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += XK) {
        *(__local uint4 *)&As[ar * XR + ac] = xh8(xa0, xa1);
        __local uint4 *bp = (__local uint4 *)&Bs[tid * XR];
#pragma unroll
        for (int j = 0; j < 4; ++j) bp[j] = xh8(wv[2 * j], wv[2 * j + 1]);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + XK < K) {  // the next step's loads, in flight during this step's arithmetic
            XLOAD(k0 + XK);
            load_group(W, S, K, nb, (k0 + XK) / 32, wv);
        }
#pragma unroll
        for (int kk = 0; kk < XK; kk += 16) {
            uint a[2][4], b[4][2];
            xfrag_a(a[0], As + g * XR + kk + 2 * t);
            xfrag_a(a[1], As + (16 + g) * XR + kk + 2 * t);
#pragma unroll
            for (int j = 0; j < 4; ++j) {  // k-pairs 2t and 2t + 8 of weight row j * 8 + g
                __local const ushort *r = &Bs[(warp * 32 + j * 8 + g) * XR + kk + 2 * t];
                b[j][0] = *(__local const uint *)r;
                b[j][1] = *(__local const uint *)(r + 8);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) XMMA_OP(acc[0][j], a[0], b[j][0], b[j][1]);
            if (upper) {
#pragma unroll
                for (int j = 0; j < 4; ++j) XMMA_OP(acc[1][j], a[1], b[j][0], b[j][1]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int col = n0 + warp * 32 + j * 8 + 2 * t;  // (N is even: col + 1 < N too)
        if (col >= N) continue;
#if HAS_BIAS
        const float2 bv = vload2(0, bias + col);
#else
        const float2 bv = (float2)(0.0f);
#endif
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + 16 * i + 8 * h + g;
                vstore2((float2)(acc[i][j][2 * h], acc[i][j][2 * h + 1]) + bv, 0,
                        y + y_off + (size_t)row * ldy + col);
            }
    }
}
#endif
