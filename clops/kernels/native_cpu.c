// Products of quantized weights in the CPU layout (rb16, kernels/matmul_cpu.cl) with integer dot
// products, run by the CPU device's queue as an OpenCL native kernel (clEnqueueNativeKernel), on
// the same buffers as its other kernels. Built for the CPU at hand, in one of two widths:
//   ISA 2: AVX-512 with VNNI and VBMI: a row's 16 columns of a block are one 16-wide vector, and
//          the weights meet x through vpdpbusd;
//   ISA 1: AVX2 with FMA and F16C: they are two 8-wide vectors, and the weights meet x through
//          vpmaddubsw and vpmaddwd (16 registers: at most 4 rows a tile, not 8).
// The 16-wide float arithmetic shared by both is written once over `vf` (below).
//
// y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n]): the rows of x (after RMSNorm * nw where
// asked) are first quantized to int8 with a scale per 32 values (dx = amax / 127, as GGML's
// q8_1 does), then each weight group meets them as integer dot products, and each group's
// integer sum meets the float scales once. A row's sums are added in the same order whatever
// the number of rows (the batch engine's tokens do not depend on their batch).
//
// Weights, 16 rows a block (see matmul_cpu.cl): q4 uchar[b][g][j][16] with value j in the low and
// j + 16 in the high nibble of byte j of a 32-value group, scales [b][g][16] (Q4_SYM: value =
// (q - 8) * d) or [b][g][2][16] (value = q * d + min); q8 char[b][k][16], scales
// [b][k / QGROUP][16]. Scales are half or float. A 64-byte load holds 4 k of the 16 rows; a
// byte permutation gives each 32-bit lane (a row) its 4 consecutive k, as the dot products take
// them. ISA 2: weights as the unsigned operand (q4: 0..15; q8: q + 128) and x as the signed
// one; the offsets come back out through the sums of x's int8 values (kept per 16). ISA 1: q4
// as there (the 16-bit pair sums of a group, at most 4 x 2 x 2 x 15 x 127, stay in 16 bits);
// q8 as |q| against x with q's sign (pairs at most 2 x 128 x 127, no offset).
//
// Float16 weights (f16: half[b][k][16]) meet float rows of x (after RMSNorm where asked), a row
// at a time in chains of k: products of few rows (a decode step), bound by the weights'
// bytes. A row's sums do not depend on the other rows here either.
//
// Work is split over a small pool of threads (the device's cores): blocks of 16 output columns,
// after the rows of x are quantized or normalized (split by rows).
//
// Also the attention of a decode row or a prompt's rows (clops_native_attention), and float32
// products of arrays (clops_native_gemm, at the end).

#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__) && defined(__F16C__)
#define ISA 2
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ISA 1
#else
#define ISA 0
#endif
#if ISA
#include <immintrin.h>
#endif

#define CLOPS_NATIVE_VERSION 5

// Where no scratch memory can be had, a product or attention has no way to report it (a native
// kernel returns nothing), and its output would be left as it was: a silent wrong value. The
// process stops instead, saying why.
__attribute__((unused)) static void out_of_memory(const char *what, size_t bytes) {
    fprintf(stderr,
            "clops: the native CPU %s could not allocate %zu bytes of scratch memory (the "
            "machine is out of memory); stopping rather than leave its output unwritten\n",
            what, bytes);
    abort();
}

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
    int32_t ksplit;  // 1: s holds a K-quant's scales as its file does (scales_of below)
} clops_mm_args;

int clops_native_version(void) { return CLOPS_NATIVE_VERSION; }
int clops_native_isa(void) { return ISA; }
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
    volatile int avoid;  // the calling thread's CPU, which the workers keep off (-1: none)
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0,
         NULL, NULL, -1};

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

// A worker's CPUs: the process's, but the calling thread's where the call names one (the
// runtime's threads are pinned one a core: a worker woken on the caller's core shares it until
// the system moves it; PERF, 2-core EPYC, a float32 2048^3 product in a C harness, 112 -> 151
// GFLOP/s with the worker kept off it)
static void keep_off(int avoid) {
    if (!have_cpus) return;
    cpu_set_t set = process_cpus;
    if (avoid >= 0 && CPU_ISSET(avoid, &set) && CPU_COUNT(&set) > 1) CPU_CLR(avoid, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *worker(void *arg) {
    const int tid = (int)(intptr_t)arg;
    int seen = start_gen[tid];  // (tasks before it are not its to run)
    int avoiding = -2;          // (the CPU it keeps off now; -2: none set yet)
    for (;;) {
        // spin a little for the next task (a step's products follow each other), then sleep
        int g = __atomic_load_n(&P.gen, __ATOMIC_ACQUIRE);
        for (int i = 0; g == seen && i < 20000; ++i) {
#if ISA
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
        if (P.avoid != avoiding) {
            avoiding = P.avoid;
            keep_off(avoiding);
        }
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
    P.avoid = sched_getcpu();
    __atomic_store_n(&P.done, 0, __ATOMIC_RELEASE);
    pthread_mutex_lock(&P.mu);
    __atomic_add_fetch(&P.gen, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    fn(ctx, 0, nt);
    // every started worker counts itself (those past nt run nothing)
    while (__atomic_load_n(&P.done, __ATOMIC_ACQUIRE) < P.started) {
#if ISA
        _mm_pause();
#endif
    }
}

#if ISA
// ---- 16 floats (a row's 16 columns of a block): one vector of ISA 2, two of ISA 1 ----
#if ISA == 2
typedef __m512 vf;
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vf_set1(float f) { return _mm512_set1_ps(f); }
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_abs(vf a) { return _mm512_abs_ps(a); }
static inline vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline float vf_sum(vf a) { return _mm512_reduce_add_ps(a); }
static inline float vf_amax(vf a) { return _mm512_reduce_max_ps(a); }
static inline vf vf_half(const void *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline __mmask16 first_n(int n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}
// the first n (at most 16) values, zeros after them
static inline vf vf_load_n(const float *p, int n) { return _mm512_maskz_loadu_ps(first_n(n), p); }
static inline void vf_store_n(float *p, vf v, int n) { _mm512_mask_storeu_ps(p, first_n(n), v); }
static inline vf vf_keep_n(vf v, int n) { return _mm512_maskz_mov_ps(first_n(n), v); }
static inline vf vf_round(vf a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// p * 2^n for whole n (inf and 0 past the float range)
static inline vf vf_scale2(vf p, vf n) { return _mm512_scalef_ps(p, n); }
// x where exp16 takes it (vscalefps takes the whole float range)
static inline vf vf_exp_range(vf x) { return x; }
// v < 0 ? a : b
static inline vf vf_neg_select(vf v, vf a, vf b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ), b, a);
}
#else
typedef struct {
    __m256 lo, hi;
} vf;
static inline vf vf_of(__m256 lo, __m256 hi) {
    vf r = {lo, hi};
    return r;
}
#define VF_MAP1(name, op) \
    static inline vf name(vf a) { return vf_of(op(a.lo), op(a.hi)); }
#define VF_MAP2(name, op) \
    static inline vf name(vf a, vf b) { return vf_of(op(a.lo, b.lo), op(a.hi, b.hi)); }
static inline vf vf_load(const float *p) {
    return vf_of(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
}
static inline void vf_store(float *p, vf v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
static inline vf vf_set1(float f) { return vf_of(_mm256_set1_ps(f), _mm256_set1_ps(f)); }
static inline vf vf_zero(void) { return vf_of(_mm256_setzero_ps(), _mm256_setzero_ps()); }
VF_MAP2(vf_add, _mm256_add_ps)
VF_MAP2(vf_sub, _mm256_sub_ps)
VF_MAP2(vf_mul, _mm256_mul_ps)
VF_MAP2(vf_div, _mm256_div_ps)
VF_MAP2(vf_max, _mm256_max_ps)
static inline __m256 abs8(__m256 a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
VF_MAP1(vf_abs, abs8)
static inline vf vf_fmadd(vf a, vf b, vf c) {
    return vf_of(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
static inline vf vf_fnmadd(vf a, vf b, vf c) {
    return vf_of(_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi));
}
static inline float sum8(__m256 a) {
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
static inline float vf_sum(vf a) { return sum8(_mm256_add_ps(a.lo, a.hi)); }
static inline float vf_amax(vf a) {
    const __m256 m = _mm256_max_ps(a.lo, a.hi);
    const __m128 b = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    const __m128 c = _mm_max_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_max_ss(c, _mm_movehdup_ps(c)));
}
static inline vf vf_half(const void *p) {
    return vf_of(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p + 1)));
}
// lanes below n (of 8) all ones, the others zero
static inline __m256i first_n8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vf_load_n(const float *p, int n) {
    return vf_of(_mm256_maskload_ps(p, first_n8(n)), _mm256_maskload_ps(p + 8, first_n8(n - 8)));
}
static inline void vf_store_n(float *p, vf v, int n) {
    _mm256_maskstore_ps(p, first_n8(n), v.lo);
    _mm256_maskstore_ps(p + 8, first_n8(n - 8), v.hi);
}
static inline vf vf_keep_n(vf v, int n) {
    return vf_of(_mm256_and_ps(v.lo, _mm256_castsi256_ps(first_n8(n))),
                 _mm256_and_ps(v.hi, _mm256_castsi256_ps(first_n8(n - 8))));
}
static inline __m256 round8(__m256 a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
VF_MAP1(vf_round, round8)
// p * 2^n for whole n (-150 .. 128): made as 2^h * 2^(n - h), h = floor(n / 2), each a normal
// float, so that a result past the largest float is inf and one below the smallest normal comes
// out subnormal or 0, as vscalefps gives them
static inline __m256 scale2_8(__m256 p, __m256 n) {
    const __m256i ni = _mm256_cvtps_epi32(
        _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-150.0f)), _mm256_set1_ps(128.0f)));
    const __m256i h = _mm256_srai_epi32(ni, 1), bias = _mm256_set1_epi32(127);
    const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, bias), 23));
    const __m256 b = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, a), b);
}
VF_MAP2(vf_scale2, scale2_8)
// x where exp16 takes it: -104 .. 89, so that r stays finite and n within -150 .. 128, past
// both ends of the float range (NaN stays NaN: minps and maxps give their second operand then)
static inline __m256 exp_range8(__m256 x) {
    return _mm256_max_ps(_mm256_set1_ps(-104.0f), _mm256_min_ps(_mm256_set1_ps(89.0f), x));
}
VF_MAP1(vf_exp_range, exp_range8)
static inline vf vf_neg_select(vf v, vf a, vf b) {
    const __m256 z = _mm256_setzero_ps();
    return vf_of(_mm256_blendv_ps(b.lo, a.lo, _mm256_cmp_ps(v.lo, z, _CMP_LT_OQ)),
                 _mm256_blendv_ps(b.hi, a.hi, _mm256_cmp_ps(v.hi, z, _CMP_LT_OQ)));
}
#endif

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
    vf ss = vf_zero();
    for (int j = 0; j < a->k; j += 16) {
        const vf v = vf_load(xr + j);
        ss = vf_fmadd(v, v, ss);
    }
    return 1.0f / sqrtf(vf_sum(ss) / a->k + a->eps);
}

// q[0..31] <- v0, v1 times id rounded to int8 (|values| at most 127); s[0], s[1]: the sums of
// each 16 of them
static inline void to_int8(vf v0, vf v1, float id, int8_t *q, int32_t *s) {
#if ISA == 2
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(q1));
    s[0] = _mm512_reduce_add_epi32(q0);
    s[1] = _mm512_reduce_add_epi32(q1);
#else
    const __m256 f = _mm256_set1_ps(id);
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(v0.lo, f));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(v0.hi, f));
    const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(v1.lo, f));
    const __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(v1.hi, f));
    // packs work within 128-bit lanes: a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7, put back
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(
                                          p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const __m256i s0 = _mm256_add_epi32(a, b), s1 = _mm256_add_epi32(c, d);
    s[0] = (int32_t)sum8(_mm256_cvtepi32_ps(s0));
    s[1] = (int32_t)sum8(_mm256_cvtepi32_ps(s1));
#endif
}

static void quantize_rows(void *p, int tid, int nt) {
    const quant_ctx *c = p;
    const clops_mm_args *a = c->a;
    const int k = a->k;
    for (int i = tid; i < a->m; i += nt) {
        const float *xr = a->x + a->x_off + (int64_t)i * a->ldx;
        const vf inv = vf_set1(a->norm ? rms_inverse(a, xr) : 1.0f);
        int8_t *q = c->xq + (int64_t)i * XQ_STRIDE(k);
        for (int g = 0; g < k / 32; ++g) {
            vf v0 = vf_mul(vf_load(xr + 32 * g), inv);
            vf v1 = vf_mul(vf_load(xr + 32 * g + 16), inv);
            if (a->norm) {
                v0 = vf_mul(v0, vf_load(a->nw + 32 * g));
                v1 = vf_mul(v1, vf_load(a->nw + 32 * g + 16));
            }
            const float amax = vf_amax(vf_max(vf_abs(v0), vf_abs(v1)));
            const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
            c->dx[(int64_t)i * (k / 32) + g] = d;
            to_int8(v0, v1, id, q + 32 * g, c->xs + (int64_t)i * (k / 16) + 2 * g);
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

static inline vf scales16(const void *s, int64_t at, int half) {
    return half ? vf_half((const uint16_t *)s + at) : vf_load((const float *)s + at);
}

// 16 bytes at p as floats: unsigned (SIGNED 0) or signed
static inline vf vf_bytes(const void *p, const int SIGNED) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
#if ISA == 2
    return _mm512_cvtepi32_ps(SIGNED ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v));
#else
    const __m128i h = _mm_unpackhi_epi64(v, v);
    return SIGNED ? vf_of(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
                          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h)))
                  : vf_of(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
                          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h)));
#endif
}

// ksplit: a K-quant's scales as its file holds them (nn/quant.py, interleave_split): bytes
// sub[b][g][c][16] (Q4_K: the 6-bit scale and min of each 32 values, c = 2; Q6_K: the int8
// scale of each 16, c = 1), then halves sup[b][g / per][c][16] (d and dmin of each 256
// values). The scale is sup * sub, the min -(sup * sub): the float values the other layout
// stores (each product exact), from 0.08 bytes a value where those take 0.25.
// Group g of block b (nb blocks, ng groups of which per share a half): its scale and
// (C == 2) its min.
static inline __attribute__((always_inline)) void scales_of(const void *s, int64_t nb, int ng,
                                                            int per, int64_t b, int g,
                                                            const int C, vf *d, vf *mn) {
    const uint8_t *sub = (const uint8_t *)s + ((int64_t)b * ng + g) * C * 16;
    const uint16_t *sup = (const uint16_t *)((const uint8_t *)s + nb * ng * C * 16) +
                          ((int64_t)b * (ng / per) + g / per) * C * 16;
    if (C == 2) {
        *d = vf_mul(vf_half(sup), vf_bytes(sub, 0));
        *mn = vf_mul(vf_mul(vf_half(sup + 16), vf_bytes(sub + 16, 0)), vf_set1(-1.0f));
    } else {
        *d = vf_mul(vf_half(sup), vf_bytes(sub, 1));
    }
}

// A tile's rows i0 .. i0 + TM - 1 of x (past m: the last row again): their int8 values, scales
// (a per 32 values) and sums (a per 16 values)
static inline __attribute__((always_inline)) void tile_rows(const mm_ctx *c, int i0,
                                                            const int TM, const int8_t **xq,
                                                            const float **dx,
                                                            const int32_t **xs) {
    const int k = c->a->k, m = c->a->m;
    for (int t = 0; t < TM; ++t) {
        const int i = i0 + t < m ? i0 + t : m - 1;
        xq[t] = c->xq + (int64_t)i * XQ_STRIDE(k);
        dx[t] = c->dx + (int64_t)i * (k / 32);
        xs[t] = c->xs + (int64_t)i * (k / 16);
    }
}

#if ISA == 2
// rows of x a tile takes at most
#define TILE_ROWS 8
// lane r (a row of the block) <- bytes r, 16 + r, 32 + r, 48 + r (4 k of that row)
static inline __m512i rows_of(const uint8_t *p) {
    const __m512i idx = _mm512_set_epi8(
        63, 47, 31, 15, 62, 46, 30, 14, 61, 45, 29, 13, 60, 44, 28, 12,
        59, 43, 27, 11, 58, 42, 26, 10, 57, 41, 25, 9, 56, 40, 24, 8,
        55, 39, 23, 7, 54, 38, 22, 6, 53, 37, 21, 5, 52, 36, 20, 4,
        51, 35, 19, 3, 50, 34, 18, 2, 49, 33, 17, 1, 48, 32, 16, 0);
    return _mm512_permutexvar_epi8(idx, _mm512_loadu_si512(p));
}

// acc[t][0..15] += the sums of rows i0 + t (t < TM) of x with block b of W over the 32-value
// groups g0 .. g1 - 1, added group by group.
static inline __attribute__((always_inline)) void tile(const mm_ctx *c, int b, int i0,
                                                       const int TM, int g0, int g1,
                                                       float *acc, int64_t pfd,
                                                       const float *sbuf) {
    const clops_mm_args *a = c->a;
    const int k = a->k, G = k / 32, half = a->scale_half;
    const int64_t nbw = (a->n + 15) / 16;  // blocks of W (ksplit: where sup starts)
    // PERF (2-core EPYC Zen 5, one row): the weights pfd bytes on asked for while these are
    // read: PF_AHEAD (4 KB) took down (k 8192) from 38 to 43-47 GB/s, o and qkv alike; the
    // GLU's products (a gate block, then an up block) prefetch the block they take next:
    // q4 40-42 -> 43-44 GB/s, q8 about even (4 KB on was no better)
    const int pf = TM == 1 && pfd != 0;
    const int8_t *xq[8];
    const float *dx[8];
    const int32_t *xs[8];
    __m512 out[8];
    tile_rows(c, i0, TM, xq, dx, xs);
    for (int t = 0; t < TM; ++t) out[t] = _mm512_loadu_ps(acc + 16 * t);
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
            __m512 d, mn;
            if (sbuf) {
                d = vf_load(sbuf + 32 * (g - g0));
                mn = vf_load(sbuf + 32 * (g - g0) + 16);
            } else if (a->ksplit) {
                scales_of(a->s, nbw, G, 8, b, g, 2, &d, &mn);
            } else {
                d = scales16(a->s, sat, half);
            }
            if (a->q4_sym) {
                for (int t = 0; t < TM; ++t) {
                    const int xsum = xs[t][2 * g] + xs[t][2 * g + 1];
                    const __m512i is = _mm512_sub_epi32(_mm512_add_epi32(lo[t], hi[t]),
                                                        _mm512_set1_epi32(8 * xsum));
                    out[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is),
                                             _mm512_mul_ps(d, _mm512_set1_ps(dx[t][g])), out[t]);
                }
            } else {
                if (!a->ksplit && !sbuf) mn = scales16(a->s, sat + 16, half);
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
            __m512 d, unused;
            if (sbuf)
                d = vf_load(sbuf + 16 * (sg - g0 * 32 / QG));
            else if (a->ksplit)
                scales_of(a->s, nbw, NSG, 256 / QG, b, sg, 1, &d, &unused);
            else
                d = scales16(a->s, ((int64_t)b * NSG + sg) * 16, half);
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
#else
// rows of x a tile takes at most (16 registers: 2 per row for its integer sums)
#define TILE_ROWS 4
// The 64 bytes at p (4 k of 16 rows, [k][16]) as two vectors whose 32-bit lanes each hold the
// 4 k of one row: rows 0-3 and 8-11 in *r0, rows 4-7 and 12-15 in *r1 (the order "P" below)
static inline void rows_of2(const uint8_t *p, __m256i *r0, __m256i *r1) {
    const __m128i *q = (const __m128i *)p;
    const __m256i s = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(q)),
                                              _mm_loadu_si128(q + 2), 1);  // k0 | k2
    const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(q + 1)),
                                              _mm_loadu_si128(q + 3), 1);  // k1 | k3
    const __m256i u = _mm256_unpacklo_epi8(s, t);  // (k0 k1) rows 0-7 | (k2 k3) rows 0-7
    const __m256i v = _mm256_unpackhi_epi8(s, t);  // the same of rows 8-15
    const __m256i k01 = _mm256_permute2x128_si256(u, v, 0x20);
    const __m256i k23 = _mm256_permute2x128_si256(u, v, 0x31);
    *r0 = _mm256_unpacklo_epi16(k01, k23);
    *r1 = _mm256_unpackhi_epi16(k01, k23);
}

// 16 values of rows 0..15 <-> the order P (rows 0-3, 8-11 | 4-7, 12-15): its own inverse
static inline vf order_p(vf v) {
    return vf_of(_mm256_permute2f128_ps(v.lo, v.hi, 0x20),
                 _mm256_permute2f128_ps(v.lo, v.hi, 0x31));
}

static inline vf vf_of_int(__m256i lo, __m256i hi) {
    return vf_of(_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi));
}

// acc[t][0..15] += the sums of rows i0 + t (t < TM) of x with block b of W over the 32-value
// groups g0 .. g1 - 1, added group by group (as ISA 2 adds them: the same integer sums, the
// same float operations).
static inline __attribute__((always_inline)) void tile(const mm_ctx *c, int b, int i0,
                                                       const int TM, int g0, int g1,
                                                       float *acc, int64_t pfd,
                                                       const float *sbuf) {
    const clops_mm_args *a = c->a;
    const int k = a->k, G = k / 32, half = a->scale_half;
    const int64_t nbw = (a->n + 15) / 16;  // blocks of W (ksplit: where sup starts)
    const int pf = TM == 1 && pfd != 0;
    const int8_t *xq[TILE_ROWS];
    const float *dx[TILE_ROWS];
    const int32_t *xs[TILE_ROWS];
    vf out[TILE_ROWS];  // in the order P
    const __m256i ones16 = _mm256_set1_epi16(1);
    tile_rows(c, i0, TM, xq, dx, xs);
    for (int t = 0; t < TM; ++t) out[t] = order_p(vf_load(acc + 16 * t));
    if (a->fmt == 3) {  // q4
        const __m256i lowmask = _mm256_set1_epi8(0x0F);
        const uint8_t *wb = a->w + (int64_t)b * G * 256;
        const int sstride = a->q4_sym ? 16 : 32;
        for (int g = g0; g < g1; ++g) {
            __m256i s0[TILE_ROWS], s1[TILE_ROWS];  // 16-bit sums of pairs of k, order P
            for (int t = 0; t < TM; ++t) s0[t] = s1[t] = _mm256_setzero_si256();
            for (int v = 0; v < 4; ++v) {
                const uint8_t *wp = wb + (int64_t)g * 256 + 64 * v;
                if (pf) _mm_prefetch((const char *)wp + pfd, _MM_HINT_T0);
                __m256i r0, r1;
                rows_of2(wp, &r0, &r1);
                const __m256i l0 = _mm256_and_si256(r0, lowmask);
                const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), lowmask);
                const __m256i l1 = _mm256_and_si256(r1, lowmask);
                const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), lowmask);
                for (int t = 0; t < TM; ++t) {
                    const int32_t *xp = (const int32_t *)(xq[t] + 32 * g);
                    const __m256i xl = _mm256_set1_epi32(xp[v]), xh = _mm256_set1_epi32(xp[4 + v]);
                    s0[t] = _mm256_add_epi16(s0[t], _mm256_add_epi16(_mm256_maddubs_epi16(l0, xl),
                                                                     _mm256_maddubs_epi16(h0, xh)));
                    s1[t] = _mm256_add_epi16(s1[t], _mm256_add_epi16(_mm256_maddubs_epi16(l1, xl),
                                                                     _mm256_maddubs_epi16(h1, xh)));
                }
            }
            const int64_t sat = ((int64_t)b * G + g) * sstride;
            vf d, mn;
            if (sbuf) {
                d = vf_load(sbuf + 32 * (g - g0));
                mn = vf_load(sbuf + 32 * (g - g0) + 16);
            } else if (a->ksplit) {
                scales_of(a->s, nbw, G, 8, b, g, 2, &d, &mn);
            } else {
                d = scales16(a->s, sat, half);
                mn = a->q4_sym ? d : scales16(a->s, sat + 16, half);
            }
            d = order_p(d);
            mn = order_p(mn);
            for (int t = 0; t < TM; ++t) {
                const int xsum = xs[t][2 * g] + xs[t][2 * g + 1];
                __m256i i0v = _mm256_madd_epi16(s0[t], ones16);
                __m256i i1v = _mm256_madd_epi16(s1[t], ones16);
                if (a->q4_sym) {
                    const __m256i off = _mm256_set1_epi32(8 * xsum);
                    i0v = _mm256_sub_epi32(i0v, off);
                    i1v = _mm256_sub_epi32(i1v, off);
                }
                out[t] = vf_fmadd(vf_of_int(i0v, i1v), vf_mul(d, vf_set1(dx[t][g])), out[t]);
                if (!a->q4_sym) out[t] = vf_fmadd(mn, vf_set1(dx[t][g] * (float)xsum), out[t]);
            }
        }
    } else {  // q8: scale groups of QGROUP (16 or 32) values, 4 k a 64-byte load
        const uint8_t *wb = a->w + (int64_t)b * k * 16;
        const int QG = a->qgroup, NSG = k / QG;
        for (int sg = g0 * 32 / QG; sg < g1 * 32 / QG; ++sg) {
            __m256i i0s[TILE_ROWS], i1s[TILE_ROWS];  // 32-bit sums, order P
            for (int t = 0; t < TM; ++t) i0s[t] = i1s[t] = _mm256_setzero_si256();
            for (int v = 0; v < QG / 4; ++v) {
                const int k0 = sg * QG + 4 * v;
                if (pf) _mm_prefetch((const char *)wb + (int64_t)k0 * 16 + pfd, _MM_HINT_T0);
                __m256i r0, r1;
                rows_of2(wb + (int64_t)k0 * 16, &r0, &r1);
                const __m256i a0 = _mm256_abs_epi8(r0), a1 = _mm256_abs_epi8(r1);
                for (int t = 0; t < TM; ++t) {
                    const __m256i xb = _mm256_set1_epi32(*(const int32_t *)(xq[t] + k0));
                    i0s[t] = _mm256_add_epi32(i0s[t], _mm256_madd_epi16(_mm256_maddubs_epi16(
                        a0, _mm256_sign_epi8(xb, r0)), ones16));
                    i1s[t] = _mm256_add_epi32(i1s[t], _mm256_madd_epi16(_mm256_maddubs_epi16(
                        a1, _mm256_sign_epi8(xb, r1)), ones16));
                }
            }
            vf d, unused;
            if (sbuf)
                d = vf_load(sbuf + 16 * (sg - g0 * 32 / QG));
            else if (a->ksplit)
                scales_of(a->s, nbw, NSG, 256 / QG, b, sg, 1, &d, &unused);
            else
                d = scales16(a->s, ((int64_t)b * NSG + sg) * 16, half);
            d = order_p(d);
            const int g = sg * QG / 32;
            for (int t = 0; t < TM; ++t)
                out[t] = vf_fmadd(vf_of_int(i0s[t], i1s[t]), vf_mul(d, vf_set1(dx[t][g])), out[t]);
        }
    }
    for (int t = 0; t < TM; ++t) vf_store(acc + 16 * t, order_p(out[t]));
}
#endif

// The sums of all rows of x with block b of W into acc [m][16]: the groups in runs whose
// weights stay in the first-level cache while every tile of rows meets them.
static void block_sums(const mm_ctx *c, int b, float *acc, int64_t pfd) {
    const clops_mm_args *a = c->a;
    const int m = a->m, G = a->k / 32;
    const int run = a->fmt == 3 ? 64 : 32;  // 16 KB of weights
    // ksplit, several tiles of rows: the run's scales made float once for all of them (8 KB:
    // q4 64 groups' scales and mins, q8 64 groups of 16), as the float layout holds them
    float sbuf[64 * 32] __attribute__((aligned(64)));
    const float *sb = a->ksplit && m > TILE_ROWS ? sbuf : NULL;
    const int64_t nbw = (a->n + 15) / 16;
    memset(acc, 0, sizeof(float) * 16 * m);
    for (int g0 = 0; g0 < G; g0 += run) {
        const int g1 = g0 + run < G ? g0 + run : G;
        if (sb && a->fmt == 3) {
            for (int g = g0; g < g1; ++g) {
                vf d, mn;
                scales_of(a->s, nbw, G, 8, b, g, 2, &d, &mn);
                vf_store(sbuf + 32 * (g - g0), d);
                vf_store(sbuf + 32 * (g - g0) + 16, mn);
            }
        } else if (sb) {
            const int QG = a->qgroup, NSG = a->k / QG;
            for (int sg = g0 * 32 / QG; sg < g1 * 32 / QG; ++sg) {
                vf d, unused;
                scales_of(a->s, nbw, NSG, 256 / QG, b, sg, 1, &d, &unused);
                vf_store(sbuf + 16 * (sg - g0 * 32 / QG), d);
            }
        }
        int i0 = 0;
#if TILE_ROWS >= 8
        for (; i0 + 8 <= m; i0 += 8) tile(c, b, i0, 8, g0, g1, acc + 16 * i0, pfd, sb);
        if (m - i0 >= 4) {
            tile(c, b, i0, 4, g0, g1, acc + 16 * i0, pfd, sb);
            i0 += 4;
        }
#else
        for (; i0 + 4 <= m; i0 += 4) tile(c, b, i0, 4, g0, g1, acc + 16 * i0, pfd, sb);
#endif
        if (m - i0 >= 2) {
            tile(c, b, i0, 2, g0, g1, acc + 16 * i0, pfd, sb);
            i0 += 2;
        }
        if (m - i0 >= 1) tile(c, b, i0, 1, g0, g1, acc + 16 * i0, pfd, sb);
    }
}

// e^x to about 2 ulp: x = n ln 2 + r (ln 2 in two parts), e^r by Cephes' expf polynomial on
// |r| <= ln 2 / 2, times 2^n (inf and 0 past the float range)
static inline vf exp16(vf x) {
    x = vf_exp_range(x);
    const vf n = vf_round(vf_mul(x, vf_set1(1.44269504088896341f)));
    vf r = vf_fnmadd(n, vf_set1(0.693359375f), x);
    r = vf_fnmadd(n, vf_set1(-2.12194440e-4f), r);
    vf p = vf_set1(1.9875691500e-4f);
    p = vf_fmadd(p, r, vf_set1(1.3981999507e-3f));
    p = vf_fmadd(p, r, vf_set1(8.3334519073e-3f));
    p = vf_fmadd(p, r, vf_set1(4.1665795894e-2f));
    p = vf_fmadd(p, r, vf_set1(1.6666665459e-1f));
    p = vf_fmadd(p, r, vf_set1(5.0000001201e-1f));
    p = vf_fmadd(p, vf_mul(r, r), vf_add(r, vf_set1(1.0f)));
    return vf_scale2(p, n);
}

// v * sigmoid(v), with e = e^-|v| (no overflow): sigmoid = 1 / (1 + e), or e / (1 + e) below 0
static inline vf silu(vf v) {
    const vf e = exp16(vf_sub(vf_zero(), vf_abs(v)));
    const vf d = vf_add(vf_set1(1.0f), e);
    return vf_mul(v, vf_div(vf_neg_select(v, e, vf_set1(1.0f)), d));
}

// y columns 16 * b .. of every row from the sums acc (and, GLU, the up rows' sums up)
static void finish_block(const mm_ctx *c, int b, const float *acc, const float *up) {
    const clops_mm_args *a = c->a;
    const int m = a->m, nout = a->glu ? a->n / 2 : a->n;
    const int col = 16 * b, left = nout - col < 16 ? nout - col : 16;
    const vf zero = vf_zero();
    const vf bv = a->has_bias ? vf_load_n(a->bias + col, left) : zero;
    const vf bu = a->has_bias && a->glu ? vf_load_n(a->bias + nout + col, left) : zero;
    for (int i = 0; i < m; ++i) {
        vf v = vf_add(vf_load(acc + 16 * i), bv);
        if (a->glu) v = vf_mul(silu(v), vf_add(vf_load(up + 16 * i), bu));
        float *yp = a->y + a->y_off + (int64_t)i * a->ldy + col;
        if (a->accum) v = vf_add(v, vf_load_n(yp, left));
        vf_store_n(yp, v, left);
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
        const vf inv = vf_set1(rms_inverse(a, xr));
        for (int j = 0; j < k; j += 16)
            vf_store(out + j, vf_mul(vf_mul(vf_load(xr + j), inv), vf_load(a->nw + j)));
    }
}

// chains of k a row's float16 products keep (ISA 1: 2 x 2 x 2 registers of sums for two blocks)
#define F16_CHAINS (ISA == 2 ? 4 : 2)

// acc0 (and, TWO, acc1) [0..15] = row xr with block b0 (b1) of W: F16_CHAINS chains, k by k
static inline __attribute__((always_inline)) void row_f16(const mm_ctx *c, const float *xr,
                                                          int b0, int b1, const int TWO,
                                                          float *acc0, float *acc1) {
    const int64_t k = c->a->k;
    const uint16_t *w0 = (const uint16_t *)c->a->w + (int64_t)b0 * k * 16;
    const uint16_t *w1 = (const uint16_t *)c->a->w + (int64_t)(TWO ? b1 : b0) * k * 16;
    vf o0[F16_CHAINS], o1[F16_CHAINS];
    for (int u = 0; u < F16_CHAINS; ++u) o0[u] = o1[u] = vf_zero();
    for (int64_t kk = 0; kk < k; kk += F16_CHAINS) {
        for (int u = 0; u < F16_CHAINS; ++u) {
            const vf xb = vf_set1(xr[kk + u]);
            o0[u] = vf_fmadd(vf_half(w0 + (kk + u) * 16), xb, o0[u]);
            if (TWO) o1[u] = vf_fmadd(vf_half(w1 + (kk + u) * 16), xb, o1[u]);
        }
    }
#if F16_CHAINS == 4
    vf_store(acc0, vf_add(vf_add(o0[0], o0[1]), vf_add(o0[2], o0[3])));
    if (TWO) vf_store(acc1, vf_add(vf_add(o1[0], o1[1]), vf_add(o1[2], o1[3])));
#else
    vf_store(acc0, vf_add(o0[0], o0[1]));
    if (TWO) vf_store(acc1, vf_add(o1[0], o1[1]));
#endif
}

// ---- float16 weights, many rows (a prompt's products) ----
// rows of x a tile takes at most: 2 x 6 registers of sums on ISA 1, 8 of ISA 2's 32
#ifndef F16_TILE_ROWS
#define F16_TILE_ROWS (ISA == 2 ? 8 : 6)
#endif
// k a run takes: 64 KB of a block's float16 weights, which every tile of rows after the first
// meets from the second-level cache.
// PERF (as below, one core): longer runs give the prefetchers longer streams of x's rows: runs of
// 256 k 88-91 GFLOP/s, 512 91-92, 1024 92-93, 2048 93-94 (f16 2048x8192: 92, 94, 94.5)
#ifndef F16_RUN
#define F16_RUN 2048
#endif

// acc[t][0..15] += rows i0 + t (t < TM) of the float rows with wh, the float16 values of a block
// of W over k0 .. k1 - 1 ([k1 - k0][16]), made float as they are loaded: one chain of k per row (a
// row's sums in the same order whatever TM).
// PERF (2-core EPYC without AVX-512, f16 16384x2048, 64 rows, one thread, runs of 256 k): 88-91
// GFLOP/s where the run's weights made float once into a buffer (16 KB) that each tile read gave
// 80-83: the two conversions a k take other pipes than the 12 FMAs, and the buffer's stores and
// its share of the first-level cache are gone (the same sums: a value made float is the same).
static inline __attribute__((always_inline)) void tile_f16(const mm_ctx *c, const uint16_t *wh,
                                                           int i0, const int TM, int k0, int k1,
                                                           float *acc) {
    const float *xr[F16_TILE_ROWS];
    vf out[F16_TILE_ROWS];
    for (int t = 0; t < TM; ++t) {
        xr[t] = c->xf + (int64_t)(i0 + t) * c->ldf + k0;
        out[t] = vf_load(acc + 16 * t);
    }
    for (int kk = 0; kk < k1 - k0; ++kk) {
        const vf wv = vf_half(wh + 16 * kk);
        for (int t = 0; t < TM; ++t) out[t] = vf_fmadd(wv, vf_set1(xr[t][kk]), out[t]);
    }
    for (int t = 0; t < TM; ++t) vf_store(acc + 16 * t, out[t]);
}

// The sums of all rows with block b of float16 W into acc [m][16]: k in runs, each run's
// weights (F16_RUN x 16) met by every tile of rows
static void block_sums_f16(const mm_ctx *c, int b, float *acc) {
    const int m = c->a->m, k = c->a->k;
    const uint16_t *w = (const uint16_t *)c->a->w + (int64_t)b * k * 16;
    memset(acc, 0, sizeof(float) * 16 * m);
    for (int k0 = 0; k0 < k; k0 += F16_RUN) {
        const int k1 = k0 + F16_RUN < k ? k0 + F16_RUN : k;
        const uint16_t *wh = w + 16 * (int64_t)k0;
        int i0 = 0;
        for (; i0 + F16_TILE_ROWS <= m; i0 += F16_TILE_ROWS)
            tile_f16(c, wh, i0, F16_TILE_ROWS, k0, k1, acc + 16 * i0);
        if (m - i0 >= 4) {
            tile_f16(c, wh, i0, 4, k0, k1, acc + 16 * i0);
            i0 += 4;
        }
        if (m - i0 >= 2) {
            tile_f16(c, wh, i0, 2, k0, k1, acc + 16 * i0);
            i0 += 2;
        }
        if (m - i0 >= 1) tile_f16(c, wh, i0, 1, k0, k1, acc + 16 * i0);
    }
}

// float16 weights meet more rows than this in tiles of rows (block_sums_f16), fewer a row at a
// time (row_f16)
#define F16_FEW_ROWS 4

// Blocks b0 .. b1 - 1 of y for float16 weights: a decode step's few rows one at a time, two
// blocks of W at once (the gate's and the up rows' under GLU, else b and b + 1); more rows in
// tiles
static void f16_blocks(const mm_ctx *c, int b0, int b1, float *acc, float *acc2) {
    const clops_mm_args *a = c->a;
    const int m = a->m;
    if (m > F16_FEW_ROWS) {
        for (int b = b0; b < b1; ++b) {
            block_sums_f16(c, b, acc);
            if (a->glu) block_sums_f16(c, b + c->nb, acc2);
            finish_block(c, b, acc, acc2);
        }
        return;
    }
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
    // the sums [m][16] of a block (and of the up rows' block under GLU), aligned for their loads
    float *acc = aligned_alloc(64, sizeof(float) * 32 * (size_t)m);
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
#if ISA
    const clops_mm_args *a = args;
    const int64_t m = a->m, k = a->k;
    const int64_t xqb = m * XQ_STRIDE(k);
    size_t need = (size_t)(xqb + m * (k / 32) * 4 + m * (k / 16) * 4 + 192);
    if ((size_t)(m * XF_STRIDE(k) * 4) > need) need = (size_t)(m * XF_STRIDE(k) * 4);
    if (need > scratch_bytes) {
        free(scratch);
        scratch = malloc(need);
        scratch_bytes = scratch ? need : 0;
        if (!scratch) out_of_memory("product", need);
    }
    uint8_t *base = scratch;
    const int nout = a->glu ? a->n / 2 : a->n;
    const int rows_threads = m < a->threads ? (int)m : a->threads;
    const int nb = (nout + 15) / 16;
    // about 8 runs a thread (a run of at least one block), where the weights stream from
    // memory; float16 weights in tiles of rows (a prompt's), bound by their FMAs: a block at a
    // time (the last runs, a sixteenth of the product each, kept a thread waiting for the other)
    const int per = a->fmt == 1 && m > F16_FEW_ROWS ? 1
                                                    : nb / (8 * (a->threads > 0 ? a->threads : 1));
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
    // (a thread without its sums' memory leaves its blocks to the others; none had any)
    if (c.next < c.nb) out_of_memory("product", sizeof(float) * 32 * (size_t)m + 64);
    pthread_mutex_unlock(&P.call);
#else
    (void)args;
#endif
}


// ---- attention of a decode row or a prompt's rows ----
// Query rows at positions pos = state[0] + i (i < m) straight from the QKV projection
// (attn_decode_cpu of attention.cl, natively; for m > 1 rope_store and attn_prefill): q and the
// new k rotated (NEOX: pairs (i, i + D/2), else (2i, 2i+1)), the new k and v stored in the cache
// at pos, and each query head's attention over the keys 0 .. pos. A key-value head and its
// n_rep query heads are one task: its keys and values are read from memory once for them. Scores
// first (a row of L = pos + 1), then their softmax with a vector exp, then the weighted values.
// A prompt's row takes the same steps as a decode row at its position (the same values).
typedef struct {
    float *out;             // [H][D]
    const float *qkv;       // [q (H*D) | k (KV*D) | v (KV*D)]
    float *kc, *vc;         // [KV][max_seq][D]
    const int32_t *state;   // state[0]: pos
    const float *inv_freq;  // [D / 2]
    int32_t max_seq, n_rep, H, KV, D, neox, threads;
    float scale;
    int32_t m;  // rows (qkv rows (H + 2 KV) * D apart, out rows H * D apart)
} clops_attn_args;

int clops_native_attn_args_size(void) { return (int)sizeof(clops_attn_args); }

#if ISA
typedef struct {
    const clops_attn_args *a;
    float *cs, *sn;  // [m][D / 2]: the angles' cosines and sines at each row's pos
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

// the new k and v of row i of qkv (at pos; cs, sn: its angles) into the cache, key-value head g
static void store_kv(const clops_attn_args *a, const float *cs, const float *sn, int64_t i,
                     int pos, int g) {
    const int D = a->D;
    const int64_t ms = a->max_seq;
    const float *row = a->qkv + i * (int64_t)(a->H + 2 * a->KV) * D;
    rotate(a, cs, sn, row + (int64_t)(a->H + g) * D, 1.0f, a->kc + ((int64_t)g * ms + pos) * D);
    memcpy(a->vc + ((int64_t)g * ms + pos) * D, row + (int64_t)(a->H + a->KV + g) * D,
           sizeof(float) * D);
}

// The n_rep query heads of key-value head g of row i (at pos; cs, sn: its angles) over the keys
// 0 .. pos; q: [R][D] and s: [R][(pos + 16) & ~15] of scratch
static void attend_row(const clops_attn_args *a, const float *cs, const float *sn, int64_t i,
                       int pos, int g, float *q, float *s) {
    const int D = a->D, DV = D / 16, R = a->n_rep, L = pos + 1, L16 = (L + 15) & ~15;
    const int64_t ms = a->max_seq;
    const float *kb = a->kc + (int64_t)g * ms * D, *vb = a->vc + (int64_t)g * ms * D;
    const float *row = a->qkv + i * (int64_t)(a->H + 2 * a->KV) * D;
    for (int r = 0; r < R; ++r)
        rotate(a, cs, sn, row + (int64_t)(g * R + r) * D, a->scale, q + r * D);
    for (int r = 0; r < R; ++r) {
        const float *qr = q + r * D;
        float *sr = s + (size_t)r * L16;
        vf qv[16];
        for (int d = 0; d < DV; ++d) qv[d] = vf_load(qr + 16 * d);
        float mx = -INFINITY;
        for (int j = 0; j < L; ++j) {
            const float *kj = kb + (int64_t)j * D;
            vf t = vf_mul(qv[0], vf_load(kj));
            for (int d = 1; d < DV; ++d) t = vf_fmadd(qv[d], vf_load(kj + 16 * d), t);
            sr[j] = vf_sum(t);
            mx = sr[j] > mx ? sr[j] : mx;
        }
        // the weights e^(s - max), 0 past L, and their sum
        const vf m = vf_set1(mx);
        vf l = vf_zero();
        for (int j = 0; j < L; j += 16) {
            const int in = L - j;
            const vf x = vf_sub(vf_load_n(sr + j, in), m);
            const vf e = vf_keep_n(exp16(x), in);
            vf_store(sr + j, e);
            l = vf_add(l, e);
        }
        const float inv = 1.0f / vf_sum(l);
        vf acc[16];
        for (int d = 0; d < DV; ++d) acc[d] = vf_zero();
        for (int j = 0; j < L; ++j) {
            const vf w = vf_set1(sr[j]);
            const float *vj = vb + (int64_t)j * D;
            for (int d = 0; d < DV; ++d) acc[d] = vf_fmadd(w, vf_load(vj + 16 * d), acc[d]);
        }
        float *o = a->out + (i * a->H + (int64_t)g * R + r) * D;
        for (int d = 0; d < DV; ++d) vf_store(o + 16 * d, vf_mul(acc[d], vf_set1(inv)));
    }
}

// attend_row's scratch for rows at positions below last_pos + 1: q [R][D], then s [R][L16]
// (its bytes; attend_scratch: the memory, NULL where there is none)
static size_t attend_scratch_bytes(const clops_attn_args *a, int last_pos) {
    const size_t R = (size_t)a->n_rep, L16 = (size_t)((last_pos + 16) & ~15);
    return sizeof(float) * (R * a->D + R * L16) + 64;
}

static float *attend_scratch(const clops_attn_args *a, int last_pos) {
    return aligned_alloc(64, attend_scratch_bytes(a, last_pos));
}

// one decode row: a task a key-value head, its k and v stored, then its query heads
static void attend_heads(void *p, int tid, int nt) {
    attn_ctx *c = p;
    const clops_attn_args *a = c->a;
    const int pos = a->state[0];
    const size_t R = (size_t)a->n_rep;
    (void)tid;
    (void)nt;
    float *scratch = attend_scratch(a, pos);
    if (!scratch) return;
    for (;;) {
        const int g = __atomic_fetch_add(&c->next, 1, __ATOMIC_RELAXED);
        if (g >= a->KV) break;
        store_kv(a, c->cs, c->sn, 0, pos, g);
        attend_row(a, c->cs, c->sn, 0, pos, g, scratch, scratch + R * a->D);
    }
    free(scratch);
}

// a prompt's rows, first step (split by rows): each row's angles, and its k and v stored
static void rows_angles_kv(void *p, int tid, int nt) {
    attn_ctx *c = p;
    const clops_attn_args *a = c->a;
    const int half = a->D / 2;
    for (int i = tid; i < a->m; i += nt) {
        const int pos = a->state[0] + i;
        float *cs = c->cs + (int64_t)i * half, *sn = c->sn + (int64_t)i * half;
        for (int d = 0; d < half; ++d) {
            const float ang = (float)pos * a->inv_freq[d];
            cs[d] = cosf(ang);
            sn[d] = sinf(ang);
        }
        for (int g = 0; g < a->KV; ++g) store_kv(a, cs, sn, i, pos, g);
    }
}

// a prompt's rows, second step: a task a row and key-value head, the longest rows first
static void attend_rows(void *p, int tid, int nt) {
    attn_ctx *c = p;
    const clops_attn_args *a = c->a;
    const int half = a->D / 2;
    const size_t R = (size_t)a->n_rep;
    (void)tid;
    (void)nt;
    float *scratch = attend_scratch(a, a->state[0] + a->m - 1);
    if (!scratch) return;
    for (;;) {
        const int t = __atomic_fetch_add(&c->next, 1, __ATOMIC_RELAXED);
        if (t >= a->m * a->KV) break;
        const int i = a->m - 1 - t / a->KV, g = t % a->KV;
        attend_row(a, c->cs + (int64_t)i * half, c->sn + (int64_t)i * half, i,
                   a->state[0] + i, g, scratch, scratch + R * a->D);
    }
    free(scratch);
}
#endif

// The entry of the native decode attention: the runtime's copy of a clops_attn_args.
void clops_native_attention(void *args) {
#if ISA
    const clops_attn_args *a = args;
    if (a->m > 1) {
        // the rows' angles [m][D / 2], cosines then sines
        float *ang = malloc(sizeof(float) * (size_t)a->m * a->D);
        if (!ang) out_of_memory("attention", sizeof(float) * (size_t)a->m * a->D);
        attn_ctx c = {a, ang, ang + (size_t)a->m * (a->D / 2), 0};
        const int nt = a->threads < a->m * a->KV ? a->threads : a->m * a->KV;
        pthread_mutex_lock(&P.call);
        run_all(rows_angles_kv, &c, a->threads < a->m ? a->threads : a->m);
        run_all(attend_rows, &c, nt);
        // (a thread without scratch leaves its tasks to the others; none had any)
        if (c.next < a->m * a->KV)
            out_of_memory("attention", attend_scratch_bytes(a, a->state[0] + a->m - 1));
        pthread_mutex_unlock(&P.call);
        free(ang);
        return;
    }
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
    if (c.next < a->KV) out_of_memory("attention", attend_scratch_bytes(a, a->state[0]));
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


// ---- float32 products of arrays: C = A @ B (clops_native_gemm) ----
// C [m][n] (row stride ldc) = A [m][k] (lda; or stored transposed, a_trans: element (i, k) at
// k * lda + i) @ B [k][n] (ldb), for each of `batch` products (the operands sc, sa, sb elements
// apart). k in steps of G_KC: each step's B packed into panels of 16 columns ([n / 16][kc][16],
// contiguous: a tile reads its panel in order), A in blocks of G_MC rows packed into tiles of
// G_TM rows ([kc][G_TM]: a k's values of the tile's rows side by side, zero rows past m), every
// tile of a block meeting every panel in turn (the block stays in the second-level cache). A
// tile's G_TM x 16 sums are G_TM vectors of 16 (ISA 1: 2 x 6 of its 16 registers), one chain of
// k each; a step's sums are added to C after the first. Threads take (block of rows, range of
// panels) tasks as they come free; a batch of small products takes one product a task.
typedef struct {
    float *c;
    const float *a;
    const float *b;
    int64_t c_off, ldc, a_off, lda, b_off, ldb, sc, sa, sb;
    int32_t m, n, k, batch, a_trans, threads;
} clops_gemm_args;

int clops_native_gemm_args_size(void) { return (int)sizeof(clops_gemm_args); }

#if ISA
#define G_TM F16_TILE_ROWS
#ifndef G_KC
#define G_KC 256
#endif
#define G_MC (16 * G_TM)

// B's rows k0 .. k0 + kc - 1, panels p0 .. p1 - 1, into bp ([panel][kc][16])
static void gemm_pack_b(const float *b, int64_t ldb, int k0, int kc, int p0, int p1, float *bp) {
    for (int p = p0; p < p1; ++p) {
        float *dst = bp + (int64_t)p * kc * 16;
        const float *src = b + (int64_t)k0 * ldb + 16 * p;
        for (int kk = 0; kk < kc; ++kk) vf_store(dst + 16 * kk, vf_load(src + kk * ldb));
    }
}

// A's rows i0 .. i0 + rows - 1 over k0 .. k0 + kc - 1 into tiles of G_TM rows ([tile][kc][G_TM]),
// rows past `rows` zero
static void gemm_pack_a(const clops_gemm_args *g, const float *a, int i0, int rows, int k0,
                        int kc, float *ap) {
    const int tiles = (rows + G_TM - 1) / G_TM;
    for (int t = 0; t < tiles; ++t) {
        float *dst = ap + (int64_t)t * kc * G_TM;
        for (int r = 0; r < G_TM; ++r) {
            const int i = t * G_TM + r;
            if (i >= rows) {
                for (int kk = 0; kk < kc; ++kk) dst[kk * G_TM + r] = 0.0f;
            } else if (g->a_trans) {
                const float *src = a + (int64_t)k0 * g->lda + i0 + i;
                for (int kk = 0; kk < kc; ++kk) dst[kk * G_TM + r] = src[kk * g->lda];
            } else {
                const float *src = a + (int64_t)(i0 + i) * g->lda + k0;
                for (int kk = 0; kk < kc; ++kk) dst[kk * G_TM + r] = src[kk];
            }
        }
    }
}

// rows (at most G_TM) x 16 of C (+)= a tile of packed A with a panel of packed B
static inline __attribute__((always_inline)) void gemm_tile(const float *ap, const float *bp,
                                                            int kc, float *c, int64_t ldc,
                                                            int rows, int add) {
    vf acc[G_TM];
    // (C's rows are far apart: their lines are asked for now, to be there when the sums are)
    for (int t = 0; t < rows; ++t) {
        __builtin_prefetch(c + t * ldc, 1);
        __builtin_prefetch(c + t * ldc + 15, 1);
    }
    for (int t = 0; t < G_TM; ++t) acc[t] = vf_zero();
#pragma GCC unroll 4
    for (int kk = 0; kk < kc; ++kk) {
        const vf bv = vf_load(bp + 16 * kk);
        const float *av = ap + G_TM * kk;
        for (int t = 0; t < G_TM; ++t) acc[t] = vf_fmadd(bv, vf_set1(av[t]), acc[t]);
    }
    for (int t = 0; t < rows; ++t) {
        float *cr = c + t * ldc;
        vf_store(cr, add ? vf_add(vf_load(cr), acc[t]) : acc[t]);
    }
}

// C's rows i0 .. i0 + rows - 1, panels p0 .. p1 - 1, for one step of k (packed A and B)
static void gemm_block(const clops_gemm_args *g, float *c, const float *ap, const float *bp,
                       int i0, int rows, int kc, int p0, int p1, int add) {
    const int tiles = (rows + G_TM - 1) / G_TM;
    for (int p = p0; p < p1; ++p)
        for (int t = 0; t < tiles; ++t) {
            const int r = rows - t * G_TM < G_TM ? rows - t * G_TM : G_TM;
            gemm_tile(ap + (int64_t)t * kc * G_TM, bp + (int64_t)p * kc * 16, kc,
                      c + (int64_t)(i0 + t * G_TM) * g->ldc + 16 * p, g->ldc, r, add);
        }
}

typedef struct {
    const clops_gemm_args *g;
    int64_t bi;     // the product (batch) of a step
    int k0, kc;     // the step
    float *bp;      // its packed B (one step, every panel)
    int mblocks, chunks, per;  // tasks: mblocks x chunks ranges of `per` panels
    int next;       // the next task
    int failed;     // a thread had no memory for its packed A
} gemm_ctx;


static void gemm_pack_b_task(void *p, int tid, int nt) {
    gemm_ctx *x = p;
    const clops_gemm_args *g = x->g;
    const int np = g->n / 16, per = (np + nt - 1) / nt;
    const int p0 = tid * per, p1 = p0 + per < np ? p0 + per : np;
    if (p0 < p1)
        gemm_pack_b(g->b + g->b_off + x->bi * g->sb, g->ldb, x->k0, x->kc, p0, p1, x->bp);
}

static void gemm_step_task(void *p, int tid, int nt) {
    gemm_ctx *x = p;
    const clops_gemm_args *g = x->g;
    (void)tid;
    (void)nt;
    float *ap = aligned_alloc(64, sizeof(float) * G_MC * G_KC);
    if (!ap) {
        __atomic_store_n(&x->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const float *a = g->a + g->a_off + x->bi * g->sa;
    float *c = g->c + g->c_off + x->bi * g->sc;
    const int np = g->n / 16;
    int packed = -1;  // the block of rows in ap
    for (;;) {
        const int task = __atomic_fetch_add(&x->next, 1, __ATOMIC_RELAXED);
        if (task >= x->mblocks * x->chunks) break;
        const int blk = task / x->chunks, ch = task % x->chunks;
        const int i0 = blk * G_MC, rows = g->m - i0 < G_MC ? g->m - i0 : G_MC;
        if (packed != blk) {
            gemm_pack_a(g, a, i0, rows, x->k0, x->kc, ap);
            packed = blk;
        }
        const int p0 = ch * x->per, p1 = p0 + x->per < np ? p0 + x->per : np;
        gemm_block(g, c, ap, x->bp, i0, rows, x->kc, p0, p1, x->k0 > 0);
    }
    free(ap);
}

// One whole product on this thread (a batch of small ones: a product a task)
typedef struct {
    const clops_gemm_args *g;
    int next, failed;
} gemm_batch_ctx;

static void gemm_batch_task(void *p, int tid, int nt) {
    gemm_batch_ctx *x = p;
    const clops_gemm_args *g = x->g;
    (void)tid;
    (void)nt;
    const int np = g->n / 16;
    float *ap = aligned_alloc(64, sizeof(float) * G_MC * G_KC);
    float *bp = aligned_alloc(64, sizeof(float) * (size_t)g->n * G_KC);
    if (!ap || !bp) {
        free(ap);
        free(bp);
        __atomic_store_n(&x->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (;;) {
        const int64_t bi = __atomic_fetch_add(&x->next, 1, __ATOMIC_RELAXED);
        if (bi >= g->batch) break;
        const float *a = g->a + g->a_off + bi * g->sa;
        float *c = g->c + g->c_off + bi * g->sc;
        for (int k0 = 0; k0 < g->k; k0 += G_KC) {
            const int kc = g->k - k0 < G_KC ? g->k - k0 : G_KC;
            gemm_pack_b(g->b + g->b_off + bi * g->sb, g->ldb, k0, kc, 0, np, bp);
            for (int i0 = 0; i0 < g->m; i0 += G_MC) {
                const int rows = g->m - i0 < G_MC ? g->m - i0 : G_MC;
                gemm_pack_a(g, a, i0, rows, k0, kc, ap);
                gemm_block(g, c, ap, bp, i0, rows, kc, 0, np, k0 > 0);
            }
        }
    }
    free(ap);
    free(bp);
}
#endif

// The entry of the native kernel: the runtime's copy of a clops_gemm_args. n is a multiple of
// 16, m, k and batch at least 1.
void clops_native_gemm(void *args) {
#if ISA
    const clops_gemm_args *g = args;
    const int nt = g->threads > 0 ? g->threads : 1, np = g->n / 16;
    pthread_mutex_lock(&P.call);
    const int mblocks = (g->m + G_MC - 1) / G_MC;
    // (a product of up to 2^24 multiply-adds takes one thread a fraction of a millisecond: a
    // batch of them a product a thread, no steps shared)
    if (g->batch >= 2 * nt &&
        ((int64_t)mblocks * np < 8 * nt || (int64_t)g->m * g->n * g->k <= (1 << 24))) {
        gemm_batch_ctx x = {g, 0, 0};
        run_all(gemm_batch_task, &x, nt);
        if (x.failed) out_of_memory("float32 product", sizeof(float) * (size_t)g->n * G_KC);
        pthread_mutex_unlock(&P.call);
        return;
    }
    float *bp = aligned_alloc(64, sizeof(float) * (size_t)g->n * G_KC);
    if (!bp) out_of_memory("float32 product", sizeof(float) * (size_t)g->n * G_KC);
    // enough tasks for every thread: the panels cut into chunks where there are few blocks
    int chunks = (4 * nt + mblocks - 1) / mblocks;
    if (chunks > np) chunks = np;
    const int per = (np + chunks - 1) / chunks;
    chunks = (np + per - 1) / per;
    for (int64_t bi = 0; bi < g->batch; ++bi)
        for (int k0 = 0; k0 < g->k; k0 += G_KC) {
            gemm_ctx x = {g, bi, k0, g->k - k0 < G_KC ? g->k - k0 : G_KC, bp, mblocks, chunks,
                          per, 0, 0};
            run_all(gemm_pack_b_task, &x, nt);
            run_all(gemm_step_task, &x, nt);
            if (x.failed) out_of_memory("float32 product", sizeof(float) * G_MC * G_KC);
        }
    free(bp);
    pthread_mutex_unlock(&P.call);
#else
    (void)args;
#endif
}
