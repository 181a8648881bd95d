// Float32 and float64 matrix products on CPUs (PoCL): C[b] = A[b] @ B[b], row-major, with element offsets,
// row strides (lda, ldb, ldc) and batch strides. Each work-item keeps a tile of RM rows by W
// columns of C in a vector register per row (float16 or double8) and walks all of k: per step
// one vector of B (one 64-byte load) and RM scalars of A broadcast into fused multiply-adds.
// Launched with one work-item per group (PoCL then compiles the body as written, with its
// vectors, rather than packing work-items into lanes) and the row tiles on the first axis:
// consecutive groups share a 16-column panel of B, which stays in the core's cache.
// PERF (PoCL 3.1, 2 cores of an EPYC with AVX-512, float32): 1024^3 in 30 ms (71 GFLOP/s),
// 2048^3 in 283 ms (61 GFLOP/s); the generated reduction took 1.8 s at 1024^3 (1.2 GFLOP/s),
// CLBlast 0.9 s at 2048^3 (19 GFLOP/s), numpy (OpenBLAS) 11 and 77 ms.
// DT 1: float64, 8 columns of double8 a tile (the same 64 bytes).
#ifndef RM
#define RM 8
#endif
#ifndef DT
#define DT 0
#endif
#if DT == 1
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define T double
#define VT double8
#define W 8
#define VLOAD vload8
#define VSTORE vstore8
#else
#define T float
#define VT float16
#define W 16
#define VLOAD vload16
#define VSTORE vstore16
#endif

__kernel void gemm_cpu(__global T *C, int c_off, int ldc, long sc,
                       __global const T *A, int a_off, int lda, long sa,
                       __global const T *B, int b_off, int ldb, long sb, int K) {
    const long i0 = (long)get_global_id(0) * RM;
    const long j0 = (long)get_global_id(1) * W;
    const long z = get_global_id(2);
    __global const T *a = A + a_off + z * sa + i0 * lda;
    __global const T *b = B + b_off + z * sb + j0;
    VT acc[RM];
    for (int r = 0; r < RM; r++) acc[r] = (VT)(0);
    for (int k = 0; k < K; k++) {
        const VT bv = VLOAD(0, b + (long)k * ldb);
        for (int r = 0; r < RM; r++) acc[r] = fma((VT)(a[(long)r * lda + k]), bv, acc[r]);
    }
    __global T *c = C + c_off + z * sc + i0 * ldc + j0;
    for (int r = 0; r < RM; r++) VSTORE(acc[r], 0, c + (long)r * ldc);
}
