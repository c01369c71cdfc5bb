/* A float64 chunk's scores and weighted values from a float64 cache in four lanes (AT_EXP4: a float64 build where
   the CPU has AVX2 and FMA): attention_kernel.c's dot4 and value_block, each lane running their operations in their
   order as gcc compiles them, so the same bits, at four lanes an instruction where gcc's code took one or two (they
   were the float64 exactness runs' largest kernel cost). Included by attention_kernel.c after attention_parts.h. */
#ifndef TOKENSWIFT_ATTENTION_F64_H
#define TOKENSWIFT_ATTENTION_F64_H

/* dot4 where d % 4 == 0: the four keys' sums side by side in one vector, each lane multiplying and then adding,
   element by element (gcc does not fuse dot4's), four elements of each key loaded and turned into four vectors of one
   element of each key. */
static void dot4_pd(const double *a, const char *const *b, int64_t d, double scale, double *out) {
    const double *k0 = (const double *)b[0], *k1 = (const double *)b[1], *k2 = (const double *)b[2],
                 *k3 = (const double *)b[3];
    __m256d sum = _mm256_setzero_pd();
    for (int64_t i = 0; i < d; i += 4) {
        const __m256d r0 = _mm256_loadu_pd(k0 + i), r1 = _mm256_loadu_pd(k1 + i), r2 = _mm256_loadu_pd(k2 + i),
                      r3 = _mm256_loadu_pd(k3 + i);
        const __m256d even01 = _mm256_unpacklo_pd(r0, r1), odd01 = _mm256_unpackhi_pd(r0, r1);
        const __m256d even23 = _mm256_unpacklo_pd(r2, r3), odd23 = _mm256_unpackhi_pd(r2, r3);
        const __m256d column[4] = {_mm256_permute2f128_pd(even01, even23, 0x20),
                                   _mm256_permute2f128_pd(odd01, odd23, 0x20),
                                   _mm256_permute2f128_pd(even01, even23, 0x31),
                                   _mm256_permute2f128_pd(odd01, odd23, 0x31)};
        for (int u = 0; u < 4; ++u) {
            __m256d product = _mm256_mul_pd(_mm256_set1_pd(a[i + u]), column[u]);
            __asm__("" : "+x"(product));  /* kept apart: gcc would fuse it into the add (-ffp-contract=fast) */
            sum = _mm256_add_pd(sum, product);
        }
    }
    _mm256_storeu_pd(out, _mm256_mul_pd(_mm256_set1_pd(scale), sum));
}

/* value_block's eight sums (i0 + 8 <= d) in two vectors, each lane value_block's fused multiply-add (gcc contracts
   its `acc += p * value` into one) in slot order. */
static inline void value_block_pd(const double *p, const char *v, const int64_t *slots, int64_t s0, int64_t n,
                                  int64_t i0, int64_t slot_bytes, double *out) {
    __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
    for (int64_t j = 0; j < n; ++j) {
        if (p[j] == 0.0) continue;
        const double *value = (const double *)(v + SLOT(slots, s0, j) * slot_bytes) + i0;
        const __m256d w = _mm256_set1_pd(p[j]);
        low = _mm256_fmadd_pd(w, _mm256_loadu_pd(value), low);
        high = _mm256_fmadd_pd(w, _mm256_loadu_pd(value + 4), high);
    }
    _mm256_storeu_pd(out + i0, low);
    _mm256_storeu_pd(out + i0 + 4, high);
}
#endif
