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
