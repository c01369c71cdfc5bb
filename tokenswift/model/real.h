/* The element type of the row kernels (attention_kernel.c, layer_kernels.c): float32, or float64 where built with
   -DTS_DOUBLE (native.py builds both; the exactness tests run float64 models through the same steps). The AVX2
   paths are float32's; float64 takes the portable loops' order. Where the CPU has AVX2 and FMA, float64's products,
   scores and weighted values run in four lanes (layer_kernels.c's dot_lanes, attention_f64.h), each lane the
   portable loops' operations in their order as gcc compiles them, so the same bits; its scores' exp runs in four
   lanes too (attention_parts.h), Cephes' exp, which a float64 build without AVX2 (libm's) rounds otherwise. */
#ifndef TOKENSWIFT_REAL_H
#define TOKENSWIFT_REAL_H
#include <math.h>
#ifdef TS_DOUBLE
typedef double real;
#define SQRT sqrt
#define EXP exp
#define FMA fma
#define FMAX fmax
#else
typedef float real;
#define SQRT sqrtf
#define EXP expf
#define FMA fmaf
#define FMAX fmaxf
#if defined(__AVX2__) && defined(__FMA__)
#define TS_AVX2 1
#endif
#endif

#include <stdint.h>
#include <string.h>
/* What a KV cache holds (native_rows.cache_element): reals, bf16 (below) or q8 rows (kv_q8.h). */
enum { KV_REAL = 0, KV_BF16 = 1, KV_Q8 = 2 };

/* A compact KV cache keeps keys and values in bfloat16, the upper half of a float32's bits (kv_cache.py). A value is
   rounded to the nearest, ties to even, as torch rounds (a prefill chunk's keys are written by torch, a step's
   here: both must store the same bits); NaN stays a quiet NaN. Reading widens exactly. */
static inline uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
#endif
