// Array kernels, gather and scatter: element copies through precomputed element offsets (the
// index arithmetic is fused by the compiler into the offsets tensor), and compaction of the
// positions of nonzero flags. T is an unsigned type of the element's size (the bits are copied).
// Build options: -DT=<uchar|ushort|uint|ulong|ulong2>.

__kernel void gather(__global T *out, const long out_off,
                     __global const T *src, const long src_off,
                     __global const long *idx, const long idx_off, const long n)
{
    long i = get_global_id(0);
    if (i >= n) return;
    out[out_off + i] = src[src_off + idx[idx_off + i]];
}

__kernel void scatter(__global T *dst, const long dst_off,
                      __global const T *val, const long val_off,
                      __global const long *idx, const long idx_off, const long n)
{
    long i = get_global_id(0);
    if (i >= n) return;
    dst[dst_off + idx[idx_off + i]] = val[val_off + i];
}

// pos is the inclusive prefix sum of flags: element i (flagged) goes to pos[i] - 1.
__kernel void compact_index(__global long *out, __global const uchar *flags, const long f_off,
                            __global const long *pos, const long p_off, const long n)
{
    long i = get_global_id(0);
    if (i >= n) return;
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
    if (i >= n) return;
    long o = sorted_idx[i];
    if (i + 1 < n && sorted_idx[i + 1] == o) return;
    dst[dst_off + o] = val[val_off + perm[i]];
}
