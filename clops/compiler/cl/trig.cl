// clops' own float32 sin, cos and tan on vectors of CLOPS_TRIG_N floats (the program defines
// CLOPS_TRIG_N before this file), for flat kernels on CPUs whose runtime's vector forms are
// wrong (PoCL 3.1: sin(1e-30) = 0.0099 on float16 vectors) or slower than these.
//
// One path for every lane, no branch per element, so a vector of lanes runs as vector code:
// Cody-Waite reduction x = n pi/2 + r (pi/2 in three floats, products by fma), |r| <= ~pi/4,
// then polynomials in z = r^2 (sin r = r + r z P(z), cos r = 1 - z/2 + z^2 Q(z),
// tan r = r + r z T(z)), picked per lane by n mod 4 with select. Lanes past CLOPS_TRIG_LIMIT
// take the runtime's scalar function, one call each, in a branch taken only when a vector
// holds one; nan gives nan.
//
// Coefficients: weighted minimax fits in float64 (Lawson's iteratively reweighted least
// squares on 4000 Chebyshev-spaced z in [0, 0.81^2], weight z for sin and tan, z^2 for cos:
// the relative error of the result), rounded to float32. Relative error of the rounded
// polynomials: sin 2^-27.3, cos 2^-30.9, tan 2^-27.8 (|r| <= 0.81).
// Measured against float64 over every float32 in [0.5, 2^18] (and a sample of the rest): within
// 1.56 units in the last place (sin, cos), 3.0 (tan, near its poles); tests/compiler/test_trig.py.

#define CLOPS_CAT_(a, b) a##b
#define CLOPS_CAT(a, b) CLOPS_CAT_(a, b)
#define CLOPS_FV CLOPS_CAT(float, CLOPS_TRIG_N)
#define CLOPS_IV CLOPS_CAT(int, CLOPS_TRIG_N)

// pi/2 = PIO2_1 + PIO2_2 + PIO2_3 + 1.06e-23: each part the float nearest what is left;
// x - n PIO2_1 is exact (|r| < 1, a multiple of 2^-24).
#define CLOPS_PIO2_1 0x1.921fb6p+0f
#define CLOPS_PIO2_2 -0x1.777a5cp-25f
#define CLOPS_PIO2_3 -0x1.ee59dap-50f
#define CLOPS_2_PI 0x1.45f306p-1f
// Up to 2^18 the error of the float 2/pi (4e-8 of it) leaves |r| <= 0.797 (the polynomials
// are fitted to 0.81), and n pi/2 is good to 2^-58.
#define CLOPS_TRIG_LIMIT 262144.0f

// r (and n mod 4 in *q) of lanes |x| <= CLOPS_TRIG_LIMIT; other lanes: r = 0, q = 0. The sign
// of a zero r is not kept. n = x 2/pi rounded to an integer by adding 1.5 2^23 (floats there
// are the integers: one rounding of the fma's exact value), its low bits n mod 4.
// PERF (PoCL 3.1, AVX2): rint and convert_int took 40% of the time of sin; this, nothing.
inline CLOPS_FV clops_trig_reduce(CLOPS_FV x, CLOPS_IV *q) {
    CLOPS_IV near = fabs(x) <= CLOPS_TRIG_LIMIT;  // false for nan
    CLOPS_FV xs = select((CLOPS_FV)(0.0f), x, near);
    CLOPS_FV t = fma(xs, CLOPS_2_PI, 0x1.8p23f);
    CLOPS_FV n = t - 0x1.8p23f;
    CLOPS_FV r = fma(n, -CLOPS_PIO2_1, xs);
    r = fma(n, -CLOPS_PIO2_2, r);
    r = fma(n, -CLOPS_PIO2_3, r);
    *q = CLOPS_CAT(as_int, CLOPS_TRIG_N)(t) & 3;
    return r;
}

inline CLOPS_FV clops_sin_poly(CLOPS_FV r, CLOPS_FV z) {
    CLOPS_FV p = fma(fma(-0x1.98e0f4p-13f, z, 0x1.11061cp-7f), z, -0x1.555542p-3f);
    return fma(r * z, p, r);
}

inline CLOPS_FV clops_cos_poly(CLOPS_FV z) {
    CLOPS_FV p = fma(fma(0x1.999fdap-16f, z, -0x1.6c0b36p-10f), z, 0x1.555548p-5f);
    return 1.0f + fma(z * z, p, -0.5f * z);
}

inline CLOPS_FV clops_tan_poly(CLOPS_FV r, CLOPS_FV z) {
    CLOPS_FV p = fma(0x1.396c58p-8f, z, -0x1.881614p-11f);
    p = fma(p, z, 0x1.7917fep-7f);
    p = fma(p, z, 0x1.585c24p-6f);
    p = fma(p, z, 0x1.bb4946p-5f);
    p = fma(p, z, 0x1.110b16p-3f);
    p = fma(p, z, 0x1.55556ap-2f);
    return fma(r * z, p, r);
}

// Lanes past the limit (inf among them: nan) take the runtime's scalar fn, in a function of
// its own, called only for a vector that holds one.
// PERF (PoCL 3.1, AVX2): any() cost a fifth of the time of sin there, inlining the lane loop
// a sixth; clang's vector reduction and a call cost nothing.
#if defined(__has_builtin)
#if __has_builtin(__builtin_reduce_or)
#define CLOPS_ANY(m) (__builtin_reduce_or(m) != 0)
#endif
#endif
#ifndef CLOPS_ANY
#define CLOPS_ANY(m) any(m)
#endif
#define CLOPS_TRIG_FAR_FN(fn)                                                               \
__attribute__((noinline)) CLOPS_FV clops_##fn##_far(CLOPS_FV x, CLOPS_FV y) {               \
    float xl[CLOPS_TRIG_N], yl[CLOPS_TRIG_N];                                               \
    CLOPS_CAT(vstore, CLOPS_TRIG_N)(x, 0, xl);                                              \
    CLOPS_CAT(vstore, CLOPS_TRIG_N)(y, 0, yl);                                              \
    for (int i = 0; i < CLOPS_TRIG_N; i++)                                                  \
        if (fabs(xl[i]) > CLOPS_TRIG_LIMIT)                                                 \
            yl[i] = fn(xl[i]);                                                              \
    return CLOPS_CAT(vload, CLOPS_TRIG_N)(0, yl);                                           \
}
CLOPS_TRIG_FAR_FN(sin)
CLOPS_TRIG_FAR_FN(cos)
CLOPS_TRIG_FAR_FN(tan)
#define CLOPS_TRIG_FAR(y, x, fn) \
    if (CLOPS_ANY(fabs(x) > CLOPS_TRIG_LIMIT)) y = clops_##fn##_far(x, y);

inline CLOPS_FV clops_sin(CLOPS_FV x) {
    CLOPS_IV q;
    CLOPS_FV r = clops_trig_reduce(x, &q), z = r * r;
    CLOPS_FV y = select(clops_sin_poly(r, z), clops_cos_poly(z), (q & 1) != 0);
    y = select(y, -y, (q & 2) != 0);
    y = select(x - x, y, fabs(x) <= CLOPS_TRIG_LIMIT);  // inf, nan: nan
    y = select(y, x, x == 0.0f);  // sin(-0) = -0 (the polynomial gives +0: -0 * z * p < 0)
    CLOPS_TRIG_FAR(y, x, sin)
    return y;
}

inline CLOPS_FV clops_cos(CLOPS_FV x) {
    CLOPS_IV q;
    CLOPS_FV r = clops_trig_reduce(x, &q), z = r * r;
    CLOPS_FV y = select(clops_cos_poly(z), clops_sin_poly(r, z), (q & 1) != 0);
    y = select(y, -y, ((q + 1) & 2) != 0);
    y = select(x - x, y, fabs(x) <= CLOPS_TRIG_LIMIT);
    CLOPS_TRIG_FAR(y, x, cos)
    return y;
}

inline CLOPS_FV clops_tan(CLOPS_FV x) {
    CLOPS_IV q;
    CLOPS_FV r = clops_trig_reduce(x, &q);
    CLOPS_FV t = clops_tan_poly(r, r * r);
    CLOPS_FV y = select(t, -1.0f / t, (q & 1) != 0);  // tan(r + pi/2) = -1 / tan r
    y = select(x - x, y, fabs(x) <= CLOPS_TRIG_LIMIT);
    y = select(y, x, x == 0.0f);  // tan(-0) = -0 (r of -0 may be +0)
    CLOPS_TRIG_FAR(y, x, tan)
    return y;
}
