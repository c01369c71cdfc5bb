/* The q8 KV cache's rows (kv_q8.py): a head's key or value at one slot as d 8-bit integers and their float32 scale,
   d + 4 bytes, so a 7K-token context's cache is read in about half the bytes of bf16 (a plain step at a long context
   waits on that read). x ~ scale * integer, scale = max|x| / 127, each integer rounded to the nearest (ties to even)
   from x * (127 / max|x|) as torch rounds (a prefill chunk's rows are written by torch, a step's here: both store
   the same bytes). Values keep the signed integers; keys store them plus 128, as unsigned bytes, the operand that
   vpdpbusd reads unsigned (attention_q8.c). */
#ifndef TOKENSWIFT_KV_Q8_H
#define TOKENSWIFT_KV_Q8_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define Q8_KEY_BIAS 128

/* The integers of x [d] (q8_row's rule) into out, their scale returned; their sum into *total where it is not NULL. */
static inline float q8_integers(const float *x, int64_t d, int8_t *out, int32_t *total) {
    float top = 0.0f;
    for (int64_t i = 0; i < d; ++i) top = fabsf(x[i]) > top ? fabsf(x[i]) : top;
    const float inv = top > 0.0f ? 127.0f / top : 0.0f;
    int32_t sum = 0;
    for (int64_t i = 0; i < d; ++i) {
        float v = nearbyintf(x[i] * inv);
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        out[i] = (int8_t)v;
        sum += out[i];
    }
    if (total) *total = sum;
    return top / 127.0f;
}

/* x [d] as a q8 row at `row`: a key's integers biased by Q8_KEY_BIAS, a value's as they are. */
static inline void q8_row(const float *x, int64_t d, int key, char *row) {
    int8_t v[d];
    const float scale = q8_integers(x, d, v, NULL);
    for (int64_t i = 0; i < d; ++i) row[i] = (char)(key ? (uint8_t)(v[i] + Q8_KEY_BIAS) : (uint8_t)v[i]);
    memcpy(row + d, &scale, sizeof scale);
}

static inline float q8_scale(const char *row, int64_t d) {
    float scale;
    memcpy(&scale, row + d, sizeof scale);
    return scale;
}

#endif
