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

__kernel void splitk_sum(__global OUT_T *C, long c_off, long scb, long scm,
                         __global const float *P, int S, int M, int N) {
    const int n = get_global_id(0), m = get_global_id(1), b = get_global_id(2);
    if (n >= N || m >= M) return;
    float v = 0.0f;
    for (int s = 0; s < S; ++s) v += P[((long)(b * S + s) * M + m) * N + n];
    ST(v, C, c_off + b * scb + m * scm + n);
}
