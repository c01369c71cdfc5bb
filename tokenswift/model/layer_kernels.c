/* The elementwise steps of a decoder layer for a few rows on the CPU, in float32: RMSNorm (with the residual
   add before it), RoPE with the cache write, SwiGLU. Each replaces a chain of 3 to 14 torch operators whose
   dispatch, not arithmetic, was the cost: a decoding step of the default model ran ~1,240 of them, about 11 ms
   of a 29 ms q4 step on this machine. The arithmetic is torch's, in the same order, per row. */
#include <math.h>
#include <stdint.h>

/* out[r] = w * (x[r] * 1 / sqrt(mean(x[r]^2) + eps)) for rows x [rows, d]. */
void rms_norm(const float *x, const float *w, float eps, int64_t rows, int64_t d, float *out) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * d;
        float *o = out + r * d;
        float sum = 0.0f;
        for (int64_t i = 0; i < d; ++i) sum += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(sum / (float)d + eps);
        for (int64_t i = 0; i < d; ++i) o[i] = w[i] * (xr[i] * inv);
    }
}

/* sum = x + y, then out = rms_norm(sum): a residual add and the next norm. */
void add_rms_norm(const float *x, const float *y, const float *w, float eps, int64_t rows, int64_t d, float *sum,
                  float *out) {
    for (int64_t i = 0; i < rows * d; ++i) sum[i] = x[i] + y[i];
    rms_norm(sum, w, eps, rows, d, out);
}

/* qkv [t, heads + 2 kv_heads, d] (one product's rows: q heads, k heads, v heads) -> q [t, heads, d] rotated, and
   the rotated k and the v of token i written to slot slots[i] of keys and values (element (head, slot, j) at
   head * head_stride + slot * slot_stride + j). cos, sin: [t, d] rope_table rows (sin's first half negated):
   x * cos + roll(x, d / 2) * sin, as rope.apply_rope. */
void rope_store(const float *qkv, const float *cos, const float *sin, int64_t t, int64_t heads, int64_t kv_heads,
                int64_t d, const int64_t *slots, float *keys, float *values, int64_t head_stride,
                int64_t slot_stride, float *q) {
    const int64_t width = (heads + 2 * kv_heads) * d, half = d / 2;
    for (int64_t i = 0; i < t; ++i) {
        const float *row = qkv + i * width, *c = cos + i * d, *s = sin + i * d;
        for (int64_t h = 0; h < heads + kv_heads; ++h) {
            const float *x = row + h * d;
            float *o = h < heads ? q + (i * heads + h) * d : keys + (h - heads) * head_stride + slots[i] * slot_stride;
            for (int64_t j = 0; j < d; ++j) {
                const float a = x[j] * c[j], b = x[j < half ? j + half : j - half] * s[j];
                o[j] = a + b;
            }
        }
        for (int64_t h = 0; h < kv_heads; ++h) {
            const float *x = row + (heads + kv_heads + h) * d;
            float *o = values + h * head_stride + slots[i] * slot_stride;
            for (int64_t j = 0; j < d; ++j) o[j] = x[j];
        }
    }
}

/* gate_up [rows, 2 n] (gate, then up) -> out [rows, n] = silu(gate) * up, silu(x) = x / (1 + exp(-x)). */
void swiglu(const float *gate_up, int64_t rows, int64_t n, float *out) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *g = gate_up + r * 2 * n, *u = g + n;
        float *o = out + r * n;
        for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LK_INLINE static inline __attribute__((always_inline))

LK_INLINE float lk_hsum(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* R rows of x (1 to 8) against weight row w: one accumulator per row, then the tail, in the same order whatever R
   (a row's product does not depend on the rows beside it). One chain of fused multiply-adds per row still
   outruns the memory that feeds it. */
LK_INLINE void dot_f32_rows(const float *w, const float *x, int64_t k, const int R, float *y, int64_t stride) {
    __m256 acc[8];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256 wv = _mm256_loadu_ps(w + i);
        for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * k + i), acc[r]);
    }
    for (int r = 0; r < R; ++r) {
        float sum = lk_hsum(acc[r]);
        for (int64_t j = i; j < k; ++j) sum = fmaf(w[j], x[r * k + j], sum);
        y[r * stride] = sum;
    }
}
#endif

/* y[m, n] = x[m, k] @ w[n, k].T for a few rows (one pass over the weight per 8 rows), the weight's rows shared
   among `threads` OpenMP threads. MKL's one-row product reached two thirds of the memory bandwidth here and its
   few-row GEMM re-packs the weight on every call. */
void f32_matmul(const float *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t j = 0; j < n; ++j) {
        const float *row = w + j * k;
#if defined(__AVX2__) && defined(__FMA__)
        for (int64_t r = 0; r < m; r += 8) {
            const float *xr = x + r * k;
            float *yr = y + r * n + j;
            switch (m - r) {
            case 1: dot_f32_rows(row, xr, k, 1, yr, n); break;
            case 2: dot_f32_rows(row, xr, k, 2, yr, n); break;
            case 3: dot_f32_rows(row, xr, k, 3, yr, n); break;
            case 4: dot_f32_rows(row, xr, k, 4, yr, n); break;
            case 5: dot_f32_rows(row, xr, k, 5, yr, n); break;
            case 6: dot_f32_rows(row, xr, k, 6, yr, n); break;
            case 7: dot_f32_rows(row, xr, k, 7, yr, n); break;
            default: dot_f32_rows(row, xr, k, 8, yr, n); break;
            }
        }
#else
        for (int64_t r = 0; r < m; ++r) {
            float sum = 0.0f;
            for (int64_t i = 0; i < k; ++i) sum = fmaf(row[i], x[r * k + i], sum);
            y[r * n + j] = sum;
        }
#endif
    }
}
