// Small vector arithmetic of clops' kernels (#include "clops/vec.cl"): horizontal sums of
// float vectors, pairwise in a fixed order (matmul.cl, matmul_cpu.cl, attention.cl's CPU
// kernels), and, where the includer defines DOT4_PTX, dot4 (layer.cl, matmul.cl's QX): 1
// (NVIDIA) by dp4a, 0 in OpenCL C.

inline float hsum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }
inline float hsum8(float8 v) { return hsum4(v.lo + v.hi); }
inline float hsum16(float16 v) { return hsum8(v.lo + v.hi); }

#ifdef DOT4_PTX
// c + the dot product of the 4 signed bytes of a and of b
#if DOT4_PTX
inline int dot4(uint a, uint b, int c) {
    int d;
    asm volatile("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
#else
inline int dot4(uint a, uint b, int c) {
    const int4 p = convert_int4(as_char4(a)) * convert_int4(as_char4(b));
    return c + (p.x + p.y) + (p.z + p.w);
}
#endif
#endif
