/* attend_rows (attention_kernel.c), which layer_kernels.c's run_layers calls: one declaration, checked against the
   definition, so the two cannot drift apart. Included after real.h. */
#ifndef TOKENSWIFT_ATTEND_ROWS_H
#define TOKENSWIFT_ATTEND_ROWS_H
int attend_rows(const real *q, int64_t t, int64_t h, int64_t kv_heads, int64_t d, const void *k, const void *v,
                int kind, int64_t head_stride, int64_t slot_stride, int64_t shared, const int64_t *tail,
                const int64_t *tail_count, int64_t tail_width, real scale, real *out, int threads);
#endif
