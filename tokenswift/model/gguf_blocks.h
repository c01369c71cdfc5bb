/* What the GGUF block kernels share (quant_kernels.c, kquant_kernels.c): float16 scales read from a block. */
#ifndef TOKENSWIFT_GGUF_BLOCKS_H
#define TOKENSWIFT_GGUF_BLOCKS_H
#include <stdint.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

static inline float half_to_float(uint16_t h) {
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

static inline uint16_t read_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline float read_half(const uint8_t *p) { return half_to_float(read_u16(p)); }

/* Q4_K and Q5_K's 6-bit scales and minimums of their eight sub-blocks of 32, packed in 12 bytes (p): sc[0..8]
   then mn[0..8] to out. The first four of each are the low 6 bits of bytes 0..3 (scales) and 4..7 (minimums); the
   last four's low nibbles are bytes 8..11 (scale low, minimum high) and their top 2 bits the top of bytes 0..7.
   Worked on 32-bit words, four bytes at once. */
static inline void scales_mins(const uint8_t *p, uint8_t *out) {
    uint32_t w[3], r[4];
    memcpy(w, p, 12);
    r[0] = w[0] & 0x3F3F3F3F;
    r[1] = (w[2] & 0x0F0F0F0F) | ((w[0] >> 2) & 0x30303030);
    r[2] = w[1] & 0x3F3F3F3F;
    r[3] = ((w[2] >> 4) & 0x0F0F0F0F) | ((w[1] >> 2) & 0x30303030);
    memcpy(out, r, 16);
}

/* The legacy kinds' activations: a row of x as int8 blocks of 32 with scales d and d * sum(q) per block
   (quant_kernels.c). */
void qk_quantize_row(const float *x, int64_t k, int8_t *q, float *d, float *s);
#endif
