// Providers, FFT fallback: mixed-radix Stockham passes (radix 2, 4 and a generic radix up to
// MAX_RADIX), Bluestein's chirp steps for sizes with a large prime factor, and the Hermitian
// extension that turns a half spectrum into a full one. Rows of length n, one row per batch.
//
// Built with -D CT=float2 -D RT=float (or double2/double with -D USE_FP64).

#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#define MAX_RADIX 32

inline CT cmul(CT a, CT b) {
    return (CT)(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}

// w^t for w = exp(-2 pi i / n), 0 <= t < n (conjugated for the inverse transform), from two
// short tables so that every pass reads its twiddles from the caches: tw[l] = w^l for l < B and
// tw[B + h] = w^(hB), B = 2^ceil(bits(n - 1) / 2) (``fft.py`` ``_twiddle_tables``; n > 1).
inline CT root(__global const CT *tw, long n, long t, int inverse) {
    const int lb = (int)(64 - clz(n - 1) + 1) / 2;
    const long b = 1L << lb;
    CT w = cmul(tw[b + (t >> lb)], tw[t & (b - 1)]);
    if (inverse) w.y = -w.y;
    return w;
}

// The 4-point transform of (a0, a1, a2, a3) into out (the inverse's for inverse != 0).
inline void dft4(CT a0, CT a1, CT a2, CT a3, int inverse, CT *out) {
    CT s0 = a0 + a2, s1 = a0 - a2, s2 = a1 + a3, d = a1 - a3;
    CT s3 = inverse ? (CT)(-d.y, d.x) : (CT)(d.y, -d.x);  // d * (-i) forward, d * (+i) inverse
    out[0] = s0 + s2;
    out[1] = s1 + s3;
    out[2] = s0 - s2;
    out[3] = s1 - s3;
}

// exp(-2 pi i t / R) for R = 8 or 16 and 0 <= t < R (conjugated for the inverse), from the
// cosines of the multiples of 2 pi / 16.
inline CT unit_root(const int R, int t, int inverse) {
    const RT c16[5] = {(RT)1, (RT)0.92387953251128675613, (RT)0.70710678118654752440,
                       (RT)0.38268343236508977173, (RT)0};
    int u = (16 / R) * t % 16;  // the angle in sixteenths of a turn
    // cos and sin of 2 pi u / 16 by quadrant
    int qd = u / 4, rr = u % 4;
    RT c = c16[rr], s = c16[4 - rr];
    RT cu = qd == 0 ? c : qd == 1 ? -s : qd == 2 ? -c : s;
    RT su = qd == 0 ? s : qd == 1 ? c : qd == 2 ? -s : -c;
    return (CT)(cu, inverse ? su : -su);
}

// One pass: work item j of n/R takes v[r] = src[j + r n/R] (r < R), multiplies by the twiddles
// of its sub-transform of length ns*R, does an R-point DFT and writes the results ns apart, so
// that after the last pass the output is in natural order (no bit reversal).
inline void stockham_pass(const int R, __global CT *dst, long dst_off, __global const CT *src,
                          long src_off, __global const CT *tw, long n, long ns, int inverse,
                          RT scale) {
    long j = get_global_id(0);
    long nr = n / R;
    if (j >= nr) return;
    long b = get_global_id(1);
    src += src_off + b * n;
    dst += dst_off + b * n;
    long k = j % ns;
    long step = n / (ns * R);
    CT v[MAX_RADIX];
    CT out[MAX_RADIX];
    v[0] = src[j];
    for (int r = 1; r < R; ++r) {
        v[r] = cmul(src[j + r * nr], root(tw, n, r * k * step, inverse));
    }
    if (R == 2) {
        out[0] = v[0] + v[1];
        out[1] = v[0] - v[1];
    } else if (R == 8 || R == 16) {
        // r = 4 r1 + r0, q = q0 + S q1 (S = R / 4): a transform of R/4 points over r1 for each
        // r0, twiddled by w_R^(r0 q0), then one of 4 points over r0 for each q0
        const int S = R / 4;
        for (int r0 = 0; r0 < 4; ++r0) {
            CT a[4];
            if (S == 2) {
                a[0] = v[r0] + v[r0 + 4];
                a[1] = v[r0] - v[r0 + 4];
            } else {
                dft4(v[r0], v[r0 + 4], v[r0 + 8], v[r0 + 12], inverse, a);
            }
            for (int q0 = 1; q0 < S; ++q0) a[q0] = cmul(a[q0], unit_root(R, r0 * q0, inverse));
            for (int q0 = 0; q0 < S; ++q0) out[r0 * S + q0] = a[q0];  // held as [r0][q0]
        }
        for (int q0 = 0; q0 < S; ++q0) {
            CT b[4];
            dft4(out[q0], out[S + q0], out[2 * S + q0], out[3 * S + q0], inverse, b);
            for (int q1 = 0; q1 < 4; ++q1) v[q0 + S * q1] = b[q1];
        }
        for (int q = 0; q < R; ++q) out[q] = v[q];
    } else if (R == 4) {
        CT a0 = v[0] + v[2], a1 = v[0] - v[2], a2 = v[1] + v[3], d = v[1] - v[3];
        // a3 = d * (-i) forward, d * (+i) inverse
        CT a3 = inverse ? (CT)(-d.y, d.x) : (CT)(d.y, -d.x);
        out[0] = a0 + a2;
        out[2] = a0 - a2;
        out[1] = a1 + a3;
        out[3] = a1 - a3;
    } else {
        long unit = n / R;
        for (int q = 0; q < R; ++q) {
            CT acc = v[0];
            for (int r = 1; r < R; ++r) {
                acc += cmul(v[r], root(tw, n, ((r * q) % R) * unit, inverse));
            }
            out[q] = acc;
        }
    }
    long base = (j / ns) * ns * R + k;
    for (int q = 0; q < R; ++q) {
        dst[base + q * ns] = out[q] * scale;
    }
}

#define PASS_ARGS __global CT *dst, long dst_off, __global const CT *src, long src_off, \
                  __global const CT *tw, long n, long ns, int inverse, RT scale
#define PASS_CALL dst, dst_off, src, src_off, tw, n, ns, inverse, scale

__kernel void fft_pass2(PASS_ARGS) { stockham_pass(2, PASS_CALL); }
__kernel void fft_pass3(PASS_ARGS) { stockham_pass(3, PASS_CALL); }
__kernel void fft_pass4(PASS_ARGS) { stockham_pass(4, PASS_CALL); }
__kernel void fft_pass5(PASS_ARGS) { stockham_pass(5, PASS_CALL); }
__kernel void fft_pass7(PASS_ARGS) { stockham_pass(7, PASS_CALL); }
__kernel void fft_pass8(PASS_ARGS) { stockham_pass(8, PASS_CALL); }
__kernel void fft_pass16(PASS_ARGS) { stockham_pass(16, PASS_CALL); }
__kernel void fft_passn(PASS_ARGS, int radix) { stockham_pass(radix, PASS_CALL); }

// Bluestein, step 1: a[b, k] = x[b, k] * chirp[k] for k < n, 0 up to m (the padded length).
__kernel void bluestein_pre(__global CT *a, __global const CT *x, long x_off,
                            __global const CT *chirp, long n, long m) {
    long k = get_global_id(0);
    long b = get_global_id(1);
    if (k >= m) return;
    a[b * m + k] = k < n ? cmul(x[x_off + b * n + k], chirp[k]) : (CT)(0, 0);
}

// Bluestein, step 2: the spectrum of a times the spectrum of the chirp filter.
__kernel void pointwise_mul(__global CT *c, __global const CT *filt, long m) {
    long k = get_global_id(0);
    long b = get_global_id(1);
    if (k >= m) return;
    c[b * m + k] = cmul(c[b * m + k], filt[k]);
}

// Bluestein, step 3: y[b, k] = c[b, k] * chirp[k] * scale for k < n.
__kernel void bluestein_post(__global CT *y, long y_off, __global const CT *c,
                             __global const CT *chirp, long n, long m, RT scale) {
    long k = get_global_id(0);
    long b = get_global_id(1);
    if (k >= n) return;
    y[y_off + b * n + k] = cmul(c[b * m + k], chirp[k]) * scale;
}

// dst[b, k] = src[b, k] for k <= n/2, conj(src[b, n - k]) above: the full spectrum of a real
// signal from its half (src rows have m = n/2 + 1 entries).
__kernel void hermitian_extend(__global CT *dst, __global const CT *src, long src_off, long n,
                               long m) {
    long k = get_global_id(0);
    long b = get_global_id(1);
    if (k >= n) return;
    CT v;
    if (k < m) {
        v = src[src_off + b * m + k];
    } else {
        v = src[src_off + b * m + (n - k)];
        v.y = -v.y;
    }
    dst[b * n + k] = v;
}

// Zero the imaginary parts of the DC term and (n even) the Nyquist term of each half spectrum
// (rows of m = n/2 + 1), which a real inverse transform ignores, in place.
__kernel void hermitian_clean(__global CT *x, long off, long n, long m) {
    long b = get_global_id(0);
    x[off + b * m].y = 0;
    if ((n & 1) == 0) x[off + b * m + n / 2].y = 0;
}

// The half spectrum of real rows of n = 2m points from the m-point transforms z of their
// (even, odd) pairs taken as complex values: X[k] = E[k] + w^k O[k] for k <= m, with
// E = (z[k] + conj z[m-k]) / 2, O = (z[k] - conj z[m-k]) / 2i (indices mod m) and
// w = exp(-2 pi i / n) (tw[k] = w^k). Work geometry: global (m + 1, batch).
__kernel void rfft_post(__global CT *y, long y_off, __global const CT *z, long m,
                        __global const CT *tw, RT scale) {
    long k = get_global_id(0);
    long b = get_global_id(1);
    if (k > m) return;
    __global const CT *zr = z + b * m;
    CT a = zr[k == m ? 0 : k];
    CT c = zr[k == 0 ? 0 : m - k];
    RT er = (a.x + c.x) * (RT)0.5, ei = (a.y - c.y) * (RT)0.5;
    // O = (a - conj c) / 2i: (a - conj c) / 2 = (dr, di), divided by i: (di, -dr)
    RT orr = (a.y + c.y) * (RT)0.5, oi = (c.x - a.x) * (RT)0.5;
    CT w = tw[k];
    y[y_off + b * (m + 1) + k] = (CT)(er + w.x * orr - w.y * oi, ei + w.x * oi + w.y * orr) *
                                 scale;
}
