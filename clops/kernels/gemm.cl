// Dense GEMM for GPUs: C[b] = A[b] @ B[b], row-major, A [M][K], B [K][N], C [M][N].
//
//   gemm_tiled  portable: float32 or float16 storage (DT 0 / 1), float32 arithmetic. A work-group
//               of 256 work-items computes a 128x128 tile of C, 8x8 values per work-item from
//               registers; A and B tiles of depth 16 are staged in local memory while the next
//               ones are read from global memory into registers.
//   gemm_mma    float16 inputs on NVIDIA tensor cores (inline PTX mma.sync m16n8k16, float32
//               accumulation): 8 warps, each a 64x32 tile of the 128x128 tile, depth 32; B is
//               staged with rows paired per word, so each fragment register is one local read.
//               Only built where the "nvidia_ptx" probe succeeds.
//
// Both need M % 128 == 0, N % 128 == 0, K % 16 (tiled) or K % 32 (mma) == 0, row strides and
// offsets multiples of 4 (tiled, float32) or 8 (float16) elements: the launcher checks.
// Work geometry: global (N / 128 * 256, M / 128, batch), local (256, 1, 1).

#ifndef DT
#define DT 0
#endif

#if DT == 0
#define IN_T float
#define LD4(p) (*(__global const float4 *)(p))
#define ST4(v, p) (*(__global float4 *)(p) = (v))
#else
#define IN_T half
#define LD4(p) vload_half4(0, (p))
#define ST4(v, p) vstore_half4((v), 0, (p))
#endif

#define TILE 128
#ifndef DEPTH
#define DEPTH 16
#endif
#define PAD 4
#define NLD (DEPTH / 8)  // float4 loads per work-item and tile, of A and of B each

__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void gemm_tiled(__global IN_T *C, int c_off, int ldc, long c_bstride,
                __global const IN_T *A, int a_off, int lda, long a_bstride,
                __global const IN_T *B, int b_off, int ldb, long b_bstride,
                int M, int N, int K) {
    __local float As[DEPTH][TILE + PAD] __attribute__((aligned(16)));  // As[k][m]
    __local float Bs[DEPTH][TILE + PAD] __attribute__((aligned(16)));
    const int tid = get_local_id(0);
    const int tx = tid & 15, ty = tid >> 4;
    const int m0 = get_group_id(1) * TILE, n0 = get_group_id(0) * TILE;
    const long bz = get_global_id(2);
    A += a_off + bz * a_bstride;
    B += b_off + bz * b_bstride;
    C += c_off + bz * c_bstride;
    // loads: A rows ar, ar + 64 at k ak + 16 l; B rows bk + 8 j at n bn..bn+3
    const int ar = tid >> 2, ak = (tid & 3) * 4;
    const int bk = tid >> 5, bn = (tid & 31) * 4;
    __global const IN_T *pa = A + (size_t)(m0 + ar) * lda + ak;
    __global const IN_T *pb = B + (size_t)bk * ldb + n0 + bn;
    float4 ra[NLD], rb[NLD];
#pragma unroll
    for (int l = 0; l < NLD; ++l) {
        ra[l] = LD4(pa + (size_t)(l & 1) * 64 * lda + (l >> 1) * 16);
        rb[l] = LD4(pb + (size_t)l * 8 * ldb);
    }

    float acc[8][8];
    for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += DEPTH) {
#pragma unroll
        for (int l = 0; l < NLD; ++l) {
            const int r = ar + (l & 1) * 64, k = ak + (l >> 1) * 16;
            As[k + 0][r] = ra[l].x; As[k + 1][r] = ra[l].y;
            As[k + 2][r] = ra[l].z; As[k + 3][r] = ra[l].w;
            vstore4(rb[l], 0, &Bs[bk + 8 * l][bn]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + DEPTH < K) {  // the next tiles, in flight during this one's arithmetic
            pa += DEPTH;
            pb += (size_t)DEPTH * ldb;
#pragma unroll
            for (int l = 0; l < NLD; ++l) {
                ra[l] = LD4(pa + (size_t)(l & 1) * 64 * lda + (l >> 1) * 16);
                rb[l] = LD4(pb + (size_t)l * 8 * ldb);
            }
        }
#pragma unroll
        for (int kk = 0; kk < DEPTH; ++kk) {
            const float4 a0 = vload4(0, &As[kk][ty * 4]), a1 = vload4(0, &As[kk][64 + ty * 4]);
            const float4 b0 = vload4(0, &Bs[kk][tx * 4]), b1 = vload4(0, &Bs[kk][64 + tx * 4]);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = mad(a[i], b[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int row = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
        __global IN_T *c = C + (size_t)row * ldc + n0;
        ST4(((float4)(acc[i][0], acc[i][1], acc[i][2], acc[i][3])), c + tx * 4);
        ST4(((float4)(acc[i][4], acc[i][5], acc[i][6], acc[i][7])), c + 64 + tx * 4);
    }
}

#ifdef USE_MMA
#ifndef MDEPTH
#define MDEPTH 32
#endif
#define ACH (MDEPTH / 8)     // 8-half chunks per row of an A tile
#define NA (MDEPTH / 16)     // A chunks per work-item and tile
#define NB (MDEPTH / 32)     // B row-pair chunks per work-item and tile
#define MROW (MDEPTH + 8)  // halves per row of As: 80 bytes, so fragment reads hit all banks
#define BROW (TILE + 8)    // words per row of Bs: 544 bytes, likewise
// From words a, b of rows k, k + 1 holding columns (n, n + 1): the words of columns n and n + 1
// holding rows (k, k + 1).
#define PAIR_LO(a, b) (((a) & 0xffffu) | ((b) << 16))
#define PAIR_HI(a, b) (((a) >> 16) | ((b) & 0xffff0000u))

// d += a (16x16, row) * b (16x8, col): float16 inputs, float32 accumulators.
inline void mma16816(float *d, const uint *a, uint b0, uint b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void gemm_mma(__global half *C, int c_off, int ldc, long c_bstride,
              __global const half *A, int a_off, int lda, long a_bstride,
              __global const half *B, int b_off, int ldb, long b_bstride,
              int M, int N, int K) {
    // NOTE: 16-byte aligned: the tiles are written 16 bytes at a time
    __local ushort As[TILE * MROW] __attribute__((aligned(16)));    // As[m][k]
    // Bs[k / 2][n]: the halves of rows k, k + 1 of column n in one word (a B fragment register)
    __local uint Bs[MDEPTH / 2 * BROW] __attribute__((aligned(16)));
    const int tid = get_local_id(0);
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    const int m0 = get_group_id(1) * TILE, n0 = get_group_id(0) * TILE;
    const long bz = get_global_id(2);
    __global const ushort *Ag = (__global const ushort *)A + a_off + bz * a_bstride;
    __global const ushort *Bg = (__global const ushort *)B + b_off + bz * b_bstride;
    C += c_off + bz * c_bstride;
    // loads of 8 halves: A chunk c = tid + 256 l is row c / ACH at k (c % ACH) * 8; B chunk
    // c is rows 2 (c >> 4), 2 (c >> 4) + 1 at n (c & 15) * 8
    __global const ushort *pa = Ag + (size_t)m0 * lda;
    __global const ushort *pb = Bg + n0;
    uint4 ra[NA], rb[2 * NB];
#pragma unroll
    for (int l = 0; l < NA; ++l) {
        const int c = tid + 256 * l;
        ra[l] = *(__global const uint4 *)(pa + (size_t)(c / ACH) * lda + (c % ACH) * 8);
    }
#pragma unroll
    for (int l = 0; l < NB; ++l) {
        const int c = tid + 256 * l;
        __global const ushort *q = pb + (size_t)(2 * (c >> 4)) * ldb + (c & 15) * 8;
        rb[2 * l] = *(__global const uint4 *)q;
        rb[2 * l + 1] = *(__global const uint4 *)(q + ldb);
    }

    float acc[4][4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j)
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += MDEPTH) {
#pragma unroll
        for (int l = 0; l < NA; ++l) {
            const int c = tid + 256 * l;
            *(__local uint4 *)&As[(c / ACH) * MROW + (c % ACH) * 8] = ra[l];
        }
#pragma unroll
        for (int l = 0; l < NB; ++l) {  // interleave two rows: word n = (B[k][n], B[k + 1][n])
            const int c = tid + 256 * l;
            const uint4 r0 = rb[2 * l], r1 = rb[2 * l + 1];
            const uint4 lo = (uint4)(PAIR_LO(r0.x, r1.x), PAIR_HI(r0.x, r1.x),
                                     PAIR_LO(r0.y, r1.y), PAIR_HI(r0.y, r1.y));
            const uint4 hi = (uint4)(PAIR_LO(r0.z, r1.z), PAIR_HI(r0.z, r1.z),
                                     PAIR_LO(r0.w, r1.w), PAIR_HI(r0.w, r1.w));
            *(__local uint4 *)&Bs[(c >> 4) * BROW + (c & 15) * 8] = lo;
            *(__local uint4 *)&Bs[(c >> 4) * BROW + (c & 15) * 8 + 4] = hi;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + MDEPTH < K) {  // the next tiles, in flight during this one's arithmetic
            pa += MDEPTH;
            pb += (size_t)MDEPTH * ldb;
#pragma unroll
            for (int l = 0; l < NA; ++l) {
                const int c = tid + 256 * l;
                ra[l] = *(__global const uint4 *)(pa + (size_t)(c / ACH) * lda + (c % ACH) * 8);
            }
#pragma unroll
            for (int l = 0; l < NB; ++l) {
                const int c = tid + 256 * l;
                __global const ushort *q = pb + (size_t)(2 * (c >> 4)) * ldb + (c & 15) * 8;
                rb[2 * l] = *(__global const uint4 *)q;
                rb[2 * l + 1] = *(__global const uint4 *)(q + ldb);
            }
        }
#pragma unroll
        for (int kk = 0; kk < MDEPTH; kk += 16) {
            uint a[4][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                __local const ushort *r0 = &As[(wm + i * 16 + g) * MROW + kk + 2 * t];
                __local const ushort *r1 = r0 + 8 * MROW;
                a[i][0] = *(__local const uint *)r0;
                a[i][1] = *(__local const uint *)r1;
                a[i][2] = *(__local const uint *)(r0 + 8);
                a[i][3] = *(__local const uint *)(r1 + 8);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {  // k-pairs (2t, 2t + 1) and (2t + 8, 2t + 9) of column g
                __local const uint *r = &Bs[(kk / 2 + t) * BROW + wn + j * 8 + g];
                b[j][0] = r[0];
                b[j][1] = r[4 * BROW];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma16816(acc[i][j], a[i], b[j][0], b[j][1]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int row = m0 + wm + i * 16 + g, col = n0 + wn + j * 8 + 2 * t;
            vstore_half2((float2)(acc[i][j][0], acc[i][j][1]), 0, C + (size_t)row * ldc + col);
            vstore_half2((float2)(acc[i][j][2], acc[i][j][3]), 0,
                         C + (size_t)(row + 8) * ldc + col);
        }
}
#endif
