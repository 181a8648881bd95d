// Sorting, the order-preserving keys of both radix sorts (sort_cpu.cl on CPU devices,
// sort_gpu.cl on GPUs): an element's bits, with the sign flipped (signed ints), or for floats the
// magnitude's bits added to the sign bit, subtracted for negatives (so -0.0 is 0.0 and the two
// keep their order, and low bytes that are zero in every element stay zero), every NaN the
// largest key (NaNs keep their order). Descending complements the key (flip all ones): still
// stable, NaN first. Needs -DU=<the element's bits as an unsigned type> -DBITS=<its bits>
// -DKIND=<0 unsigned, 1 signed, 2 float> -DINF=<bits of +inf> (floats).

#define SIGN ((U)((U)1 << (BITS - 1)))

inline U key_of(U b, U flip)
{
#if KIND == 1
    b ^= SIGN;
#elif KIND == 2
    U mag = b & (U)~SIGN;
    b = (b & SIGN) ? (U)(SIGN - mag) : (U)(SIGN + mag);  // -0.0 and 0.0: SIGN
    b = mag > (U)INF ? (U)~(U)0 : b;  // NaN: past +inf
#endif
    return b ^ flip;
}
