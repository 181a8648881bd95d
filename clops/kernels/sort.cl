// Array kernels, searching: binary search of a sorted 1-d array (searchsorted), with NaN as the
// largest value. (Sorts: sort_cpu.cl on CPUs, sort_gpu.cl elsewhere.)
// Build options: -DT=<math type> -DIS_FLOAT (NaN-aware compares) -DFP64.

#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

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
