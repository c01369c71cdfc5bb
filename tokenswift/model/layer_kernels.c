/* The elementwise steps of a decoder layer for a few rows on the CPU, in float32: RMSNorm (with the residual
   add before it), RoPE with the cache write, SwiGLU. Each replaces a chain of 3 to 14 torch operators whose
   dispatch, not arithmetic, was the cost: a decoding step of the default model ran ~1,240 of them, about 11 ms
   of a 29 ms q4 step on this machine. The arithmetic is torch's, in the same order, per row. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* out[r] = w * (x[r] * 1 / sqrt(mean(x[r]^2) + eps)) for rows x [rows, d]. */
static void rms_norm(const float *x, const float *w, float eps, int64_t rows, int64_t d, float *out) {
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
static void add_rms_norm(const float *x, const float *y, const float *w, float eps, int64_t rows, int64_t d,
                         float *sum, float *out) {
    for (int64_t i = 0; i < rows * d; ++i) sum[i] = x[i] + y[i];
    rms_norm(sum, w, eps, rows, d, out);
}

/* qkv [t, heads + 2 kv_heads, d] (one product's rows: q heads, k heads, v heads) -> q [t, heads, d] rotated, and
   the rotated k and the v of token i written to slot slots[i] of keys and values (element (head, slot, j) at
   head * head_stride + slot * slot_stride + j). cos, sin: [t, d] rope_table rows (sin's first half negated):
   x * cos + roll(x, d / 2) * sin, as rope.apply_rope. */
static void rope_store(const float *qkv, const float *cos, const float *sin, int64_t t, int64_t heads,
                       int64_t kv_heads, int64_t d, const int64_t *slots, float *keys, float *values,
                       int64_t head_stride, int64_t slot_stride, float *q) {
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
static void swiglu(const float *gate_up, int64_t rows, int64_t n, float *out) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *g = gate_up + r * 2 * n, *u = g + n;
        float *o = out + r * n;
        for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

#if defined(__AVX2__) && defined(__FMA__)
#include "simd.h"
#define LK_INLINE static inline __attribute__((always_inline))

/* R rows of x (1 to 4) against weight row w. A row's sum runs in two accumulators, even and odd blocks of 8, then
   the tail, in the same order whatever R (a row's product does not depend on the rows beside it). One chain of
   multiply-adds per row held a core to ~80% of the memory bandwidth it reads; two chains of four rows (eight
   accumulators) stay in the registers. */
LK_INLINE void dot_f32_rows(const float *w, const float *x, int64_t k, const int R, float *y, int64_t stride) {
    __m256 even[4], odd[4];
    for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m256 w0 = _mm256_loadu_ps(w + i), w1 = _mm256_loadu_ps(w + i + 8);
        for (int r = 0; r < R; ++r) {
            even[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k + i), even[r]);
            odd[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * k + i + 8), odd[r]);
        }
    }
    if (i + 8 <= k) {
        const __m256 w0 = _mm256_loadu_ps(w + i);
        for (int r = 0; r < R; ++r) even[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k + i), even[r]);
        i += 8;
    }
    for (int r = 0; r < R; ++r) {
        float sum = hsum(_mm256_add_ps(even[r], odd[r]));
        for (int64_t j = i; j < k; ++j) sum = fmaf(w[j], x[r * k + j], sum);
        y[r * stride] = sum;
    }
}
#endif

/* y[m, n] = x[m, k] @ w[n, k].T for a few rows (the weight read from memory once), the weight's rows shared
   among `threads` OpenMP threads. MKL's one-row product reached two thirds of the memory bandwidth here and its
   few-row GEMM re-packs the weight on every call. */
void f32_matmul(const float *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t j = 0; j < n; ++j) {
        const float *row = w + j * k;
#if defined(__AVX2__) && defined(__FMA__)
        for (int64_t r = 0; r < m; r += 4) {  /* the weight row is read from L1 for the next four */
            const float *xr = x + r * k;
            float *yr = y + r * n + j;
            switch (m - r) {
            case 1: dot_f32_rows(row, xr, k, 1, yr, n); break;
            case 2: dot_f32_rows(row, xr, k, 2, yr, n); break;
            case 3: dot_f32_rows(row, xr, k, 3, yr, n); break;
            default: dot_f32_rows(row, xr, k, 4, yr, n); break;
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

/* A decoder layer in two calls around its attention (native_rows.NativeBlock), so that a step's ~40 operators a
   layer, each dispatched from Python, are two calls: the Python around them cost ~10 ms of a 45 ms float32 step. */

int qk_matmul(int kind, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int threads);

struct product {  /* one of a layer's four weights: float32 [n, k] (kind -1) or GGUF blocks (quant_kernels.c) */
    const void *weight;
    const float *bias;  /* [n] or NULL */
    int64_t n, k, kind;
};

struct block {
    struct product qkv, o, gate_up, down;  /* qkv: rows q, k, v; gate_up: rows gate, up */
    const float *input_norm, *post_norm;
    double eps;
    int64_t dim, heads, kv_heads, head_dim, intermediate;
};

/* y [m, n] = x [m, k] @ weight.T (+ bias). */
static int product(const struct product *p, const float *x, int64_t m, float *y, int threads) {
    if (p->kind < 0)
        f32_matmul(p->weight, p->n, p->k, x, m, y, threads);
    else if (qk_matmul((int)p->kind, p->weight, p->n, p->k, x, m, y, threads))
        return -1;
    if (p->bias)
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < p->n; ++j) y[i * p->n + j] += p->bias[j];
    return 0;
}

/* Before attention, for t rows x [t, dim]: q [t, heads, head_dim] = the rotated queries of the input norm of x;
   the rotated keys and the values written to `slots` of keys/values (rope_store's layout). Returns 0, or -1 when
   out of memory. */
int block_in(const struct block *b, const float *x, int64_t t, const float *cos, const float *sin,
             const int64_t *slots, float *keys, float *values, int64_t head_stride, int64_t slot_stride, float *q,
             int threads) {
    float *h = malloc((size_t)(t * b->dim) * sizeof(float)), *qkv = malloc((size_t)(t * b->qkv.n) * sizeof(float));
    int status = -1;
    if (h && qkv) {
        rms_norm(x, b->input_norm, (float)b->eps, t, b->dim, h);
        status = product(&b->qkv, h, t, qkv, threads);
        if (status == 0)
            rope_store(qkv, cos, sin, t, b->heads, b->kv_heads, b->head_dim, slots, keys, values, head_stride,
                       slot_stride, q);
    }
    free(h); free(qkv);
    return status;
}

/* After attention, in place on x [t, dim]: x += attn @ o.T, then x += down(swiglu(post norm of x @ gate_up.T)).
   Returns 0, or -1 when out of memory. */
int block_out(const struct block *b, float *x, const float *attn, int64_t t, int threads) {
    const int64_t d = b->dim, inner = b->intermediate;
    float *y = malloc((size_t)(t * d) * sizeof(float)), *h = malloc((size_t)(t * d) * sizeof(float));
    float *gate_up = malloc((size_t)(t * 2 * inner) * sizeof(float));
    float *act = malloc((size_t)(t * inner) * sizeof(float));
    int status = -1;
    if (y && h && gate_up && act && product(&b->o, attn, t, y, threads) == 0) {
        add_rms_norm(x, y, b->post_norm, (float)b->eps, t, d, x, h);
        if (product(&b->gate_up, h, t, gate_up, threads) == 0) {
            swiglu(gate_up, t, inner, act);
            if (product(&b->down, act, t, y, threads) == 0) {
                for (int64_t i = 0; i < t * d; ++i) x[i] += y[i];
                status = 0;
            }
        }
    }
    free(y); free(h); free(gate_up); free(act);
    return status;
}
