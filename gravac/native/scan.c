/* gravac's one native kernel: the ascending indices of the entries that pass a
 * magnitude threshold, in one read of the tensor (gravac/native/__init__.py builds and
 * loads it; gravac/compressors/blockscan.py calls it).
 *
 * NumPy needs three passes for the same answer (|x| written out, a bool mask written out,
 * flatnonzero reading it back); here 64 entries at a time are compared in SIMD registers
 * into a bit mask and only its set bits are visited. 64, not 16: the loop over the set
 * bits mispredicts its exit about once per mask, and at CF 10-40 that was most of the
 * cost (2.56M entries at CF 10: 2.3 ms with masks of 16, 1.1 with masks of 64).
 * Semantics are NumPy's exactly:
 *   threshold > 0:  |x| >= t  (NaN fails: an ordered comparison)
 *   zero_test:      x != 0    (NaN passes: an unordered comparison; -0 fails)
 * `out` must hold n entries (the worst case); the count is returned.
 *
 * One body serves float and double (GRAVAC_SCAN below, instantiated twice): only the
 * element type, the SIMD width and the intrinsics' suffix differ.
 */
#include <math.h>
#include <stdint.h>

#if defined(__SSE2__)
#include <emmintrin.h>

static inline int64_t emit(uint64_t bits, int64_t base, int64_t *out, int64_t c) {
    while (bits) {
        out[c++] = base + __builtin_ctzll(bits);
        bits &= bits - 1;
    }
    return c;
}

/* NAME(x, n, t, zero_test, out) for element type T in SSE2 vectors VT of LANES entries;
 * SFX is the intrinsics' suffix (ps: 4 floats, pd: 2 doubles), ABS the scalar |.|. */
#define GRAVAC_SCAN(NAME, T, VT, LANES, SFX, ABS)                                          \
int64_t NAME(const T *x, int64_t n, T t, int zero_test, int64_t *out) {                   \
    const VT sign = _mm_set1_##SFX((T)-0.0), tv = _mm_set1_##SFX(t),                      \
             zero = _mm_setzero_##SFX();                                                  \
    int64_t c = 0, i = 0;                                                                 \
    for (; i + 64 <= n; i += 64) {                                                        \
        uint64_t bits = 0;                                                                \
        for (int j = 0; j < 64; j += LANES) {                                             \
            VT v = _mm_loadu_##SFX(x + i + j);                                            \
            VT m = zero_test ? _mm_cmpneq_##SFX(v, zero)                                  \
                             : _mm_cmpge_##SFX(_mm_andnot_##SFX(sign, v), tv);            \
            bits |= (uint64_t)_mm_movemask_##SFX(m) << j;                                 \
        }                                                                                 \
        c = emit(bits, i, out, c);                                                        \
    }                                                                                     \
    for (; i < n; i++)                                                                    \
        if (zero_test ? x[i] != (T)0 : ABS(x[i]) >= t) out[c++] = i;                      \
    return c;                                                                             \
}

#else  /* no SSE2 (not x86-64): the same loop, one entry at a time, without branches */

#define GRAVAC_SCAN(NAME, T, VT, LANES, SFX, ABS)                                          \
int64_t NAME(const T *x, int64_t n, T t, int zero_test, int64_t *out) {                   \
    int64_t c = 0;                                                                        \
    for (int64_t i = 0; i < n; i++) {                                                     \
        out[c] = i;                                                                       \
        c += zero_test ? (x[i] != (T)0) : (ABS(x[i]) >= t);                               \
    }                                                                                     \
    return c;                                                                             \
}

#endif

GRAVAC_SCAN(gravac_scan_f32, float, __m128, 4, ps, fabsf)
GRAVAC_SCAN(gravac_scan_f64, double, __m128d, 2, pd, fabs)
