// Row normalizations over the last axis: RMSNorm and LayerNorm, float32; the float16 rows that
// tensor-core products read (half_rows), and the sums of split products' slices (split_sum,
// split_norm_half).
//   LSIZE  work-items per row (1 on CPUs); the row's sums are reduced in local memory.
// Work geometry: global (M * LSIZE), local (LSIZE), unless a kernel says otherwise.

#ifndef LSIZE
#define LSIZE 1
#endif

inline float2 row_sums(__global const float *xr, int K, int lid, __local float2 *red) {
    float2 s = (float2)(0.0f);
    for (int k = lid; k < K; k += LSIZE) {
        float v = xr[k];
        s += (float2)(v, v * v);
    }
#if LSIZE > 1
    red[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = LSIZE / 2; h > 0; h >>= 1) {
        if (lid < h) red[lid] += red[lid + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    s = red[0];
#endif
    return s;
}

// The sum of v over the work-group (a row's LSIZE work-items), in every one of them.
inline float row_total(float v, __local float *red, int lid) {
#if LSIZE > 1
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = LSIZE / 2; h > 0; h >>= 1) {
        if (lid < h) red[lid] += red[lid + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    v = red[0];
#endif
    return v;
}

// y = x / sqrt(mean(x^2) + eps) * w. x rows are ldx apart, y rows K apart.
__kernel void rmsnorm(__global float *y, __global const float *x, int x_off, int ldx,
                      __global const float *w, int K, float eps) {
    __local float2 red[LSIZE];
    const int m = get_global_id(0) / LSIZE, lid = get_global_id(0) % LSIZE;
    __global const float *xr = x + x_off + (size_t)m * ldx;
    float2 s = row_sums(xr, K, lid, red);
    float r = rsqrt(s.y / K + eps);
    __global float *yr = y + (size_t)m * K;
    for (int k = lid; k < K; k += LSIZE) yr[k] = xr[k] * r * w[k];
}

// QK-norm, in place: RMSNorm of the query and key groups of projected rows [q | k | v] (rows ld
// apart): nq groups of lq values (weight wq [lq]), then groups of lk values (weight wk [lk]).
// Work geometry: global (groups * LSIZE, M), local (LSIZE, 1).
__kernel void qk_norm(__global float *x, int ld, int nq, int lq, int lk,
                      __global const float *wq, __global const float *wk, float eps) {
    __local float2 red[LSIZE];
    const int g = get_group_id(0), lid = get_local_id(0), m = get_global_id(1);
    const bool isq = g < nq;
    const int K = isq ? lq : lk;
    __global float *xr = x + (size_t)m * ld + (isq ? g * lq : nq * lq + (g - nq) * lk);
    __global const float *w = isq ? wq : wk;
    float2 s = row_sums(xr, K, lid, red);
    float r = rsqrt(s.y / K + eps);
    for (int k = lid; k < K; k += LSIZE) xr[k] = xr[k] * r * w[k];
}

// The residual add of a block's output t [M][K]: x += scale * t, or with a post-norm (NORM 1)
// x += scale * rmsnorm(t) * w. Work geometry: global (M * LSIZE), local (LSIZE).
__kernel void residual(__global float *x, __global const float *t, __global const float *w,
                       int K, float eps, float scale, int norm) {
    __local float2 red[LSIZE];
    const int m = get_global_id(0) / LSIZE, lid = get_global_id(0) % LSIZE;
    __global const float *tr = t + (size_t)m * K;
    __global float *xr = x + (size_t)m * K;
    float r = 1.0f;
    if (norm) {  // the same for the whole work-group
        float2 s = row_sums(tr, K, lid, red);
        r = rsqrt(s.y / K + eps);
    }
    for (int k = lid; k < K; k += LSIZE) {
        float v = norm ? tr[k] * r * w[k] : tr[k];
        xr[k] += v * scale;
    }
}

// y = (x - mean) / sqrt(var + eps) * w + b.
__kernel void layernorm(__global float *y, __global const float *x, int x_off, int ldx,
                        __global const float *w, __global const float *b, int K, float eps) {
    __local float2 red[LSIZE];
    const int m = get_global_id(0) / LSIZE, lid = get_global_id(0) % LSIZE;
    __global const float *xr = x + x_off + (size_t)m * ldx;
    float2 s = row_sums(xr, K, lid, red);
    float mean = s.x / K;
    // NOTE: a second pass for the variance: E[x^2] - mean^2 loses digits on offset rows.
    float v = 0.0f;
    for (int k = lid; k < K; k += LSIZE) { float d = xr[k] - mean; v += d * d; }
#if LSIZE > 1
    barrier(CLK_LOCAL_MEM_FENCE);
    red[lid] = (float2)(v, 0.0f);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = LSIZE / 2; h > 0; h >>= 1) {
        if (lid < h) red[lid] += red[lid + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    v = red[0].x;
#endif
    float r = rsqrt(v / K + eps);
    __global float *yr = y + (size_t)m * K;
    for (int k = lid; k < K; k += LSIZE) yr[k] = (xr[k] - mean) * r * w[k] + b[k];
}

// y[m, :] = float16 of a row of x, with a prologue: MODE 0 none, 1 RMSNorm (as rmsnorm, weight
// w), 2 silu(x[m, k]) * x[m, K + k] (rows [gate | up] of a gated MLP). The float16 rows feed
// tensor-core products (gemm.cl gemm_nt_mma). y rows are K apart; K a multiple of 4.
// A work-item takes float4s lid, lid + LSIZE, ... in rounds of NV, a round's loads all issued
// before their use (one trip to memory a round, not one a float4).
#ifndef MODE
#define MODE 0
#endif
#ifndef NV
#define NV 1
#endif
__kernel void half_rows(__global half *y, __global const float *x, int x_off, int ldx,
                        __global const float *w, int K, float eps) {
    const int m = get_global_id(0) / LSIZE, lid = get_global_id(0) % LSIZE, K4 = K / 4;
    __global const float *xr = x + x_off + (size_t)m * ldx;
    __global half *yr = y + (size_t)m * K;
    float4 v[NV];
#if MODE == 1
    __local float red[LSIZE];
    float ss = 0.0f;
    for (int k0 = lid; k0 < K4; k0 += NV * LSIZE) {
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const int k = k0 + i * LSIZE;
            v[i] = k < K4 ? vload4(k, xr) : (float4)(0.0f);
        }
#pragma unroll
        for (int i = 0; i < NV; ++i) ss += dot(v[i], v[i]);
    }
    const float r = rsqrt(row_total(ss, red, lid) / K + eps);
#endif
    for (int k0 = lid; k0 < K4; k0 += NV * LSIZE) {
#if MODE
        float4 u[NV];  // the norm's weights, or the GLU's up values
#endif
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const int k = min(k0 + i * LSIZE, K4 - 1);
            v[i] = vload4(k, xr);
#if MODE == 2
            u[i] = vload4(k, xr + K);
#elif MODE == 1
            u[i] = vload4(k, w);
#endif
        }
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const int k = k0 + i * LSIZE;
            if (k < K4) {
#if MODE == 1
                vstore_half4(v[i] * r * u[i], k, yr);
#elif MODE == 2
                vstore_half4(v[i] / (1.0f + exp(-v[i])) * u[i], k, yr);
#else
                vstore_half4(v[i], k, yr);
#endif
            }
        }
    }
}

// v + slices s .. s + n of the float4 k, in order, their loads issued together (n a constant,
// 8 at most)
inline float4 slices_add(float4 v, __global const float *p, size_t slice, int s, int k,
                         const int n) {
    float4 a[8];
#pragma unroll
    for (int u = 0; u < n; ++u) a[u] = vload4(k, p + (s + u) * slice);
#pragma unroll
    for (int u = 0; u < n; ++u) v += a[u];
    return v;
}

// The split tensor-core products' partial sums (gemm.cl gemm_nt_mma and gemm_nt_wgmma with
// SPLIT > 1: P [S][M][N], slices of M * N floats): the float4 k of row p's sum over the slices,
// in order, the loads of 8 slices (then of 4) issued before their use (a loop of one load and
// its use waits a trip to memory a slice).
inline float4 slices_sum4(__global const float *p, size_t slice, int S, int k) {
    float4 v = (float4)(0.0f);
    int s = 0;
    for (; s + 8 <= S; s += 8) v = slices_add(v, p, slice, s, k, 8);
    if (s + 4 <= S) {  // (a product split in 4: its loads issued together too)
        v = slices_add(v, p, slice, s, k, 4);
        s += 4;
    }
    for (; s < S; ++s) v += vload4(k, p + s * slice);
    return v;
}

// HAS_BIAS, ACCUM (split_sum): add bias[n]; add into C instead of overwriting.
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef ACCUM
#define ACCUM 0
#endif
// C[m, n] (+)= sum over s < S, in order, of P[s][m][n] (+ bias[n]): a split product's end. A
// work-item takes 4 columns. N a multiple of 4. Work geometry: global (N / 4, M).
__kernel void split_sum(__global float *C, int c_off, int ldc, __global const float *P, int S,
                        __global const float *bias) {
    const int n = get_global_id(0), m = get_global_id(1);
    const int N = 4 * get_global_size(0), M = get_global_size(1);
    float4 v = slices_sum4(P + (size_t)m * N, (size_t)M * N, S, n);
#if HAS_BIAS
    v += vload4(n, bias);
#endif
    __global float *c = C + c_off + (size_t)m * ldc;
#if ACCUM
    v += vload4(n, c);
#endif
    vstore4(v, n, c);
}

// A split product's end and the next one's start in one pass: x[m, :] += the sum, in order, of
// the slices P[s][m][:] (s < S; P [S][M][K]; as split_sum with ACCUM), then y[m, :] = float16
// of RMSNorm(x[m, :]) * w (as half_rows MODE 1; y rows K apart). K a multiple of 4.
// Work geometry: global (M * LSIZE), local (LSIZE).
__kernel void split_norm_half(__global float *x, int x_off, int ldx, __global const float *P,
                              int S, __global half *y, __global const float *w, int K,
                              float eps) {
    __local float red[LSIZE];
    const int m = get_global_id(0) / LSIZE, lid = get_global_id(0) % LSIZE, K4 = K / 4;
    const size_t slice = (size_t)(get_global_size(0) / LSIZE) * K;
    __global float *xr = x + x_off + (size_t)m * ldx;
    float ss = 0.0f;
    for (int k = lid; k < K4; k += LSIZE) {
        const float4 v = slices_sum4(P + (size_t)m * K, slice, S, k) + vload4(k, xr);
        vstore4(v, k, xr);
        ss += dot(v, v);
    }
    const float r = rsqrt(row_total(ss, red, lid) / K + eps);
    __global half *yr = y + (size_t)m * K;
    for (int k = lid; k < K4; k += LSIZE) vstore_half4(vload4(k, xr) * r * vload4(k, w), k, yr);
}
