// A mixture of experts' routing on the device: each row's top-k experts and their weights
// (moe_route), the (row, slot) pairs grouped by expert into tiles of TILE rows (moe_align;
// moe_align_e on GPUs), the grouped rows of x (moe_gather), and each row's weighted sum of its
// experts' outputs (moe_combine). The grouped products between them are matmul.cl's /
// matmul_cpu.cl's with EXPERTS 1. Every kernel takes the row count M as an argument (a plan
// resizes it).
//
// Compile-time parameters (one program holds the four kernels; each reads its own):
//   TOPK, NORM  moe_route, moe_route_wg: experts a row; 1: weights renormalized over them
//   RL          moe_route_wg: the work-items of a row's work-group (a power of two)
//   NE, LS      moe_align, moe_align_e: the experts; the work-items of a work-group (a power
//               of two)
//   ACCUM       moe_combine: 1: add into out

#ifndef TOPK
#define TOPK 1
#endif
#ifndef NORM
#define NORM 0
#endif
#ifndef NE
#define NE 1
#endif
#ifndef LS
#define LS 1
#endif
#ifndef ACCUM
#define ACCUM 0
#endif
#ifndef RL
#define RL 1
#endif

// Row r's top TOPK experts of its E logits, by descending logit (an exact tie: the lower
// expert first), into ids[r * TOPK ..], and their weights into wts[r * TOPK ..]: NORM 1, the
// softmax over the TOPK chosen logits; NORM 0, exp(l - max) / sum over all E of exp(l - max).
// Work geometry: global (at least M), a work-item per row.
__kernel void moe_route(__global int *ids, __global float *wts, __global const float *logits,
                        int M, int E) {
    const int r = get_global_id(0);
    if (r >= M) return;
    __global const float *l = logits + (size_t)r * E;
    float best[TOPK];
    int idx[TOPK];
    int n = 0;  // places filled
    for (int e = 0; e < E; ++e) {
        const float v = l[e];
        if (n == TOPK && !(v > best[TOPK - 1])) continue;
        int j = n < TOPK ? n++ : TOPK - 1;  // the place freed: the last
        // (strictly greater moves up: an equal logit stays behind the lower expert)
        for (; j > 0 && v > best[j - 1]; --j) {
            best[j] = best[j - 1];
            idx[j] = idx[j - 1];
        }
        best[j] = v;
        idx[j] = e;
    }
    const float mx = best[0];
    float s = 0.0f;
#if NORM
    for (int j = 0; j < TOPK; ++j) s += exp(best[j] - mx);
#else
    for (int e = 0; e < E; ++e) s += exp(l[e] - mx);
#endif
    for (int j = 0; j < TOPK; ++j) {
        ids[(size_t)r * TOPK + j] = idx[j];
        wts[(size_t)r * TOPK + j] = exp(best[j] - mx) / s;
    }
}

#if RL > 1
// moe_route's choice and weights (the same ids; the weights' sums in another order) by a
// work-group of RL work-items a row: TOPK rounds, each the row's largest logit not chosen
// before (an exact tie: the lower expert; a NaN below every number), from each work-item's
// best of its share of the experts by a reduction in local memory. Work geometry: global
// (M * RL), local (RL).
inline bool before(float v, int e, float bv, int be) {
    return v > bv || (v == bv && e < be);
}
__kernel __attribute__((reqd_work_group_size(RL, 1, 1)))
void moe_route_wg(__global int *ids, __global float *wts, __global const float *logits,
                  int M, int E) {
    __local float lv[RL];
    __local int le[RL];
    __local int chosen[TOPK];
    __local float part[RL];
    const int r = get_group_id(0), t = get_local_id(0);
    if (r >= M) return;  // (the whole work-group)
    __global const float *l = logits + (size_t)r * E;
    for (int j = 0; j < TOPK; ++j) {
        float bv = -INFINITY;
        int be = E;  // (none yet: after every expert)
        for (int e = t; e < E; e += RL) {
            bool taken = false;
            for (int q = 0; q < j; ++q) taken |= chosen[q] == e;
            const float v = isnan(l[e]) ? -INFINITY : l[e];
            if (!taken && before(v, e, bv, be)) {
                bv = v;
                be = e;
            }
        }
        lv[t] = bv;
        le[t] = be;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int s = RL / 2; s > 0; s >>= 1) {
            if (t < s && before(lv[t + s], le[t + s], lv[t], le[t])) {
                lv[t] = lv[t + s];
                le[t] = le[t + s];
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (t == 0) chosen[j] = le[0];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float mx = l[chosen[0]];
    float s = 0.0f;
#if NORM
    for (int j = 0; j < TOPK; ++j) s += exp(l[chosen[j]] - mx);
#else
    for (int e = t; e < E; e += RL) s += exp(l[e] - mx);
    part[t] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = RL / 2; h > 0; h >>= 1) {
        if (t < h) part[t] += part[t + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    s = part[0];
#endif
    if (t < TOPK) {
        ids[(size_t)r * TOPK + t] = chosen[t];
        wts[(size_t)r * TOPK + t] = exp(l[chosen[t]] - mx) / s;
    }
}
#endif

// The sum over the work-group of each work-item's v, to all of them (buf: LS ints).
inline int group_sum(int v, __local int *buf) {
    const int t = get_local_id(0);
    buf[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = LS / 2; h > 0; h >>= 1) {
        if (t < h) buf[t] += buf[t + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const int s = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);  // (before buf's next use)
    return s;
}

// From ids [M * K] (pair v = r * K + j: row r's j-th expert): the P slots of the grouped rows,
// experts in ascending order, each expert's pairs in ascending v, each expert's group padded to
// a multiple of TILE. order[s]: the pair of slot s, -1 for padding; tile_e[t]: the expert of
// tile t (slots t * TILE ..), -1 past the last group; pos[v]: the slot of pair v. NE: the
// experts (a local count each). Work geometry: global (LS), local (LS): one work-group (CPUs:
// moe_align_e's work-groups, each counting every pair, took 30 times as long on PoCL).
__kernel __attribute__((reqd_work_group_size(LS, 1, 1)))
void moe_align(__global int *order, __global int *tile_e, __global int *pos,
               __global const int *ids, int M, int P, int K, int TILE) {
    __local int count[NE], start[NE], cursor[NE], chunk[LS];
    __local int total;
    const int t = get_local_id(0), V = M * K;
    for (int e = t; e < NE; e += LS) count[e] = cursor[e] = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int v = t; v < V; v += LS) atomic_inc(&count[clamp(ids[v], 0, NE - 1)]);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (t == 0) {
        int s = 0;
        for (int e = 0; e < NE; ++e) {
            start[e] = s;
            s += (count[e] + TILE - 1) / TILE * TILE;
        }
        total = s;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // each group's padding slots and tiles; the unused tail (slots none of the pairs take, so
    // these stores race with nothing below)
    for (int e = t; e < NE; e += LS) {
        const int s0 = start[e], c = count[e], end = s0 + (c + TILE - 1) / TILE * TILE;
        for (int s = s0 + c; s < end; ++s) order[s] = -1;
        for (int q = s0 / TILE; q < end / TILE; ++q) tile_e[q] = e;
    }
    for (int s = total + t; s < P; s += LS) order[s] = -1;
    for (int q = total / TILE + t; q < P / TILE; q += LS) tile_e[q] = -1;
    // the pairs, LS at a time in order of v: a pair's slot is its expert's start, the count
    // of its expert's pairs in the chunks before (cursor) and in this chunk before it
    for (int base = 0; base < V; base += LS) {
        const int v = base + t;
        const int e = v < V ? clamp(ids[v], 0, NE - 1) : -1;
        chunk[t] = e;
        barrier(CLK_LOCAL_MEM_FENCE);
        int rank = 0, last = 1;
        if (e >= 0) {
            for (int j = 0; j < LS; ++j)
                if (chunk[j] == e) {
                    if (j < t) ++rank;
                    else if (j > t) last = 0;
                }
            const int s = start[e] + cursor[e] + rank;
            order[s] = v;
            pos[v] = s;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (e >= 0 && last) cursor[e] += rank + 1;  // (the chunk's last pair of its expert)
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

// moe_align's slots (the same values) on GPUs. Work geometry: global (NE * LS), local (LS):
// work-group e places expert e's pairs (every group counts every expert's pairs, for its
// group's start), work-item t those of pairs t * ceil(V / LS) .. (after the ones before it:
// an exclusive prefix sum of the counts over the work-group); work-group 0 also the tail past
// the last group.
__kernel __attribute__((reqd_work_group_size(LS, 1, 1)))
void moe_align_e(__global int *order, __global int *tile_e, __global int *pos,
                 __global const int *ids, int M, int P, int K, int TILE) {
    __local int count[NE], buf[LS];
    const int t = get_local_id(0), e = get_group_id(0), V = M * K;
    for (int i = t; i < NE; i += LS) count[i] = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int v = t; v < V; v += LS) atomic_inc(&count[clamp(ids[v], 0, NE - 1)]);
    barrier(CLK_LOCAL_MEM_FENCE);
    // the start of e's group: the padded groups of the experts before it
    int before = 0, all = 0;
    for (int i = t; i < NE; i += LS) {
        const int padded = (count[i] + TILE - 1) / TILE * TILE;
        all += padded;
        before += i < e ? padded : 0;
    }
    const int start = group_sum(before, buf), total = group_sum(all, buf);
    const int c = count[e], end = start + (c + TILE - 1) / TILE * TILE;
    // the group's padding slots and tiles; work-group 0: the unused tail (slots none of the
    // pairs take: these stores race with nothing below)
    for (int s = start + c + t; s < end; s += LS) order[s] = -1;
    for (int q = start / TILE + t; q < end / TILE; q += LS) tile_e[q] = e;
    if (e == 0) {
        for (int s = total + t; s < P; s += LS) order[s] = -1;
        for (int q = total / TILE + t; q < P / TILE; q += LS) tile_e[q] = -1;
    }
    // the work-item's pairs of expert e, and the count of those before them (an exclusive
    // prefix sum over the work-group, Hillis-Steele)
    const int per = (V + LS - 1) / LS, v0 = min(t * per, V), v1 = min(v0 + per, V);
    int mine = 0;
    for (int v = v0; v < v1; ++v) mine += clamp(ids[v], 0, NE - 1) == e;
    buf[t] = mine;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = 1; h < LS; h <<= 1) {
        const int add = t >= h ? buf[t - h] : 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        buf[t] += add;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    int s = start + buf[t] - mine;
    for (int v = v0; v < v1; ++v)
        if (clamp(ids[v], 0, NE - 1) == e) {
            order[s] = v;
            pos[v] = s++;
        }
}

// xg[s, :] = x[order[s] / K, :] for s < P (zeros where order[s] < 0), rows of D floats.
// Work geometry: global (D, P).
__kernel void moe_gather(__global float *xg, __global const float *x,
                         __global const int *order, int P, int K, int D) {
    const int c = get_global_id(0), s = get_global_id(1);
    if (s >= P) return;
    const int v = order[s];
    xg[(size_t)s * D + c] = v < 0 ? 0.0f : x[(size_t)(v / K) * D + c];
}

// out[r, :] (ACCUM: +=) sum over j < K, in order, of wts[r * K + j] * yd[pos[r * K + j], :],
// rows of D floats, for r < M. Work geometry: global (D, M).
__kernel void moe_combine(__global float *out, __global const float *yd,
                          __global const int *pos, __global const float *wts, int M, int K,
                          int D) {
    const int c = get_global_id(0), r = get_global_id(1);
    if (r >= M) return;
    float s = 0.0f;
    for (int j = 0; j < K; ++j) {
        const int v = r * K + j;
        s += wts[v] * yd[(size_t)pos[v] * D + c];
    }
    __global float *o = out + (size_t)r * D + c;
#if ACCUM
    *o += s;
#else
    *o = s;
#endif
}
