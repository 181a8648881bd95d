// clops' own float32 pow on vectors of CLOPS_TRIG_N floats (the program defines CLOPS_TRIG_N and
// trig.cl's CLOPS_CAT, CLOPS_FV before this file), for flat kernels on CPUs that run float64
// vectors: x^y = 2^(y log2|x|) with the logarithm and the product in float64, then the sign
// and C99's special cases (Annex F.9.4.4, numpy's float32 power) by select, lane by lane.
//
// Accuracy: |y log2|x|| < 150 wherever the float32 result is finite and not zero, so float64's
// relative error there (a few 2^-53 of it) moves the result by less than 2^-44 of itself: the
// float32 result is the correctly rounded one but where rounding the float64 value again lands
// on the other side of a halfway point (rare: an ulp then). tests/compiler/test_vector_math.py
// checks it against numpy, every special pair included.
// PERF (PoCL 3.1, 2-core EPYC, AVX2, 2^22 float32 in a plain kernel): the runtime's float8 pow
// 41 ms, this on float8 (log2, exp2 on double8) 17 ms, numpy 44.

#pragma OPENCL EXTENSION cl_khr_fp64 : enable

#define CLOPS_DV CLOPS_CAT(double, CLOPS_TRIG_N)
#define CLOPS_LV CLOPS_CAT(long, CLOPS_TRIG_N)
#define CLOPS_TO_DV CLOPS_CAT(convert_double, CLOPS_TRIG_N)
#define CLOPS_TO_FV CLOPS_CAT(convert_float, CLOPS_TRIG_N)

inline CLOPS_FV clops_pow(CLOPS_FV a, CLOPS_FV b) {
    CLOPS_DV x = CLOPS_TO_DV(a), y = CLOPS_TO_DV(b);
    CLOPS_DV r = exp2(y * log2(fabs(x)));
    CLOPS_DV hy = y * 0.5;
    CLOPS_LV integral = floor(y) == y;  // (true for the infinities, false for nan)
    CLOPS_LV odd = integral & (floor(hy) != hy);
    // a negative x (-0.0 and -inf too) to an odd integral power: negative
    r = select(r, -r, signbit(x) & odd);
    // a finite negative x to a finite power that is not integral: nan
    r = select(r, (CLOPS_DV)(NAN), (x < 0.0) & isfinite(x) & isfinite(y) & ~integral);
    // x^0 = 1 for every x (nan too), 1^y = 1 for every y (nan too), (-1)^(+-inf) = 1
    r = select(r, (CLOPS_DV)(1.0), (y == 0.0) | (x == 1.0) | ((x == -1.0) & isinf(y)));
    return CLOPS_TO_FV(r);
}
