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
#define TAKE_EXPERT(t) TAKE_EXPERT_OF(tile_e[t])
#define TAKE_EXPERT_OF(e)                       \
    const int expert = (e);                     \
    if (expert < 0) return;                     \
    W += (size_t)expert * w_stride;             \
    S += (size_t)expert * s_stride;             \
    EXPERT_BIAS(expert)
#else
#define EXPERT_ARGS
#define TAKE_EXPERT(t)
#endif

// ROUTE (matmul.cl's QX with EXPERTS, a lone row's slots a tile each): the work-group finds the
// row's top TOPK of its ROUTE_E router logits itself (moe.cl's moe_route rule: by descending
// logit, an exact tie to the lower expert, a NaN below every number) and takes slot t's
// expert; the first work-group of each slot writes the slot's expert into tile_e[t] and its
// weight into wts[t] (ROUTE_NORM 1: the softmax over the chosen logits; 0: over all of them),
// for the launches after it. The kernel's last two arguments: logits, wts.
#ifndef ROUTE
#define ROUTE 0
#endif
#if ROUTE
#define ROUTE_ARGS , __global const float *logits, __global float *wts
// The expert of slot t (every work-item of the group calls it; rl [ROUTE_E] and chosen
// [TOPK] of local memory).
inline int route_slot(__global const float *logits, __global int *tile_e, __global float *wts,
                      int t, __local float *rl, __local int *chosen) {
    const int lid = get_local_id(0), gs = get_local_size(0);
    for (int e = lid; e < ROUTE_E; e += gs) {
        const float v = logits[e];
        rl[e] = isnan(v) ? -INFINITY : v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = lid; e < ROUTE_E; e += gs) {
        const float v = rl[e];
        int rank = 0;
        for (int f = 0; f < ROUTE_E; ++f) {
            const float u = rl[f];
            rank += u > v || (u == v && f < e);
        }
        if (rank < TOPK) chosen[rank] = e;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (get_group_id(0) == 0 && lid == 0) {
        const float mx = rl[chosen[0]];
        float s = 0.0f;
#if ROUTE_NORM
        for (int j = 0; j < TOPK; ++j) s += exp(rl[chosen[j]] - mx);
#else
        for (int e = 0; e < ROUTE_E; ++e) s += exp(rl[e] - mx);
#endif
        tile_e[t] = chosen[t];
        wts[t] = exp(rl[chosen[t]] - mx) / s;
    }
    return chosen[t];
}
#else
#define ROUTE_ARGS
#endif
