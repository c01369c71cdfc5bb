/* One float32 row of the sampler on a CPU (row_kernel.py calls these; sampler.py is the rule and the reference).

   A row sampled with the writing defaults ran about forty small torch operators: the end-of-text ban, the penalty,
   the no-repeat rule and DRY as gathers and scatters over a copy of the row, then temperature and min-p as passes
   over its 49K scores, then the finite columns: 0.5-1 ms a row, up to a tenth of a plain step. Here each rule is the
   same float32 operation on the same values in the same order (a division, a product, a subtraction, a comparison:
   IEEE operations round the same in any build; no fast-math), so the scores and the token are bit for bit torch's,
   which tests/test_sample_rows.py checks on rows with ties, padding, infinities and duplicates. */
/* No a * b + c may become one fused (differently rounded) operation in this file: torch rounds each. */
#pragma GCC optimize("fp-contract=off")
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* What one row's rules change, the sampler's lists as they stand (-1: no token there). */
struct row_rules {
    const int64_t *eos; int64_t n_eos;              /* banned: -inf */
    const int64_t *window; int64_t n_window;         /* the penalty's tokens, each once however often it occurs */
    float theta;                                     /* 1: no penalty */
    const int64_t *refused; int64_t n_refused;       /* no-repeat followers and the position's bans: -inf */
    const int64_t *dry; const double *amounts; int64_t n_dry;  /* DRY: z - (float)amount, the largest one wins */
    float temperature;                               /* 0: greedy, the scores stop after the rules above */
    float log_min_p;                                 /* -inf: no min-p */
};

/* The penalty (sampler.penalised): positive scores divided by theta, the others multiplied. `seen` marks the tokens
   done, as torch's gather-then-scatter penalises a repeated token once. */
static void penalise(float *z, int64_t vocab, const struct row_rules *r, uint8_t *seen) {
    for (int64_t i = 0; i < r->n_window; ++i) {
        const int64_t t = r->window[i];
        if (t < 0 || t >= vocab || seen[t]) continue;
        seen[t] = 1;
        z[t] = z[t] > 0.0f ? z[t] / r->theta : z[t] * r->theta;
    }
    for (int64_t i = 0; i < r->n_window; ++i)
        if (r->window[i] >= 0 && r->window[i] < vocab) seen[r->window[i]] = 0;
}

/* DRY (sampler.penalize's scatter_reduce "amin"): every amount of a token is taken from its score before DRY. */
static void dry(float *z, int64_t vocab, const struct row_rules *r, float *before) {
    for (int64_t i = 0; i < r->n_dry; ++i)
        if (r->dry[i] >= 0 && r->dry[i] < vocab) before[i] = z[r->dry[i]];
    for (int64_t i = 0; i < r->n_dry; ++i) {
        const int64_t t = r->dry[i];
        if (t < 0 || t >= vocab) continue;
        const float v = before[i] - (float)r->amounts[i];
        z[t] = isnan(v) || v < z[t] ? v : z[t];  /* amin keeps a NaN (inf - inf): the NaN check then hands over */
    }
}

/* Divides the row by t (temperature) in place; its largest score, or NaN where a score is NaN. The vector loop's
   division is the same IEEE operation as the scalar one, and a maximum is the same in any order. */
static float divide(float *z, int64_t vocab, float t) {
    float top = -INFINITY;
    int nan = 0;
    int64_t i = 0;
#ifdef __AVX512F__
    const __m512 vt = _mm512_set1_ps(t);
    __m512 vtop = _mm512_set1_ps(-INFINITY);
    __mmask16 unordered = 0;
    for (; i + 16 <= vocab; i += 16) {
        const __m512 x = _mm512_div_ps(_mm512_loadu_ps(z + i), vt);
        _mm512_storeu_ps(z + i, x);
        unordered |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        vtop = _mm512_max_ps(vtop, x);
    }
    top = _mm512_reduce_max_ps(vtop);
    nan = unordered != 0;
#endif
    for (; i < vocab; ++i) {
        z[i] = z[i] / t;
        nan |= isnan(z[i]);
        top = z[i] > top ? z[i] : top;
    }
    return nan ? NAN : top;
}

/* min_p_filter: a score whose difference to the best is below log(min_p) becomes -inf. */
static void min_p(float *z, int64_t vocab, float top, float log_min_p) {
    int64_t i = 0;
#ifdef __AVX512F__
    const __m512 vtop = _mm512_set1_ps(top), floor = _mm512_set1_ps(log_min_p), gone = _mm512_set1_ps(-INFINITY);
    for (; i + 16 <= vocab; i += 16) {
        const __m512 x = _mm512_loadu_ps(z + i);
        const __mmask16 low = _mm512_cmp_ps_mask(_mm512_sub_ps(x, vtop), floor, _CMP_LT_OQ);
        _mm512_storeu_ps(z + i, _mm512_mask_mov_ps(x, low, gone));
    }
#endif
    for (; i < vocab; ++i)
        if (z[i] - top < log_min_p) z[i] = -INFINITY;
}

/* out[vocab] = Sampler.process of one row of logits under `r` (the rules the caller checked this kernel covers);
   scratch: vocab bytes of zeros (left zero) and n_dry floats. Returns -1 where a score is NaN (the caller then takes
   the torch path, whose NaN rules this does not repeat), else 0. */
int sample_row(const float *logits, int64_t vocab, const struct row_rules *r, uint8_t *seen, float *before,
               float *out) {
    memcpy(out, logits, (size_t)vocab * sizeof(float));
    for (int64_t i = 0; i < r->n_eos; ++i)
        if (r->eos[i] >= 0 && r->eos[i] < vocab) out[r->eos[i]] = -INFINITY;
    if (r->theta != 1.0f) penalise(out, vocab, r, seen);
    for (int64_t i = 0; i < r->n_refused; ++i)
        if (r->refused[i] >= 0 && r->refused[i] < vocab) out[r->refused[i]] = -INFINITY;
    dry(out, vocab, r, before);
    if (r->temperature == 0.0f) {
        for (int64_t i = 0; i < vocab; ++i)
            if (isnan(out[i])) return -1;
        return 0;
    }
    const float top = divide(out, vocab, r->temperature);
    if (isnan(top)) return -1;
    if (r->log_min_p != -INFINITY) min_p(out, vocab, top, r->log_min_p);
    return 0;
}

/* The columns of a processed row whose scores are finite, in order (Sampler.noisy's candidates); their count. */
int64_t finite_columns(const float *row, int64_t vocab, int64_t *columns) {
    int64_t n = 0, i = 0;
#ifdef __AVX512F__
    const __m512 low = _mm512_set1_ps(-INFINITY), high = _mm512_set1_ps(INFINITY);
    for (; i + 16 <= vocab; i += 16) {
        const __m512 x = _mm512_loadu_ps(row + i);
        unsigned m = _mm512_cmp_ps_mask(x, low, _CMP_GT_OQ) & _mm512_cmp_ps_mask(x, high, _CMP_LT_OQ);
        for (; m; m &= m - 1) columns[n++] = i + __builtin_ctz(m);
    }
#endif
    for (; i < vocab; ++i)
        if (row[i] > -INFINITY && row[i] < INFINITY) columns[n++] = i;
    return n;
}

/* DRY's match lengths of one window (dry_xtc.match_lengths for one row): length[s - 1], s = 1..n-1, the number of
   leading k < limit with rev[k] = rev[k + s], rev[k] a token that is no breaker, rev the window reversed. */
void dry_lengths(const int64_t *window, int64_t n, const uint8_t *breakers, int64_t vocab, int64_t limit,
                 int64_t *length) {
    for (int64_t s = 1; s < n; ++s) {
        int64_t k = 0;
        for (; k < limit && k + s < n; ++k) {
            const int64_t a = window[n - 1 - k];
            if (a < 0 || a >= vocab || breakers[a] || a != window[n - 1 - k - s]) break;
        }
        length[s - 1] = k;
    }
}

/* no_repeat.repeat_followers of one window of w tokens: out[j] = window[j + n - 1] where the n - 1 tokens from j
   are the window's last n - 1 (all of them tokens), else -1; j < w - n + 1. */
void repeat_followers_row(const int64_t *window, int64_t w, int64_t n, int64_t *out) {
    const int64_t starts = w - n + 1, *tail = window + starts;
    int whole = 1;
    for (int64_t k = 0; k < n - 1; ++k) whole &= tail[k] >= 0;
    for (int64_t j = 0; j < starts; ++j) {
        int64_t k = 0;
        if (whole)
            while (k < n - 1 && window[j + k] == tail[k]) ++k;
        out[j] = whole && k == n - 1 ? window[j + n - 1] : -1;
    }
}

/* keys.mix32 on 32-bit words (its int64 products keep the low 32 bits exact, as these wrap). */
static uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352DU;
    x ^= x >> 15;
    x *= 0x846CA68BU;
    return x ^ (x >> 16);
}

/* Noise.gumbel's uniform draws of the tokens `ids` at the position whose key is `key` (keys.position_key):
   u[i] = uniform(mix32(mix32(token_mix[ids[i]] ^ key) + key)), integers and a double exact in any build; the
   logs stay torch's (sampler.Noise), whose rounding the text depends on. */
void noise_uniforms(const int64_t *token_mix, const int64_t *ids, int64_t n, int64_t key, double *u) {
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t h = mix32((uint32_t)token_mix[ids[i]] ^ (uint32_t)key);
        u[i] = ((double)mix32(h + (uint32_t)key) + 0.5) * 0x1p-32;
    }
}
