/* The parts of a chunk's attention that attention_kernel.c (float32 and bf16 caches) and attention_q8.c (q8 rows)
   share: the chunk, the row blocks, the vector sums, the prefetch and (max, sum); and the float caches' exp and a
   row's softmax numerators.
   Included after real.h and, where TS_AVX2, immintrin.h with AT_AVX2 defined; in a float64 build with AVX2 and FMA,
   immintrin.h with AT_EXP4 (the float64 scores' largest and exp, here; their sums, attention_f64.h). */
#ifndef TOKENSWIFT_ATTENTION_PARTS_H
#define TOKENSWIFT_ATTENTION_PARTS_H
/* A chunk's keys and values (8 KiB each in bf16 at head_dim 64) stay in L1 for all the rows. 128 ran a 2-row q8
   pass at 7.7K 4% faster, but a q8 chunk's weights are 8 bits of its largest (attention_q8.c): over twice the
   slots, more of them round to nothing, and the outputs moved twice as far from attention over the rows. */
#define CHUNK 64
/* The cache slot of a chunk's j-th key: slots[j], or s0 + j for a contiguous chunk (slots NULL). */
#define SLOT(slots, s0, j) ((slots) ? (slots)[j] : (s0) + (j))

#ifdef AT_AVX2
/* Rows per block of the vector path: a block's keys and values are loaded once for all its rows. Three rows (a
   token's query heads under one KV head at the default model's g = 3) keep their 24 accumulators in the 32 vector
   registers of AVX-512VL; AVX2's 16 take one row at a time. Blocking changes no row's sums: each runs the same
   operations in the same order whatever the rows beside it. */
#ifdef __AVX512VL__
#define ROW_BLOCK 3
#else
#define ROW_BLOCK 1
#endif
#define MAX_GROUP 3  /* the most rows a block takes anywhere (its arrays), ROW_BLOCK here */

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

/* Asks for the `bytes` at x (a key or value of the next chunk) in L2; in L1 they would evict the chunk at work.
   The hardware prefetcher stops at every 4 KiB page (16 slots of a head at d = 64): without this a plain step at
   a 7K context spent a third of its attention waiting for memory, and a verify batch's extra rows could not hide
   under the reads. */
INLINE void prefetch_row(const char *x, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(x + i, _MM_HINT_T1);
}
#endif

struct part { real max, sum; };

#ifdef AT_EXP4
/* exp(x) for x <= 0 in four float64 lanes: Cephes' exp (e^r = 1 + 2 r P(r^2) / (Q(r^2) - r P(r^2)) for |r| <= ln 2 / 2,
   within 2 ulp of libm's), 0 below -708 and for -inf: there 2^n, built from its exponent bits, would leave the normal
   doubles, and such a score's weight is under 3.3e-308 of its chunk's largest (1). A NaN stays NaN (max_pd returns its
   second operand for one). libm's exp, one call a score, took a tenth of the float64 exactness tests' time. */
static inline __m256d exp4_nonpositive(__m256d x) {
    const __m256d vanishes = _mm256_cmp_pd(x, _mm256_set1_pd(-708.0), _CMP_LT_OQ);
    x = _mm256_max_pd(_mm256_set1_pd(-708.0), x);
    const __m256d n = _mm256_floor_pd(_mm256_fmadd_pd(x, _mm256_set1_pd(1.4426950408889634073599),
                                                      _mm256_set1_pd(0.5)));
    x = _mm256_fnmadd_pd(n, _mm256_set1_pd(6.93145751953125e-1), x);
    x = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.42860682030941723212e-6), x);
    const __m256d xx = _mm256_mul_pd(x, x);
    __m256d p = _mm256_fmadd_pd(_mm256_set1_pd(1.26177193074810590878e-4), xx,
                                _mm256_set1_pd(3.02994407707441961300e-2));
    p = _mm256_mul_pd(x, _mm256_fmadd_pd(p, xx, _mm256_set1_pd(9.99999999999999999910e-1)));
    __m256d q = _mm256_fmadd_pd(_mm256_set1_pd(3.00198505138664455042e-6), xx,
                                _mm256_set1_pd(2.52448340349684104192e-3));
    q = _mm256_fmadd_pd(q, xx, _mm256_set1_pd(2.27265548208155028766e-1));
    q = _mm256_fmadd_pd(q, xx, _mm256_set1_pd(2.00000000000000000009e0));
    const __m256d e = _mm256_fmadd_pd(_mm256_set1_pd(2.0), _mm256_div_pd(p, _mm256_sub_pd(q, p)),
                                      _mm256_set1_pd(1.0));
    /* 2^n for n >= -1021 (x >= -708): a normal double built from its exponent bits. */
    const __m256i bits = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n)),
                                                            _mm256_set1_epi64x(1023)), 52);
    return _mm256_andnot_pd(vanishes, _mm256_mul_pd(e, _mm256_castsi256_pd(bits)));
}
#endif

/* One query row's softmax numerators over a chunk, in place, where d does not fit chunk_rows_vector: scores ->
   exp(score - max); returns (max, sum). */
static inline struct part exponentiate(real *row, int64_t n) {
    real max = -INFINITY, sum = 0.0;
#ifndef AT_EXP4
    for (int64_t j = 0; j < n; ++j) max = row[j] > max ? row[j] : max;
#endif
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
#elif defined(AT_EXP4)
    /* Four at a time, the slots past n padded with -inf (exp 0; a chunk's row has CHUNK slots, a multiple of four):
       each slot takes the same lane and order whatever the chunk's length. */
    const int64_t padded = (n + 3) / 4 * 4;
    for (int64_t j = n; j < padded; ++j) row[j] = -INFINITY;
    /* The largest in four lanes (max_pd, like the scalar loop, keeps its second operand where one is NaN): the
       scalar loop's value (where the largest is a zero, perhaps its other sign, which exp(score - max) does not see),
       without its chain of compares. */
    __m256d largest = _mm256_set1_pd(-INFINITY);
    for (int64_t j = 0; j < padded; j += 4) largest = _mm256_max_pd(_mm256_loadu_pd(row + j), largest);
    double tops[4];
    _mm256_storeu_pd(tops, largest);
    for (int u = 0; u < 4; ++u) max = tops[u] > max ? tops[u] : max;
    __m256d total = _mm256_setzero_pd();
    const __m256d top = _mm256_set1_pd(max);
    for (int64_t j = 0; j < padded; j += 4) {
        const __m256d e = exp4_nonpositive(_mm256_sub_pd(_mm256_loadu_pd(row + j), top));
        _mm256_storeu_pd(row + j, e);
        total = _mm256_add_pd(total, e);
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, total);
    for (int u = 0; u < 4; ++u) sum += lanes[u];
#else
    for (int64_t j = 0; j < n; ++j) {
        row[j] = EXP(row[j] - max);
        sum += row[j];
    }
#endif
    return (struct part){max, sum};
}

#ifdef AT_AVX2
/* A row's softmax numerators over its padded scores (the slots past n are -inf: exp 0), in place, in whole vectors
   (the sum in eight lanes of every eighth slot, then the lanes in order); returns (max, sum). attention_q8.c's
   block_weights runs the same loops for a block's rows side by side, with its own exp. */
static inline struct part exponentiate_vector(float *row, int64_t padded) {
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
    return (struct part){max, sum};
}
#endif
#ifndef TS_DOUBLE
/* attend_rows' query rows over a q8 cache, quantized once for every chunk (attention_q8.c): row i's integers at
   integers + i * d, a[i] = its scale times the attention's, bias[i] = Q8_KEY_BIAS times the integers' sum. */
struct q8_queries { int8_t *integers; float *a; int32_t *bias; };

int q8_queries_of(const float *q, int64_t rows, int64_t d, float scale, struct q8_queries *out);
void q8_queries_free(struct q8_queries *queries);
void q8_chunk(const struct q8_queries *queries, int64_t h, int64_t g, int64_t r0, int64_t rows, int64_t d,
              const char *k, const char *v, int64_t slot_stride, const int64_t *slots, int64_t s0, int64_t n,
              int64_t head, int64_t ahead, float *scores, struct part *parts, float *o);
#endif
#endif
