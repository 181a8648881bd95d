// Products of quantized weights in the CPU layout (rb16, kernels/matmul_cpu.cl) with integer dot
// products (x86-64 AVX-512 VNNI, vpdpbusd), run by the CPU device's queue as an OpenCL native
// kernel (clEnqueueNativeKernel), on the same buffers as its other kernels.
//
// y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n]): the rows of x (after RMSNorm * nw where
// asked) are first quantized to int8 with a scale per 32 values (dx = amax / 127, as GGML's
// q8_1 does), then each weight group meets them as 4-byte integer dot products, and each group's
// integer sum meets the float scales once. A row's sums are added in the same order whatever
// the number of rows (the batch engine's tokens do not depend on their batch).
//
// Weights, 16 rows a block (see matmul_cpu.cl): q4 uchar[b][g][j][16] with value j in the low and
// j + 16 in the high nibble of byte j of a 32-value group, scales [b][g][16] (Q4_SYM: value =
// (q - 8) * d) or [b][g][2][16] (value = q * d + min); q8 char[b][k][16], scales
// [b][k / QGROUP][16]. Scales are half or float. A 64-byte load holds 4 k of the 16 rows; a
// byte permutation gives each 32-bit lane (a row) its 4 consecutive k, as vpdpbusd takes them:
// weights as the unsigned operand (q4: 0..15; q8: q + 128) and x as the signed one; the offsets
// come back out through the sums of x's int8 values (kept per 16).
//
// Float16 weights (f16: half[b][k][16]) meet float rows of x (after RMSNorm where asked), a row
// at a time in four chains of k: products of few rows (a decode step), bound by the weights'
// bytes. A row's sums do not depend on the other rows here either.
//
// Work is split over a small pool of threads (the device's cores): blocks of 16 output columns,
// after the rows of x are quantized or normalized (split by rows).
//
// Also a decode row's attention (clops_native_attention, at the end).

#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__) && defined(__F16C__)
#define HAVE_VNNI 1
#include <immintrin.h>
#else
#define HAVE_VNNI 0
#endif

#define CLOPS_NATIVE_VERSION 1

// The argument block: the runtime replaces the memory objects (the first 6 fields) with their
// host pointers in its copy. Offsets and strides are in elements.
typedef struct {
    float *y;
    const float *x;
    const uint8_t *w;
    const void *s;
    const float *bias;
    const float *nw;
    int64_t y_off, ldy, x_off, ldx;
    int32_t m, n, k, fmt, scale_half, q4_sym, qgroup, accum, glu, has_bias, norm, threads;
    float eps;
    int32_t pad;
} clops_mm_args;

int clops_native_version(void) { return CLOPS_NATIVE_VERSION; }
int clops_native_vnni(void) { return HAVE_VNNI; }
int clops_native_args_size(void) { return (int)sizeof(clops_mm_args); }

// ---- a pool of threads: run(fn) on all of them and wait ----
#define MAX_THREADS 64
typedef void (*task_fn)(void *ctx, int tid, int nt);
static struct {
    pthread_mutex_t call;  // one call at a time (queues of several devices may meet here)
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started;  // workers running
    volatile int gen;
    volatile int done;
    int nt;
    task_fn fn;
    void *ctx;
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0,
         NULL, NULL};

// The CPUs the process may run on, as the thread that loads the library sees them. A worker
// takes them all: the runtime's threads that call in are pinned to one core each (Intel's
// TBB workers), and a thread inherits its creator's mask.
static cpu_set_t process_cpus;
static int have_cpus;
// A child process made by fork() has none of the workers: it starts its own.
static void forked(void) {
    pthread_mutex_init(&P.call, NULL);
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.cv, NULL);
    P.started = 0;
    P.gen = 0;
    P.done = 0;
}

__attribute__((constructor)) static void read_cpus(void) {
    have_cpus = sched_getaffinity(0, sizeof process_cpus, &process_cpus) == 0;
    pthread_atfork(NULL, NULL, forked);
}

static int start_gen[MAX_THREADS];  // the task count when each worker was made

static void *worker(void *arg) {
    const int tid = (int)(intptr_t)arg;
    int seen = start_gen[tid];  // (tasks before it are not its to run)
    if (have_cpus) pthread_setaffinity_np(pthread_self(), sizeof process_cpus, &process_cpus);
    for (;;) {
        // spin a little for the next task (a step's products follow each other), then sleep
        int g = __atomic_load_n(&P.gen, __ATOMIC_ACQUIRE);
        for (int i = 0; g == seen && i < 20000; ++i) {
#if HAVE_VNNI
            _mm_pause();
#endif
            g = __atomic_load_n(&P.gen, __ATOMIC_ACQUIRE);
        }
        if (g == seen) {
            pthread_mutex_lock(&P.mu);
            while ((g = __atomic_load_n(&P.gen, __ATOMIC_ACQUIRE)) == seen)
                pthread_cond_wait(&P.cv, &P.mu);
            pthread_mutex_unlock(&P.mu);
        }
        seen = g;
        if (tid < P.nt) P.fn(P.ctx, tid, P.nt);
        __atomic_add_fetch(&P.done, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

// Runs fn(ctx, tid, nt) for tid < nt, this thread taking tid 0; returns when all are done.
static void run_all(task_fn fn, void *ctx, int nt) {
    if (nt > MAX_THREADS) nt = MAX_THREADS;
    if (nt <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    while (P.started < nt - 1) {
        pthread_t th;
        start_gen[P.started + 1] = P.gen;
        if (pthread_create(&th, NULL, worker, (void *)(intptr_t)(P.started + 1)) != 0) break;
        pthread_detach(th);
        P.started++;
    }
    if (nt - 1 > P.started) nt = P.started + 1;
    if (nt <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    P.fn = fn;
    P.ctx = ctx;
    P.nt = nt;
    __atomic_store_n(&P.done, 0, __ATOMIC_RELEASE);
    pthread_mutex_lock(&P.mu);
    __atomic_add_fetch(&P.gen, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    fn(ctx, 0, nt);
    // every started worker counts itself (those past nt run nothing)
    while (__atomic_load_n(&P.done, __ATOMIC_ACQUIRE) < P.started) {
#if HAVE_VNNI
        _mm_pause();
#endif
    }
}

#if HAVE_VNNI
// ---- int8 rows of x ----
// (rows a cache line further apart than k bytes: the 8 rows of a tile fall in different sets)
#define XQ_STRIDE(k) ((int64_t)(k) + 64)
#define PF_AHEAD 4096
typedef struct {
    const clops_mm_args *a;
    int8_t *xq;   // [m][k]
    float *dx;    // [m][k / 32]
    int32_t *xs;  // [m][k / 16]: sums of the int8 values of each 16
} quant_ctx;

// 1 / RMS of a row of x (k values), eps inside the root
static float rms_inverse(const clops_mm_args *a, const float *xr) {
    __m512 ss = _mm512_setzero_ps();
    for (int j = 0; j < a->k; j += 16) {
        const __m512 v = _mm512_loadu_ps(xr + j);
        ss = _mm512_fmadd_ps(v, v, ss);
    }
    return 1.0f / sqrtf(_mm512_reduce_add_ps(ss) / a->k + a->eps);
}

static void quantize_rows(void *p, int tid, int nt) {
    const quant_ctx *c = p;
    const clops_mm_args *a = c->a;
    const int k = a->k;
    for (int i = tid; i < a->m; i += nt) {
        const float *xr = a->x + a->x_off + (int64_t)i * a->ldx;
        const __m512 inv = _mm512_set1_ps(a->norm ? rms_inverse(a, xr) : 1.0f);
        int8_t *q = c->xq + (int64_t)i * XQ_STRIDE(k);
        for (int g = 0; g < k / 32; ++g) {
            __m512 v0 = _mm512_mul_ps(_mm512_loadu_ps(xr + 32 * g), inv);
            __m512 v1 = _mm512_mul_ps(_mm512_loadu_ps(xr + 32 * g + 16), inv);
            if (a->norm) {
                v0 = _mm512_mul_ps(v0, _mm512_loadu_ps(a->nw + 32 * g));
                v1 = _mm512_mul_ps(v1, _mm512_loadu_ps(a->nw + 32 * g + 16));
            }
            const float amax = _mm512_reduce_max_ps(
                _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
            _mm_storeu_si128((__m128i *)(q + 32 * g), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(q + 32 * g + 16), _mm512_cvtsepi32_epi8(q1));
            c->dx[(int64_t)i * (k / 32) + g] = d;
            c->xs[(int64_t)i * (k / 16) + 2 * g] = _mm512_reduce_add_epi32(q0);
            c->xs[(int64_t)i * (k / 16) + 2 * g + 1] = _mm512_reduce_add_epi32(q1);
        }
    }
}

// ---- the products ----
typedef struct {
    const clops_mm_args *a;
    const int8_t *xq;
    const float *dx;
    const int32_t *xs;
    const float *xf;  // float16 weights: the float rows (RMSNorm(x) * nw where asked)
    int64_t ldf;
    int nb;     // blocks of 16 output columns (of y)
    int chunk;  // blocks a thread takes at a time
    int next;   // the first block no thread has taken
} mm_ctx;

// lane r (a row of the block) <- bytes r, 16 + r, 32 + r, 48 + r (4 k of that row)
static inline __m512i rows_of(const uint8_t *p) {
    const __m512i idx = _mm512_set_epi8(
        63, 47, 31, 15, 62, 46, 30, 14, 61, 45, 29, 13, 60, 44, 28, 12,
        59, 43, 27, 11, 58, 42, 26, 10, 57, 41, 25, 9, 56, 40, 24, 8,
        55, 39, 23, 7, 54, 38, 22, 6, 53, 37, 21, 5, 52, 36, 20, 4,
        51, 35, 19, 3, 50, 34, 18, 2, 49, 33, 17, 1, 48, 32, 16, 0);
    return _mm512_permutexvar_epi8(idx, _mm512_loadu_si512(p));
}

static inline __m512 scales16(const void *s, int64_t at, int half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)s + at)))
                : _mm512_loadu_ps((const float *)s + at);
}

// acc[t][0..15] += the sums of rows i0 + t (t < TM) of x with block b of W over the 32-value
// groups g0 .. g1 - 1, added group by group.
static inline __attribute__((always_inline)) void tile(const mm_ctx *c, int b, int i0,
                                                       const int TM, int g0, int g1,
                                                       float *acc, int64_t pfd) {
    const clops_mm_args *a = c->a;
    const int k = a->k, G = k / 32, half = a->scale_half;
    // PERF (2-core EPYC Zen 5, one row): the weights pfd bytes on asked for while these are
    // read: PF_AHEAD (4 KB) took down (k 8192) from 38 to 43-47 GB/s, o and qkv alike; the
    // GLU's products (a gate block, then an up block) prefetch the block they take next:
    // q4 40-42 -> 43-44 GB/s, q8 about even (4 KB on was no better)
    const int pf = TM == 1 && pfd != 0;
    const int8_t *xq[8];
    const float *dx[8];
    const int32_t *xs[8];
    __m512 out[8];
    for (int t = 0; t < TM; ++t) {
        const int i = i0 + t < a->m ? i0 + t : a->m - 1;
        xq[t] = c->xq + (int64_t)i * XQ_STRIDE(k);
        dx[t] = c->dx + (int64_t)i * G;
        xs[t] = c->xs + (int64_t)i * (k / 16);
        out[t] = _mm512_loadu_ps(acc + 16 * t);
    }
    if (a->fmt == 3) {  // q4
        const __m512i lowmask = _mm512_set1_epi8(0x0F);
        const uint8_t *wb = a->w + (int64_t)b * G * 256;
        const int sstride = a->q4_sym ? 16 : 32;
        for (int g = g0; g < g1; ++g) {
            __m512i lo[8], hi[8];
            for (int t = 0; t < TM; ++t) lo[t] = hi[t] = _mm512_setzero_si512();
            for (int v = 0; v < 4; ++v) {
                if (pf) _mm_prefetch((const char *)wb + (int64_t)g * 256 + 64 * v + pfd,
                                     _MM_HINT_T0);
                const __m512i raw = rows_of(wb + (int64_t)g * 256 + 64 * v);
                const __m512i wl = _mm512_and_si512(raw, lowmask);
                const __m512i wh = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lowmask);
                for (int t = 0; t < TM; ++t) {
                    const int32_t *xp = (const int32_t *)(xq[t] + 32 * g);
                    lo[t] = _mm512_dpbusd_epi32(lo[t], wl, _mm512_set1_epi32(xp[v]));
                    hi[t] = _mm512_dpbusd_epi32(hi[t], wh, _mm512_set1_epi32(xp[4 + v]));
                }
            }
            const int64_t sat = ((int64_t)b * G + g) * sstride;
            const __m512 d = scales16(a->s, sat, half);
            if (a->q4_sym) {
                for (int t = 0; t < TM; ++t) {
                    const int xsum = xs[t][2 * g] + xs[t][2 * g + 1];
                    const __m512i is = _mm512_sub_epi32(_mm512_add_epi32(lo[t], hi[t]),
                                                        _mm512_set1_epi32(8 * xsum));
                    out[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is),
                                             _mm512_mul_ps(d, _mm512_set1_ps(dx[t][g])), out[t]);
                }
            } else {
                const __m512 mn = scales16(a->s, sat + 16, half);
                for (int t = 0; t < TM; ++t) {
                    const int xsum = xs[t][2 * g] + xs[t][2 * g + 1];
                    const __m512i is = _mm512_add_epi32(lo[t], hi[t]);
                    out[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is),
                                             _mm512_mul_ps(d, _mm512_set1_ps(dx[t][g])), out[t]);
                    out[t] = _mm512_fmadd_ps(mn, _mm512_set1_ps(dx[t][g] * (float)xsum), out[t]);
                }
            }
        }
    } else {  // q8: scale groups of QGROUP (16 or 32) values, 4 k a 64-byte load
        const __m512i bias8 = _mm512_set1_epi8((char)0x80);
        const uint8_t *wb = a->w + (int64_t)b * k * 16;
        const int QG = a->qgroup, NSG = k / QG;
        for (int sg = g0 * 32 / QG; sg < g1 * 32 / QG; ++sg) {
            __m512i i0s[8], i1s[8];  // two chains of integer sums
            for (int t = 0; t < TM; ++t) i0s[t] = i1s[t] = _mm512_setzero_si512();
            for (int v = 0; v < QG / 4; v += 2) {
                const int k0 = sg * QG + 4 * v;
                if (pf) {
                    _mm_prefetch((const char *)wb + (int64_t)k0 * 16 + pfd, _MM_HINT_T0);
                    _mm_prefetch((const char *)wb + (int64_t)k0 * 16 + 64 + pfd, _MM_HINT_T0);
                }
                const __m512i w0 = _mm512_xor_si512(rows_of(wb + (int64_t)k0 * 16), bias8);
                const __m512i w1 = _mm512_xor_si512(rows_of(wb + (int64_t)(k0 + 4) * 16), bias8);
                for (int t = 0; t < TM; ++t) {
                    const int32_t *xp = (const int32_t *)(xq[t] + k0);
                    i0s[t] = _mm512_dpbusd_epi32(i0s[t], w0, _mm512_set1_epi32(xp[0]));
                    i1s[t] = _mm512_dpbusd_epi32(i1s[t], w1, _mm512_set1_epi32(xp[1]));
                }
            }
            const __m512 d = scales16(a->s, ((int64_t)b * NSG + sg) * 16, half);
            const int g = sg * QG / 32;
            for (int t = 0; t < TM; ++t) {
                const int xsum = QG == 32 ? xs[t][2 * g] + xs[t][2 * g + 1] : xs[t][sg];
                const __m512i is = _mm512_sub_epi32(_mm512_add_epi32(i0s[t], i1s[t]),
                                                    _mm512_set1_epi32(128 * xsum));
                out[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is),
                                         _mm512_mul_ps(d, _mm512_set1_ps(dx[t][g])), out[t]);
            }
        }
    }
    for (int t = 0; t < TM; ++t) _mm512_storeu_ps(acc + 16 * t, out[t]);
}

// The sums of all rows of x with block b of W into acc [m][16]: the groups in runs whose
// weights stay in the first-level cache while every tile of rows meets them.
static void block_sums(const mm_ctx *c, int b, float *acc, int64_t pfd) {
    const clops_mm_args *a = c->a;
    const int m = a->m, G = a->k / 32;
    const int run = a->fmt == 3 ? 64 : 32;  // 16 KB of weights
    memset(acc, 0, sizeof(float) * 16 * m);
    for (int g0 = 0; g0 < G; g0 += run) {
        const int g1 = g0 + run < G ? g0 + run : G;
        int i0 = 0;
        for (; i0 + 8 <= m; i0 += 8) tile(c, b, i0, 8, g0, g1, acc + 16 * i0, pfd);
        if (m - i0 >= 4) {
            tile(c, b, i0, 4, g0, g1, acc + 16 * i0, pfd);
            i0 += 4;
        }
        if (m - i0 >= 2) {
            tile(c, b, i0, 2, g0, g1, acc + 16 * i0, pfd);
            i0 += 2;
        }
        if (m - i0 >= 1) tile(c, b, i0, 1, g0, g1, acc + 16 * i0, pfd);
    }
}

// e^x to about 2 ulp: x = n ln 2 + r (ln 2 in two parts), e^r by Cephes' expf polynomial on
// |r| <= ln 2 / 2, times 2^n by vscalefps (which gives inf and 0 past the float range)
static inline __m512 exp16(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

// v * sigmoid(v), with e = e^-|v| (no overflow): sigmoid = 1 / (1 + e), or e / (1 + e) below 0
static inline __m512 silu(__m512 v) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(v)));
    const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
    const __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mul_ps(v, _mm512_div_ps(_mm512_mask_blend_ps(neg, _mm512_set1_ps(1.0f), e), d));
}

// y columns 16 * b .. of every row from the sums acc (and, GLU, the up rows' sums up)
static void finish_block(const mm_ctx *c, int b, const float *acc, const float *up) {
    const clops_mm_args *a = c->a;
    const int m = a->m, nout = a->glu ? a->n / 2 : a->n;
    const int col = 16 * b, left = nout - col < 16 ? nout - col : 16;
    const __mmask16 mask = (__mmask16)((1u << left) - 1u);
    const __m512 zero = _mm512_setzero_ps();
    const __m512 bv = a->has_bias ? _mm512_maskz_loadu_ps(mask, a->bias + col) : zero;
    const __m512 bu =
        a->has_bias && a->glu ? _mm512_maskz_loadu_ps(mask, a->bias + nout + col) : zero;
    for (int i = 0; i < m; ++i) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(acc + 16 * i), bv);
        if (a->glu) v = _mm512_mul_ps(silu(v), _mm512_add_ps(_mm512_loadu_ps(up + 16 * i), bu));
        float *yp = a->y + a->y_off + (int64_t)i * a->ldy + col;
        if (a->accum) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, yp));
        _mm512_mask_storeu_ps(yp, mask, v);
    }
}

// ---- float16 weights: float rows, one at a time ----
// (rows 16 floats further apart than k)
#define XF_STRIDE(k) ((int64_t)(k) + 16)
typedef struct {
    const clops_mm_args *a;
    float *out;  // [m][XF_STRIDE(k)]
} rows_ctx;

static void float_rows(void *p, int tid, int nt) {
    const rows_ctx *c = p;
    const clops_mm_args *a = c->a;
    const int k = a->k;
    for (int i = tid; i < a->m; i += nt) {
        const float *xr = a->x + a->x_off + (int64_t)i * a->ldx;
        float *out = c->out + (int64_t)i * XF_STRIDE(k);
        if (!a->norm) {
            memcpy(out, xr, sizeof(float) * k);
            continue;
        }
        const __m512 inv = _mm512_set1_ps(rms_inverse(a, xr));
        for (int j = 0; j < k; j += 16)
            _mm512_storeu_ps(out + j, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + j), inv),
                                                    _mm512_loadu_ps(a->nw + j)));
    }
}

// acc0 (and, TWO, acc1) [0..15] = row xr with block b0 (b1) of W: four chains, k by k
static inline __attribute__((always_inline)) void row_f16(const mm_ctx *c, const float *xr,
                                                          int b0, int b1, const int TWO,
                                                          float *acc0, float *acc1) {
    const int64_t k = c->a->k;
    const uint16_t *w0 = (const uint16_t *)c->a->w + (int64_t)b0 * k * 16;
    const uint16_t *w1 = (const uint16_t *)c->a->w + (int64_t)(TWO ? b1 : b0) * k * 16;
    __m512 o0[4], o1[4];
    for (int u = 0; u < 4; ++u) o0[u] = o1[u] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk += 4) {
        for (int u = 0; u < 4; ++u) {
            const __m512 xb = _mm512_set1_ps(xr[kk + u]);
            o0[u] = _mm512_fmadd_ps(
                _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w0 + (kk + u) * 16))), xb,
                o0[u]);
            if (TWO)
                o1[u] = _mm512_fmadd_ps(
                    _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w1 + (kk + u) * 16))),
                    xb, o1[u]);
        }
    }
    _mm512_storeu_ps(acc0, _mm512_add_ps(_mm512_add_ps(o0[0], o0[1]),
                                         _mm512_add_ps(o0[2], o0[3])));
    if (TWO)
        _mm512_storeu_ps(acc1, _mm512_add_ps(_mm512_add_ps(o1[0], o1[1]),
                                             _mm512_add_ps(o1[2], o1[3])));
}

// Blocks b0 .. b1 - 1 of y for float16 weights: two blocks of W at once (the gate's and the up
// rows' under GLU, else b and b + 1)
static void f16_blocks(const mm_ctx *c, int b0, int b1, float *acc, float *acc2) {
    const clops_mm_args *a = c->a;
    const int m = a->m;
    for (int b = b0; b < b1; ++b) {
        const int two = a->glu || b + 1 < b1;
        const int other = a->glu ? b + c->nb : b + 1;
        for (int i = 0; i < m; ++i) {
            const float *xr = c->xf + (int64_t)i * c->ldf;
            if (two)
                row_f16(c, xr, b, other, 1, acc + 16 * i, acc2 + 16 * i);
            else
                row_f16(c, xr, b, b, 0, acc + 16 * i, NULL);
        }
        if (a->glu) {
            finish_block(c, b, acc, acc2);
        } else {
            finish_block(c, b, acc, NULL);
            if (two) finish_block(c, ++b, acc2, NULL);
        }
    }
}

static void products(void *p, int tid, int nt) {
    mm_ctx *c = p;
    const clops_mm_args *a = c->a;
    const int m = a->m;
    (void)tid;
    (void)nt;
    float *acc = malloc(sizeof(float) * 32 * m);
    if (!acc) return;
    float *acc2 = acc + 16 * m;
    // Threads take runs of neighbouring blocks as they come free (each block's weights are read
    // once from memory, in order within a run): a thread the system holds back for a while
    // leaves its share to the others instead of making them wait at the end.
    for (;;) {
        const int b0 = __atomic_fetch_add(&c->next, c->chunk, __ATOMIC_RELAXED);
        if (b0 >= c->nb) break;
        const int b1 = b0 + c->chunk < c->nb ? b0 + c->chunk : c->nb;
        if (a->fmt == 1) {
            f16_blocks(c, b0, b1, acc, acc2);
            continue;
        }
        for (int b = b0; b < b1; ++b) {
            if (a->glu) {
                // block b of the gate, then b + nb of the up rows, each prefetching the block
                // that follows it (b + nb, then b + 1)
                const int64_t bb = a->fmt == 3 ? (int64_t)(a->k / 32) * 256 : (int64_t)a->k * 16;
                block_sums(c, b, acc, bb * c->nb);
                block_sums(c, b + c->nb, acc2, -bb * (c->nb - 1));
            } else {
                block_sums(c, b, acc, PF_AHEAD);
            }
            finish_block(c, b, acc, acc2);
        }
    }
    free(acc);
}

// scratch for the int8 rows, per calling thread (grown, never shrunk)
static __thread void *scratch;
static __thread size_t scratch_bytes;
#endif

// The entry of the native kernel: the runtime's copy of a clops_mm_args.
void clops_native_matmul(void *args) {
#if HAVE_VNNI
    const clops_mm_args *a = args;
    const int64_t m = a->m, k = a->k;
    const int64_t xqb = m * XQ_STRIDE(k);
    size_t need = (size_t)(xqb + m * (k / 32) * 4 + m * (k / 16) * 4 + 192);
    if ((size_t)(m * XF_STRIDE(k) * 4) > need) need = (size_t)(m * XF_STRIDE(k) * 4);
    if (need > scratch_bytes) {
        free(scratch);
        scratch = malloc(need);
        scratch_bytes = scratch ? need : 0;
        if (!scratch) return;  // (the device has no memory left either)
    }
    uint8_t *base = scratch;
    const int nout = a->glu ? a->n / 2 : a->n;
    const int rows_threads = m < a->threads ? (int)m : a->threads;
    const int nb = (nout + 15) / 16;
    // about 8 runs a thread (a run of at least one block)
    const int per = nb / (8 * (a->threads > 0 ? a->threads : 1));
    mm_ctx c = {a, NULL, NULL, NULL, NULL, 0, nb, per > 0 ? per : 1, 0};
    pthread_mutex_lock(&P.call);
    if (a->fmt == 1) {
        rows_ctx r = {a, (float *)base};
        run_all(float_rows, &r, rows_threads);
        c.xf = r.out;
        c.ldf = XF_STRIDE(k);
    } else {
        quant_ctx q = {a, (int8_t *)base, (float *)(base + ((xqb + 63) & ~63)), NULL};
        q.xs = (int32_t *)((uint8_t *)q.dx + ((m * (k / 32) * 4 + 63) & ~63));
        run_all(quantize_rows, &q, rows_threads);
        c.xq = q.xq;
        c.dx = q.dx;
        c.xs = q.xs;
    }
    run_all(products, &c, a->threads);
    pthread_mutex_unlock(&P.call);
#else
    (void)args;
#endif
}

// ---- decode attention ----
// One query row at position pos = state[0] straight from the QKV projection (attn_decode_cpu of
// attention.cl, natively): q and the new k rotated (NEOX: pairs (i, i + D/2), else (2i, 2i+1)),
// the new k and v stored in the cache at pos, and each query head's attention over the keys
// 0 .. pos. A key-value head and its n_rep query heads are one task: its keys and values are
// read from memory once for them. Scores first (a row of L = pos + 1), then their softmax with
// a vector exp, then the weighted values.
typedef struct {
    float *out;             // [H][D]
    const float *qkv;       // [q (H*D) | k (KV*D) | v (KV*D)]
    float *kc, *vc;         // [KV][max_seq][D]
    const int32_t *state;   // state[0]: pos
    const float *inv_freq;  // [D / 2]
    int32_t max_seq, n_rep, H, KV, D, neox, threads;
    float scale;
} clops_attn_args;

int clops_native_attn_args_size(void) { return (int)sizeof(clops_attn_args); }

#if HAVE_VNNI
typedef struct {
    const clops_attn_args *a;
    const float *cs, *sn;  // [D / 2]: the angles' cosines and sines at pos
    int next;              // the first key-value head no thread has taken
} attn_ctx;

static void rotate(const clops_attn_args *a, const float *cs, const float *sn, const float *src,
                   float mul, float *dst) {
    const int half = a->D / 2;
    for (int i = 0; i < half; ++i) {
        const int p0 = a->neox ? i : 2 * i, p1 = a->neox ? i + half : 2 * i + 1;
        const float x0 = src[p0], x1 = src[p1];
        dst[p0] = (x0 * cs[i] - x1 * sn[i]) * mul;
        dst[p1] = (x0 * sn[i] + x1 * cs[i]) * mul;
    }
}

static void attend_heads(void *p, int tid, int nt) {
    attn_ctx *c = p;
    const clops_attn_args *a = c->a;
    const int D = a->D, DV = D / 16, R = a->n_rep, pos = a->state[0], L = pos + 1;
    const int64_t ms = a->max_seq;
    (void)tid;
    (void)nt;
    // q rows [R][D], then the scores [R][L16] (L rounded up to 16)
    const int L16 = (L + 15) & ~15;
    float *scratch = aligned_alloc(64, sizeof(float) * ((size_t)R * D + (size_t)R * L16) + 64);
    if (!scratch) return;
    float *q = scratch, *s = scratch + (size_t)R * D;
    for (;;) {
        const int g = __atomic_fetch_add(&c->next, 1, __ATOMIC_RELAXED);
        if (g >= a->KV) break;
        float *kb = a->kc + (int64_t)g * ms * D, *vb = a->vc + (int64_t)g * ms * D;
        rotate(a, c->cs, c->sn, a->qkv + (int64_t)(a->H + g) * D, 1.0f, kb + (int64_t)pos * D);
        memcpy(vb + (int64_t)pos * D, a->qkv + (int64_t)(a->H + a->KV + g) * D,
               sizeof(float) * D);
        for (int r = 0; r < R; ++r)
            rotate(a, c->cs, c->sn, a->qkv + (int64_t)(g * R + r) * D, a->scale, q + r * D);
        for (int r = 0; r < R; ++r) {
            const float *qr = q + r * D;
            float *sr = s + (size_t)r * L16;
            __m512 qv[16];
            for (int d = 0; d < DV; ++d) qv[d] = _mm512_loadu_ps(qr + 16 * d);
            float mx = -INFINITY;
            for (int j = 0; j < L; ++j) {
                const float *kj = kb + (int64_t)j * D;
                __m512 t = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
                for (int d = 1; d < DV; ++d)
                    t = _mm512_fmadd_ps(qv[d], _mm512_loadu_ps(kj + 16 * d), t);
                sr[j] = _mm512_reduce_add_ps(t);
                mx = sr[j] > mx ? sr[j] : mx;
            }
            // the weights e^(s - max), 0 past L, and their sum
            const __m512 m = _mm512_set1_ps(mx);
            __m512 l = _mm512_setzero_ps();
            for (int j = 0; j < L; j += 16) {
                const __mmask16 in =
                    L - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (L - j)) - 1u);
                const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(in, sr + j), m);
                const __m512 e = _mm512_maskz_mov_ps(in, exp16(x));
                _mm512_store_ps(sr + j, e);
                l = _mm512_add_ps(l, e);
            }
            const float inv = 1.0f / _mm512_reduce_add_ps(l);
            __m512 acc[16];
            for (int d = 0; d < DV; ++d) acc[d] = _mm512_setzero_ps();
            for (int j = 0; j < L; ++j) {
                const __m512 w = _mm512_set1_ps(sr[j]);
                const float *vj = vb + (int64_t)j * D;
                for (int d = 0; d < DV; ++d)
                    acc[d] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vj + 16 * d), acc[d]);
            }
            float *o = a->out + (int64_t)(g * R + r) * D;
            for (int d = 0; d < DV; ++d)
                _mm512_storeu_ps(o + 16 * d, _mm512_mul_ps(acc[d], _mm512_set1_ps(inv)));
        }
    }
    free(scratch);
}
#endif

// The entry of the native decode attention: the runtime's copy of a clops_attn_args.
void clops_native_attention(void *args) {
#if HAVE_VNNI
    const clops_attn_args *a = args;
    float cs[128], sn[128];  // (D at most 256)
    const float pos = (float)a->state[0];
    for (int i = 0; i < a->D / 2; ++i) {
        const float ang = pos * a->inv_freq[i];
        cs[i] = cosf(ang);
        sn[i] = sinf(ang);
    }
    attn_ctx c = {a, cs, sn, 0};
    pthread_mutex_lock(&P.call);
    run_all(attend_heads, &c, a->threads < a->KV ? a->threads : a->KV);
    pthread_mutex_unlock(&P.call);
#else
    (void)args;
#endif
}

// Native kernels in a row as one command: a count, then records of (kind, size in bytes, the
// block), 64-bit aligned (runtime.nativekernel.Chain): kind 1 clops_native_matmul, 2
// clops_native_attention.
void clops_native_chain(void *args) {
    const int64_t *h = args;
    const char *p = (const char *)(h + 1);
    for (int64_t i = 0; i < h[0]; ++i) {
        const int64_t kind = ((const int64_t *)p)[0], size = ((const int64_t *)p)[1];
        void *blk = (void *)(p + 16);
        if (kind == 1)
            clops_native_matmul(blk);
        else if (kind == 2)
            clops_native_attention(blk);
        p += 16 + size;
    }
}
