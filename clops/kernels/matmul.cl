// y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n]) for float, half, bfloat16 and block-quantized W.
//
// Compile-time parameters:
//   WFMT   0 float32, 1 float16, 2 bfloat16, 3 "q4" (4-bit, scale and min per 32), 4 "q8" (int8,
//          a scale per QGROUP values)
//   SCALE_HALF  1: q4/q8 scales are stored as half (exact for Q4_0/Q4_1/Q8_0), 0: as float
//   QGROUP 32 or 16 (q8 only: Q6_K has a scale per 16 values)
//   TM     rows of x per work-item: the dequantized weights are reused TM times from registers
//   LSIZE  work-items that split K for one output column (1 on CPUs; 32..128 on GPUs)
//   ROWS   output columns per work-item, one after another (CPUs: fewer, longer work-items)
//   HAS_BIAS, ACCUM  add bias[n]; add into y instead of overwriting (residual connections)
//
// Layouts (row n of W is K values, K a multiple of 32):
//   q4: qs uchar[N][K/2]; in each 32-value group, byte j holds value j (low nibble) and value
//       j+16 (high nibble). sm: (scale, min) pairs per group, value = q * scale + min.
//   q8: qs char[N][K]; sc: one scale per QGROUP values, value = q * scale.
// Work geometry: global (ceil(N / ROWS) * LSIZE, ceil(M / TM)), local (LSIZE, 1).

#ifndef TM
#define TM 1
#endif
#ifndef LSIZE
#define LSIZE 1
#endif
#ifndef QGROUP
#define QGROUP 32
#endif
#ifndef ROWS
#define ROWS 1
#endif

#if SCALE_HALF
#define LOAD_SCALE(p, i) vload_half((i), (p))
#define SCALE_T half
#else
#define LOAD_SCALE(p, i) ((p)[i])
#define SCALE_T float
#endif

#if WFMT == 0
#define W_T float
#elif WFMT == 1 || WFMT == 2
#define W_T ushort
#elif WFMT == 3
#define W_T uchar
#else
#define W_T char
#endif

inline float4 bf16x4(ushort4 v) {
    return as_float4(convert_uint4(v) << 16);
}

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
#elif WFMT == 3
    size_t gi = (size_t)n * (K / 32) + g;
    uchar16 q = vload16(0, W + gi * 16);
    float d = LOAD_SCALE(S, 2 * gi), mn = LOAD_SCALE(S, 2 * gi + 1);
    float16 lo = convert_float16(q & (uchar16)15) * d + mn;
    float16 hi = convert_float16(q >> (uchar16)4) * d + mn;
    w[0] = lo.s0123; w[1] = lo.s4567; w[2] = lo.s89ab; w[3] = lo.scdef;
    w[4] = hi.s0123; w[5] = hi.s4567; w[6] = hi.s89ab; w[7] = hi.scdef;
#else
    size_t base = (size_t)n * K + g * 32;
    float16 a = convert_float16(vload16(0, W + base));
    float16 b = convert_float16(vload16(1, W + base));
#if QGROUP == 32
    float d0 = LOAD_SCALE(S, base / 32), d1 = d0;
#else
    float d0 = LOAD_SCALE(S, base / 16), d1 = LOAD_SCALE(S, base / 16 + 1);
#endif
    a *= d0; b *= d1;
    w[0] = a.s0123; w[1] = a.s4567; w[2] = a.s89ab; w[3] = a.scdef;
    w[4] = b.s0123; w[5] = b.s4567; w[6] = b.s89ab; w[7] = b.scdef;
#endif
}

inline void matmul_column(__global float *y, int y_off, int ldy,
                          __global const float *x, int x_off, int ldx,
                          __global const W_T *W, __global const SCALE_T *S,
                          __global const float *bias, int M, int N, int K, int n, int lid,
                          __local float *red) {
    const int m0 = get_global_id(1) * TM;
    const int groups = K / 32;
    float4 acc[TM];
    for (int i = 0; i < TM; ++i) acc[i] = (float4)(0.0f);
    __global const float *xr[TM];
    for (int i = 0; i < TM; ++i) xr[i] = x + x_off + (size_t)min(m0 + i, M - 1) * ldx;

    for (int g = lid; g < groups; g += LSIZE) {
        float4 w[8];
        load_group(W, S, K, n, g, w);
        for (int i = 0; i < TM; ++i) {
            __global const float *xp = xr[i] + g * 32;
            float4 a = acc[i];
            for (int j = 0; j < 8; ++j) a = mad(vload4(j, xp), w[j], a);
            acc[i] = a;
        }
    }
    float r[TM];
    for (int i = 0; i < TM; ++i) r[i] = acc[i].x + acc[i].y + acc[i].z + acc[i].w;

#if LSIZE > 1
    for (int i = 0; i < TM; ++i) red[i * LSIZE + lid] = r[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LSIZE / 2; s > 0; s >>= 1) {
        if (lid < s)
            for (int i = 0; i < TM; ++i) red[i * LSIZE + lid] += red[i * LSIZE + lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid != 0) return;
    for (int i = 0; i < TM; ++i) r[i] = red[i * LSIZE];
#endif

#if HAS_BIAS
    const float b = bias[n];
#else
    const float b = 0.0f;
#endif
    for (int i = 0; i < TM; ++i) {
        if (m0 + i >= M) break;
        __global float *yp = y + y_off + (size_t)(m0 + i) * ldy + n;
#if ACCUM
        *yp += r[i] + b;
#else
        *yp = r[i] + b;
#endif
    }
}

__kernel void matmul(__global float *y, int y_off, int ldy,
                     __global const float *x, int x_off, int ldx,
                     __global const W_T *W, __global const SCALE_T *S,
                     __global const float *bias, int M, int N, int K) {
    __local float red[TM * LSIZE];
    // NOTE: from the global id, so that with LSIZE 1 the driver may pick any local size.
    const int c = get_global_id(0) / LSIZE;
    const int lid = get_global_id(0) % LSIZE;
    for (int r = 0; r < ROWS; ++r) {
        const int n = c * ROWS + r;
        if (n >= N) return;
        matmul_column(y, y_off, ldy, x, x_off, ldx, W, S, bias, M, N, K, n, lid, red);
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
