// Tensor creation from Philox4x32-10: element i of a tensor takes word (i % 4) of the block
// counter (i / 4, stream), so a value depends only on (seed, stream, i): the same on every
// device, for every work size, and for any split of the index range.
#include "clops/philox.cl"

inline uint4 block_words(long b, uint k0, uint k1, uint stream) {
    return philox4x32_10((uint4)((uint)b, (uint)((ulong)b >> 32), stream, 0u), (uint2)(k0, k1));
}

#define STORE4(expr0, expr1, expr2, expr3) \
    long i = 4 * b; \
    if (i < n) out[i] = (expr0); \
    if (i + 1 < n) out[i + 1] = (expr1); \
    if (i + 2 < n) out[i + 2] = (expr2); \
    if (i + 3 < n) out[i + 3] = (expr3);

__kernel void rng_bits(__global uint *out, long off, long n, uint k0, uint k1, uint stream) {
    long b = get_global_id(0);
    uint4 w = block_words(b, k0, k1, stream);
    out += off;
    STORE4(w.x, w.y, w.z, w.w)
}

__kernel void rng_uniform_f32(__global float *out, long off, long n, uint k0, uint k1,
                              uint stream, float lo, float scale) {
    long b = get_global_id(0);
    uint4 w = block_words(b, k0, k1, stream);
    out += off;
    STORE4(lo + scale * philox_uniform(w.x), lo + scale * philox_uniform(w.y),
           lo + scale * philox_uniform(w.z), lo + scale * philox_uniform(w.w))
}

__kernel void rng_normal_f32(__global float *out, long off, long n, uint k0, uint k1,
                             uint stream, float mean, float std) {
    long b = get_global_id(0);
    uint4 w = block_words(b, k0, k1, stream);
    float2 p = philox_normal2(w.x, w.y), q = philox_normal2(w.z, w.w);
    out += off;
    STORE4(mean + std * p.x, mean + std * p.y, mean + std * q.x, mean + std * q.y)
}

// Integers in [lo, lo + range) with range <= 2^32: the high word of word * range
// (bias below range / 2^32).
__kernel void rng_integers_i64(__global long *out, long off, long n, uint k0, uint k1,
                               uint stream, long lo, ulong range) {
    long b = get_global_id(0);
    uint4 w = block_words(b, k0, k1, stream);
    out += off;
    STORE4(lo + (long)(((ulong)w.x * range) >> 32), lo + (long)(((ulong)w.y * range) >> 32),
           lo + (long)(((ulong)w.z * range) >> 32), lo + (long)(((ulong)w.w * range) >> 32))
}

__kernel void rng_integers_i32(__global int *out, long off, long n, uint k0, uint k1,
                               uint stream, long lo, ulong range) {
    long b = get_global_id(0);
    uint4 w = block_words(b, k0, k1, stream);
    out += off;
    STORE4((int)(lo + (long)(((ulong)w.x * range) >> 32)),
           (int)(lo + (long)(((ulong)w.y * range) >> 32)),
           (int)(lo + (long)(((ulong)w.z * range) >> 32)),
           (int)(lo + (long)(((ulong)w.w * range) >> 32)))
}

#ifdef cl_khr_fp64
// Doubles take two words each: element i is half (i % 2) of block i / 2.
#define STORE2(expr0, expr1) \
    long i = 2 * b; \
    if (i < n) out[i] = (expr0); \
    if (i + 1 < n) out[i + 1] = (expr1);

__kernel void rng_uniform_f64(__global double *out, long off, long n, uint k0, uint k1,
                              uint stream, double lo, double scale) {
    long b = get_global_id(0);
    uint4 w = block_words(b, k0, k1, stream);
    out += off;
    STORE2(lo + scale * philox_uniform_double(w.x, w.y),
           lo + scale * philox_uniform_double(w.z, w.w))
}

__kernel void rng_normal_f64(__global double *out, long off, long n, uint k0, uint k1,
                             uint stream, double mean, double std) {
    long b = get_global_id(0);
    uint4 w = block_words(b, k0, k1, stream);
    double2 p = philox_normal2_double(w);
    out += off;
    STORE2(mean + std * p.x, mean + std * p.y)
}
#endif
