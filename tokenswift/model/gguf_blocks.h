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

/* The legacy kinds' activations: a row of x as int8 blocks of 32 with scales d and d * sum(q) per block
   (quant_kernels.c). */
void qk_quantize_row(const float *x, int64_t k, int8_t *q, float *d, float *s);
#endif
