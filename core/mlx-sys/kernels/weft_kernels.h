/* Weft's CPU kernels for MLX (kernels/qmm_primitive.cpp): a small C API over a custom MLX
 * primitive, in mlx-c's conventions (result through `res`, 0 on success). */
#ifndef WEFT_KERNELS_H
#define WEFT_KERNELS_H

#include "mlx/c/array.h"
#include "mlx/c/stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/* `x @ w^T` for affine-quantized `w` ([N, K*bits/32] uint32, scales/biases [N, K/group_size]),
 * as mlx's quantized_matmul(transpose=true). On a CPU stream with 4/5/8 bits, group 32/64 and
 * float32/float16/bfloat16 inputs it builds Weft's primitive; otherwise it returns MLX's op.
 * `int8_activations` nonzero: below 16 rows of x with 4- or 8-bit weights, x is quantized to
 * int8 per block of 32 (llama.cpp's q8 activations) and the int8 kernel runs.
 * On failure returns nonzero; weft_kernels_last_error() has the message (this thread). */
int weft_quantized_matmul(mlx_array* res, const mlx_array x, const mlx_array w,
                          const mlx_array scales, const mlx_array biases, int group_size,
                          int bits, int int8_activations, const mlx_stream stream);

/* mlx's gather_qmm(x, w, scales, biases, rhs_indices = indices, transpose = true) for the
 * experts of a mixture-of-experts layer: `w` [E, N, K*bits/32], scales/biases [E, N, K/group_size],
 * `x` [..., M, K] whose batch dimensions broadcast against `indices` (uint32/int32 expert ids);
 * the result is [broadcast shape..., M, N]. Weft's primitive in the same domain as
 * weft_quantized_matmul (MLX's op otherwise). An id >= E gives NaN rows, never a read past w. */
int weft_gather_qmm(mlx_array* res, const mlx_array x, const mlx_array w, const mlx_array scales,
                    const mlx_array biases, const mlx_array indices, int group_size, int bits,
                    const mlx_stream stream);

const char* weft_kernels_last_error(void);

/* The instruction set the kernel uses for inner dimension k at `bits` ("avx512", "avx2",
 * "generic"). */
const char* weft_kernels_isa(int k, int bits);

/* The int8-activation kernel's instruction set under the same cap ("avx512vnni-int8",
 * "avx2-int8", "generic-int8"). */
const char* weft_kernels_int8_isa(void);

/* Caps the instruction set at "avx512" (no cap), "avx2" or "generic", process-wide (tests and
 * benchmarks compare the kernels this way; `WEFT_CPU_ISA` sets it at startup). Nonzero for an
 * unknown name. */
int weft_kernels_limit_isa(const char* isa);

/* Threads the kernel's pool runs on (WEFT_CPU_THREADS, else the CPUs this process may use). */
int weft_kernels_threads(void);

/* kernels/row_ops.cpp: mlx's fast::rms_norm and fast::rope as one CPU primitive each (MLX runs
 * both as a graph of small ops on the CPU). Float32 inputs on a CPU stream take the primitive;
 * anything else returns MLX's op. `weight` may be empty (ctx NULL). */
int weft_rms_norm(mlx_array* res, const mlx_array x, const mlx_array weight, float eps,
                  const mlx_stream stream);

/* fast::rope(x, dims, traditional, base, scale, offset, freqs): `base` NaN means none (then
 * `freqs`, dims / 2 float32 values, is given; else it is empty); `offset` an int32 scalar array
 * or one offset per index of x's first axis. */
int weft_rope(mlx_array* res, const mlx_array x, int dims, int traditional, float base,
              float scale, const mlx_array offset, const mlx_array freqs, const mlx_stream stream);

/* The residual add and RMSNorm of a decoder layer in one CPU primitive with two outputs:
 * `sum` = x + residual, `res` = rms_norm(sum, weight, eps), bit for bit weft_rms_norm of MLX's
 * add. Float32 x and residual of one shape on a CPU stream; MLX's ops otherwise. */
int weft_add_rms_norm(mlx_array* sum, mlx_array* res, const mlx_array x, const mlx_array residual,
                      const mlx_array weight, float eps, const mlx_stream stream);

/* `x - logsumexp(x, -1, keepdims)` (the sampling tail's log-probabilities) as one CPU
 * primitive with a vectorized exp, rows over the kernels' pool; float32 on a CPU stream, MLX's
 * ops otherwise. Fast mode only (exp and the sum round differently). */
int weft_log_softmax(mlx_array* res, const mlx_array x, const mlx_stream stream);

const char* weft_row_ops_last_error(void);

/* weft_quantized_matmul of silu(gate) * up for `gate_up` [..., 2K] holding the gate then the up
 * half (a fused gate/up projection's output, mlx-lm's swiglu before the down projection): the
 * activation is applied while the kernel reads its input, so the split, sigmoid and products
 * are no ops of their own. Float32 on a CPU stream in weft_quantized_matmul's domain; MLX's ops
 * otherwise. Errors through weft_kernels_last_error(). */
int weft_swiglu_quantized_matmul(mlx_array* res, const mlx_array gate_up, const mlx_array w,
                                 const mlx_array scales, const mlx_array biases, int group_size,
                                 int bits, int int8_activations, const mlx_stream stream);

/* kernels/attention.cpp: mlx's fast::scaled_dot_product_attention(q, k, v, scale, mask_mode,
 * mask) as one CPU primitive (MLX runs a graph of small ops there). q [B, Hq, Lq, D], k / v
 * [B, Hkv, Lk, D / Dv] (Hq a multiple of Hkv; any strides), float32, on a CPU stream, with
 * mask_mode "" (mask empty: ctx NULL), "causal" (Lq <= Lk: query i sees keys <= i + Lk - Lq) or
 * "array" (a boolean or float mask broadcastable to [B, Hq, Lq, Lk]) take the primitive;
 * anything else returns MLX's op. Errors through weft_sdpa_last_error(). */
int weft_sdpa(mlx_array* res, const mlx_array queries, const mlx_array keys, const mlx_array values,
              float scale, const char* mask_mode, const mlx_array mask, const mlx_stream stream);

const char* weft_sdpa_last_error(void);

/* The instruction set weft_sdpa's kernel uses ("avx512", "avx2", "generic"). */
const char* weft_sdpa_isa(void);

#ifdef __cplusplus
}
#endif

#endif
