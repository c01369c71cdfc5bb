/* Products of GGUF-quantized weights (Q4_0, Q4_1, Q8_0 blocks, as the file stores them) with float32 activations.

   The activations are quantized per block of 32 to int8 with a float scale (llama.cpp's Q8_1 for Q4 weights,
   Q8_0 for Q8 weights), so each block's product is an integer dot product: on AVX2, 32 multiply-adds in two
   instructions (maddubs + madd), the way llama.cpp computes it. The weights are read once per call whatever the
   number of activation rows. Without AVX2 the same arithmetic runs as plain loops. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_blocks.h"
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "simd.h"
#define QK_AVX2 1
#endif

#define QK 32
enum { KIND_Q4_0 = 0, KIND_Q4_1 = 1, KIND_Q8_0 = 2, KIND_Q5_1 = 4 };
static const int64_t BLOCK_BYTES[3] = {18, 20, 34};

/* One row of x -> int8 blocks q, scales d and d * sum(q) per block. */
void qk_quantize_row(const float *x, int64_t k, int8_t *q, float *d, float *s) {
    for (int64_t b = 0; b < k / QK; ++b) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        for (int i = 0; i < QK; ++i) {  /* fmaxf would be a libm call per element */
            const float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
        }
        const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < QK; ++i) {
            const int v = (int)nearbyintf(xb[i] * inv);
            q[b * QK + i] = (int8_t)v;
            sum += v;
        }
        d[b] = scale;
        s[b] = scale * (float)sum;
    }
}

#ifdef QK_AVX2
static inline __m256 block_dot(__m256i w_u8, __m256i x_i8) {  /* 32 (u8 * s8) -> 8 float partial sums */
    const __m256i pairs = _mm256_maddubs_epi16(w_u8, x_i8);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif

#ifndef QK_AVX2
/* The portable path: activation rows in tiles, each weight block unpacked once per tile. */
#define TILE 8

/* Byte j of a Q4 block holds weight j in its low nibble and weight j + 16 in its high one. w = d * q + m
   (Q4_1), w = d * (q - 8) (Q4_0, so m = -8d): sum_j w_j x_j = d dx sum(q x) + m dx sum(xq). Writes the
   products of one weight row with rows [0, rows) of the quantized activations to y[i * stride]. */
static void dot_q4(const uint8_t *row, int64_t nb, int kind, const int8_t *q, const float *d, const float *s,
                   int64_t k, int rows, float *y, int64_t stride) {
    const int64_t bytes = BLOCK_BYTES[kind], nibbles = kind == KIND_Q4_1 ? 4 : 2;
    float total[TILE] = {0}, offsets[TILE] = {0};
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = row + b * bytes;
        const float wd = half_to_float(read_u16(blk));
        const float wm = kind == KIND_Q4_1 ? half_to_float(read_u16(blk + 2)) : -8.0f * wd;
        for (int i = 0; i < rows; ++i) {
            const int8_t *xb = q + i * k + b * QK;
            int sum = 0;
            for (int j = 0; j < QK / 2; ++j)
                sum += (blk[nibbles + j] & 0x0F) * xb[j] + (blk[nibbles + j] >> 4) * xb[j + QK / 2];
            total[i] += wd * d[i * nb + b] * (float)sum;
            offsets[i] += wm * s[i * nb + b];
        }
    }
    for (int i = 0; i < rows; ++i) y[i * stride] = total[i] + offsets[i];
}
#endif

#ifdef QK_AVX2
/* One activation row (a decoding step): accumulators in registers, two of each so that consecutive blocks' fused
   multiply-adds do not wait on each other. The offsets' multiply-adds are explicit fmaf: the compiler may contract
   a * b + c or not, differently here and in the tiles of dot_q4_rows, whose sums must be the same. */
static float dot_q4_row(const uint8_t *row, int64_t nb, int kind, const int8_t *q, const float *d, const float *s) {
    const int64_t bytes = BLOCK_BYTES[kind], nibbles = kind == KIND_Q4_1 ? 4 : 2;
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float off0 = 0.0f, off1 = 0.0f;
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const uint8_t *b0 = row + b * bytes, *b1 = b0 + bytes;
        const float d0 = half_to_float(read_u16(b0)), d1 = half_to_float(read_u16(b1));
        const float m0 = kind == KIND_Q4_1 ? half_to_float(read_u16(b0 + 2)) : -8.0f * d0;
        const float m1 = kind == KIND_Q4_1 ? half_to_float(read_u16(b1 + 2)) : -8.0f * d1;
        const __m128i r0 = _mm_loadu_si128((const __m128i *)(b0 + nibbles));
        const __m128i r1 = _mm_loadu_si128((const __m128i *)(b1 + nibbles));
        const __m256i w0 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(r0, 4), r0), low);
        const __m256i w1 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(r1, 4), r1), low);
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(q + b * QK));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(q + (b + 1) * QK));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * d[b]), block_dot(w0, x0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1 * d[b + 1]), block_dot(w1, x1), acc1);
        off0 = fmaf(m0, s[b], off0);
        off1 = fmaf(m1, s[b + 1], off1);
    }
    for (; b < nb; ++b) {
        const uint8_t *b0 = row + b * bytes;
        const float d0 = half_to_float(read_u16(b0));
        const float m0 = kind == KIND_Q4_1 ? half_to_float(read_u16(b0 + 2)) : -8.0f * d0;
        const __m128i r0 = _mm_loadu_si128((const __m128i *)(b0 + nibbles));
        const __m256i w0 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(r0, 4), r0), low);
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(q + b * QK));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * d[b]), block_dot(w0, x0), acc0);
        off0 = fmaf(m0, s[b], off0);
    }
    return hsum(_mm256_add_ps(acc0, acc1)) + (off0 + off1);
}

static float dot_q8_row(const uint8_t *row, int64_t nb, const int8_t *q, const float *d) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const uint8_t *b0 = row + b * 34, *b1 = b0 + 34;
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(b0 + 2));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(b1 + 2));
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(q + b * QK));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(q + (b + 1) * QK));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(read_u16(b0)) * d[b]),
                               block_dot(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(x0, w0)), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(read_u16(b1)) * d[b + 1]),
                               block_dot(_mm256_sign_epi8(w1, w1), _mm256_sign_epi8(x1, w1)), acc1);
    }
    for (; b < nb; ++b) {
        const uint8_t *b0 = row + b * 34;
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(b0 + 2));
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(q + b * QK));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(read_u16(b0)) * d[b]),
                               block_dot(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(x0, w0)), acc0);
    }
    return hsum(_mm256_add_ps(acc0, acc1));
}

#define INLINE static inline __attribute__((always_inline))

/* R activation rows (2 to 4) against one weight row, each block unpacked once for all of them: every row's sums in
   registers and in the order of dot_q4_row / dot_q8_row (even and odd blocks apart), so a row's product is the same
   whatever rows share the call (an AR step versus a verify batch). */
INLINE void dot_q4_rows(const uint8_t *row, int64_t nb, int kind, const int8_t *q, const float *d, const float *s,
                        int64_t k, const int R, float *y, int64_t stride) {
    const int64_t bytes = BLOCK_BYTES[kind], nibbles = kind == KIND_Q4_1 ? 4 : 2;
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[2][4];
    float off[2][4];
    for (int i = 0; i < R; ++i) {
        acc[0][i] = acc[1][i] = _mm256_setzero_ps();
        off[0][i] = off[1][i] = 0.0f;
    }
    for (int64_t b = 0; b < nb; ++b) {
        const int half = (int)(b & 1);
        const uint8_t *blk = row + b * bytes;
        const float wd = half_to_float(read_u16(blk));
        const float wm = kind == KIND_Q4_1 ? half_to_float(read_u16(blk + 2)) : -8.0f * wd;
        const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + nibbles));
        const __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
        for (int i = 0; i < R; ++i) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(q + i * k + b * QK));
            if (half) {
                acc[1][i] = _mm256_fmadd_ps(_mm256_set1_ps(wd * d[i * nb + b]), block_dot(w, x), acc[1][i]);
                off[1][i] = fmaf(wm, s[i * nb + b], off[1][i]);
            } else {
                acc[0][i] = _mm256_fmadd_ps(_mm256_set1_ps(wd * d[i * nb + b]), block_dot(w, x), acc[0][i]);
                off[0][i] = fmaf(wm, s[i * nb + b], off[0][i]);
            }
        }
    }
    for (int i = 0; i < R; ++i) y[i * stride] = hsum(_mm256_add_ps(acc[0][i], acc[1][i])) + (off[0][i] + off[1][i]);
}

INLINE void dot_q8_rows(const uint8_t *row, int64_t nb, const int8_t *q, const float *d, int64_t k, const int R,
                        float *y, int64_t stride) {
    __m256 acc[2][4];
    for (int i = 0; i < R; ++i) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = row + b * 34;
        const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
        const __m256i w_abs = _mm256_sign_epi8(w, w);
        const float wd = half_to_float(read_u16(blk));
        for (int i = 0; i < R; ++i) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(q + i * k + b * QK));
            const __m256 p = block_dot(w_abs, _mm256_sign_epi8(x, w));
            if (b & 1)
                acc[1][i] = _mm256_fmadd_ps(_mm256_set1_ps(wd * d[i * nb + b]), p, acc[1][i]);
            else
                acc[0][i] = _mm256_fmadd_ps(_mm256_set1_ps(wd * d[i * nb + b]), p, acc[0][i]);
        }
    }
    for (int i = 0; i < R; ++i) y[i * stride] = hsum(_mm256_add_ps(acc[0][i], acc[1][i]));
}

/* Rows [0, rows) of the activations against one weight row, in register tiles of up to 4. */
static void dot_rows(const uint8_t *row, int64_t nb, int kind, const int8_t *q, const float *d, const float *s,
                     int64_t k, int64_t rows, float *y, int64_t stride) {
    for (int64_t i = 0; i < rows;) {
        const int64_t left = rows - i;
        const int8_t *qi = q + i * k;
        const float *di = d + i * nb, *si = s + i * nb;
        float *yi = y + i * stride;
        if (kind == KIND_Q8_0) {
            if (left >= 4) dot_q8_rows(row, nb, qi, di, k, 4, yi, stride);
            else if (left == 3) dot_q8_rows(row, nb, qi, di, k, 3, yi, stride);
            else if (left == 2) dot_q8_rows(row, nb, qi, di, k, 2, yi, stride);
            else *yi = dot_q8_row(row, nb, qi, di);
        } else {
            if (left >= 4) dot_q4_rows(row, nb, kind, qi, di, si, k, 4, yi, stride);
            else if (left == 3) dot_q4_rows(row, nb, kind, qi, di, si, k, 3, yi, stride);
            else if (left == 2) dot_q4_rows(row, nb, kind, qi, di, si, k, 2, yi, stride);
            else *yi = dot_q4_row(row, nb, kind, qi, di, si);
        }
        i += left >= 4 ? 4 : left;
    }
}
#endif

#ifndef QK_AVX2
/* Q8_0: w = d * q, q int8. */
static void dot_q8(const uint8_t *row, int64_t nb, const int8_t *q, const float *d, int64_t k, int rows, float *y,
                   int64_t stride) {
    float total[TILE] = {0};
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = row + b * 34;
        const int8_t *wq = (const int8_t *)(blk + 2);
        const float wd = half_to_float(read_u16(blk));
        for (int i = 0; i < rows; ++i) {
            const int8_t *xb = q + i * k + b * QK;
            int sum = 0;
            for (int j = 0; j < QK; ++j) sum += wq[j] * xb[j];
            total[i] += wd * d[i * nb + b] * (float)sum;
        }
    }
    for (int i = 0; i < rows; ++i) y[i * stride] = total[i];
}
#endif

/* quant_packed.c: its kinds are PACKED + the GGUF kind; without AVX-512 VNNI it packs nothing and refuses them. */
#define PACKED 8
int packed_matmul(int kind, const uint8_t *w, int64_t n, int64_t k, const int8_t *q, const float *d, const float *s,
                  int64_t m, float *y, int64_t ystride, int threads);
/* kquant_kernels.c: Q5_0, Q5_1 and the K-quants, kinds K_FIRST.. */
#define K_FIRST 3
#define K_LAST 7
int kq_matmul(int kind, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int64_t ystride,
              int threads);
int64_t legacy_packed_bytes(int kind, int64_t n, int64_t k);
void legacy_pack(int kind, const uint8_t *w, int64_t n, int64_t k, uint8_t *out);
int64_t kq_packed_bytes(int kind, int64_t n, int64_t k);  /* kquant_packed.c: Q4_K, Q5_K, Q6_K */
void kq_pack(int kind, const uint8_t *w, int64_t n, int64_t k, uint8_t *out);
void kq_rows(int kind, const uint8_t *w, int64_t k, int64_t count, float *out);
int64_t kq_row_bytes(int kind, int64_t k);
/* A product whose rows are several weights' in turn (q/k/v, gate/up: a file may store them in different kinds),
   each read where it lies: w points to STACKED's parts, their rows adding up to n. */
#define STACKED 16
struct part {
    int64_t kind, rows;
    const uint8_t *w;
};

/* The columns [0, n) of y (rows of ystride floats) for the legacy kinds, plain or packed. */
static int legacy_matmul(int kind, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
                         int64_t ystride, int threads) {
    const int packed = kind >= PACKED;
    if (packed) kind -= PACKED;  /* Q4_0, Q4_1, Q8_0, Q5_0 or Q5_1; else one of the first three */
    const int64_t nb = k / QK;
    int8_t *q = malloc((size_t)(m * k));
    float *d = malloc((size_t)(m * nb) * sizeof(float)), *s = malloc((size_t)(m * nb) * sizeof(float));
    if (!q || !d || !s) {
        free(q); free(d); free(s);
        return -1;
    }
    for (int64_t i = 0; i < m; ++i) qk_quantize_row(x + i * k, k, q + i * k, d + i * nb, s + i * nb);
    if (packed) {
        const int status = packed_matmul(kind, w, n, k, q, d, s, m, y, ystride, threads);
        free(q); free(d); free(s);
        return status;
    }
    const int64_t row_bytes = nb * BLOCK_BYTES[kind];
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t j = 0; j < n; ++j) {
        const uint8_t *row = w + j * row_bytes;
#ifdef QK_AVX2
        dot_rows(row, nb, kind, q, d, s, k, m, y + j, ystride);
#else
        for (int64_t i = 0; i < m; i += TILE) {
            const int rows = (int)(m - i < TILE ? m - i : TILE);
            if (kind == KIND_Q8_0)
                dot_q8(row, nb, q + i * k, d + i * nb, k, rows, y + i * ystride + j, ystride);
            else
                dot_q4(row, nb, kind, q + i * k, d + i * nb, s + i * nb, k, rows, y + i * ystride + j, ystride);
        }
#endif
    }
    free(q); free(d); free(s);
    return 0;
}

static int matmul_into(int kind, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
                       int64_t ystride, int threads) {
    if (kind == STACKED) {
        const struct part *p = (const struct part *)w;
        for (int64_t row = 0; row < n; row += p->rows, ++p)
            if (matmul_into((int)p->kind, p->w, p->rows, k, x, m, y + row, ystride, threads))
                return -1;
        return 0;
    }
    if ((kind >= K_FIRST && kind <= K_LAST) || kind - PACKED > KIND_Q5_1)
        return kq_matmul(kind, w, n, k, x, m, y, ystride, threads);
    return legacy_matmul(kind, w, n, k, x, m, y, ystride, threads);
}

/* The bytes qk_pack writes for an n x k weight of `kind`, or 0 where this build or kind has no packed products. */
int64_t qk_packed_bytes(int kind, int64_t n, int64_t k) {
    return kind <= KIND_Q5_1 ? legacy_packed_bytes(kind, n, k) : kq_packed_bytes(kind, n, k);
}

/* Writes the packed form of W (`kind` blocks, [n, k / block]) to out; its products take kind PACKED + kind. */
void qk_pack(int kind, const uint8_t *w, int64_t n, int64_t k, uint8_t *out) {
    if (kind <= KIND_Q5_1)
        legacy_pack(kind, w, n, k, out);
    else
        kq_pack(kind, w, n, k, out);
}

/* y[m, n] = x[m, k] @ W[n, k].T for W in `kind` blocks ([n, k / block, block bytes]), packed by qk_pack (kind
   PACKED + the GGUF kind), or STACKED parts. Returns 0, or -1 when out of memory. Rows of W are shared among
   `threads` OpenMP threads. Each row of x is computed alone, the same whatever rows share the call. */
int qk_matmul(int kind, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int threads) {
    return matmul_into(kind, w, n, k, x, m, y, n, threads);
}

/* The first `count` rows of W, dequantized to float32. */
void qk_rows(int kind, const uint8_t *w, int64_t k, int64_t count, float *out) {
    if (kind >= K_FIRST && kind <= K_LAST) {
        kq_rows(kind, w, k, count, out);
        return;
    }
    const int64_t nb = k / QK, bytes = BLOCK_BYTES[kind], nibbles = kind == KIND_Q4_1 ? 4 : 2;
    for (int64_t r = 0; r < count; ++r) {
        const uint8_t *row = w + r * nb * bytes;
        float *o = out + r * k;
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *blk = row + b * bytes;
            const float wd = half_to_float(read_u16(blk));
            if (kind == KIND_Q8_0) {
                for (int j = 0; j < QK; ++j) o[b * QK + j] = wd * (float)((const int8_t *)(blk + 2))[j];
                continue;
            }
            const float wm = kind == KIND_Q4_1 ? half_to_float(read_u16(blk + 2)) : -8.0f * wd;
            for (int j = 0; j < QK / 2; ++j) {
                o[b * QK + j] = wd * (float)(blk[nibbles + j] & 0x0F) + wm;
                o[b * QK + j + QK / 2] = wd * (float)(blk[nibbles + j] >> 4) + wm;
            }
        }
    }
}

/* Rows ids[0..count) of W (`kind` blocks), dequantized to float32: an embedding's lookup. */
void qk_take(int kind, const uint8_t *w, int64_t k, const int64_t *ids, int64_t count, float *out) {
    const int64_t row_bytes = kind >= K_FIRST && kind <= K_LAST ? kq_row_bytes(kind, k) : k / QK * BLOCK_BYTES[kind];
    for (int64_t i = 0; i < count; ++i) qk_rows(kind, w + ids[i] * row_bytes, k, 1, out + i * k);
}
