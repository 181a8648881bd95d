// Helpers for generated kernels: complex arithmetic on float2/double2, integer powers and
// Python-style float remainders. Included once at the top of every generated program.

#define CLOPS_DEF_COMPLEX(R, C)                                                          \
inline C cdiv_##R(C a, C b) {                                                            \
    /* Smith's algorithm: no overflow for large |b| */                                    \
    if (fabs(b.x) >= fabs(b.y)) {                                                        \
        if (b.x == 0 && b.y == 0) return (C)(a.x / b.x, a.y / b.x);                      \
        R r = b.y / b.x, d = b.x + b.y * r;                                              \
        return (C)((a.x + a.y * r) / d, (a.y - a.x * r) / d);                            \
    }                                                                                    \
    R r = b.x / b.y, d = b.y + b.x * r;                                                  \
    return (C)((a.x * r + a.y) / d, (a.y * r - a.x) / d);                                \
}                                                                                        \
inline C cexp_##R(C a) {                                                                 \
    /* C99 Annex G special values; exp(x) overflowing with a finite result: two halves */ \
    if (a.y == 0) return (C)(exp(a.x), a.y);                                             \
    if (isinf(a.x)) {                                                                    \
        if (a.x < 0) return isfinite(a.y) ? (C)(0 * cos(a.y), 0 * sin(a.y))              \
                                          : (C)(0, copysign((R)0, a.y));                 \
        if (!isfinite(a.y)) return (C)(a.x, NAN);                                        \
        return (C)(a.x * cos(a.y), a.x * sin(a.y));                                      \
    }                                                                                    \
    R e = exp(a.x);                                                                      \
    if (isinf(e)) {                                                                      \
        R h = exp(a.x / 2);                                                              \
        return (C)(h * cos(a.y) * h, h * sin(a.y) * h);                                  \
    }                                                                                    \
    return (C)(e * cos(a.y), e * sin(a.y));                                              \
}                                                                                        \
inline C cexpm1_##R(C a) {                                                               \
    /* expm1(x+iy) = expm1(x) cos y - 2 sin^2(y/2) + i e^x sin y: no cancellation near 0 */ \
    if (a.y == 0) return (C)(a.x == 0 ? 0 : expm1(a.x), a.y);  /* e^(+-0) - 1 is +0 */   \
    if (!(fabs(a.x) <= 1)) { C e = cexp_##R(a); return (C)(e.x - 1, e.y); }              \
    R s = sin(a.y / 2);                                                                  \
    return (C)(expm1(a.x) * cos(a.y) - 2 * s * s, exp(a.x) * sin(a.y));                  \
}                                                                                        \
inline C clog_##R(C a) {                                                                 \
    /* near |z| = 1: log|z| = log1p((u - 1)(u + 1) + v^2) / 2, u >= v the magnitudes */    \
    R h = hypot(a.x, a.y), u = fmax(fabs(a.x), fabs(a.y)), v = fmin(fabs(a.x), fabs(a.y)); \
    R re = (h > (R)0.5 && h < 2) ? log1p((u - 1) * (u + 1) + v * v) / 2 : log(h);         \
    if (h < (R)1.0842021724855044e-19) /* subnormal parts: |z| 2^64, then - 64 log 2 */   \
        re = log(hypot(u * (R)18446744073709551616.0, v * (R)18446744073709551616.0))     \
             - (R)44.3614195558365;                                                      \
    return (C)(re, atan2(a.y, a.x));                                                     \
}                                                                                        \
inline C clog1p_##R(C a) {                                                               \
    /* near 0: |1 + z|^2 = 1 + (x (2 + x) + y^2), through log1p (no cancellation) */     \
    if (fabs(a.x) < (R)0.5 && fabs(a.y) < (R)0.5)                                        \
        return (C)(log1p(a.x * (2 + a.x) + a.y * a.y) / 2, atan2(a.y, 1 + a.x));         \
    return clog_##R((C)(1 + a.x, a.y));                                                  \
}                                                                                        \
inline C csqrt_##R(C a) {                                                                \
    if (isinf(a.y)) return (C)(INFINITY, a.y);                                           \
    if (isnan(a.x)) return (C)(a.x, a.x);                                                \
    if (isinf(a.x)) {                                                                    \
        if (a.x > 0) return (C)(a.x, isnan(a.y) ? a.y : copysign((R)0, a.y));            \
        return (C)(isnan(a.y) ? a.y : 0, copysign((R)INFINITY, a.y));                    \
    }                                                                                    \
    if (isnan(a.y)) return (C)(a.y, a.y);                                                \
    if (a.x == 0 && a.y == 0) return (C)(0, a.y);                                        \
    /* |z| + |x| may overflow near the largest finite values: take sqrt(z/4) * 2 there; */ \
    /* (|z| + |x|) / 2 may underflow for subnormal z: take sqrt(z * 2^64) * 2^-32 there */ \
    R x = a.x, y = a.y, s = 1, m = hypot(x, y);                                          \
    if (isinf(m + fabs(x))) { x /= 4; y /= 4; s = 2; m = hypot(x, y); }                  \
    if (m < (R)1.0842021724855044e-19) {                                                 \
        x *= (R)18446744073709551616.0; y *= (R)18446744073709551616.0;                  \
        s = (R)2.3283064365386963e-10; m = hypot(x, y);                                  \
    }                                                                                    \
    R re = sqrt((m + fabs(x)) / 2);                                                      \
    if (x >= 0) return (C)(re * s, y / (2 * re) * s);                                   \
    return (C)(fabs(y) / (2 * re) * s, copysign(re, y) * s);                             \
}                                                                                        \
inline C csinh_##R(C a) {                                                                \
    if (a.y == 0) return (C)(sinh(a.x), a.y);                                            \
    if (!isfinite(a.y)) return (C)((a.x == 0 || isinf(a.x)) ? a.x : NAN, NAN);           \
    if (isinf(a.x)) return (C)(a.x * cos(a.y), INFINITY * sin(a.y));                     \
    if (fabs(a.x) > 20) { /* sinh x = sign(x) cosh x = sign(x) e^|x| / 2, no overflow */ \
        R h = exp(fabs(a.x) / 2);                                                        \
        return (C)(copysign((R)1, a.x) * (h * cos(a.y) / 2 * h), h * sin(a.y) / 2 * h);  \
    }                                                                                    \
    return (C)(sinh(a.x) * cos(a.y), cosh(a.x) * sin(a.y));                              \
}                                                                                        \
inline C ccosh_##R(C a) {                                                                \
    if (a.y == 0) return (C)(cosh(a.x), copysign((R)0, a.x) * a.y);                      \
    if (!isfinite(a.y)) return (C)(isinf(a.x) ? INFINITY : NAN, a.x == 0 ? 0 : NAN);     \
    if (isinf(a.x)) return (C)(INFINITY * cos(a.y), a.x * sin(a.y));                     \
    if (fabs(a.x) > 20) { /* cosh x = sign(x) sinh x = e^|x| / 2, no overflow */         \
        R h = exp(fabs(a.x) / 2);                                                        \
        return (C)(h * cos(a.y) / 2 * h, copysign((R)1, a.x) * (h * sin(a.y) / 2 * h));  \
    }                                                                                    \
    return (C)(cosh(a.x) * cos(a.y), sinh(a.x) * sin(a.y));                              \
}                                                                                        \
inline C ctanh_##R(C a) {                                                                \
    if (isnan(a.x)) return (C)(a.x, a.y == 0 ? a.y : a.x);                               \
    if (isinf(a.x)) return (C)(copysign((R)1, a.x), copysign((R)0, a.y));                \
    if (!isfinite(a.y)) return (C)(a.x == 0 ? a.x : NAN, NAN);                           \
    if (fabs(a.x) > 20) /* tanh is +-1 to working precision; keep the tiny imaginary */  \
        return (C)(copysign((R)1, a.x), 4 * sin(a.y) * cos(a.y) * exp(-2 * fabs(a.x)));  \
    /* Kahan: t = tan y, b = 1 + t^2, s = sinh x: (b sqrt(1 + s^2) s + i t) / (1 + b s^2) */ \
    R t = tan(a.y), b = 1 + t * t, s = sinh(a.x), d = 1 + b * s * s;                     \
    return (C)(b * sqrt(1 + s * s) * s / d, t / d);                                      \
}                                                                                        \
/* Inverse functions: Kahan's formulas ("Branch cuts for complex elementary functions") */ \
/* from square roots of 1 +- z for finite z, C99 Annex G values for infinite and NaN. */ \
inline C casinh_##R(C a) {                                                               \
    /* odd and conj-symmetric: work on |x| + i|y|, copy the signs back at the end */     \
    R x = fabs(a.x), y = fabs(a.y), re, im;                                              \
    if (isinf(y)) {                                                                      \
        re = INFINITY;                                                                   \
        im = isnan(x) ? x : isinf(x) ? (R)0.7853981633974483 : (R)1.5707963267948966;    \
    } else if (isinf(x)) {                                                               \
        re = x; im = isnan(y) ? y : 0;                                                   \
    } else if (isnan(x) || isnan(y)) {                                                   \
        re = NAN; im = (isnan(x) && y == 0) ? y : NAN;                                   \
    } else if (y == 0) {                                                                 \
        re = asinh(x); im = 0;                                                           \
    } else { /* asinh z = -i asin(iz) */                                                 \
        C s1 = csqrt_##R((C)(1 + y, -x)), s2 = csqrt_##R((C)(1 - y, x));                 \
        re = asinh(s1.x * s2.y - s1.y * s2.x);                                           \
        im = atan2(y, s1.x * s2.x - s1.y * s2.y);                                        \
    }                                                                                    \
    return (C)(copysign(re, a.x), copysign(im, a.y));                                    \
}                                                                                        \
inline C cacos_##R(C a) {                                                                \
    /* conj-symmetric: work on x + i|y|, where the imaginary part of the result is <= 0 */ \
    R x = a.x, y = fabs(a.y), re, im;                                                    \
    if (isinf(y)) {                                                                      \
        im = -INFINITY;                                                                  \
        re = isnan(x) ? x : isinf(x) ? (x < 0 ? (R)2.356194490192345 :                   \
             (R)0.7853981633974483) : (R)1.5707963267948966;                             \
    } else if (isinf(x)) {                                                               \
        im = -INFINITY;                                                                  \
        re = isnan(y) ? y : x < 0 ? (R)3.141592653589793 : 0;                            \
    } else if (isnan(x) || isnan(y)) {                                                   \
        im = NAN; re = (x == 0) ? (R)1.5707963267948966 : NAN;                           \
    } else {                                                                             \
        C s1 = csqrt_##R((C)(1 - x, -y)), s2 = csqrt_##R((C)(1 + x, y));                 \
        re = 2 * atan2(s1.x, s2.x);                                                      \
        im = asinh(s2.x * s1.y - s2.y * s1.x);                                           \
    }                                                                                    \
    return (C)(re, signbit(a.y) ? -im : im);                                             \
}                                                                                        \
inline C cacosh_##R(C a) {                                                               \
    /* conj-symmetric: work on x + i|y|, where the imaginary part of the result is >= 0 */ \
    R x = a.x, y = fabs(a.y), re, im;                                                    \
    if (isinf(y)) {                                                                      \
        re = INFINITY;                                                                   \
        im = isnan(x) ? x : isinf(x) ? (x < 0 ? (R)2.356194490192345 :                   \
             (R)0.7853981633974483) : (R)1.5707963267948966;                             \
    } else if (isinf(x)) {                                                               \
        re = INFINITY;                                                                   \
        im = isnan(y) ? y : x < 0 ? (R)3.141592653589793 : 0;                            \
    } else if (isnan(x) || isnan(y)) {                                                   \
        re = NAN; im = (x == 0) ? (R)1.5707963267948966 : NAN;                           \
    } else {                                                                             \
        C s1 = csqrt_##R((C)(x - 1, y)), s2 = csqrt_##R((C)(x + 1, y));                  \
        re = asinh(s1.x * s2.x + s1.y * s2.y);                                           \
        im = 2 * atan2(s1.y, s2.x);                                                      \
    }                                                                                    \
    return (C)(re, signbit(a.y) ? -im : im);                                             \
}                                                                                        \
inline C catanh_##R(C a) {                                                               \
    /* odd and conj-symmetric: work on |x| + i|y|, copy the signs back at the end */     \
    R x = fabs(a.x), y = fabs(a.y), re, im;                                              \
    if (isinf(y)) {                                                                      \
        re = 0; im = (R)1.5707963267948966;                                              \
    } else if (isinf(x)) {                                                               \
        re = 0; im = isnan(y) ? y : (R)1.5707963267948966;                               \
    } else if (isnan(x) || isnan(y)) {                                                   \
        re = (x == 0) ? x : NAN; im = NAN;                                               \
    } else {                                                                             \
        R d = (1 - x) * (1 - x) + y * y;                                                 \
        if (isinf(d)) { /* |z| huge: atanh z = 1/z + i pi/2 to working precision */      \
            R h = hypot(x, y);                                                           \
            re = x / h / h; im = (R)1.5707963267948966;                                  \
        } else {                                                                         \
            /* near z = 1, 4x/d may overflow: log1p(4x/d) = log(4x) - 2 log|1 - z| there */ \
            re = (4 * x > d * (R)1e10) ? (log(4 * x) - 2 * log(hypot(1 - x, y))) / 4     \
                                       : log1p(4 * x / d) / 4;                           \
            im = atan2(2 * y, (1 - x) * (1 + x) - y * y) / 2;                            \
        }                                                                                \
    }                                                                                    \
    return (C)(copysign(re, a.x), copysign(im, a.y));                                    \
}                                                                                        \
inline C csign_##R(C a) {                                                                \
    R m = hypot(a.x, a.y);                                                               \
    if (m == 0) return (C)(0, 0);                                                        \
    return (C)(a.x / m, a.y / m);                                                        \
}                                                                                        \
inline C cpow_##R(C a, C b) {                                                            \
    if (b.x == 0 && b.y == 0) return (C)(1, 0);                                          \
    if (a.x == 0 && a.y == 0) return (C)(0, 0);                                          \
    C l = clog_##R(a);                                                                   \
    return cexp_##R((C)(l.x * b.x - l.y * b.y, l.x * b.y + l.y * b.x));                  \
}                                                                                        \
inline R fremainder_##R(R a, R b) {                                                      \
    R r = fmod(a, b);                                                                    \
    if (r != 0 && ((r < 0) != (b < 0))) r += b;                                          \
    return r == 0 ? copysign((R)0, b) : r;                                               \
}                                                                                        \
inline R ffloordiv_##R(R a, R b) {                                                       \
    /* floor(a / b) computed from fmod, exact where a / b rounds up across an integer */  \
    if (b == 0) return a / b;                                                            \
    /* infinite operand: floor(a / b), as the standard's table (numpy gives NaN, -1) */  \
    if (isinf(a) || isinf(b)) return floor(a / b);                                       \
    R m = fmod(a, b);                                                                    \
    R d = (a - m) / b;                                                                   \
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1;                                          \
    if (d == 0) return copysign((R)0, a / b);                                            \
    R f = floor(d);                                                                      \
    return (d - f > (R)0.5) ? f + 1 : f;                                                 \
}

CLOPS_DEF_COMPLEX(float, float2)
#ifdef CLOPS_FP64
CLOPS_DEF_COMPLEX(double, double2)
#endif

#define CLOPS_DEF_IPOW(T)                                                                \
inline T ipow_##T(T a, T b) {                                                            \
    if (b < 0) return (a == 1) ? 1 : (a == (T)-1) ? ((b & 1) ? (T)-1 : 1) : 0;           \
    T r = 1;                                                                             \
    while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }                                    \
    return r;                                                                            \
}
CLOPS_DEF_IPOW(char) CLOPS_DEF_IPOW(short) CLOPS_DEF_IPOW(int) CLOPS_DEF_IPOW(long)
CLOPS_DEF_IPOW(uchar) CLOPS_DEF_IPOW(ushort) CLOPS_DEF_IPOW(uint) CLOPS_DEF_IPOW(ulong)

inline float clops_bf16_load(ushort b) { return as_float(((uint)b) << 16); }
inline ushort clops_bf16_store(float f) {
    if (isnan(f)) return (ushort)0x7FC0;
    uint u = as_uint(f);
    u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even
    return (ushort)(u >> 16);
}
