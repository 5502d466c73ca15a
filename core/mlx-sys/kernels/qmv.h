/* kernels/qmv.cpp: Weft's CUDA kernel for an affine-quantized matmul with few rows of x (a
 * decode step), in mlx-c's conventions (the result through the out pointer, 0 on success, else
 * weft_qmv_last_error() has the message for this thread).
 * x [..., K] (float32, float16 or bfloat16; at most WEFT_QMV_MAX_ROWS rows in all), w [N, K *
 * bits / 32] uint32, scales and biases [N, K / group_size]; y [..., N] in x's dtype, as
 * quantized_matmul(x, w, scales, biases, transpose=true). bits 4 or 8; K * bits / 32 a multiple
 * of 4 (whole 16-byte chunks) and group_size a multiple of the codes in one chunk.
 * rows_per_warp: rows of w one warp computes (1, 2 or 4); 0 picks by shape.
 * GPU streams of MLX's CUDA backend only (compiled at evaluation by NVRTC). */
#ifndef WEFT_QMV_H
#define WEFT_QMV_H

#include "mlx/c/array.h"
#include "mlx/c/stream.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_QMV_MAX_ROWS 8

int weft_qmv_cuda(mlx_array* y, const mlx_array x, const mlx_array w, const mlx_array scales,
                  const mlx_array biases, int group_size, int bits, int rows_per_warp,
                  const mlx_stream stream);

const char* weft_qmv_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
