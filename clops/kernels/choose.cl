// Choosing a token, the parts sample.cl and argmax.cl share: the penalized logit, a
// work-group's sums and argmax (NT work-items, a power of two), and greedy_choose, the last
// step of an argmax over several work-groups (its includer includes fence.cl first).

#ifndef NT
#define NT 64
#endif

inline float penalized(__global const float *lg, __global const uchar *seen, int v,
                       float penalty) {
    float l = lg[v];
    if (penalty != 1.0f && seen[v]) l = l > 0.0f ? l / penalty : l * penalty;
    return l;
}

// The work-group's sum of v (NT work-items) through red, for float and uint.
#define REDUCE_ADD(NAME, T)                                      \
    inline T NAME(T v, __local T *red, int lid) {                \
        barrier(CLK_LOCAL_MEM_FENCE);                            \
        red[lid] = v;                                            \
        barrier(CLK_LOCAL_MEM_FENCE);                            \
        for (int s = NT / 2; s > 0; s >>= 1) {                   \
            if (lid < s) red[lid] += red[lid + s];               \
            barrier(CLK_LOCAL_MEM_FENCE);                        \
        }                                                        \
        return red[0];                                           \
    }
REDUCE_ADD(reduce_sum, float)
REDUCE_ADD(reduce_count, uint)

// The work-group's largest v and, on ties, the smallest index i (NT work-items, through redf
// and redi): every work-item gets the index in *arg and the value back.
inline float reduce_argmax(float v, int i, __local float *redf, __local int *redi, int lid,
                           int *arg) {
    redf[lid] = v;
    redi[lid] = i;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = NT / 2; s > 0; s >>= 1) {
        if (lid < s) {
            const float o = redf[lid + s];
            const int oi = redi[lid + s];
            if (o > redf[lid] || (o == redf[lid] && oi < redi[lid])) {
                redf[lid] = o;
                redi[lid] = oi;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    *arg = redi[0];
    return redf[0];
}

// The greedy choice once each work-group has its argmax (best, bi) of the penalized logits
// (first index on ties): the group's goes to z[2 g], z[2 g + 1]; the last group to finish (a
// ticket in state[3], zero between launches and left zero) picks among them, writes the id to
// tokens[state[0] + advance], sets seen[id] and moves state[0] on by advance.
inline void greedy_choose(float best, int bi, __global int *tokens, __global int *state,
                          __global uchar *seen, __global float *z, int V, int advance,
                          __local float *redf, __local int *redi, __local int *last) {
    const int lid = get_local_id(0), g = get_group_id(0), NG = get_num_groups(0);
    int am;
    const float m = reduce_argmax(best, bi, redf, redi, lid, &am);
    if (lid == 0) {
        z[2 * g] = m;
        z[2 * g + 1] = as_float(am);
    }
    GLOBAL_FENCE();
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (lid == 0) *last = atomic_inc(state + 3) == NG - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!*last) return;
    GLOBAL_FENCE();
    best = -INFINITY;
    bi = V;
    for (int q = lid; q < NG; q += NT) {  // (q rises: the first group's index of a tie stays)
        const float v = ((volatile __global const float *)z)[2 * q];
        const int i = as_int(((volatile __global const float *)z)[2 * q + 1]);
        if (v > best || (v == best && i < bi)) {
            best = v;
            bi = i;
        }
    }
    reduce_argmax(best, bi, redf, redi, lid, &am);
    if (lid == 0) {
        const int tok = min(am, V - 1);
        const int at = state[0] + advance;
        tokens[at] = tok;
        seen[tok] = 1;
        state[0] = at;
        state[3] = 0;
    }
}
