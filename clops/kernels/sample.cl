// Choosing the next token on the device: repetition penalty, temperature, min-p, top-k, top-p
// and a seeded counter-based random draw, or argmax when temperature <= 0. One work-group of
// NT work-items (a power of two) does it all (greedy: argmax.cl's kernels, over several
// work-groups); only the token id leaves the device.
//
// The chosen id goes to tokens[state[0] + advance], seen[id] is set (for the penalty), and
// state[0] moves on by advance, so the next decode step finds its input on the device.

inline uint fmix32(uint h) {
    h ^= h >> 16; h *= 0x85ebca6bu;
    h ^= h >> 13; h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

// A uniform float in [0, 1) from (seed, counter): the same pair always gives the same draw.
inline float uniform01(uint seed, uint counter) {
    uint h = fmix32(seed ^ fmix32(counter * 0x9E3779B9u + 0x7f4a7c15u));
    h = fmix32(h + seed * 0x632be5abu);
    return (float)(h >> 8) * (1.0f / 16777216.0f);
}

// Order-preserving map of a float to an unsigned key.
inline uint fkey(float f) {
    uint u = as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

#include "clops/fence.cl"  // GLOBAL_FENCE (choose.cl's)
#include "clops/choose.cl"  // penalized, reduce_sum, reduce_count, reduce_argmax

// Work geometry: global (NT), local (NT).
__kernel void sample(__global int *tokens, __global int *state, __global uchar *restrict seen,
                     __global const float *restrict logits, int l_off,
                     __global float *restrict z, int V,
                     int advance, float temperature, int top_k, float top_p, float min_p,
                     float penalty, uint seed) {
    __local float redf[NT];
    __local int redi[NT];
    __local uint redu[NT];
    __local int chosen;
    const int lid = get_local_id(0);
    __global const float *lg = logits + l_off;

    // Argmax (first index on ties) of the penalized logits, kept in z for the later passes.
    float best = -INFINITY;
    int bi = V;
    const float invt = temperature > 0.0f ? 1.0f / temperature : 1.0f;
    if (temperature > 0.0f) {
        for (int v = lid; v < V; v += NT) {
            float l = penalized(lg, seen, v, penalty) * invt;
            z[v] = l;
            if (l > best || (l == best && v < bi)) { best = l; bi = v; }
        }
    } else {
        // PERF: greedy needs no z; without its stores the loads of many steps overlap
        // (H100, vocab 49152 / 151936: 10.9 / 16.6 us; 16 or 32 loads a work-item issued before
        // any comparison gave 10.4-10.8 / 15.6-16.7, so one work-group's pass is not bound by
        // its trips to memory)
#pragma unroll 4
        for (int v = lid; v < V; v += NT) {
            float l = penalized(lg, seen, v, penalty);
            if (l > best || (l == best && v < bi)) { best = l; bi = v; }
        }
    }
    int am;
    const float zmax = reduce_argmax(best, bi, redf, redi, lid, &am);
    if (lid == 0) chosen = min(am, V - 1);
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);

    if (temperature > 0.0f && zmax > -INFINITY) {
        // Keep z >= thr: thr starts at min-p's bound, then rises for top-k and top-p.
        uint thr = 0u;
        if (min_p > 0.0f) thr = fkey(zmax + log(min_p));
        if (top_k > 0 && top_k < V) {
            uint t = 0u;
            for (int bit = 31; bit >= 0; --bit) {
                uint cand = t | (1u << bit);
                uint c = 0u;
                for (int v = lid; v < V; v += NT) c += fkey(z[v]) >= cand;
                if (reduce_count(c, redu, lid) >= (uint)top_k) t = cand;
            }
            thr = max(thr, t);
        }
        if (top_p < 1.0f) {
            float zs = 0.0f;
            for (int v = lid; v < V; v += NT) {
                float zv = z[v];
                if (fkey(zv) >= thr) zs += exp(zv - zmax);
            }
            const float target = top_p * reduce_sum(zs, redf, lid);
            uint t = thr;
            for (int bit = 31; bit >= 0; --bit) {
                uint cand = t | (1u << bit);
                if (cand <= t) continue;
                float s = 0.0f;
                for (int v = lid; v < V; v += NT) {
                    float zv = z[v];
                    if (fkey(zv) >= cand) s += exp(zv - zmax);
                }
                if (reduce_sum(s, redf, lid) >= target) t = cand;
            }
            thr = max(thr, t);
        }
        // Draw: contiguous chunks per work-item, an exclusive scan of their masses, then the
        // work-item whose chunk holds u walks it.
        const int C = (V + NT - 1) / NT;
        const int c0 = lid * C, c1 = min(V, c0 + C);
        float mass = 0.0f;
        for (int v = c0; v < c1; ++v) {
            float zv = z[v];
            if (fkey(zv) >= thr) mass += exp(zv - zmax);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        redf[lid] = mass;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid == 0) {
            float run = 0.0f;
            for (int i = 0; i < NT; ++i) { float t = redf[i]; redf[i] = run; run += t; }
            redf[0] = 0.0f;
            // the total travels to every work-item as the bits of redi[0]
            redi[0] = as_int(run);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const float total = as_float(redi[0]);
        const float u = uniform01(seed, (uint)state[0]) * total;
        const float lo = redf[lid];
        if (mass > 0.0f && u >= lo && u < lo + mass) {
            float run = lo;
            int pick = -1;
            for (int v = c0; v < c1; ++v) {
                float zv = z[v];
                if (fkey(zv) >= thr) {
                    pick = v;
                    run += exp(zv - zmax);
                    if (run > u) break;
                }
            }
            if (pick >= 0) chosen = pick;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        const int tok = chosen;
        const int at = state[0] + advance;
        tokens[at] = tok;
        seen[tok] = 1;
        state[0] = at;
    }
}
