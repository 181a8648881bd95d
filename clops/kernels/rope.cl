// Rotary position pairs, for the kernels that rotate q and k (attention.cl, paged.cl,
// layer.cl): the includer defines ROPE_NEOX (1: element i pairs with i + ROT_DIM / 2, the
// halves of the rotated dimensions; 0: with i + 1, adjacent elements) and ROT_DIM (the rotated
// dimensions).
//   pair_index(i)  the two elements of rotation pair i (i < ROT_DIM / 2)
//   pair_of(t)     the rotation pair that element t belongs to (t < ROT_DIM)
//   turn(...)      element t turned by an angle, given its pair's two values
inline int pair_of(int t) {
#if ROPE_NEOX
    return t % (ROT_DIM / 2);
#else
    return t / 2;
#endif
}

// Element t (of pair i, whose first element is `first`) turned by pos * inv_freq[i], its pair's
// values a and b.
inline float turn(float a, float b, int t, int first, int i, int pos,
                  __global const float *inv_freq) {
    float c, s = sincos((float)pos * inv_freq[i], &c);
    return t == first ? a * c - b * s : a * s + b * c;
}

inline int2 pair_index(int i) {
#if ROPE_NEOX
    return (int2)(i, i + ROT_DIM / 2);
#else
    return (int2)(2 * i, 2 * i + 1);
#endif
}
