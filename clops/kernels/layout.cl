// Providers, relayout: a strided copy over up to 8 dims, with an element conversion, a cyclic
// rotation per dim (roll, fftshift) and zero fill past a valid extent per dim (padding).
//
// Built with -D DST_T=<type> -D SRC_T=<type>, optionally -D LOAD(p,i)=..., -D STORE(p,i,v)=...,
// -D CONVERT(x)=..., -D ZERO=..., -D USE_FP64.

#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#ifndef LOAD
#define LOAD(p, i) ((p)[i])
#endif
#ifndef STORE
#define STORE(p, i, v) ((p)[i] = (v))
#endif
#ifndef CONVERT
#define CONVERT(x) (x)
#endif
#ifndef ZERO
#define ZERO ((DST_T)(0))
#endif

__kernel void strided_copy(__global DST_T *dst, long dst_off, __global const SRC_T *src,
                           long src_off, long8 shape, long8 dst_strides, long8 src_strides,
                           long8 rot, long8 valid, long total) {
    long i = get_global_id(0);
    if (i >= total) return;
    long sh[8] = {shape.s0, shape.s1, shape.s2, shape.s3, shape.s4, shape.s5, shape.s6, shape.s7};
    long ds[8] = {dst_strides.s0, dst_strides.s1, dst_strides.s2, dst_strides.s3,
                  dst_strides.s4, dst_strides.s5, dst_strides.s6, dst_strides.s7};
    long ss[8] = {src_strides.s0, src_strides.s1, src_strides.s2, src_strides.s3,
                  src_strides.s4, src_strides.s5, src_strides.s6, src_strides.s7};
    long rt[8] = {rot.s0, rot.s1, rot.s2, rot.s3, rot.s4, rot.s5, rot.s6, rot.s7};
    long vd[8] = {valid.s0, valid.s1, valid.s2, valid.s3, valid.s4, valid.s5, valid.s6, valid.s7};
    long d_idx = dst_off, s_idx = src_off;
    int inside = 1;
    long rest = i;
    for (int d = 7; d >= 0; --d) {
        long c = rest % sh[d];
        rest /= sh[d];
        d_idx += c * ds[d];
        long j = c + rt[d];
        if (j >= sh[d]) j -= sh[d];
        inside &= j < vd[d];
        s_idx += j * ss[d];
    }
    if (inside) {
        STORE(dst, d_idx, CONVERT(LOAD(src, s_idx)));
    } else {
        STORE(dst, d_idx, ZERO);
    }
}

#ifndef NO_SCALE
// y[off + i] *= factor, for real (REAL_T) or complex (a vector of REAL_T) elements.
__kernel void scale(__global DST_T *y, long off, REAL_T factor, long total) {
    long i = get_global_id(0);
    if (i >= total) return;
    y[off + i] = y[off + i] * factor;
}
#endif
