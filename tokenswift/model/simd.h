/* What the kernels' AVX2 paths share (layer_kernels.c). */
#ifndef TOKENSWIFT_SIMD_H
#define TOKENSWIFT_SIMD_H
#include <immintrin.h>

/* The sum of a vector's eight lanes, in one fixed order (a row's product must round the same in every call). */
static inline float hsum(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}
#endif
