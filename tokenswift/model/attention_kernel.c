/* Attention of a few query rows (a decoding step, a draft pass, a verify batch) over the KV cache (real.h).

   torch's CPU flash-attention kernel treats these rows as a tiny GEMM per KV block and reached a third of this
   machine's memory bandwidth on a 2K-token cache (0.66 ms a layer for 3 MB of keys and values). Here each KV head
   reads its keys and values once for all the query heads of its group and all the rows: each cached slot's key
   is loaded once and dotted with every query, each value once and added to every output.

   The slots are cut into chunks of CHUNK; a (KV head, chunk) pair is one task with its own running maximum, sum
   and output per query (flash-decoding), and the tasks are merged in chunk order. The chunks depend on the slot
   only, so a row's result does not depend on how many rows share the call nor on the thread count. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "real.h"
#ifdef TS_AVX2
#include <immintrin.h>
#define AT_AVX2 1
#endif

#define CHUNK 64  /* a chunk's keys and values (16 KiB each at head_dim 64) stay in L1 for all the rows */

#ifdef AT_AVX2
#define INLINE static inline __attribute__((always_inline))

/* The eight sums of eight vectors' lanes, [sum(v[0]), ..., sum(v[7])]. */
INLINE __m256 hsum8(const __m256 *v) {
    const __m256 s01 = _mm256_hadd_ps(v[0], v[1]), s23 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 s45 = _mm256_hadd_ps(v[4], v[5]), s67 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

/* exp(x) for x <= 0 (Cephes' polynomial, as in avx_mathfun: about 1 ulp), exactly 0 for x = -inf. */
INLINE __m256 exp_nonpositive(__m256 x) {
    const __m256 masked = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(masked, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

/* scores[j - s0] = scale * q . k[j] for the slots [s0, s1), eight slots at a time (the last eight re-read the chunk's
   last slot in place of slots past s1, and write up to the next multiple of 8): every slot's sum takes the same
   order, wherever s1 falls. */
INLINE void row_scores(const float *q, const float *k, int64_t slot_stride, int64_t s0, int64_t s1, int64_t d,
                       float scale, float *scores) {
    for (int64_t j = s0; j < s1; j += 8) {
        const float *keys[8];
        for (int u = 0; u < 8; ++u) keys[u] = k + (j + u < s1 ? j + u : s1 - 1) * slot_stride;
        __m256 acc[8];
        for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
        for (int64_t i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys[u] + i), acc[u]);
        }
        _mm256_storeu_ps(scores + j - s0, _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale)));
    }
}

/* o[0, d) = sum over the slots [s0, s1) of p[j - s0] * v[j], in slot order, the sums in registers (d <= 128). */
INLINE void row_values(const float *p, const float *v, int64_t slot_stride, int64_t s0, int64_t s1, int64_t d,
                       float *o) {
    __m256 acc[16];
    for (int64_t i = 0; i < d / 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = s0; j < s1; ++j) {
        const float w = p[j - s0];
        if (w == 0.0f) continue;  /* masked */
        const __m256 wv = _mm256_set1_ps(w);
        const float *value = v + j * slot_stride;
        for (int64_t i = 0; i < d / 8; ++i) acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(value + 8 * i), acc[i]);
    }
    for (int64_t i = 0; i < d / 8; ++i) _mm256_storeu_ps(o + 8 * i, acc[i]);
}
#endif

static real dot(const real *a, const real *b, int64_t d) {
    real sum = 0.0;
    for (int64_t i = 0; i < d; ++i) sum += a[i] * b[i];
    return sum;
}

struct part { real max, sum; };

/* One query row's softmax numerators over a chunk, in place, where d does not fit chunk_rows_vector: scores ->
   exp(score - max); returns (max, sum). */
static struct part exponentiate(real *row, int64_t n) {
    real max = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < n; ++j) max = row[j] > max ? row[j] : max;
    if (max == -INFINITY) {  /* a chunk this row sees none of */
        memset(row, 0, (size_t)n * sizeof(real));
        return (struct part){max, 0.0};
    }
#ifdef AT_AVX2
    /* Eight at a time, the last eight padded with -inf (exp 0): each slot takes the same lane and order whatever
       the chunk's length. */
    __m256 total = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 8) {
        float lanes[8];
        for (int u = 0; u < 8; ++u) lanes[u] = j + u < n ? row[j + u] : -INFINITY;
        const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(lanes), _mm256_set1_ps(max)));
        _mm256_storeu_ps(lanes, e);
        for (int u = 0; u < 8 && j + u < n; ++u) row[j + u] = lanes[u];
        total = _mm256_add_ps(total, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, total);
    for (int u = 0; u < 8; ++u) sum += lanes[u];
#else
    for (int64_t j = 0; j < n; ++j) {
        row[j] = EXP(row[j] - max);
        sum += row[j];
    }
#endif
    return (struct part){max, sum};
}

#ifdef AT_AVX2
/* chunk_task's rows where d % 8 == 0 and d <= 128: every score and numerator in whole vectors (the slots past s1,
   up to the chunk's next multiple of 8, are -inf: exp 0), in the order of the scalar tail loops they replace. */
static void chunk_rows_vector(const float *q, int64_t h, int64_t g, int64_t rows, int64_t d, const float *k,
                              const float *v, int64_t slot_stride, int64_t s, int64_t s0, int64_t s1,
                              const uint8_t *mask, float scale, int64_t head, float *scores, struct part *parts,
                              float *o) {
    const int64_t n = s1 - s0, padded = (n + 7) / 8 * 8;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r / g;
        const float *qr = q + (t * h + head * g + r % g) * d;
        float *row = scores + r * CHUNK;
        if (d == 64) row_scores(qr, k, slot_stride, s0, s1, 64, scale, row);
        else row_scores(qr, k, slot_stride, s0, s1, d, scale, row);
        for (int64_t j = n; j < padded; ++j) row[j] = -INFINITY;
        if (mask)
            for (int64_t j = s0; j < s1; ++j)
                if (!mask[t * s + j]) row[j - s0] = -INFINITY;
        __m256 top = _mm256_set1_ps(-INFINITY);
        for (int64_t j = 0; j < padded; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(row + j));
        float lanes[8], max = -INFINITY, sum = 0.0f;
        _mm256_storeu_ps(lanes, top);
        for (int u = 0; u < 8; ++u) max = lanes[u] > max ? lanes[u] : max;
        if (max == -INFINITY) {  /* a chunk this row sees none of */
            parts[r] = (struct part){max, 0.0f};
            memset(o + r * d, 0, (size_t)d * sizeof(float));
            continue;
        }
        __m256 total = _mm256_setzero_ps();
        const __m256 maxv = _mm256_set1_ps(max);
        for (int64_t j = 0; j < padded; j += 8) {
            const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + j), maxv));
            _mm256_storeu_ps(row + j, e);
            total = _mm256_add_ps(total, e);
        }
        _mm256_storeu_ps(lanes, total);
        for (int u = 0; u < 8; ++u) sum += lanes[u];
        parts[r] = (struct part){max, sum};
        if (d == 64) row_values(row, v, slot_stride, s0, s1, 64, o + r * d);
        else row_values(row, v, slot_stride, s0, s1, d, o + r * d);
    }
}
#endif

/* Task (head, chunk): slots [s0, s1) for the rows query rows of KV head `head` (row r = token r / g, query head
   head * g + r % g). Writes each row's maximum score and sum of exp(score - maximum) to parts[r] and its
   exp-weighted sum of values to o[r * d]. */
static void chunk_task(const real *q, int64_t h, int64_t g, int64_t rows, int64_t d, const real *k,
                       const real *v, int64_t slot_stride, int64_t s, int64_t s0, int64_t s1, const uint8_t *mask,
                       real scale, int64_t head, real *scores, struct part *parts, real *o) {
#ifdef AT_AVX2
    if (d % 8 == 0 && d <= 128) {
        chunk_rows_vector(q, h, g, rows, d, k, v, slot_stride, s, s0, s1, mask, scale, head, scores, parts, o);
        return;
    }
#endif
    const int64_t n = s1 - s0;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r / g;
        const real *qr = q + (t * h + head * g + r % g) * d;
        real *row = scores + r * CHUNK;
        for (int64_t j = s0; j < s1; ++j) row[j - s0] = scale * dot(qr, k + j * slot_stride, d);
        if (mask)
            for (int64_t j = s0; j < s1; ++j)
                if (!mask[t * s + j]) row[j - s0] = -INFINITY;
        parts[r] = exponentiate(row, n);
        real *out = o + r * d;
        memset(out, 0, (size_t)d * sizeof(real));
        for (int64_t j = s0; j < s1; ++j) {
            if (row[j - s0] == 0.0) continue;
            for (int64_t i = 0; i < d; ++i) out[i] += row[j - s0] * v[j * slot_stride + i];
        }
    }
}

/* out[t, h * d] = softmax(scale * q k^T + mask) v for q [t, h, d] (contiguous) over slots [0, s) of k and v, whose
   element (head, slot, i) is at head * head_stride + slot * slot_stride + i. mask: NULL (every row sees every slot)
   or [t, s] bytes, nonzero = visible; every row must see at least one slot. kv_heads divides h (GQA: query head
   i reads KV head i / (h / kv_heads)). Returns 0, or -1 when out of memory. */
int attend_rows(const real *q, int64_t t, int64_t h, int64_t kv_heads, int64_t d, const real *k, const real *v,
                int64_t head_stride, int64_t slot_stride, int64_t s, const uint8_t *mask, real scale, real *out,
                int threads) {
    const int64_t g = h / kv_heads, rows = g * t, chunks = (s + CHUNK - 1) / CHUNK, tasks = kv_heads * chunks;
    struct part *parts = malloc((size_t)(tasks * rows) * sizeof(struct part));
    real *o = malloc((size_t)(tasks * rows * d) * sizeof(real));
    real *scores = malloc((size_t)(threads * rows * CHUNK) * sizeof(real));
    if (!parts || !o || !scores) {
        free(parts); free(o); free(scores);
        return -1;
    }
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && tasks > 1)
    for (int64_t task = 0; task < tasks; ++task) {
        int me = 0;
#ifdef _OPENMP
        me = omp_get_thread_num();
#endif
        const int64_t head = task / chunks, s0 = task % chunks * CHUNK, s1 = s0 + CHUNK < s ? s0 + CHUNK : s;
        chunk_task(q, h, g, rows, d, k + head * head_stride, v + head * head_stride, slot_stride, s, s0, s1, mask,
                   scale, head, scores + me * rows * CHUNK, parts + task * rows, o + task * rows * d);
    }
    for (int64_t head = 0; head < kv_heads; ++head) {
        for (int64_t r = 0; r < rows; ++r) {
            real max = -INFINITY, sum = 0.0;
            for (int64_t c = 0; c < chunks; ++c) max = FMAX(max, parts[(head * chunks + c) * rows + r].max);
            real *y = out + ((r / g) * h + head * g + r % g) * d;
            memset(y, 0, (size_t)d * sizeof(real));
            for (int64_t c = 0; c < chunks; ++c) {
                const struct part p = parts[(head * chunks + c) * rows + r];
                if (p.max == -INFINITY) continue;  /* a chunk this row sees none of */
                const real w = EXP(p.max - max);
                const real *oc = o + ((head * chunks + c) * rows + r) * d;
                sum += w * p.sum;
                for (int64_t i = 0; i < d; ++i) y[i] += w * oc[i];
            }
            const real inv = sum > 0.0 ? 1.0 / sum : 0.0;
            for (int64_t i = 0; i < d; ++i) y[i] *= inv;
        }
    }
    free(parts); free(o); free(scores);
    return 0;
}
