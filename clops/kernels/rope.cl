// Rotary position pairs, for the kernels that rotate q and k (attention.cl, paged.cl): the
// includer defines ROPE_NEOX (1: element i pairs with i + ROT_DIM / 2, the halves of the
// rotated dimensions; 0: with i + 1, adjacent elements) and ROT_DIM (the rotated dimensions).
//   pair_index(i)  the two elements of rotation pair i (i < ROT_DIM / 2)
inline int2 pair_index(int i) {
#if ROPE_NEOX
    return (int2)(i, i + ROT_DIM / 2);
#else
    return (int2)(2 * i, 2 * i + 1);
#endif
}
