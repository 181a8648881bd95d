// Array kernels, sorting of (key, index) pairs: a bitonic network over rows padded to a power of
// two (GPUs: many short parallel passes), or block merge sort then merge-path merge passes
// (CPUs: O(n log n) work in few launches). Ties are broken by the original index, so the order
// is stable (ascending and descending alike); NaN sorts last ascending and first descending;
// padding always sorts last.
// Searching: binary search of a sorted 1-d array (searchsorted), with NaN as the largest value.
// Build options: -DT=<math type> -DIS_FLOAT (NaN-aware compares) -DFP64.

#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

inline bool before(T ka, long ia, T kb, long ib, long n, int desc)
{
    if (ia >= n) return false;
    if (ib >= n) return true;
#ifdef IS_FLOAT
    bool na = isnan(ka), nb = isnan(kb);
    if (na || nb) {
        if (na && nb) return ia < ib;
        return desc ? na : nb;
    }
#endif
    if (ka != kb) return desc ? ka > kb : ka < kb;
    return ia < ib;
}

// keys/idx: rows of P; x: rows of n (row stride n).
__kernel void sort_init(__global const T *x, const long x_off, __global T *keys,
                        __global long *idx, const long n, const long P, const long total)
{
    long g = get_global_id(0);
    if (g >= total) return;
    long row = g / P, i = g % P;
    idx[g] = i;
    keys[g] = i < n ? x[x_off + row * n + i] : (T)0;
}

__kernel void sort_step(__global T *keys, __global long *idx, const long n, const long P,
                        const long j, const long k, const int desc, const long total)
{
    long g = get_global_id(0);
    if (g >= total) return;
    long hp = P >> 1;
    long row = g / hp, t = g % hp;
    long i = (t / j) * 2 * j + (t % j);
    long l = i + j;
    long a = row * P + i, b = row * P + l;
    T ka = keys[a], kb = keys[b];
    long ia = idx[a], ib = idx[b];
    bool up = (i & k) == 0;
    bool swap = up ? before(kb, ib, ka, ia, n, desc) : before(ka, ia, kb, ib, n, desc);
    if (swap) {
        keys[a] = kb; keys[b] = ka;
        idx[a] = ib; idx[b] = ia;
    }
}

// -- merge sort (CPUs: O(n log n) work in few launches) -------------------------------------------
// Merge the sorted runs a[0:na] and b[0:nb] into out (same order as before()).
inline void merge_runs(__global const T *ak, __global const long *ai, long na,
                       __global const T *bk, __global const long *bi, long nb,
                       __global T *ok, __global long *oi, long n, int desc)
{
    long i = 0, j = 0, o = 0;
    while (i < na && j < nb) {
        if (before(bk[j], bi[j], ak[i], ai[i], n, desc)) { ok[o] = bk[j]; oi[o++] = bi[j++]; }
        else { ok[o] = ak[i]; oi[o++] = ai[i++]; }
    }
    while (i < na) { ok[o] = ak[i]; oi[o++] = ai[i++]; }
    while (j < nb) { ok[o] = bk[j]; oi[o++] = bi[j++]; }
}

// Each work-item sorts one block of B keys of a row (bottom-up merge sort, the second buffer
// pair as scratch); the result is in (ka, ia).
__kernel void msort_block(__global const T *x, const long x_off, __global T *ka,
                          __global long *ia, __global T *kb, __global long *ib, const long n,
                          const long B, const long bpr, const long total, const int desc)
{
    long g = get_global_id(0);
    if (g >= total) return;
    long row = g / bpr, s = (g % bpr) * B;
    long len = min(n, s + B) - s, base = row * n + s;
    for (long t = 0; t < len; t++) {
        ka[base + t] = x[x_off + base + t];
        ia[base + t] = s + t;
    }
    __global T *sk = ka + base, *dk = kb + base;
    __global long *si = ia + base, *di = ib + base;
    for (long w = 1; w < len; w <<= 1) {
        for (long lo = 0; lo < len; lo += 2 * w) {
            long mid = min(lo + w, len), hi = min(lo + 2 * w, len);
            merge_runs(sk + lo, si + lo, mid - lo, sk + mid, si + mid, hi - mid, dk + lo,
                       di + lo, n, desc);
        }
        __global T *tk = sk; sk = dk; dk = tk;
        __global long *ti = si; si = di; di = ti;
    }
    if (sk != ka + base) {
        for (long t = 0; t < len; t++) { ka[base + t] = sk[t]; ia[base + t] = si[t]; }
    }
}

// How many of the first k merged entries come from run a (merge path co-rank).
inline long corank(long k, __global const T *ak, __global const long *ai, long na,
                   __global const T *bk, __global const long *bi, long nb, long n, int desc)
{
    long lo = max(0L, k - nb), hi = min(k, na);
    while (lo < hi) {
        long i = lo + (hi - lo) / 2, j = k - i;
        // is a[i] past the first k? (at least j entries of b come before it)
        bool past = (j == 0) || before(bk[j - 1], bi[j - 1], ak[i], ai[i], n, desc);
        if (past) hi = i; else lo = i + 1;
    }
    return lo;
}

// One pass: runs of w become runs of 2w; each work-item writes C merged entries (C divides 2w).
__kernel void msort_merge(__global const T *sk, __global const long *si, __global T *dk,
                          __global long *di, const long n, const long w, const long C,
                          const long cpr, const long total, const int desc)
{
    long g = get_global_id(0);
    if (g >= total) return;
    long row = g / cpr, o0 = (g % cpr) * C;
    if (o0 >= n) return;
    long o1 = min(n, o0 + C);
    long s = (o0 / (2 * w)) * (2 * w);
    long na = min(w, n - s), nb = max(0L, min(w, n - s - w));
    __global const T *ak = sk + row * n + s, *bk = ak + na;
    __global const long *ai = si + row * n + s, *bi = ai + na;
    long k0 = o0 - s, k1 = o1 - s;
    long i0 = corank(k0, ak, ai, na, bk, bi, nb, n, desc);
    long i1 = corank(k1, ak, ai, na, bk, bi, nb, n, desc);
    merge_runs(ak + i0, ai + i0, i1 - i0, bk + (k0 - i0), bi + (k0 - i0),
               (k1 - i1) - (k0 - i0), dk + row * n + o0, di + row * n + o0, n, desc);
}

inline bool lt(T p, T q)
{
#ifdef IS_FLOAT
    if (isnan(p)) return false;
    if (isnan(q)) return true;
#endif
    return p < q;
}

__kernel void searchsorted(__global const T *a, const long a_off, const long a_stride,
                           const long n, __global const T *v, const long v_off,
                           __global long *out, const long m, const int right)
{
    long g = get_global_id(0);
    if (g >= m) return;
    T x = v[v_off + g];
    long lo = 0, hi = n;
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        T am = a[a_off + mid * a_stride];
        bool go_right = right ? !lt(x, am) : lt(am, x);
        if (go_right) lo = mid + 1; else hi = mid;
    }
    out[g] = lo;
}
