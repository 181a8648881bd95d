// A mixture of experts' grouped products of many rows (a prompt's) on NVIDIA's tensor cores:
// matmul.cl (its weight formats: load_group) with matmul_xmma after it, so that the matmul
// programs do not change with this kernel. Defines as matmul's with EXPERTS 1, XMMA 1, XG, KP,
// XH, XGLU and MMA_PTX (below).
#include "clops/matmul.cl"

#if XMMA
#if QX || QROWS || !EXPERTS || XMODE == 1
#error "matmul_xmma takes EXPERTS, and neither QX, QROWS nor XMODE 1"
#endif
// ---- experts' rows on tensor cores: matmul_xmma ----
// y[s, n] = sum_k a[s, k] W_e[n, k] (+ bias_e[n]) for the M rows s of moe.align's slots, each
// tile of XT rows meeting the weights of its expert e (tile_e, experts.cl). A work-group of 8
// warps takes a tile's XT rows and XN weight rows (columns of y), XK values of k a step: the
// rows and the weights are rounded to float16 into local memory (the weights dequantized on
// the way to the values dequant_half makes for the dense prompt's products), and mma.sync
// m16n8k16 (float32 sums) meets them, each warp 32 rows by 32 columns. Two buffers of local
// memory: a step's loads are in flight while the step before is summed. A row's sums are added
// in one order whatever its place: steps of XK in order, each step's products in the
// instruction's.
//   XG 1: row s is row order[s] / KP of x (the gathered rows: moe.gather folded in); 0: row s
//         of x. Slots with order[s] < 0 (padding) read zeros.
//   XMODE 2: act(x[s, k]) * x[s, K + k] (the GLU of [gate | up] rows, ldx >= 2K) in place of x.
//   XH 1: x holds float16 rows (x_off, ldx in halves, 16-byte aligned), read as they are.
//   XGLU 1: W_e holds [gate | up] rows (N = 2F) and y gets the float16 rows act(gate) * up
//           [M][F] (y_off, ldy in halves): a work-group takes 64 gate rows and the 64 up rows
//           F after them, interleaved in local memory, so that each accumulator pair is a gate
//           and its up (bias: bias_e's gate and up values). GLU_LIMIT, GLU_ALPHA (float
//           literals): gpt-oss's clamped GLU in place of act (activation.cl's glu_clamp).
// align puts an expert's pairs before its padding, so where slot 16 i of a tile is padding, so
// is every slot after it: a warp skips the instructions of its 16-row halves that hold no row
// (and stores zeros there). MMA_PTX 0 (CPUs, tests): the instruction emulated through local
// memory, by its fragment layout.
// Arguments: y, y_off, ldy, x, x_off, ldx, W, S, bias, M (a multiple of XT), N, K, order, then
// EXPERT_ARGS. Work geometry: global (ceil(N / XN) * 256, M / XT), local (256, 1).
#ifndef XG
#define XG 0
#endif
#ifndef KP
#define KP 1
#endif
#ifndef XH
#define XH 0
#endif
#ifndef XGLU
#define XGLU 0
#endif
#ifndef XMMA_M4  // (bench A/B: 0 takes MXFP4 by XQ 4)
#define XMMA_M4 1
#endif
#if XH && XMODE
#error "XH does not take XMODE"
#endif
#define XT 64        // rows of a tile (moe.align's tile)
#define XN 128       // weight rows (columns of y) a work-group: two work-items a row
#define XK 32        // values of k a step: one 32-value group of a weight row
#define XR (XK + 8)  // halves a row of local memory: 80 bytes, so fragment reads hit all banks

// The weights' way into local memory: XQ 1, Q4_0 (half scales, the min -8 scales): a
// work-item's 8 bytes of a group, values j and j + 16 of its 8 j; XQ 2, Q8_0 (half scales):
// its 16 bytes; XQ 4, the compact K-quants, IQ4_XS and MXFP4 (WFMT 5): a work-item its half of
// the group (low or high nibbles) as load_group makes them, the other half not computed; XQ 5,
// MXFP4 (WFMT 5, KQT 2): its half of the group's 4-bit values straight to float16 (their
// table's float16 bits by byte permutes, times the group's power of two in float16); XQ 0,
// any other format, by load_group (each work-item of a row's two the whole group, its half
// kept). XQ 1 and 2 make (q - 8) d and q d rounded once to float16, XQ 5 table[q] 2^p, as
// load_group's float values rounded to float16 are.
#if WFMT == 3 && Q4_SYM && SCALE_HALF
#define XQ 1
#elif WFMT == 4 && QGROUP == 32 && !QMIN && SCALE_HALF
#define XQ 2
#elif WFMT == 5 && KQT == 2 && XMMA_M4
#define XQ 5
#elif WFMT == 5
#define XQ 4
#else
#define XQ 0
#endif

#if MMA_PTX
#include "clops/ptx.cl"  // mma16816, half2_bits
#define XH2(a, b) half2_bits((a), (b))
#define XMMA_OP(d, a, b0, b1) mma16816((d), (a), (b0), (b1))
// bytes 2p and 2p + 1 of w (p 0, 1) as integers o + byte in float16, packed: (0x64 << 8 | byte)
// is 1024 + byte
inline uint xbytes_h2(uint w, int p) {
    uint r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"(p ? 0x4342 : 0x4140));
    return r | 0x64006400u;
}
// (h - o) * d of two float16 (o, d as float16 pairs' bits): the subtraction exact (integers
// under 2048), the product rounded once
inline uint xsub_mul(uint h, uint o, uint d) {
    uint r;
    asm("{sub.rn.f16x2 %0, %1, %2;\n\tmul.rn.f16x2 %0, %0, %3;}"
        : "=&r"(r) : "r"(h), "r"(o), "r"(d));
    return r;
}
// four values (bytes of w, less off) times the float16 scale bits d: two float16 pairs
#define XQ4(w, o, d) (uint2)(xsub_mul(xbytes_h2((w), 0), (o), (d)), \
                             xsub_mul(xbytes_h2((w), 1), (o), (d)))
#if XQ == 5
// MXFP4's doubled E2M1 values (nn/quant.py E2M1_DOUBLED, +0 for its -0) in float16 are 0xHH00:
// their high bytes, 4 a word in the table's order
#define XM4_T0 0x42403C00u
#define XM4_T1 0x4A484644u
#define XM4_T2 0xC2C0BC00u
#define XM4_T3 0xCAC8C6C4u
// float16 bits of 2^q, q in [-24, 15] (subnormal under -14), twice
inline uint xpow2_h2(int q) {
    return (q >= -14 ? (uint)(q + 15) << 10 : 1u << (q + 24)) * 0x10001u;
}
// a group's scale 2^(e - 128) as two float16 powers of two s1 s2 (each in float16's range, s2
// 1 but where 2^(e - 128) is not): table[q] s1 is exact (q's values have two significant bits
// at most), and times s2 rounded once, as the float product rounded to float16 is
#define XM4_SCALES(e) \
    const int p_ = (int)(e) - 128, p1_ = clamp(p_, -24, 15); \
    const uint s1_ = xpow2_h2(p1_), s2_ = xpow2_h2(clamp(p_ - p1_, -24, 15))
// the 4 values of nibbles s (bits 0..15) as two float16 pairs: the table's bytes picked as
// iq4_4 picks them (bit 3 of a nibble chooses the half of the table), spread to the high byte
// of each half, then scaled
inline uint2 xm4_h4(uint s, uint s1, uint s2) {
    uint a, b, t, lo, hi;
    const uint sel = s & 0x7777u, pick = 0x3210u | ((s & 0x8888u) >> 1);
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(a) : "r"(XM4_T0), "r"(XM4_T1), "r"(sel));
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(b) : "r"(XM4_T2), "r"(XM4_T3), "r"(sel));
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(t) : "r"(a), "r"(b), "r"(pick));
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(lo) : "r"(t), "r"(0x1404));
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(hi) : "r"(t), "r"(0x3424));
    asm("{mul.rn.f16x2 %0, %0, %2;\n\tmul.rn.f16x2 %0, %0, %3;\n\t"
        "mul.rn.f16x2 %1, %1, %2;\n\tmul.rn.f16x2 %1, %1, %3;}"
        : "+r"(lo), "+r"(hi) : "r"(s1), "r"(s2));
    return (uint2)(lo, hi);
}
#define XM4(s) xm4_h4((s), s1_, s2_)
#endif
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
// (the same values as the instructions above: (byte - o) d rounded once to float16)
inline uint xq2(uint w, int b, float o, float d) {
    return xh2(((float)((w >> (8 * b)) & 0xFFu) - o) * d,
               ((float)((w >> (8 * b + 8)) & 0xFFu) - o) * d);
}
#define XQ4(w, o, d) (uint2)(xq2((w), 0, (o), (d)), xq2((w), 2, (o), (d)))
#if XQ == 5
// (the same values as the instructions above: table[q] 2^(e - 128) rounded once to float16)
__constant float XM4_TABLE[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
#define XM4_SCALES(e) const float s_ = as_float(((uint)(e) - 1u) << 23)
inline uint2 xm4_h4(uint s, float sc) {
    return (uint2)(xh2(XM4_TABLE[s & 15u] * sc, XM4_TABLE[(s >> 4) & 15u] * sc),
                   xh2(XM4_TABLE[(s >> 8) & 15u] * sc, XM4_TABLE[(s >> 12) & 15u] * sc));
}
#define XM4(s) xm4_h4((s), s_)
#endif
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

__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void matmul_xmma(__global float *y, int y_off, int ldy, __global const float *x, int x_off,
                 int ldx, __global const W_T *W, __global const SCALE_T *S,
                 __global const float *bias, int M, int N, int K, __global const int *order
                 EXPERT_ARGS) {
    __local ushort As[2][XT * XR] __attribute__((aligned(16)));  // As[buffer][s][k]
    __local ushort Bs[2][XN * XR] __attribute__((aligned(16)));  // Bs[buffer][n][k]
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 2) * 32, wn = (warp & 3) * 32;  // the warp's rows and columns
    const int m0 = get_group_id(1) * XT, n0 = get_group_id(0) * XN;
#if !MMA_PTX
    __local uint sc_all[8 * 192];
    __local uint *sc = sc_all + warp * 192;
#endif
    TAKE_EXPERT(get_group_id(1));
    // (warp-uniform) the warp's 16-row halves that hold rows (emulated: every half, so that
    // the emulation's barriers meet; a padding row's zeros add nothing)
#if MMA_PTX
    const int live0 = order[m0 + wm] >= 0, live1 = order[m0 + wm + 16] >= 0;
#else
    const int live0 = 1, live1 = 1;
#endif
    // this work-item's 8 values of a row of the tile a step (row tid / 4, k (tid % 4) * 8 ..)
    const int ar = tid >> 2, ac = (tid & 3) * 8;
    const int slot = order[m0 + ar];
    const int live = slot >= 0;
    const size_t xrow = XG ? (live ? slot / KP : 0) : m0 + ar;  // (its row of x)
#if XH
    __global const uint4 *xr =
        (__global const uint4 *)((__global const ushort *)x + x_off + xrow * ldx + ac);
    uint4 xa = (uint4)(0u);
#define XLOAD(k0) do { if (live) xa = xr[(k0) / 8]; } while (0)
#define XA_STORE(b) (*(__local uint4 *)&As[b][ar * XR + ac] = xa)
#else
    __global const float *xr = x + x_off + xrow * ldx + ac;
    float4 xa0 = (float4)(0.0f), xa1 = (float4)(0.0f);
#if XMODE == 2
#define XLOAD(k0) do { if (live) { \
        xa0 = glu_act4(vload4(0, xr + (k0))) * vload4(0, xr + K + (k0)); \
        xa1 = glu_act4(vload4(1, xr + (k0))) * vload4(1, xr + K + (k0)); } } while (0)
#else
#define XLOAD(k0) do { if (live) { xa0 = vload4(0, xr + (k0)); xa1 = vload4(1, xr + (k0)); } \
    } while (0)
#endif
#define XA_STORE(b) (*(__local uint4 *)&As[b][ar * XR + ac] = xh8(xa0, xa1))
#endif
    // and its half of a weight row's group a step (row tid / 2, half tid % 2)
    const int br = tid >> 1, bh = tid & 1;
#if XGLU
    // local row 2 i: gate row j0 + i; 2 i + 1: up row F + j0 + i
    const int F = N / 2, j0 = get_group_id(0) * (XN / 2);
    const int nb = (br & 1) * F + min(j0 + br / 2, F - 1);
#else
    const int nb = min(n0 + br, N - 1);
#endif
#if XQ == 4
    // (the group read in place; the values of its own half of them, selected, not branched)
    float16 wh;
#define WLOAD(gi) do { \
        const uint8 r_ = kq_load(W, K, nb, (gi)); \
        uint4 lo_, hi_; \
        kq_words(r_, &lo_, &hi_); \
        const float4 sc_ = kq_scales(r_); \
        wh = kq_values16(bh ? hi_ : lo_, bh ? sc_.z : sc_.x, bh ? sc_.w : sc_.y); } while (0)
#elif XQ == 5
    // (the group's 16 bytes of values, its half picked as they are stored, and its exponent)
    __global const uchar *wrow = W + (size_t)nb * KQ_ROW(K);
    uint4 wr;
    uint we;
#define WLOAD(gi) do { wr = ((__global const uint4 *)wrow)[gi]; \
        we = wrow[KQ_SOFF(K) + 2 * (gi)]; } while (0)
#elif XQ
    // (its 8 or 16 bytes of each group, and the group's half scale as bits)
#if XQ == 1
    __global const uint2 *wq = (__global const uint2 *)(W + (size_t)nb * (K / 2)) + bh;
    uint2 wr;
#else
    __global const uint4 *wq = (__global const uint4 *)(W + (size_t)nb * K) + bh;
    uint4 wr;
#endif
    __global const ushort *sq = (__global const ushort *)S + (size_t)nb * (K / 32);
    ushort wd;
#define WLOAD(gi) do { wr = wq[2 * (gi)]; wd = sq[gi]; } while (0)
#else
    float4 wv[8];
#define WLOAD(gi) load_group(W, S, K, nb, (gi), wv)
#endif
    // the loads in registers into buffer b of local memory
#if MMA_PTX
#define XD ((uint)wd * 0x10001u)
#define XO4 0x64086408u  // 1024 + 8
#define XO8 0x64806480u  // 1024 + 128
#else
#define XD vload_half(0, (__private const half *)&wd)
#define XO4 8.0f
#define XO8 128.0f
#endif
#if XQ == 1
    // byte j of the 8: value 8 bh + j (low nibble) and 16 + 8 bh + j (high)
#define WSTORE(b) do { \
        const uint m4 = 0x0F0F0F0Fu; \
        __local uint4 *bp = (__local uint4 *)&Bs[b][br * XR + 8 * bh]; \
        const uint2 l0 = XQ4(wr.x & m4, XO4, XD), l1 = XQ4(wr.y & m4, XO4, XD); \
        const uint2 h0 = XQ4((wr.x >> 4) & m4, XO4, XD), h1 = XQ4((wr.y >> 4) & m4, XO4, XD); \
        bp[0] = (uint4)(l0, l1); bp[2] = (uint4)(h0, h1); } while (0)
#elif XQ == 2
#define XS8(w) ((w) ^ 0x80808080u)  // int8 as 128 + byte
#define WSTORE(b) do { \
        __local uint4 *bp = (__local uint4 *)&Bs[b][br * XR + 16 * bh]; \
        bp[0] = (uint4)(XQ4(XS8(wr.x), XO8, XD), XQ4(XS8(wr.y), XO8, XD)); \
        bp[1] = (uint4)(XQ4(XS8(wr.z), XO8, XD), XQ4(XS8(wr.w), XO8, XD)); } while (0)
#elif XQ == 5
// (word i of the group: values 4 i .. 4 i + 3 in its low 16 bits, 16 + 4 i .. in its high)
#define WSTORE(b) do { \
        __local uint4 *bp = (__local uint4 *)&Bs[b][br * XR + 16 * bh]; \
        const uint sh = 16 * bh; \
        XM4_SCALES(we); \
        bp[0] = (uint4)(XM4(wr.x >> sh), XM4(wr.y >> sh)); \
        bp[1] = (uint4)(XM4(wr.z >> sh), XM4(wr.w >> sh)); } while (0)
#elif XQ == 4
#define WSTORE(b) do { \
        __local uint4 *bp = (__local uint4 *)&Bs[b][br * XR + 16 * bh]; \
        bp[0] = xh8(wh.s0123, wh.s4567); bp[1] = xh8(wh.s89ab, wh.scdef); } while (0)
#else
#define WSTORE(b) do { \
        __local uint4 *bp = (__local uint4 *)&Bs[b][br * XR + 16 * bh]; \
        bp[0] = xh8(wv[4 * bh], wv[4 * bh + 1]); bp[1] = xh8(wv[4 * bh + 2], wv[4 * bh + 3]); \
    } while (0)
#endif
#define XSTORE(b) do { XA_STORE(b); WSTORE(b); } while (0)
    float acc[2][4][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j)
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    XLOAD(0);
    WLOAD(0);
    XSTORE(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    const int steps = K / XK;
    for (int s = 0; s < steps; ++s) {
        const int cur = s & 1;
        if (s + 1 < steps) {  // the next step's loads, in flight during this step's sums
            XLOAD((s + 1) * XK);
            WLOAD(s + 1);
        }
#pragma unroll
        for (int kk = 0; kk < XK; kk += 16) {
            uint a[2][4], b[4][2];
            xfrag_a(a[0], &As[cur][(wm + g) * XR + kk + 2 * t]);
            xfrag_a(a[1], &As[cur][(wm + 16 + g) * XR + kk + 2 * t]);
#pragma unroll
            for (int j = 0; j < 4; ++j) {  // k-pairs 2t and 2t + 8 of weight row wn + 8 j + g
                __local const ushort *r = &Bs[cur][(wn + j * 8 + g) * XR + kk + 2 * t];
                b[j][0] = *(__local const uint *)r;
                b[j][1] = *(__local const uint *)(r + 8);
            }
            if (live0) {
#pragma unroll
                for (int j = 0; j < 4; ++j) XMMA_OP(acc[0][j], a[0], b[j][0], b[j][1]);
            }
            if (live1) {
#pragma unroll
                for (int j = 0; j < 4; ++j) XMMA_OP(acc[1][j], a[1], b[j][0], b[j][1]);
            }
        }
        if (s + 1 < steps) XSTORE(cur ^ 1);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#if XGLU
        // (columns 2 i and 2 i + 1 of the work-group: gate and up row j0 + i)
        const int col = j0 + (wn + j * 8) / 2 + t;
        if (col >= F) continue;
#define XBIAS (float2)(bias[col], bias[F + col])
#else
        const int col = n0 + wn + j * 8 + 2 * t;  // (N is even: col + 1 < N too)
        if (col >= N) continue;
#define XBIAS vload2(0, bias + col)
#endif
#if HAS_BIAS
        const float2 bv = XBIAS;
#else
        const float2 bv = (float2)(0.0f);
#endif
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + wm + 16 * i + 8 * h + g;
                const float2 v = (float2)(acc[i][j][2 * h], acc[i][j][2 * h + 1]) + bv;
#if XGLU && defined(GLU_LIMIT)
                // (gpt-oss's clamped GLU, as activation.cl's glu_clamp makes it)
                const float gc = fmin(v.x, GLU_LIMIT), uc = clamp(v.y, -GLU_LIMIT, GLU_LIMIT);
                vstore_half_rte((uc + 1.0f) * (gc / (1.0f + exp(-GLU_ALPHA * gc))), 0,
                                (__global half *)y + y_off + (size_t)row * ldy + col);
#elif XGLU
                vstore_half_rte(glu_act4((float4)(v, 0.0f, 0.0f)).x * v.y, 0,
                                (__global half *)y + y_off + (size_t)row * ldy + col);
#else
                vstore2(v, 0, y + y_off + (size_t)row * ldy + col);
#endif
            }
    }
}
#endif
