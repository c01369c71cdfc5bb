/* What the K-quant kernels share (kquant_kernels.c: activations, dispatch, portable products; kquant_avx2.c: AVX2
   products a weight row at a time; kquant_packed.c, q6k_packed.c: AVX-512 VNNI products of repacked weights).

   Every path computes the same floats, bit for bit: a block's integer sums are exact whatever their order, and
   each (activation row, weight row) pair is scaled in one fixed order, per super-block b of 256 (or block of 32):
     Q4_K, Q5_K: acc = fma(d dx, isum_b, acc); acc = fma(-(dmin dx), imin_b, acc)   (isum = sum_s sc_s dot_s,
                 imin = sum_s mn_s sum_s(x))
     Q6_K:       acc = fma(d dx, isum_b, acc)   (isum = sum_g sc_g (dot_g - 32 sum_g(x)))
     Q5_0, Q5_1: acc = fma(d dx, dot_b, acc); off = fma(m, dx sum(x), off); result acc + off (Q5_0: m = -16 d)
   with the integers converted to float once, so a row's product is the same in every build and in every batch. */
#ifndef TOKENSWIFT_KQUANT_H
#define TOKENSWIFT_KQUANT_H
#include <stdint.h>

#include "gguf_blocks.h"

#define QK 32
#define QK_K 256
#define KQ_TILE 4 /* activation rows per pass over a weight row or group (the weights unpacked once for them) */
enum { KIND_Q5_0 = 3, KIND_Q5_1 = 4, KIND_Q4_K = 5, KIND_Q5_K = 6, KIND_Q6_K = 7 };
static const int64_t KQ_BYTES[8] = {0, 0, 0, 22, 24, 144, 176, 210};

/* The quantized activation rows: q [m, k] int8; d, one scale per block (of 256, or of 32 for Q5_x); s, Q5_x's
   d * sum(q) per block; bsums, the K kinds' sums of q per 16 [m, k / 16]. */
struct acts {
    int8_t *q;
    float *d, *s;
    int16_t *bsums;
    int64_t k, nb;
};

/* kquant_kernels.c: weight l (0..255) of a K super-block, unsigned (Q6_K: 0..63, w = d sc (q - 32)). */
int kq_weight(int kind, const uint8_t *blk, int l);

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KQ_AVX2 1
/* kquant_avx2.c: rows [i, i + R) of the activations (R <= KQ_TILE) against one weight row, to y[r * stride]. */
void kq_rows_avx2(int kind, const uint8_t *row, const struct acts *a, int64_t i, int R, float *y, int64_t stride);
#endif

/* kquant_packed.c (Q4_K, Q5_K) and q6k_packed.c (Q6_K): sixteen weight rows a group, on AVX-512 VNNI;
   kq_packed_bytes is 0 where this build or kind has no packed form. */
int64_t kq_packed_bytes(int kind, int64_t n, int64_t k);
void kq_pack(int kind, const uint8_t *w, int64_t n, int64_t k, uint8_t *out);
int kq_packed_products(int kind, const uint8_t *w, int64_t n, const struct acts *a, int64_t m, float *y,
                       int64_t ystride, int threads);
#define KQ_LANES 16      /* weight rows per packed group */
#define Q4K_GROUP 2496   /* bytes of a group's super-block: kquant_packed.c's layouts */
#define Q5K_GROUP 3008
#define Q6K_GROUP 3360   /* q6k_packed.c's: sixteen rows of 210 bytes, as the file's */
void q6k_pack(const uint8_t *w, int64_t n, int64_t k, uint8_t *out);
void q6k_group(const uint8_t *blk, const struct acts *a, int64_t i, int R, float *y, int64_t stride, int lanes);
#endif
