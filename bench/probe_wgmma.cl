// probe_wgmma.py's kernels: can NVIDIA's OpenCL compiler reach Hopper's wgmma (sm_90a) through
// inline PTX? One warpgroup (128 work-items) computes D (64 x 16, float32) = A (64 x 16) B
// (16 x 16) with one wgmma.mma_async.m64n16k16, A and B read from local memory through matrix
// descriptors (no swizzle: 8 x 8 "core matrices" of 128 contiguous bytes). A is K-major: core
// (m8, k8) at byte (m8 * 2 + k8) * 128. B is K-major (TRANS_B 0: B^T stored [n][k], core
// (n8, k8) at (n8 * 2 + k8) * 128) or N-major (TRANS_B 1: B stored [k][n], core (k8, n8) at
// (n8 * 2 + k8) * 128, 16 bytes per k row). The descriptors' leading and stride byte offsets
// come as arguments, so that one build tries both readings of the PTX manual.
//
// HIDE 1: every sm_90a instruction is written as a PTX comment "//@@..." so that the PTX
// assembles for the plain sm_90 target the compiler names; the host then removes the "//@@"
// markers, names .target sm_90a and builds the PTX as a program binary.
#ifndef TRANS_B
#define TRANS_B 0
#endif
#ifndef HIDE
#define HIDE 0
#endif
#if HIDE
#define H "//@@"
#else
#define H ""
#endif
#define STR2(x) #x
#define STR(x) STR2(x)

inline uint smem_addr(__local const void *p) {
    uint r;
    asm volatile("{ .reg .pred q; .reg .u64 s; isspacep.shared q, %1; cvta.to.shared.u64 s, %1;"
                 " selp.u64 s, s, %1, q; cvt.u32.u64 %0, s; }"
                 : "=r"(r) : "l"((ulong)p));
    return r;
}

inline ulong desc(uint addr, uint lbo, uint sbo) {
    return (ulong)((addr & 0x3ffff) >> 4) | ((ulong)(lbo >> 4) << 16) | ((ulong)(sbo >> 4) << 32);
}

__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void probe(__global float *D, __global const half *A, __global const half *B, int lbo_a,
           int sbo_a, int lbo_b, int sbo_b) {
    __local ushort As[64 * 16] __attribute__((aligned(128)));
    __local ushort Bs[16 * 16] __attribute__((aligned(128)));
    const int tid = get_local_id(0);
    __global const ushort *a = (__global const ushort *)A, *b = (__global const ushort *)B;
    for (int i = tid; i < 64 * 16; i += 128) {  // A [m][k]
        const int m = i / 16, k = i % 16;
        As[((m / 8) * 2 + k / 8) * 64 + (m % 8) * 8 + k % 8] = a[i];
    }
    for (int i = tid; i < 16 * 16; i += 128) {  // B [k][n]
        const int k = i / 16, n = i % 16;
#if TRANS_B
        Bs[((n / 8) * 2 + k / 8) * 64 + (k % 8) * 8 + n % 8] = b[i];
#else
        Bs[((n / 8) * 2 + k / 8) * 64 + (n % 8) * 8 + k % 8] = b[i];
#endif
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    barrier(CLK_LOCAL_MEM_FENCE);
    const ulong da = desc(smem_addr(As), lbo_a, sbo_a), db = desc(smem_addr(Bs), lbo_b, sbo_b);
    float d[8];
    for (int i = 0; i < 8; ++i) d[i] = 0.0f;
    asm volatile(H "wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 H "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, " STR(TRANS_B) ";\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(0));
    asm volatile(H "wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile(H "wgmma.wait_group.sync.aligned 0;" ::: "memory");
    // D fragment: warp w rows 16 w + g (+ 8), n8 tile j columns 8 j + 2 t (+ 1)
    const int w = tid >> 5, g = (tid & 31) >> 2, t = tid & 3;
    for (int j = 0; j < 2; ++j)
        for (int e = 0; e < 4; ++e) {
            const int row = 16 * w + g + 8 * (e >> 1), col = 8 * j + 2 * t + (e & 1);
            D[row * 16 + col] = d[4 * j + e];
        }
}

// the local-memory limit: a work-group of 64 work-items that uses LOCAL_BYTES of local memory
__kernel void big_local(__global float *out, __local float *dyn) {
#ifdef LOCAL_BYTES
    __local float s[LOCAL_BYTES / 4];
    s[get_local_id(0) * 100] = 1.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    out[get_local_id(0)] = s[(63 - get_local_id(0)) * 100] + dyn[0];
#else
    dyn[get_local_id(0)] = 1.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    out[get_local_id(0)] = dyn[63 - get_local_id(0)];
#endif
}
