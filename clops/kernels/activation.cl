// Elementwise activations and softmax, float32.

inline float silu(float v) { return v / (1.0f + exp(-v)); }

// tanh form of GELU, as GPT-2 style models use it.
inline float gelu_tanh(float v) {
    return 0.5f * v * (1.0f + tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}

// Exact GELU via erf.
inline float gelu_erf(float v) { return 0.5f * v * (1.0f + erf(v * 0.7071067811865476f)); }

// h[m, f] = act(gu[m, f]) * gu[m, F + f]: the gated MLP of Llama (act = SiLU) after a fused
// gate/up projection. Work geometry: global (F, M).
__kernel void glu(__global float *h, __global const float *gu, int F, int act) {
    const int f = get_global_id(0), m = get_global_id(1);
    __global const float *r = gu + (size_t)m * 2 * F;
    float g = r[f];
    float a = act == 0 ? silu(g) : act == 1 ? gelu_tanh(g) : gelu_erf(g);
    h[(size_t)m * F + f] = a * r[F + f];
}

// gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
// h = (u + 1) * g * sigmoid(alpha * g). Work geometry: global (F, M).
__kernel void glu_clamp(__global float *h, __global const float *gu, int F, float limit,
                        float alpha) {
    const int f = get_global_id(0), m = get_global_id(1);
    __global const float *r = gu + (size_t)m * 2 * F;
    const float g = fmin(r[f], limit), u = clamp(r[F + f], -limit, limit);
    h[(size_t)m * F + f] = (u + 1.0f) * (g / (1.0f + exp(-alpha * g)));
}

// In place over n values: y = y * mul / div, then, if cap > 0, cap * tanh(y / cap) (embedding
// multipliers, logit scaling and soft-capping). Work geometry: global (n).
__kernel void scale_cap(__global float *y, float mul, float div, float cap) {
    const int i = get_global_id(0);
    float v = y[i] * mul / div;
    y[i] = cap > 0.0f ? cap * tanh(v / cap) : v;
}

// y = act(x) over n contiguous values (act 0 SiLU, 1 GELU tanh, 2 GELU erf).
__kernel void unary(__global float *y, __global const float *x, int x_off, int n, int act) {
    const int i = get_global_id(0);
    if (i >= n) return;
    float v = x[x_off + i];
    y[i] = act == 0 ? silu(v) : act == 1 ? gelu_tanh(v) : gelu_erf(v);
}

// Row softmax over the last axis (rows K long). Work geometry: global (M).
__kernel void softmax(__global float *y, __global const float *x, int x_off, int K) {
    const int m = get_global_id(0);
    __global const float *xr = x + x_off + (size_t)m * K;
    __global float *yr = y + (size_t)m * K;
    float mx = -INFINITY;
    for (int k = 0; k < K; ++k) mx = fmax(mx, xr[k]);
    float s = 0.0f;
    for (int k = 0; k < K; ++k) { float e = exp(xr[k] - mx); yr[k] = e; s += e; }
    float inv = 1.0f / s;
    for (int k = 0; k < K; ++k) yr[k] *= inv;
}

// The same over float16 vectors along each row (CPUs whose vector exp gives the scalar one's
// values, ``probes.vector_math_agrees``): a work-item's row in 16-wide loads, the rest of a row
// past a multiple of 16 as scalars; the max and the sum kept in 16 lanes, folded in halves.
// (The row kernel above, a work-item a row, leaves vectors to the runtime, which makes them
// across work-items: 16 rows a vector, each lane its own row's stream.)
// Work geometry: global (M).
__kernel __attribute__((vec_type_hint(float16)))
void softmax_v16(__global float *y, __global const float *x, int x_off, int K) {
    const int m = get_global_id(0);
    __global const float *xr = x + x_off + (size_t)m * K;
    __global float *yr = y + (size_t)m * K;
    const int K16 = K / 16;
    float16 mv = (float16)(-INFINITY);
    for (int k = 0; k < K16; ++k) mv = fmax(mv, vload16(k, xr));
    const float8 m8 = fmax(mv.lo, mv.hi);
    const float4 m4 = fmax(m8.lo, m8.hi);
    float mx = fmax(fmax(m4.x, m4.y), fmax(m4.z, m4.w));
    for (int k = K16 * 16; k < K; ++k) mx = fmax(mx, xr[k]);
    float16 sv = (float16)(0.0f);
    for (int k = 0; k < K16; ++k) {
        const float16 e = exp(vload16(k, xr) - mx);
        vstore16(e, k, yr);
        sv += e;
    }
    const float8 s8 = sv.lo + sv.hi;
    const float4 s4 = s8.lo + s8.hi;
    float s = (s4.x + s4.y) + (s4.z + s4.w);
    for (int k = K16 * 16; k < K; ++k) { float e = exp(xr[k] - mx); yr[k] = e; s += e; }
    const float inv = 1.0f / s;
    for (int k = 0; k < K16; ++k) vstore16(vload16(k, yr) * inv, k, yr);
    for (int k = K16 * 16; k < K; ++k) yr[k] *= inv;
}

// Softmax over the middle axis of contiguous (outer, K, inner): each work-item walks one column
// K long with the row kernel's arithmetic, in its order; neighbours in dim 0 are neighbouring
// columns, so a CPU runtime's vector lanes load contiguous memory (no transposes around it).
// Work geometry: global (inner, outer).
__kernel void softmax_cols(__global float *y, __global const float *x, int x_off, int K,
                           int inner) {
    const size_t j = get_global_id(0), o = get_global_id(1);
    const size_t base = o * (size_t)K * inner + j;
    __global const float *xc = x + x_off + base;
    __global float *yc = y + base;
    float mx = -INFINITY;
    for (int k = 0; k < K; ++k) mx = fmax(mx, xc[(size_t)k * inner]);
    float s = 0.0f;
    for (int k = 0; k < K; ++k) {
        float e = exp(xc[(size_t)k * inner] - mx);
        yc[(size_t)k * inner] = e;
        s += e;
    }
    float inv = 1.0f / s;
    for (int k = 0; k < K; ++k) yc[(size_t)k * inner] *= inv;
}

// softmax_cols over 16 * NV adjacent columns a work-item as NV float16 vectors (inner a
// multiple of 16 * NV; CPUs as softmax_v16). A strip of 64 columns (NV 4) reads 256 bytes of
// each row it visits, against the 64 of one vector: rows far apart cost a page walk each.
// Work geometry: global (inner / (16 * NV), outer).
#ifndef NV
#define NV 1
#endif
__kernel __attribute__((vec_type_hint(float16)))
void softmax_cols_v16(__global float *y, __global const float *x, int x_off, int K,
                      int inner) {
    const size_t j = get_global_id(0), o = get_global_id(1);
    const size_t base = o * (size_t)K * inner + j * (16 * NV);
    __global const float *xc = x + x_off + base;
    __global float *yc = y + base;
    float16 mx[NV], s[NV];
    for (int v = 0; v < NV; ++v) {
        mx[v] = (float16)(-INFINITY);
        s[v] = (float16)(0.0f);
    }
    for (int k = 0; k < K; ++k)
        for (int v = 0; v < NV; ++v) mx[v] = fmax(mx[v], vload16(v, xc + (size_t)k * inner));
    for (int k = 0; k < K; ++k)
        for (int v = 0; v < NV; ++v) {
            const float16 e = exp(vload16(v, xc + (size_t)k * inner) - mx[v]);
            vstore16(e, v, yc + (size_t)k * inner);
            s[v] += e;
        }
    for (int v = 0; v < NV; ++v) s[v] = 1.0f / s[v];
    for (int k = 0; k < K; ++k)
        for (int v = 0; v < NV; ++v)
            vstore16(vload16(v, yc + (size_t)k * inner) * s[v], v, yc + (size_t)k * inner);
}
