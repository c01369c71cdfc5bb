/* Q4_K and Q5_K products on AVX-512 VNNI with the weights repacked sixteen rows a group, as quant_packed.c packs
   the blocks of 32 (q6k_packed.c packs Q6_K's; the products of all three are shared among threads here). A row at
   a time, each super-block's 256 products end in lanes that are scaled and summed apart, ~50 vector operations per
   row and super-block; here each activation byte run is broadcast against sixteen weight rows at once and every
   sum lands one per lane, exact: a sub-block of 32 costs eight vpdpbusd and one 32-bit multiply by its scale for
   sixteen rows. About 8% larger than the file's blocks (Q5_K: 7%).

   A group's super-block: the sixteen rows' d and dmin (float16, 32 bytes each); their eight 6-bit scales as bytes,
   sub-block by sub-block (8 x 16); their minimums as 16-bit pairs (sub-blocks 2p, 2p + 1) for vpdpwssd against the
   activations' sums of 32 (4 x 64 bytes); then, per chunk j of 64 weights, eight runs of 64 bytes, lane r's four
   bytes being its bytes 32j + 4t..32j + 4t + 3 (low nibbles: sub-block 2j, high: 2j + 1), and for Q5_K the fifth
   bits of sub-blocks 2j and 2j + 1 after them, a 64-bit mask per run (bit 4r + c: lane r's byte c), added as 16
   under the mask. Rows past n are zero.

   A group's blocks are read in the order they lie: on this EPYC, reading each super-block's weights before its
   first 448 bytes (the kernel needs the scales and minimums last) ran at half the speed where the copy starts on
   a cache line, as the allocator gives it (a prefetch of those lines first restores the order). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kquant.h"
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define KP_VNNI 1
#endif

#define HEAD 448 /* a Q4_K or Q5_K group's super-block: d, dmin, scales, minimums, then the weights' chunks */

#ifdef KP_VNNI
/* Bytes of a group's super-block, and of a chunk of 64 weights in it (Q5_K: and its fifth bits). */
static int64_t group_bytes(int kind) {
    return kind == KIND_Q4_K ? Q4K_GROUP : kind == KIND_Q5_K ? Q5K_GROUP : kind == KIND_Q6_K ? Q6K_GROUP : 0;
}
#define CHUNK(kind) ((kind) == KIND_Q5_K ? 640 : 512)
#endif

int64_t kq_packed_bytes(int kind, int64_t n, int64_t k) {
#ifdef KP_VNNI
    return (n + KQ_LANES - 1) / KQ_LANES * (k / QK_K) * group_bytes(kind);
#else
    (void)kind; (void)n; (void)k;
    return 0;
#endif
}

#ifdef KP_VNNI
#define LANES KQ_LANES

/* Writes the packed form of a Q4_K, Q5_K or Q6_K weight W ([n, k / 256 super-blocks]) to out (kq_packed_bytes). */
void kq_pack(int kind, const uint8_t *w, int64_t n, int64_t k, uint8_t *out) {
    const int64_t nb = k / QK_K;
    memset(out, 0, (size_t)kq_packed_bytes(kind, n, k));
    if (kind == KIND_Q6_K) {
        q6k_pack(w, n, k, out);
        return;
    }
    for (int64_t g = 0; g * LANES < n; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *blk = out + (g * nb + b) * group_bytes(kind);
            for (int64_t r = 0; r < LANES && g * LANES + r < n; ++r) {
                const uint8_t *src = w + ((g * LANES + r) * nb + b) * KQ_BYTES[kind];
                const uint8_t *qs = src + (kind == KIND_Q5_K ? 48 : 16), *qh = src + 16;
                uint8_t scm[16];
                scales_mins(src + 4, scm);
                memcpy(blk + 2 * r, src, 2);
                memcpy(blk + 32 + 2 * r, src + 2, 2);
                for (int s = 0; s < 8; ++s) blk[64 + 16 * s + r] = scm[s];
                for (int p = 0; p < 4; ++p) {
                    const int16_t pair[2] = {scm[8 + 2 * p], scm[9 + 2 * p]};
                    memcpy(blk + 192 + 64 * p + 4 * r, pair, 4);
                }
                for (int j = 0; j < 4; ++j)
                    for (int t = 0; t < 8; ++t) {
                        uint8_t *chunk = blk + HEAD + CHUNK(kind) * j;
                        memcpy(chunk + 64 * t + 4 * r, qs + 32 * j + 4 * t, 4);
                        for (int c = 0; kind == KIND_Q5_K && c < 4; ++c)  /* bit s of qh[l]: weight 32s + l's */
                            for (int half = 0; half < 2; ++half)
                                chunk[512 + 64 * half + 8 * t + r / 2] |=
                                    (uint8_t)(((qh[4 * t + c] >> (2 * j + half)) & 1) << (4 * (r % 2) + c));
                    }
            }
        }
}

#define INLINE static inline __attribute__((always_inline))
#define TILE KQ_TILE

/* The exact sums of one sub-block's eight runs w with an activation row's 32 bytes x, per lane. */
INLINE __m512i sub_dot(const __m512i *w, const int8_t *x) {
    const int32_t *run = (const int32_t *)x;
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
    for (int t = 0; t < 8; t += 2) {
        even = _mm512_dpbusd_epi32(even, w[t], _mm512_set1_epi32(run[t]));
        odd = _mm512_dpbusd_epi32(odd, w[t + 1], _mm512_set1_epi32(run[t + 1]));
    }
    return _mm512_add_epi32(even, odd);
}

/* R activation rows from i (q, d: their int8 values and scale per super-block; pairs: their sums of 32 as 16-bit
   pairs) against the group at blk: y[r * stride + lane] for lane < lanes. Per row and lane, per super-block:
   acc += (d dx) * sum_s sc_s dot_s, then acc -= (dmin dx) * sum_s mn_s sum_s(x): the same order whatever R. */
INLINE void group_rows(int kind, const uint8_t *blk, int64_t nb, const int8_t *q, const float *d,
                       const int32_t *pairs, int64_t k, const int R, float *y, int64_t stride, int lanes) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[TILE];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, blk += group_bytes(kind)) {
        __m512i isum[TILE], w[8];
        for (int line = 0; line < HEAD; line += 64) _mm_prefetch((const char *)blk + line, _MM_HINT_T0);
        for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
        for (int s = 0; s < 8; ++s) {  /* sub-block s: chunk s / 2, low nibbles for even s */
            const uint8_t *runs = blk + HEAD + CHUNK(kind) * (s / 2);
            for (int t = 0; t < 8; ++t) {
                const __m512i raw = _mm512_loadu_si512(runs + 64 * t);
                w[t] = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(raw, 4) : raw, low);
            }
            for (int t = 0; kind == KIND_Q5_K && t < 8; ++t) {
                uint64_t fifth;
                memcpy(&fifth, runs + 512 + 64 * (s % 2) + 8 * t, 8);
                w[t] = _mm512_mask_add_epi8(w[t], (__mmask64)fifth, w[t], _mm512_set1_epi8(16));
            }
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 64 + 16 * s)));
            for (int r = 0; r < R; ++r)
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(sub_dot(w, q + r * k + b * QK_K + 32 * s), sc));
        }
        const __m512 dh = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const __m512 dminh = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
        for (int r = 0; r < R; ++r) {
            __m512i imin = _mm512_setzero_si512();
            for (int p = 0; p < 4; ++p)
                imin = _mm512_dpwssd_epi32(imin, _mm512_loadu_si512(blk + 192 + 64 * p),
                                           _mm512_set1_epi32(pairs[(r * nb + b) * 4 + p]));
            const __m512 dx = _mm512_set1_ps(d[r * nb + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dh, dx), _mm512_cvtepi32_ps(isum[r]), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_mul_ps(dminh, dx), _mm512_cvtepi32_ps(imin), acc[r]);
        }
    }
    const __mmask16 keep = (__mmask16)((1u << lanes) - 1);
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * stride, keep, acc[r]);
}

INLINE void q45k_group(int kind, const uint8_t *blk, int64_t nb, const int8_t *q, const float *d,
                       const int32_t *pairs, int64_t k, const int R, float *y, int64_t stride, int lanes) {
    if (kind == KIND_Q5_K) group_rows(KIND_Q5_K, blk, nb, q, d, pairs, k, R, y, stride, lanes);
    else group_rows(KIND_Q4_K, blk, nb, q, d, pairs, k, R, y, stride, lanes);
}

/* y[m, columns [0, n) of rows of ystride] = the quantized activations (K style: q, d per 256, bsums per 16) times
   the packed weight (Q4_K, Q5_K or Q6_K), groups of sixteen rows shared among threads. Returns 0, or -1 when out of
   memory. */
int kq_packed_products(int kind, const uint8_t *w, int64_t n, const struct acts *a, int64_t m, float *y,
                       int64_t ystride, int threads) {
    const int64_t k = a->k, nb = a->nb, groups = (n + LANES - 1) / LANES;
    const int8_t *q = a->q;
    const float *d = a->d;
    const int q6 = kind == KIND_Q6_K;
    int32_t *pairs = q6 ? NULL : malloc((size_t)(m * nb * 4) * sizeof(int32_t));  /* sums of 32, two a word */
    if (!q6 && !pairs)
        return -1;
    for (int64_t i = 0; !q6 && i < m * nb * 4; ++i) {
        const int16_t *bs = a->bsums + 4 * i;  /* sub-blocks 2p, 2p + 1 of a super-block: four sums of 16 */
        const int16_t both[2] = {(int16_t)(bs[0] + bs[1]), (int16_t)(bs[2] + bs[3])};
        memcpy(pairs + i, both, 4);
    }
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t g = 0; g < groups; ++g) {
        const int lanes = n - g * LANES < LANES ? (int)(n - g * LANES) : LANES;
        const uint8_t *blk = w + g * nb * group_bytes(kind);
        for (int64_t i = 0; i < m; i += TILE) {
            if (q6) {
                q6k_group(blk, a, i, (int)(m - i < TILE ? m - i : TILE), y + i * ystride + g * LANES, ystride, lanes);
                continue;
            }
            const int8_t *qi = q + i * k;
            const float *di = d + i * nb;
            const int32_t *pi = pairs + i * nb * 4;
            float *yi = y + i * ystride + g * LANES;
            switch (m - i < TILE ? m - i : TILE) {
            case 1: q45k_group(kind, blk, nb, qi, di, pi, k, 1, yi, ystride, lanes); break;
            case 2: q45k_group(kind, blk, nb, qi, di, pi, k, 2, yi, ystride, lanes); break;
            case 3: q45k_group(kind, blk, nb, qi, di, pi, k, 3, yi, ystride, lanes); break;
            default: q45k_group(kind, blk, nb, qi, di, pi, k, 4, yi, ystride, lanes); break;
            }
        }
    }
    free(pairs);
    return 0;
}
#else
void kq_pack(int kind, const uint8_t *w, int64_t n, int64_t k, uint8_t *out) {
    (void)kind; (void)w; (void)n; (void)k; (void)out;
}

int kq_packed_products(int kind, const uint8_t *w, int64_t n, const struct acts *a, int64_t m, float *y,
                       int64_t ystride, int threads) {
    (void)kind; (void)w; (void)n; (void)a; (void)m; (void)y; (void)ystride; (void)threads;
    return -2;
}
#endif
