// Array kernels, sorting on GPUs: a stable LSD radix sort of order-preserving keys (the keys of
// sort_cpu.cl: NaN last, -0.0 and 0.0 one key that keeps their order, descending as complemented
// keys), work-groups of WG work-items on tiles of TILE = WG * ITEMS keys in local memory.
// - rs_rows: a work-group sorts a whole row of at most TILE keys in local memory (every pass in
//   one launch): many short rows, or a short 1-d array.
// - longer rows, a pass of 8 bits in three launches: rs_count (each tile's digit counts),
//   rs_scan (each digit's counts over the tiles of a row, exclusive, and the digit's total),
//   rs_scatter (each tile sorted by the digit in local memory, then written to its digit's base
//   + the tile's offset + its rank in the tile). A pass whose digit is the same in every key of
//   a row moves nothing (decided in rs_scatter from the totals, on the device); where the data
//   of a row lies before each pass (the input, or scratch A or B) is kept in st, so that the
//   launches are the same whatever the data (clops.jit replays them).
// In local memory a tile is sorted by stable splits of 4 bits each (two a pass): every work-item
// counts the nibbles of its ITEMS consecutive keys into its column of h[16][WG], one exclusive
// scan of h in digit-major order gives every key its slot. Elements move as their bits (keys are
// recomputed), indices (IDX) as uint; padding past a row's end sorts last by its position.
// Build options: -DU=<uchar|ushort|uint|ulong> -DBITS=<its bits> -DKIND=<0 unsigned, 1 signed,
// 2 float> -DINF=<bits of +inf> (floats) -DVALS=<0|1> (write the sorted values) -DIDX=<0|1> (write
// the permutation, int64) -DWG=<work-items> -DITEMS=<keys a work-item> -DPASSES=<BITS / 8>.

#include "clops/sortkey.cl"  // SIGN, key_of

#define TILE (WG * ITEMS)
#define NIB 16
#define NB 256

// Exclusive prefix sum over the work-group of v (every work-item calls it); *total: the sum.
inline uint scan_wg(__local uint *sc, int lid, uint v, uint *total)
{
    sc[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int off = 1; off < WG; off <<= 1) {
        uint t = lid >= off ? sc[lid - off] : 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        sc[lid] += t;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    uint r = sc[lid] - v;
    *total = sc[WG - 1];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// Stable split of the tile (lk, li) by the nibble of the keys at bit sh: keys of a smaller nibble
// first, equal nibbles in their order. Positions m.. (padding) take the largest nibble, so they
// stay last. A nibble the same in the whole tile moves nothing (skipped).
// PERF: h and the tile are read at strides of 16 and ITEMS (bank conflicts on GPUs); untimed.
inline void split(__local U *lk, __local uint *li, __local ushort *h, __local uint *sc, int sh,
                  U flip, int m, int lid)
{
    U v[ITEMS];
    uint dg[ITEMS];
#if IDX
    uint ix[ITEMS];
#endif
    for (int d = 0; d < NIB; d++) h[d * WG + lid] = 0;
    for (int k = 0; k < ITEMS; k++) {
        int i = lid * ITEMS + k;
        v[k] = lk[i];
#if IDX
        ix[k] = li[i];
#endif
        dg[k] = i < m ? (uint)(key_of(v[k], flip) >> sh) & (NIB - 1) : NIB - 1;
        h[dg[k] * WG + lid]++;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // exclusive scan of h in place: a work-item sums NIB consecutive entries
    uint s[NIB], sum = 0;
    for (int j = 0; j < NIB; j++) { s[j] = sum; sum += h[lid * NIB + j]; }
    uint total;
    uint base = scan_wg(sc, lid, sum, &total);
    for (int j = 0; j < NIB; j++) h[lid * NIB + j] = (ushort)(base + s[j]);
    barrier(CLK_LOCAL_MEM_FENCE);
    int same = 0;
    for (int d = 0; d < NIB; d++) {
        uint c = (d + 1 < NIB ? (uint)h[(d + 1) * WG] : (uint)TILE) - h[d * WG];
        same |= d + 1 < NIB ? c == (uint)m : c == (uint)TILE;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (same) return;  // the same in every work-item
    for (int k = 0; k < ITEMS; k++) {
        uint p = h[dg[k] * WG + lid]++;
        lk[p] = v[k];
#if IDX
        li[p] = ix[k];
#endif
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

// -- a work-group a row (n <= TILE) ---------------------------------------------------------------
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void rs_rows(__global const U *x, const long x_off, __global U *ov, __global long *oi,
             const long n, const U flip)
{
    __local U lk[TILE];
#if IDX
    __local uint li[TILE];
#else
    __local uint li[1];
#endif
    __local ushort h[NIB * WG];
    __local uint sc[WG];
    int lid = get_local_id(0);
    long row = get_group_id(0);
    __global const U *src = x + x_off + row * n;
    for (int i = lid; i < TILE; i += WG) {
        lk[i] = i < n ? src[i] : (U)0;
#if IDX
        li[i] = i;
#endif
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int sh = 0; sh < BITS; sh += 4) split(lk, li, h, sc, sh, flip, (int)n, lid);
    for (int i = lid; i < n; i += WG) {
#if VALS
        ov[row * n + i] = lk[i];
#endif
#if IDX
        oi[row * n + i] = li[i];
#endif
    }
}

// -- rows of several tiles: T tiles a row, a pass in three launches ------------------------------
// st[row][p]: where the row's data lies before pass p (0: x, 1: A, 2: B; pass 0 reads x).
// cnt[row][d][t]: tile t's count of digit d (rs_count), then its exclusive offset among the
// tiles of the row (rs_scan); tot[row][d]: the row's count of digit d.
inline __global const U *source(__global const U *x, long x_off, __global const U *A,
                                __global const U *B, uint where, long row, long n)
{
    return where == 0 ? x + x_off + row * n : (where == 1 ? A : B) + row * n;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void rs_count(__global const U *x, const long x_off, __global const U *A, __global const U *B,
              __global const uint *st, __global uint *cnt, const long n, const long T,
              const int p, const U flip)
{
    __local uint hist[NB];
    int lid = get_local_id(0);
    long g = get_group_id(0), row = g / T, t = g % T;
    for (int d = lid; d < NB; d += WG) hist[d] = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    __global const U *src = source(x, x_off, A, B, p ? st[row * (PASSES + 1) + p] : 0, row, n);
    long lo = t * TILE + (long)lid * ITEMS, hi = min(n, lo + ITEMS);
    // a run of one digit is counted once (sorted input, or a digit the same in every key, would
    // otherwise send every key's increment to one counter)
    uint run = 0, cur = 0;
    for (long i = lo; i < hi; i++) {
        uint d = (uint)(key_of(src[i], flip) >> (8 * p)) & (NB - 1);
        if (run && d != cur) { atomic_add(&hist[cur], run); run = 0; }
        cur = d;
        run++;
    }
    if (run) atomic_add(&hist[cur], run);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int d = lid; d < NB; d += WG) cnt[(row * NB + d) * T + t] = hist[d];
}

// A work-group a (row, digit): the digit's counts over the row's tiles, scanned in place.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void rs_scan(__global uint *cnt, __global uint *tot, const long T)
{
    __local uint sc[WG];
    int lid = get_local_id(0);
    long g = get_group_id(0);
    __global uint *c = cnt + g * T;
    uint carry = 0;
    for (long t0 = 0; t0 < T; t0 += WG) {
        uint v = t0 + lid < T ? c[t0 + lid] : 0, total;
        uint e = scan_wg(sc, lid, v, &total);
        if (t0 + lid < T) c[t0 + lid] = carry + e;
        carry += total;
    }
    if (lid == 0) tot[g] = carry;
}

// Pass p over tile t of a row: from st's buffer to the other scratch buffer (A or B), or in the
// last pass to the outputs (ov, oi).
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void rs_scatter(__global const U *x, const long x_off, __global U *A, __global U *B,
                __global uint *iA, __global uint *iB, __global U *ov, __global long *oi,
                __global uint *st, __global const uint *cnt, __global const uint *tot,
                const long n, const long T, const int p, const U flip)
{
    __local U lk[TILE];
#if IDX
    __local uint li[TILE];
#else
    __local uint li[1];
#endif
    __local ushort h[NIB * WG];
    __local uint sc[WG];
    __local uint gb[NB], ls[NB];
    int lid = get_local_id(0);
    long g = get_group_id(0), row = g / T, t = g % T;
    int last = p == PASSES - 1;
    uint where = p ? st[row * (PASSES + 1) + p] : 0;
    // the digits' bases in the row; a digit that holds every key: nothing moves this pass
    __global const uint *tr = tot + row * NB;
    int full = 0;
    for (int d0 = 0; d0 < NB; d0 += WG) {
        int d = d0 + lid;
        uint v = d < NB ? tr[d] : 0, total;
        full |= v == (uint)n;
        uint e = scan_wg(sc, lid, v, &total);
        if (d < NB) gb[d] = e + (d0 ? gb[d0 - 1] + tr[d0 - 1] : 0);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    uint nfull;
    scan_wg(sc, lid, full, &nfull);
    uint to = where == 1 ? 2 : 1;
    if (nfull && !last) {
        if (t == 0 && lid == 0) st[row * (PASSES + 1) + p + 1] = where;
        return;
    }
    if (t == 0 && lid == 0 && !last) st[row * (PASSES + 1) + p + 1] = to;
    __global const U *src = source(x, x_off, A, B, where, row, n);
    __global const uint *isrc = (where == 1 ? iA : iB) + row * n;
    long lo = t * TILE;
    int m = (int)min((long)TILE, n - lo);
    if (nfull) {  // the last pass moves nothing: the row as it lies, to the outputs
        for (int i = lid; i < m; i += WG) {
#if VALS
            ov[row * n + lo + i] = src[lo + i];
#endif
#if IDX
            oi[row * n + lo + i] = where ? isrc[lo + i] : lo + i;
#endif
        }
        return;
    }
    for (int i = lid; i < TILE; i += WG) {
        lk[i] = i < m ? src[lo + i] : (U)0;
#if IDX
        li[i] = i < m ? (where ? isrc[lo + i] : (uint)(lo + i)) : 0;
#endif
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    split(lk, li, h, sc, 8 * p, flip, m, lid);
    split(lk, li, h, sc, 8 * p + 4, flip, m, lid);
    // where each digit's run starts in the sorted tile
    for (int j = lid; j < m; j += WG) {
        uint d = (uint)(key_of(lk[j], flip) >> (8 * p)) & (NB - 1);
        if (j == 0 || d != ((uint)(key_of(lk[j - 1], flip) >> (8 * p)) & (NB - 1))) ls[d] = j;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    __global const uint *ct = cnt + row * NB * T + t;
    __global U *dv = (to == 1 ? A : B) + row * n;
    __global uint *di = (to == 1 ? iA : iB) + row * n;
    for (int j = lid; j < m; j += WG) {
        U e = lk[j];
        uint d = (uint)(key_of(e, flip) >> (8 * p)) & (NB - 1);
        long pos = gb[d] + ct[d * T] + (j - ls[d]);
        if (last) {
#if VALS
            ov[row * n + pos] = e;
#endif
#if IDX
            oi[row * n + pos] = li[j];
#endif
        } else {
            dv[pos] = e;
#if IDX
            di[pos] = li[j];
#endif
        }
    }
}
