// GEMM of any shape and strides for GPUs: C[b] = A[b] @ B[b], where the tiled kernels of gemm.cl
// do not take the product (M or N not a multiple of 128, a transposed or strided view, few
// output tiles over a long K: x.T @ x of a tall x). float32 arithmetic on float32 or float16
// storage (DT 0 / 1).
//
//   gemm_any    a work-group of 256 work-items computes a 64x64 tile of C over one slice of K:
//               4x4 values per work-item from registers, A and B tiles of depth 16 staged in
//               local memory, elements past an edge read as zeros. Element (m, k) of A is read at
//               A[a_off + b*sab + m*sam + k*sak] and (k, n) of B at B[b_off + b*sbb + k*sbk +
//               n*sbn], so that a transposed view needs no copy (A_KFAST / B_NFAST: the loads walk
//               k / n fastest, for A / B whose stride there is 1). Group z of the grid takes
//               batch z / S and slice z % S of K (KS deep): with PART, it writes its sums as
//               float32 to P[z] ([M][N]) and splitk_sum adds the S slices up in order, so that
//               a result repeats exactly whatever runs first; without, C[b] directly.
//   gemm_any_mma  the same on float16 storage through NVIDIA's tensor cores (MMA; below).
//   splitk_sum  C[b][m][n] = sum over s < S, in order, of P[b * S + s][m][n].
//
// Work geometry: gemm_any global (ceil(N / 64) * 16, ceil(M / 64) * 16, batch * S), local
// (16, 16, 1); splitk_sum global (N, M, batch), any local size.

#ifndef DT
#define DT 0
#endif
#ifndef A_KFAST
#define A_KFAST 0
#endif
#ifndef B_NFAST
#define B_NFAST 1
#endif
#ifndef PART
#define PART 0
#endif
#ifndef MMA
#define MMA 0
#endif
#ifndef VEC_A
#define VEC_A 0
#endif
#ifndef VEC_B
#define VEC_B 0
#endif

#if DT == 0
#define IN_T float
#define LD(p, i) ((p)[i])
#define OUT_T float
#define ST(v, p, i) ((p)[i] = (v))
#else
#define IN_T half
#define LD(p, i) vload_half(0, (p) + (i))
#define OUT_T half
#define ST(v, p, i) vstore_half((v), 0, (p) + (i))
#endif

#define GT 64         // rows and columns of the tile of C
#define GD 16         // depth of the A and B tiles
#define GR (GT + 4)   // floats per local row (16-byte aligned rows)

// The place (k, row or column) in a GD x GT tile of its element e of 1024, in the order the
// loads walk memory: k fastest where kfast, else the row or column.
inline int2 tile_place(int e, int kfast) {
    return kfast ? (int2)(e % GD, e / GD) : (int2)(e / GT, e % GT);
}

__kernel __attribute__((reqd_work_group_size(16, 16, 1)))
void gemm_any(
#if PART
              __global float *C,
#else
              __global OUT_T *C,
#endif
              long c_off, long scb, long scm,
              __global const IN_T *A, long a_off, long sab, long sam, long sak,
              __global const IN_T *B, long b_off, long sbb, long sbk, long sbn,
              int M, int N, int K, int S, int KS) {
    __local float As[GD * GR] __attribute__((aligned(16)));  // As[k][m]
    __local float Bs[GD * GR] __attribute__((aligned(16)));  // Bs[k][n]
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int tid = ty * 16 + tx;
    const int n0 = get_group_id(0) * GT, m0 = get_group_id(1) * GT;
    const int z = get_group_id(2);
    const int b = z / S, s = z % S;
    const int k0 = s * KS, k1 = min(K, k0 + KS);
    __global const IN_T *Ab = A + a_off + b * sab;
    __global const IN_T *Bb = B + b_off + b * sbb;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int kt = k0; kt < k1; kt += GD) {
        // each tile holds 1024 elements: 4 per work-item
        for (int i = 0; i < 4; ++i) {
            const int e = tid + i * 256;
            const int2 pa = tile_place(e, A_KFAST), pb = tile_place(e, !B_NFAST);
            const int m = m0 + pa.y, k = kt + pa.x;
            As[pa.x * GR + pa.y] = (m < M && k < k1) ? (float)LD(Ab, m * sam + k * sak) : 0.0f;
            const int n = n0 + pb.y, k2 = kt + pb.x;
            Bs[pb.x * GR + pb.y] = (n < N && k2 < k1) ? (float)LD(Bb, k2 * sbk + n * sbn) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < GD; ++kk) {
            const float4 a = vload4(0, As + kk * GR + ty * 4);
            const float4 v = vload4(0, Bs + kk * GR + tx * 4);
            const float av[4] = {a.x, a.y, a.z, a.w};
            for (int i = 0; i < 4; ++i) {
                acc[i][0] = fma(av[i], v.x, acc[i][0]);
                acc[i][1] = fma(av[i], v.y, acc[i][1]);
                acc[i][2] = fma(av[i], v.z, acc[i][2]);
                acc[i][3] = fma(av[i], v.w, acc[i][3]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + ty * 4 + i;
        if (m >= M) break;
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + tx * 4 + j;
            if (n >= N) break;
#if PART
            C[((long)z * M + m) * N + n] = acc[i][j];
#else
            ST(acc[i][j], C, c_off + b * scb + m * scm + n);
#endif
        }
    }
}

#if MMA
// gemm_any_mma: gemm_any's product (the same arguments, geometry, tiles of C and slices of K) on
// float16 storage through tensor cores (NVIDIA mma.sync m16n8k16, float32 sums). The A and B
// tiles are 32 deep, staged as float16 in local memory (A as [m][k], B as [n][k], so that a
// fragment's k-pairs are one word), elements past an edge zeros (VEC_A / VEC_B: a view whose
// stride is 1 along one axis and whose other strides and offset are multiples of 8 is read 16
// bytes a load, 8 values along that axis a work-item); warp w of the 8 takes rows
// 16 (w % 4) .. + 15 and columns 32 (w / 4) .. + 31 of the tile: four mma a step of 16 k.
#include "clops/ptx.cl"  // mma16816

#define MD 32             // depth of the A and B tiles
#define MLD (MD + 8)      // halves per local row: fragment reads spread over the banks
#define ML (GT * MD / 256)  // elements of each tile a work-item loads

// Element e of a tile (a work-item takes e = its id + 256 i), in the order memory is walked (k
// fastest where the stride along k is 1, else the row or column): its k and its row (A) or
// column (B). PERF (H200): the next tile loaded into registers during this one's mma (and
// tiles 64 deep) was slower: 3000^3 24 against 36 TFLOP/s.
#define A_K(e) (A_KFAST ? (e) % MD : (e) / GT)
#define A_R(e) (A_KFAST ? (e) / MD : (e) % GT)
#define B_K(e) (B_NFAST ? (e) / GT : (e) % MD)
#define B_C(e) (B_NFAST ? (e) % GT : (e) / MD)

__kernel __attribute__((reqd_work_group_size(16, 16, 1)))
void gemm_any_mma(
#if PART
                  __global float *C,
#else
                  __global half *C,
#endif
                  long c_off, long scb, long scm,
                  __global const half *A, long a_off, long sab, long sam, long sak,
                  __global const half *B, long b_off, long sbb, long sbk, long sbn,
                  int M, int N, int K, int S, int KS) {
    __local ushort As[GT * MLD] __attribute__((aligned(16)));  // As[m][k]
    __local ushort Bs[GT * MLD] __attribute__((aligned(16)));  // Bs[n][k]
    const int tid = get_local_id(1) * 16 + get_local_id(0);
    const int lane = tid % 32, w = tid / 32;
    const int g = lane / 4, t = lane % 4;
    const int wm = (w % 4) * 16, wn = (w / 4) * 32;
    const int n0 = get_group_id(0) * GT, m0 = get_group_id(1) * GT;
    const int z = get_group_id(2);
    const int b = z / S, s = z % S;
    const int k0 = s * KS, k1 = min(K, k0 + KS);
    __global const ushort *Ab = (__global const ushort *)A + a_off + b * sab;
    __global const ushort *Bb = (__global const ushort *)B + b_off + b * sbb;
    float acc[4][4];
    for (int j = 0; j < 4; ++j)
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
    for (int kt = k0; kt < k1; kt += MD) {
#if VEC_A
        {   // 8 values along the fast axis (stride 1, 16-byte aligned) a work-item
            const int r = A_KFAST ? tid / (MD / 8) : (tid % (GT / 8)) * 8;
            const int kk = A_KFAST ? (tid % (MD / 8)) * 8 : tid / (GT / 8);
            const int m = m0 + r, k = kt + kk;
            __global const ushort *p = Ab + m * sam + k * sak;
            ushort8 v = (ushort8)(0);
            if (A_KFAST ? (m < M && k + 8 <= k1) : (m + 8 <= M && k < k1)) {
                v = *(__global const ushort8 *)p;
            } else {
                ushort w[8];
                for (int i = 0; i < 8; ++i)
                    w[i] = (A_KFAST ? (m < M && k + i < k1) : (m + i < M && k < k1)) ? p[i]
                                                                                   : (ushort)0;
                v = (ushort8)(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]);
            }
            if (A_KFAST) {
                *(__local ushort8 *)(As + r * MLD + kk) = v;
            } else {
                const ushort w[8] = {v.s0, v.s1, v.s2, v.s3, v.s4, v.s5, v.s6, v.s7};
                for (int i = 0; i < 8; ++i) As[(r + i) * MLD + kk] = w[i];
            }
        }
#else
        for (int i = 0; i < ML; ++i) {
            const int e = tid + i * 256;
            const int m = m0 + A_R(e), k = kt + A_K(e);
            As[A_R(e) * MLD + A_K(e)] = (m < M && k < k1) ? Ab[m * sam + k * sak] : (ushort)0;
        }
#endif
#if VEC_B
        {   // likewise: n fastest (B_NFAST) or k fastest
            const int c = B_NFAST ? (tid % (GT / 8)) * 8 : tid / (MD / 8);
            const int kk = B_NFAST ? tid / (GT / 8) : (tid % (MD / 8)) * 8;
            const int n = n0 + c, k = kt + kk;
            __global const ushort *p = Bb + k * sbk + n * sbn;
            ushort8 v = (ushort8)(0);
            if (B_NFAST ? (n + 8 <= N && k < k1) : (n < N && k + 8 <= k1)) {
                v = *(__global const ushort8 *)p;
            } else {
                ushort w[8];
                for (int i = 0; i < 8; ++i)
                    w[i] = (B_NFAST ? (n + i < N && k < k1) : (n < N && k + i < k1)) ? p[i]
                                                                                   : (ushort)0;
                v = (ushort8)(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]);
            }
            if (B_NFAST) {
                const ushort w[8] = {v.s0, v.s1, v.s2, v.s3, v.s4, v.s5, v.s6, v.s7};
                for (int i = 0; i < 8; ++i) Bs[(c + i) * MLD + kk] = w[i];
            } else {
                *(__local ushort8 *)(Bs + c * MLD + kk) = v;
            }
        }
#else
        for (int i = 0; i < ML; ++i) {
            const int e = tid + i * 256;
            const int n = n0 + B_C(e), k2 = kt + B_K(e);
            Bs[B_C(e) * MLD + B_K(e)] = (n < N && k2 < k1) ? Bb[k2 * sbk + n * sbn] : (ushort)0;
        }
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < MD; kk += 16) {
            uint a[4];
            __local const ushort *pa = As + (wm + g) * MLD + kk + 2 * t;
            a[0] = *(__local const uint *)pa;
            a[1] = *(__local const uint *)(pa + 8 * MLD);
            a[2] = *(__local const uint *)(pa + 8);
            a[3] = *(__local const uint *)(pa + 8 * MLD + 8);
            for (int j = 0; j < 4; ++j) {
                __local const ushort *pb = Bs + (wn + 8 * j + g) * MLD + kk + 2 * t;
                mma16816(acc[j], a, *(__local const uint *)pb, *(__local const uint *)(pb + 8));
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int j = 0; j < 4; ++j) {
        for (int i = 0; i < 4; ++i) {
            const int m = m0 + wm + g + (i / 2) * 8, n = n0 + wn + 8 * j + 2 * t + i % 2;
            if (m >= M || n >= N) continue;
#if PART
            C[((long)z * M + m) * N + n] = acc[j][i];
#else
            vstore_half(acc[j][i], 0, C + c_off + b * scb + m * scm + n);
#endif
        }
    }
}
#endif

// pad_copy: dst[b] ([MP][KP], contiguous) = the (M, K) matrix b of a view (element (m, k) at
// src[s_off + b*ssb + m*ssm + k*ssk]) with zeros past its edges, for the tiled kernels of
// gemm.cl: tiles of 32 x 32 through local memory, read along the view's fast axis (k where
// its stride is 1, else m: a transposed view) and written along k. Global (KP, MP / 4, batch),
// local (32, 8, 1).
__kernel __attribute__((reqd_work_group_size(32, 8, 1)))
void pad_copy(__global ushort *dst, __global const ushort *src, long s_off, long ssb,
              long ssm, long ssk, int M, int K, int MP, int KP) {
    __local ushort tile[32][33];
    const int tx = get_local_id(0), ty = get_local_id(1), b = get_group_id(2);
    const int k0 = get_group_id(0) * 32, m0 = get_group_id(1) * 32;
    __global const ushort *s = src + s_off + b * ssb;
    for (int j = ty; j < 32; j += 8) {
        const int m = ssk == 1 ? m0 + j : m0 + tx, k = ssk == 1 ? k0 + tx : k0 + j;
        const ushort v = (m < M && k < K) ? s[m * ssm + k * ssk] : (ushort)0;
        if (ssk == 1) tile[j][tx] = v; else tile[tx][j] = v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int j = ty; j < 32; j += 8) {
        const int m = m0 + j, k = k0 + tx;
        if (m < MP && k < KP) dst[((long)b * MP + m) * KP + k] = tile[j][tx];
    }
}

__kernel void splitk_sum(__global OUT_T *C, long c_off, long scb, long scm,
                         __global const float *P, int S, int M, int N) {
    const int n = get_global_id(0), m = get_global_id(1), b = get_global_id(2);
    if (n >= N || m >= M) return;
    float v = 0.0f;
    for (int s = 0; s < S; ++s) v += P[((long)(b * S + s) * M + m) * N + n];
    ST(v, C, c_off + b * scb + m * scm + n);
}
