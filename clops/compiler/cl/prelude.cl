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
    R e = exp(a.x);                                                                      \
    if (a.y == 0) return (C)(e, a.y);                                                    \
    return (C)(e * cos(a.y), e * sin(a.y));                                              \
}                                                                                        \
inline C clog_##R(C a) { return (C)(log(hypot(a.x, a.y)), atan2(a.y, a.x)); }           \
inline C csqrt_##R(C a) {                                                                \
    if (a.x == 0 && a.y == 0) return (C)(0, a.y);                                        \
    if (isinf(a.y)) return (C)(INFINITY, a.y);                                           \
    R m = hypot(a.x, a.y);                                                               \
    R re = sqrt((m + fabs(a.x)) / 2);                                                    \
    if (a.x >= 0) return (C)(re, a.y / (2 * re));                                        \
    return (C)(fabs(a.y) / (2 * re), copysign(re, a.y));                                 \
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
