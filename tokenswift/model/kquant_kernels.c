/* Products of the GGUF blocks that K-quant files hold (Q4_K, Q5_K, Q6_K super-blocks of 256, and the legacy Q5_0
   and Q5_1 blocks of 32 that their mixes use where rows are not a multiple of 256) with float32 activations: the
   activations quantized here, the products a weight row at a time where the file's blocks lie (kquant_avx2.c with
   AVX2, else this file's plain loops) or sixteen rows a group from a repacked copy (kquant_packed.c, q6k_packed.c
   with AVX-512 VNNI).

   As in llama.cpp, the activations are quantized to int8 (K kinds: one scale per 256 and the sums of each 16,
   which carry the K blocks' minimums and Q6_K's -32; Q5_x: quant_kernels.c's blocks of 32), so a super-block's
   products are integer sums that are exact whatever their order, scaled in float in the one order kquant.h
   states: every build, and every row whatever rows share the call (an autoregressive step versus a verify
   batch), computes the same floats. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kquant.h"

#define PACKED 8 /* quant_kernels.c: a packed weight's kind is PACKED + its GGUF kind's */
static int is_k(int kind) { return kind >= KIND_Q4_K; }

int64_t kq_row_bytes(int kind, int64_t k) { return k / (is_k(kind) ? QK_K : QK) * KQ_BYTES[kind]; }

/* x [k] -> int8 q with one scale per 256 (d = max |x| / 127) and the sums of each 16. */
static void quantize_row_k(const float *x, int64_t k, int8_t *q, float *d, int16_t *bsums) {
    for (int64_t b = 0; b < k / QK_K; ++b) {
        const float *xb = x + b * QK_K;
        float amax = 0.0f;
        for (int i = 0; i < QK_K; ++i) {  /* fmaxf would be a libm call per element */
            const float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
        }
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
int kq_weight(int kind, const uint8_t *blk, int l) {
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

#ifndef KQ_AVX2
/* The portable dot products: one weight row (nb blocks) with activation row i, in kquant.h's order. */
static float dot_k_portable(int kind, const uint8_t *row, const struct acts *a, int64_t i) {
    const int8_t *x = a->q + i * a->k;
    const int16_t *bs = a->bsums + i * a->k / 16;
    float acc = 0.0f;
    for (int64_t b = 0; b < a->nb; ++b, x += QK_K, bs += 16) {
        const uint8_t *blk = row + b * KQ_BYTES[kind];
        const float dx = a->d[i * a->nb + b];
        int32_t isum = 0, imin = 0;
        if (kind == KIND_Q6_K) {
            const int8_t *sc = (const int8_t *)(blk + 192);
            for (int g = 0; g < 16; ++g) {
                int32_t dot = 0;
                for (int l = 16 * g; l < 16 * g + 16; ++l) dot += kq_weight(kind, blk, l) * x[l];
                isum += sc[g] * (dot - 32 * bs[g]);
            }
            acc = fmaf(read_half(blk + 208) * dx, (float)isum, acc);
            continue;
        }
        uint8_t scm[16];
        scales_mins(blk + 4, scm);
        for (int s = 0; s < 8; ++s) {
            int32_t dot = 0;
            for (int l = 32 * s; l < 32 * s + 32; ++l) dot += kq_weight(kind, blk, l) * x[l];
            isum += scm[s] * dot;
            imin += scm[8 + s] * (bs[2 * s] + bs[2 * s + 1]);
        }
        acc = fmaf(read_half(blk) * dx, (float)isum, acc);
        acc = fmaf(-(read_half(blk + 2) * dx), (float)imin, acc);
    }
    return acc;
}

/* Q5_0 (w = d (q - 16)) and Q5_1 (w = d q + m): 4 bytes of fifth bits, then 16 bytes of nibbles (byte j holds
   weights j and j + 16). */
static float dot_q5_portable(int kind, const uint8_t *row, const struct acts *a, int64_t i) {
    const int8_t *x = a->q + i * a->k;
    const float *d = a->d + i * a->nb, *s = a->s + i * a->nb;
    const int64_t head = kind == KIND_Q5_1 ? 4 : 2;
    float acc = 0.0f, off = 0.0f;
    for (int64_t b = 0; b < a->nb; ++b, x += QK) {
        const uint8_t *blk = row + b * KQ_BYTES[kind], *qs = blk + head + 4;
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
#endif

/* y[i * ystride + j] = activation row i times weight row j, for weight rows [0, n). */
static void products(int kind, const uint8_t *w, int64_t n, const struct acts *a, int64_t m, float *y,
                     int64_t ystride, int threads) {
    const int64_t row_bytes = a->nb * KQ_BYTES[kind];
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t j = 0; j < n; ++j) {
        const uint8_t *row = w + j * row_bytes;
#ifdef KQ_AVX2
        for (int64_t i = 0; i < m; i += KQ_TILE)
            kq_rows_avx2(kind, row, a, i, (int)(m - i < KQ_TILE ? m - i : KQ_TILE), y + i * ystride + j, ystride);
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
    const int packed = kind >= PACKED;  /* kquant_packed.c and q6k_packed.c's layouts */
    if (packed) kind -= PACKED;
    struct acts a = {0};
    int status = quantize(kind, x, m, k, &a);
    if (status == 0 && packed)
        status = kq_packed_products(kind, w, n, &a, m, y, ystride, threads);
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
        const uint8_t *blk = w + b * KQ_BYTES[kind];
        float *o = out + b * per;
        if (kind == KIND_Q6_K) {
            const float d = read_half(blk + 208);
            const int8_t *sc = (const int8_t *)(blk + 192);
            for (int l = 0; l < QK_K; ++l) o[l] = d * (float)sc[l / 16] * (float)(kq_weight(kind, blk, l) - 32);
        } else if (is_k(kind)) {
            uint8_t scm[16];
            scales_mins(blk + 4, scm);
            const float d = read_half(blk), dmin = read_half(blk + 2);
            for (int l = 0; l < QK_K; ++l) {
                const float scale = d * (float)scm[l / 32], shift = dmin * (float)scm[8 + l / 32];
                o[l] = scale * (float)kq_weight(kind, blk, l) - shift;
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
