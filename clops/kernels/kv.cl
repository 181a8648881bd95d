// The element type of an LLM's KV cache, for the kernels that read or write it (attention.cl,
// layer.cl): KV_HALF 1 keeps float16 values (half the bytes a position), read and written
// through vload_half / vstore_half (no cl_khr_fp16 needed; stores round to nearest even), 0
// keeps float32. Arithmetic is float32 either way.
//   KV_LOAD4(i, p), KV_LOAD16(i, p)  4 or 16 values from p + 4i (16i), as floats
//   KV_GET(p, i)                      value p[i], as a float
//   KV_PUT(v, p, i)                   p[i] = v
//   KV_STORE4(v, i, p)                4 values at p + 4i
//   kv_round(v)                       v as the cache keeps it
#ifndef KV_HALF
#define KV_HALF 0
#endif
#if KV_HALF
typedef half kv_t;
#define KV_LOAD4(i, p) vload_half4(i, p)
#define KV_LOAD16(i, p) vload_half16(i, p)
#define KV_GET(p, i) vload_half(i, p)
#define KV_PUT(v, p, i) vstore_half(v, i, p)
#define KV_STORE4(v, i, p) vstore_half4(v, i, p)
#else
typedef float kv_t;
#define KV_LOAD4(i, p) vload4(i, p)
#define KV_LOAD16(i, p) vload16(i, p)
#define KV_GET(p, i) ((p)[i])
#define KV_PUT(v, p, i) ((p)[i] = (v))
#define KV_STORE4(v, i, p) vstore4(v, i, p)
#endif

inline float kv_round(float v) {
#if KV_HALF
    ushort u;
    vstore_half(v, 0, (__private half *)&u);
    return vload_half(0, (__private const half *)&u);
#else
    return v;
#endif
}

// Four values of a row as stored, for kernels that load rows early and convert them where used
// (kernels/layer.cl): kv4_t (float16: a uint2, one 8-byte load; float32: a float4), kv4_zero(),
// kv4_load(p, i) (values 4i .. 4i + 3 of p, a multiple of 4 values from the buffer's start)
// and kv4_f(u) (as floats). vload_half4 may not assume more than 2-byte alignment, and NVIDIA's
// compiler makes four 2-byte loads of it; on NVIDIA (KV_PTX 1) the conversion is PTX's cvt.
// For loads spread over many rows; where a warp's loads are one row's consecutive bytes
// (attention.cl's tiles) 8-byte loads measured 2-5% slower decode past 4096 positions (H100, 1B
// Q4_0 and F16 bodies), and KV_LOAD4 stays there.
#ifndef KV_PTX
#define KV_PTX 0
#endif
// Four float16 values in the bits of a uint2 (the first in u.x's low half), as floats.
inline float4 half4_f(uint2 u) {
#if KV_PTX
    float4 v;
    asm("{\n .reg .b16 a, b, c, d;\n mov.b32 {a, b}, %4;\n mov.b32 {c, d}, %5;\n"
        " cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;\n cvt.f32.f16 %2, c;\n cvt.f32.f16 %3, d;\n}"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(u.x), "r"(u.y));
    return v;
#else
    return vload_half4(0, (__private const half *)&u);
#endif
}
#if KV_HALF
typedef uint2 kv4_t;
inline kv4_t kv4_zero(void) { return (uint2)(0u); }
inline kv4_t kv4_load(__global const kv_t *p, size_t i) {
    return ((__global const uint2 *)p)[i];
}
inline float4 kv4_f(kv4_t u) { return half4_f(u); }
#else
typedef float4 kv4_t;
inline kv4_t kv4_zero(void) { return (float4)(0.0f); }
inline kv4_t kv4_load(__global const kv_t *p, size_t i) { return vload4(i, p); }
inline float4 kv4_f(kv4_t u) { return u; }
#endif

// SINKS 1 (gpt-oss): the attention kernels take each head's sink logit, one more term of each
// softmax's denominator, as their last argument
#ifndef SINKS
#define SINKS 0
#endif
#if SINKS
#define SINKS_ARG , __global const float *sinks
#else
#define SINKS_ARG
#endif
