/* A chunk's attention over a q8 cache (kv_q8.h): attention_kernel.c's chunk_task where the rows are q8.

   A plain step at a 7K context reads its keys and values from memory, 177 MB in bf16; q8 rows are 68 bytes instead
   of 128, and their products are 8-bit integer dot products (vpdpbusd where the CPU has AVX-512 VNNI, four
   multiply-adds a lane where vdpbf16ps does two; vpmaddubsw and vpmaddwd on AVX2, where bf16 has no product and
   each bf16 element is widened to float32 first). The arithmetic, the same in every build (integer sums are exact in
   any order; the float steps run in the same order in the portable and the vector loops):
   - a query row is quantized as a cache row is (its integers qi and scale sq), and a key's score is
     (float)(sum_i qi[i] * k[i]) * (sq * scale) * sk, k the key's signed integers and sk its scale;
   - p = exp(score - max) by q8_exp: 2^n * P(f), n = round(x / ln 2), P the degree-6 Taylor polynomial of 2^f on
     [-1/2, 1/2] (within an ulp or two: the 8-bit weights it feeds round far more), ten vector operations where the
     float32 Cephes exp of attention_parts.h takes twenty; the numerators summed in eight lanes, as the vector loops do;
   - the values are summed with 8-bit weights: w = p * sv (the value's scale), top = max w over the chunk,
     u = nearbyint(w * (255 / top)), and out[i] = (float)(sum_j u[j] * v[j][i]) * (top / 255). A slot whose weight
     is under 1/510 of the chunk's largest adds nothing; the sum that divides at the end is of the float numerators.
   So a row's result depends on its query and the rows it sees, in order, as attention_kernel.c requires. */
#include <stdint.h>
#ifndef TS_DOUBLE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "real.h"
#ifdef TS_AVX2
#include <immintrin.h>
#define AT_AVX2 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define AT_Q8_VNNI 1
#elif !defined(__AVX512VL__)  /* AVX-512 without VNNI blocks three rows (ROW_BLOCK): not measured, left portable */
#define AT_Q8_AVX2 1  /* the same sums by vpmaddubsw on the keys less their bias (block_scores) */
#endif
#endif
#include "attention_parts.h"
#include "kv_q8.h"
#ifdef AT_Q8_VNNI
#define Q8_BIASED 1  /* the vector loops' key products read the keys' biased bytes (vpdpbusd's unsigned operand) */
#else
#define Q8_BIASED 0
#endif

#define Q8_EXP_FLOOR -110.0f  /* exp(-110) is 0 in float32: -inf (a padded slot) takes it too */
#define LOG2E 1.44269504088896341f
#define MAX_PIECES 4  /* a query row's 32-byte pieces at the widest head the vector loops take (d = 128) */
/* 2^f for |f| <= 1/2: ln 2^k / k!, k = 6..0, by Horner's rule. */
static const float EXP2_TAYLOR[7] = {1.5403530e-4f, 1.3333558e-3f, 9.6181291e-3f, 5.5504109e-2f, 2.4022651e-1f,
                                     6.9314718e-1f, 1.0f};

/* exp(x) for x <= 0 (the header's rule), one value. */
static inline float q8_exp(float x) {
    const float t = fmaxf(x, Q8_EXP_FLOOR) * LOG2E, n = nearbyintf(t), f = t - n;
    float p = EXP2_TAYLOR[0];
    for (int k = 1; k < 7; ++k) p = fmaf(p, f, EXP2_TAYLOR[k]);
    return ldexpf(p, (int)n);
}

/* A row's numerators over its n scores, in place, and (max, sum): the sum in eight lanes of every eighth slot,
   then the lanes in order, as numerators_vector adds them. */
static struct part numerators_portable(float *row, int64_t n) {
    float max = -INFINITY, lanes[8] = {0.0f}, sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) max = row[j] > max ? row[j] : max;
    for (int64_t j = 0; j < n; ++j) {
        row[j] = q8_exp(row[j] - max);
        lanes[j % 8] += row[j];
    }
    for (int u = 0; u < 8; ++u) sum += lanes[u];
    return (struct part){max, sum};
}

/* out[i] = the chunk's weighted sum of values (the header's rule) for one row's numerators p over n slots. */
static void values_portable(const float *p, const char *const *values, int64_t n, int64_t d, float *out) {
    float w[CHUNK], top = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
        w[j] = p[j] * q8_scale(values[j], d);
        top = w[j] > top ? w[j] : top;
    }
    int32_t acc[d];
    memset(acc, 0, sizeof acc);
    const float inv = top > 0.0f ? 255.0f / top : 0.0f;
    for (int64_t j = 0; j < n; ++j) {
        const int32_t u = (int32_t)nearbyintf(w[j] * inv);
        for (int64_t i = 0; u && i < d; ++i) acc[i] += u * (int8_t)values[j][i];
    }
    const float c = top / 255.0f;
    for (int64_t i = 0; i < d; ++i) out[i] = (float)acc[i] * c;
}

int q8_queries_of(const float *q, int64_t rows, int64_t d, float scale, struct q8_queries *out) {
    out->integers = malloc((size_t)(rows * d));
    out->a = malloc((size_t)rows * sizeof(float));
    out->bias = malloc((size_t)rows * sizeof(int32_t));
    if (!out->integers || !out->a || !out->bias) {
        q8_queries_free(out);
        return -1;
    }
    for (int64_t r = 0; r < rows; ++r) {
        int32_t total;
        out->a[r] = q8_integers(q + r * d, d, out->integers + r * d, &total) * scale;
        out->bias[r] = Q8_KEY_BIAS * total;
    }
    return 0;
}

void q8_queries_free(struct q8_queries *queries) {
    free(queries->integers); free(queries->a); free(queries->bias);
    queries->integers = NULL; queries->a = NULL; queries->bias = NULL;
}

/* One row's scores, numerators and weighted values over the chunk, a slot at a time: qi its integers. */
static void row_portable(const int8_t *qi, float a, int32_t bias, int64_t d, const char *const *keys,
                         const char *const *values, int64_t n, float *row, struct part *part, float *out) {
    for (int64_t j = 0; j < n; ++j) {
        const uint8_t *key = (const uint8_t *)keys[j];
        int32_t s = 0;
        for (int64_t i = 0; i < d; ++i) s += qi[i] * key[i];
        row[j] = (float)(s - bias) * a * q8_scale(keys[j], d);
    }
    *part = numerators_portable(row, n);
    values_portable(row, values, n, d, out);
}

#if defined(AT_Q8_VNNI) || defined(AT_Q8_AVX2)
/* The eight sums of eight vectors' int32 lanes (integer sums are exact in any order): unpacks and adds in pairs,
   which ran a 7K step's attention ~2% faster than six vphaddd. */
INLINE __m256i hsum8_epi32(const __m256i *v) {
    __m256i s[4], t[2];
    for (int i = 0; i < 4; ++i)
        s[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; ++i)
        t[i] = _mm256_add_epi32(_mm256_unpacklo_epi64(s[2 * i], s[2 * i + 1]),
                                _mm256_unpackhi_epi64(s[2 * i], s[2 * i + 1]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(t[0], t[1], 0x20), _mm256_permute2x128_si256(t[0], t[1], 0x31));
}

/* scores[r * CHUNK + j] for R rows and the chunk's keys at d = 32 NB (64 or 128), eight keys at a time: qb[r] row
   r's integers (NB vectors of 32), bias[r] = Q8_KEY_BIAS * their sum (the keys' bytes carry the bias),
   a[r] = sq * scale. */
INLINE void block_scores(const __m256i (*qb)[MAX_PIECES], const int32_t *bias, const float *a,
                         const char *const *keys, int64_t padded, const int R, const int NB, int64_t ahead,
                         float *scores) {
    const int64_t d = 32 * NB;
    for (int64_t j = 0; j < padded; j += 8) {
        if (ahead)
            for (int u = 0; u < 8; ++u) prefetch_row(keys[j + u] + ahead, d + 4);
        __m256i acc[MAX_GROUP][8];
        for (int r = 0; r < R; ++r)
            for (int u = 0; u < 8; ++u) acc[r][u] = _mm256_setzero_si256();
        for (int b = 0; b < NB; ++b)
            for (int u = 0; u < 8; ++u) {
                const __m256i kv = _mm256_loadu_si256((const __m256i *)(keys[j + u] + 32 * b));
#ifdef AT_Q8_VNNI
                for (int r = 0; r < R; ++r) acc[r][u] = _mm256_dpbusd_epi32(acc[r][u], kv, qb[r][b]);
#else
                /* The key's signed integers (its bytes less the bias): |k| times q with k's sign, by byte pairs. Both
                   are within +-127, so a pair's sum (<= 2 * 127 * 127) fits vpmaddubsw's 16 bits unsaturated. */
                const __m256i k = _mm256_xor_si256(kv, _mm256_set1_epi8((char)Q8_KEY_BIAS)), size = _mm256_abs_epi8(k);
                for (int r = 0; r < R; ++r)
                    acc[r][u] = _mm256_add_epi32(acc[r][u], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(size, _mm256_sign_epi8(qb[r][b], k)), _mm256_set1_epi16(1)));
#endif
            }
        __m256 sk = _mm256_setzero_ps();
        float lanes[8];
        for (int u = 0; u < 8; ++u) lanes[u] = q8_scale(keys[j + u], d);
        sk = _mm256_loadu_ps(lanes);
        for (int r = 0; r < R; ++r) {
            /* vpdpbusd read the keys' biased bytes: the bias's share of the sum goes (bias[r] = 128 * sum(q)) */
            const __m256i s = _mm256_sub_epi32(hsum8_epi32(acc[r]), _mm256_set1_epi32(Q8_BIASED ? bias[r] : 0));
            _mm256_storeu_ps(scores + r * CHUNK + j,
                             _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(a[r])), sk));
        }
    }
}

/* q8_exp of eight values: vroundps is nearbyintf (exact, as is fma), and p * 2^n is ldexpf: one rounding. */
INLINE __m256 q8_exp8(__m256 x) {
    const __m256 t = _mm256_mul_ps(_mm256_max_ps(x, _mm256_set1_ps(Q8_EXP_FLOOR)), _mm256_set1_ps(LOG2E));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(EXP2_TAYLOR[0]);
    for (int k = 1; k < 7; ++k) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_TAYLOR[k]));
#ifdef AT_Q8_VNNI
    return _mm256_scalef_ps(p, n);
#else
    /* n >= -159 (the floor): p * 2^(n + 64) is a normal float, exact; times 2^-64 it rounds once, where the result
       is subnormal, as ldexpf does. */
    const __m256i up = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127 + 64)), 23);
    return _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(up)), _mm256_set1_ps(0x1p-64f));
#endif
}

/* The low bytes of eight int32 lanes (each within 0..255) to eight bytes at `to`. */
INLINE void store_bytes8(uint32_t *to, __m256i u) {
#ifdef AT_Q8_VNNI
    _mm_storel_epi64((__m128i *)to, _mm256_cvtepi32_epi8(u));
#else
    const __m256i low = _mm256_shuffle_epi8(u, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                -1, -1, -1, -1));
    _mm_storel_epi64((__m128i *)to, _mm_unpacklo_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1)));
#endif
}


/* R rows' numerators in place, each row's (max, sum) in parts (numerators_portable's order), and its 8-bit weights
   (the header's rule; sv: the slots' scales, 0 past n, where p is 0 too): u4, four slots to a 32-bit word, and
   c = top / 255. The rows go side by side in every loop, each row's sums and maxima in the order of one row alone
   (so the same values), while one row's reductions wait on their latency the others' work goes on; the largest
   weight is found as the numerators are made. Row by row in three passes this took 36% of a 7K plain step's
   attention cycles (rdtsc), 29% so. */
INLINE void block_weights(float *scores, const float *sv, int64_t padded, const int R, struct part *parts,
                          uint32_t (*u4)[CHUNK / 4], float *c) {
    __m256 peak[MAX_GROUP], total[MAX_GROUP], wtop[MAX_GROUP], maxv[MAX_GROUP];
    float lanes[8];
    for (int r = 0; r < R; ++r) peak[r] = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < padded; j += 8)
        for (int r = 0; r < R; ++r) peak[r] = _mm256_max_ps(peak[r], _mm256_loadu_ps(scores + r * CHUNK + j));
    for (int r = 0; r < R; ++r) {
        float max = -INFINITY;
        _mm256_storeu_ps(lanes, peak[r]);
        for (int u = 0; u < 8; ++u) max = lanes[u] > max ? lanes[u] : max;
        parts[r].max = max;
        maxv[r] = _mm256_set1_ps(max);
        total[r] = _mm256_setzero_ps();
        wtop[r] = _mm256_setzero_ps();
    }
    for (int64_t j = 0; j < padded; j += 8) {
        const __m256 s = _mm256_loadu_ps(sv + j);
        for (int r = 0; r < R; ++r) {
            float *row = scores + r * CHUNK;
            const __m256 e = q8_exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), maxv[r]));
            _mm256_storeu_ps(row + j, e);
            total[r] = _mm256_add_ps(total[r], e);
            wtop[r] = _mm256_max_ps(wtop[r], _mm256_mul_ps(e, s));
        }
    }
    __m256 inv[MAX_GROUP];
    for (int r = 0; r < R; ++r) {
        float sum = 0.0f, t = 0.0f;
        _mm256_storeu_ps(lanes, total[r]);
        for (int u = 0; u < 8; ++u) sum += lanes[u];
        parts[r].sum = sum;
        _mm256_storeu_ps(lanes, wtop[r]);
        for (int u = 0; u < 8; ++u) t = lanes[u] > t ? lanes[u] : t;
        inv[r] = _mm256_set1_ps(t > 0.0f ? 255.0f / t : 0.0f);
        c[r] = t / 255.0f;
    }
    for (int64_t j = 0; j < padded; j += 8) {
        const __m256 s = _mm256_loadu_ps(sv + j);
        for (int r = 0; r < R; ++r) {
            const __m256 w = _mm256_mul_ps(_mm256_loadu_ps(scores + r * CHUNK + j), s);
            const __m256i u = _mm256_cvtps_epi32(_mm256_mul_ps(w, inv[r]));
            store_bytes8(u4[r] + j / 4, u);
        }
    }
}

#ifdef AT_Q8_VNNI
/* o[r * d + i] for R rows and the 64 elements i from `at` (a section of a row of d), four slots a step: their
   rows' bytes interleaved so that a 32-bit lane holds one element of the four (unpacks within 128-bit lanes:
   128-bit lane L of x[k] holds elements 16 L + 4 k .. + 3), each dotted with the row's four weights. Slots past n
   carry weight 0. */
INLINE void block_values(const uint32_t (*u4)[CHUNK / 4], const float *c, const char *const *values, int64_t n,
                         const int R, int64_t d, int64_t at, int64_t ahead, float *o) {
    __m512i acc[MAX_GROUP][4];
    for (int r = 0; r < R; ++r)
        for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_setzero_si512();
    for (int64_t j = 0; j < n; j += 4) {
        if (ahead)
            for (int u = 0; u < 4; ++u) prefetch_row(values[j + u] + ahead, d + 4);
        const __m512i A = _mm512_loadu_si512(values[j] + at), B = _mm512_loadu_si512(values[j + 1] + at);
        const __m512i C = _mm512_loadu_si512(values[j + 2] + at), D = _mm512_loadu_si512(values[j + 3] + at);
        const __m512i ab_lo = _mm512_unpacklo_epi8(A, B), ab_hi = _mm512_unpackhi_epi8(A, B);
        const __m512i cd_lo = _mm512_unpacklo_epi8(C, D), cd_hi = _mm512_unpackhi_epi8(C, D);
        const __m512i x[4] = {_mm512_unpacklo_epi16(ab_lo, cd_lo), _mm512_unpackhi_epi16(ab_lo, cd_lo),
                              _mm512_unpacklo_epi16(ab_hi, cd_hi), _mm512_unpackhi_epi16(ab_hi, cd_hi)};
        for (int r = 0; r < R; ++r) {
            const __m512i w = _mm512_set1_epi32((int)u4[r][j / 4]);
            for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_dpbusd_epi32(acc[r][k], w, x[k]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int k = 0; k < 4; ++k) {
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][k]), _mm512_set1_ps(c[r]));
            float *to = o + r * d + at;
            _mm_storeu_ps(to + 4 * k, _mm512_extractf32x4_ps(f, 0));
            _mm_storeu_ps(to + 16 + 4 * k, _mm512_extractf32x4_ps(f, 1));
            _mm_storeu_ps(to + 32 + 4 * k, _mm512_extractf32x4_ps(f, 2));
            _mm_storeu_ps(to + 48 + 4 * k, _mm512_extractf32x4_ps(f, 3));
        }
}
#else
/* block_values without vpdpbusd: two slots a step, their values widened to 16 bits and interleaved so that a
   32-bit lane of vpmaddwd holds one element of both, times the pair of weights (a product fits 16 bits, 255 * 127,
   but two of them do not: no vpmaddubsw). Unpacks go within 128-bit lanes: acc[r][2 g] holds elements 16 g + 0..3
   and 16 g + 8..11, acc[r][2 g + 1] 16 g + 4..7 and 16 g + 12..15, put back in order at the end. Slots past n
   carry weight 0 (an odd n's last pair). */
INLINE void block_values(const uint32_t (*u4)[CHUNK / 4], const float *c, const char *const *values, int64_t n,
                         const int R, int64_t d, int64_t at, int64_t ahead, float *o) {
    __m256i acc[MAX_GROUP][8];
    for (int r = 0; r < R; ++r)
        for (int k = 0; k < 8; ++k) acc[r][k] = _mm256_setzero_si256();
    for (int64_t j = 0; j < n; j += 2) {
        if (ahead)
            for (int u = 0; u < 2; ++u) prefetch_row(values[j + u] + ahead, d + 4);
        __m256i w[MAX_GROUP];
        for (int r = 0; r < R; ++r) {
            const uint8_t *u = (const uint8_t *)u4[r];
            w[r] = _mm256_set1_epi32((int)((uint32_t)u[j + 1] << 16 | u[j]));
        }
        for (int g = 0; g < 4; ++g) {
            const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(values[j] + at + 16 * g)));
            const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(values[j + 1] + at + 16 * g)));
            const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
            for (int r = 0; r < R; ++r) {
                acc[r][2 * g] = _mm256_add_epi32(acc[r][2 * g], _mm256_madd_epi16(lo, w[r]));
                acc[r][2 * g + 1] = _mm256_add_epi32(acc[r][2 * g + 1], _mm256_madd_epi16(hi, w[r]));
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < 4; ++g) {
            const __m256 scale = _mm256_set1_ps(c[r]);
            const __m256i first = _mm256_permute2x128_si256(acc[r][2 * g], acc[r][2 * g + 1], 0x20);
            const __m256i second = _mm256_permute2x128_si256(acc[r][2 * g], acc[r][2 * g + 1], 0x31);
            float *to = o + r * d + at + 16 * g;
            _mm256_storeu_ps(to, _mm256_mul_ps(_mm256_cvtepi32_ps(first), scale));
            _mm256_storeu_ps(to + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(second), scale));
        }
}
#endif

/* A block's scores at d = 32 NB: block_scores with R and NB constants, each pair its own unrolled loops. */
static void scores_of(const __m256i (*qb)[MAX_PIECES], const int32_t *bias, const float *a, const char *const *keys,
                      int64_t padded, int R, int NB, int64_t ahead, float *sc) {
    if (NB == 2) {
        if (R == 3) block_scores(qb, bias, a, keys, padded, 3, 2, ahead, sc);
        else if (R == 2) block_scores(qb, bias, a, keys, padded, 2, 2, ahead, sc);
        else block_scores(qb, bias, a, keys, padded, 1, 2, ahead, sc);
    } else {
        if (R == 3) block_scores(qb, bias, a, keys, padded, 3, 4, ahead, sc);
        else if (R == 2) block_scores(qb, bias, a, keys, padded, 2, 4, ahead, sc);
        else block_scores(qb, bias, a, keys, padded, 1, 4, ahead, sc);
    }
}

/* q8_chunk's rows at d = 64 or 128, in blocks of ROW_BLOCK rows (keys and values addressed once for all): row r's
   integers at qi[r], its a and bias at a[r], bias[r]. */
static void chunk_vector(const int8_t *const *qi, const float *a, const int32_t *bias, int64_t rows, int64_t d,
                         const char *const *keys, const char *const *values, int64_t n, int64_t ahead, float *scores,
                         struct part *parts, float *o) {
    const int64_t padded = (n + 7) / 8 * 8;
    const int nb = (int)(d / 32);
    for (int64_t r = 0; r < rows; r += ROW_BLOCK) {
        const int b = rows - r < ROW_BLOCK ? (int)(rows - r) : ROW_BLOCK;
        __m256i qb[MAX_GROUP][MAX_PIECES];
        for (int i = 0; i < b; ++i)
            for (int piece = 0; piece < nb; ++piece)
                qb[i][piece] = _mm256_loadu_si256((const __m256i *)(qi[r + i] + 32 * piece));
        const int64_t next = r == 0 ? ahead : 0;  /* the first block reads the chunk from memory */
        scores_of(qb, bias + r, a + r, keys, padded, b, nb, next, scores + r * CHUNK);
    }
    float sv[CHUNK];
    for (int64_t j = 0; j < padded; ++j) sv[j] = j < n ? q8_scale(values[j], d) : 0.0f;
    uint32_t u4[MAX_GROUP][CHUNK / 4];
    float c[MAX_GROUP];
    for (int64_t r = 0; r < rows; r += ROW_BLOCK) {
        const int b = rows - r < ROW_BLOCK ? (int)(rows - r) : ROW_BLOCK;
        for (int i = 0; i < b; ++i)
            for (int64_t j = n; j < padded; ++j) scores[(r + i) * CHUNK + j] = -INFINITY;
        if (b == 3) block_weights(scores + r * CHUNK, sv, padded, 3, parts + r, u4, c);
        else if (b == 2) block_weights(scores + r * CHUNK, sv, padded, 2, parts + r, u4, c);
        else block_weights(scores + r * CHUNK, sv, padded, 1, parts + r, u4, c);
        for (int64_t at = 0; at < d; at += 64) {  /* the row's sections of 64 elements, each over every slot */
            const int64_t next = r == 0 && at == 0 ? ahead : 0;
            if (b == 3) block_values(u4, c, values, n, 3, d, at, next, o + r * d);
            else if (b == 2) block_values(u4, c, values, n, 2, d, at, next, o + r * d);
            else block_values(u4, c, values, n, 1, d, at, next, o + r * d);
        }
    }
}
#endif

/* chunk_task over a q8 cache: query rows [r0, r0 + rows) of KV head `head` (row r: token r / g, query head
   head * g + r % g; its integers queries' row token * h + query head) over the n <= CHUNK slots SLOT(slots, s0, j);
   k and v: the head's first row; slot_stride and `ahead` in bytes. Writes each row's (max, sum) to parts and its
   weighted values to o, as chunk_task does. */
void q8_chunk(const struct q8_queries *queries, int64_t h, int64_t g, int64_t r0, int64_t rows, int64_t d,
              const char *k, const char *v, int64_t slot_stride, const int64_t *slots, int64_t s0, int64_t n,
              int64_t head, int64_t ahead, float *scores, struct part *parts, float *o) {
    const char *keys[CHUNK], *values[CHUNK];
    const int64_t padded = (n + 7) / 8 * 8;  /* past n: the last slot again, with weight 0 */
    for (int64_t j = 0; j < padded; ++j) {
        const int64_t at = SLOT(slots, s0, j < n ? j : n - 1) * slot_stride;
        keys[j] = k + at;
        values[j] = v + at;
    }
    const int8_t *qi[rows];
    float a[rows];
    int32_t bias[rows];
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t row_id = r0 + r, at = (row_id / g) * h + head * g + row_id % g;
        qi[r] = queries->integers + at * d;
        a[r] = queries->a[at];
        bias[r] = queries->bias[at];
    }
#if defined(AT_Q8_VNNI) || defined(AT_Q8_AVX2)
    if (d == 64 || d == 128) {
        chunk_vector(qi, a, bias, rows, d, keys, values, n, ahead, scores, parts, o);
        return;
    }
#endif
    (void)ahead;
    for (int64_t r = 0; r < rows; ++r)
        row_portable(qi[r], a[r], bias[r], d, keys, values, n, scores + r * CHUNK, parts + r, o + r * d);
}
#endif

/* 1 where this build's q8 products take the vector loops (vpdpbusd, or AVX2's) for heads d wide, else 0 (the
   portable loops: correct, not fast; float64 builds have no q8 cache). */
int attention_q8_fast(int64_t d) {
#if defined(AT_Q8_VNNI) || defined(AT_Q8_AVX2)
    return d == 64 || d == 128;
#else
    (void)d;
    return 0;
#endif
}
