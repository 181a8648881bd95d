// A mixture of experts' grouped product (matmul.cl's matmul, matmul_cpu.cl's matmul_rb, EXPERTS
// 1): W, S and bias hold E experts' weights stacked, expert e's at W + e * w_stride,
// S + e * s_stride, bias + e * N; tile_e[t] is the expert whose weights row tile t (rows
// t * TM .., M a multiple of TM) meets, or -1 (a padding tile: its work-items store nothing).
//   EXPERT_ARGS     the kernel's trailing arguments (tile_e, w_stride, s_stride); empty at 0
//   TAKE_EXPERT(t)  W, S and bias moved to tile t's expert, or the work-item returns (a
//                   work-group's work-items share their tile: a padding tile's leave together)
#ifndef EXPERTS
#define EXPERTS 0
#endif
#if EXPERTS
#define EXPERT_ARGS , __global const int *tile_e, int w_stride, int s_stride
#if HAS_BIAS
#define EXPERT_BIAS(e) bias += (size_t)(e) * N
#else
#define EXPERT_BIAS(e)
#endif
#define TAKE_EXPERT(t)                          \
    const int expert = tile_e[t];               \
    if (expert < 0) return;                     \
    W += (size_t)expert * w_stride;             \
    S += (size_t)expert * s_stride;             \
    EXPERT_BIAS(expert)
#else
#define EXPERT_ARGS
#define TAKE_EXPERT(t)
#endif
