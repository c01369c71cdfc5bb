/* K-quant products on AVX2 (and on AVX-512 CPUs, for the weights that are not repacked): one weight row, where
   the file's blocks lie, against up to KQ_TILE activation rows, the weights unpacked once for them. As llama.cpp's
   ggml-quants computes them: vpmaddubsw multiplies pairs of u8 weights and s8 activations into 16-bit sums (at
   most 2 x 63 x 127, no saturation), vpmaddwd multiplies those by the sub-block's scale into 32-bit sums; each
   super-block's (or Q5 block's) integer sums are then added up exactly and scaled once, in kquant.h's order, so
   the results are the portable loops' and the packed kernels' to the bit. */
#include <math.h>

#include "kquant.h"

#ifdef KQ_AVX2
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* The sums of the eight 32-bit lanes of a and of b, exact. */
INLINE void hsum2(__m256i a, __m256i b, int32_t *sa, int32_t *sb) {
    __m256i t = _mm256_hadd_epi32(a, b);  /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    t = _mm256_hadd_epi32(t, t);          /* a0..3 b0..3 a0..3 b0..3 | a4..7 b4..7 a4..7 b4..7 */
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    *sa = _mm_cvtsi128_si32(s);
    *sb = _mm_extract_epi32(s, 1);
}

/* 16-bit lane l of the result: lane 2s + l / 8 of `scales`'s 128-bit half (half 0 for l < 8): spreads a pair of
   sub-block scales (held as 16-bit lanes, the same in both halves) over the 16-bit sums of 32 weights. */
INLINE __m256i spread(__m256i scales, int s0, int s1) {
    const __m256i index = _mm256_set_m128i(_mm_set1_epi16((short)((2 * s1 + 1) << 8 | 2 * s1)),
                                           _mm_set1_epi16((short)((2 * s0 + 1) << 8 | 2 * s0)));
    return _mm256_shuffle_epi8(scales, index);
}

INLINE __m256i load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Q4_K and Q5_K (w = d sc q - dmin mn per sub-block of 32): chunk j of 64 weights is 32 bytes of nibbles, low ones
   sub-block 2j, high ones 2j + 1; Q5_K's fifth bits are bit 2j (low) and 2j + 1 (high) of its 32 bytes qh. */
INLINE void q45k_rows(int kind, const uint8_t *row, const struct acts *a, int64_t i, const int R, float *y,
                      int64_t stride) {
    const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    float acc[KQ_TILE] = {0};
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *blk = row + b * KQ_BYTES[kind], *qs = blk + (kind == KIND_Q5_K ? 48 : 16);
        uint8_t scm[16];
        scales_mins(blk + 4, scm);
        const __m256i both = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)scm));  /* sc 0..7, mn 0..7 */
        const __m256i scales = _mm256_permute2x128_si256(both, both, 0x00);
        const __m128i mn = _mm256_extracti128_si256(both, 1);
        const __m256i mins = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));
        const __m256i qh = kind == KIND_Q5_K ? load(blk + 16) : _mm256_setzero_si256();
        __m256i isum[KQ_TILE];
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        for (int j = 0; j < 4; ++j) {
            const __m256i raw = load(qs + 32 * j);
            __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
            if (kind == KIND_Q5_K) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4));
            }
            const __m256i sl = spread(scales, 2 * j, 2 * j), sh = spread(scales, 2 * j + 1, 2 * j + 1);
            for (int r = 0; r < R; ++r) {
                const int8_t *x = a->q + (i + r) * a->k + b * QK_K + 64 * j;
                const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load(x)), sl);
                const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load(x + 32)), sh);
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(pl, ph));
            }
        }
        const float wd = read_half(blk), wmin = read_half(blk + 2);
        for (int r = 0; r < R; ++r) {
            const __m256i bs = load(a->bsums + (i + r) * a->k / 16 + b * 16);  /* pairs of sums of 16: sub-block s */
            int32_t dot, imin;
            hsum2(isum[r], _mm256_madd_epi16(bs, mins), &dot, &imin);
            const float dx = a->d[(i + r) * a->nb + b];
            acc[r] = fmaf(wd * dx, (float)dot, acc[r]);
            acc[r] = fmaf(-(wmin * dx), (float)imin, acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) y[r * stride] = acc[r];
}

/* Q6_K (w = d sc (q - 32) per sub-block of 16): each 128-half's 64 bytes of ql (quarters 0 and 1 in their low
   nibbles, 2 and 3 in their high ones) and 32 of qh (quarter t's two high bits at shift 2t); quarter t of half h
   is sub-blocks 8h + 2t and 8h + 2t + 1. The -32 is taken back as 32 sc times the activations' sums of 16. */
INLINE void q6k_rows(const uint8_t *row, const struct acts *a, int64_t i, const int R, float *y, int64_t stride) {
    const __m256i low = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    float acc[KQ_TILE] = {0};
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *blk = row + b * KQ_BYTES[KIND_Q6_K];
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        __m256i isum[KQ_TILE];
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h) {
            const __m256i qh = load(blk + 128 + 32 * h), l0 = load(blk + 64 * h), l1 = load(blk + 64 * h + 32);
            const __m256i half = h ? _mm256_permute2x128_si256(sc, sc, 0x11) : _mm256_permute2x128_si256(sc, sc, 0x00);
            __m256i w[4];
            w[0] = _mm256_and_si256(l0, low);
            w[1] = _mm256_and_si256(l1, low);
            w[2] = _mm256_and_si256(_mm256_srli_epi16(l0, 4), low);
            w[3] = _mm256_and_si256(_mm256_srli_epi16(l1, 4), low);
            for (int t = 0; t < 4; ++t) {
                const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), three);
                w[t] = _mm256_or_si256(w[t], _mm256_slli_epi16(high, 4));
            }
            for (int t = 0; t < 4; ++t) {
                const __m256i s = spread(half, 2 * t, 2 * t + 1);
                for (int r = 0; r < R; ++r) {
                    const int8_t *x = a->q + (i + r) * a->k + b * QK_K + 128 * h + 32 * t;
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(w[t], load(x)), s));
                }
            }
        }
        const float wd = read_half(blk + 208);
        for (int r = 0; r < R; ++r) {
            const __m256i bs = load(a->bsums + (i + r) * a->k / 16 + b * 16);
            int32_t dot, offset;
            hsum2(isum[r], _mm256_madd_epi16(bs, sc), &dot, &offset);
            acc[r] = fmaf(wd * a->d[(i + r) * a->nb + b], (float)(dot - 32 * offset), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) y[r * stride] = acc[r];
}

/* Q5_0 and Q5_1 blocks of 32: 16 bytes of nibbles (byte j: weights j and j + 16) and 32 fifth bits (bit j: weight
   j), spread to bytes as llama.cpp's bytes_from_bits_32 does. */
INLINE __m256i q5_weights(const uint8_t *blk, int64_t head) {
    uint32_t bits;
    memcpy(&bits, blk + head, 4);
    const __m256i spread_bytes = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i fifth = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread_bytes);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(fifth, bit), bit);
    const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + head + 4));
    const __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
    return _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(16)));
}

/* Two blocks at a time (their sums reduced together), the second absent at an odd row's end. */
INLINE void q5_rows(int kind, const uint8_t *row, const struct acts *a, int64_t i, const int R, float *y,
                    int64_t stride) {
    const int64_t head = kind == KIND_Q5_1 ? 4 : 2;
    const __m256i ones = _mm256_set1_epi16(1);
    float acc[KQ_TILE] = {0}, off[KQ_TILE] = {0};
    for (int64_t b = 0; b < a->nb; b += 2) {
        const int pair = b + 1 < a->nb;
        __m256i w[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        float wd[2], wm[2];
        for (int h = 0; h < 1 + pair; ++h) {
            const uint8_t *blk = row + (b + h) * KQ_BYTES[kind];
            w[h] = q5_weights(blk, head);
            wd[h] = read_half(blk);
            wm[h] = kind == KIND_Q5_1 ? read_half(blk + 2) : -16.0f * wd[h];
        }
        for (int r = 0; r < R; ++r) {
            const int64_t at = (i + r) * a->nb + b;
            const __m256i d0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w[0], load(a->q + at * QK)), ones);
            const __m256i d1 = pair ? _mm256_madd_epi16(_mm256_maddubs_epi16(w[1], load(a->q + (at + 1) * QK)), ones)
                                    : _mm256_setzero_si256();
            int32_t dot[2];
            hsum2(d0, d1, &dot[0], &dot[1]);
            for (int h = 0; h < 1 + pair; ++h) {
                acc[r] = fmaf(wd[h] * a->d[at + h], (float)dot[h], acc[r]);
                off[r] = fmaf(wm[h], a->s[at + h], off[r]);
            }
        }
    }
    for (int r = 0; r < R; ++r) y[r * stride] = acc[r] + off[r];
}

INLINE void rows_of(int kind, const uint8_t *row, const struct acts *a, int64_t i, const int R, float *y,
                    int64_t stride) {
    switch (kind) {
    case KIND_Q4_K: q45k_rows(KIND_Q4_K, row, a, i, R, y, stride); break;
    case KIND_Q5_K: q45k_rows(KIND_Q5_K, row, a, i, R, y, stride); break;
    case KIND_Q6_K: q6k_rows(row, a, i, R, y, stride); break;
    default: q5_rows(kind, row, a, i, R, y, stride); break;
    }
}

void kq_rows_avx2(int kind, const uint8_t *row, const struct acts *a, int64_t i, int R, float *y, int64_t stride) {
    switch (R) {
    case 1: rows_of(kind, row, a, i, 1, y, stride); break;
    case 2: rows_of(kind, row, a, i, 2, y, stride); break;
    case 3: rows_of(kind, row, a, i, 3, y, stride); break;
    default: rows_of(kind, row, a, i, KQ_TILE, y, stride); break;
    }
}
#endif
