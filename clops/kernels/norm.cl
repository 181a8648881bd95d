// Row normalizations over the last axis: RMSNorm and LayerNorm, float32.
//   LSIZE  work-items per row (1 on CPUs); the row's sums are reduced in local memory.
// Work geometry: global (M * LSIZE), local (LSIZE).

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
