// Array kernels, dense linear algebra on stacks of small and medium matrices: LU factorization
// with partial pivoting, LU solves, and Cholesky. One work-group per matrix (row-major, n x n,
// contiguous); its work-items share each step's row/column/trailing-update work, separated by
// barriers (a work-group of one on CPUs runs the same code serially).
// Build options: -DT=<float|double> -DFP64.

#ifdef FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

__kernel void lu_factor(__global T *A, const long a_off, __global long *piv,
                        __global int *swaps, const int n)
{
    const long m = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global T *a = A + a_off + m * (long)n * n;
    __local int pivot;
    int nswap = 0;
    for (int k = 0; k < n; k++) {
        if (lid == 0) {
            int p = k;
            T best = fabs(a[(long)k * n + k]);
            for (int i = k + 1; i < n; i++) {
                T v = fabs(a[(long)i * n + k]);
                if (v > best) { best = v; p = i; }
            }
            pivot = p;
            piv[m * n + k] = p;
            if (p != k) nswap++;
        }
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        const int p = pivot;
        if (p != k) {
            for (int j = lid; j < n; j += L) {
                T t = a[(long)k * n + j];
                a[(long)k * n + j] = a[(long)p * n + j];
                a[(long)p * n + j] = t;
            }
        }
        barrier(CLK_GLOBAL_MEM_FENCE);
        const T d = a[(long)k * n + k];
        if (d != 0) {
            for (int i = k + 1 + lid; i < n; i += L) a[(long)i * n + k] /= d;
        }
        barrier(CLK_GLOBAL_MEM_FENCE);
        const long t = n - k - 1;
        for (long e = lid; e < t * t; e += L) {
            long i = k + 1 + e / t, j = k + 1 + e % t;
            a[i * n + j] -= a[i * n + k] * a[(long)k * n + j];
        }
        barrier(CLK_GLOBAL_MEM_FENCE);
    }
    if (lid == 0) swaps[m] = nswap;
}

// B (n x r per matrix) is overwritten by the solution of A X = B, A given as its LU factors.
__kernel void lu_solve(__global const T *A, const long a_off, __global const long *piv,
                       __global T *B, const long b_off, const int n, const int r)
{
    const long m = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const T *a = A + a_off + m * (long)n * n;
    __global T *b = B + b_off + m * (long)n * r;
    for (int c = lid; c < r; c += L) {
        for (int k = 0; k < n; k++) {
            long p = piv[m * n + k];
            if (p != k) {
                T t = b[(long)k * r + c];
                b[(long)k * r + c] = b[p * r + c];
                b[p * r + c] = t;
            }
        }
        for (int i = 0; i < n; i++) {
            T s = b[(long)i * r + c];
            for (int k = 0; k < i; k++) s -= a[(long)i * n + k] * b[(long)k * r + c];
            b[(long)i * r + c] = s;
        }
        for (int i = n - 1; i >= 0; i--) {
            T s = b[(long)i * r + c];
            for (int k = i + 1; k < n; k++) s -= a[(long)i * n + k] * b[(long)k * r + c];
            b[(long)i * r + c] = s / a[(long)i * n + i];
        }
    }
}

// Lower Cholesky factor of the (Hermitian) lower triangle of A; not positive definite -> NaN.
__kernel void cholesky(__global const T *A, const long a_off, __global T *Lout, const int n)
{
    const long m = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const T *a = A + a_off + m * (long)n * n;
    __global T *l = Lout + m * (long)n * n;
    for (long e = lid; e < (long)n * n; e += L) l[e] = 0;
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (int j = 0; j < n; j++) {
        if (lid == 0) {
            T s = a[(long)j * n + j];
            for (int k = 0; k < j; k++) s -= l[(long)j * n + k] * l[(long)j * n + k];
            l[(long)j * n + j] = sqrt(s);
        }
        barrier(CLK_GLOBAL_MEM_FENCE);
        const T d = l[(long)j * n + j];
        for (int i = j + 1 + lid; i < n; i += L) {
            T s = a[(long)i * n + j];
            for (int k = 0; k < j; k++) s -= l[(long)i * n + k] * l[(long)j * n + k];
            l[(long)i * n + j] = s / d;
        }
        barrier(CLK_GLOBAL_MEM_FENCE);
    }
}

// Householder QR of an m x n matrix in place (as LAPACK's unblocked geqr2): R on and above the
// diagonal, the reflectors' vectors below it (their first entry 1 implied), their scales in tau.
__kernel void qr_factor(__global T *A, const long a_off, __global T *tau, const int m,
                        const int n)
{
    const long g = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    const int kmax = min(m, n);
    __global T *a = A + a_off + g * (long)m * n;
    __global T *t = tau + g * kmax;
    __local T s_tau;
    for (int k = 0; k < kmax; k++) {
        if (lid == 0) {
            T alpha = a[(long)k * n + k], xn = 0, tk = 0;
            for (int i = k + 1; i < m; i++) xn = hypot(xn, a[(long)i * n + k]);
            if (xn != 0) {
                T beta = -copysign(hypot(alpha, xn), alpha);
                tk = (beta - alpha) / beta;
                T scale = 1 / (alpha - beta);
                for (int i = k + 1; i < m; i++) a[(long)i * n + k] *= scale;
                a[(long)k * n + k] = beta;
            }
            t[k] = tk;
            s_tau = tk;
        }
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        const T tk = s_tau;
        if (tk != 0) {
            for (int j = k + 1 + lid; j < n; j += L) {
                T w = a[(long)k * n + j];
                for (int i = k + 1; i < m; i++) w += a[(long)i * n + k] * a[(long)i * n + j];
                w *= tk;
                a[(long)k * n + j] -= w;
                for (int i = k + 1; i < m; i++) a[(long)i * n + j] -= a[(long)i * n + k] * w;
            }
        }
        barrier(CLK_GLOBAL_MEM_FENCE);
    }
}

// Q (m x qc, the first qc columns of the product of the reflectors) from qr_factor's output.
__kernel void qr_form_q(__global const T *A, const long a_off, __global const T *tau,
                        __global T *Q, const int m, const int n, const int qc)
{
    const long g = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    const int kmax = min(m, n);
    __global const T *a = A + a_off + g * (long)m * n;
    __global const T *t = tau + g * kmax;
    __global T *q = Q + g * (long)m * qc;
    for (int c = lid; c < qc; c += L) {
        for (int i = 0; i < m; i++) q[(long)i * qc + c] = (i == c) ? (T)1 : (T)0;
        for (int k = kmax - 1; k >= 0; k--) {
            T tk = t[k];
            if (tk == 0) continue;
            T w = q[(long)k * qc + c];
            for (int i = k + 1; i < m; i++) w += a[(long)i * n + k] * q[(long)i * qc + c];
            w *= tk;
            q[(long)k * qc + c] -= w;
            for (int i = k + 1; i < m; i++) q[(long)i * qc + c] -= a[(long)i * n + k] * w;
        }
    }
}

// -- Jacobi methods: eigh (two-sided, symmetric) and svd (one-sided, Hestenes) -----------------
// Each round of a sweep treats n/2 disjoint index pairs at once (the circle method: every pair
// meets once in N - 1 rounds, N = n rounded up to even; the pairs of the padding index are
// skipped). Work-items share the pairs of a round; barriers separate the rounds.
inline void round_pair(int N, int r, int i, int *p, int *q)
{
    int a = (i == 0) ? 0 : ((i - 1 + r) % (N - 1)) + 1;
    int b = ((N - 2 - i + r) % (N - 1)) + 1;
    *p = min(a, b);
    *q = max(a, b);
}

// The Givens rotation (c, s) of count pairs (a[k step + i], a[k step + j]), k < count: two
// columns of a row-major matrix (step = its row length) or two rows (step 1).
inline void rotate_pairs(__global T *a, long step, long i, long j, int count, T c, T s)
{
    for (int k = 0; k < count; k++) {
        T x = a[k * step + i], y = a[k * step + j];
        a[k * step + i] = c * x - s * y;
        a[k * step + j] = s * x + c * y;
    }
}

// W (n x n, from A's lower triangle) is diagonalized in place; V accumulates the rotations.
// rot: scratch of N floats per matrix (cosine and sine of each pair of a round).
__kernel void eigh_jacobi(__global const T *A, const long a_off, __global T *W, __global T *V,
                          __global T *rot, const int n, const T tol, const int max_sweeps)
{
    const long g = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    const int N = n + (n & 1);
    __global const T *a = A + a_off + g * (long)n * n;
    __global T *w = W + g * (long)n * n;
    __global T *v = V + g * (long)n * n;
    __global T *cs = rot + g * (long)N;
    __local int go;
    for (long e = lid; e < (long)n * n; e += L) {
        long i = e / n, j = e % n;
        w[e] = i >= j ? a[i * n + j] : a[j * n + i];
        v[e] = i == j ? (T)1 : (T)0;
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (int sweep = 0; sweep < max_sweeps; sweep++) {
        if (lid == 0) {
            T off = 0, tot = 0;
            for (long e = 0; e < (long)n * n; e++) {
                T x = w[e];
                tot += x * x;
                if (e / n != e % n) off += x * x;
            }
            go = off > tol * tol * tot;
        }
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        const int more = go;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!more) break;
        for (int r = 0; r < N - 1; r++) {
            for (int i = lid; i < N / 2; i += L) {
                int p, q;
                round_pair(N, r, i, &p, &q);
                T c = 1, s = 0;
                if (q < n) {
                    T apq = w[(long)p * n + q];
                    if (apq != 0) {
                        T tau = (w[(long)q * n + q] - w[(long)p * n + p]) / (2 * apq);
                        T t = (tau >= 0 ? (T)1 : (T)-1) / (fabs(tau) + sqrt(1 + tau * tau));
                        c = 1 / sqrt(1 + t * t);
                        s = t * c;
                    }
                }
                cs[2 * i] = c;
                cs[2 * i + 1] = s;
            }
            barrier(CLK_GLOBAL_MEM_FENCE);
            for (int i = lid; i < N / 2; i += L) {
                int p, q;
                round_pair(N, r, i, &p, &q);
                T c = cs[2 * i], s = cs[2 * i + 1];
                if (q >= n || s == 0) continue;
                rotate_pairs(w, n, p, q, n, c, s);  // columns p, q of W and of V
                rotate_pairs(v, n, p, q, n, c, s);
            }
            barrier(CLK_GLOBAL_MEM_FENCE);
            for (int i = lid; i < N / 2; i += L) {
                int p, q;
                round_pair(N, r, i, &p, &q);
                T c = cs[2 * i], s = cs[2 * i + 1];
                if (q >= n || s == 0) continue;
                rotate_pairs(w, 1, (long)p * n, (long)q * n, n, c, s);  // rows p, q of W
            }
            barrier(CLK_GLOBAL_MEM_FENCE);
        }
    }
}

// U (m x n, m >= n) starts as A (element (i, j) at a[i * rs + j * cs]) and ends with
// orthogonal columns (the singular values times the left vectors); V accumulates the rotations.
__kernel void svd_jacobi(__global const T *A, const long a_off, const long rs, const long cs,
                         __global T *U, __global T *V, const int m, const int n, const T tol,
                         const int max_sweeps)
{
    const long g = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    const int N = n + (n & 1);
    __global const T *a = A + a_off + g * (long)m * n;
    __global T *u = U + g * (long)m * n;
    __global T *v = V + g * (long)n * n;
    __local int rotated;
    for (long e = lid; e < (long)m * n; e += L) u[e] = a[(e / n) * rs + (e % n) * cs];
    for (long e = lid; e < (long)n * n; e += L) v[e] = (e / n == e % n) ? (T)1 : (T)0;
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (int sweep = 0; sweep < max_sweeps; sweep++) {
        if (lid == 0) rotated = 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = 0; r < N - 1; r++) {
            for (int i = lid; i < N / 2; i += L) {
                int p, q;
                round_pair(N, r, i, &p, &q);
                if (q >= n) continue;
                T al = 0, be = 0, ga = 0;
                for (int k = 0; k < m; k++) {
                    T x = u[(long)k * n + p], y = u[(long)k * n + q];
                    al += x * x;
                    be += y * y;
                    ga += x * y;
                }
                if (fabs(ga) <= tol * sqrt(al * be) || ga == 0) continue;
                rotated = 1;
                T zeta = (be - al) / (2 * ga);
                T t = (zeta >= 0 ? (T)1 : (T)-1) / (fabs(zeta) + sqrt(1 + zeta * zeta));
                T c = 1 / sqrt(1 + t * t), s = c * t;
                rotate_pairs(u, n, p, q, m, c, s);  // columns p, q of U (m rows) and of V
                rotate_pairs(v, n, p, q, n, c, s);
            }
            barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        }
        const int more = rotated;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!more) break;
    }
}
