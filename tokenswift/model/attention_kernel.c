/* Attention of a few query rows (a decoding step, a draft pass, a verify batch) over the KV cache (real.h).

   torch's CPU flash-attention kernel treats these rows as a tiny GEMM per KV block and reached a third of this
   machine's memory bandwidth on a 2K-token cache (0.66 ms a layer for 3 MB of keys and values). Here each KV head
   reads its keys and values once for all the query heads of its group and all the rows: each cached slot's key
   is loaded once and dotted with every query, each value once and added to every output.

   A row's visible slots, in slot order, are cut into chunks of CHUNK; each chunk's running maximum, sum and output
   per query (flash-decoding) are merged in chunk order. The chunks are counted over the slots a row sees, not over
   the cache: a verify batch's tree row sees the prefix and then its ancestors, which sit among other candidates'
   slots, and it must cut them into the chunks a plain step at its position cuts its contiguous slots into, or the
   sums round otherwise and the text drifts from plain decoding. The slots every row sees, [0, shared), make whole
   chunks, each a task (KV head, chunk) that reads them once for all rows; from the last whole chunk on, each token
   has its own list, a task (KV head, token, chunk) for its query heads. So a row's result depends on its query and
   the keys and values it sees, in order, and on nothing else: not the rows beside it, where its slots sit, nor the
   thread count. (A sliding window hides the first slots from later rows: then nothing is shared, and each token
   reads its own window.)

   The cache holds float32 (real) or, compact, bfloat16 keys and values (KV_BF16, real.h): a bf16 element is widened
   to float32 exactly as it is loaded, and every sum then runs as over a float32 cache holding the same values, so
   a step reads half the bytes and computes what the float32 kernel computes over the rounded values. Where the CPU
   has AVX-512 BF16 (AT_DOT_BF16), a compact cache's products take vdpbf16ps instead: the scores over q rounded to
   bf16, the weighted sums over the weights rounded to bf16, each lane adding its pair of products, the second's
   and then the first's, each rounded (Intel's definition; measured the same on this Zen 4). At a 7K context these
   products are a row's arithmetic, and a verify batch's extra rows are arithmetic: this halves them. Every row, a
   plain step's or a verify batch's, takes the same path on a machine, so TokenSwift stays plain decoding's text; a
   machine without the instruction keeps the float32 products (its text may part from this one's at a near tie, as
   the AVX2 and portable builds' already may). A q8 cache's chunks are attention_q8.c's, over the same tasks. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "real.h"
#include "attend_rows.h"
#ifdef TS_AVX2
#include <immintrin.h>
#define AT_AVX2 1
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
#define AT_DOT_BF16 1
#endif
#elif defined(TS_DOUBLE) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define AT_EXP4 1  /* float64 in four lanes: the scores, their largest and exp (attention_parts.h), the values */
#endif
#include "attention_parts.h"

#ifdef AT_AVX2

/* Lanes i..i+7 of a cached key or value (its first element at `row`), widened to float32 from a bf16 cache. */
INLINE __m256 load_kv(const char *row, int64_t i, const int bf16) {
    if (!bf16)
        return _mm256_loadu_ps((const float *)row + i);
    const __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}


/* scores[r * CHUNK + j] = scale * q[r] . key[j] for R rows and the chunk's keys, eight at a time (keys past n
   repeat the last key: every slot's sum takes the same order wherever n falls), each key vector loaded once for
   the R rows. A sum: eight lanes over d in order, then hsum8. */
INLINE void block_scores(const float *const *q, const char *const *keys, int64_t padded, int64_t d, float scale,
                         const int R, int64_t ahead, const int bf16, float *scores) {
    for (int64_t j = 0; j < padded; j += 8) {
        if (ahead)
            for (int u = 0; u < 8; ++u) prefetch_row(keys[j + u] + ahead, d << (bf16 ? 1 : 2));
        __m256 acc[MAX_GROUP][8];
        for (int r = 0; r < R; ++r)
            for (int u = 0; u < 8; ++u) acc[r][u] = _mm256_setzero_ps();
        for (int64_t i = 0; i < d; i += 8) {
            __m256 qv[MAX_GROUP];
            for (int r = 0; r < R; ++r) qv[r] = _mm256_loadu_ps(q[r] + i);
            for (int u = 0; u < 8; ++u) {
                const __m256 kv = load_kv(keys[j + u], i, bf16);
                for (int r = 0; r < R; ++r) acc[r][u] = _mm256_fmadd_ps(qv[r], kv, acc[r][u]);
            }
        }
        for (int r = 0; r < R; ++r)
            _mm256_storeu_ps(scores + r * CHUNK + j, _mm256_mul_ps(hsum8(acc[r]), _mm256_set1_ps(scale)));
    }
}

#ifdef AT_DOT_BF16
/* block_scores over a compact cache at d = 64 with vdpbf16ps: qb[r] is row r's query rounded to bf16 (its 64
   elements as four vectors of sixteen), each key's four vectors are dotted in pairs, lane by lane, then hsum8. */
INLINE void block_scores_bf16(const __m256bh (*qb)[4], const char *const *keys, int64_t padded, float scale,
                              const int R, int64_t ahead, float *scores) {
    for (int64_t j = 0; j < padded; j += 8) {
        if (ahead)
            for (int u = 0; u < 8; ++u) prefetch_row(keys[j + u] + ahead, 128);
        __m256 acc[MAX_GROUP][8];
        for (int r = 0; r < R; ++r)
            for (int u = 0; u < 8; ++u) acc[r][u] = _mm256_setzero_ps();
        for (int b = 0; b < 4; ++b)
            for (int u = 0; u < 8; ++u) {
                const __m256bh kv = (__m256bh)_mm256_loadu_si256((const __m256i *)keys[j + u] + b);
                for (int r = 0; r < R; ++r) acc[r][u] = _mm256_dpbf16_ps(acc[r][u], qb[r][b], kv);
            }
        for (int r = 0; r < R; ++r)
            _mm256_storeu_ps(scores + r * CHUNK + j, _mm256_mul_ps(hsum8(acc[r]), _mm256_set1_ps(scale)));
    }
}

/* block_values over a compact cache at d = 64 with vdpbf16ps: the weights rounded to bf16, two slots a step, each
   lane adding the second slot's product and then the first one's (each rounded); a lane holds output elements of
   both halves of a 16-element group (unpacklo/hi interleave within 128-bit halves), put back in order at the end.
   An odd n pairs its last slot with the padding's zero weight: +0 added to a sum of finite terms. */
INLINE void block_values_bf16(const float *p, const char *const *values, int64_t n, int64_t padded, const int R,
                              int64_t ahead, float *o) {
    uint32_t pairs[MAX_GROUP][CHUNK / 2];  /* the weights of slots 2i and 2i + 1 as one bf16 pair */
    for (int r = 0; r < R; ++r)
        for (int64_t j = 0; j < padded; j += 8)
            _mm_storeu_si128((__m128i *)(pairs[r] + j / 2),
                             (__m128i)_mm256_cvtneps_pbh(_mm256_loadu_ps(p + r * CHUNK + j)));
    __m256 acc[MAX_GROUP][8];
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < 8; ++i) acc[r][i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 2) {
        const char *first = values[j], *second = values[j + 1 < n ? j + 1 : j];
        if (ahead) {
            prefetch_row(first + ahead, 128);
            prefetch_row(second + ahead, 128);
        }
        __m256bh w[MAX_GROUP];
        for (int r = 0; r < R; ++r) w[r] = (__m256bh)_mm256_set1_epi32((int)pairs[r][j / 2]);
        for (int g = 0; g < 4; ++g) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)first + g);
            const __m256i b = _mm256_loadu_si256((const __m256i *)second + g);
            const __m256bh lo = (__m256bh)_mm256_unpacklo_epi16(a, b), hi = (__m256bh)_mm256_unpackhi_epi16(a, b);
            for (int r = 0; r < R; ++r) {
                acc[r][2 * g] = _mm256_dpbf16_ps(acc[r][2 * g], w[r], lo);
                acc[r][2 * g + 1] = _mm256_dpbf16_ps(acc[r][2 * g + 1], w[r], hi);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < 4; ++g) {
            _mm256_storeu_ps(o + r * 64 + 16 * g, _mm256_permute2f128_ps(acc[r][2 * g], acc[r][2 * g + 1], 0x20));
            _mm256_storeu_ps(o + r * 64 + 16 * g + 8, _mm256_permute2f128_ps(acc[r][2 * g], acc[r][2 * g + 1], 0x31));
        }
}

/* A query row of d = 64 rounded to bf16 (to nearest, ties to even, as torch and to_bf16 round), for vdpbf16ps. */
INLINE void query_bf16(const float *q, __m256bh *out) {
    for (int b = 0; b < 4; ++b) out[b] = _mm512_cvtneps_pbh(_mm512_loadu_ps(q + 16 * b));
}
#endif

/* o[r * d + i] = sum over the chunk's n slots of p[r * CHUNK + j] * value[j][i], in slot order, for R rows and
   D = d <= 128 (D / 8 accumulators a row), each value vector loaded once for the R rows. A zero weight adds +0 to
   a sum that starts at +0 and whose values are finite: the sums are those of skipping it. */
INLINE void block_values(const float *p, const char *const *values, int64_t n, const int64_t D, const int R,
                         int64_t ahead, const int bf16, float *o) {
    __m256 acc[MAX_GROUP][16];
    for (int r = 0; r < R; ++r)
        for (int64_t i = 0; i < D / 8; ++i) acc[r][i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
        __m256 w[MAX_GROUP];
        for (int r = 0; r < R; ++r) w[r] = _mm256_set1_ps(p[r * CHUNK + j]);
        if (ahead) prefetch_row(values[j] + ahead, D << (bf16 ? 1 : 2));
        for (int64_t i = 0; i < D / 8; ++i) {
            const __m256 vv = load_kv(values[j], 8 * i, bf16);
            for (int r = 0; r < R; ++r) acc[r][i] = _mm256_fmadd_ps(w[r], vv, acc[r][i]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int64_t i = 0; i < D / 8; ++i) _mm256_storeu_ps(o + r * D + 8 * i, acc[r][i]);
}
#endif

/* Element i of a cached key or value (its first element at `row`): real, or bf16 widened. */
static inline real kv_at(const char *row, int64_t i, int bf16) {
    return bf16 ? (real)from_bf16(((const uint16_t *)row)[i]) : ((const real *)row)[i];
}

static real dot(const real *a, const char *b, int64_t d, int bf16) {
    real sum = 0.0;
    for (int64_t i = 0; i < d; ++i) sum += a[i] * kv_at(b, i, bf16);
    return sum;
}

/* Four keys' dot()s side by side, each summed in dot()'s order: with one chain of multiply-adds a score, each waited
   on the last one's latency. The portable loops run a build without AVX2, a bf16 cache in float64, and head sizes
   the vector path does not take (a float64 cache with AVX2 takes attention_f64.h's copies of these loops); with this
   and weighted_values a float64 forward took 0.76-0.87x the time. Only where d % 8 == 0 (chunk_task): elsewhere gcc
   contracts its multiply-adds otherwise than dot()'s, and the last bits of a score would move. */
static void dot4(const real *a, const char *const *b, int64_t d, int bf16, real scale, real *out) {
    real s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int64_t i = 0; i < d; ++i) {
        s0 += a[i] * kv_at(b[0], i, bf16);
        s1 += a[i] * kv_at(b[1], i, bf16);
        s2 += a[i] * kv_at(b[2], i, bf16);
        s3 += a[i] * kv_at(b[3], i, bf16);
    }
    out[0] = scale * s0;
    out[1] = scale * s1;
    out[2] = scale * s2;
    out[3] = scale * s3;
}

/* out[i0 + u] for u < width (at most 8): the sum over the chunk's n slots of p[j] * value[j][i0 + u], in slot order
   (a zero weight skipped), in registers. */
static inline __attribute__((always_inline)) void value_block(const real *p, const char *v, const int64_t *slots,
                                                              int64_t s0, int64_t n, int64_t i0, const int width,
                                                              int64_t slot_bytes, int bf16, real *out) {
    real acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (int64_t j = 0; j < n; ++j) {
        if (p[j] == 0.0) continue;
        const char *value = v + SLOT(slots, s0, j) * slot_bytes;
        for (int u = 0; u < width; ++u) acc[u] += p[j] * kv_at(value, i0 + u, bf16);
    }
    for (int u = 0; u < width; ++u) out[i0 + u] = acc[u];
}

#ifdef AT_EXP4
#include "attention_f64.h"
#endif

/* out[i] = sum over the chunk's n slots of p[j] * value[j][i], eight output elements at a time (the last d % 8 as
   one more block, the same shape: the same contractions). The loop this replaces summed in `out` itself, which
   might alias the cache as far as the compiler knew: each product waited on the store of the one before. */
static void weighted_values(const real *p, const char *v, const int64_t *slots, int64_t s0, int64_t n, int64_t d,
                            int64_t slot_bytes, int bf16, real *out) {
    int64_t i0 = 0;
#ifdef AT_EXP4
    if (!bf16) {
        for (; i0 + 8 <= d; i0 += 8) value_block_pd(p, v, slots, s0, n, i0, slot_bytes, out);
    }
#endif
    for (; i0 + 8 <= d; i0 += 8) value_block(p, v, slots, s0, n, i0, 8, slot_bytes, bf16, out);
    if (i0 < d) value_block(p, v, slots, s0, n, i0, (int)(d - i0), slot_bytes, bf16, out);
}

#ifdef AT_AVX2

/* chunk_task's rows where d % 8 == 0 and d <= 128, in blocks of ROW_BLOCK rows: the chunk's key and value
   addresses found once for all of them, then every block's scores while the keys are in L1, then every block's
   values (a chunk's keys and values together fill this core's 32 KiB L1). Inlined twice, for each cache element
   (bf16 a constant). */
INLINE void chunk_rows_vector(const float *q, int64_t h, int64_t g, int64_t r0, int64_t rows, int64_t d,
                              const char *k, const char *v, int64_t slot_stride, const int64_t *slots, int64_t s0,
                              int64_t n, float scale, int64_t head, int64_t ahead, const int bf16, float *scores,
                              struct part *parts, float *o) {
    const int64_t padded = (n + 7) / 8 * 8;
    const char *keys[CHUNK], *values[CHUNK];
    const float *qs[MAX_GROUP];
    for (int64_t j = 0; j < padded; ++j) {
        const int64_t at = SLOT(slots, s0, j < n ? j : n - 1) * slot_stride * (bf16 ? 2 : 4);
        keys[j] = k + at;
        values[j] = v + at;
    }
    for (int64_t r = 0; r < rows; r += ROW_BLOCK) {
        const int b = rows - r < ROW_BLOCK ? (int)(rows - r) : ROW_BLOCK;
        for (int i = 0; i < b; ++i) {
            const int64_t row_id = r0 + r + i;
            qs[i] = q + ((row_id / g) * h + head * g + row_id % g) * d;
        }
        float *sc = scores + r * CHUNK;
        const int64_t next = r == 0 ? ahead : 0;  /* the first block reads the chunk from memory */
#ifdef AT_DOT_BF16
        if (bf16 && d == 64) {
            __m256bh qb[MAX_GROUP][4];
            for (int i = 0; i < b; ++i) query_bf16(qs[i], qb[i]);
            if (b == ROW_BLOCK) block_scores_bf16(qb, keys, padded, scale, ROW_BLOCK, next, sc);
            else if (b == 2) block_scores_bf16(qb, keys, padded, scale, 2, next, sc);
            else block_scores_bf16(qb, keys, padded, scale, 1, next, sc);
            continue;
        }
#endif
        if (d != 64)  /* d = 64 (the default model's) blocked and inlined; others a row at a time */
            for (int i = 0; i < b; ++i)
                block_scores(qs + i, keys, padded, d, scale, 1, i ? 0 : next, bf16, sc + i * CHUNK);
        else if (b == ROW_BLOCK) block_scores(qs, keys, padded, 64, scale, ROW_BLOCK, next, bf16, sc);
        else if (b == 2) block_scores(qs, keys, padded, 64, scale, 2, next, bf16, sc);
        else block_scores(qs, keys, padded, 64, scale, 1, next, bf16, sc);
    }
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = n; j < padded; ++j) scores[r * CHUNK + j] = -INFINITY;
        parts[r] = exponentiate_vector(scores + r * CHUNK, padded);
    }
    for (int64_t r = 0; r < rows; r += ROW_BLOCK) {
        const int b = rows - r < ROW_BLOCK ? (int)(rows - r) : ROW_BLOCK;
        const float *p = scores + r * CHUNK;
        float *out = o + r * d;
        const int64_t next = r == 0 ? ahead : 0;
#ifdef AT_DOT_BF16
        if (bf16 && d == 64) {
            if (b == ROW_BLOCK) block_values_bf16(p, values, n, padded, ROW_BLOCK, next, out);
            else if (b == 2) block_values_bf16(p, values, n, padded, 2, next, out);
            else block_values_bf16(p, values, n, padded, 1, next, out);
            continue;
        }
#endif
        if (d != 64)
            for (int i = 0; i < b; ++i)
                block_values(p + i * CHUNK, values, n, d, 1, i ? 0 : next, bf16, out + i * d);
        else if (b == ROW_BLOCK) block_values(p, values, n, 64, ROW_BLOCK, next, bf16, out);
        else if (b == 2) block_values(p, values, n, 64, 2, next, bf16, out);
        else block_values(p, values, n, 64, 1, next, bf16, out);
    }
}

static void chunk_rows_float(const float *q, int64_t h, int64_t g, int64_t r0, int64_t rows, int64_t d,
                             const char *k, const char *v, int64_t slot_stride, const int64_t *slots, int64_t s0,
                             int64_t n, float scale, int64_t head, int64_t ahead, float *scores, struct part *parts,
                             float *o) {
    chunk_rows_vector(q, h, g, r0, rows, d, k, v, slot_stride, slots, s0, n, scale, head, ahead, 0, scores, parts, o);
}

static void chunk_rows_bf16(const float *q, int64_t h, int64_t g, int64_t r0, int64_t rows, int64_t d,
                            const char *k, const char *v, int64_t slot_stride, const int64_t *slots, int64_t s0,
                            int64_t n, float scale, int64_t head, int64_t ahead, float *scores, struct part *parts,
                            float *o) {
    chunk_rows_vector(q, h, g, r0, rows, d, k, v, slot_stride, slots, s0, n, scale, head, ahead, 1, scores, parts, o);
}
#endif

/* Task: query rows [r0, r0 + rows) of KV head `head` (row r: token r / g, query head head * g + r % g) over n <=
   CHUNK cached slots that all of them see, SLOT(slots, s0, j) for j < n. Writes each row's maximum score and sum
   of exp(score - maximum) to parts[r - r0] and its exp-weighted sum of values to o[(r - r0) * d]. k and v: the
   head's first key and value, of the cache's kind (KV_REAL, KV_BF16, KV_Q8; q8: the queries as q8_queries_of made
   them); slot_stride and `ahead` count its elements (a q8 cache's: bytes). */
static void chunk_task(const real *q, const void *q8, int64_t h, int64_t g, int64_t r0, int64_t rows, int64_t d,
                       const char *k, const char *v, int kind, int64_t slot_stride, const int64_t *slots, int64_t s0,
                       int64_t n, real scale, int64_t head, int64_t ahead, real *scores, struct part *parts, real *o) {
#ifndef TS_DOUBLE
    if (kind == KV_Q8) {
        q8_chunk(q8, h, g, r0, rows, d, k, v, slot_stride, slots, s0, n, head, ahead, scores, parts, o);
        return;
    }
#else
    (void)q8;
#endif
    const int bf16 = kind == KV_BF16;
#ifdef AT_AVX2
    if (d % 8 == 0 && d <= 128) {
        (bf16 ? chunk_rows_bf16 : chunk_rows_float)(q, h, g, r0, rows, d, k, v, slot_stride, slots, s0, n, scale,
                                                    head, ahead * (bf16 ? 2 : 4), scores, parts, o);
        return;
    }
#endif
    (void)ahead;  /* the portable loops leave the next chunk to the hardware prefetcher */
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t row_id = r0 + r;
        const real *qr = q + ((row_id / g) * h + head * g + row_id % g) * d;
        real *row = scores + r * CHUNK;
        const int64_t size = bf16 ? 2 : (int64_t)sizeof(real);
        const int64_t fours = d % 8 == 0 ? n / 4 * 4 : 0;
        int64_t j = 0;
        for (; j < fours; j += 4) {
            const char *four[4];
            for (int u = 0; u < 4; ++u) four[u] = k + SLOT(slots, s0, j + u) * slot_stride * size;
#ifdef AT_EXP4
            if (!bf16) {
                dot4_pd(qr, four, d, scale, row + j);
                continue;
            }
#endif
            dot4(qr, four, d, bf16, scale, row + j);
        }
        for (; j < n; ++j) row[j] = scale * dot(qr, k + SLOT(slots, s0, j) * slot_stride * size, d, bf16);
        parts[r] = exponentiate(row, n);
        weighted_values(row, v, slots, s0, n, d, slot_stride * size, bf16, o + r * d);
    }
}

/* 1 where a compact cache's scores take vdpbf16ps (AT_DOT_BF16) in this build, else 0. */
int attention_dot_bf16(void) {
#ifdef AT_DOT_BF16
    return 1;
#else
    return 0;
#endif
}

/* The bytes of a cache element: a real (KV_REAL), a bf16 (KV_BF16) or, in a q8 row, a byte (KV_Q8). */
static int64_t element_bytes(int kind) {
    return kind == KV_BF16 ? 2 : (kind == KV_Q8 ? 1 : (int64_t)sizeof(real));
}

/* Where attend_rows keeps the result of row r's c-th chunk (KV head `head`): its whole chunks first, task by
   task, all rows each; then each token's own chunks, (head, token, chunk) by (head, token, chunk), g rows each. */
static int64_t result_at(int64_t c, int64_t head, int64_t r, int64_t whole, int64_t rows, int64_t common, int64_t t,
                         int64_t most, int64_t g) {
    if (c < whole)
        return (head * whole + c) * rows + r;
    return common * rows + ((head * t + r / g) * most + c - whole) * g + r % g;
}

/* out[t, h * d] = softmax(scale * q k^T) v for q [t, h, d] (contiguous) over the slots each token sees: all of
   [0, shared), then its own slots tail[i * tail_width + j] for j < tail_count[i], ascending and >= shared. k and
   v's element (head, slot, i) is at head * head_stride + slot * slot_stride + i, of the cache's `kind`: a real, a
   bf16, or byte i of a q8 row (kv_q8.h: strides in bytes);
   every token sees at least one slot. kv_heads divides h (GQA: query head i reads KV head i / (h / kv_heads)).
   Returns 0, or -1 when out of memory. */
int attend_rows(const real *q, int64_t t, int64_t h, int64_t kv_heads, int64_t d, const void *k, const void *v,
                int kind, int64_t head_stride, int64_t slot_stride, int64_t shared, const int64_t *tail,
                const int64_t *tail_count, int64_t tail_width, real scale, real *out, int threads) {
    /* Whole chunks of [0, shared) for all rows; from c0 on, each token's slots: [c0, shared) and then its tail. */
    const int64_t g = h / kv_heads, rows = g * t, c0 = shared / CHUNK * CHUNK, whole = c0 / CHUNK;
    const int64_t lead = shared - c0;
    int64_t most = 0;  /* chunks of the longest token's own part */
    for (int64_t i = 0; i < t; ++i) {
        const int64_t chunks = (lead + tail_count[i] + CHUNK - 1) / CHUNK;
        most = chunks > most ? chunks : most;
    }
    const int64_t common = kv_heads * whole, own = kv_heads * t * most;
    const int64_t head_bytes = head_stride * element_bytes(kind);
    const char *keys = k, *values = v;
    struct part *parts = malloc((size_t)(common * rows + own * g) * sizeof(struct part));
    real *o = malloc((size_t)((common * rows + own * g) * d) * sizeof(real));
    real *scores = malloc((size_t)(threads * rows * CHUNK) * sizeof(real));
    const void *q8 = NULL;
#ifndef TS_DOUBLE
    struct q8_queries queries = {NULL, NULL, NULL};
    if (kind == KV_Q8 && parts && o && scores) {
        if (q8_queries_of(q, t * h, d, scale, &queries)) {
            free(parts); free(o); free(scores);
            return -1;
        }
        q8 = &queries;
    }
#endif
    if (!parts || !o || !scores) {
        free(parts); free(o); free(scores);
        return -1;
    }
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && common + own > 1)
    for (int64_t task = 0; task < common + own; ++task) {
        int me = 0;
#ifdef _OPENMP
        me = omp_get_thread_num();
#endif
        real *scratch = scores + me * rows * CHUNK;
        if (task < common) {  /* (head, whole chunk): every row */
            const int64_t head = task / whole, c = task % whole;
            const int64_t ahead = c + 1 < whole ? CHUNK * slot_stride : 0;  /* the next chunk, to prefetch */
            chunk_task(q, q8, h, g, 0, rows, d, keys + head * head_bytes, values + head * head_bytes, kind, slot_stride,
                       NULL, c * CHUNK, CHUNK, scale, head, ahead, scratch, parts + task * rows, o + task * rows * d);
            continue;
        }
        const int64_t x = task - common, head = x / (t * most), i = x / most % t, c = x % most;
        const int64_t len = lead + tail_count[i];  /* (head, token, chunk of its own slots): its g rows */
        if (c * CHUNK >= len)
            continue;
        const int64_t n = len - c * CHUNK < CHUNK ? len - c * CHUNK : CHUNK;
        int64_t slots[CHUNK];
        for (int64_t j = 0; j < n; ++j) {
            const int64_t at = c * CHUNK + j;
            slots[j] = at < lead ? c0 + at : tail[i * tail_width + at - lead];
        }
        chunk_task(q, q8, h, g, i * g, g, d, keys + head * head_bytes, values + head * head_bytes, kind, slot_stride,
                   slots, 0, n, scale, head, 0, scratch, parts + common * rows + x * g, o + (common * rows + x * g) * d);
    }
    for (int64_t head = 0; head < kv_heads; ++head) {
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = r / g, chunks = whole + (lead + tail_count[i] + CHUNK - 1) / CHUNK;
            real max = -INFINITY, sum = 0.0;
            for (int64_t c = 0; c < chunks; ++c)
                max = FMAX(max, parts[result_at(c, head, r, whole, rows, common, t, most, g)].max);
            real *y = out + (i * h + head * g + r % g) * d;
            memset(y, 0, (size_t)d * sizeof(real));
            for (int64_t c = 0; c < chunks; ++c) {
                const int64_t at = result_at(c, head, r, whole, rows, common, t, most, g);
                const real w = EXP(parts[at].max - max), *oc = o + at * d;
                sum += w * parts[at].sum;
                for (int64_t j = 0; j < d; ++j) y[j] += w * oc[j];
            }
            const real inv = sum > 0.0 ? 1.0 / sum : 0.0;
            for (int64_t j = 0; j < d; ++j) y[j] *= inv;
        }
    }
    free(parts); free(o); free(scores);
#ifndef TS_DOUBLE
    q8_queries_free(&queries);
#endif
    return 0;
}
