// Philox4x32-10: a counter-based random number generator (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC'11). Each (counter, key) pair gives four independent 32-bit
// words, so any work-item can draw the numbers of any index with no state and no sync.
//
// Include in a custom kernel with  #include "clops/philox.cl"
//
//   uint4 r = philox4x32_10((uint4)(idx_lo, idx_hi, 0, 0), (uint2)(seed_lo, seed_hi));
//   float u = philox_uniform(r.x);          // [0, 1)

#ifndef CLOPS_PHILOX_CL
#define CLOPS_PHILOX_CL

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

inline uint4 philox4x32_round(uint4 c, uint2 k) {
    uint hi0 = mul_hi(PHILOX_M0, c.x), lo0 = PHILOX_M0 * c.x;
    uint hi1 = mul_hi(PHILOX_M1, c.z), lo1 = PHILOX_M1 * c.z;
    return (uint4)(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
}

// Ten rounds, the key bumped by the Weyl constants between rounds.
inline uint4 philox4x32_10(uint4 c, uint2 k) {
    for (int r = 0; r < 9; r++) {
        c = philox4x32_round(c, k);
        k.x += PHILOX_W0;
        k.y += PHILOX_W1;
    }
    return philox4x32_round(c, k);
}

// 24 random bits -> float in [0, 1).
inline float philox_uniform(uint x) { return (float)(x >> 8) * 0x1.0p-24f; }

// 24 random bits -> float in (0, 1] (safe for log).
inline float philox_uniform_open0(uint x) { return (float)((x >> 8) + 1u) * 0x1.0p-24f; }

// Box-Muller: two words -> two standard normal floats.
inline float2 philox_normal2(uint a, uint b) {
    float r = sqrt(-2.0f * log(philox_uniform_open0(a)));
    float t = 6.283185307179586f * philox_uniform(b);
    return (float2)(r * cos(t), r * sin(t));
}

#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
// 53 random bits from two words -> double in [0, 1).
inline double philox_uniform_double(uint a, uint b) {
    ulong x = ((ulong)(a >> 5) << 26) | (ulong)(b >> 6);
    return (double)x * 0x1.0p-53;
}

inline double2 philox_normal2_double(uint4 w) {
    double u1 = 1.0 - philox_uniform_double(w.x, w.y);  // (0, 1]
    double r = sqrt(-2.0 * log(u1));
    double t = 6.283185307179586 * philox_uniform_double(w.z, w.w);
    return (double2)(r * cos(t), r * sin(t));
}
#endif

#endif  // CLOPS_PHILOX_CL
