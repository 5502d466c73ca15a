/* kernels/gated_delta.cpp: the gated delta recurrence of hybrid models as one op per call, in
 * mlx-c's conventions (results through the out pointers, 0 on success, else
 * weft_gated_delta_last_error() has the message for this thread).
 * q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv] (Hv a multiple of Hk); g (the decay, linear space) and
 * beta [B, T, Hv]; state [B, Hv, Dv, Dk] (empty, ctx NULL: zeros); mask [B, T] bool (empty:
 * none; false: the row's state stays as it was over that step and y is 0 there).
 * Results: y [B, T, Hv, Dv] in q's dtype, the new state [B, Hv, Dv, Dk] float32. */
#ifndef WEFT_GATED_DELTA_H
#define WEFT_GATED_DELTA_H

#include "mlx/c/array.h"
#include "mlx/c/stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MLX's fast::gated_delta_update (its Metal kernel on Metal, its fallback graph elsewhere). */
int weft_gated_delta_fused(mlx_array* y, mlx_array* state_out, const mlx_array q, const mlx_array k,
                           const mlx_array v, const mlx_array g, const mlx_array beta,
                           const mlx_array state, const mlx_array mask, const mlx_stream stream);

/* Weft's CUDA kernel for the whole recurrence (one launch); GPU streams of MLX's CUDA backend
 * only (the kernel is compiled at evaluation, so a build error shows when the result is
 * evaluated). */
int weft_gated_delta_cuda(mlx_array* y, mlx_array* state_out, const mlx_array q, const mlx_array k,
                          const mlx_array v, const mlx_array g, const mlx_array beta,
                          const mlx_array state, const mlx_array mask, const mlx_stream stream);

/* Weft's CPU primitive for the whole recurrence (CPU streams; float32, bfloat16 or float16 q;
 * float32 sums in another order than MLX's ops: the fast kernel mode). */
int weft_gated_delta_cpu(mlx_array* y, mlx_array* state_out, const mlx_array q, const mlx_array k,
                         const mlx_array v, const mlx_array g, const mlx_array beta,
                         const mlx_array state, const mlx_array mask, const mlx_stream stream);

const char* weft_gated_delta_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
