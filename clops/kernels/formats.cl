// The weight formats of the matrix-vector kernels (#include "clops/formats.cl": matmul.cl,
// matmul_cpu.cl), by WFMT (0 float32, 1 float16, 2 bfloat16, 3 q4, 4 q8, 5 the compact K-quants
// of the row layout, matmul.cl alone) and SCALE_HALF (1:
// the q4/q8 scales stored as half, 0: as float):
//   W_T                a weight's storage type (the 16 bits of a float16 or bfloat16: ushort)
//   SCALE_T            a scale's storage type
//   LOAD_SCALE(p, i)   scale i of p, as a float
//   LOAD16_SCALE(i, p) scales 16 i .. 16 i + 15 of p, as a float16
// and the q8 scales' parameters: QGROUP (values a scale: 32, or 16 for Q6_K), QMIN (1: a
// (scale, min) pair per QGROUP values, Q5_1, Q5_K, Q2_K)
#ifndef QGROUP
#define QGROUP 32
#endif
#ifndef QMIN
#define QMIN 0
#endif

#if WFMT == 0
#define W_T float
#elif WFMT == 1 || WFMT == 2
#define W_T ushort
#elif WFMT == 3 || WFMT == 5
#define W_T uchar
#else
#define W_T char
#endif

#if SCALE_HALF
#define SCALE_T half
#define LOAD_SCALE(p, i) vload_half((i), (p))
#define LOAD16_SCALE(i, p) vload_half16((i), (p))
#else
#define SCALE_T float
#define LOAD_SCALE(p, i) ((p)[i])
#define LOAD16_SCALE(i, p) vload16((i), (p))
#endif
