// Array kernels, gather and scatter: element copies through precomputed element offsets (the
// index arithmetic is fused by the compiler into the offsets tensor), and compaction of the
// positions of nonzero flags. T is an unsigned type of the element's size (the bits are copied).
// Build options: -DT=<uchar|ushort|uint|ulong|ulong2>; -DEXACT where launches have exactly as
// many work-items as elements (CPUs): no bound checks then.
// PERF (PoCL 3.1, 2-core EPYC, two 2048x4096 float32 joined along axis 1, copy_rows): 29.5 ms
// with the bound check's early return, 6.9 without (PoCL then runs a group's work-items as vector
// lanes; numpy 16-21); Intel's runtime the same either way (12-15).

#ifdef EXACT
#define PAST(cond) 0
#else
#define PAST(cond) (cond)
#endif

__kernel void gather(__global T *out, const long out_off,
                     __global const T *src, const long src_off,
                     __global const long *idx, const long idx_off, const long n)
{
    long i = get_global_id(0);
    if (PAST(i >= n)) return;
    out[out_off + i] = src[src_off + idx[idx_off + i]];
}

__kernel void scatter(__global T *dst, const long dst_off,
                      __global const T *val, const long val_off,
                      __global const long *idx, const long idx_off, const long n)
{
    long i = get_global_id(0);
    if (PAST(i >= n)) return;
    dst[dst_off + idx[idx_off + i]] = val[val_off + i];
}

// pos is the inclusive prefix sum of flags: element i (flagged) goes to pos[i] - 1.
__kernel void compact_index(__global long *out, __global const uchar *flags, const long f_off,
                            __global const long *pos, const long p_off, const long n)
{
    long i = get_global_id(0);
    if (PAST(i >= n)) return;
    if (flags[f_off + i]) out[pos[p_off + i] - 1] = i;
}

// Scatter with repeated offsets, deterministically: offsets sorted stably (perm = their original
// positions), only the last of each run of equal offsets writes, so the last assignment wins.
__kernel void scatter_last(__global T *dst, const long dst_off,
                           __global const T *val, const long val_off,
                           __global const long *sorted_idx, __global const long *perm,
                           const long n)
{
    long i = get_global_id(0);
    if (PAST(i >= n)) return;
    long o = sorted_idx[i];
    if (i + 1 < n && sorted_idx[i + 1] == o) return;
    dst[dst_off + o] = val[val_off + perm[i]];
}

// Gather along one axis by an index array, in blocks: the view is outer x len x inner (outer and
// inner each one stride), idx holds n raw int64 indices (negatives wrap, then clamped into
// range as numpy's checked indices would be, so no access strays). Work-item (j, k, o) writes
// out[(o * n + k) * inner + j] = src[src_off + o * os + wrap(idx[k]) * as + j * js]: dim 0 runs
// along the inner block, so a CPU runtime vectorizes contiguous loads and stores (rows of
// x[idx] are plain copies), with no per-element offsets tensor in memory.
inline long wrap_index(long i, const long len)
{
    i = i < 0 ? i + len : i;
    return clamp(i, 0L, len - 1);
}

// -DUNIT_INNER: the inner block is contiguous (js == 1), so the loads are unit-stride vectors.
__kernel void take_blocks(__global T *out, __global const T *src, const long src_off,
                          __global const long *idx, const long idx_off, const long n,
                          const long len, const long as, const long os, const long js,
                          const long inner)
{
    long j = get_global_id(0), k = get_global_id(1), o = get_global_id(2);
    if (PAST(j >= inner)) return;
    long i = wrap_index(idx[idx_off + k], len);
#ifdef UNIT_INNER
    __global const T *row = src + src_off + o * os + i * as;
    out[(o * n + k) * inner + j] = row[j];
#else
    out[(o * n + k) * inner + j] = src[src_off + o * os + i * as + j * js];
#endif
}

// The same with an inner block of one element: dim 0 runs along the indices.
__kernel void take_elems(__global T *out, __global const T *src, const long src_off,
                         __global const long *idx, const long idx_off, const long n,
                         const long len, const long as, const long os)
{
    long k = get_global_id(0), o = get_global_id(1);
    if (PAST(k >= n)) return;
    long i = wrap_index(idx[idx_off + k], len);
    out[o * n + k] = src[src_off + o * os + i * as];
}

// x[mask] straight from the mask: pos is the inclusive prefix sum of flags, flagged row i (of
// inner contiguous elements) goes to row pos[i] - 1 of out. No index array in between.
__kernel void compress_blocks(__global T *out, __global const T *src, const long src_off,
                              __global const uchar *flags, const long f_off,
                              __global const long *pos, const long p_off, const long n,
                              const long inner)
{
    long j = get_global_id(0), i = get_global_id(1);
    if (PAST(j >= inner) || !flags[f_off + i]) return;
    out[(pos[p_off + i] - 1) * inner + j] = src[src_off + i * inner + j];
}

__kernel void compress_elems(__global T *out, __global const T *src, const long src_off,
                             __global const uchar *flags, const long f_off,
                             __global const long *pos, const long p_off, const long n)
{
    long i = get_global_id(0);
    if (PAST(i >= n) || !flags[f_off + i]) return;
    out[pos[p_off + i] - 1] = src[src_off + i];
}

// One input of a concatenation: rows of a contiguous source (row length `inner`) placed at column
// `col` of the output's rows (row length `out_row`). Work geometry: global (inner, rows); dim 0
// runs along a row, so a CPU runtime copies contiguous vectors.
__kernel void copy_rows(__global T *out, const long out_off, const long out_row, const long col,
                        __global const T *src, const long src_off, const long inner)
{
    long j = get_global_id(0), r = get_global_id(1);
    if (PAST(j >= inner)) return;
    __global T *orow = out + out_off + r * out_row + col;
    __global const T *srow = src + src_off + r * inner;
    orow[j] = srow[j];
}

// Copies that move the source's unit-stride axis (q) away from the last place: out[ia*osa +
// ib*osb + iq*osq + j] = src[src_off + ia*sa + ib*sb + iq + j*sj] (the output's last axis j is
// unit-stride, its others any order of a, b, q), q in tiles of TB. A plain copy of a work-item
// an element reads one element of each cache line it loads; here every line read along q is
// used whole while it is in cache. Two forms:
// - permute_lines (Intel's runtime, which vectorizes across work-items): a work-item per j and
//   tile of q, so that neighbouring work-items store neighbouring output elements;
// - permute_tiles (elsewhere): a work-item per TB x TB tile, each output line stored whole.
// PERF (2 cores, kernel time, float32 (2, 0, 1) of 256x256x256; 64x128x64): Intel's runtime
// permute_lines 26-30 ms, 0.4-0.9; permute_tiles 48-53, 0.5-1.0; through a private tile 41-45,
// 1.3-1.8. PoCL 3.1 permute_tiles 63-85 ms, 0.6-1.4; permute_lines 150-230, 2.6-4.0.
#define TB 16
__kernel void permute_lines(__global T *out, __global const T *src, const long src_off,
                            const long nq, const long nj, const long sj, const long nb,
                            const long sa, const long sb, const long osa, const long osb,
                            const long osq)
{
    long j = get_global_id(0), tq = get_global_id(1), ab = get_global_id(2);
    if (PAST(j >= nj)) return;
    long ia = ab / nb, ib = ab % nb, q0 = tq * TB;
    __global const T *s = src + src_off + ia * sa + ib * sb + q0 + j * sj;
    __global T *d = out + ia * osa + ib * osb + q0 * osq + j;
    if (nq - q0 >= TB) {
        for (int q = 0; q < TB; q++) d[q * osq] = s[q];
    } else {
        for (long q = 0; q < nq - q0; q++) d[q * osq] = s[q];
    }
}

__kernel void permute_tiles(__global T *out, __global const T *src, const long src_off,
                            const long nq, const long nj, const long sj, const long nb,
                            const long sa, const long sb, const long osa, const long osb,
                            const long osq)
{
    long tj = get_global_id(0), tq = get_global_id(1), ab = get_global_id(2);
    long q0 = tq * TB, j0 = tj * TB;
    if (PAST(j0 >= nj)) return;
    long ia = ab / nb, ib = ab % nb;
    __global const T *s = src + src_off + ia * sa + ib * sb + q0 + j0 * sj;
    __global T *d = out + ia * osa + ib * osb + q0 * osq + j0;
    long qn = min((long)TB, nq - q0), jn = min((long)TB, nj - j0);
    if (qn == TB && jn == TB) {
        for (int q = 0; q < TB; q++)
            for (int j = 0; j < TB; j++) d[q * osq + j] = s[j * sj + q];
        return;
    }
    for (long q = 0; q < qn; q++)
        for (long j = 0; j < jn; j++) d[q * osq + j] = s[j * sj + q];
}
