/* The element type of the row kernels (attention_kernel.c, layer_kernels.c): float32, or float64 where built with
   -DTS_DOUBLE (native.py builds both; the exactness tests run float64 models through the same steps). The AVX2
   paths are float32's; float64 takes the portable loops, in the same order. */
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
#endif
