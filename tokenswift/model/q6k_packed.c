/* Q6_K products on AVX-512 VNNI with the weights repacked sixteen rows a group, as kquant_packed.c packs Q4_K's, in
   the file's own bytes: each weight keeps its low four bits and its high two apart, as the file stores them (an
   8-bit copy, 30% larger, was no faster). Per sub-block of 16 and activation row, four vpdpbusd (u8 weights 0..63
   x s8 activations) and one 32-bit multiply by the scale give sixteen rows' exact sums; the -32 is taken back once
   per super-block, 32 times the scales (int16 pairs, vpdpwssd) times the activations' sums of 16.

   A group's super-block, 3,360 bytes (210 a row, as in the file), in the order the kernel reads it: the sixteen
   rows' d (float16, 32 bytes); their scales as int8 pairs, pair p (sub-blocks 2p, 2p + 1) of row r at 32p + 2r
   (256 bytes); then per quarter j of 64 weights (sub-blocks 4j..4j + 3), three sets of four runs of 64 bytes,
   lane r's four bytes of run t holding row r's weights 4t..4t + 3 of each of those sub-blocks: first their high
   two bits (sub-block 4j + c at bits 2c), then their low four, sub-blocks 4j and 4j + 1 (low and high nibbles),
   then 4j + 2 and 4j + 3. Rows past n are zero. */
#include <stdint.h>
#include <string.h>

#include "kquant.h"
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#define HEAD 288     /* d and the scales */
#define QUARTER 768  /* a quarter's three sets of runs */

/* Writes Q6_K's packed form of W ([n, k / 256 super-blocks of 210 bytes]) to out, zeroed (kq_pack). */
void q6k_pack(const uint8_t *w, int64_t n, int64_t k, uint8_t *out) {
    const int64_t nb = k / QK_K;
    for (int64_t g = 0; g * KQ_LANES < n; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *blk = out + (g * nb + b) * Q6K_GROUP;
            for (int64_t r = 0; r < KQ_LANES && g * KQ_LANES + r < n; ++r) {
                const uint8_t *src = w + ((g * KQ_LANES + r) * nb + b) * KQ_BYTES[KIND_Q6_K];
                memcpy(blk + 2 * r, src + 208, 2);
                for (int p = 0; p < 8; ++p) memcpy(blk + 32 + 32 * p + 2 * r, src + 192 + 2 * p, 2);
                for (int l = 0; l < QK_K; ++l) {
                    const int q = kq_weight(KIND_Q6_K, src, l), sub = l / 16, c = sub % 4;
                    uint8_t *at = blk + HEAD + QUARTER * (sub / 4) + 64 * (l % 16 / 4) + 4 * r + l % 4;
                    at[0] |= (uint8_t)((q >> 4) << 2 * c);
                    at[256 + 256 * (c / 2)] |= (uint8_t)((q & 0x0F) << 4 * (c % 2));
                }
            }
        }
}

#define INLINE static inline __attribute__((always_inline))

/* The high two bits of sub-block 4j + c, from bits 2c of the runs h to bits 4 and 5. */
INLINE __m512i high_bits(__m512i h, int c) {
    const __m512i at = c == 0 ? _mm512_slli_epi16(h, 4) : c == 1 ? _mm512_slli_epi16(h, 2)
                     : c == 2 ? h : _mm512_srli_epi16(h, 2);
    return _mm512_and_si512(at, _mm512_set1_epi8(0x30));
}

/* Pair p of the sixteen rows' scales (sub-blocks 2p, 2p + 1) as 16-bit lanes, two a row. */
INLINE __m512i scale_pairs(const uint8_t *blk, int p) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * p)));
}

/* The exact sums of one sub-block's four runs w with an activation row's 16 bytes x, per lane. */
INLINE __m512i sub_dot(const __m512i *w, const int8_t *x) {
    int32_t run[4];
    memcpy(run, x, 16);
    const __m512i zero = _mm512_setzero_si512();
    const __m512i even = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, w[0], _mm512_set1_epi32(run[0])), w[2],
                                             _mm512_set1_epi32(run[2]));
    const __m512i odd = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, w[1], _mm512_set1_epi32(run[1])), w[3],
                                            _mm512_set1_epi32(run[3]));
    return _mm512_add_epi32(even, odd);
}

/* R activation rows from i against the group at blk: y[r * stride + lane] for lane < lanes. Per row and lane, per
   super-block: acc += (d dx) * (sum_g sc_g dot_g - 32 sum_g sc_g sum_g(x)), the same order whatever R. */
INLINE void group_rows(const uint8_t *blk, const struct acts *a, int64_t i, const int R, float *y, int64_t stride,
                       int lanes) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[KQ_TILE];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b, blk += Q6K_GROUP) {
        for (int line = 0; line < HEAD; line += 64) _mm_prefetch((const char *)blk + line, _MM_HINT_T0);
        const __m512 dh = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        __m512i isum[KQ_TILE];
        for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
        for (int j = 0; j < 4; ++j) {
            const uint8_t *quarter = blk + HEAD + QUARTER * j;
            __m512i high[4];
            for (int t = 0; t < 4; ++t) high[t] = _mm512_loadu_si512(quarter + 64 * t);
            for (int half = 0; half < 2; ++half) {  /* sub-blocks 4j + 2 half and 4j + 2 half + 1 */
                const int pair = 2 * j + half;
                const __m512i scales = scale_pairs(blk, pair);
                __m512i raw[4];
                for (int t = 0; t < 4; ++t) raw[t] = _mm512_loadu_si512(quarter + 256 + 256 * half + 64 * t);
                for (int odd = 0; odd < 2; ++odd) {
                    const int c = 2 * half + odd;
                    const __m512i sc = odd ? _mm512_srai_epi32(scales, 16)
                                           : _mm512_srai_epi32(_mm512_slli_epi32(scales, 16), 16);
                    __m512i w[4];
                    for (int t = 0; t < 4; ++t)
                        w[t] = _mm512_or_si512(_mm512_and_si512(odd ? _mm512_srli_epi16(raw[t], 4) : raw[t], low),
                                               high_bits(high[t], c));
                    for (int r = 0; r < R; ++r) {
                        const int8_t *x = a->q + (i + r) * a->k + b * QK_K + 16 * (4 * j + c);
                        isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(sub_dot(w, x), sc));
                    }
                }
            }
        }
        for (int r = 0; r < R; ++r) {
            const int16_t *bs = a->bsums + ((i + r) * a->nb + b) * 16;
            __m512i offset = _mm512_setzero_si512();
            for (int p = 0; p < 8; ++p) {
                int32_t sums;  /* the activations' sums of sub-blocks 2p and 2p + 1 */
                memcpy(&sums, bs + 2 * p, 4);
                offset = _mm512_dpwssd_epi32(offset, scale_pairs(blk, p), _mm512_set1_epi32(sums));
            }
            isum[r] = _mm512_sub_epi32(isum[r], _mm512_slli_epi32(offset, 5));
            const __m512 dx = _mm512_set1_ps(a->d[(i + r) * a->nb + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dh, dx), _mm512_cvtepi32_ps(isum[r]), acc[r]);
        }
    }
    const __mmask16 keep = (__mmask16)((1u << lanes) - 1);
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * stride, keep, acc[r]);
}

/* R (1..KQ_TILE) activation rows from i against one group: kquant_packed.c shares the groups among threads. */
void q6k_group(const uint8_t *blk, const struct acts *a, int64_t i, int R, float *y, int64_t stride, int lanes) {
    switch (R) {
    case 1: group_rows(blk, a, i, 1, y, stride, lanes); break;
    case 2: group_rows(blk, a, i, 2, y, stride, lanes); break;
    case 3: group_rows(blk, a, i, 3, y, stride, lanes); break;
    default: group_rows(blk, a, i, KQ_TILE, y, stride, lanes); break;
    }
}
#endif
