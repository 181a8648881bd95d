// Dense GEMM for GPUs: C[b] = A[b] @ B[b], row-major, A [M][K], B [K][N], C [M][N].
//
//   gemm_tiled      portable: float32 or float16 storage (DT 0 / 1), float32 arithmetic. A
//                   work-group of 256 work-items computes a 128x128 tile of C, 8x8 values per
//                   work-item from registers; A and B tiles of depth 16 are staged in local memory
//                   while the next ones are read from global memory into registers.
//   gemm_mma_async  float16 inputs on NVIDIA tensor cores (inline PTX mma.sync m16n8k16, float32
//                   accumulation), tiles copied by cp.async into a ring of local stages, fragments
//                   read by ldmatrix; tile shapes are compile-time parameters (see below). Needs
//                   sm_80 PTX (cp.async); H100: 4 warps of 64x64, 128x128 tiles, depth 32,
//                   3 stages ran 4096^3 at 370 TFLOP/s (PyTorch 700).
//   gemm_wgmma      float16 inputs on Hopper's wgmma (sm_90a, reached by patching the PTX binary:
//                   see its comment below); H100 4096^3: 465-475 TFLOP/s (PyTorch 660-720), the
//                   mma.sync kernel above 366-372 in the same runs.
//   gemm_nt_mma     C (float32) = A B^T on tensor cores, B a linear layer's [N][K] weight: the
//                   products of an LLM prompt's rows (see its comment below).
//   gemm_nt_wgmma   the same product on wgmma (Hopper; WG_NT 1): H200, 512 rows of a 1B body's
//                   gate/up projection (16384 x 2048) in 93 us, 343 TFLOP/s (gemm_nt_mma: 287).
//   gemm_mma        the same instructions without cp.async / ldmatrix (plain loads through
//                   registers): 8 warps, each a 64x32 tile of the 128x128 tile, depth MDEPTH; the
//                   fallback where gemm_mma_async does not build (227 TFLOP/s on the H100).
//                   Both tensor-core kernels are only built where the "nvidia_ptx" probe succeeds.
//
// All need M % 128 == 0, N % 128 == 0, K % 16 (tiled) or K % 32 (mma) == 0, row strides and
// offsets multiples of 4 (tiled, float32) or 8 (float16) elements: the launcher checks.
// Work geometry: global (N / 128 * 256, M / 128, batch), local (256, 1, 1); gemm_mma_async:
// global (N / BN * NT, M / BM, batch), local (NT, 1, 1), NT = 32 x the number of warps.

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

// HAS_BIAS, ACCUM (gemm_nt_mma, gemm_nt_wgmma): add bias[n]; add into C instead of overwriting.
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef ACCUM
#define ACCUM 0
#endif
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

#include "clops/ptx.cl"  // mma16816

// The A fragment of mma16816 from a local [row][k] tile with rows ld halves apart, p at row g
// and k-pair 2t of the fragment: rows g and g + 8, k-pairs 2t and 2t + 8.
inline void frag_a(uint *a, __local const ushort *p, int ld) {
    a[0] = *(__local const uint *)p;
    a[1] = *(__local const uint *)(p + 8 * ld);
    a[2] = *(__local const uint *)(p + 8);
    a[3] = *(__local const uint *)(p + 8 * ld + 8);
}

// gemm_mma's global loads of the A and B tiles at pa, pb into registers ra, rb: A chunk
// c = tid + 256 l is row c / ACH at k (c % ACH) * 8; B chunk c is rows 2 (c >> 4) and
// 2 (c >> 4) + 1 at n (c & 15) * 8.
#define MMA_LOAD_TILES()                                                                   \
    do {                                                                                   \
        _Pragma("unroll") for (int l = 0; l < NA; ++l) {                                   \
            const int c = tid + 256 * l;                                                   \
            ra[l] = *(__global const uint4 *)(pa + (size_t)(c / ACH) * lda + (c % ACH) * 8); \
        }                                                                                  \
        _Pragma("unroll") for (int l = 0; l < NB; ++l) {                                   \
            const int c = tid + 256 * l;                                                   \
            __global const ushort *q = pb + (size_t)(2 * (c >> 4)) * ldb + (c & 15) * 8;   \
            rb[2 * l] = *(__global const uint4 *)q;                                        \
            rb[2 * l + 1] = *(__global const uint4 *)(q + ldb);                            \
        }                                                                                  \
    } while (0)

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
    __global const ushort *pa = Ag + (size_t)m0 * lda;
    __global const ushort *pb = Bg + n0;
    uint4 ra[NA], rb[2 * NB];
    MMA_LOAD_TILES();

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
            MMA_LOAD_TILES();
        }
#pragma unroll
        for (int kk = 0; kk < MDEPTH; kk += 16) {
            uint a[4][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                frag_a(a[i], As + (wm + i * 16 + g) * MROW + kk + 2 * t, MROW);
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

// gemm_nt_mma: C[m, n] (+)= sum_k A[m, k] B[n, k] (+ bias[n]) for m < M: float16 A [M][K] and
// B [N][K] (a linear layer's weight as stored), float32 C at c_off with rows ldc apart. The B
// fragments of mma.sync's "col" operand are pairs along k, so both tiles are kept [row][k] in
// local memory and read the same way. A work-group of 4 warps computes a 64x64 tile of C, each
// warp 32x32; depth 32; the next tiles are read into registers during this one's arithmetic.
// SPLIT > 1: work-group z of the grid takes the z-th of SPLIT equal slices of K and writes its
// sums to C + z * c_split (no bias, no accumulation; norm.cl's split_sum adds the slices up in
// order, so that results repeat exactly), so that products of few tiles and long K still fill
// the device.
// Needs N % 64 == 0, (K / SPLIT) % 32 == 0, 16-byte aligned rows of A and B; rows of A past M
// read as 0. Work geometry: global (N / 64 * 128, ceil(M / 64), SPLIT), local (128, 1, 1).
#ifndef SPLIT
#define SPLIT 1
#endif
// The epilogue of gemm_nt_mma and gemm_nt_wgmma: d[0], d[1] the sums at row, columns col and
// col + 1 of C, d[2], d[3] those at row + 8 (an mma accumulator fragment), each pair + bias
// (HAS_BIAS) + what C holds (ACCUM; neither where SPLIT > 1), rows from M on dropped.
inline void nt_store(__global float *C, int ldc, int M, int row, int col, const float *d,
                     __global const float *bias) {
#if HAS_BIAS && SPLIT == 1
    const float2 bv = vload2(0, bias + col);
#else
    const float2 bv = (float2)(0.0f);
#endif
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (row + 8 * h >= M) continue;
        __global float *p = C + (size_t)(row + 8 * h) * ldc + col;
        float2 v = (float2)(d[2 * h], d[2 * h + 1]) + bv;
#if ACCUM && SPLIT == 1
        v += vload2(0, p);
#endif
        vstore2(v, 0, p);
    }
}

// GLU (gemm_nt_wgmma): B's rows are [gate | up] (N of them) and C takes float16
// silu(gate) * up [M][N / 2] (c_off and ldc in halves): a tile of BN columns multiplies BN / 2
// gate rows and the up rows N / 2 after them. g[], u[]: a gate and an up fragment (as d[] of
// nt_store), at row, columns col and col + 1 of C.
#ifndef GLU
#define GLU 0
#endif
inline void glu_store(__global half *C, int ldc, int M, int row, int col, const float *g,
                      const float *u) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (row + 8 * h >= M) continue;
        const float2 a = (float2)(g[2 * h], g[2 * h + 1]), b = (float2)(u[2 * h], u[2 * h + 1]);
        vstore_half2(a / (1.0f + exp(-a)) * b, 0, C + (size_t)(row + 8 * h) * ldc + col);
    }
}

#define NTT 64           // rows and columns of the tile of C
#define NTK 32           // depth of the A and B tiles
#define NTR (NTK + 8)    // halves per local row: 80 bytes, so fragment reads hit all banks

__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void gemm_nt_mma(__global float *C, int c_off, int ldc, __global const half *A, int lda,
                 __global const half *B, int ldb, __global const float *bias, int M, int N,
                 int K, long c_split) {
    __local ushort As[NTT * NTR] __attribute__((aligned(16)));  // As[m][k]
    __local ushort Bs[NTT * NTR] __attribute__((aligned(16)));  // Bs[n][k]
    const int tid = get_local_id(0);
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int m0 = get_group_id(1) * NTT, n0 = get_group_id(0) * NTT;
#if SPLIT > 1
    K /= SPLIT;  // this group's slice of the depth, and of the partial sums
    A += (size_t)get_group_id(2) * K;
    B += (size_t)get_group_id(2) * K;
    C += get_group_id(2) * c_split;
#endif
    // this work-item's two 16-byte chunks of each tile: row c / 4, halves (c % 4) * 8 + 0..7
    __global const uint4 *pa[2], *pb[2];
    bool in_m[2];
    int at[2];
#pragma unroll
    for (int l = 0; l < 2; ++l) {
        const int c = tid + 128 * l, r = c >> 2, col = (c & 3) * 8;
        in_m[l] = m0 + r < M;
        pa[l] = (__global const uint4 *)((__global const ushort *)A +
                                         (size_t)min(m0 + r, M - 1) * lda + col);
        pb[l] = (__global const uint4 *)((__global const ushort *)B + (size_t)(n0 + r) * ldb +
                                         col);
        at[l] = r * NTR + col;
    }
    uint4 ra[2], rb[2];
#pragma unroll
    for (int l = 0; l < 2; ++l) {
        ra[l] = in_m[l] ? pa[l][0] : (uint4)(0u);
        rb[l] = pb[l][0];
    }
    float acc[2][4][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j)
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += NTK) {
#pragma unroll
        for (int l = 0; l < 2; ++l) {
            *(__local uint4 *)&As[at[l]] = ra[l];
            *(__local uint4 *)&Bs[at[l]] = rb[l];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + NTK < K) {  // 16-byte chunks: NTK / 8 of them per tile row and step
#pragma unroll
            for (int l = 0; l < 2; ++l) {
                ra[l] = in_m[l] ? pa[l][(k0 + NTK) / 8] : (uint4)(0u);
                rb[l] = pb[l][(k0 + NTK) / 8];
            }
        }
#pragma unroll
        for (int kk = 0; kk < NTK; kk += 16) {
            uint a[2][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                frag_a(a[i], As + (wm + i * 16 + g) * NTR + kk + 2 * t, NTR);
#pragma unroll
            for (int j = 0; j < 4; ++j) {  // k-pairs (2t, 2t + 1) and (2t + 8, 2t + 9) of column g
                __local const ushort *r = &Bs[(wn + j * 8 + g) * NTR + kk + 2 * t];
                b[j][0] = *(__local const uint *)r;
                b[j][1] = *(__local const uint *)(r + 8);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma16816(acc[i][j], a[i], b[j][0], b[j][1]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    C += c_off;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            nt_store(C, ldc, M, m0 + wm + i * 16 + g, n0 + wn + j * 8 + 2 * t, acc[i][j], bias);
}
#if defined(USE_MMA_ASYNC) || defined(USE_WGMMA)
// The shared-space address of a local pointer: NVIDIA's compiler may hand over the pointer as a
// shared-window offset or as a generic address; isspacep tells which.
inline uint smem_addr(__local const void *p) {
    uint r;
    asm volatile("{ .reg .pred q; .reg .u64 s; isspacep.shared q, %1; cvta.to.shared.u64 s, %1;"
                 " selp.u64 s, s, %1, q; cvt.u32.u64 %0, s; }"
                 : "=r"(r) : "l"((ulong)p));
    return r;
}

// The tile of C (x: column, y: row) of a gx x gy grid of tiles that comes pid-th in an order
// walking C in bands of raster tile rows, so that neighbours in that order share A and B tiles
// in L2.
inline int2 raster_of(int pid, int gx, int gy, int raster) {
    const int band = raster * gx;
    const int first = (pid / band) * raster, h = min(gy - first, raster);
    return (int2)((pid % band) / h, first + (pid % band) % h);
}

// The tile of C this work-group computes: raster_of its place in the grid, or (raster 0) the
// grid's own order.
inline int2 raster_tile(int raster) {
    const int bx = get_group_id(0), by = get_group_id(1);
    if (raster > 0)
        return raster_of(by * get_num_groups(0) + bx, get_num_groups(0), get_num_groups(1),
                         raster);
    return (int2)(bx, by);
}

inline void cp_async16(uint dst, __global const ushort *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"((ulong)src)
                 : "memory");
}
#endif

#ifdef USE_MMA_ASYNC
// gemm_mma_async: float16 tensor cores fed by cp.async (global -> local, no registers) through
// a STAGES-deep ring of local tiles, fragments read with ldmatrix. A work-group of
// (BM / WM) x (BN / WN) warps computes a BM x BN tile of C, each warp a WM x WN tile; depth BK.
// Local tiles are unpadded, their 16-byte chunks swizzled (XOR of the chunk index with bits of
// the row) so that the 8 rows an ldmatrix phase reads fall in 8 different bank groups.
// RASTER > 0: work-groups walk C in bands of RASTER tile rows, so that neighbours in launch
// order share A and B tiles in L2.
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 64
#endif
#ifndef BK
#define BK 32
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef RASTER
#define RASTER 8
#endif
#define WCOLS (BN / WN)
#define NT ((BM / WM) * WCOLS * 32)  // work-items
#define MI (WM / 16)                 // m16 tiles per warp
#define NJ (WN / 8)                  // n8 tiles per warp
#define AK8 (BK / 8)                 // 16-byte chunks per row of an A tile
#define BN8 (BN / 8)                 // and of a B tile
#define A_ST (BM * BK)               // halves per stage
#define B_ST (BK * BN)
#define NLA (BM * AK8 / NT)          // chunks per work-item and stage
#define NLB (BK * BN8 / NT)
#if BK == 32
#define ASW(r, c) ((c) ^ (((r) >> 1) & 3))  // rows of 64 bytes: two per 128-byte line
#else
#define ASW(r, c) ((c) ^ ((r) & 7))
#endif
#define BSW(k, c) ((c) ^ ((k) & 7))
#if STAGES == 2
#define CP_WAIT() asm volatile("cp.async.wait_group 0;" ::: "memory")
#elif STAGES == 3
#define CP_WAIT() asm volatile("cp.async.wait_group 1;" ::: "memory")
#else
#define CP_WAIT() asm volatile("cp.async.wait_group 2;" ::: "memory")
#endif

// one stage: this work-item's chunks of the A and B tiles at qa, qb into local sa, sb
inline void load_tile(uint sa, uint sb, __global const ushort *qa, __global const ushort *qb,
                      const size_t *ga, const size_t *gb, const uint *da, const uint *db) {
#pragma unroll
    for (int l = 0; l < NLA; ++l) cp_async16(sa + da[l], qa + ga[l]);
#pragma unroll
    for (int l = 0; l < NLB; ++l) cp_async16(sb + db[l], qb + gb[l]);
}

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void gemm_mma_async(__global half *C, int c_off, int ldc, long c_bstride,
                    __global const half *A, int a_off, int lda, long a_bstride,
                    __global const half *B, int b_off, int ldb, long b_bstride,
                    int M, int N, int K) {
    __local ushort As[STAGES * A_ST] __attribute__((aligned(128)));  // As[s][m][k], swizzled
    __local ushort Bs[STAGES * B_ST] __attribute__((aligned(128)));  // Bs[s][k][n], swizzled
    const int tid = get_local_id(0);
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp / WCOLS) * WM, wn = (warp % WCOLS) * WN;
    const int2 tile = raster_tile(RASTER);
    const int m0 = tile.y * BM, n0 = tile.x * BN;
    const long bz = get_global_id(2);
    __global const ushort *pa = (__global const ushort *)A + a_off + bz * a_bstride
        + (size_t)m0 * lda;
    __global const ushort *pb = (__global const ushort *)B + b_off + bz * b_bstride + n0;
    C += c_off + bz * c_bstride;
    const uint sa = smem_addr(As), sb = smem_addr(Bs);

    // this work-item's chunks: A chunk c = tid + NT l is row c / AK8, k (c % AK8) * 8; B chunk c
    // is row c / BN8, n (c % BN8) * 8
    size_t ga[NLA], gb[NLB];
    uint da[NLA], db[NLB];
#pragma unroll
    for (int l = 0; l < NLA; ++l) {
        const int c = tid + NT * l, r = c / AK8, ch = c % AK8;
        ga[l] = (size_t)r * lda + ch * 8;
        da[l] = (uint)(r * BK + ASW(r, ch) * 8) * 2;
    }
#pragma unroll
    for (int l = 0; l < NLB; ++l) {
        const int c = tid + NT * l, r = c / BN8, ch = c % BN8;
        gb[l] = (size_t)r * ldb + ch * 8;
        db[l] = (uint)(r * BN + BSW(r, ch) * 8) * 2;
    }
    const int KT = K / BK;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_tile(sa + s * (A_ST * 2), sb + s * (B_ST * 2), pa + (size_t)s * BK,
                              pb + (size_t)s * BK * ldb, ga, gb, da, db);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }

    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    // ldmatrix rows of this lane: A row wm + 16 i + (lane & 15) at chunk 2 kk' + (lane >> 4);
    // B row kk + (lane & 7) + 8 ((lane >> 3) & 1) at chunk (wn + 16 jj) / 8 + (lane >> 4)
    const int ar = wm + (lane & 15), ahi = lane >> 4;
    const int bkr = (lane & 7) + ((lane >> 3) & 1) * 8, bhi = lane >> 4;
    int stage = 0;
    for (int kt = 0; kt < KT; ++kt) {
        CP_WAIT();
        barrier(CLK_LOCAL_MEM_FENCE);
        {
            const int nk = kt + STAGES - 1;
            int ns = stage + STAGES - 1;
            if (ns >= STAGES) ns -= STAGES;
            if (nk < KT)
                load_tile(sa + ns * (A_ST * 2), sb + ns * (B_ST * 2), pa + (size_t)nk * BK,
                          pb + (size_t)nk * BK * ldb, ga, gb, da, db);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        const uint sas = sa + stage * (A_ST * 2), sbs = sb + stage * (B_ST * 2);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint a[MI][4], b[NJ][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                const int r = ar + 16 * i, ch = kk / 8 + ahi;
                const uint p = sas + (uint)(r * BK + ASW(r, ch) * 8) * 2;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(a[i][0]), "=r"(a[i][1]), "=r"(a[i][2]), "=r"(a[i][3])
                             : "r"(p));
            }
#pragma unroll
            for (int jj = 0; jj < NJ / 2; ++jj) {
                const int r = kk + bkr, ch = (wn + 16 * jj) / 8 + bhi;
                const uint p = sbs + (uint)(r * BN + BSW(r, ch) * 8) * 2;
                asm volatile(
                    "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                    : "=r"(b[2 * jj][0]), "=r"(b[2 * jj][1]), "=r"(b[2 * jj + 1][0]),
                      "=r"(b[2 * jj + 1][1])
                    : "r"(p));
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NJ; ++j) mma16816(acc[i][j], a[i], b[j][0], b[j][1]);
        }
        if (++stage == STAGES) stage = 0;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int row = m0 + wm + i * 16 + g, col = n0 + wn + j * 8 + 2 * t;
            vstore_half2((float2)(acc[i][j][0], acc[i][j][1]), 0, C + (size_t)row * ldc + col);
            vstore_half2((float2)(acc[i][j][2], acc[i][j][3]), 0,
                         C + (size_t)(row + 8) * ldc + col);
        }
}
#endif
#ifdef USE_WGMMA
// gemm_wgmma: Hopper's warpgroup tensor-core instruction (wgmma.mma_async, PTX for sm_90a),
// tiles copied by cp.async into a STAGES-deep ring of local tiles that wgmma reads through
// matrix descriptors. NVIDIA's OpenCL compiler names .target sm_90 and its ptxas rejects wgmma
// there, so the sm_90a instructions are written as PTX comments ("//@@", WG_HIDE) and the host
// (gemm.py) builds this source, removes the markers from the PTX binary, names sm_90a and
// builds the PTX as a program binary (bench/probe_wgmma.py found this works: driver 580).
// A work-group of BM / 64 warpgroups computes a BM x BN tile of C, each warpgroup 64 rows of it
// with one m64nBNk16 instruction per 16 of depth (float32 accumulators, BN / 2 registers).
// Local tiles are "core matrices" of 8 rows x 16 bytes, 128 contiguous bytes each (no swizzle):
// A K-major, core (m / 8, k / 8) at ((m / 8) KC + k / 8) 128 bytes; B N-major (the descriptor's
// transposed operand), core (n / 8, k / 8) at ((n / 8) KC + k / 8) 128 bytes; the descriptors'
// leading offset (along k) is 128 bytes, the stride offset (along m or n) KC 128 bytes.
// WAITN 1: the wgmma of one tile stays in flight while the next is issued; tiles are then read
// STAGES - 2 ahead instead of STAGES - 1. Needs M % BM, N % BN, K % BK == 0, 16-byte rows.
#ifndef WG_HIDE_ON
#define WG_HIDE_ON 1
#endif
#if WG_HIDE_ON
#define WG_HIDE "//@@"
#else
#define WG_HIDE ""
#endif
#define WG_STR2(x) #x
#define WG_STR(x) WG_STR2(x)
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
#endif
#ifndef BK
#define BK 64
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef WAITN
#define WAITN 1
#endif
#ifndef RASTER
#define RASTER 8
#endif
#ifndef WS
#define WS 0  // producer warps (warp specialization, below); 0: every work-item copies
#endif
#ifndef TMA
#define TMA 0  // 1: the producers' copies by the tensor memory accelerator (below; needs WS)
#endif
#if TMA
#define TMA_MAPS , __global const ulong *maps
#else
#define TMA_MAPS
#endif
#define NWG (BM / 64)                // warpgroups of consumers
#define NTW (NWG * 128 + WS * 32)    // work-items
#define KC (BK / 8)                  // core matrices along k
#define WA_ST (BM * BK * 2)          // bytes per stage of A and of B
#define WB_ST (BK * BN * 2)
#define WNLA (BM * KC / NTW)         // 16-byte chunks per work-item and stage
#define WNLB (BN * KC / NTW)
#define LEAD (STAGES - 1 - WAITN)    // tiles read ahead
#ifndef SWZ
#define SWZ 1
#endif
#if SWZ && BK != 64
#error "gemm_wgmma: the 128-byte swizzle needs BK 64"
#endif
#ifndef B_SWAP  // B's descriptor offsets: LBO between 64-column slabs, SBO between 8-row groups
#define B_SWAP 0
#endif
#if B_SWAP
#define B_LBO 1024
#define B_SBO (BK * 128)
#else
#define B_LBO (BK * 128)
#define B_SBO 1024
#endif
#if LEAD == 1
#define CP_WAIT_LEAD "cp.async.wait_group 0;"
#elif LEAD == 2
#define CP_WAIT_LEAD "cp.async.wait_group 1;"
#elif LEAD == 3
#define CP_WAIT_LEAD "cp.async.wait_group 2;"
#elif LEAD == 4
#define CP_WAIT_LEAD "cp.async.wait_group 3;"
#else
#define CP_WAIT_LEAD "cp.async.wait_group 4;"
#endif
// WG_NT 1: gemm_nt_wgmma (B K-major, as stored [N][K]) instead of gemm_wgmma (B N-major):
// wgmma's transpose flag for B
#ifndef WG_NT
#define WG_NT 0
#endif
#if WG_NT
#define WG_TB "0"
#else
#define WG_TB "1"
#endif
#if BN == 256
#define WG_MMA wgmma_n256
#else
#define WG_MMA wgmma_n128
#endif

inline void wgmma_n128(float *d, ulong da, ulong db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" WG_HIDE
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
        "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
        "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, " WG_TB ";\n}"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
            "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
            "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
            "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
            "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
            "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
            "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
            "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
            "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
            "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
            "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
          : "l"(da), "l"(db));
}

inline void wgmma_n256(float *d, ulong da, ulong db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" WG_HIDE
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
        "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
        "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, "
        "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
        "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, "
        "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "
        "%125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, " WG_TB ";\n}"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
            "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
            "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
            "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
            "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
            "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
            "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
            "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
            "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
            "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
            "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]),
            "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
            "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
            "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
            "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
            "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
            "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),
            "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]),
            "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]),
            "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
            "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),
            "+f"(d[127])
          : "l"(da), "l"(db));
}

// a matrix descriptor: start address, leading and stride byte offsets, swizzle mode (0 none,
// 1 128-byte)
inline ulong wg_desc(uint addr, uint lbo, uint sbo, ulong swizzle) {
    return (ulong)((addr & 0x3ffff) >> 4) | ((ulong)(lbo >> 4) << 16) |
           ((ulong)(sbo >> 4) << 32) | (swizzle << 62);
}

inline void wg_load(uint sa, uint sb, __global const ushort *qa, __global const ushort *qb,
                    const size_t *ga, const size_t *gb, const uint *da, const uint *db) {
#pragma unroll
    for (int l = 0; l < WNLA; ++l) cp_async16(sa + da[l], qa + ga[l]);
#pragma unroll
    for (int l = 0; l < WNLB; ++l) cp_async16(sb + db[l], qb + gb[l]);
}

// acc += one stage's product: BK / 16 wgmma on A's tile at a0 (this warpgroup's 64 rows) and
// B's at b0, in flight as one batch; then until at most WAITN batches are in flight
inline void wg_stage(float *acc, uint a0, uint b0) {
    asm volatile(WG_HIDE "wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
#if WG_NT  // both K-major: k16 steps of 32 bytes into the swizzled rows
        WG_MMA(acc, wg_desc(a0 + kk * 32, 16, 1024, 1), wg_desc(b0 + kk * 32, 16, 1024, 1));
#elif SWZ  // A: k16 step 32 bytes into the swizzled rows; B: 16 rows of 128 bytes
        WG_MMA(acc, wg_desc(a0 + kk * 32, 16, 1024, 1),
               wg_desc(b0 + kk * 2048, B_LBO, B_SBO, 1));
#else
        WG_MMA(acc, wg_desc(a0 + kk * 256, 128, KC * 128, 0),
               wg_desc(b0 + kk * 256, 128, KC * 128, 0));
#endif
    asm volatile(WG_HIDE "wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile(WG_HIDE "wgmma.wait_group.sync.aligned " WG_STR(WAITN) ";" ::: "memory");
}

// acc (this work-item's BN / 2 sums, zeroed here) = the product of KT tiles of depth BK: A's
// and B's tiles copied by cp.async (wg_load; B's next tile b_step elements further on) into the
// ring of STAGES local stages LEAD ahead, each stage's wgmma for warpgroup wg issued once its
// copy is in. B's descriptor: gemm_wgmma's N-major tile, or (WG_NT) K-major like A's.
inline void wg_mainloop(float *acc, uint sa, uint sb, __global const ushort *pa,
                        __global const ushort *pb, size_t b_step, const size_t *ga,
                        const size_t *gb, const uint *da, const uint *db, int KT, int wg) {
#pragma unroll
    for (int s = 0; s < LEAD; ++s) {
        if (s < KT) wg_load(sa + s * WA_ST, sb + s * WB_ST, pa + (size_t)s * BK, pb + s * b_step,
                            ga, gb, da, db);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;

    int stage = 0, ls = LEAD % STAGES;  // the stage read now, the stage loaded next
    for (int kt = 0; kt < KT; ++kt) {
        asm volatile(CP_WAIT_LEAD ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        barrier(CLK_LOCAL_MEM_FENCE);
        {
            const int nk = kt + LEAD;
            if (nk < KT)
                wg_load(sa + ls * WA_ST, sb + ls * WB_ST, pa + (size_t)nk * BK, pb + nk * b_step,
                        ga, gb, da, db);
            asm volatile("cp.async.commit_group;" ::: "memory");
            if (++ls == STAGES) ls = 0;
        }
        wg_stage(acc, sa + stage * WA_ST + wg * (64 * BK * 2), sb + stage * WB_ST);
        if (++stage == STAGES) stage = 0;
    }
    asm volatile(WG_HIDE "wgmma.wait_group.sync.aligned 0;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

#if WS
// WS > 0: warp specialization. The work-group's first NWG warpgroups only issue wgmma (they
// are the consumers); WS more warps (the producers) only copy tiles with cp.async. Stage s of
// the ring is handed over through two mbarriers in local memory: full[s] completes when every
// producer has seen its copies of the stage land (cp.async.wait_group, then a proxy fence so
// that wgmma's reads see them, then an arrive), empty[s] when every consumer warp's wgmma that
// read it has finished. Neither side waits on a barrier of the whole work-group in the loop.
#define NCONS (NWG * 128)
#define NPROD (WS * 32)
#ifndef PLEAD
#define PLEAD 2  // a producer's copy groups in flight before it hands the oldest over
#endif
#if PLEAD == 1  // tile kt - PLEAD has landed once at most PLEAD - 1 newer groups are pending
#define CP_WAIT_PLEAD "cp.async.wait_group 0;"
#elif PLEAD == 2
#define CP_WAIT_PLEAD "cp.async.wait_group 1;"
#else
#define CP_WAIT_PLEAD "cp.async.wait_group 2;"
#endif
#if PLEAD + WAITN > STAGES
#error "gemm_wgmma: warp specialization needs PLEAD + WAITN <= STAGES"
#endif
#if !SWZ
#error "gemm_wgmma: the producers copy the 128-byte-swizzled layout only (SWZ 1)"
#endif
#if (BM * 8) % NPROD || NPROD % (BN / 8)
#error "gemm_wgmma: the producers must split the tiles' chunks evenly"
#endif

inline void mbar_init(uint bar, uint count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}

inline void mbar_arrive(uint bar) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared.b64 st, [%0]; }" :: "r"(bar)
                 : "memory");
}

// until the phase of bar with this parity (0 the first, 1 the second, 0 the third ...) is over
inline void mbar_wait(uint bar, uint parity) {
    uint done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared.b64 p, [%1], %2;"
                     " selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// One producer's n chunks of a K-major tile (rows of 128 bytes, the 128-byte swizzle): rows
// r0 + l NPROD / 8, each its 16-byte chunk k8, at byte 16 (k8 ^ r % 8) of the row (sw[j]: that
// byte in row r0 + j). src: row r0's chunk in global memory, step elements from a row to the
// next; clamp: rows from r0 + last on read row r0 + last.
inline void ws_km(uint dst, __global const ushort *src, int step, const uint *sw, int n,
                  bool clamp, int last) {
#pragma unroll
    for (int l = 0; l < n; ++l) {
        const int dr = l * (NPROD / 8);
        cp_async16(dst + dr * 128 + sw[dr & 7], src + (size_t)(clamp ? min(dr, last) : dr) * step);
    }
}

// Producer p's share of a tile's copies: A's BM rows (K-major) from pa, B's from pb (WG_NT:
// K-major as A's; else N-major, gemm_wgmma's layout above). A's rows from arows on read row
// arows - 1.
typedef struct {
    __global const ushort *a, *b;  // this producer's first chunk of A's and B's first tile
    uint da, db;                   // and its local byte in a stage
    uint swa[8];                   // the swizzled chunk's byte in rows r0 + j (j as used)
#if !WG_NT
    uint swb[8];                   // and of B's rows k0 + j (WG_NT: B's rows are A's)
#endif
    int alast;                     // A's last row, counted from this producer's first
} ws_chunks;

inline ws_chunks ws_setup(__global const ushort *pa, __global const ushort *pb, int lda, int ldb,
                          int arows, int p) {
    ws_chunks c;
    const int r0 = p >> 3, k8 = p & 7;
    c.a = pa + (size_t)r0 * lda + k8 * 8;
    c.da = r0 * 128;
    c.alast = arows - 1 - r0;
#pragma unroll
    for (int j = 0; j < 8; ++j) c.swa[j] = (k8 ^ ((r0 + j) & 7)) << 4;
#if WG_NT
    c.b = pb + (size_t)r0 * ldb + k8 * 8;
    c.db = r0 * 128;
#else  // B [K][N]: row k of the 64-column slab n / 64 at (n / 64) BK 128 + 128 k, swizzled
    const int n8 = p % (BN / 8), k0 = p / (BN / 8);
    c.b = pb + (size_t)k0 * ldb + n8 * 8;
    c.db = (n8 >> 3) * (BK * 128) + k0 * 128;
#pragma unroll
    for (int j = 0; j < 8; ++j) c.swb[j] = ((n8 & 7) ^ ((k0 + j) & 7)) << 4;
#endif
    return c;
}

// the copies of the tile a_off (A) and b_off (B) elements past the first into stage (sa, sb)
inline void ws_copy(const ws_chunks *c, uint sa, uint sb, size_t a_off, size_t b_off, int lda,
                    int ldb, bool clamp) {
    const uint da = sa + c->da, db = sb + c->db;
    __global const ushort *qa = c->a + a_off, *qb = c->b + b_off;
    if (clamp) ws_km(da, qa, lda, c->swa, BM * 8 / NPROD, true, c->alast);
    else ws_km(da, qa, lda, c->swa, BM * 8 / NPROD, false, 0);
#if WG_NT
    ws_km(db, qb, ldb, c->swa, BN * 8 / NPROD, false, 0);
#else
#pragma unroll
    for (int l = 0; l < BN * 8 / NPROD; ++l) {
        const int dk = l * (NPROD / (BN / 8));
        cp_async16(db + dk * 128 + c->swb[dk & 7], qb + (size_t)dk * ldb);
    }
#endif
}

#if TMA
// TMA 1 (gemm_wgmma): the tiles come by Hopper's tensor memory accelerator instead. One producer
// work-item issues a stage's copies (cp.async.bulk.tensor; full[s] counts their bytes). maps
// (the kernel's last argument): A's tensor map (dimensions k, m, batch; box BK x BM), then B's
// (n, k, batch; box 64 x BK, one copy per 64 columns of the tile), 128 bytes each, encoded by
// the host (runtime/tma.py) with the 128-byte swizzle, so that the tiles land as the cp.async
// path lays them out.
#if WG_NT || BK != 64
#error "gemm_wgmma: TMA needs gemm_wgmma's B and BK 64"
#endif
inline void tma3(uint dst, __global const ulong *map, int c0, int c1, int c2, uint bar) {
    asm volatile(WG_HIDE "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx"
                 "::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 :: "r"(dst), "l"((ulong)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}

// an arrival on bar that also tells it to expect this many bytes more this phase
inline void mbar_expect(uint bar, uint bytes) {
    asm volatile("{ .reg .b64 st; " WG_HIDE "mbarrier.arrive.expect_tx.shared.b64 st, [%0], %1;"
                 "\n}" :: "r"(bar), "r"(bytes) : "memory");
}

// the KT tiles of the tile of C at row m0, column n0, batch z: A's at (kt BK, m0), B's at n0,
// kt BK; a stage once the consumers have released it. g0: the ring's tiles before the first.
inline void ws_tma_producer(uint sa, uint sb, uint bars, __global const ulong *maps, int m0,
                            int n0, int z, int KT, int g0) {
    int s = g0 % STAGES, ph = g0 / STAGES & 1;  // the stage copied next, its use's parity
    for (int kt = 0; kt < KT; ++kt) {
        const int k = kt * BK;
        if (g0 + kt >= STAGES) mbar_wait(bars + 8 * (STAGES + s), ph ^ 1);
        const uint full = bars + 8 * s, db = sb + s * WB_ST;
        mbar_expect(full, WA_ST + WB_ST);
        tma3(sa + s * WA_ST, maps, k, m0, z, full);
        for (int j = 0; j < BN / 64; ++j)
            tma3(db + j * (BK * 128), maps + 16, n0 + 64 * j, k, z, full);
        if (++s == STAGES) s = 0, ph ^= 1;
    }
}
#endif

// this work-item's part of the product of KT tiles (A's next tile BK further on, B's b_step):
// a consumer's BN / 2 sums in acc; a producer's copies (A's rows from arows on read as row
// arows - 1). bars: 2 STAGES mbarriers (full, then empty), set up by ws_init. A producer hands
// tile kt over (full) once it has landed and tile kt + PLEAD - 1 is issued, and copies tile kt
// once the consumers have released the tile STAGES before it (empty). g0: the tiles that went
// through the ring before this product's first (PERSIST: the earlier tiles of C's), so the
// ring's stages and phases run on from them; the consumers release every stage they read.
inline void ws_mainloop(float *acc, uint sa, uint sb, uint bars, __global const ushort *pa,
                        __global const ushort *pb, size_t b_step, int lda, int ldb, int arows,
                        int KT, int tid, int g0) {
    if (tid >= NCONS) {
        const ws_chunks c = ws_setup(pa, pb, lda, ldb, arows, tid - NCONS);
        const bool clamp = arows < BM;
        // the stage copied next and its use's parity, the stage handed over next
        int s = g0 % STAGES, ph = g0 / STAGES & 1, hs = s;
        for (int kt = 0; kt < KT + PLEAD; ++kt) {
            if (kt >= PLEAD) {
                if (kt < KT) asm volatile(CP_WAIT_PLEAD ::: "memory");
                else asm volatile("cp.async.wait_group 0;" ::: "memory");
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                mbar_arrive(bars + 8 * hs);
                if (++hs == STAGES) hs = 0;
            }
            if (kt < KT) {
                if (g0 + kt >= STAGES) mbar_wait(bars + 8 * (STAGES + s), ph ^ 1);
                ws_copy(&c, sa + s * WA_ST, sb + s * WB_ST, (size_t)kt * BK, kt * b_step, lda,
                        ldb, clamp);
                asm volatile("cp.async.commit_group;" ::: "memory");
                if (++s == STAGES) s = 0, ph ^= 1;
            }
        }
        return;
    }
    const int wg = tid >> 7;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    // the stage read next and its use's parity, the stage released next
    int s = g0 % STAGES, ph = g0 / STAGES & 1, rs = s;
    for (int kt = 0; kt < KT; ++kt) {
        mbar_wait(bars + 8 * s, ph);
        wg_stage(acc, sa + s * WA_ST + wg * (64 * BK * 2), sb + s * WB_ST);
        // the stage WAITN tiles back is read: one arrival a warp
        if (kt >= WAITN) {
            if ((tid & 31) == 0) mbar_arrive(bars + 8 * (STAGES + rs));
            if (++rs == STAGES) rs = 0;
        }
        if (++s == STAGES) s = 0, ph ^= 1;
    }
    asm volatile(WG_HIDE "wgmma.wait_group.sync.aligned 0;" ::: "memory");
#if PERSIST  // and the last WAITN stages, now read, for the next tile's copies
    for (int kt = max(KT - WAITN, 0); kt < KT; ++kt) {
        if ((tid & 31) == 0) mbar_arrive(bars + 8 * (STAGES + rs));
        if (++rs == STAGES) rs = 0;
    }
#endif
}

// the full and empty mbarriers of the ring, by work-item 0, before anyone uses them
inline void ws_init(uint bars, int tid) {
    if (tid == 0)
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, TMA ? 1 : NPROD);  // arrivals before a stage is in
            mbar_init(bars + 8 * (STAGES + s), NCONS / 32);
        }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#else
#define NPROD 0
#endif

#ifndef PERSIST
#define PERSIST 0
#endif
#if PERSIST && !WS
#error "gemm_wgmma: PERSIST needs producer warps (WS)"
#endif

#if !WG_NT
// a consumer's sums (acc) into the tile of C at row m0, column n0: the j-th 8 columns of its
// warpgroup's 64 rows are rows 16 w + g (+ 8), columns 8 j + 2 t (+ 1) (w: the warp in it, g and
// t its lane / 4 and % 4)
inline void wg_store(__global half *C, int ldc, const float *acc, int m0, int n0, int tid) {
    const int wg = tid >> 7, w = (tid >> 5) & 3, g = (tid & 31) >> 2, t = tid & 3;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int row = m0 + 64 * wg + 16 * w + g, col = n0 + 8 * j + 2 * t;
        vstore_half2((float2)(acc[4 * j], acc[4 * j + 1]), 0, C + (size_t)row * ldc + col);
        vstore_half2((float2)(acc[4 * j + 2], acc[4 * j + 3]), 0,
                     C + (size_t)(row + 8) * ldc + col);
    }
}

// PERSIST 1 (with WS): a work-group a compute unit computes tiles of C one after another (the
// (N / BN) (M / BM) tiles of its batch in raster_of's order, every get_num_groups(0)-th from its
// group id on), its producers copying the next tile's first stages while the consumers store
// the last one's sums. Work geometry then (groups NTW, 1, batch), local (NTW, 1, 1).
__kernel __attribute__((reqd_work_group_size(NTW, 1, 1)))
void gemm_wgmma(__global half *C, int c_off, int ldc, long c_bstride,
                __global const half *A, int a_off, int lda, long a_bstride,
                __global const half *B, int b_off, int ldb, long b_bstride,
                int M, int N, int K TMA_MAPS) {
    __local ushort As[STAGES * BM * BK] __attribute__((aligned(1024)));
    __local ushort Bs[STAGES * BK * BN] __attribute__((aligned(1024)));
    const int tid = get_local_id(0);
    const long bz = get_global_id(2);
    __global const ushort *qa = (__global const ushort *)A + a_off + bz * a_bstride;
    __global const ushort *qb = (__global const ushort *)B + b_off + bz * b_bstride;
    C += c_off + bz * c_bstride;
    const uint sa = smem_addr(As), sb = smem_addr(Bs);
    float acc[BN / 2];
#if WS
    __local ulong bars[2 * STAGES];
    ws_init(smem_addr(bars), tid);
    const int KT = K / BK;
#if PERSIST
    const int gx = N / BN, gy = M / BM;
    int g0 = 0;
    for (int i = get_group_id(0); i < gx * gy; i += get_num_groups(0), g0 += KT) {
        const int2 tile = raster_of(i, gx, gy, RASTER);
#else
    {
        const int g0 = 0;
        const int2 tile = raster_tile(RASTER);
#endif
        const int m0 = tile.y * BM, n0 = tile.x * BN;
#if TMA
        if (tid >= NCONS) {
            if (tid == NCONS) ws_tma_producer(sa, sb, smem_addr(bars), maps, m0, n0, bz, KT, g0);
        } else
#endif
        ws_mainloop(acc, sa, sb, smem_addr(bars), qa + (size_t)m0 * lda, qb + n0,
                    (size_t)BK * ldb, lda, ldb, BM, KT, tid, g0);
        if (tid < NCONS) wg_store(C, ldc, acc, m0, n0, tid);
    }
#else
    const int wg = tid >> 7;
    const int2 tile = raster_tile(RASTER);
    const int m0 = tile.y * BM, n0 = tile.x * BN;
    __global const ushort *pa = qa + (size_t)m0 * lda, *pb = qb + n0;
    size_t ga[WNLA], gb[WNLB];
    uint da[WNLA], db[WNLB];
#if SWZ
    // 128-byte swizzle (BK 64): A row m at 128 m, its 16-byte chunk k8 at k8 ^ (m % 8); B row k
    // of the 64-column slab n / 64 at (n / 64) BK 128 + 128 k, chunk (n / 8) % 8 at that ^ (k % 8).
    // Chunk c = tid + NTW l of A is row c / 8, k8 c % 8; of B row c / (BN / 8), n8 c % (BN / 8).
#pragma unroll
    for (int l = 0; l < WNLA; ++l) {
        const int c = tid + NTW * l, r = c >> 3, k8 = c & 7;
        ga[l] = (size_t)r * lda + k8 * 8;
        da[l] = (uint)(r * 128 + ((k8 ^ (r & 7)) << 4));
    }
#pragma unroll
    for (int l = 0; l < WNLB; ++l) {
        const int c = tid + NTW * l, k = c / (BN / 8), n8 = c % (BN / 8);
        gb[l] = (size_t)k * ldb + n8 * 8;
        db[l] = (uint)((n8 >> 3) * (BK * 128) + k * 128 + (((n8 & 7) ^ (k & 7)) << 4));
    }
#else
    // this work-item's chunks. A chunk c = tid + NTW l: row 8 (c / 8 / KC) + c % 8, k-chunk
    // (c / 8) % KC, local byte 16 c. B chunk c: k row 8 kg + c % 8, n-chunk n8 = 2 nhi + nlo
    // (nlo = bit 3 of c, so that a warp reads whole 32-byte sectors), kg, nhi from c / 16.
#pragma unroll
    for (int l = 0; l < WNLA; ++l) {
        const int c = tid + NTW * l, r = ((c >> 3) / KC) * 8 + (c & 7);
        ga[l] = (size_t)r * lda + ((c >> 3) % KC) * 8;
        da[l] = (uint)c * 16;
    }
#pragma unroll
    for (int l = 0; l < WNLB; ++l) {
        const int c = tid + NTW * l, kr = c & 7, nlo = (c >> 3) & 1;
        const int kg = (c >> 4) % KC, n8 = ((c >> 4) / KC) * 2 + nlo;
        gb[l] = (size_t)(kg * 8 + kr) * ldb + n8 * 8;
        db[l] = (uint)((n8 * KC + kg) * 128 + kr * 16);
    }
#endif
    wg_mainloop(acc, sa, sb, pa, pb, (size_t)BK * ldb, ga, gb, da, db, K / BK, wg);
    wg_store(C, ldc, acc, m0, n0, tid);
#endif
}
#else
// gemm_nt_wgmma: gemm_nt_mma's product (float32 C (+)= A B^T (+ bias[n]), B a linear layer's
// [N][K] weight as stored; SPLIT slices of K as there) on wgmma. B is K-major like A, so both
// local tiles take A's 128-byte-swizzled layout above (B's BN rows in one descriptor, 8-row
// groups 1024 bytes apart) and wgmma reads B untransposed. Rows of A past M read row M - 1,
// rows of B past N row N - 1 (their sums are not stored). Needs N % 8 == 0 (WS, GLU:
// N % BN == 0), (K / SPLIT) % BK == 0, 16-byte rows. GLU (SPLIT 1, no bias or ACCUM): C takes
// float16 silu(gate) * up of [gate | up] rows B (glu_store).
// Work geometry: global (ceil(N / BN) * NTW, ceil(M / BM), SPLIT), local (NTW, 1, 1).
#if GLU && WS
#error "gemm_nt_wgmma: GLU takes the form without producer warps"
#endif
__kernel __attribute__((reqd_work_group_size(NTW, 1, 1)))
void gemm_nt_wgmma(__global float *C, int c_off, int ldc, __global const half *A, int lda,
                   __global const half *B, int ldb, __global const float *bias, int M, int N,
                   int K, long c_split) {
    __local ushort As[STAGES * BM * BK] __attribute__((aligned(1024)));
    __local ushort Bs[STAGES * BN * BK] __attribute__((aligned(1024)));
    const int tid = get_local_id(0);
    const int wg = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int2 tile = raster_tile(RASTER);
    const int m0 = tile.y * BM, n0 = tile.x * BN;
    __global const ushort *pa = (__global const ushort *)A;
    __global const ushort *pb = (__global const ushort *)B;
#if SPLIT > 1
    K /= SPLIT;  // this group's slice of the depth, and of the partial sums
    pa += (size_t)get_group_id(2) * K;
    pb += (size_t)get_group_id(2) * K;
    C += get_group_id(2) * c_split;
#endif
    const uint sa = smem_addr(As), sb = smem_addr(Bs);
    float acc[BN / 2];
#if WS
    // rows of A past M: the producers read row M - 1 instead (arows M - m0)
    __local ulong bars[2 * STAGES];
    ws_init(smem_addr(bars), tid);
    ws_mainloop(acc, sa, sb, smem_addr(bars), pa + (size_t)m0 * lda, pb + (size_t)n0 * ldb, BK,
                lda, ldb, M - m0, K / BK, tid, 0);
    if (tid >= NCONS) return;
#else
    // chunk c = tid + NTW l of a tile: row c / 8, 16-byte k-chunk k8 = c % 8, at local byte
    // 128 row + 16 (k8 ^ row % 8)
    size_t ga[WNLA], gb[WNLB];
    uint da[WNLA], db[WNLB];
#pragma unroll
    for (int l = 0; l < WNLA; ++l) {
        const int c = tid + NTW * l, r = c >> 3, k8 = c & 7;
        ga[l] = (size_t)min(m0 + r, M - 1) * lda + k8 * 8;
        da[l] = (uint)(r * 128 + ((k8 ^ (r & 7)) << 4));
    }
#pragma unroll
    for (int l = 0; l < WNLB; ++l) {
        const int c = tid + NTW * l, r = c >> 3, k8 = c & 7;
#if GLU  // the tile's gate rows, then their up rows
        const int nr = r < BN / 2 ? n0 / 2 + r : N / 2 + n0 / 2 + r - BN / 2;
#else
        const int nr = min(n0 + r, N - 1);
#endif
        gb[l] = (size_t)nr * ldb + k8 * 8;
        db[l] = (uint)(r * 128 + ((k8 ^ (r & 7)) << 4));
    }
    wg_mainloop(acc, sa, sb, pa, pb, BK, ga, gb, da, db, K / BK, wg);
#endif
    // accumulator j-th 8 columns: rows 16 w + g (+ 8), columns 8 j + 2 t (+ 1) of the warpgroup's
#if GLU
    // (a work-item holds gate column 8 j + 2 t (j < BN / 16) and its up column BN / 2 on)
#pragma unroll
    for (int j = 0; j < BN / 16; ++j)
        glu_store((__global half *)C + c_off, ldc, M, m0 + 64 * wg + 16 * w + g,
                  n0 / 2 + 8 * j + 2 * t, acc + 4 * j, acc + 4 * (j + BN / 16));
#else
    C += c_off;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
        if (n0 + 8 * j < N)  // (a last tile past N: its columns there not stored)
            nt_store(C, ldc, M, m0 + 64 * wg + 16 * w + g, n0 + 8 * j + 2 * t, acc + 4 * j,
                     bias);
#endif
}
#endif
#endif
#endif
