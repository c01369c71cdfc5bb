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
   reads its own window.) */
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
/* The cache slot of a chunk's j-th key: slots[j], or s0 + j for a contiguous chunk (slots NULL). */
#define SLOT(slots, s0, j) ((slots) ? (slots)[j] : (s0) + (j))

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

/* scores[j] = scale * q . k[slot j] for the chunk's n slots, eight at a time (the last eight re-read the chunk's
   last slot in place of slots past n, and write up to the next multiple of 8): every slot's sum takes the same
   order, wherever n falls. */
INLINE void row_scores(const float *q, const float *k, int64_t slot_stride, const int64_t *slots, int64_t s0,
                       int64_t n, int64_t d, float scale, float *scores) {
    for (int64_t j = 0; j < n; j += 8) {
        const float *keys[8];
        for (int u = 0; u < 8; ++u) keys[u] = k + SLOT(slots, s0, j + u < n ? j + u : n - 1) * slot_stride;
        __m256 acc[8];
        for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
        for (int64_t i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys[u] + i), acc[u]);
        }
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale)));
    }
}

/* o[0, d) = sum over the chunk's n slots of p[j] * v[slot j], in order, the sums in registers (d <= 128). */
INLINE void row_values(const float *p, const float *v, int64_t slot_stride, const int64_t *slots, int64_t s0,
                       int64_t n, int64_t d, float *o) {
    __m256 acc[16];
    for (int64_t i = 0; i < d / 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
        const float w = p[j];
        if (w == 0.0f) continue;  /* underflowed */
        const __m256 wv = _mm256_set1_ps(w);
        const float *value = v + SLOT(slots, s0, j) * slot_stride;
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
/* chunk_task's rows where d % 8 == 0 and d <= 128: every score and numerator in whole vectors (the slots past n,
   up to the next multiple of 8, are -inf: exp 0), in the order of the scalar tail loops they replace. */
static void chunk_rows_vector(const float *q, int64_t h, int64_t g, int64_t r0, int64_t rows, int64_t d,
                              const float *k, const float *v, int64_t slot_stride, const int64_t *slots, int64_t s0,
                              int64_t n, float scale, int64_t head, float *scores, struct part *parts, float *o) {
    const int64_t padded = (n + 7) / 8 * 8;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t row_id = r0 + r;
        const float *qr = q + ((row_id / g) * h + head * g + row_id % g) * d;
        float *row = scores + r * CHUNK;
        if (d == 64) row_scores(qr, k, slot_stride, slots, s0, n, 64, scale, row);
        else row_scores(qr, k, slot_stride, slots, s0, n, d, scale, row);
        for (int64_t j = n; j < padded; ++j) row[j] = -INFINITY;
        __m256 top = _mm256_set1_ps(-INFINITY);
        for (int64_t j = 0; j < padded; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(row + j));
        float lanes[8], max = -INFINITY, sum = 0.0f;
        _mm256_storeu_ps(lanes, top);
        for (int u = 0; u < 8; ++u) max = lanes[u] > max ? lanes[u] : max;
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
        if (d == 64) row_values(row, v, slot_stride, slots, s0, n, 64, o + r * d);
        else row_values(row, v, slot_stride, slots, s0, n, d, o + r * d);
    }
}
#endif

/* Task: query rows [r0, r0 + rows) of KV head `head` (row r: token r / g, query head head * g + r % g) over n <=
   CHUNK cached slots that all of them see, SLOT(slots, s0, j) for j < n. Writes each row's maximum score and sum
   of exp(score - maximum) to parts[r - r0] and its exp-weighted sum of values to o[(r - r0) * d]. */
static void chunk_task(const real *q, int64_t h, int64_t g, int64_t r0, int64_t rows, int64_t d, const real *k,
                       const real *v, int64_t slot_stride, const int64_t *slots, int64_t s0, int64_t n, real scale,
                       int64_t head, real *scores, struct part *parts, real *o) {
#ifdef AT_AVX2
    if (d % 8 == 0 && d <= 128) {
        chunk_rows_vector(q, h, g, r0, rows, d, k, v, slot_stride, slots, s0, n, scale, head, scores, parts, o);
        return;
    }
#endif
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t row_id = r0 + r;
        const real *qr = q + ((row_id / g) * h + head * g + row_id % g) * d;
        real *row = scores + r * CHUNK;
        for (int64_t j = 0; j < n; ++j) row[j] = scale * dot(qr, k + SLOT(slots, s0, j) * slot_stride, d);
        parts[r] = exponentiate(row, n);
        real *out = o + r * d;
        memset(out, 0, (size_t)d * sizeof(real));
        for (int64_t j = 0; j < n; ++j) {
            if (row[j] == 0.0) continue;
            const real *value = v + SLOT(slots, s0, j) * slot_stride;
            for (int64_t i = 0; i < d; ++i) out[i] += row[j] * value[i];
        }
    }
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
   v's element (head, slot, i) is at head * head_stride + slot * slot_stride + i; every token sees at least one
   slot. kv_heads divides h (GQA: query head i reads KV head i / (h / kv_heads)). Returns 0, or -1 when out of
   memory. */
int attend_rows(const real *q, int64_t t, int64_t h, int64_t kv_heads, int64_t d, const real *k, const real *v,
                int64_t head_stride, int64_t slot_stride, int64_t shared, const int64_t *tail,
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
    struct part *parts = malloc((size_t)(common * rows + own * g) * sizeof(struct part));
    real *o = malloc((size_t)((common * rows + own * g) * d) * sizeof(real));
    real *scores = malloc((size_t)(threads * rows * CHUNK) * sizeof(real));
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
            chunk_task(q, h, g, 0, rows, d, k + head * head_stride, v + head * head_stride, slot_stride, NULL,
                       c * CHUNK, CHUNK, scale, head, scratch, parts + task * rows, o + task * rows * d);
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
        chunk_task(q, h, g, i * g, g, d, k + head * head_stride, v + head * head_stride, slot_stride, slots, 0, n,
                   scale, head, scratch, parts + common * rows + x * g, o + (common * rows + x * g) * d);
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
    return 0;
}
