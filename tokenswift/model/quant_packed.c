/* Products of GGUF weights repacked a group of weight rows at a time: sixteen rows for AVX-512 VNNI (this
   project's EPYC), eight for AVX2 (CPUs without AVX-512: Zen 2/3, Intel client cores).

   Multiplied a weight row at a time (the file's own blocks), each block's 32 products ended in eight lanes scaled
   and summed apart, so every activation row paid ~12 vector operations per block of 32 and a verify batch's extra
   rows cost a third of a plain step's products. Here a group of weight rows is stored block by block as vpdpbusd
   reads it (lane r: four consecutive weights of row r), the activations' four-byte runs are broadcast, and each
   block's integer sums land one per lane, exact: per block and row, two chains of four vpdpbusd (AVX2: eight
   vpmaddubsw summed in 16 bits, one vpmaddwd), one conversion and two multiply-adds give a group's outputs. The
   outputs come out as lanes, with no horizontal sums, and each activation row's arithmetic is the same whatever
   rows share the call; a lane's float steps are the same in both builds (and the portable loops'), so a weight
   row's product does not depend on which of them runs.

   A group's block: the rows' scales d and offsets m as float16 (w = d q + m; Q4_0's m is -8 d and Q5_0's -16 d,
   exact in float16; Q8_0 has none), then the weights: for Q4 and Q5 the file's own nibble bytes (byte j holds
   weights j and j + 16), four runs of 4 bytes a row, and Q5's fifth bits as masks (VNNI only); for Q8 eight runs,
   on VNNI of q + 128, unsigned as vpdpbusd wants them, the 128 taken back from each block's integer sum (exact,
   where an offset -128 d would cancel in floats), on AVX2 of q itself (vpsignb makes the products' signs). Rows
   past n (the last group) are zero. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define QP_VNNI 1
#define QP_PACKS 1
#define LANES 16     /* weight rows per group */
#define TILE_ROWS 8  /* activation rows per pass over a group's weights (their 16 accumulators in registers) */
#define LAST_KIND 4  /* Q5_1: the kinds packed here are Q4_0 .. Q5_1 */
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QP_AVX2 1
#define QP_PACKS 1
#define LANES 8
#define TILE_ROWS 4  /* three ymm registers a row (16-bit sums, products, offsets), 12 of AVX2's 16 */
#define LAST_KIND 2  /* Q8_0: Q5's fifth bits have no masked byte add on AVX2 (kquant_kernels.c reads them) */
#endif

#define QK 32
enum { KIND_Q4_0 = 0, KIND_Q4_1 = 1, KIND_Q8_0 = 2, KIND_Q5_0 = 3, KIND_Q5_1 = 4 };

#ifdef QP_PACKS
static const int64_t GGUF_BYTES[5] = {18, 20, 34, 22, 24};
#define WEIGHTS_AT (4 * LANES)  /* a group's block: LANES scales d, then LANES offsets m, float16, then weights */

/* Bytes of one group's block: scales and offsets, then LANES x 32 weights as nibbles (Q4, Q5) or bytes (Q8), and
   for Q5 the fifth bits: eight 64-bit masks, one per run of nibbles (bit 4r + c: byte c of row r's run). */
static int64_t group_block_bytes(int kind) {
    return WEIGHTS_AT + (kind == KIND_Q8_0 ? 32 : 16) * LANES + (kind >= KIND_Q5_0 ? 64 : 0);  /* Q5: VNNI only */
}

/* Where a block's nibble bytes start: after d (and m for Q4_1/Q5_1), and Q5's 4 bytes of fifth bits. */
static int64_t nibbles_at(int kind) {
    return kind == KIND_Q4_0 ? 2 : kind == KIND_Q4_1 ? 4 : kind == KIND_Q5_0 ? 6 : 8;
}
#endif

/* The bytes legacy_pack writes for an n x k weight of `kind`, or 0 where this build or kind has no packed products. */
int64_t legacy_packed_bytes(int kind, int64_t n, int64_t k) {
#ifdef QP_PACKS
    if (kind > LAST_KIND)  /* kquant_kernels.c reads the K kinds' blocks where they lie */
        return 0;
    return (n + LANES - 1) / LANES * (k / QK) * group_block_bytes(kind);
#else
    (void)kind; (void)n; (void)k;
    return 0;
#endif
}

#ifdef QP_PACKS
static uint16_t half_bits(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* float16 d times -8 (Q4_0) or -16 (Q5_0): exact, GGUF scales being far from float16's limits. */
static uint16_t times(uint16_t d, float by) { return _cvtss_sh(_cvtsh_ss(d) * by, 0); }

/* The offset m of w = d q + m for a block of `kind` at src. */
static uint16_t offset_of(int kind, const uint8_t *src) {
    switch (kind) {
    case KIND_Q4_1: case KIND_Q5_1: return half_bits(src + 2);
    case KIND_Q4_0: return times(half_bits(src), -8.0f);
    case KIND_Q5_0: return times(half_bits(src), -16.0f);
    default: return 0;
    }
}

#ifdef QP_VNNI
#define Q8_BIAS 0x80  /* q + 128: vpdpbusd's unsigned operand */
#else
#define Q8_BIAS 0  /* q itself: vpsignb moves its signs to the activations */
#endif

/* Writes the packed form of W ([n, k / 32, GGUF block bytes]) to out (legacy_packed_bytes of them). */
void legacy_pack(int kind, const uint8_t *w, int64_t n, int64_t k, uint8_t *out) {
    const int64_t nb = k / QK, bytes = GGUF_BYTES[kind], step = group_block_bytes(kind);
    memset(out, 0, (size_t)legacy_packed_bytes(kind, n, k));
    for (int64_t g = 0; g * LANES < n; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *blk = out + (g * nb + b) * step;
            for (int64_t r = 0; r < LANES && g * LANES + r < n; ++r) {
                const uint8_t *src = w + (g * LANES + r) * nb * bytes + b * bytes;
                const uint16_t d = half_bits(src);
                const uint16_t m = offset_of(kind, src);
                memcpy(blk + 2 * r, &d, 2);
                memcpy(blk + 2 * LANES + 2 * r, &m, 2);
                for (int t = 0; t < (kind == KIND_Q8_0 ? 8 : 4); ++t)
                    for (int c = 0; c < 4; ++c) {
                        uint8_t *at = blk + WEIGHTS_AT + t * 4 * LANES + r * 4 + c;
                        if (kind == KIND_Q8_0) *at = (uint8_t)(src[2 + 4 * t + c] ^ Q8_BIAS);
                        else *at = src[nibbles_at(kind) + 4 * t + c];
                    }
                if (kind >= KIND_Q5_0) {  /* bit j of qh: weight j's fifth bit; run t holds weights 4t..4t + 3 */
                    uint32_t qh;
                    memcpy(&qh, src + nibbles_at(kind) - 4, 4);
                    uint8_t *masks = blk + WEIGHTS_AT + 16 * LANES;
                    for (int t = 0; t < 8; ++t)
                        masks[8 * t + r / 2] |= (uint8_t)(((qh >> 4 * t) & 0x0F) << 4 * (r % 2));
                }
            }
        }
}

#define INLINE static inline __attribute__((always_inline))

/* The activations' four-byte run t of a block at x, as one int32 to broadcast (memcpy: the bytes are int8_t). */
INLINE int32_t run_of(const int8_t *x, int t) {
    int32_t run;
    memcpy(&run, x + 4 * t, sizeof run);
    return run;
}

#ifdef QP_VNNI
/* The exact integer sums of one activation row's block (32 int8 at x) with the group's 16 weight rows. */
INLINE __m512i group_dot(const __m512i *w, int kind, const int8_t *x) {
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();  /* two chains, summed exactly */
    if (kind == KIND_Q8_0) {
        for (int t = 0; t < 8; t += 2) {
            even = _mm512_dpbusd_epi32(even, w[t], _mm512_set1_epi32(run_of(x, t)));
            odd = _mm512_dpbusd_epi32(odd, w[t + 1], _mm512_set1_epi32(run_of(x, t + 1)));
        }
    } else {  /* w[t]: weights 4t..4t+3 (low nibbles); w[4 + t]: 16 + 4t.. (high ones) */
        for (int t = 0; t < 4; ++t) {
            even = _mm512_dpbusd_epi32(even, w[t], _mm512_set1_epi32(run_of(x, t)));
            odd = _mm512_dpbusd_epi32(odd, w[4 + t], _mm512_set1_epi32(run_of(x, 4 + t)));
        }
    }
    return _mm512_add_epi32(even, odd);
}

/* R activation rows (quantized: q, scales d, d * sum s per block; for Q8, sums: 128 * sum per block) against
   the group of 16 weight rows at blk: y[i * stride + lane] for lane < lanes. Per row and lane: acc += (wd * dx) *
   sum over the blocks in order, offsets += wm * s apart, then acc + offsets. */
INLINE void group_rows(const uint8_t *blk, int64_t nb, int kind, const int8_t *q, const float *d, const float *s,
                       const int32_t *sums, int64_t k, const int R, float *y, int64_t stride, int lanes) {
    const int64_t step = group_block_bytes(kind);
    __m512 acc[TILE_ROWS], off[TILE_ROWS];
    for (int i = 0; i < R; ++i) acc[i] = off[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, blk += step) {
        const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const __m512 wm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 2 * LANES)));
        __m512i w[8];
        if (kind == KIND_Q8_0) {
            for (int t = 0; t < 8; ++t) w[t] = _mm512_loadu_si512(blk + WEIGHTS_AT + 64 * t);
        } else {
            const __m512i low = _mm512_set1_epi8(0x0F);
            for (int t = 0; t < 4; ++t) {
                const __m512i raw = _mm512_loadu_si512(blk + WEIGHTS_AT + 64 * t);
                w[t] = _mm512_and_si512(raw, low);
                w[4 + t] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
            }
        }
        if (kind >= KIND_Q5_0) {  /* the fifth bits, 16 added under each run's mask */
            for (int t = 0; t < 8; ++t) {
                uint64_t bits;
                memcpy(&bits, blk + WEIGHTS_AT + 16 * LANES + 8 * t, 8);
                w[t] = _mm512_mask_add_epi8(w[t], (__mmask64)bits, w[t], _mm512_set1_epi8(16));
            }
        }
        for (int i = 0; i < R; ++i) {
            __m512i dot = group_dot(w, kind, q + i * k + b * QK);
            if (kind == KIND_Q8_0)
                dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(sums[i * nb + b]));
            else
                off[i] = _mm512_fmadd_ps(wm, _mm512_set1_ps(s[i * nb + b]), off[i]);
            acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(wd, _mm512_set1_ps(d[i * nb + b])), _mm512_cvtepi32_ps(dot), acc[i]);
        }
    }
    const __mmask16 keep = (__mmask16)((1u << lanes) - 1);
    for (int i = 0; i < R; ++i) _mm512_mask_storeu_ps(y + i * stride, keep, _mm512_add_ps(acc[i], off[i]));
}
#else
/* group_rows on AVX2: a lane is a weight row (eight a group), the activation runs broadcast as on VNNI. A Q4
   block's 32 products per lane are eight vpmaddubsw (nibbles 0..15 times activations within +-127: a pair's sum
   within 3,810) summed in 16 bits (16 products, within 30,480: exact) and widened once by vpmaddwd; Q8's weights
   are signed, so each run is vpsignb's |q| times the activations with q's signs (a pair within 32,512), widened
   run by run. The float steps are the VNNI loop's, lane for lane. */
INLINE void group_rows(const uint8_t *blk, int64_t nb, int kind, const int8_t *q, const float *d, const float *s,
                       const int32_t *sums, int64_t k, const int R, float *y, int64_t stride, int lanes) {
    (void)sums;
    const int64_t step = group_block_bytes(kind);
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[TILE_ROWS], off[TILE_ROWS];
    for (int i = 0; i < R; ++i) acc[i] = off[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, blk += step) {
        __m256i dot[TILE_ROWS];
        if (kind == KIND_Q8_0) {
            for (int i = 0; i < R; ++i) dot[i] = _mm256_setzero_si256();
            for (int t = 0; t < 8; ++t) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + WEIGHTS_AT + 32 * t));
                const __m256i size = _mm256_sign_epi8(w, w);
                for (int i = 0; i < R; ++i) {
                    const __m256i x = _mm256_set1_epi32(run_of(q + i * k + b * QK, t));
                    dot[i] = _mm256_add_epi32(dot[i], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(size, _mm256_sign_epi8(x, w)), ones));
                }
            }
        } else {
            __m256i sum16[TILE_ROWS];
            for (int i = 0; i < R; ++i) sum16[i] = _mm256_setzero_si256();
            for (int t = 0; t < 4; ++t) {  /* low nibbles: weights 4t..4t + 3; high ones: 16 + 4t.. */
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + WEIGHTS_AT + 32 * t));
                const __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                for (int i = 0; i < R; ++i) {
                    const int8_t *x = q + i * k + b * QK;
                    sum16[i] = _mm256_add_epi16(sum16[i], _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, _mm256_set1_epi32(run_of(x, t))),
                        _mm256_maddubs_epi16(hi, _mm256_set1_epi32(run_of(x, 4 + t)))));
                }
            }
            for (int i = 0; i < R; ++i) dot[i] = _mm256_madd_epi16(sum16[i], ones);
        }
        const __m256 wd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        const __m256 wm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 2 * LANES)));
        for (int i = 0; i < R; ++i) {
            if (kind != KIND_Q8_0) off[i] = _mm256_fmadd_ps(wm, _mm256_set1_ps(s[i * nb + b]), off[i]);
            acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(wd, _mm256_set1_ps(d[i * nb + b])), _mm256_cvtepi32_ps(dot[i]),
                                     acc[i]);
        }
    }
    for (int i = 0; i < R; ++i) {
        float out[LANES];
        _mm256_storeu_ps(out, _mm256_add_ps(acc[i], off[i]));
        memcpy(y + i * stride, out, (size_t)lanes * sizeof(float));
    }
}
#endif

/* y[m, n] = the quantized activations' rows (quant_kernels.c's quantize_row) times the packed weight, groups of
   LANES rows shared among threads. Returns 0, -1 when out of memory (-2 in a build without VNNI or AVX2, which packs
   nothing). */
int packed_matmul(int kind, const uint8_t *w, int64_t n, int64_t k, const int8_t *q, const float *d, const float *s,
                  int64_t m, float *y, int64_t ystride, int threads) {
    const int64_t nb = k / QK, groups = (n + LANES - 1) / LANES, group_bytes = nb * group_block_bytes(kind);
    int32_t *sums = NULL;  /* Q8 on VNNI: 128 times each activation block's sum, what q + 128 adds to its product */
    if (kind == KIND_Q8_0 && Q8_BIAS) {
        if (!(sums = malloc((size_t)(m * nb) * sizeof(int32_t))))
            return -1;
        for (int64_t i = 0; i < m * nb; ++i) {
            int32_t sum = 0;
            for (int j = 0; j < QK; ++j) sum += q[i * QK + j];
            sums[i] = 128 * sum;
        }
    }
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t g = 0; g < groups; ++g) {
        const int lanes = n - g * LANES < LANES ? (int)(n - g * LANES) : LANES;
        for (int64_t i = 0; i < m; i += TILE_ROWS) {
            const int8_t *qi = q + i * k;
            const float *di = d + i * nb, *si = s + i * nb;
            const int32_t *ci = sums ? sums + i * nb : NULL;
            float *yi = y + i * ystride + g * LANES;
            const uint8_t *blk = w + g * group_bytes;
            switch (m - i < TILE_ROWS ? m - i : TILE_ROWS) {
            case 1: group_rows(blk, nb, kind, qi, di, si, ci, k, 1, yi, ystride, lanes); break;
            case 2: group_rows(blk, nb, kind, qi, di, si, ci, k, 2, yi, ystride, lanes); break;
            case 3: group_rows(blk, nb, kind, qi, di, si, ci, k, 3, yi, ystride, lanes); break;
#if TILE_ROWS == 8
            case 4: group_rows(blk, nb, kind, qi, di, si, ci, k, 4, yi, ystride, lanes); break;
            case 5: group_rows(blk, nb, kind, qi, di, si, ci, k, 5, yi, ystride, lanes); break;
            case 6: group_rows(blk, nb, kind, qi, di, si, ci, k, 6, yi, ystride, lanes); break;
            case 7: group_rows(blk, nb, kind, qi, di, si, ci, k, 7, yi, ystride, lanes); break;
            default: group_rows(blk, nb, kind, qi, di, si, ci, k, 8, yi, ystride, lanes); break;
#else
            default: group_rows(blk, nb, kind, qi, di, si, ci, k, 4, yi, ystride, lanes); break;
#endif
            }
        }
    }
    free(sums);
    return 0;
}
#else
int packed_matmul(int kind, const uint8_t *w, int64_t n, int64_t k, const int8_t *q, const float *d, const float *s,
                  int64_t m, float *y, int64_t ystride, int threads) {
    (void)kind; (void)w; (void)n; (void)k; (void)q; (void)d; (void)s; (void)m; (void)y; (void)ystride; (void)threads;
    return -2;
}

void legacy_pack(int kind, const uint8_t *w, int64_t n, int64_t k, uint8_t *out) {
    (void)kind; (void)w; (void)n; (void)k; (void)out;
}
#endif
