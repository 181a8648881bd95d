// Array kernels, scans (cumulative sums and products) along the last axis of contiguous rows.
// Three phases, all work-item parallel (no local memory, so the same code is right on CPUs and
// GPUs): each chunk of a row scans itself and records its total; one work-item per row turns the
// totals into exclusive prefixes; each chunk but the first combines its prefix in.
// Build options: -DT=<math type> -DOP_MUL (products; sums otherwise) -DCOMPLEX -DFP64
// -DS=<input type> (read as another type and converted, as bool flags into long positions).

#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#ifndef S
#define S T
#endif

#ifdef OP_MUL
#ifdef COMPLEX
#define COMB(a, b) ((T)((a).x * (b).x - (a).y * (b).y, (a).x * (b).y + (a).y * (b).x))
#define IDENT ((T)(1, 0))
#else
#define COMB(a, b) ((T)((a) * (b)))
#define IDENT ((T)1)
#endif
#else
#define COMB(a, b) ((T)((a) + (b)))
#ifdef COMPLEX
#define IDENT ((T)(0, 0))
#else
#define IDENT ((T)0)
#endif
#endif

// x: rows of n (row stride n); out: rows of n + shift (shift 1 puts the identity first).
__kernel void scan_chunks(__global const S *x, const long x_off, __global T *out,
                          const long o_off, __global T *totals, const long n, const long shift,
                          const long chunk, const long nchunks, const long total_items)
{
    long g = get_global_id(0);
    if (g >= total_items) return;
    long row = g / nchunks, c = g % nchunks;
    long beg = c * chunk, end = min(n, beg + chunk);
    __global const S *xr = x + x_off + row * n;
    __global T *orow = out + o_off + row * (n + shift) + shift;
    if (shift && c == 0) orow[-1] = IDENT;
    T acc = IDENT;
    for (long i = beg; i < end; i++) {
        acc = COMB(acc, (T)xr[i]);
        orow[i] = acc;
    }
    totals[g] = acc;
}

__kernel void scan_totals(__global T *totals, const long nchunks, const long rows)
{
    long row = get_global_id(0);
    if (row >= rows) return;
    __global T *t = totals + row * nchunks;
    T acc = IDENT;
    for (long c = 0; c < nchunks; c++) {
        T v = t[c];
        t[c] = acc;
        acc = COMB(acc, v);
    }
}

__kernel void scan_fix(__global T *out, const long o_off, __global const T *totals,
                       const long n, const long shift, const long chunk, const long nchunks,
                       const long total_items)
{
    long g = get_global_id(0);
    if (g >= total_items) return;
    long row = g / nchunks, c = g % nchunks;
    if (c == 0) return;
    long beg = c * chunk, end = min(n, beg + chunk);
    __global T *orow = out + o_off + row * (n + shift) + shift;
    T p = totals[g];
    for (long i = beg; i < end; i++) orow[i] = COMB(p, orow[i]);
}
