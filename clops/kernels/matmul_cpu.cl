// y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n]) on CPUs, W repacked at load (nn/quant.py,
// layout "rb16") so that one 16-wide vector load holds the same k of 16 consecutive rows: a
// work-item computes a block of 16 output columns for TM rows of x with 16-wide arithmetic
// and broadcasts of x, the weights streamed once, front to back.
//
// Compile-time parameters:
//   WFMT   0 float32, 1 float16, 2 bfloat16, 3 q4 (scale and min per 32), 4 q8 (a scale per
//          QGROUP values)
//   SCALE_HALF  1: q4/q8 scales stored as half; 0: as float
//   Q4_SYM 1 (q4): every min is -8 x its scale (Q4_0): only the scales are stored, S[b][g][16]
//   QGROUP 32 or 16 (q8)
//   QMIN   1 (q8): a (scale, min) pair per QGROUP values (Q5_1, Q5_K, Q2_K), value =
//          (q * scale) + min, each operation rounded on its own as GGUF rounds it
//   TM     rows of x per work-item (each weight vector meets TM rows from registers)
//   TM_DEQ quantized weights, TM >= TM_DEQ: dequantized once per vector for the TM rows;
//          TM < TM_DEQ: integer values meet x, the sums scaled per group (fewer operations
//          for one row; a row's sums then come out in another order)
//   HAS_BIAS, ACCUM  add bias[n]; add into y instead of overwriting
//   HW_FMA 1: the device has fused multiply-add (fma(); else mad())
//   LDX    the row stride of x as a constant (0: the argument ldx)
//   NBW    blocks of 16 columns per work-item, one after another
//   NBC    blocks of 16 columns per work-item at once (float formats): each x value loaded
//          meets them all; a column's sums come out in the same order whatever NBC
//   NORM   1: RMSNorm(x) * nw (eps) in place of x
//   GLU    1: W is [gate (N/2 rows) | up (N/2 rows)], N/2 a multiple of 16; y gets N/2 columns
//          silu(x . gate) * (x . up) (bias, where given, added to both before)
//   EXPERTS 1: a mixture of experts' grouped product (experts.cl); not with GLU
// M >= TM: the last tile of rows ends at row M - 1.
//
// Layouts (N padded to a multiple of 16 with zero rows; block b holds rows 16b .. 16b + 15;
// entries [.][16] are the 16 rows of the block):
//   float: W[b][k][16]
//   q4:    W uchar[b][g][j][16] for group g (32 values) and j < 16: row r's byte holds value
//          j (low nibble) and value j + 16 (high nibble) of its group; S[b][g][2][16]: the
//          scales, then the mins (value = q * scale + min); Q4_SYM: S[b][g][16], the scales
//          (value = (q - 8) * scale, 18 bytes per 32 values as the file's, not 20)
//   q8:    W char[b][k][16]; S[b][k / QGROUP][16] (value = q * scale); QMIN:
//          S[b][k / QGROUP][2][16], the scales, then the mins (value = (q * scale) + min)
// Work geometry: global (ceil(M / TM), ceil(NOUT / (16 * NBW))), local (1, 1): one work-item
// per group, so that the compiler does not vectorize across work-items (its loads would become
// gathers).

#ifndef TM
#define TM 1
#endif
#ifndef LDX
#define LDX 0
#endif
#ifndef NBW
#define NBW 1
#endif
#ifndef NBC
#define NBC 1
#endif
#if NBC > 1 && (WFMT > 2 || NBW > 1)
#error "NBC takes float weights and NBW 1"
#endif
#ifndef NORM
#define NORM 0
#endif
#ifndef GLU
#define GLU 0
#endif
#if GLU
#define NOUT (N / 2)
#else
#define NOUT N
#endif
#if NORM
// x * nw of the current 32 values (k0 .. k0 + 31, k0 a multiple of 32), made once per group
// into xn (NORM_GROUP): the inner loops read it as they read x
#define NORM_GROUP(k0)                                                                    \
    _Pragma("unroll") for (int i = 0; i < TM; ++i) {                                     \
        vstore16(vload16(0, xr[i] + (k0)) * vload16(0, nw + (k0)), 0, xn[i]);             \
        vstore16(vload16(1, xr[i] + (k0)) * vload16(1, nw + (k0)), 1, xn[i]);             \
    }
#define XV(i, k) (xn[i][(k) & 31])
#define XV16(i, k) vload16(0, xn[i] + ((k) & 31))
#else
#define NORM_GROUP(k0)
#define XV(i, k) (xr[i][k])
#define XV16(i, k) vload16(0, xr[i] + (k))
#endif

#include "clops/vec.cl"  // hsum16
#ifndef TM_DEQ
#define TM_DEQ 4
#endif
#ifndef Q4_SYM
#define Q4_SYM 0
#endif
#include "clops/formats.cl"  // QGROUP, QMIN; W_T, SCALE_T, LOAD16_SCALE
#if QMIN && WFMT != 4
#error "QMIN takes q8 weights"
#endif
#include "clops/experts.cl"
#if EXPERTS && GLU
#error "EXPERTS takes no GLU"
#endif
// q4: the scales of block b (G groups), and group g's scales and mins as 16-wide vectors
#if Q4_SYM
#define Q4_SCALES_OF(b, G) (S + (size_t)(b) * (G) * 16)
#define Q4_D(g, sb) LOAD16_SCALE((g), (sb))
#define Q4_MIN(g, sb) (LOAD16_SCALE((g), (sb)) * -8.0f)
#else
#define Q4_SCALES_OF(b, G) (S + (size_t)(b) * (G) * 32)
#define Q4_D(g, sb) LOAD16_SCALE(2 * (g), (sb))
#define Q4_MIN(g, sb) LOAD16_SCALE(2 * (g) + 1, (sb))
#endif

// the 16 rows' values at position i of the block's stream (float formats)
#if WFMT == 0
#define LOADW(p, i) vload16((i), (p))
#elif WFMT == 1
#define LOADW(p, i) vload_half16((i), (__global const half *)(p))
#elif WFMT == 2
#define LOADW(p, i) as_float16(convert_uint16(vload16((i), (p))) << 16)
#endif

// PERF: fused multiply-adds where the device has them (mad() compiles to a multiply and an
// add on PoCL: q4 and q8 products of one row 15-20% slower)
#if HW_FMA
#define FMA(a, b, c) fma((a), (b), (c))
#else
#define FMA(a, b, c) mad((a), (b), (c))
#endif

#if QMIN
// (q * d) + mn and a + ((t * d) + (sx * mn)), each operation rounded on its own as GGUF's
// dequantization rounds it (matmul.cl's qmin16 says why this holds with fused ones too)
inline float16 qmin16(float16 q, float16 d, float16 mn) {
#pragma OPENCL FP_CONTRACT OFF
    return q * d + mn;
}
inline float16 qmin_acc(float16 a, float16 t, float16 d, float sx, float16 mn) {
#pragma OPENCL FP_CONTRACT OFF
    return a + (t * d + sx * mn);
}
#endif

__kernel void matmul_rb(__global float *y, int y_off, int ldy,
                        __global const float *x, int x_off, int ldx,
                        __global const W_T *W, __global const SCALE_T *S,
                        __global const float *bias, int M, int N, int K,
                        __global const float *nw, float eps EXPERT_ARGS) {
    // the last tile of rows ends at row M - 1 (it may share rows with the one before, which
    // compute the same sums; only the rows past the tile before are stored): every tile is
    // whole (needs M >= TM), so that x's rows lie LDX apart from one pointer
    const int first = get_global_id(0) * TM, m0 = min(first, M - TM);
    TAKE_EXPERT(get_global_id(0));
#if LDX
    const int ldx_ = LDX;  // a constant: the rows' loads take immediate offsets
#else
    const int ldx_ = ldx;
#endif
    __global const float *x0 = x + x_off + (size_t)m0 * ldx_;
    __global const float *xr[TM];
    #pragma unroll
    for (int i = 0; i < TM; ++i) xr[i] = x0 + i * ldx_;
#if NORM
    // RMSNorm folded in: the sums meet x * nw and are scaled by each row's 1 / rms
    float inv_rms[TM];
    #pragma unroll
    for (int i = 0; i < TM; ++i) {
        float16 ss = (float16)(0.0f);
        for (int k = 0; k < K; k += 16) {
            const float16 v = vload16(0, xr[i] + k);
            ss = FMA(v, v, ss);
        }
        inv_rms[i] = rsqrt(hsum16(ss) / K + eps);
    }
    float xn[TM][32];
#endif
    // PERF: NBW blocks of columns one after another (fewer work-groups to schedule)
    for (int bi = 0; bi < NBW; ++bi) {
    // the first block of output columns (of NBC), and the last there is
    const int bo = (get_global_id(1) * NBW + bi) * NBC, last_bo = (NOUT + 15) / 16 - 1;
    if (bo > last_bo) return;
    // acc[c * TM + i]: block bo + c, row m0 + i
    float16 acc[NBC * TM], acc2[NBC * TM];
    for (int part = 0; part <= GLU; ++part) {
    // the block of weight rows (GLU: the gate's, then the up's)
    const int b = bo + part * (N / 32);
    // PERF: two sums per row (even and odd steps, or low and high nibbles), so that FMAs in
    // flight do not wait on each other; added at the end, the same way for every TM
    #pragma unroll
    for (int i = 0; i < NBC * TM; ++i) acc[i] = acc2[i] = (float16)(0.0f);

#if WFMT == 3 && TM >= TM_DEQ
    // several rows of x (prompts): the weights are dequantized once and meet TM rows
    const int G = K / 32;
    __global const uchar *wb = W + (size_t)b * G * 256;
    __global const SCALE_T *sb = Q4_SCALES_OF(b, G);
    for (int g = 0; g < G; ++g) {
        NORM_GROUP(g * 32)
        __global const uchar *wg = wb + g * 256;
        const float16 d = Q4_D(g, sb), mn = Q4_MIN(g, sb);
        for (int j = 0; j < 16; ++j) {
            const uchar16 q = vload16(j, wg);
            const float16 lo = FMA(convert_float16(q & (uchar16)15), d, mn);
            const float16 hi = FMA(convert_float16(q >> (uchar16)4), d, mn);
            #pragma unroll
            for (int i = 0; i < TM; ++i) {
                acc[i] = FMA(lo, (float16)XV(i, g * 32 + j), acc[i]);
                acc2[i] = FMA(hi, (float16)XV(i, g * 32 + 16 + j), acc2[i]);
            }
        }
    }
#elif WFMT == 3
    // one row (decode): the integer values meet x, their sums scaled once per group; four
    // sums in flight per row
    const int G = K / 32;
    __global const uchar *wb = W + (size_t)b * G * 256;
    __global const SCALE_T *sb = Q4_SCALES_OF(b, G);
    for (int g = 0; g < G; ++g) {
        NORM_GROUP(g * 32)
        float16 t0[TM], t1[TM], t2[TM], t3[TM];
        #pragma unroll
        for (int i = 0; i < TM; ++i) t0[i] = t1[i] = t2[i] = t3[i] = (float16)(0.0f);
        __global const uchar *wg = wb + g * 256;
        for (int j = 0; j < 16; j += 2) {
            const uchar16 q0 = vload16(j, wg), q1 = vload16(j + 1, wg);
            const float16 l0 = convert_float16(q0 & (uchar16)15);
            const float16 h0 = convert_float16(q0 >> (uchar16)4);
            const float16 l1 = convert_float16(q1 & (uchar16)15);
            const float16 h1 = convert_float16(q1 >> (uchar16)4);
            #pragma unroll
            for (int i = 0; i < TM; ++i) {
                const int k = g * 32 + j;
                t0[i] = FMA(l0, (float16)XV(i, k), t0[i]);
                t1[i] = FMA(h0, (float16)XV(i, k + 16), t1[i]);
                t2[i] = FMA(l1, (float16)XV(i, k + 1), t2[i]);
                t3[i] = FMA(h1, (float16)XV(i, k + 17), t3[i]);
            }
        }
        const float16 d = Q4_D(g, sb), mn = Q4_MIN(g, sb);
        #pragma unroll
        for (int i = 0; i < TM; ++i) {
            // the mins meet the sum of the group's 32 x values
            const float sx = hsum16(XV16(i, g * 32) + XV16(i, g * 32 + 16));
            acc[i] = FMA(d, (t0[i] + t1[i]) + (t2[i] + t3[i]), FMA(mn, (float16)sx, acc[i]));
        }
    }
#elif WFMT == 4 && TM >= TM_DEQ
    const int G = K / QGROUP;
    __global const char *wb = W + (size_t)b * K * 16;
    __global const SCALE_T *sb = S + (size_t)b * G * 16 * (1 + QMIN);
    for (int g = 0; g < G; ++g) {
        if ((g * QGROUP) % 32 == 0) { NORM_GROUP(g * QGROUP) }
#if QMIN
        const float16 d = LOAD16_SCALE(2 * g, sb), mn = LOAD16_SCALE(2 * g + 1, sb);
#else
        const float16 d = LOAD16_SCALE(g, sb);
#endif
        for (int j = 0; j < QGROUP; j += 2) {
            const int k = g * QGROUP + j;
#if QMIN
            const float16 w0 = qmin16(convert_float16(vload16(k, wb)), d, mn);
            const float16 w1 = qmin16(convert_float16(vload16(k + 1, wb)), d, mn);
#else
            const float16 w0 = convert_float16(vload16(k, wb)) * d;
            const float16 w1 = convert_float16(vload16(k + 1, wb)) * d;
#endif
            #pragma unroll
            for (int i = 0; i < TM; ++i) {
                acc[i] = FMA(w0, (float16)XV(i, k), acc[i]);
                acc2[i] = FMA(w1, (float16)XV(i, k + 1), acc2[i]);
            }
        }
    }
#elif WFMT == 4
    const int G = K / QGROUP;
    __global const char *wb = W + (size_t)b * K * 16;
    __global const SCALE_T *sb = S + (size_t)b * G * 16 * (1 + QMIN);
    for (int g = 0; g < G; ++g) {
        if ((g * QGROUP) % 32 == 0) { NORM_GROUP(g * QGROUP) }
        float16 t0[TM], t1[TM], t2[TM], t3[TM];
        #pragma unroll
        for (int i = 0; i < TM; ++i) t0[i] = t1[i] = t2[i] = t3[i] = (float16)(0.0f);
        for (int j = 0; j < QGROUP; j += 4) {
            const int k = g * QGROUP + j;
            const float16 q0 = convert_float16(vload16(k, wb));
            const float16 q1 = convert_float16(vload16(k + 1, wb));
            const float16 q2 = convert_float16(vload16(k + 2, wb));
            const float16 q3 = convert_float16(vload16(k + 3, wb));
            #pragma unroll
            for (int i = 0; i < TM; ++i) {
                t0[i] = FMA(q0, (float16)XV(i, k), t0[i]);
                t1[i] = FMA(q1, (float16)XV(i, k + 1), t1[i]);
                t2[i] = FMA(q2, (float16)XV(i, k + 2), t2[i]);
                t3[i] = FMA(q3, (float16)XV(i, k + 3), t3[i]);
            }
        }
#if QMIN
        // the mins meet the sum of the group's x values
        const float16 d = LOAD16_SCALE(2 * g, sb), mn = LOAD16_SCALE(2 * g + 1, sb);
        #pragma unroll
        for (int i = 0; i < TM; ++i) {
#if QGROUP == 32
            const float sx = hsum16(XV16(i, g * 32) + XV16(i, g * 32 + 16));
#else
            const float sx = hsum16(XV16(i, g * QGROUP));
#endif
            acc[i] = qmin_acc(acc[i], (t0[i] + t1[i]) + (t2[i] + t3[i]), d, sx, mn);
        }
#else
        const float16 d = LOAD16_SCALE(g, sb);
        #pragma unroll
        for (int i = 0; i < TM; ++i) acc[i] = FMA(d, (t0[i] + t1[i]) + (t2[i] + t3[i]), acc[i]);
#endif
    }
#else
    // PERF (2-core EPYC, Intel's runtime, f16 16384x2048 with 64 rows): NBC 2 with TM 4, 401
    // GFLOP/s, where TM 8 one block at a time made 329: one x load for two FMAs
    __global const W_T *wb[NBC];  // (a block past the last reads the last, stores nothing)
    #pragma unroll
    for (int c = 0; c < NBC; ++c)
        wb[c] = W + (size_t)(min(bo + c, last_bo) + part * (N / 32)) * K * 16;
    for (int k0 = 0; k0 < K; k0 += 32) {
        NORM_GROUP(k0)
        for (int j = 0; j < 32; j += 2) {
            float16 w0[NBC], w1[NBC];
            #pragma unroll
            for (int c = 0; c < NBC; ++c) {
                w0[c] = LOADW(wb[c], k0 + j);
                w1[c] = LOADW(wb[c], k0 + j + 1);
            }
            #pragma unroll
            for (int i = 0; i < TM; ++i) {
                const float16 x0 = (float16)XV(i, k0 + j), x1 = (float16)XV(i, k0 + j + 1);
                #pragma unroll
                for (int c = 0; c < NBC; ++c) {
                    acc[c * TM + i] = FMA(w0[c], x0, acc[c * TM + i]);
                    acc2[c * TM + i] = FMA(w1[c], x1, acc2[c * TM + i]);
                }
            }
        }
    }
#endif
    #pragma unroll
    for (int q = 0; q < NBC * TM; ++q) {
        acc[q] += acc2[q];
#if NORM
        acc[q] *= inv_rms[q % TM];
#endif
    }
    #pragma unroll
    for (int c = 0; c < NBC; ++c) {
        if (bo + c > last_bo) break;  // (constant indices: acc stays in registers)
#if HAS_BIAS
        {
            const int nb = (b + c) * 16;  // (GLU: N is a multiple of 32, no partial block)
            float16 bv;
            if (nb + 16 <= N) {
                bv = vload16(0, bias + nb);
            } else {
                float tmp[16];
                for (int r = 0; r < 16; ++r) tmp[r] = nb + r < N ? bias[nb + r] : 0.0f;
                bv = vload16(0, tmp);
            }
            #pragma unroll
            for (int i = 0; i < TM; ++i) acc[c * TM + i] += bv;
        }
#endif
#if GLU
        // PERF: the gate's sums wait in y (registers held them: spilled with 8 rows)
        #pragma unroll
        for (int i = 0; i < TM; ++i) {
            if (m0 + i < first) continue;  // the tile before has this row
            __global float *yp = y + y_off + (size_t)(m0 + i) * ldy + (bo + c) * 16;
            if (part == 0) {
                vstore16(acc[c * TM + i], 0, yp);
            } else {
                const float16 g = vload16(0, yp);
                acc[c * TM + i] *= g / (1.0f + exp(-g));  // silu(gate) * up
            }
        }
#endif
    }
    }  // (the parts)

    #pragma unroll
    for (int c = 0; c < NBC; ++c) {
    if (bo + c > last_bo) break;
    const int n0 = (bo + c) * 16, NO = NOUT;
    #pragma unroll
    for (int i = 0; i < TM; ++i) {
        if (m0 + i < first) continue;  // the tile before stores this row
        __global float *yp = y + y_off + (size_t)(m0 + i) * ldy + n0;
        const float16 a = acc[c * TM + i];
        if (n0 + 16 <= NO) {
#if ACCUM
            vstore16(vload16(0, yp) + a, 0, yp);
#else
            vstore16(a, 0, yp);
#endif
        } else {
            float tmp[16];
            vstore16(a, 0, tmp);
            for (int r = 0; r < 16 && n0 + r < NO; ++r) {
#if ACCUM
                yp[r] += tmp[r];
#else
                yp[r] = tmp[r];
#endif
            }
        }
    }
    }
    }
}

// out[m, :] = row ids[m] of the table W (layout rb16, any WFMT), dequantized to float32. ids
// come from tokens[state[0] + m]. Work geometry: global (K / 32, M).
__kernel void embedding_rb(__global float *out, __global const int *tokens,
                           __global const int *state, __global const W_T *W,
                           __global const SCALE_T *S, int K, int vocab) {
    const int g = get_global_id(0), m = get_global_id(1);
    const int id = clamp(tokens[state[0] + m], 0, vocab - 1);
    const int b = id / 16, r = id % 16;
    __global float *o = out + (size_t)m * K + g * 32;
#if WFMT == 3
    __global const uchar *wg = W + ((size_t)b * (K / 32) + g) * 256;
#if Q4_SYM
    __global const SCALE_T *sg = S + ((size_t)b * (K / 32) + g) * 16;
#else
    __global const SCALE_T *sg = S + ((size_t)b * (K / 32) + g) * 32;
#endif
#if SCALE_HALF
    const float d = vload_half(r, sg);
#else
    const float d = sg[r];
#endif
#if Q4_SYM
    const float mn = d * -8.0f;
#elif SCALE_HALF
    const float mn = vload_half(16 + r, sg);
#else
    const float mn = sg[16 + r];
#endif
    for (int j = 0; j < 16; ++j) {
        const uchar q = wg[j * 16 + r];
        o[j] = (q & 15) * d + mn;
        o[j + 16] = (q >> 4) * d + mn;
    }
#elif WFMT == 4 && QMIN
    __global const char *wb = W + (size_t)b * K * 16;
    __global const SCALE_T *sb = S + (size_t)b * (K / QGROUP) * 32;
    for (int j = 0; j < 32; j += 16) {
        const int k = g * 32 + j, gi = k / QGROUP;
#if SCALE_HALF
        const float d = vload_half(gi * 32 + r, sb), mn = vload_half(gi * 32 + 16 + r, sb);
#else
        const float d = sb[gi * 32 + r], mn = sb[gi * 32 + 16 + r];
#endif
        float q[16];
        for (int t = 0; t < 16; ++t) q[t] = wb[(size_t)(k + t) * 16 + r];
        vstore16(qmin16(vload16(0, q), (float16)d, (float16)mn), 0, o + j);
    }
#elif WFMT == 4
    __global const char *wb = W + (size_t)b * K * 16;
    __global const SCALE_T *sb = S + (size_t)b * (K / QGROUP) * 16;
    for (int j = 0; j < 32; ++j) {
        const int k = g * 32 + j;
#if SCALE_HALF
        const float d = vload_half((k / QGROUP) * 16 + r, sb);
#else
        const float d = sb[(k / QGROUP) * 16 + r];
#endif
        o[j] = wb[(size_t)k * 16 + r] * d;
    }
#else
    __global const W_T *wb = W + (size_t)b * K * 16;
    for (int j = 0; j < 32; ++j) {
        const size_t i = (size_t)(g * 32 + j) * 16 + r;
#if WFMT == 0
        o[j] = wb[i];
#elif WFMT == 1
        o[j] = vload_half(i, (__global const half *)wb);
#else
        o[j] = as_float((uint)wb[i] << 16);
#endif
    }
#endif
}
