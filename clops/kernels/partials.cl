// The combine of a split decode attention's partials, for the kernels that split it
// (attention.cl, layer.cl): each partial is D + 2 floats (a chunk's unnormalized output, its
// largest score, the sum of its weights), D = HEAD_DIM. PARTS_PTX 1 (NVIDIA): partials written
// by other work-groups of the same launch are read from L2 with ld.global.cg.
#ifndef PARTS_PTX
#define PARTS_PTX 0
#endif
// p[i] for combine_parts: with ``fresh``, written by other work-groups of this launch (read
// past any cached copy: from L2 on NVIDIA, else through a volatile load).
inline float part_ld(__global const float *p, int i, bool fresh) {
    if (fresh) {
#if PARTS_PTX
        float v;
        asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p + i));
        return v;
#else
        return ((volatile __global const float *)p)[i];
#endif
    }
    return p[i];
}

// Dimension d of the attention whose n partials (unnormalized output, max, sum; D + 2 floats
// each) are p; ``fresh`` (a constant at each call): see part_ld.
// PERF (H100, 1B body at 16383 positions, 128 partials a head): attn_combine took about 42
// us with volatile loads, one partial at a time; 8 partials' loads issued before their use and,
// after a finished launch, plain loads: about 10 us
#define CU 8
inline float combine_parts(__global const float *p, int n, int d, bool fresh) {
    float mx = -INFINITY;
    int s = 0;
    for (; s + CU <= n; s += CU) {
        float m[CU];
#pragma unroll
        for (int u = 0; u < CU; ++u)
            m[u] = part_ld(p, (s + u) * (HEAD_DIM + 2) + HEAD_DIM, fresh);
#pragma unroll
        for (int u = 0; u < CU; ++u) mx = fmax(mx, m[u]);
    }
    for (; s < n; ++s) mx = fmax(mx, part_ld(p, s * (HEAD_DIM + 2) + HEAD_DIM, fresh));
    float num = 0.0f, den = 0.0f;
    for (s = 0; s + CU <= n; s += CU) {
        float a[CU], b[CU], c[CU];
#pragma unroll
        for (int u = 0; u < CU; ++u) {
            const int at = (s + u) * (HEAD_DIM + 2);
            a[u] = part_ld(p, at + HEAD_DIM, fresh);
            b[u] = part_ld(p, at + d, fresh);
            c[u] = part_ld(p, at + HEAD_DIM + 1, fresh);
        }
#pragma unroll
        for (int u = 0; u < CU; ++u) {
            const float w = exp(a[u] - mx);
            num += w * b[u];
            den += w * c[u];
        }
    }
    for (; s < n; ++s) {
        const int at = s * (HEAD_DIM + 2);
        const float w = exp(part_ld(p, at + HEAD_DIM, fresh) - mx);
        num += w * part_ld(p, at + d, fresh);
        den += w * part_ld(p, at + HEAD_DIM + 1, fresh);
    }
    return num / den;
}
