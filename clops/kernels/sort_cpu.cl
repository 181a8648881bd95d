// Array kernels, sorting on CPU devices: a stable LSD radix sort of order-preserving keys, one
// byte a pass. A work-item sorts a whole row (rows of a matrix: one launch), or a chunk of a long
// row with its passes spread over the work-items (one launch to count, one a pass).
// Keys: sortkey.cl's (order-preserving; -0.0 is 0.0, NaN last; descending complements them;
// low bytes zero in every element stay zero, so integral floats skip passes).
// Passes whose byte is the same in every key of a row are skipped (decided in the kernels, from
// the counts: nothing is read back). Elements move as their bits; keys are recomputed each pass.
// Build options: -DU=<uchar|ushort|uint|ulong> (the element's bits) -DBITS=<its bits> -DR=<bits
// of a digit> -DNB=<2^R> -DPASSES=<BITS / R, rounded up> -DKIND=<0 unsigned, 1 signed, 2 float>
// -DINF=<bits of +inf> (floats) -DVALS=<0|1> (write the sorted values) -DIDX=<0|1> (write the
// permutation, int64) -DSMALL=<rows this short: insertion sort> -DCMAX=<most chunks of a row>.

#include "clops/sortkey.cl"  // SIGN, key_of

// Where no key of a row is NaN or -0.0, the key (sortkey.cl) is one-to-one: passes after the
// first move keys instead of bits (no key to recompute), and the last turns them back into
// values.
inline int special(U b)
{
#if KIND == 2
    return (b & (U)~SIGN) > (U)INF || b == SIGN;
#else
    return 0;
#endif
}

inline U value_of(U k, U flip)
{
    k ^= flip;
#if KIND == 1
    k ^= SIGN;
#elif KIND == 2
    k = (k & SIGN) ? (U)(k - SIGN) : (U)((SIGN - k) | SIGN);
#endif
    return k;
}

inline uint digit(U k, int p) { return (uint)(k >> (R * p)) & (NB - 1); }

// The slots of four consecutive elements of digits d0..d3 in offs (advanced past them); equal
// digits take consecutive slots, in order.
#define SLOTS4(offs, d0, d1, d2, d3, p0, p1, p2, p3) \
    p0 = offs[d0]; \
    p1 = offs[d1] + (d0 == d1); \
    p2 = offs[d2] + (d0 == d2) + (d1 == d2); \
    p3 = offs[d3] + (d0 == d3) + (d1 == d3) + (d2 == d3); \
    offs[d0] = p0 + 1; offs[d1] = p1 + 1; offs[d2] = p2 + 1; offs[d3] = p3 + 1;

// Digit counts of every pass over src[lo:hi), added to cnt[PASSES][NB] (two interleaved sets of
// counters, so that runs of one digit do not wait on each other's increments).
__attribute__((always_inline)) inline uint count_digits(__global const U *src, long lo, long hi, U flip, uint *cnt,
                         uint *cnt2)
{
    long i = lo;
    uint sp = 0;
    for (; i + 1 < hi; i += 2) {
        U b0 = src[i], b1 = src[i + 1];
        U k0 = key_of(b0, flip), k1 = key_of(b1, flip);
        sp += special(b0) + special(b1);
        for (int p = 0; p < PASSES; p++) {
            cnt[p * NB + digit(k0, p)]++;
            cnt2[p * NB + digit(k1, p)]++;
        }
    }
    if (i < hi) {
        U b0 = src[i], k0 = key_of(b0, flip);
        sp += special(b0);
        for (int p = 0; p < PASSES; p++) cnt[p * NB + digit(k0, p)]++;
    }
    for (int t = 0; t < PASSES * NB; t++) cnt[t] += cnt2[t];
    return sp;
}

// One pass over src[lo:hi) (bits sv, and indices si, or, in the first pass, the positions):
// each element to its slot of offs (exclusive prefix sums of the digit counts, advanced as they
// fill); the last pass writes the values (VALS) and int64 indices dl, the others dv and di. With
// keyed, passes after the first read keys and all but the last write them. With next >= 0, also
// counts what lands in each chunk of 2^s slots by its digit of pass next.
#define LOAD(e, k, i) \
    U e = sv[i]; \
    U k = keyed && !first ? e : key_of(e, flip);
#define MOVE(e, k, i, pos) \
    if (!last) dv[pos] = keyed ? k : e; \
    else if (VALS) dv[pos] = keyed && !first ? value_of(e, flip) : e; \
    if (IDX) { uint ix_ = first ? (uint)(i) : si[i]; if (last) dl[pos] = ix_; else di[pos] = ix_; }

__attribute__((always_inline)) inline void scatter(__global const U *sv, __global const uint *si, __global U *dv,
                    __global uint *di, __global long *dl, long lo, long hi, uint *offs, int p,
                    U flip, int first, int last, int keyed, int next, int s, uint *nc)
{
    long i = lo;
    for (; i + 3 < hi; i += 4) {
        LOAD(e0, k0, i) LOAD(e1, k1, i + 1) LOAD(e2, k2, i + 2) LOAD(e3, k3, i + 3)
        uint d0 = digit(k0, p), d1 = digit(k1, p), d2 = digit(k2, p), d3 = digit(k3, p);
        uint p0, p1, p2, p3;
        SLOTS4(offs, d0, d1, d2, d3, p0, p1, p2, p3)
        MOVE(e0, k0, i, p0) MOVE(e1, k1, i + 1, p1) MOVE(e2, k2, i + 2, p2)
        MOVE(e3, k3, i + 3, p3)
        if (next >= 0) {
            nc[(p0 >> s) * NB + digit(k0, next)]++;
            nc[(p1 >> s) * NB + digit(k1, next)]++;
            nc[(p2 >> s) * NB + digit(k2, next)]++;
            nc[(p3 >> s) * NB + digit(k3, next)]++;
        }
    }
    for (; i < hi; i++) {
        LOAD(e, k, i)
        uint pos = offs[digit(k, p)]++;
        MOVE(e, k, i, pos)
        if (next >= 0) nc[(pos >> s) * NB + digit(k, next)]++;
    }
}

// scatter with its flags as constants (so that each combination is compiled on its own)
#define SCATTER(first, last, next_, nc_) \
    if (keyed) scatter(sv, si, dv, di, dl, lo, hi, offs, p, flip, first, last, 1, next_, s, nc_); \
    else scatter(sv, si, dv, di, dl, lo, hi, offs, p, flip, first, last, 0, next_, s, nc_);

// Stable insertion sort of a short row (n <= SMALL) in private memory.
inline void insertion_row(__global const U *src, __global U *ov, __global long *oi, long n,
                          U flip)
{
    U kk[SMALL], vv[SMALL];
    uint ii[SMALL];
    for (int i = 0; i < (int)n; i++) {
        U b = src[i], k = key_of(b, flip);
        int j = i;
        while (j > 0 && kk[j - 1] > k) {
            kk[j] = kk[j - 1]; vv[j] = vv[j - 1]; ii[j] = ii[j - 1];
            j--;
        }
        kk[j] = k; vv[j] = b; ii[j] = (uint)i;
    }
    for (int i = 0; i < (int)n; i++) {
#if VALS
        ov[i] = vv[i];
#endif
#if IDX
        oi[i] = ii[i];
#endif
    }
}

// The row as it is (every key the same): elements lo..hi-1.
inline void copy_row(__global const U *src, __global U *ov, __global long *oi, long lo, long hi)
{
    for (long i = lo; i < hi; i++) {
#if VALS
        ov[i] = src[i];
#endif
#if IDX
        oi[i] = i;
#endif
    }
}

// -- one work-item a row ------------------------------------------------------------------------
// x: rows of n (from x_off); ov, oi: the sorted rows (values, int64 positions); sv0/sv1, si0/si1:
// scratch of rows * n for passes between the first and the last.
__kernel void rsort_rows(__global const U *x, const long x_off, __global U *ov,
                         __global long *oi, __global U *sv0, __global U *sv1,
                         __global uint *si0, __global uint *si1, const long n,
                         const long rows, const U flip, __global const uchar *todo,
                         const int only_todo)
{
    long row = get_global_id(0);
    if (row >= rows || (only_todo && !todo[row])) return;
    long base = row * n;
    __global const U *src = x + x_off + base;
    if (n <= SMALL) {
        insertion_row(src, ov + base, oi + base, n, flip);
        return;
    }
    uint cnt[PASSES * NB], cnt2[PASSES * NB];
    for (int t = 0; t < PASSES * NB; t++) { cnt[t] = 0; cnt2[t] = 0; }
    int keyed = count_digits(src, 0, n, flip, cnt, cnt2) == 0;
    U k0 = key_of(src[0], flip);
    int act[PASSES], m = 0;
    for (int p = 0; p < PASSES; p++)
        if (cnt[p * NB + digit(k0, p)] != (uint)n) act[m++] = p;
    if (m == 0) {
        copy_row(src, ov + base, oi + base, 0, n);
        return;
    }
    __global U *svs[2] = {sv0 + base, sv1 + base};
    __global uint *sis[2] = {si0 + base, si1 + base};
    for (int a = 0; a < m; a++) {
        int p = act[a];
        uint offs[NB], run = 0;
        for (int d = 0; d < NB; d++) { offs[d] = run; run += cnt[p * NB + d]; }
        int last = a == m - 1;
        __global const U *sv = a == 0 ? src : svs[(m - a) & 1];
        __global const uint *si = sis[(m - a) & 1];
        __global U *dv = last ? ov + base : svs[(m - 1 - a) & 1];
        __global uint *di = sis[(m - 1 - a) & 1];
        __global long *dl = oi + base;
        long lo = 0, hi = n;
        int s = 0;
        if (a == 0 && last) { SCATTER(1, 1, -1, 0) }
        else if (a == 0) { SCATTER(1, 0, -1, 0) }
        else if (last) { SCATTER(0, 1, -1, 0) }
        else { SCATTER(0, 0, -1, 0) }
    }
}

// -- chunks of long rows: C chunks of 2^s elements (the last one shorter) --------------------
// hist[row][c]: the digit counts of chunk c of the input row, [p][NB] for every pass, then how
// many of its keys are NaN or -0.0.
#define HSTRIDE (PASSES * NB + 1)
__kernel void rsort_hist(__global const U *x, const long x_off, __global uint *hist,
                         const long n, const int s, const long C, const long total,
                         const U flip)
{
    long g = get_global_id(0);
    if (g >= total) return;
    long row = g / C, c = g % C;
    long lo = c << s, hi = min(n, (c + 1) << s);
    uint cnt[PASSES * NB], cnt2[PASSES * NB];
    for (int t = 0; t < PASSES * NB; t++) { cnt[t] = 0; cnt2[t] = 0; }
    uint sp = count_digits(x + x_off + row * n, lo, hi, flip, cnt, cnt2);
    __global uint *h = hist + g * HSTRIDE;
    for (int t = 0; t < PASSES * NB; t++) h[t] = cnt[t];
    h[PASSES * NB] = sp;
}

// One pass (digit p) of chunk c of a row. The chunk's digit counts come from rsort_hist (the
// row's first pass) or, later, from the previous pass's writers: part[a & 1][row][w][c][NB]
// counts what writer w put into chunk c, by the digit of the next pass.
__kernel void rsort_pass(__global const U *x, const long x_off, __global U *ov,
                         __global long *oi, __global U *sv0, __global U *sv1,
                         __global uint *si0, __global uint *si1,
                         __global const uint *hist, __global uint *part, const long n,
                         const int s, const long C, const long total, const U flip,
                         const int p)
{
    long g = get_global_id(0);
    if (g >= total) return;
    long rows = total / C, row = g / C, c = g % C;
    long base = row * n;
    long lo = c << s, hi = min(n, (c + 1) << s);
    __global const U *src = x + x_off + base;
    __global const uint *hrow = hist + row * C * HSTRIDE;
    // the passes that move something: a digit that is not the same in every key of the row
    U k0 = key_of(src[0], flip);
    int act[PASSES], m = 0, a = -1;
    uint sp = 0;
    for (long cc = 0; cc < C; cc++) sp += hrow[cc * HSTRIDE + PASSES * NB];
    int keyed = sp == 0;
    for (int q = 0; q < PASSES; q++) {
        uint d0 = digit(k0, q), same = 0;
        for (long cc = 0; cc < C; cc++) same += hrow[cc * HSTRIDE + q * NB + d0];
        if (same != (uint)n) {
            if (q == p) a = m;
            act[m++] = q;
        }
    }
    if (m == 0 && p == PASSES - 1) copy_row(src, ov + base, oi + base, lo, hi);
    if (a < 0) return;
    // this chunk's first slot for each digit: all smaller digits of the row, then this digit
    // in the chunks before
    uint offs[NB];
    for (int d = 0; d < NB; d++) offs[d] = 0;
    for (long cc = 0; cc < C; cc++)
        for (int d = 0; d < NB; d++) offs[d] += hrow[cc * HSTRIDE + p * NB + d];
    uint run = 0;
    for (int d = 0; d < NB; d++) { uint t = offs[d]; offs[d] = run; run += t; }
    __global const uint *prev = part + (((a - 1) & 1) * rows + row) * C * C * NB;
    for (long cc = 0; cc < c; cc++) {
        if (a == 0) {
            for (int d = 0; d < NB; d++) offs[d] += hrow[cc * HSTRIDE + p * NB + d];
        } else {
            for (long w = 0; w < C; w++)
                for (int d = 0; d < NB; d++) offs[d] += prev[(w * C + cc) * NB + d];
        }
    }
    int last = a == m - 1, next = last ? -1 : act[a + 1];
    __global const U *sv = a == 0 ? src : (((m - a) & 1) ? sv1 : sv0) + base;
    __global const uint *si = (((m - a) & 1) ? si1 : si0) + base;
    __global U *dv = last ? ov + base : (((m - 1 - a) & 1) ? sv1 : sv0) + base;
    __global uint *di = (((m - 1 - a) & 1) ? si1 : si0) + base;
    __global long *dl = oi + base;
    if (last) {
        uint none[1];
        if (a == 0) { SCATTER(1, 1, -1, none) }
        else { SCATTER(0, 1, -1, none) }
        return;
    }
    uint nc[CMAX * NB];
    for (long t = 0; t < C * NB; t++) nc[t] = 0;
    if (a == 0) { SCATTER(1, 0, next, nc) }
    else { SCATTER(0, 0, next, nc) }
    __global uint *mine = part + ((a & 1) * rows + row) * C * C * NB + c * C * NB;
    for (long t = 0; t < C * NB; t++) mine[t] = nc[t];
}

// -- runs of a sorted row ----------------------------------------------------------------------
// flags[i]: whether x[i] starts a run of equal values (x sorted; every NaN is a run of its own,
// -0.0 and 0.0 are one value).
__kernel void run_starts(__global const U *x, const long x_off, __global uchar *flags,
                         const long n)
{
    long g = get_global_id(0);
    if (g >= n) return;
    if (g == 0) { flags[0] = 1; return; }
    U a = x[x_off + g - 1], b = x[x_off + g];
#if KIND == 2
    int same = (a == b && (b & (U)~SIGN) <= (U)INF) || ((a | b) & (U)~SIGN) == 0;
#else
    int same = a == b;
#endif
    flags[g] = !same;
}

// -- short rows of plain keys, many at once: a bitonic network -----------------------------------
// Rows of no NaN and no -0.0 (where only the values are asked for, the order of equal keys
// cannot show), each padded to P (a power of two) with the largest key. A row with a NaN or a
// -0.0 is marked in todo for rsort_rows. Two forms of one network:
// - bsort_rows_lanes (Intel's runtime, which vectorizes across work-items): a work-item a row,
//   the rows of a work-group interleaved in scratch (t[j * W + lane]), so that the runtime's
//   vectors load and store whole rows of lanes;
// - bsort_rows8 (PoCL, which did not vectorize that form): a work-item sorts 8 rows at once as
//   explicit vectors of 8 (t[j] holds key j of the 8 rows).
__kernel void bsort_rows_lanes(__global const U *x, const long x_off, __global U *ov,
                               __global U *scratch, __global uchar *todo, const long n,
                               const long P, const int lp, const long rows, const U flip)
{
    long row = get_global_id(0);
    long W = get_local_size(0), lane = get_local_id(0);
    long rr = row < rows ? row : rows - 1;
    __global const U *src = x + x_off + rr * n;
    __global U *t = scratch + get_group_id(0) * W * P + lane;
    int sp = 0;
    for (long j = 0; j < P; j++) {
        U b = src[min(j, n - 1)];
        sp |= special(b);
        t[j * W] = j < n ? key_of(b, flip) : (U)~(U)0;
    }
    for (int lk = 1; lk <= lp; lk++) {
        for (int lj = lk - 1; lj >= 0; lj--) {
            long j = 1L << lj;
            for (long q = 0; q < P / 2; q++) {
                long i = ((q >> lj) << (lj + 1)) | (q & (j - 1));
                long l = i + j;
                U a = t[i * W], b = t[l * W];
                U lo = min(a, b), hi = max(a, b);
                int up = ((i >> lk) & 1) == 0;
                t[i * W] = up ? lo : hi;
                t[l * W] = up ? hi : lo;
            }
        }
    }
    if (row < rows) {
        todo[row] = sp;
        for (long j = 0; j < n; j++) ov[row * n + j] = value_of(t[j * W], flip);
    }
}

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define U8 CAT(U, 8)

__kernel void bsort_rows8(__global const U *x, const long x_off, __global U *ov,
                         __global U *scratch, __global uchar *todo, const long n, const long P,
                         const int lp, const long rows, const U flip)
{
    long g = get_global_id(0);
    long r0 = g * 8;
    if (r0 >= rows) return;
    __global U *t = scratch + g * P * 8;
    long off[8];
    int sp[8];
    for (int lane = 0; lane < 8; lane++) {
        off[lane] = x_off + min(r0 + lane, rows - 1) * n;
        sp[lane] = 0;
    }
    for (long j = 0; j < n; j++) {
        for (int lane = 0; lane < 8; lane++) {
            U b = x[off[lane] + j];
            sp[lane] |= special(b);
            t[j * 8 + lane] = key_of(b, flip);
        }
    }
    for (long j = n * 8; j < P * 8; j++) t[j] = (U)~(U)0;
    for (int lane = 0; lane < 8 && r0 + lane < rows; lane++) todo[r0 + lane] = sp[lane];
    for (int lk = 1; lk <= lp; lk++) {
        for (int lj = lk - 1; lj >= 0; lj--) {
            long j = 1L << lj;
            for (long q = 0; q < P / 2; q++) {
                long i = ((q >> lj) << (lj + 1)) | (q & (j - 1));
                long l = i + j;
                U8 a = vload8(i, t), b = vload8(l, t);
                U8 lo = min(a, b), hi = max(a, b);
                int up = ((i >> lk) & 1) == 0;
                vstore8(up ? lo : hi, i, t);
                vstore8(up ? hi : lo, l, t);
            }
        }
    }
    int m = min(8L, rows - r0);
    for (long j = 0; j < n; j++)
        for (int lane = 0; lane < m; lane++)
            ov[(r0 + lane) * n + j] = value_of(t[j * 8 + lane], flip);
}

// -- distinct values of a row by hashing (unique_values, unique_counts) ------------------------
// distinct_chunks: a work-item counts the distinct values of its chunk of x[0:n) in a hash table
// of DCAP slots of its own (tab, cnt: from g * DCAP; a count of 0 is an empty slot), equal as
// run_starts compares them (-0.0 and 0.0 one value: the chunk's first one kept), then packs them
// to the start of its slots in slot order. found[g]: how many, or -1 where a NaN (every NaN a
// value of its own) or more than DCAP / 2 of them (the table half full) stopped it.
// distinct_merge (one work-item): the chunks' values, in chunk order, into one table of 2^lg
// slots (mt, mc), packed to its start; info[0]: how many distinct values, or -1 where a chunk
// gave up (the caller sorts the input instead then).
#define DCAP 4096
#define DLOG 12
inline ulong dslot(U b, int lg)
{
    ulong z = (ulong)key_of(b, (U)0) * 0x9E3779B97F4A7C15ul;
    return z >> (64 - lg);
}

inline int dsame(U a, U b)
{
#if KIND == 2
    return a == b || ((a | b) & (U)~SIGN) == 0;
#else
    return a == b;
#endif
}

__kernel void distinct_chunks(__global const U *x, const long x_off, const long n,
                              const long chunk, __global U *tab, __global uint *cnt,
                              __global long *found)
{
    long g = get_global_id(0);
    long lo = g * chunk, hi = min(n, lo + chunk);
    __global U *t = tab + g * DCAP;
    __global uint *c = cnt + g * DCAP;
    for (int s = 0; s < DCAP; s++) c[s] = 0;
    long m = 0;
    for (long i = lo; i < hi; i++) {
        U b = x[x_off + i];
#if KIND == 2
        if ((b & (U)~SIGN) > (U)INF) { found[g] = -1; return; }
#endif
        uint s = (uint)dslot(b, DLOG);
        while (c[s] != 0 && !dsame(t[s], b)) s = (s + 1) & (DCAP - 1);
        if (c[s] == 0) {
            if (++m > DCAP / 2) { found[g] = -1; return; }
            t[s] = b;
        }
        c[s]++;
    }
    long k = 0;
    for (int s = 0; s < DCAP; s++) {
        if (c[s] == 0) continue;
        t[k] = t[s];
        c[k] = c[s];
        k++;
    }
    found[g] = m;
}

__kernel void distinct_merge(__global const U *tab, __global const uint *cnt,
                             __global const long *found, const long chunks, const int lg,
                             __global U *mt, __global long *mc, __global long *info)
{
    if (get_global_id(0) != 0) return;
    long size = 1L << lg, d = 0;
    for (long s = 0; s < size; s++) mc[s] = 0;
    for (long g = 0; g < chunks; g++) {
        if (found[g] < 0) { info[0] = -1; return; }
        for (long k = 0; k < found[g]; k++) {
            U b = tab[g * DCAP + k];
            ulong s = dslot(b, lg);
            while (mc[s] != 0 && !dsame(mt[s], b)) s = (s + 1) & (size - 1);
            if (mc[s] == 0) { mt[s] = b; d++; }
            mc[s] += cnt[g * DCAP + k];
        }
    }
    long k = 0;
    for (long s = 0; s < size; s++) {
        if (mc[s] == 0) continue;
        mt[k] = mt[s];
        mc[k] = mc[s];
        k++;
    }
    info[0] = d;
}
