/* Products of GGUF-quantized weights (Q4_0, Q4_1, Q8_0 blocks, as the file stores them) with float32 activations.

   The activations are quantized per block of 32 to int8 with a float scale (llama.cpp's Q8_1 for Q4 weights,
   Q8_0 for Q8 weights), so each block's product is an integer dot product. Where the CPU has AVX2 (or AVX-512
   VNNI) the weights are repacked a group of rows at a time and multiplied by quant_packed.c; the loops here
   multiply the file's own blocks (builds without AVX2, and weights kept unpacked), in the same arithmetic lane for
   lane, so a weight row's product is the same bit for bit in every build. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_blocks.h"

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

/* Activation rows in tiles, each weight block unpacked once per tile. */
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
            total[i] = fmaf(wd * d[i * nb + b], (float)sum, total[i]);  /* quant_packed.c's steps, explicit */
            offsets[i] = fmaf(wm, s[i * nb + b], offsets[i]);
        }
    }
    for (int i = 0; i < rows; ++i) y[i * stride] = total[i] + offsets[i];
}

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
            total[i] = fmaf(wd * d[i * nb + b], (float)sum, total[i]);
        }
    }
    for (int i = 0; i < rows; ++i) y[i * stride] = total[i];
}

/* quant_packed.c: its kinds are PACKED + the GGUF kind; without AVX2 or AVX-512 VNNI it packs nothing and refuses
   them. */
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
        for (int64_t i = 0; i < m; i += TILE) {
            const int rows = (int)(m - i < TILE ? m - i : TILE);
            if (kind == KIND_Q8_0)
                dot_q8(row, nb, q + i * k, d + i * nb, k, rows, y + i * ystride + j, ystride);
            else
                dot_q4(row, nb, kind, q + i * k, d + i * nb, s + i * nb, k, rows, y + i * ystride + j, ystride);
        }
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
