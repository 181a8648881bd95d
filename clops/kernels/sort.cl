// Array kernels, sorting of (key, index) pairs: a bitonic network over rows padded to a power of
// two (GPUs: many short parallel passes; CPUs sort with sort_cpu.cl). Ties are broken by the
// original index, so the order is stable (ascending and descending alike); NaN sorts last
// ascending and first descending; padding always sorts last.
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
