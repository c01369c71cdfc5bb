/* Products of the GGUF blocks that K-quant files hold (Q4_K, Q5_K, Q6_K super-blocks of 256, and the legacy Q5_0
   and Q5_1 blocks of 32 that their mixes use where rows are not a multiple of 256) with float32 activations, read
   where the file lies: no copy, no repacking.

   As in llama.cpp, the activations are quantized to int8 (K kinds: one scale per 256 and the sums of each 16,
   which carry the K blocks' minimums and Q6_K's -32; Q5_x: quant_kernels.c's blocks of 32), so a super-block's
   products are integer sums that are exact whatever their order, scaled once in float. On AVX-512 VNNI a chunk
   of 64 weights costs one vpmaddubsw and one vpdpwssd (its sub-block scales as 16-bit lanes); elsewhere the same
   arithmetic runs as plain loops. A row of activations is always computed alone, in the same order, so its
   product is the same whatever rows share the call (an autoregressive step versus a verify batch). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "gguf_blocks.h"
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include "simd.h"
#define KQ_VNNI 1
#endif

#define QK 32
#define QK_K 256
#define PACKED 8 /* quant_kernels.c: a packed weight's kind is PACKED + its GGUF kind's */
int kq_packed_products(const uint8_t *w, int64_t n, int64_t k, const int8_t *q, const float *d,
                       const int16_t *bsums, int64_t m, float *y, int64_t ystride, int threads);
enum { KIND_Q5_0 = 3, KIND_Q5_1 = 4, KIND_Q4_K = 5, KIND_Q5_K = 6, KIND_Q6_K = 7 };
static const int64_t BYTES[8] = {0, 0, 0, 22, 24, 144, 176, 210};
static int is_k(int kind) { return kind >= KIND_Q4_K; }

int64_t kq_row_bytes(int kind, int64_t k) { return k / (is_k(kind) ? QK_K : QK) * BYTES[kind]; }

/* The quantized activation rows: q [m, k]; d, one scale per block (of 256, or of 32 for Q5_x); s, Q5_x's d *
   sum(q) per block; bsums, the K kinds' sums of q per 16 [m, k / 16]. */
struct acts {
    int8_t *q;
    float *d, *s;
    int16_t *bsums;
    int64_t k, nb;
};

/* x [k] -> int8 q with one scale per 256 (d = max |x| / 127) and the sums of each 16. */
static void quantize_row_k(const float *x, int64_t k, int8_t *q, float *d, int16_t *bsums) {
    for (int64_t b = 0; b < k / QK_K; ++b) {
        const float *xb = x + b * QK_K;
        float amax = 0.0f;
        for (int i = 0; i < QK_K; ++i) amax = fmaxf(amax, fabsf(xb[i]));
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int g = 0; g < QK_K / 16; ++g) {
            int sum = 0;
            for (int i = g * 16; i < g * 16 + 16; ++i) {
                const int v = (int)nearbyintf(xb[i] * inv);
                q[b * QK_K + i] = (int8_t)v;
                sum += v;
            }
            bsums[b * 16 + g] = (int16_t)sum;
        }
        d[b] = amax / 127.0f;
    }
}

static int quantize(int kind, const float *x, int64_t m, int64_t k, struct acts *a) {
    a->k = k;
    a->nb = k / (is_k(kind) ? QK_K : QK);
    a->q = malloc((size_t)(m * k));
    a->d = malloc((size_t)(m * a->nb) * sizeof(float));
    a->s = is_k(kind) ? NULL : malloc((size_t)(m * a->nb) * sizeof(float));
    a->bsums = is_k(kind) ? malloc((size_t)(m * k / 16) * sizeof(int16_t)) : NULL;
    if (!a->q || !a->d || !(a->s || a->bsums))
        return -1;
    for (int64_t i = 0; i < m; ++i) {
        if (is_k(kind))
            quantize_row_k(x + i * k, k, a->q + i * k, a->d + i * a->nb, a->bsums + i * k / 16);
        else
            qk_quantize_row(x + i * k, k, a->q + i * k, a->d + i * a->nb, a->s + i * a->nb);
    }
    return 0;
}

/* Weight l (0..255) of a super-block as an unsigned integer, and its sub-block's scale index: Q4_K/Q5_K (w = d sc q
   - dmin mn, scale per 32), Q6_K (w = d sc (q - 32), scale per 16). Chunk j of 64 holds its low nibbles, then its
   high ones (Q4_K, Q5_K: bytes 32j..32j+31 of qs; Q6_K: the 128-halves' 64 bytes of ql, low then high nibbles). */
static int k_weight(int kind, const uint8_t *blk, int l) {
    if (kind == KIND_Q6_K) {
        const uint8_t *ql = blk + 64 * (l / 128), *qh = blk + 128 + 32 * (l / 128);
        const int r = l % 128, quarter = r / 32;
        const int low = (ql[r % 64] >> (4 * (r / 64))) & 0x0F;
        return low | ((qh[r % 32] >> (2 * quarter)) & 3) << 4;
    }
    const uint8_t *qs = blk + (kind == KIND_Q5_K ? 48 : 16);
    const int nibble = (qs[32 * (l / 64) + l % 32] >> (4 * ((l / 32) % 2))) & 0x0F;
    return kind == KIND_Q5_K ? nibble | ((blk[16 + l % 32] >> (l / 32)) & 1) << 4 : nibble;
}

#ifndef KQ_VNNI
/* The portable dot products: one weight row (nb blocks) with activation row i. */
static float dot_k_portable(int kind, const uint8_t *row, const struct acts *a, int64_t i) {
    const int8_t *x = a->q + i * a->k;
    const int16_t *bs = a->bsums + i * a->k / 16;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < a->nb; ++b, x += QK_K, bs += 16) {
        const uint8_t *blk = row + b * BYTES[kind];
        int32_t isum = 0, imin = 0;
        if (kind == KIND_Q6_K) {
            const int8_t *sc = (const int8_t *)(blk + 192);
            for (int g = 0; g < 16; ++g) {
                int32_t dot = 0;
                for (int l = 16 * g; l < 16 * g + 16; ++l) dot += k_weight(kind, blk, l) * x[l];
                isum += sc[g] * (dot - 32 * bs[g]);
            }
            acc = fmaf(read_half(blk + 208) * a->d[i * a->nb + b], (float)isum, acc);
            continue;
        }
        uint8_t scm[16];
        scales_mins(blk + 4, scm);
        const uint8_t *sc = scm, *mn = scm + 8;
        for (int s = 0; s < 8; ++s) {
            int32_t dot = 0;
            for (int l = 32 * s; l < 32 * s + 32; ++l) dot += k_weight(kind, blk, l) * x[l];
            isum += sc[s] * dot;
            imin += mn[s] * (bs[2 * s] + bs[2 * s + 1]);
        }
        acc = fmaf(read_half(blk) * a->d[i * a->nb + b], (float)isum, acc);
        accm = fmaf(read_half(blk + 2) * a->d[i * a->nb + b], (float)imin, accm);
    }
    return acc - accm;
}

/* Q5_0 (w = d (q - 16)) and Q5_1 (w = d q + m): 4 bytes of fifth bits, then 16 bytes of nibbles (byte j holds
   weights j and j + 16). */
static float dot_q5_portable(int kind, const uint8_t *row, const struct acts *a, int64_t i) {
    const int8_t *x = a->q + i * a->k;
    const float *d = a->d + i * a->nb, *s = a->s + i * a->nb;
    const int64_t head = kind == KIND_Q5_1 ? 4 : 2;
    float acc = 0.0f, off = 0.0f;
    for (int64_t b = 0; b < a->nb; ++b, x += QK) {
        const uint8_t *blk = row + b * BYTES[kind], *qs = blk + head + 4;
        uint32_t qh;
        memcpy(&qh, blk + head, 4);
        int32_t dot = 0;
        for (int j = 0; j < QK / 2; ++j) {
            dot += ((qs[j] & 0x0F) | ((qh >> j) & 1) << 4) * x[j];
            dot += ((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) * x[j + 16];
        }
        const float wd = read_half(blk), wm = kind == KIND_Q5_1 ? read_half(blk + 2) : -16.0f * wd;
        acc = fmaf(wd * d[b], (float)dot, acc);
        off = fmaf(wm, s[b], off);
    }
    return acc + off;
}
#else
#define INLINE static inline __attribute__((always_inline))
#define TILE 4 /* activation rows per pass over a weight row (the weights unpacked once for them) */

/* 16-bit lane indexes that spread a super-block's scales over a chunk of 64 weights (lane l: weights 2l, 2l + 1 of
   the chunk): Q4_K/Q5_K chunk j takes scale 2j on lanes 0..15 and 2j + 1 on lanes 16..31; Q6_K chunk j scale
   4j + l / 8. */
static const int16_t SPREAD_32[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}};
static const int16_t SPREAD_16[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13, 14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15,
     15, 15, 15, 15}};

INLINE __m512i spread(const int16_t *table) { return _mm512_loadu_si512(table); }

/* The 64 weights of chunk j as bytes, in order: nibbles of 32 bytes, low ones then high ones. */
INLINE __m512i nibbles(const uint8_t *p) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)p);
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
    return _mm512_and_si512(both, _mm512_set1_epi8(0x0F));
}

/* Q4_K and Q5_K: R activation rows (from i) against one weight row. Per super-block and row: four chunks' integer
   sums (maddubs: pairs of u8 weight x s8 activation; dpwssd: times the sub-block's scale, accumulated), one float
   multiply-add of d * dx; the minimums from the activations' sums of 16, apart. */
INLINE void q45k_rows(int kind, const uint8_t *row, const struct acts *a, int64_t i, const int R, float *y,
                      int64_t stride) {
    __m512 acc[TILE];
    __m256 accm[TILE];
    for (int r = 0; r < R; ++r) {
        acc[r] = _mm512_setzero_ps();
        accm[r] = _mm256_setzero_ps();
    }
    const __m256i pair_idx = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *blk = row + b * BYTES[kind];
        uint8_t scm[16];
        scales_mins(blk + 4, scm);
        const __m256i both = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)scm));  /* scales, minimums */
        const __m512i scales = _mm512_castsi256_si512(both);
        const __m256i mins = _mm256_permutexvar_epi16(pair_idx, both);
        __m512i w[4], s[4];
        for (int j = 0; j < 4; ++j) {
            w[j] = nibbles(blk + (kind == KIND_Q5_K ? 48 : 16) + 32 * j);
            s[j] = _mm512_permutexvar_epi16(spread(SPREAD_32[j]), scales);
        }
        if (kind == KIND_Q5_K) {  /* the fifth bits: bit 2j of qh[l] for weight 64j + l, bit 2j + 1 for 64j + 32 + l */
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
            for (int j = 0; j < 4; ++j) {
                const __mmask64 high = (__mmask64)_mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << 2 * j))) |
                    (__mmask64)_mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * j + 1)))) << 32;
                w[j] = _mm512_mask_add_epi8(w[j], high, w[j], _mm512_set1_epi8(16));
            }
        }
        const float wd = read_half(blk), wmin = read_half(blk + 2);
        for (int r = 0; r < R; ++r) {
            const int8_t *x = a->q + (i + r) * a->k + b * QK_K;
            __m512i isum = _mm512_setzero_si512();
            for (int j = 0; j < 4; ++j)
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(w[j], _mm512_loadu_si512(x + 64 * j)), s[j]);
            const float dx = a->d[(i + r) * a->nb + b];
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(wd * dx), _mm512_cvtepi32_ps(isum), acc[r]);
            const __m256i bs = _mm256_loadu_si256((const __m256i *)(a->bsums + (i + r) * a->k / 16 + b * 16));
            const __m256 imin = _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mins));
            accm[r] = _mm256_fmadd_ps(_mm256_set1_ps(wmin * dx), imin, accm[r]);
        }
    }
    for (int r = 0; r < R; ++r) y[r * stride] = _mm512_reduce_add_ps(acc[r]) - hsum(accm[r]);
}

/* Q6_K: R activation rows against one weight row; each 128-half's 64 bytes of low bits (two chunks: low nibbles,
   high nibbles) and 32 of high bits (2 per weight, for the quarters 0..3 of the half at shifts 0, 2, 4, 6). The
   -32 is taken back exactly, as 32 sc times the activations' sums of 16. */
INLINE void q6k_rows(const uint8_t *row, const struct acts *a, int64_t i, const int R, float *y, int64_t stride) {
    __m512 acc[TILE];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const __m512i three = _mm512_set1_epi8(3), low = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *blk = row + b * BYTES[KIND_Q6_K];
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        __m512i w[4], s[4];
        for (int h = 0; h < 2; ++h) {
            const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
            const __m512i q01 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
            const __m512i q23 = _mm512_srli_epi16(q01, 4);
            w[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low), _mm512_slli_epi16(_mm512_and_si512(q01, three), 4));
            w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low),
                                           _mm512_slli_epi16(_mm512_and_si512(q23, three), 4));
        }
        for (int j = 0; j < 4; ++j) s[j] = _mm512_permutexvar_epi16(spread(SPREAD_16[j]), _mm512_castsi256_si512(sc));
        const float wd = read_half(blk + 208);
        for (int r = 0; r < R; ++r) {
            const int8_t *x = a->q + (i + r) * a->k + b * QK_K;
            __m512i isum = _mm512_setzero_si512();
            for (int j = 0; j < 4; ++j)
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(w[j], _mm512_loadu_si512(x + 64 * j)), s[j]);
            const __m256i bs = _mm256_loadu_si256((const __m256i *)(a->bsums + (i + r) * a->k / 16 + b * 16));
            const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc), 5);  /* 32 sum_g sc[g] bsum[g] */
            isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(offset));
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(wd * a->d[(i + r) * a->nb + b]), _mm512_cvtepi32_ps(isum), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) y[r * stride] = _mm512_reduce_add_ps(acc[r]);
}

/* Q5_0 and Q5_1: R activation rows against one weight row, a block of 32 in a 256-bit vector (vpdpbusd), its
   fifth bits added under a mask; the offsets (Q5_0's -16 d, Q5_1's m) times d * sum(q), apart. */
INLINE void q5_rows(int kind, const uint8_t *row, const struct acts *a, int64_t i, const int R, float *y,
                    int64_t stride) {
    const int64_t head = kind == KIND_Q5_1 ? 4 : 2;
    __m256 acc[TILE];
    float off[TILE];
    for (int r = 0; r < R; ++r) {
        acc[r] = _mm256_setzero_ps();
        off[r] = 0.0f;
    }
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *blk = row + b * BYTES[kind];
        uint32_t qh;
        memcpy(&qh, blk + head, 4);
        const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + head + 4));
        __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
        w = _mm256_mask_add_epi8(w, (__mmask32)qh, w, _mm256_set1_epi8(16));
        const float wd = read_half(blk), wm = kind == KIND_Q5_1 ? read_half(blk + 2) : -16.0f * wd;
        for (int r = 0; r < R; ++r) {
            const int64_t at = (i + r) * a->nb + b;
            const __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + at * QK));
            const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd * a->d[at]), _mm256_cvtepi32_ps(dot), acc[r]);
            off[r] = fmaf(wm, a->s[at], off[r]);
        }
    }
    for (int r = 0; r < R; ++r) y[r * stride] = hsum(acc[r]) + off[r];
}

INLINE void rows_of(int kind, const uint8_t *row, const struct acts *a, int64_t i, const int R, float *y,
                    int64_t stride) {
    if (kind == KIND_Q6_K) q6k_rows(row, a, i, R, y, stride);
    else if (is_k(kind)) q45k_rows(kind, row, a, i, R, y, stride);
    else q5_rows(kind, row, a, i, R, y, stride);
}
#endif

/* y[i * ystride + j] = activation row i times weight row j, for weight rows [0, n). */
static void products(int kind, const uint8_t *w, int64_t n, const struct acts *a, int64_t m, float *y,
                     int64_t ystride, int threads) {
    const int64_t row_bytes = a->nb * BYTES[kind];
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t j = 0; j < n; ++j) {
        const uint8_t *row = w + j * row_bytes;
#ifdef KQ_VNNI
        for (int64_t i = 0; i < m; i += TILE) {
            float *yi = y + i * ystride + j;
            switch (m - i) {
            case 1: rows_of(kind, row, a, i, 1, yi, ystride); break;
            case 2: rows_of(kind, row, a, i, 2, yi, ystride); break;
            case 3: rows_of(kind, row, a, i, 3, yi, ystride); break;
            default: rows_of(kind, row, a, i, 4, yi, ystride); break;
            }
        }
#else
        for (int64_t i = 0; i < m; ++i)
            y[i * ystride + j] = is_k(kind) ? dot_k_portable(kind, row, a, i) : dot_q5_portable(kind, row, a, i);
#endif
    }
}

/* y[m, columns [0, n) of rows of ystride] = x[m, k] @ W[n, k].T for W in `kind` blocks, or packed (PACKED + kind).
   Returns 0, or -1 when out of memory. */
int kq_matmul(int kind, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int64_t ystride,
              int threads) {
    const int packed = kind >= PACKED;  /* kquant_packed.c's layout */
    if (packed) kind -= PACKED;
    struct acts a = {0};
    int status = quantize(kind, x, m, k, &a);
    if (status == 0 && packed)
        status = kq_packed_products(w, n, k, a.q, a.d, a.bsums, m, y, ystride, threads);
    else if (status == 0)
        products(kind, w, n, &a, m, y, ystride, threads);
    free(a.q); free(a.d); free(a.s); free(a.bsums);
    return status;
}

/* The first `count` rows of W, dequantized to float32 (the gguf package's arithmetic: d sc, then times q, less
   dmin mn). */
void kq_rows(int kind, const uint8_t *w, int64_t k, int64_t count, float *out) {
    const int64_t per = is_k(kind) ? QK_K : QK, nb = k / per;
    for (int64_t b = 0; b < count * nb; ++b) {
        const uint8_t *blk = w + b * BYTES[kind];
        float *o = out + b * per;
        if (kind == KIND_Q6_K) {
            const float d = read_half(blk + 208);
            const int8_t *sc = (const int8_t *)(blk + 192);
            for (int l = 0; l < QK_K; ++l) o[l] = d * (float)sc[l / 16] * (float)(k_weight(kind, blk, l) - 32);
        } else if (is_k(kind)) {
            uint8_t scm[16];
            scales_mins(blk + 4, scm);
            const float d = read_half(blk), dmin = read_half(blk + 2);
            for (int l = 0; l < QK_K; ++l) {
                const float scale = d * (float)scm[l / 32], shift = dmin * (float)scm[8 + l / 32];
                o[l] = scale * (float)k_weight(kind, blk, l) - shift;
            }
        } else {
            const int64_t head = kind == KIND_Q5_1 ? 4 : 2;
            uint32_t qh;
            memcpy(&qh, blk + head, 4);
            const float d = read_half(blk), m = kind == KIND_Q5_1 ? read_half(blk + 2) : 0.0f;
            for (int j = 0; j < QK; ++j) {
                const int q = ((blk[head + 4 + j % 16] >> (4 * (j / 16))) & 0x0F) | ((qh >> j) & 1) << 4;
                o[j] = kind == KIND_Q5_1 ? d * (float)q + m : d * (float)(q - 16);
            }
        }
    }
}
