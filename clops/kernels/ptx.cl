// NVIDIA PTX helpers of clops' kernels, included (#include "clops/ptx.cl") only where the
// "nvidia_ptx" probe passed: warp shuffles and the mma.sync tensor-core instruction.

// v of the lane whose index differs from this one's by the bits of o (a butterfly step)
inline float shfl_xor(float v, int o) {
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(o));
    return r;
}

// 16 bytes read once: by the non-coherent path, without a place in L1 (layer.cl's wload says
// what that gained)
inline uint4 ld_stream(__global const uint4 *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// d += a (16x16, row) * b (16x8, col): float16 inputs, float32 accumulators. Fragments (g =
// lane / 4, t = lane % 4): a[0] row g, k 2t and 2t + 1; a[1] row g + 8; a[2], a[3] the same
// rows at k + 8; b0 k 2t and 2t + 1 of column g, b1 k + 8; d[0], d[1] row g, columns 2t and
// 2t + 1, d[2], d[3] row g + 8.
inline void mma16816(float *d, const uint *a, uint b0, uint b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// lo and hi rounded to float16, packed (lo in the low half)
inline uint half2_bits(float lo, float hi) {
    uint r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// the two float16 values of v (the low half first)
inline float2 half2_floats(uint v) {
    float a, b;
    asm("{.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\tcvt.f32.f16 %0, lo;\n\t"
        "cvt.f32.f16 %1, hi;}" : "=f"(a), "=f"(b) : "r"(v));
    return (float2)(a, b);
}
