/* The elementwise steps of a decoder layer for a few rows on the CPU, in float32 or float64 (real.h): RMSNorm
   (with the residual add before it), RoPE with the cache write, SwiGLU. Each replaces a chain of 3 to 14 torch
   operators whose dispatch, not arithmetic, was the cost: a decoding step of the default model ran ~1,240 of them, about 11 ms
   of a 29 ms q4 step on this machine. The formulas are torch's; the sums run in this file's order (gcc may fuse a
   square into the sum's multiply-add), which is the same for a row whatever rows share the call. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "real.h"
#include "attend_rows.h"
#include "kv_q8.h"

/* out[r] = w * (x[r] * 1 / sqrt(mean(x[r]^2) + eps)) for rows x [rows, d]. */
static void rms_norm(const real *x, const real *w, real eps, int64_t rows, int64_t d, real *out) {
    for (int64_t r = 0; r < rows; ++r) {
        const real *xr = x + r * d;
        real *o = out + r * d;
        real sum = 0.0;
        for (int64_t i = 0; i < d; ++i) sum += xr[i] * xr[i];
        const real inv = 1.0 / SQRT(sum / (real)d + eps);
        for (int64_t i = 0; i < d; ++i) o[i] = w[i] * (xr[i] * inv);
    }
}

/* sum = x + y, then out = rms_norm(sum): a residual add and the next norm. */
static void add_rms_norm(const real *x, const real *y, const real *w, real eps, int64_t rows, int64_t d,
                         real *sum, real *out) {
    for (int64_t i = 0; i < rows * d; ++i) sum[i] = x[i] + y[i];
    rms_norm(sum, w, eps, rows, d, out);
}

/* x [d] into the cache's elements from `at` (the cache's kind: reals, bf16, or a q8 row of a key or a value). */
static void store_kv(void *cache, int64_t at, const real *x, int64_t d, int kind, int key) {
    if (kind == KV_REAL) {
        memcpy((real *)cache + at, x, (size_t)d * sizeof(real));
        return;
    }
#ifndef TS_DOUBLE
    if (kind == KV_Q8) {
        q8_row(x, d, key, (char *)cache + at);
        return;
    }
#endif
    (void)key;
    uint16_t *o = (uint16_t *)cache + at;
    for (int64_t j = 0; j < d; ++j) o[j] = to_bf16((float)x[j]);
}

/* qkv [t, heads + 2 kv_heads, d] (one product's rows: q heads, k heads, v heads) -> q [t, heads, d] rotated, and
   the rotated k and the v of token i written to slot slots[i] of keys and values (element (head, slot, j) at
   head * head_stride + slot * slot_stride + j, of the cache's kind: a real, a bf16 rounded as torch rounds, or byte
   j of a q8 row, kv_q8.h). cos, sin: [t, d] rope_table rows (sin's first half negated): x * cos + roll(x, d / 2) * sin, as
   rope.apply_rope. */
static void rope_store(const real *qkv, const real *cos, const real *sin, int64_t t, int64_t heads,
                       int64_t kv_heads, int64_t d, const int64_t *slots, void *keys, void *values, int kind,
                       int64_t head_stride, int64_t slot_stride, real *q) {
    const int64_t width = (heads + 2 * kv_heads) * d, half = d / 2;
    real key[d];
    for (int64_t i = 0; i < t; ++i) {
        const real *row = qkv + i * width, *c = cos + i * d, *s = sin + i * d;
        for (int64_t h = 0; h < heads + kv_heads; ++h) {
            const real *x = row + h * d;
            real *o = h < heads ? q + (i * heads + h) * d : key;
            for (int64_t j = 0; j < d; ++j) {
                const real a = x[j] * c[j], b = x[j < half ? j + half : j - half] * s[j];
                o[j] = a + b;
            }
            if (h >= heads)
                store_kv(keys, (h - heads) * head_stride + slots[i] * slot_stride, key, d, kind, 1);
        }
        for (int64_t h = 0; h < kv_heads; ++h)
            store_kv(values, h * head_stride + slots[i] * slot_stride, row + (heads + kv_heads + h) * d, d, kind,
                     0);
    }
}

/* gate_up [rows, 2 n] (gate, then up) -> out [rows, n] = silu(gate) * up, silu(x) = x / (1 + exp(-x)). */
static void swiglu(const real *gate_up, int64_t rows, int64_t n, real *out) {
    for (int64_t r = 0; r < rows; ++r) {
        const real *g = gate_up + r * 2 * n, *u = g + n;
        real *o = out + r * n;
        for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0 + EXP(-g[i])) * u[i];
    }
}

#define LK_INLINE static inline __attribute__((always_inline))
#ifdef TS_AVX2
#include "simd.h"

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

#if defined(TS_DOUBLE) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* The portable dot_lanes (the #elif below) in float64 vectors: each row's eight partial sums in two vectors of four
   lanes, each lane's multiply-adds fused as FMA() fuses them, in the same order; so the same bits, at four lanes an
   instruction where gcc's code for the portable loops took one. */
LK_INLINE void dot_lanes(const double *w, int64_t k, const double *x, const int W, double *y) {
    __m256d low[4], high[4];
    for (int r = 0; r < W; ++r) low[r] = high[r] = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256d x0 = _mm256_loadu_pd(x + i), x1 = _mm256_loadu_pd(x + i + 4);
        for (int r = 0; r < W; ++r) {
            low[r] = _mm256_fmadd_pd(_mm256_loadu_pd(w + r * k + i), x0, low[r]);
            high[r] = _mm256_fmadd_pd(_mm256_loadu_pd(w + r * k + i + 4), x1, high[r]);
        }
    }
    for (int r = 0; r < W; ++r) {
        double l[8];
        _mm256_storeu_pd(l, low[r]);
        _mm256_storeu_pd(l + 4, high[r]);
        double sum = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        for (int64_t j = i; j < k; ++j) sum = FMA(w[r * k + j], x[j], sum);
        y[r] = sum;
    }
}
#elif !defined(TS_AVX2)
/* Weight rows w[0..W) (1 to 4) against one row x: each sum in eight partial sums (as eight vector lanes) over k,
   then the lanes by pairs, then the tail; the order of a row alone, whatever W. One serial chain of FMAs a sum waited
   on each one's latency (a float64 model's products, the exactness tests' whole forward, ran at a quarter of the
   core's rate); four rows' chains side by side keep the multiply-adders busy. */
LK_INLINE void dot_lanes(const real *w, int64_t k, const real *x, const int W, real *y) {
    real lanes[4][8];
    for (int r = 0; r < W; ++r)
        for (int u = 0; u < 8; ++u) lanes[r][u] = 0.0;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        for (int r = 0; r < W; ++r)
            for (int u = 0; u < 8; ++u) lanes[r][u] = FMA(w[r * k + i + u], x[i + u], lanes[r][u]);
    for (int r = 0; r < W; ++r) {
        const real *l = lanes[r];
        real sum = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        for (int64_t j = i; j < k; ++j) sum = FMA(w[r * k + j], x[j], sum);
        y[r] = sum;
    }
}
#endif

/* y[m, n] = x[m, k] @ w[n, k].T for a few rows (the weight read from memory once), the weight's rows shared
   among `threads` OpenMP threads. MKL's one-row product reached two thirds of the memory bandwidth here and its
   few-row GEMM re-packs the weight on every call. */
void dense_matmul(const real *w, int64_t n, int64_t k, const real *x, int64_t m, real *y, int threads) {
#ifdef TS_AVX2
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t j = 0; j < n; ++j) {
        const real *row = w + j * k;
        for (int64_t r = 0; r < m; r += 4) {  /* the weight row is read from L1 for the next four */
            const real *xr = x + r * k;
            real *yr = y + r * n + j;
            switch (m - r) {
            case 1: dot_f32_rows(row, xr, k, 1, yr, n); break;
            case 2: dot_f32_rows(row, xr, k, 2, yr, n); break;
            case 3: dot_f32_rows(row, xr, k, 3, yr, n); break;
            default: dot_f32_rows(row, xr, k, 4, yr, n); break;
            }
        }
    }
#else
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t j = 0; j < n; j += 4) {
        const real *rows = w + j * k;
        for (int64_t r = 0; r < m; ++r) {
            real *yr = y + r * n + j;
            switch (n - j) {
            case 1: dot_lanes(rows, k, x + r * k, 1, yr); break;
            case 2: dot_lanes(rows, k, x + r * k, 2, yr); break;
            case 3: dot_lanes(rows, k, x + r * k, 3, yr); break;
            default: dot_lanes(rows, k, x + r * k, 4, yr); break;
            }
        }
    }
#endif
}

/* A decoder layer in two calls around its attention (native_rows.NativeBlock), so that a step's ~40 operators a
   layer, each dispatched from Python, are two calls: the Python around them cost ~10 ms of a 45 ms float32 step. */

#ifndef TS_DOUBLE
int qk_matmul(int kind, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int threads);
#endif

struct product {  /* one of a layer's four weights: dense [n, k] (kind -1) or GGUF blocks (quant_kernels.c) */
    const void *weight;
    const real *bias;  /* [n] or NULL */
    int64_t n, k, kind;
};

struct block {
    struct product qkv, o, gate_up, down;  /* qkv: rows q, k, v; gate_up: rows gate, up */
    const real *input_norm, *post_norm;
    double eps;
    int64_t dim, heads, kv_heads, head_dim, intermediate;
};

/* y [m, n] = x [m, k] @ weight.T (+ bias). */
static int product(const struct product *p, const real *x, int64_t m, real *y, int threads) {
    if (p->kind < 0)
        dense_matmul(p->weight, p->n, p->k, x, m, y, threads);
#ifndef TS_DOUBLE
    else if (qk_matmul((int)p->kind, p->weight, p->n, p->k, x, m, y, threads))
        return -1;
#else
    else
        return -1;  /* GGUF blocks are float32's (q4) */
#endif
    if (p->bias)
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < p->n; ++j) y[i * p->n + j] += p->bias[j];
    return 0;
}

/* Before attention, for t rows x [t, dim]: q [t, heads, head_dim] = the rotated queries of the input norm of x;
   the rotated keys and the values written to `slots` of keys/values (rope_store's layout). Returns 0, or -1 when
   out of memory. */
int block_in(const struct block *b, const real *x, int64_t t, const real *cos, const real *sin,
             const int64_t *slots, void *keys, void *values, int kind, int64_t head_stride, int64_t slot_stride,
             real *q, int threads) {
    real *h = malloc((size_t)(t * b->dim) * sizeof(real)), *qkv = malloc((size_t)(t * b->qkv.n) * sizeof(real));
    int status = -1;
    if (h && qkv) {
        rms_norm(x, b->input_norm, (real)b->eps, t, b->dim, h);
        status = product(&b->qkv, h, t, qkv, threads);
        if (status == 0)
            rope_store(qkv, cos, sin, t, b->heads, b->kv_heads, b->head_dim, slots, keys, values, kind,
                       head_stride, slot_stride, q);
    }
    free(h); free(qkv);
    return status;
}

/* After attention, in place on x [t, dim]: x += attn @ o.T, then x += down(swiglu(post norm of x @ gate_up.T)).
   Returns 0, or -1 when out of memory. */
int block_out(const struct block *b, real *x, const real *attn, int64_t t, int threads) {
    const int64_t d = b->dim, inner = b->intermediate;
    real *y = malloc((size_t)(t * d) * sizeof(real)), *h = malloc((size_t)(t * d) * sizeof(real));
    real *gate_up = malloc((size_t)(t * 2 * inner) * sizeof(real));
    real *act = malloc((size_t)(t * inner) * sizeof(real));
    int status = -1;
    if (y && h && gate_up && act && product(&b->o, attn, t, y, threads) == 0) {
        add_rms_norm(x, y, b->post_norm, (real)b->eps, t, d, x, h);
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

/* A forward's n layers in one call, each as block_in, attend_rows and block_out run it (so its rows are theirs bit
   for bit): the Python around three calls a layer took a fifth of a q4 step of the default model. x [t, dim] is
   updated in place; layer i's keys and values start layer_bytes * i bytes into keys and values (one cache buffer
   for all layers, attend_rows' strides within a layer), and its rows see the slots that shared, tail, tail_count
   and tail_width list (attend_rows). queries: NULL, or [n, t, heads, head_dim] for every layer's rotated queries;
   keep: NULL, or n flags, a copy of x after each flagged layer going to kept ([flagged, t, dim], in order).
   Returns 0, or -1 when out of memory. */
int run_layers(const struct block *const *layers, int64_t n, real *x, int64_t t, const real *cos, const real *sin,
               const int64_t *slots, char *keys, char *values, int64_t layer_bytes, int kind, int64_t head_stride,
               int64_t slot_stride, int64_t shared, const int64_t *tail, const int64_t *tail_count,
               int64_t tail_width, real scale, real *queries, const int64_t *keep, real *kept, int threads) {
    const struct block *first = layers[0];
    const int64_t width = t * first->heads * first->head_dim, rows = t * first->dim;
    real *scratch = queries ? NULL : malloc((size_t)width * sizeof(real));
    real *attn = malloc((size_t)width * sizeof(real));
    int status = attn && (queries || scratch) ? 0 : -1;
    for (int64_t i = 0, kept_rows = 0; i < n && status == 0; ++i) {
        const struct block *b = layers[i];
        real *q = queries ? queries + i * width : scratch;
        char *k = keys + i * layer_bytes, *v = values + i * layer_bytes;
        status = block_in(b, x, t, cos, sin, slots, k, v, kind, head_stride, slot_stride, q, threads);
        if (status == 0)
            status = attend_rows(q, t, b->heads, b->kv_heads, b->head_dim, k, v, kind, head_stride, slot_stride,
                                 shared, tail, tail_count, tail_width, scale, attn, threads);
        if (status == 0)
            status = block_out(b, x, attn, t, threads);
        if (status == 0 && keep && keep[i]) {
            memcpy(kept + kept_rows * rows, x, (size_t)rows * sizeof(real));
            ++kept_rows;
        }
    }
    free(scratch); free(attn);
    return status;
}
