// decode_layer: one decoder layer of a decode step (one row) in one launch. A persistent kernel:
// its G work-groups all run at once (kernels/layer.py launches no more than its probe found
// resident) and meet at grid barriers between the phases:
//   A  qkv = Wqkv . (RMSNorm(x) * anw); q rotated -> qr, k rotated and v -> the cache at pos
//   B  attention of each query head over chunks of LS positions; the last work-group of a
//      head to finish combines its chunks' partials -> attn
//   C  x += Wo . attn
//   D  h = silu(Wg . n(x)) * (Wu . n(x)), n(x) = RMSNorm(x) * fnw ([gate | up] rows of Wgu)
//   E  x += Wd . h
// The launch boundary is the barrier after E. Each phase's input vector is read by every
// work-group that has work in it and quantized into local memory (int8, a scale per 32 values,
// the sums of the int8 values per 32 for q4's minimums), then the weights (q4: 16 nibble bytes
// and a (scale, min) half pair per 32; q8: 32 bytes and a half scale per 32) meet it through
// 4-byte integer dot products, a warp (32 work-items) for 2 to 8 weight rows at once.
// Compile-time: DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, QKMAX (the longest input: max of DIM,
// HEADS * HEAD_DIM, FFN), WF_QKV, WF_O, WF_GU, WF_D (3 q4, 4 q8), ROPE_NEOX, PTX (NVIDIA: dp4a,
// shfl.sync, membar.gl), SPIN_LIMIT, PHASES (a bitmask of the phases A..E that run, for
// timing them apart: default all).
// Work geometry: global (G * LS), local (LS).
#define LS 256
#define NW (LS / 32)
#define D HEAD_DIM
#define N_REP (HEADS / KV_HEADS)
// rows of a head a warp computes at once in A (8, or fewer where they do not divide a warp's)
#define RPW (HEAD_DIM / NW)
#define RA (RPW % 8 == 0 ? 8 : RPW % 4 == 0 ? 4 : 2)
#ifndef PHASES
#define PHASES 31
#endif
#ifndef SPIN_LIMIT
#define SPIN_LIMIT (1 << 26)
#endif
#if LS % HEAD_DIM || HEAD_DIM % (2 * NW) || HEAD_DIM > LS
#error "decode_layer: HEAD_DIM must divide 256 and be a multiple of 16"
#endif

#if PTX
#define GLOBAL_FENCE() asm volatile("membar.gl;" ::: "memory")
inline int dot4(uint a, uint b, int c) {
    int d;
    asm volatile("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
#include "clops/ptx.cl"  // shfl_xor
#else
#define GLOBAL_FENCE() mem_fence(CLK_GLOBAL_MEM_FENCE)
inline int dot4(uint a, uint b, int c) {
    const int4 p = convert_int4(as_char4(a)) * convert_int4(as_char4(b));
    return c + (p.x + p.y) + (p.z + p.w);
}
#endif

typedef volatile __global const float *vin;  // written by other work-groups of this launch

// Four floats written by other work-groups of this launch: from L2 (NVIDIA's L1 is not
// coherent between multiprocessors), not reordered across the grid barriers.
inline float4 load4_fresh(__global const float *p) {
#if PTX
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
#else
    const vin q = (vin)p;
    return (float4)(q[0], q[1], q[2], q[3]);
#endif
}

// The sum of v over each warp, in its lane 0 (every work-item of the group calls it).
inline float warp_total(float v, __local float *red) {
#if PTX
    for (int o = 16; o > 0; o >>= 1) v += shfl_xor(v, o);
    return v;
#else
    const int t = get_local_id(0);
    red[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    float s = 0.0f;
    if ((t & 31) == 0)
        for (int i = 0; i < 32; ++i) s += red[t + i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return s;
#endif
}

// The sum (max: the largest) of v over the work-group, in every work-item.
inline float group_reduce(float v, __local float *red, bool max_of) {
    const int t = get_local_id(0);
    red[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LS / 2; s > 0; s >>= 1) {
        if (t < s) red[t] = max_of ? fmax(red[t], red[t + s]) : red[t] + red[t + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// All work-groups of the launch meet here. bar: [arrivals, generation, timed out]; arrivals
// are back at zero after each barrier, so the next launch starts where this one ended.
inline void grid_sync(volatile __global int *bar) {
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) {
        const int gen = bar[1];
        GLOBAL_FENCE();
        if (atomic_inc(&bar[0]) == (int)get_num_groups(0) - 1) {
            atomic_xchg(&bar[0], 0);
            GLOBAL_FENCE();
            atomic_inc(&bar[1]);
        } else {
            int spins = 0;
            while (bar[1] == gen)
                if (++spins > SPIN_LIMIT) {  // not all resident: say so rather than hang
                    bar[2] = 1;
                    break;
                }
        }
        GLOBAL_FENCE();
    }
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
}

// The largest (max_of) or the sum of v over the 8 work-items of an aligned group of 8.
inline float eight(float v, bool max_of, __local float *red) {
#if PTX
    for (int o = 1; o < 8; o <<= 1) {
        const float u = shfl_xor(v, o);
        v = max_of ? fmax(v, u) : v + u;
    }
    return v;
#else
    const int t = get_local_id(0), g = t & ~7;
    red[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    float r = red[g];
    for (int i = 1; i < 8; ++i) r = max_of ? fmax(r, red[g + i]) : r + red[g + i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
#endif
}

// The work-group quantizes v[i] = src[i] * (nw ? nw[i] : 1), i < K, into xq (int8, 4 a uint,
// block b of 32 values at xq[8 b ..]), xd (per block: amax / 127) and xs (per block: the sum of
// its int8 values), and returns this work-item's part of the sum of squares of src (the RMS of
// a norm: int8 values are the same for any scale of v, so 1 / RMS multiplies the sums after).
// Eight work-items a block, four values each; every round's loads are issued before any is
// used (one memory latency, not one a round), and every work-item runs every round (the
// shuffles and barriers of eight()).
#define QR ((QKMAX / 4 + LS - 1) / LS)
inline float quantize(__global const float *src, int K, __global const float *nw,
                      __local uint *xq, __local float *xd, __local int *xs, __local float *red) {
    const int t = get_local_id(0);
    float4 v[QR];
    float ss = 0.0f;
#pragma unroll
    for (int r = 0; r < QR; ++r) {
        const int i = r * LS + t;
        v[r] = r * LS < K / 4 && i < K / 4 ? load4_fresh(src + 4 * i) : (float4)(0.0f);
    }
#pragma unroll
    for (int r = 0; r < QR; ++r) {
        if (r * LS >= K / 4) break;  // (the same for every work-item)
        const int i = r * LS + t;
        const bool in = i < K / 4;
        ss += dot(v[r], v[r]);
        const float4 u = in && nw ? v[r] * vload4(i, nw) : v[r];
        const float amax = eight(fmax(fmax(fabs(u.x), fabs(u.y)), fmax(fabs(u.z), fabs(u.w))),
                                 true, red);
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        const int4 q = convert_int4_rte(u * id);
        const float sum = eight((float)(q.x + q.y + q.z + q.w), false, red);
        if (in) {
            xq[i] = (uint)(q.x & 0xff) | (uint)(q.y & 0xff) << 8 | (uint)(q.z & 0xff) << 16 |
                    (uint)(q.w & 0xff) << 24;
            if ((t & 7) == 0) {
                xd[i >> 3] = amax / 127.0f;
                xs[i >> 3] = (int)sum;
            }
        }
    }
    return ss;
}

// After quantize() of a norm's input: 1 / RMS (eps inside the root) in every work-item; its
// reduction's barriers also publish the quantized x.
inline float rms_after(float ss, int K, float eps, __local float *red) {
    return rsqrt(group_reduce(ss, red, false) / K + eps);
}

// After quantize() without a norm: publish the quantized x.
inline void quantized(void) { barrier(CLK_LOCAL_MEM_FENCE); }

// This lane's parts of R rows n[0 .. R) of W [N][K] (format fmt) . the quantized x, in r[]:
// the rows' loads of a step are all issued before any is used (R times the bytes in flight).
inline void rows_part(int fmt, __global const uchar *W, __global const half *S, int K,
                      const int *n, const int R, __local const uint *xq,
                      __local const float *xd, __local const int *xs, int lane, float *r) {
    const int nb = K / 32;
    const uint M = 0x0f0f0f0fu;
#pragma unroll
    for (int i = 0; i < R; ++i) r[i] = 0.0f;
#pragma unroll 8
    for (int b = lane; b < nb; b += 32) {
        __local const uint *x = xq + 8 * b;
        const float dx = xd[b];
        if (fmt == 3) {
            uint4 u[8];
            float2 d[8];
#pragma unroll
            for (int i = 0; i < R; ++i) {
                u[i] = ((__global const uint4 *)(W + (size_t)n[i] * (K / 2)))[b];
                d[i] = vload_half2((size_t)n[i] * nb + b, S);
            }
            const float sx = dx * (float)xs[b];
#pragma unroll
            for (int i = 0; i < R; ++i) {
                int p = dot4(u[i].x & M, x[0], 0);
                p = dot4(u[i].y & M, x[1], p);
                p = dot4(u[i].z & M, x[2], p);
                p = dot4(u[i].w & M, x[3], p);
                p = dot4((u[i].x >> 4) & M, x[4], p);
                p = dot4((u[i].y >> 4) & M, x[5], p);
                p = dot4((u[i].z >> 4) & M, x[6], p);
                p = dot4((u[i].w >> 4) & M, x[7], p);
                r[i] = mad(d[i].x * dx, (float)p, mad(d[i].y, sx, r[i]));
            }
        } else {
            uint4 u[8], v[8];
            float d[8];
#pragma unroll
            for (int i = 0; i < R; ++i) {
                __global const uint4 *wr = (__global const uint4 *)(W + (size_t)n[i] * K);
                u[i] = wr[2 * b];
                v[i] = wr[2 * b + 1];
                d[i] = vload_half((size_t)n[i] * nb + b, S);
            }
#pragma unroll
            for (int i = 0; i < R; ++i) {
                int p = dot4(u[i].x, x[0], 0);
                p = dot4(u[i].y, x[1], p);
                p = dot4(u[i].z, x[2], p);
                p = dot4(u[i].w, x[3], p);
                p = dot4(v[i].x, x[4], p);
                p = dot4(v[i].y, x[5], p);
                p = dot4(v[i].z, x[6], p);
                p = dot4(v[i].w, x[7], p);
                r[i] = mad(d[i] * dx, (float)p, r[i]);
            }
        }
    }
}

// y[n] += W[n] . x for n < N, a warp two rows (the quantized x in local memory).
inline void rows_add(int fmt, __global const uchar *W, __global const half *S, int K, int N,
                     __global float *y, __local const uint *xq, __local const float *xd,
                     __local const int *xs, __local float *red) {
    const int t = get_local_id(0), w = t >> 5, lane = t & 31;
    const int units = (N + 2 * NW - 1) / (2 * NW);
    for (int u = get_group_id(0); u < units; u += get_num_groups(0)) {
        const int n = (u * NW + w) * 2;
        const int rows[2] = {min(n, N - 1), min(n + 1, N - 1)};
        float r[2];
        rows_part(fmt, W, S, K, rows, 2, xq, xd, xs, lane, r);
        r[0] = warp_total(r[0], red);
        r[1] = warp_total(r[1], red);
        if (lane == 0 && n < N) y[n] += r[0];
        if (lane == 0 && n + 1 < N) y[n + 1] += r[1];
    }
}

__kernel __attribute__((reqd_work_group_size(LS, 1, 1)))
void decode_layer(__global float *x, __global const float *anw,
                  __global const uchar *wqkv, __global const half *sqkv,
                  __global float *qr, __global float *kc, __global float *vc,
                  __global const int *state, __global const float *inv_freq,
                  __global const uchar *wo, __global const half *so, __global float *attn,
                  __global float *part, __global int *count, __global const float *fnw,
                  __global const uchar *wgu, __global const half *sgu, __global float *h,
                  __global const uchar *wd, __global const half *sd, __global int *bar,
                  int max_seq, float eps, float scale) {
    __local uint xq[QKMAX / 4];
    __local float xd[QKMAX / 32];
    __local int xs[QKMAX / 32];
    __local float red[LS], pl[LS], y[HEAD_DIM];
    __local int last;
    const int t = get_local_id(0), w = t >> 5, lane = t & 31;
    const int grp = get_group_id(0), G = get_num_groups(0);
    const int pos = state[0], L = pos + 1;
    volatile __global int *vbar = (volatile __global int *)bar;

    // ---- A: qkv, a head (HEAD_DIM rows) a work-group at a time; rotation; the cache ----
    if ((PHASES & 1) && grp < HEADS + 2 * KV_HEADS) {
        const float fa = rms_after(quantize(x, DIM, anw, xq, xd, xs, red), DIM, eps, red);
        for (int u = grp; u < HEADS + 2 * KV_HEADS; u += G) {
            for (int i = 0; i < HEAD_DIM / NW; i += RA) {
                const int r = w * (HEAD_DIM / NW) + i;
                int rows[RA];
                for (int e = 0; e < RA; ++e) rows[e] = u * HEAD_DIM + r + e;
                float sums[RA];
                rows_part(WF_QKV, wqkv, sqkv, DIM, rows, RA, xq, xd, xs, lane, sums);
                for (int e = 0; e < RA; ++e) {
                    const float v = warp_total(sums[e], red);
                    if (lane == 0) y[r + e] = v * fa;
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            if (t < HEAD_DIM) {
                float v = y[t];
                if (u < HEADS + KV_HEADS) {  // q and k heads turn by pos
#if ROPE_NEOX
                    const int i = t < D / 2 ? t : t - D / 2, a = i, b = i + D / 2;
#else
                    const int i = t >> 1, a = 2 * i, b = 2 * i + 1;
#endif
                    float c, sn = sincos((float)pos * inv_freq[i], &c);
                    v = t == a ? y[a] * c - y[b] * sn : y[a] * sn + y[b] * c;
                }
                if (u < HEADS) {
                    qr[u * D + t] = v;
                } else {
                    const int kvh = u < HEADS + KV_HEADS ? u - HEADS : u - HEADS - KV_HEADS;
                    const size_t at = ((size_t)kvh * max_seq + pos) * D + t;
                    if (u < HEADS + KV_HEADS) kc[at] = v; else vc[at] = v;
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }
    grid_sync(vbar);

    // ---- B: attention, (head, chunk of LS positions) units ----
    if (PHASES & 2) {
        const int S = (L + LS - 1) / LS;
        for (int u = grp; u < HEADS * S; u += G) {
            const int hh = u / S, s = u % S, kvh = hh / N_REP;
            const int j0 = s * LS, n = min(L - j0, LS);
            if (t < D) y[t] = ((vin)qr)[hh * D + t] * scale;
            barrier(CLK_LOCAL_MEM_FENCE);
            float sc = -INFINITY;
            if (t < n) {
                // (the new position's key, written in A by another multiprocessor, was never
                // in this one's L1: plain loads see it)
                __global const float4 *kr =
                    (__global const float4 *)(kc + ((size_t)kvh * max_seq + j0 + t) * D);
                float4 a = (float4)(0.0f);
#pragma unroll 8
                for (int d = 0; d < D / 4; ++d) a = mad(vload4(d, y), kr[d], a);
                sc = (a.x + a.y) + (a.z + a.w);
            }
            const float mx = group_reduce(sc, red, true);
            const float p = t < n ? exp(sc - mx) : 0.0f;
            pl[t] = p;
            const float l = group_reduce(p, red, false);  // (its barriers publish pl)
            // a work-item a dimension d = t % D, positions t / D, t / D + LS / D, ...
            const int d = t % D;
            float acc = 0.0f;
            __global const float *vb = vc + ((size_t)kvh * max_seq + j0) * D + d;
#pragma unroll 16
            for (int j = t / D; j < n; j += LS / D) acc = mad(pl[j], vb[(size_t)j * D], acc);
            red[t] = acc;
            barrier(CLK_LOCAL_MEM_FENCE);
            if (t < D) {
                for (int g = 1; g < LS / D; ++g) acc += red[g * D + t];
                if (S == 1) {
                    attn[hh * D + t] = acc / l;
                } else {
                    __global float *pp = part + ((size_t)hh * S + s) * (D + 2);
                    pp[t] = acc;
                    if (t == 0) {
                        pp[D] = mx;
                        pp[D + 1] = l;
                    }
                }
            }
            if (S > 1) {  // the last of the head's work-groups combines its chunks
                GLOBAL_FENCE();
                barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
                if (t == 0) last = atomic_inc(count + hh) == S - 1;
                barrier(CLK_LOCAL_MEM_FENCE);
                if (last && t < D) {
                    GLOBAL_FENCE();
                    vin ph = (vin)part + (size_t)hh * S * (D + 2);
                    float M = -INFINITY;
                    for (int c = 0; c < S; ++c) M = fmax(M, ph[c * (D + 2) + D]);
                    float o = 0.0f, den = 0.0f;
                    for (int c = 0; c < S; ++c) {
                        const float e = exp(ph[c * (D + 2) + D] - M);
                        o = mad(e, ph[c * (D + 2) + t], o);
                        den = mad(e, ph[c * (D + 2) + D + 1], den);
                    }
                    attn[hh * D + t] = o / den;
                    if (t == 0) atomic_xchg(count + hh, 0);
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }
    grid_sync(vbar);

    // ---- C: x += Wo . attn ----
    if ((PHASES & 4) && grp < (DIM + 2 * NW - 1) / (2 * NW)) {
        quantize(attn, HEADS * D, 0, xq, xd, xs, red);
        quantized();
        rows_add(WF_O, wo, so, HEADS * D, DIM, x, xq, xd, xs, red);
    }
    grid_sync(vbar);

    // ---- D: h = silu(gate) * up ----
    if ((PHASES & 8) && grp < (FFN + 4 * NW - 1) / (4 * NW)) {
        const float fd = rms_after(quantize(x, DIM, fnw, xq, xd, xs, red), DIM, eps, red);
        const int units = (FFN + 4 * NW - 1) / (4 * NW);
        for (int u = grp; u < units; u += G) {
            const int j = (u * NW + w) * 4;
            int rows[8];
            for (int e = 0; e < 4; ++e) {
                rows[2 * e] = min(j + e, FFN - 1);
                rows[2 * e + 1] = FFN + rows[2 * e];
            }
            float r[8];
            rows_part(WF_GU, wgu, sgu, DIM, rows, 8, xq, xd, xs, lane, r);
            for (int e = 0; e < 8; ++e) r[e] = warp_total(r[e], red) * fd;
            for (int e = 0; e < 4; ++e)
                if (lane == 0 && j + e < FFN)
                    h[j + e] = r[2 * e] / (1.0f + exp(-r[2 * e])) * r[2 * e + 1];
        }
    }
    grid_sync(vbar);

    // ---- E: x += Wd . h ----
    if ((PHASES & 16) && grp < (DIM + 2 * NW - 1) / (2 * NW)) {
        quantize(h, FFN, 0, xq, xd, xs, red);
        quantized();
        rows_add(WF_D, wd, sd, FFN, DIM, x, xq, xd, xs, red);
    }
}

// The probe: G work-groups meet at `rounds` grid barriers, each adding its id to a sum after
// every one; a work-group that spun past SPIN_LIMIT sets bar[2].
__kernel __attribute__((reqd_work_group_size(LS, 1, 1)))
void grid_probe(__global int *bar, __global int *sums, int rounds) {
    volatile __global int *vbar = (volatile __global int *)bar;
    for (int r = 0; r < rounds; ++r) {
        if (get_local_id(0) == 0) atomic_add(&sums[r], (int)get_group_id(0) + 1);
        grid_sync(vbar);
        // every work-group sees every other's addition of this round
        if (get_local_id(0) == 0 && ((volatile __global int *)sums)[r] !=
                (int)(get_num_groups(0) * (get_num_groups(0) + 1) / 2))
            atomic_or(&bar[2], 2);
    }
}
