// Float32 and float64 matrix products on CPUs (PoCL): C[b] = A[b] @ B[b], row-major, with element offsets,
// row strides (lda, ldb, ldc) and batch strides. Each work-item keeps a tile of RM rows by W
// columns of C in a vector register per row (float16 or double8) and walks all of k: per step
// one vector of B (one 64-byte load) and RM scalars of A broadcast into fused multiply-adds.
// Launched with one work-item per group (PoCL then compiles the body as written, with its
// vectors, rather than packing work-items into lanes); the row loops unrolled, so that the RM
// accumulators live in registers (left as loops, PoCL kept them on the stack: half the speed).
// PERF (PoCL 3.1, 2 cores of an EPYC with AVX-512, float32): 1024^3 in 10.5 ms, 2048^3 in
// 84 ms (about 205 GFLOP/s, 1.0x numpy's OpenBLAS in the same process) with B packed and the
// tiles grouped; 30 and 283 ms before either, the generated reduction 1.8 s at 1024^3, CLBlast
// 0.9 s at 2048^3.
// DT 1: float64, 8 columns of double8 a tile (the same 64 bytes).
// PACKED 1: B as pack_b leaves it (batch stride sb = K * N); GM: row tiles per group.
#ifndef RM
#define RM 8
#endif
#ifndef DT
#define DT 0
#endif
#ifndef GM
#define GM 8
#endif
#ifndef PACKED
#define PACKED 0
#endif
// A_T 1: A stored transposed, element (i, k) at A[k * lda + i] (x.T of a row-major x, read in
// place: the RM values of a step are contiguous)
#ifndef A_T
#define A_T 0
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
    // PERF: tiles taken in groups of GM row tiles: the groups' A rows stay in cache while
    // they meet every column panel of B (the work-groups run in order, the first axis fastest)
    const int G0 = get_global_size(0), G1 = get_global_size(1);
    const int L = get_global_id(0) + get_global_id(1) * G0;
    const int per = GM * G1, first = (L / per) * GM, gsz = min(G0 - first, GM);
    const long i0 = (long)(first + (L % per) % gsz) * RM;
    const long j0 = (long)((L % per) / gsz) * W;
    const long z = get_global_id(2);
#if A_T
    __global const T *a = A + a_off + z * sa + i0;
#else
    __global const T *a = A + a_off + z * sa + i0 * lda;
#endif
#if PACKED
    // B packed by pack_b: panel j0 / W is K rows of W values, contiguous
    __global const T *b = B + z * sb + j0 * K;
    const int ldb_ = W;
#else
    __global const T *b = B + b_off + z * sb + j0;
    const int ldb_ = ldb;
#endif
    VT acc[RM];
    #pragma unroll
    for (int r = 0; r < RM; r++) acc[r] = (VT)(0);
    for (int k = 0; k < K; k++) {
        const VT bv = VLOAD(0, b + (long)k * ldb_);
        #pragma unroll
#if A_T
        for (int r = 0; r < RM; r++) acc[r] = fma((VT)(a[(long)k * lda + r]), bv, acc[r]);
#else
        for (int r = 0; r < RM; r++) acc[r] = fma((VT)(a[(long)r * lda + k]), bv, acc[r]);
#endif
    }
    __global T *c = C + c_off + z * sc + i0 * ldc + j0;
    #pragma unroll
    for (int r = 0; r < RM; r++) VSTORE(acc[r], 0, c + (long)r * ldc);
}

// out[z][j / W][k][j % W] = B[z][k][j]: column panels of B made contiguous for gemm_cpu
// (PACKED), so that a panel's rows do not fall on the same cache sets (row strides of a power
// of two). A work-item moves 16 rows of a panel (fewer at the end of k). Work geometry: global
// (N / W, ceil(K / 16), batch).
__kernel void pack_b(__global T *out, __global const T *B, int b_off, int ldb, long sb, int K) {
    const int p = get_global_id(0), k0 = get_global_id(1) * 16, z = get_global_id(2);
    const long n = (long)get_global_size(0) * W;
    const int kn = min(16, K - k0);
    for (int j = 0; j < kn; j++)
        VSTORE(VLOAD(0, B + b_off + z * sb + (long)(k0 + j) * ldb + (long)p * W), 0,
               out + z * n * K + ((long)p * K + k0 + j) * W);
}

// out[z][k][j] = B[z][k][j] for j < N, 0 for the columns past N up to a whole vector: B padded
// for gemm_cpu where N is no multiple of W. Work geometry: global (ceil(N / W), K, batch).
__kernel void pad_cols(__global T *out, __global const T *B, int b_off, int ldb, long sb, int N) {
    const int p = get_global_id(0), k = get_global_id(1), z = get_global_id(2);
    const long wide = (long)get_global_size(0) * W;
    __global const T *src = B + b_off + z * sb + (long)k * ldb + (long)p * W;
    __global T *dst = out + ((long)z * get_global_size(1) + k) * wide + (long)p * W;
    if ((p + 1) * W <= N) {
        VSTORE(VLOAD(0, src), 0, dst);
        return;
    }
    for (int j = 0; j < W; ++j) dst[j] = p * W + j < N ? src[j] : (T)0;
}

// float32 on CPUs of 8-wide vectors (AVX2: 16 registers of 8 floats): C[b] = A[b] @ B[b] with A
// packed by pack_a (tiles of RM rows, each K steps of its RM values, contiguous) and B by pack_b.
// A work-item keeps RM rows of 16 columns as two float8 halves a row, 2 * RM accumulators (RM 6:
// 12 registers, with B's two halves and the broadcast 15 of 16), and walks all of k: per step
// two vector loads of B and RM scalars of A from one stream. Rows of the last tile past M are
// zeros in the packed A and are not stored. Work geometry: global (ceil(M / RM), N / 16,
// batch), work-groups of one.
// PERF (2-core EPYC, AVX2, float32 2040 x 2048 x 2048, Intel's runtime; standalone kernels,
// same process): 4 rows of float16 (gemm_cpu) 163-195 ms, this at RM 6 125-134 ms, numpy's
// OpenBLAS 120-140 ms; 6 rows of float16 unpacked A 174 ms; k unrolled 2 or 4 times slower.
__kernel void gemm_cpu_pa(__global float *C, int c_off, int ldc, long sc,
                          __global const float *A, long sa, __global const float *B, long sb,
                          int M, int K) {
    const int G0 = get_global_size(0), G1 = get_global_size(1);
    const int L = get_global_id(0) + get_global_id(1) * G0;
    const int per = GM * G1, first = (L / per) * GM, gsz = min(G0 - first, GM);
    const long tile = first + (L % per) % gsz;
    const long j0 = (long)((L % per) / gsz) * 16;
    const long z = get_global_id(2);
    __global const float *a = A + z * sa + tile * RM * K;
    __global const float *b = B + z * sb + j0 * K;
    float8 lo[RM], hi[RM];
    #pragma unroll
    for (int r = 0; r < RM; r++) { lo[r] = (float8)(0); hi[r] = (float8)(0); }
    for (int k = 0; k < K; k++) {
        const float8 bl = vload8(0, b + (long)k * 16), bh = vload8(1, b + (long)k * 16);
        #pragma unroll
        for (int r = 0; r < RM; r++) {
            const float8 av = (float8)(a[(long)k * RM + r]);
            lo[r] = fma(av, bl, lo[r]);
            hi[r] = fma(av, bh, hi[r]);
        }
    }
    const long i0 = tile * RM;
    __global float *c = C + c_off + z * sc + i0 * ldc + j0;
    #pragma unroll
    for (int r = 0; r < RM; r++) {
        if (i0 + r < M) {
            vstore8(lo[r], 0, c + (long)r * ldc);
            vstore8(hi[r], 1, c + (long)r * ldc);
        }
    }
}

// out[z][t][k][r] = A[z][t * RM + r][k] (0 for rows past M): A's rows in tiles for gemm_cpu_pa
// (A_T: element (i, k) at A[k * lda + i]). A work-item moves 16 steps of k of a tile (fewer at
// the end of k). Work geometry: global (ceil(K / 16), ceil(M / RM), batch).
__kernel void pack_a(__global float *out, __global const float *A, int a_off, int lda, long sa,
                     int M, int K) {
    const int k0 = get_global_id(0) * 16, t = get_global_id(1), z = get_global_id(2);
    const int kn = min(16, K - k0);
    __global float *o = out + ((long)z * get_global_size(1) + t) * RM * K + (long)k0 * RM;
    __global const float *a = A + a_off + z * sa;
    #pragma unroll
    for (int r = 0; r < RM; r++) {
        const long i = (long)t * RM + r;
        for (int j = 0; j < kn; j++) {
#if A_T
            o[j * RM + r] = i < M ? a[(long)(k0 + j) * lda + i] : 0.0f;
#else
            o[j * RM + r] = i < M ? a[i * lda + k0 + j] : 0.0f;
#endif
        }
    }
}
