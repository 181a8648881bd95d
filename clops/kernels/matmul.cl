// y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n]) for float, half, bfloat16 and block-quantized W.
//
// Compile-time parameters:
//   WFMT   0 float32, 1 float16, 2 bfloat16, 3 "q4" (4-bit, scale and min per 32), 4 "q8" (int8,
//          a scale per QGROUP values)
//   SCALE_HALF  1: q4/q8 scales are stored as half (exact for Q4_0/Q4_1/Q8_0), 0: as float
//   QGROUP 32 or 16 (q8 only: Q6_K has a scale per 16 values)
//   QMIN   1 (q8): a (scale, min) pair per QGROUP values, value = (q * scale) + min (Q5_1, Q5_K,
//          Q2_K), rounded twice as GGUF computes it; not with QX
//   KQB, KQM, KQT  (WFMT 5, the compact K-quants, nn/quant.py's k4, k5, k6, i4, m4 and n4)
//          high bits a value (0: Q4_K, 1: Q5_K, 2: Q6_K), whether a group has a min (1: Q4_K,
//          Q5_K), and whether the 4-bit values index a table (1: IQ4's, IQ4_XS; 2: MXFP4's
//          doubled E2M1 values, a group's scale 2^(e - 128) of its exponent byte e; 3: IQ4's,
//          IQ4_NL, a group's half scale in its sub-scale bytes; their nibbles in the order
//          kq_words reads them; 2 and 3 without super-scales)
//   KQH    (WFMT 5, KQB 1: h5) Q5_0: a group's half scale in its sub-scale bytes, no
//          super-scales, value (q - 16) * scale
//   TM     rows of x per work-item: the dequantized weights are reused TM times from registers
//   LSIZE  work-items that split K for one output column (1 on CPUs; up to 256 on GPUs)
//   ROWS   output columns per work-item, one after another (CPUs: fewer, longer work-items)
//   NCOL   output columns per work-group (GPUs), each by its own team of LSIZE work-items
//   USE_SHFL  1: teams (LSIZE <= 32, warp-aligned) reduce with NVIDIA PTX shfl.sync, no barrier;
//             teams of several whole warps then add their warps' sums in local memory
//   CHUNKED   1 (GPUs): work-item i of a team takes 16-byte chunks i, i + LSIZE, ... of the row
//             (consecutive work-items read consecutive bytes), read through aligned vector
//             pointers; 0: 32-value groups (CPUs: long contiguous runs per work-item)
//   X_ALIGNED 1: x_off and ldx are multiples of 4 (x read as float4)
//   CPT    output columns per team (CHUNKED): each x chunk is loaded once for CPT columns
//   XMODE  (CHUNKED) 0: x; 1: RMSNorm(x) * nw (eps) folded in; 2: silu(gate) * up of rows
//          [gate (K) | up (K)] folded in (ldx >= 2K)
//   HAS_BIAS, ACCUM  add bias[n]; add into y instead of overwriting (residual connections)
//   QX     1 (CHUNKED, TM 1, q4/q8 weights: one decode row): int8 activations. Each work-group
//          first quantizes x (after XMODE) into local memory, int8 with a scale per 32 values
//          (the scheme of GGML's q8_1), then every 16-byte chunk of weights meets it through
//          int32 dot products of 4 bytes (DP4A: NVIDIA PTX dp4a; 0: plain OpenCL C), and each
//          chunk's int sum meets the float scales once. QK: K (sizes the local x), UNR: chunks
//          per column each work-item loads before using them (bytes in flight), CB: blocks of
//          NCOL * CPT columns per work-group (one after another: x quantized once for them),
//          PIPE: 1 to load a step ahead
//   EXPERTS 1: a mixture of experts' grouped product (experts.cl); with QX, a tile a row (TM 1)
//
// Layouts (row n of W is K values, K a multiple of 32):
//   q4: qs uchar[N][K/2]; in each 32-value group, byte j holds value j (low nibble) and value
//       j+16 (high nibble). sm: (scale, min) pairs per group, value = q * scale + min.
//   q8: qs char[N][K]; sc: one scale per QGROUP values, value = q * scale; QMIN: (scale, min)
//       pairs per QGROUP values, value = (q * scale) + min.
//   kq (WFMT 5): each row one run of KQ_ROW(K) bytes (nn/quant.py spells it out): a group's
//       16 bytes of low nibbles as q4's, its high bits, its sub-scales, the half super-scales
//       of each 256 values; S is not read.
// Work geometry: global (ceil(N / ROWS) * LSIZE, ceil(M / TM)), local (LSIZE, 1); on GPUs
// global (ceil(N / (NCOL * CPT)) * NCOL * LSIZE, ceil(M / TM)), local (NCOL * LSIZE, 1); QX:
// global (ceil(N / (CB * NCOL * CPT)) * NCOL * LSIZE, 1).

#ifndef TM
#define TM 1
#endif
#ifndef LSIZE
#define LSIZE 1
#endif
#ifndef ROWS
#define ROWS 1
#endif
#ifndef NCOL
#define NCOL 1
#endif
#ifndef USE_SHFL
#define USE_SHFL 0
#endif
#ifndef CHUNKED
#define CHUNKED 0
#endif
#ifndef X_ALIGNED
#define X_ALIGNED 0
#endif
#ifndef CPT
#define CPT 1
#endif
#ifndef XMODE
#define XMODE 0
#endif
#ifndef GLU_ACT  // (XMODE 2) the gate's activation: 0 SiLU, 1 GELU (tanh form); GLU_LIMIT and
#define GLU_ACT 0  // GLU_ALPHA (float literals): gpt-oss's clamped GLU in its place
#endif
#if XMODE && !CHUNKED
#error "XMODE needs CHUNKED"
#endif
#ifndef QX
#define QX 0
#endif
#ifndef DP4A
#define DP4A 0
#endif
#ifndef QROWS
#define QROWS 0
#endif
#ifndef UNR
#define UNR 2
#endif
#ifndef CB
#define CB 1
#endif
#ifndef PIPE
#define PIPE 0
#endif
#if QX && !(CHUNKED && TM == 1 && WFMT >= 3 && ROWS == 1)
#error "QX needs CHUNKED, TM 1, ROWS 1 and q4/q8 weights"
#endif
#if QROWS && !(CHUNKED && WFMT >= 3 && !QX && !QMIN)
#error "QROWS needs CHUNKED and q4/q8 weights (no mins), not QX"
#endif
#include "clops/formats.cl"  // QGROUP, QMIN; W_T, SCALE_T, LOAD_SCALE
// Q4_DM(S, gi): q4's (scale, min) of group gi, a pair of S; Q4_SYM 1 (Q4_0, whose every min is
// -8 times its scale): S holds the scales alone and the min is made here (exact: a power of two
// times the scale), the file's 18 bytes a 32 values where the pairs take 20
#ifndef Q4_SYM
#define Q4_SYM 0
#endif
#if Q4_SYM
inline float2 q4_sym_pair(float d) { return (float2)(d, -8.0f * d); }
#define Q4_DM(S, gi) q4_sym_pair(LOAD_SCALE((S), (gi)))
#elif SCALE_HALF
#define Q4_DM(S, gi) vload_half2((gi), (S))
#else
#define Q4_DM(S, gi) vload2((gi), (S))
#endif
#if QMIN && (QX || WFMT != 4)
#error "QMIN takes q8 weights and no QX"
#endif
#include "clops/experts.cl"
// SLOTSUM (QX, EXPERTS, a lone row's slots a tile each): the work-groups of a column
// block count themselves in cnt[block] (zero between launches, left zero), and the last to
// finish adds up its columns of the slots' rows of y in slot order, each weighed by wts[j],
// into out (SLOTSUM 2: += ; 1: =), as moe.cl's moe_combine does: the weighted sum without a
// launch of its own. The kernel's last three arguments: out, wts, cnt.
#ifndef SLOTSUM
#define SLOTSUM 0
#endif
#if SLOTSUM
#if !(QX && EXPERTS)
#error "SLOTSUM takes QX and EXPERTS"
#endif
#define SLOTSUM_ARGS , __global float *out, __global const float *wts, __global int *cnt
#include "clops/fence.cl"  // GLOBAL_FENCE
#else
#define SLOTSUM_ARGS
#endif

inline float4 bf16x4(ushort4 v) {
    return as_float4(convert_uint4(v) << 16);
}

#if QMIN
// (q * d) + mn and (a * d) + (b * mn), each operation rounded on its own as GGUF's
// dequantization rounds it. (For Q5_1, Q5_K and Q2_K, q * d is exact in float32: d has at most
// 17 significant bits, q 5; a fused multiply-add would give the same values. The pragma keeps
// the formula's roundings for any scale.)
inline float16 qmin16(float16 q, float d, float mn) {
#pragma OPENCL FP_CONTRACT OFF
    return q * d + mn;
}
inline float qmin_dot(float a, float d, float b, float mn) {
#pragma OPENCL FP_CONTRACT OFF
    return a * d + b * mn;
}
#endif

#if WFMT == 5
// ---- the compact K-quants: a group of 32 values read in place ----
#if !defined(KQB) || !defined(KQM)
#error "WFMT 5 needs KQB and KQM"
#endif
#ifndef KQT
#define KQT 0
#endif
#ifndef KQH
#define KQH 0
#endif
#define KQ_OFF (KQH ? 16 : 32)  // (KQM 0: the offset of the values, Q6_K's or Q5_0's)
#define KQ_HOFF(K) ((K) / 2)                            // the high bits: 4 KQB bytes a group
#define KQ_SOFF(K) (KQ_HOFF(K) + (K) / 8 * KQB)         // the sub-scales: 2 bytes a group
#define KQ_DOFF(K) (KQ_SOFF(K) + (K) / 16)              // the super-scales: a half2 a 256
#define KQ_ROW(K) ((KQ_DOFF(K) + (K) / 64 + 15) / 16 * 16)
// group g of row n: (nibbles x4, high bits x2 (KQB 1: the second 0), sub-scales, super-scales)
inline uint8 kq_load(__global const uchar *W, int K, int n, int g) {
    __global const uchar *row = W + (size_t)n * KQ_ROW(K);
    const uint4 q = ((__global const uint4 *)row)[g];
#if KQB == 0
    const uint2 h = (uint2)(0u);
#elif KQB == 1
    const uint2 h = (uint2)(((__global const uint *)(row + KQ_HOFF(K)))[g], 0u);
#else
    const uint2 h = ((__global const uint2 *)(row + KQ_HOFF(K)))[g];
#endif
    const uint s = ((__global const ushort *)(row + KQ_SOFF(K)))[g];
#if KQT >= 2 || KQH
    // (MXFP4, IQ4_NL, Q5_0: no super-scales; K need not be a multiple of 256)
    const uint d = 0u;
#else
    const uint d = ((__global const uint *)(row + KQ_DOFF(K)))[g / 8];
#endif
    return (uint8)(q, h, s, d);
}
#if KQT == 2
// MXFP4's doubled E2M1 values (nn/quant.py E2M1_DOUBLED), 4 int8 a word
#define IQ4_T0 0x03020100u
#define IQ4_T1 0x0C080604u
#define IQ4_T2 0xFDFEFF00u
#define IQ4_T3 0xF4F8FAFCu
#elif KQT
// IQ4_NL's and IQ4_XS's 16 values (nn/quant.py IQ4_VALUES), 4 int8 a word
#define IQ4_T0 0xBFAD9881u
#define IQ4_T1 0xF6EADDCFu
#define IQ4_T2 0x26190D01u
#define IQ4_T3 0x71594535u
#endif
#if KQT
// The table's values of the 4 nibbles of s (bits 0..15), as 4 int8 bytes
#if DP4A
// (NVIDIA: byte permutes; a selector's bit 3 would replicate a sign, so each half of the table
// is picked with 3 bits and bit 3 chooses between the halves)
inline uint iq4_4(uint s) {
    uint a, b, d;
    const uint sel = s & 0x7777u, pick = 0x3210u | ((s & 0x8888u) >> 1);
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(a) : "r"(IQ4_T0), "r"(IQ4_T1), "r"(sel));
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(b) : "r"(IQ4_T2), "r"(IQ4_T3), "r"(sel));
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(pick));
    return d;
}
#else
__constant uint IQ4_TABLE[4] = {IQ4_T0, IQ4_T1, IQ4_T2, IQ4_T3};
inline uint iq4_4(uint s) {
    uint d = 0u;
    for (int i = 0; i < 4; ++i) {
        const uint q = (s >> (4 * i)) & 15u;
        d |= ((IQ4_TABLE[q >> 2] >> (8 * (q & 3))) & 0xFFu) << (8 * i);
    }
    return d;
}
#endif
#endif
// The group's values as bytes: lo values 0..15, hi values 16..31, 4 a word (KQT: int8, the
// table's; else unsigned). KQT: word i of the group holds values 4i..4i+3 in its low 16 bits
// and 16+4i..16+4i+3 in its high 16 bits, a nibble each.
inline void kq_words(uint8 r, uint4 *lo, uint4 *hi) {
    const uint4 q = r.s0123;
#if KQT
    *lo = (uint4)(iq4_4(q.x), iq4_4(q.y), iq4_4(q.z), iq4_4(q.w));
    *hi = (uint4)(iq4_4(q.x >> 16), iq4_4(q.y >> 16), iq4_4(q.z >> 16), iq4_4(q.w >> 16));
#else
    uint4 l = q & (uint4)0x0F0F0F0Fu, h = (q >> (uint4)4) & (uint4)0x0F0F0F0Fu;
    // (a shift and an and-or a word: word w's bits moved to bit 4 (and 5) of each byte)
#if KQB == 1
    const uint b = r.s4;
    l |= (uint4)(b << 4, b << 3, b << 2, b << 1) & (uint4)0x10101010u;
    h |= (uint4)(b, b >> 1, b >> 2, b >> 3) & (uint4)0x10101010u;
#elif KQB == 2
    const uint b0 = r.s4, b1 = r.s5;
    l |= (uint4)(b0 << 4, b0 << 2, b0, b0 >> 2) & (uint4)0x30303030u;
    h |= (uint4)(b1 << 4, b1 << 2, b1, b1 >> 2) & (uint4)0x30303030u;
#elif KQB != 0
#error "KQB: 0, 1 or 2 high bits a value"
#endif
    *lo = l;
    *hi = h;
#endif
}
// (s0, mn0, s1, mn1): the scale and min of values 0..15 and of 16..31 (KQM 0: mn = -32 s,
// KQH -16 s; KQT: no min)
inline float4 kq_scales(uint8 r) {
    const uint dd = r.s7;
    const float2 d = vload_half2(0, (const __private half *)&dd);
#if KQT == 2
    // (2^(e - 128), e >= 2: a normal float32)
    const float s = as_float(((r.s6 & 0xFFu) - 1u) << 23);
    return (float4)(s, 0.0f, s, 0.0f);
#elif KQT == 3 || KQH
    const ushort sh = (ushort)r.s6;  // (the group's half scale)
    const float s = vload_half(0, (const __private half *)&sh);
    return KQH ? (float4)(s, -16.0f * s, s, -16.0f * s) : (float4)(s, 0.0f, s, 0.0f);
#elif KQT
    const float s = d.x * (float)as_char((uchar)(r.s6 & 0xFFu));
    return (float4)(s, 0.0f, s, 0.0f);
#elif KQM
    const float s = d.x * (float)(r.s6 & 0xFFu), mn = -(d.y * (float)(r.s6 >> 8));
    return (float4)(s, mn, s, mn);
#else
    const float s0 = d.x * (float)as_char((uchar)(r.s6 & 0xFFu));
    const float s1 = d.x * (float)as_char((uchar)(r.s6 >> 8));
    return (float4)(s0, -32.0f * s0, s1, -32.0f * s1);
#endif
}
// bytes as floats: the table's int8 values (KQT), else unsigned
#if KQT
#define KQ_FLOAT16(q) convert_float16(as_char16(q))
#else
#define KQ_FLOAT16(q) convert_float16(as_uchar16(q))
#endif
// The 16 values of bytes q with scale s and min mn as GGUF computes them: q * s + mn (Q4_K's and
// Q5_K's q * s is exact), or (q - 32) * s (Q6_K; Q5_0 (q - 16) * s: -0.0 where s < 0 and q is
// the offset, as GGUF's)
inline float16 kq_values16(uint4 q, float s, float mn) {
#if KQT
    return KQ_FLOAT16(q) * s;  // (no + 0: GGUF's -0.0 where s is -0.0)
#elif KQM
    return KQ_FLOAT16(q) * s + mn;
#else
    return convert_float16(convert_short16(as_uchar16(q)) - (short16)KQ_OFF) * s;
#endif
}
#endif

// Dequantize the 32 weights of group g of row n into w[0..7].
inline void load_group(__global const W_T *W, __global const SCALE_T *S, int K, int n, int g,
                       float4 *w) {
#if WFMT == 0
    __global const float *p = W + (size_t)n * K + g * 32;
    for (int j = 0; j < 8; ++j) w[j] = vload4(j, p);
#elif WFMT == 1
    __global const ushort *p = W + (size_t)n * K + g * 32;
    for (int j = 0; j < 8; ++j) w[j] = vload_half4(j, (__global const half *)p);
#elif WFMT == 2
    __global const ushort *p = W + (size_t)n * K + g * 32;
    for (int j = 0; j < 8; ++j) w[j] = bf16x4(vload4(j, p));
#elif WFMT == 5
    const uint8 r = kq_load(W, K, n, g);
    uint4 lo, hi;
    kq_words(r, &lo, &hi);
    const float4 sc = kq_scales(r);
    const float16 a = kq_values16(lo, sc.x, sc.y), b = kq_values16(hi, sc.z, sc.w);
    w[0] = a.s0123; w[1] = a.s4567; w[2] = a.s89ab; w[3] = a.scdef;
    w[4] = b.s0123; w[5] = b.s4567; w[6] = b.s89ab; w[7] = b.scdef;
#elif WFMT == 3
    size_t gi = (size_t)n * (K / 32) + g;
    uchar16 q = vload16(0, W + gi * 16);
    const float2 dm = Q4_DM(S, gi);
    const float d = dm.x, mn = dm.y;
    float16 lo = convert_float16(q & (uchar16)15) * d + mn;
    float16 hi = convert_float16(q >> (uchar16)4) * d + mn;
    w[0] = lo.s0123; w[1] = lo.s4567; w[2] = lo.s89ab; w[3] = lo.scdef;
    w[4] = hi.s0123; w[5] = hi.s4567; w[6] = hi.s89ab; w[7] = hi.scdef;
#else
    size_t base = (size_t)n * K + g * 32;
    float16 a = convert_float16(vload16(0, W + base));
    float16 b = convert_float16(vload16(1, W + base));
#if QMIN && QGROUP == 32
    const float d0 = LOAD_SCALE(S, 2 * (base / 32)), m0 = LOAD_SCALE(S, 2 * (base / 32) + 1);
    a = qmin16(a, d0, m0); b = qmin16(b, d0, m0);
#elif QMIN
    const size_t gi = base / 16;
    a = qmin16(a, LOAD_SCALE(S, 2 * gi), LOAD_SCALE(S, 2 * gi + 1));
    b = qmin16(b, LOAD_SCALE(S, 2 * gi + 2), LOAD_SCALE(S, 2 * gi + 3));
#else
#if QGROUP == 32
    float d0 = LOAD_SCALE(S, base / 32), d1 = d0;
#else
    float d0 = LOAD_SCALE(S, base / 16), d1 = LOAD_SCALE(S, base / 16 + 1);
#endif
    a *= d0; b *= d1;
#endif
    w[0] = a.s0123; w[1] = a.s4567; w[2] = a.s89ab; w[3] = a.scdef;
    w[4] = b.s0123; w[5] = b.s4567; w[6] = b.s89ab; w[7] = b.scdef;
#endif
}

#if USE_SHFL
// Sum over the LSIZE lanes of a team (butterfly within aligned groups of LSIZE lanes); teams of
// more than a warp: over each warp of the team (finish adds the warps' sums).
#define WLANES (LSIZE < 32 ? LSIZE : 32)
inline float team_sum(float v) {
    for (int o = WLANES / 2; o > 0; o >>= 1) {
        uint t;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"
                     : "=r"(t) : "r"(as_uint(v)), "r"(o));
        v += as_float(t);
    }
    return v;
}
#endif

#if CHUNKED
// Values per 16-byte chunk of a weight row.
#if WFMT == 0
#define VPC 4
#elif WFMT == 1 || WFMT == 2
#define VPC 8
#elif WFMT == 3 || WFMT == 5
#define VPC 32
#else
#define VPC 16
#endif

// x rows start at multiples of 4 floats (X_ALIGNED): 16-byte loads; else element loads
#if X_ALIGNED
#define X4(p, i) (*((__global const float4 *)(p) + (i)))
#else
#define X4(p, i) vload4((i), (p))
#endif
// The x the weights meet (XMODE): x; x * nw (RMSNorm folded in, the 1/rms scale applied to the
// sums); act(x[k]) * x[K + k] (the GLU of a [gate | up] row folded in, act GLU_ACT's, as
// activation.cl's glu computes it)
inline float4 glu_act4(float4 v) {
#if GLU_ACT == 1
    return 0.5f * v * (1.0f + tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
#else
    return v / (1.0f + exp(-v));
#endif
}
// act(g) * u, or (GLU_LIMIT) gpt-oss's clamped GLU, as activation.cl's glu_clamp computes it
inline float4 glu4(float4 g, float4 u) {
#ifdef GLU_LIMIT
    const float4 gc = fmin(g, GLU_LIMIT), uc = clamp(u, -GLU_LIMIT, GLU_LIMIT);
    return (uc + 1.0f) * (gc / (1.0f + exp(-GLU_ALPHA * gc)));
#else
    return glu_act4(g) * u;
#endif
}
#if XMODE == 1
#define XC4(p, i) (X4(p, i) * X4(nw, i))
#elif XMODE == 2
#define XC4(p, i) glu4(X4(p, i), X4((p) + K, i))
#else
#define XC4(p, i) X4(p, i)
#endif
#define X8(p, i) ((float8)(XC4(p, 2 * (i)), XC4(p, 2 * (i) + 1)))
#define X16(p, i) ((float16)(X8(p, 2 * (i)), X8(p, 2 * (i) + 1)))

#if QX || QROWS
#define DOT4_PTX DP4A  // dot4, for the int8 products: dp4a where DP4A
#endif
#include "clops/vec.cl"  // hsum4, hsum8, hsum16 (QX: dot4)

// PERF: quantized values become floats by placing their bits in the mantissa of 1.0 (a shift
// and an and-or each), not by int-to-float conversions, which run at a fraction of the FMA rate
// on GPUs; the offset (the 1.0s) is taken out of each chunk's sum.
// 1 + q / 16 for the low (nib_lo) or high (nib_hi) nibbles of the 16 bytes in w, in byte order:
// a shift and an and-or per value.
#define NIB(v, sh) (as_float(0x3F800000u | ((sh) >= 0 ? (v) << (sh) : (v) >> -(sh)) & 0x00780000u))
#define NIB4(v, s0) (float4)(NIB(v, s0), NIB(v, (s0) - 8), NIB(v, (s0) - 16), NIB(v, (s0) - 24))
#define BYT(v, sh) (as_float(0x3F800000u | ((sh) >= 0 ? (v) << (sh) : (v) >> -(sh)) & 0x007F8000u))
#define BYT4(v) (float4)(BYT(v, 15), BYT(v, 7), BYT(v, -1), BYT(v, -9))
inline float16 byte_f(uint4 w) { return (float16)(BYT4(w.x), BYT4(w.y), BYT4(w.z), BYT4(w.w)); }

inline float16 nib_lo(uint4 w) {
    return (float16)(NIB4(w.x, 19), NIB4(w.y, 19), NIB4(w.z, 19), NIB4(w.w, 19));
}
inline float16 nib_hi(uint4 w) {
    return (float16)(NIB4(w.x, 15), NIB4(w.y, 15), NIB4(w.z, 15), NIB4(w.w, 15));
}

// x[c*VPC .. c*VPC+VPC) . W[n, same]: one 16-byte aligned load of weights.
inline float chunk_dot(__global const W_T *W, __global const SCALE_T *S, int K, int n, int c,
                       __global const float *xr, __global const float *nw) {
#if WFMT == 0
    const float4 w = *((__global const float4 *)(W + (size_t)n * K) + c);
    return hsum4(w * XC4(xr, c));
#elif WFMT == 1 || WFMT == 2
    const uint4 u = *((__global const uint4 *)(W + (size_t)n * K) + c);
#if WFMT == 1
    const float8 w = vload_half8(0, (const __private half *)&u);
#else
    const uint8 b = (uint8)(u.x << 16, u.x & 0xffff0000u, u.y << 16, u.y & 0xffff0000u,
                            u.z << 16, u.z & 0xffff0000u, u.w << 16, u.w & 0xffff0000u);
    const float8 w = as_float8(b);
#endif
    return hsum8(w * X8(xr, c));
#elif WFMT == 3
    const size_t gi = (size_t)n * (K / 32) + c;
    const uint4 q = *((__global const uint4 *)W + gi);
    const float2 dm = Q4_DM(S, gi);
    const float d = dm.x, mn = dm.y;
    const float16 xl = X16(xr, 2 * c), xh = X16(xr, 2 * c + 1);
    // value j (low nibble of byte j) meets xl[j], value j + 16 (high nibble) meets xh[j];
    // nibbles become 1 + q / 16 (q placed in the mantissa): sum q x = 16 (sum f x - sum x)
    const float16 a = nib_lo(q) * xl + nib_hi(q) * xh;
    const float sx = hsum16(xl + xh);
    return d * 16.0f * (hsum16(a) - sx) + mn * sx;
#elif WFMT == 5
    const uint8 r = kq_load(W, K, n, c);
    uint4 lo, hi;
    kq_words(r, &lo, &hi);
    const float4 sc = kq_scales(r);
    const float16 xl = X16(xr, 2 * c), xh = X16(xr, 2 * c + 1);
    // sum (q s + mn) x = s sum q x + mn sum x, for each half
    return (sc.x * hsum16(KQ_FLOAT16(lo) * xl) + sc.y * hsum16(xl)) +
           (sc.z * hsum16(KQ_FLOAT16(hi) * xh) + sc.w * hsum16(xh));
#else
    const size_t base = (size_t)n * K + c * 16;
    // bytes become f = 1 + (q + 128) / 256 (placed in the mantissa): sum q x = 256 sum f x
    // - 384 sum x
    const uint4 u = *((__global const uint4 *)(W + base)) ^ (uint4)0x80808080u;
    const float16 xv = X16(xr, c);
#if QMIN
    // sum ((q d) + mn) x = (sum q x) d + (sum x) mn
    const size_t gi = base / QGROUP;
    const float sx = hsum16(xv);
    return qmin_dot(256.0f * hsum16(byte_f(u) * xv) - 384.0f * sx, LOAD_SCALE(S, 2 * gi), sx,
                    LOAD_SCALE(S, 2 * gi + 1));
#else
    return LOAD_SCALE(S, base / QGROUP) * (256.0f * hsum16(byte_f(u) * xv) - 384.0f * hsum16(xv));
#endif
#endif
}
#endif

// Partial sums r[i * CPT + j] of rows m0 + i, columns n + j.
#define RN (TM * CPT)
#if XMODE == 1
#define RN2 (RN + TM)  // and the sums of squares of the x rows
#else
#define RN2 RN
#endif
// Reduce the partial sums r over the team (lid: place in it), then the team's first
// work-item stores columns n .. n + CPT - 1 of rows m0 ..
// NOTE: no early return: the int8 path calls this in a loop, every work-item of the group
// reaching the barriers of the local-memory reduction each time.
inline void finish(float *r, __global float *y, int y_off, int ldy, __global const float *bias,
                   int M, int N, int K, int n, int m0, int lid, __local float *red, float eps) {
#if USE_SHFL
    for (int i = 0; i < RN2; ++i) r[i] = team_sum(r[i]);
#if LSIZE > 32
    // the team's warps: lane 0 of each leaves its sums in red, work-item 0 adds them up
    if ((lid & 31) == 0)
        for (int i = 0; i < RN2; ++i) red[i * (LSIZE / 32) + (lid >> 5)] = r[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0)
        for (int i = 0; i < RN2; ++i) {
            float s = 0.0f;
            for (int w = 0; w < LSIZE / 32; ++w) s += red[i * (LSIZE / 32) + w];
            r[i] = s;
        }
    barrier(CLK_LOCAL_MEM_FENCE);  // before the next column block's sums overwrite red
#endif
#elif LSIZE > 1
    for (int i = 0; i < RN2; ++i) red[i * LSIZE + lid] = r[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LSIZE / 2; s > 0; s >>= 1) {
        if (lid < s)
            for (int i = 0; i < RN2; ++i) red[i * LSIZE + lid] += red[i * LSIZE + lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    // (only work-item 0 reads red[i * LSIZE], which only it writes: no barrier before reuse)
    for (int i = 0; i < RN2; ++i) r[i] = red[i * LSIZE];
#endif
    if (lid != 0) return;
#if XMODE == 1
    for (int i = 0; i < TM; ++i) {
        const float inv = rsqrt(r[RN + i] / K + eps);
        for (int j = 0; j < CPT; ++j) r[i * CPT + j] *= inv;
    }
#endif
    for (int j = 0; j < CPT; ++j) {
        if (n + j >= N) return;
#if HAS_BIAS
        const float b = bias[n + j];
#else
        const float b = 0.0f;
#endif
        for (int i = 0; i < TM; ++i) {
            if (m0 + i >= M) break;
            __global float *yp = y + y_off + (size_t)(m0 + i) * ldy + n + j;
#if ACCUM
            *yp += r[i * CPT + j] + b;
#else
            *yp = r[i * CPT + j] + b;
#endif
        }
    }
}

// Output columns n .. n + CPT - 1 (those < N) of rows m0 .. m0 + TM - 1, by a team of LSIZE
// work-items (lid is this one's place in it).
inline void matmul_column(__global float *y, int y_off, int ldy,
                          __global const float *x, int x_off, int ldx,
                          __global const W_T *W, __global const SCALE_T *S,
                          __global const float *bias, int M, int N, int K, int n, int lid,
                          __local float *red, __global const float *nw, float eps) {
    const int m0 = get_global_id(1) * TM;
    __global const float *xr[TM];
    for (int i = 0; i < TM; ++i) xr[i] = x + x_off + (size_t)min(m0 + i, M - 1) * ldx;
    float r[RN2];
    for (int i = 0; i < RN2; ++i) r[i] = 0.0f;

#if CHUNKED
    // columns past N (last team of the last group) compute column N - 1 and store nothing
    int nn[CPT];
    for (int j = 0; j < CPT; ++j) nn[j] = min(n + j, N - 1);
    // PERF: each x chunk is read once for the CPT columns (the loads are shared)
#pragma unroll 2
    for (int c = lid; c < K / VPC; c += LSIZE)
        for (int i = 0; i < TM; ++i) {
#pragma unroll
            for (int j = 0; j < CPT; ++j)
                r[i * CPT + j] += chunk_dot(W, S, K, nn[j], c, xr[i], nw);
#if XMODE == 1
            for (int q = 0; q < VPC / 4; ++q) {
                const float4 v = X4(xr[i], c * (VPC / 4) + q);
                r[RN + i] += dot(v, v);
            }
#endif
        }
#else
    const int groups = K / 32, nc = min(n, N - 1);
    float4 acc[TM];
    for (int i = 0; i < TM; ++i) acc[i] = (float4)(0.0f);
    for (int g = lid; g < groups; g += LSIZE) {
        float4 w[8];
        load_group(W, S, K, nc, g, w);
        for (int i = 0; i < TM; ++i) {
            __global const float *xp = xr[i] + g * 32;
            float4 a = acc[i];
            // (fma, not mad: a runtime may contract mad or not as it vectorizes each TM
            // apart (Intel's on AVX-512), and a row's sums would then depend on its tile)
            for (int j = 0; j < 8; ++j) a = fma(vload4(j, xp), w[j], a);
            acc[i] = a;
        }
    }
    for (int i = 0; i < TM; ++i) r[i] = acc[i].x + acc[i].y + acc[i].z + acc[i].w;
#endif

    finish(r, y, y_off, ldy, bias, M, N, K, n, m0, lid, red, eps);
}

#if QX || QROWS
// ---- int8 activations (QX: one decode row; QROWS: rows quantized beforehand) ----
#define NB (QK / 32)  // 32-value blocks of x
// Local int8 x, 16 values per uint4: q4 chunks (one block) meet half 0 (values 0..15, the low
// nibbles) and half 1 (values 16..31, the high nibbles) of their block, kept in two planes so
// that a warp's 16-byte reads of consecutive blocks hit consecutive banks; q8 chunks (16
// values) meet the 16 values in the same place of the row.
#if WFMT == 3 || WFMT == 5
#define XQI(b, h) ((h) * NB + (b))
#else
#define XQI(b, h) (2 * (b) + (h))
#endif

// The 16-byte chunk c of row n of W (wq) and its scales (ws: q4 (scale, min); q8 scale).
#if WFMT == 3
#define WS_T float2
#define LOAD_WS(n, c) Q4_DM(S, (size_t)(n) * NB + (c))
#elif WFMT == 5
#define WS_T float  // (the scales come with the values, kq_load)
#define LOAD_WS(n, c) 0.0f
#else
#define WS_T float
#define LOAD_WS(n, c) LOAD_SCALE(S, ((size_t)(n) * QK + (c) * 16) / QGROUP)
#endif
#if WFMT == 5
#define WQ_T uint8
#define LOAD_WQ(n, c) kq_load(W, QK, n, c)
#else
#define WQ_T uint4
#define LOAD_WQ(n, c) (*((__global const uint4 *)W + (size_t)(n) * (QK / VPC) + (c)))
#endif

#define NCH (QK / VPC)                                 // chunks per row

// A block of 32 values v as int8 (GGML's q8_1): q = round(v * 127 / amax) into u (4 a uint);
// returns (dx, dx * sum q), dx = amax / 127.
inline float2 block_q8(const float4 *v, uint *u) {
    float4 amax4 = (float4)(0.0f);
    for (int j = 0; j < 8; ++j) amax4 = fmax(amax4, fabs(v[j]));
    const float amax = fmax(fmax(amax4.x, amax4.y), fmax(amax4.z, amax4.w));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int4 sq = (int4)(0);
    for (int j = 0; j < 8; ++j) {
        const int4 q = convert_int4_sat_rte(v[j] * inv);
        sq += q;
        u[j] = as_uint(convert_char4_sat(q));
    }
    const float dx = amax / 127.0f;
    return (float2)(dx, dx * (float)((sq.x + sq.y) + (sq.z + sq.w)));
}

// The int sums of a 16-byte weight chunk q against int8 x: q4 (a block: low nibbles meet xl,
// values 0..15, high nibbles xh, values 16..31); q8 (16 values against xv).
inline int q4_dot(uint4 q, uint4 xl, uint4 xh) {
    const uint m = 0x0F0F0F0Fu;
    int s = dot4(q.x & m, xl.x, 0);
    s = dot4(q.y & m, xl.y, s);
    s = dot4(q.z & m, xl.z, s);
    s = dot4(q.w & m, xl.w, s);
    s = dot4((q.x >> 4) & m, xh.x, s);
    s = dot4((q.y >> 4) & m, xh.y, s);
    s = dot4((q.z >> 4) & m, xh.z, s);
    return dot4((q.w >> 4) & m, xh.w, s);
}
inline int q8_dot(uint4 q, uint4 xv) {
    int s = dot4(q.x, xv.x, 0);
    s = dot4(q.y, xv.y, s);
    s = dot4(q.z, xv.z, s);
    return dot4(q.w, xv.w, s);
}
#if WFMT == 5
// acc + a kq group (r) against int8 x: xl values 0..15, xh 16..31, xd (dx, dx * sum xq)
inline float kq_dot(WQ_T r, uint4 xl, uint4 xh, float2 xd, float acc) {
    uint4 lo, hi;
    kq_words(r, &lo, &hi);
    const float4 sc = kq_scales(r);
#if KQT || KQM
    // sum (q s + mn) (xq dx) = s dx sum q xq + mn dx sum xq (KQT: q the table's, mn 0)
    int s = q8_dot(lo, xl);
    s = dot4(hi.x, xh.x, s);
    s = dot4(hi.y, xh.y, s);
    s = dot4(hi.z, xh.z, s);
    s = dot4(hi.w, xh.w, s);
    return fma(sc.x * xd.x, (float)s, fma(sc.y, xd.y, acc));
#else
    // sum (q - off) xq = sum q xq + sum (-off) xq, each half (0xE0: -32 a byte, 0xF0: -16)
    const uint4 off = (uint4)(KQH ? 0xF0F0F0F0u : 0xE0E0E0E0u);
    const int s0 = q8_dot(lo, xl) + q8_dot(off, xl);
    const int s1 = q8_dot(hi, xh) + q8_dot(off, xh);
    return fma(sc.x * xd.x, (float)s0, fma(sc.z * xd.x, (float)s1, acc));
#endif
}
#endif

#define STEPS ((NCH + LSIZE * UNR - 1) / (LSIZE * UNR))  // per column block
// Load step t (of the team's CB * STEPS; QROWS: of STEPS) of work-item lid: UNR chunks of CPT
// columns.
inline void load_step(int t, int lid, int n_first, int N, __global const W_T *W,
                      __global const SCALE_T *S, WQ_T wq[UNR][CPT], WS_T ws[UNR][CPT]) {
    const int c0 = lid + (t % STEPS) * LSIZE * UNR, n0 = n_first + (t / STEPS) * (NCOL * CPT);
#pragma unroll
    for (int u = 0; u < UNR; ++u) {
        const int c = c0 + u * LSIZE;
        if (c < NCH)
#pragma unroll
            for (int j = 0; j < CPT; ++j) {
                const int nj = min(n0 + j, N - 1);
                wq[u][j] = LOAD_WQ(nj, c);
                ws[u][j] = LOAD_WS(nj, c);
            }
    }
}
#endif

#if QX
// The work-group quantizes x (after XMODE) into xq, xs: per block of 32 values
// q = round(v * 127 / amax), (dx, dx * sum q) with dx = amax / 127 (so v ~ q * dx). Returns this
// work-item's part of the sum of squares of the raw x (XMODE 1).
#define NT (LSIZE * NCOL)  // work-items per group
inline float4 x_in(__global const float *xr, __global const float *nw, int K, int i,
                   float *ssq) {
#if XMODE == 1
    const float4 raw = X4(xr, i);
    *ssq += dot(raw, raw);
    return raw * X4(nw, i);
#else
    return XC4(xr, i);
#endif
}
#if USE_SHFL && NT % 32 == 0
// PERF: 8 work-items per block, one float4 each (a warp reads 512 consecutive bytes); the
// block's amax and sum of q over the 8 by warp shuffles
#include "clops/ptx.cl"  // shfl_xor
#define XPASS ((NB * 8 + NT - 1) / NT)  // float4s of x per work-item
#define XG (XPASS < 8 ? XPASS : 8)
inline float quantize_x(__global const float *xr, __global const float *nw, int K,
                        __local uint4 *xq, __local float2 *xs) {
    float ssq = 0.0f;
    const int t = get_local_id(0), l = t & 7;
    // NOTE: the same trip count for every work-item (full-warp shuffles). PERF: the loads of
    // up to 8 passes are issued before any is used (one memory latency, not 8)
    for (int p0 = 0; p0 < XPASS; p0 += XG) {
        float4 v[XG];
#pragma unroll
        for (int g = 0; g < XG; ++g) {
            const int i = (p0 + g) * NT + t;
            v[g] = p0 + g < XPASS && i < NB * 8 ? x_in(xr, nw, K, i, &ssq) : (float4)(0.0f);
        }
#pragma unroll
        for (int g = 0; g < XG; ++g) {
            const int i = (p0 + g) * NT + t, b = i >> 3;
            const float4 a4 = fabs(v[g]);
            float amax = fmax(fmax(a4.x, a4.y), fmax(a4.z, a4.w));
            amax = fmax(amax, shfl_xor(amax, 1));
            amax = fmax(amax, shfl_xor(amax, 2));
            amax = fmax(amax, shfl_xor(amax, 4));
            const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            const int4 q = convert_int4_sat_rte(v[g] * inv);
            float sq = (float)((q.x + q.y) + (q.z + q.w));  // exact: |sum| <= 32 * 127
            sq += shfl_xor(sq, 1);
            sq += shfl_xor(sq, 2);
            sq += shfl_xor(sq, 4);
            if (p0 + g < XPASS && i < NB * 8) {
                ((__local uint *)xq)[XQI(b, l >> 2) * 4 + (l & 3)] =
                    as_uint(convert_char4_sat(q));
                const float dx = amax / 127.0f;
                if (l == 0) xs[b] = (float2)(dx, dx * sq);
            }
        }
    }
    return ssq;
}
#else
// Work-item t quantizes blocks t, t + NT, ...
inline float quantize_x(__global const float *xr, __global const float *nw, int K,
                        __local uint4 *xq, __local float2 *xs) {
    float ssq = 0.0f;
    for (int b = get_local_id(0); b < NB; b += NT) {
        float4 v[8];
        for (int j = 0; j < 8; ++j) v[j] = x_in(xr, nw, K, b * 8 + j, &ssq);
        uint u[8];
        xs[b] = block_q8(v, u);
        xq[XQI(b, 0)] = (uint4)(u[0], u[1], u[2], u[3]);
        xq[XQI(b, 1)] = (uint4)(u[4], u[5], u[6], u[7]);
    }
    return ssq;
}
#endif


// One team's output columns: CB blocks of CPT columns, n_first + b * NCOL * CPT + j; in each,
// chunks lid, lid + LSIZE, ... of the rows, UNR of them per column loaded at once. PIPE 1: the
// next step's loads are issued before this step's arithmetic (twice the registers).
inline void gemv_q(__global float *y, int y_off, __global const float *x, int x_off,
                   __global const W_T *W, __global const SCALE_T *S, __global const float *bias,
                   int N, int K, int n_first, int lid, __local float *red,
                   __global const float *nw, float eps, __local uint4 *xq, __local float2 *xs,
                   __local float *ssq) {
    __global const float *xr = x + x_off;
    WQ_T wq[UNR][CPT];
    WS_T ws[UNR][CPT];
    // PERF: the first weights are on their way while the work-group quantizes x
    load_step(0, lid, n_first, N, W, S, wq, ws);
    const float part = quantize_x(xr, nw, K, xq, xs);
#if XMODE == 1
    ssq[get_local_id(0)] = part;
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    float x_ss = 0.0f;
#if XMODE == 1
    for (int i = lid; i < NT; i += LSIZE) x_ss += ssq[i];
#endif
    float r[RN2];
    for (int i = 0; i < RN; ++i) r[i] = 0.0f;
    for (int t = 0; t < CB * STEPS; ++t) {
#if PIPE
        WQ_T wn[UNR][CPT];
        WS_T sn[UNR][CPT];
        if (t + 1 < CB * STEPS) load_step(t + 1, lid, n_first, N, W, S, wn, sn);
#endif
        const int c0 = lid + (t % STEPS) * LSIZE * UNR;
#pragma unroll
        for (int u = 0; u < UNR; ++u) {
            const int c = c0 + u * LSIZE;
            if (c >= NCH) break;
#if WFMT == 5
            const uint4 xl = xq[XQI(c, 0)], xh = xq[XQI(c, 1)];
            const float2 xd = xs[c];
#pragma unroll
            for (int j = 0; j < CPT; ++j) r[j] = kq_dot(wq[u][j], xl, xh, xd, r[j]);
#elif WFMT == 3
            const uint4 xl = xq[XQI(c, 0)], xh = xq[XQI(c, 1)];
            const float2 xd = xs[c];
#pragma unroll
            for (int j = 0; j < CPT; ++j) {
                const int s = q4_dot(wq[u][j], xl, xh);
                // sum (q d + mn) (xq dx) = d dx sum q xq + mn dx sum xq
                r[j] = fma(ws[u][j].x * xd.x, (float)s, fma(ws[u][j].y, xd.y, r[j]));
            }
#else
            const uint4 xv = xq[c];
            const float dx = xs[c / 2].x;
#pragma unroll
            for (int j = 0; j < CPT; ++j)
                r[j] = fma(ws[u][j] * dx, (float)q8_dot(wq[u][j], xv), r[j]);
#endif
        }
#if PIPE
#pragma unroll
        for (int u = 0; u < UNR; ++u)
#pragma unroll
            for (int j = 0; j < CPT; ++j) {
                wq[u][j] = wn[u][j];
                ws[u][j] = sn[u][j];
            }
#else
        if (t + 1 < CB * STEPS) load_step(t + 1, lid, n_first, N, W, S, wq, ws);
#endif
        if (t % STEPS == STEPS - 1) {  // the end of a column block
#if XMODE == 1
            r[RN] = x_ss;
#endif
            finish(r, y, y_off, 0, bias, 1, N, K, n_first + (t / STEPS) * (NCOL * CPT), 0, lid,
                   red, eps);
            for (int i = 0; i < RN; ++i) r[i] = 0.0f;
        }
    }
}
#endif

// QX: the group's size is fixed (NVIDIA: registers budgeted for it; groups of up to 1024).
#if QX
#define MATMUL_ATTR __attribute__((reqd_work_group_size(LSIZE * NCOL, 1, 1)))
#else
#define MATMUL_ATTR
#endif
__kernel MATMUL_ATTR void matmul(__global float *y, int y_off, int ldy,
                     __global const float *x, int x_off, int ldx,
                     __global const W_T *W, __global const SCALE_T *S,
                     __global const float *bias, int M, int N, int K,
                     __global const float *nw, float eps EXPERT_ARGS SLOTSUM_ARGS
                     ROUTE_ARGS) {
    __local float red[RN2 * LSIZE * NCOL];
#if SLOTSUM
    __local int last;
    const int y_off0 = y_off;
#endif
#if ROUTE
#if !(QX && EXPERTS)
#error "ROUTE takes QX and EXPERTS"
#endif
    __local float rl[ROUTE_E];
    __local int chosen[TOPK];
    TAKE_EXPERT_OF(route_slot(logits, (__global int *)tile_e, wts, get_global_id(1), rl,
                              chosen));
#else
    TAKE_EXPERT(get_global_id(1));
#endif
    // NOTE: from the global id, so that with LSIZE 1 the driver may pick any local size.
    const int c = get_global_id(0) / LSIZE;
    const int lid = get_global_id(0) % LSIZE;
#if NCOL > 1
    __local float *team = red + (get_local_id(0) / LSIZE) * RN2 * LSIZE;
#else
    __local float *team = red;
#endif
#if QX
    __local uint4 xq[QK / 16];
    __local float2 xs[NB];
#if XMODE == 1
    __local float ssq[LSIZE * NCOL];
#else
    __local float *ssq = red;
#endif
    // NOTE: no early exit: every work-item reaches the barrier after the quantization of x
    const int n_first = (get_group_id(0) * CB * NCOL + get_local_id(0) / LSIZE) * CPT;
#if EXPERTS
    // (a lone row's slots, TM 1: tile t's row of x and of y, ldx and ldy apart)
    x_off += get_global_id(1) * ldx;
    y_off += get_global_id(1) * ldy;
#endif
    gemv_q(y, y_off, x, x_off, W, S, bias, N, K, n_first, lid, team, nw, eps, xq, xs, ssq);
#if SLOTSUM
    // (the group's columns: CB blocks of NCOL teams of CPT)
    const int g = get_group_id(0), c0 = g * CB * NCOL * CPT;
    const int c1 = min(N, c0 + CB * NCOL * CPT);
    GLOBAL_FENCE();
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) last = atomic_inc(cnt + g) == get_num_groups(1) - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!last) return;
    GLOBAL_FENCE();
    for (int c = c0 + get_local_id(0); c < c1; c += get_local_size(0)) {
        float s = 0.0f;
        for (int j = 0; j < get_num_groups(1); ++j) s += wts[j] * y[y_off0 + j * ldy + c];
#if SLOTSUM == 2
        out[c] += s;
#else
        out[c] = s;
#endif
    }
    if (get_local_id(0) == 0) atomic_xchg(cnt + g, 0);
#endif
    return;
#endif
    for (int r = 0; r < ROWS; ++r) {
        const int n = (c * ROWS + r) * CPT;
#if NCOL == 1
        if (n >= N) return;  // the whole work-group
#endif
        matmul_column(y, y_off, ldy, x, x_off, ldx, W, S, bias, M, N, K, n, lid, team, nw,
                      eps);
    }
}

// out[m, :] = row ids[m] of the table W (any WFMT), dequantized to float32. ids come from
// tokens[state[0] + m] so that a decode step reads the token the previous step sampled.
// Work geometry: global (K / 32, M).
__kernel void embedding(__global float *out, __global const int *tokens,
                        __global const int *state, __global const W_T *W,
                        __global const SCALE_T *S, int K, int vocab) {
    const int g = get_global_id(0);
    const int m = get_global_id(1);
    int id = tokens[state[0] + m];
    id = clamp(id, 0, vocab - 1);
    float4 w[8];
    load_group(W, S, K, id, g, w);
    __global float *o = out + (size_t)m * K + g * 32;
    for (int j = 0; j < 8; ++j) vstore4(w[j], j, o);
}

// W dequantized to float16 rows [N][K] (any WFMT): the B operand of gemm.cl's gemm_nt_mma for a
// prompt's rows. A work-item converts 8 consecutive values of a row: consecutive work-items read
// consecutive 8-byte (int8), 8-byte (4-bit: one half of a group's nibbles) or 16/32-byte
// (float) runs and write consecutive 16-byte runs of float16, each with one store. The values
// are load_group's, computed as it computes them. Work geometry: global (K / 8, N).
#if QMIN
inline float8 qmin8(float8 q, float d, float mn) {
#pragma OPENCL FP_CONTRACT OFF
    return q * d + mn;
}
#endif
__kernel void dequant_half(__global half *out, __global const W_T *W, __global const SCALE_T *S,
                           int K) {
    const int c = get_global_id(0), n = get_global_id(1);
    const size_t base = (size_t)n * K + 8 * c;  // the first of the 8 values
#if WFMT == 0
    float8 v = vload8(0, W + base);
#elif WFMT == 1
    ((__global uint4 *)out)[base / 8] = ((__global const uint4 *)W)[base / 8];
    return;
#elif WFMT == 2
    float8 v = as_float8(convert_uint8(vload8(0, W + base)) << 16);
#elif WFMT == 5
    // (c % 4: values 0..7, 8..15 (low nibbles), 16..23, 24..31 of group c / 4)
    const uint8 r = kq_load(W, K, n, c / 4);
    uint4 lo, hi;
    kq_words(r, &lo, &hi);
    const float4 sc = kq_scales(r);
    const float2 sm = (c & 2) ? sc.zw : sc.xy;
    const float16 v16 = kq_values16((c & 2) ? hi : lo, sm.x, sm.y);
    float8 v = (c & 1) ? v16.hi : v16.lo;
#elif WFMT == 3
    const size_t gi = base / 32;  // the group; c % 4: which 8 bytes and which nibbles
    uchar8 q = as_uchar8(((__global const uint2 *)W)[2 * gi + (c & 1)]);
    q = (c & 2) ? q >> (uchar8)4 : q & (uchar8)15;
    const float2 dm = Q4_DM(S, gi);
    float8 v = convert_float8(q) * dm.x + dm.y;
#else
    float8 v = convert_float8(as_char8(((__global const uint2 *)W)[base / 8]));
#if QMIN
    v = qmin8(v, LOAD_SCALE(S, 2 * (base / QGROUP)), LOAD_SCALE(S, 2 * (base / QGROUP) + 1));
#else
    v *= LOAD_SCALE(S, base / QGROUP);
#endif
#endif
#if WFMT != 1
    ushort8 h;
    vstore_half8(v, 0, (__private half *)&h);
    ((__global ushort8 *)out)[base / 8] = h;
#endif
}

#if QROWS
// ---- int8 rows: a batch's rows meet q4/q8 weights as int8 (the batched engine) ----
// quantize_rows puts x's rows (after XMODE: 1 x * nw, and the rows' sums of squares in ss;
// 2 silu(gate) * up) into xq, xs as QX's prologue does (per block of 32 values q = round(v * 127
// / amax), (dx, dx * sum q), the same numbers), each row in its own place; matmul_qrows then
// reads each weight chunk once for TM rows. A row's sums are added in one order whatever M and
// its place in the batch: TM, LSIZE and the chunk order are the kernel's, not the batch's.
// quantize_rows: global (QR_LOCAL, M), local (QR_LOCAL, 1), a work-group a row.
#define QR_LOCAL 128
__kernel __attribute__((reqd_work_group_size(QR_LOCAL, 1, 1)))
void quantize_rows(__global const float *x, int x_off, int ldx, int M,
                   __global const float *nw, __global uint4 *xq, __global float2 *xs,
                   __global float *ss) {
    __local float red[QR_LOCAL];
    const int m = get_global_id(1), t = get_local_id(0);
    __global const float *xr = x + x_off + (size_t)m * ldx;
    __global uint4 *q_row = xq + (size_t)m * (QK / 16);
    float ssq = 0.0f;
    for (int b = t; b < NB; b += QR_LOCAL) {
        float4 v[8];
        for (int j = 0; j < 8; ++j) {
            const float4 raw = vload4(b * 8 + j, xr);
#if XMODE == 1
            ssq += dot(raw, raw);
            v[j] = raw * vload4(b * 8 + j, nw);
#elif XMODE == 2
            v[j] = glu4(raw, vload4(b * 8 + j, xr + QK));
#else
            v[j] = raw;
#endif
        }
        uint u[8];
        xs[(size_t)m * NB + b] = block_q8(v, u);
        q_row[XQI(b, 0)] = (uint4)(u[0], u[1], u[2], u[3]);
        q_row[XQI(b, 1)] = (uint4)(u[4], u[5], u[6], u[7]);
    }
#if XMODE == 1
    red[t] = ssq;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = QR_LOCAL / 2; h > 0; h >>= 1) {
        if (t < h) red[t] += red[t + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (t == 0) ss[m] = red[0];
#endif
}

// y[m, n] (+)= the int8 rows . W[n, :] (+ bias[n]); XMODE 1: times the row's 1/rms.
// Work geometry: global (ceil(N / (NCOL * CPT)) * NCOL * LSIZE, ceil(M / TM)), local
// (NCOL * LSIZE, 1). The arguments keep matmul's places for M (9), N and K. EXPERTS: a mixture
// of experts' grouped product (experts.cl), a tile of TM rows a work-group's rows.
__kernel __attribute__((reqd_work_group_size(LSIZE * NCOL, 1, 1)))
void matmul_qrows(__global float *y, int y_off, int ldy, __global const uint4 *xq,
                  __global const float2 *xs, __global const float *ss,
                  __global const W_T *W, __global const SCALE_T *S,
                  __global const float *bias, int M, int N, int K, float eps EXPERT_ARGS) {
    __local float red[RN2 * LSIZE * NCOL];
    // (EXPERTS: a work-group's rows are one tile, one expert's: a padding tile's leave together)
    TAKE_EXPERT(get_global_id(1));
    __local float *team = red + (get_local_id(0) / LSIZE) * RN2 * LSIZE;
    const int lid = get_local_id(0) % LSIZE;
    const int n = (get_group_id(0) * NCOL + get_local_id(0) / LSIZE) * CPT;
    const int m0 = get_global_id(1) * TM;
    // rows past M compute row M - 1 and store nothing; columns past N column N - 1
    int mi[TM];
    for (int i = 0; i < TM; ++i) mi[i] = min(m0 + i, M - 1);
    float r[RN2];
    for (int i = 0; i < RN; ++i) r[i] = 0.0f;
    for (int t = 0; t < STEPS; ++t) {
        const int c0 = lid + t * LSIZE * UNR;
        WQ_T wq[UNR][CPT];
        WS_T ws[UNR][CPT];
        load_step(t, lid, n, N, W, S, wq, ws);
#pragma unroll
        for (int u = 0; u < UNR; ++u) {
            const int c = c0 + u * LSIZE;
            if (c >= NCH) break;
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                __global const uint4 *xr = xq + (size_t)mi[i] * (QK / 16);
#if WFMT == 5
                const uint4 xl = xr[XQI(c, 0)], xh = xr[XQI(c, 1)];
                const float2 xd = xs[(size_t)mi[i] * NB + c];
#pragma unroll
                for (int j = 0; j < CPT; ++j)
                    r[i * CPT + j] = kq_dot(wq[u][j], xl, xh, xd, r[i * CPT + j]);
#elif WFMT == 3
                const uint4 xl = xr[XQI(c, 0)], xh = xr[XQI(c, 1)];
                const float2 xd = xs[(size_t)mi[i] * NB + c];
#pragma unroll
                for (int j = 0; j < CPT; ++j)
                    r[i * CPT + j] = fma(ws[u][j].x * xd.x, (float)q4_dot(wq[u][j], xl, xh),
                                         fma(ws[u][j].y, xd.y, r[i * CPT + j]));
#else
                const uint4 xv = xr[c];
                const float dx = xs[(size_t)mi[i] * NB + c / 2].x;
#pragma unroll
                for (int j = 0; j < CPT; ++j)
                    r[i * CPT + j] = fma(ws[u][j] * dx, (float)q8_dot(wq[u][j], xv),
                                         r[i * CPT + j]);
#endif
            }
        }
    }
#if XMODE == 1
    // the rows' sums of squares, whole, from the team's first work-item (finish adds the team)
    for (int i = 0; i < TM; ++i) r[RN + i] = lid == 0 ? ss[mi[i]] : 0.0f;
#endif
    finish(r, y, y_off, ldy, bias, M, N, K, n, m0, lid, team, eps);
}
#endif
