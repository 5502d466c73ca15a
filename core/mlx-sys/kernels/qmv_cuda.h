// Weft's CUDA kernel for a quantized matmul with few rows of x (a decode step): y = x W^T for
// MLX's affine-quantized W (w = scale * q + bias per group of GS codes along K), compiled at run
// time by MLX's fast::cuda_kernel (NVRTC). MLX's own kernel for this shape streams the weights
// at ~0.8 TB/s on an H100 (benches/gpu/qmv_roof.py); this one is built to stream them near the
// memory roof: every byte of W is read once, 16 bytes per lane per load, with all of a lane's
// loads for a row issued before its arithmetic.
//
// Template arguments (declared by MLX as constants): InT (x and y), ST (scales, biases),
// XKind (0 float32, 1 float16, 2 bfloat16: how x is read), MB (most rows of x: 1, 2, 4 or 8),
// K, BITS (4 or 8), GS (group size, a multiple of the codes in 16 bytes), ROWS (rows of W per
// warp). M and N are read from the shapes, so one compiled kernel serves every layer of a K
// and every batch up to MB rows.
// Inputs: x [M, K] InT, w [N, K * BITS / 32] uint32, scales and biases [N, K / GS] ST.
// Output: y [M, N] InT. Launch: grid (32, ceil(N / ROWS), 1) threads, blocks (32, WARPS, 1).
//
// Lane l of a warp takes 16-byte chunks l, l + 32, ... of each of its ROWS rows (each chunk
// inside one group). A code q becomes the float 256 + q with one AND-OR on a shifted word: the
// code's bits are placed in the mantissa of 256.0f (bits 15..18 for the low nibble of a byte,
// 19..22 for the high one, whose x is pre-scaled by 1/16; bits 15..22 for an 8-bit code), so
// no integer-to-float conversion runs. The chunk's dot product is then
//   sum (256 + q) x - 256 sum x,
// and y gains scale * that + bias * sum x. The 256 * sum x term is exact in float32 up to the
// rounding of the products, which a float32 sum over 32 codes keeps below 2^-15 relative.
//
// The source is a raw string so that benches/gpu/qmv_check.py can run it through MLX's Python
// `mx.fast.cuda_kernel` and benches/gpu/gdn_nvrtc_check.py-style tools can compile it.
#pragma once

namespace weft_qmv {

inline const char* cuda_source() {
  return R"WEFT_QMV_CUDA(
  constexpr int EPW = 32 / BITS;          // codes per 32-bit word
  constexpr int WPR = K / EPW;            // words per row of W
  constexpr int CHUNKS = WPR / 4;         // 16-byte chunks per row
  constexpr int EPC = 4 * EPW;            // codes per chunk
  constexpr int GPR = K / GS;             // groups per row
  constexpr int ITERS = (CHUNKS + 31) / 32;
  const int M = x_shape[0];
  const int N = w_shape[0];
  const int lane = threadIdx.x;
  const int row0 = (blockIdx.y * blockDim.y + threadIdx.y) * ROWS;
  // Whole warps leave together (a warp shares row0), so the shuffles below stay full.
  if (row0 >= N) {
    return;
  }
  const uint4* wrow[ROWS];
  const ST* srow[ROWS];
  const ST* brow[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int n = (row0 + r < N) ? row0 + r : N - 1;
    wrow[r] = reinterpret_cast<const uint4*>(w) + (size_t)n * CHUNKS;
    srow[r] = scales + (size_t)n * GPR;
    brow[r] = biases + (size_t)n * GPR;
  }

  // Eight (4-bit) or four (8-bit) consecutive x values as floats.
  auto load_x = [&](const InT* p, float* out) {
    if constexpr (XKind == 0) {
      const float4* q4 = reinterpret_cast<const float4*>(p);
#pragma unroll
      for (int i = 0; i < EPW / 4; ++i) {
        const float4 v = q4[i];
        out[4 * i] = v.x; out[4 * i + 1] = v.y; out[4 * i + 2] = v.z; out[4 * i + 3] = v.w;
      }
    } else {
      unsigned u[EPW / 2];
      if constexpr (EPW == 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(p);
        u[0] = v.x; u[1] = v.y; u[2] = v.z; u[3] = v.w;
      } else {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        u[0] = v.x; u[1] = v.y;
      }
#pragma unroll
      for (int i = 0; i < EPW / 2; ++i) {
        if constexpr (XKind == 2) {
          out[2 * i] = __uint_as_float(u[i] << 16);
          out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        } else {
          out[2 * i] = __half2float(__ushort_as_half((unsigned short)(u[i] & 0xffffu)));
          out[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(u[i] >> 16)));
        }
      }
    }
  };

  float acc[MB][ROWS];
#pragma unroll
  for (int m = 0; m < MB; ++m) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      acc[m][r] = 0.0f;
    }
  }

#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int c = it * 32 + lane;
    if (CHUNKS % 32 == 0 || c < CHUNKS) {
      uint4 wv[ROWS];
      float sc[ROWS], bi[ROWS];
      const int g = (c * EPC) / GS;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        wv[r] = wrow[r][c];
        sc[r] = static_cast<float>(srow[r][g]);
        bi[r] = static_cast<float>(brow[r][g]);
      }
#pragma unroll
      for (int m = 0; m < MB; ++m) {
        if (m >= M) {
          break;
        }
        const InT* xp = x + (size_t)m * K + (size_t)c * EPC;
        float dot[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          dot[r] = 0.0f;
        }
        float xsum = 0.0f, xoff = 0.0f;
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) {
          float xv[EPW];
          load_x(xp + wi * EPW, xv);
          if constexpr (BITS == 4) {
#pragma unroll
            for (int p = 0; p < 4; ++p) {
              const float xe = xv[2 * p];
              const float xo = xv[2 * p + 1] * 0.0625f;
              xsum += xv[2 * p] + xv[2 * p + 1];
              xoff += xe + xo;
              xv[2 * p + 1] = xo;
            }
          } else {
#pragma unroll
            for (int p = 0; p < 4; ++p) {
              xsum += xv[p];
            }
            xoff = xsum;
          }
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            const unsigned word = wi == 0 ? wv[r].x : wi == 1 ? wv[r].y : wi == 2 ? wv[r].z : wv[r].w;
#pragma unroll
            for (int p = 0; p < 4; ++p) {
              // Byte p of the word moved to bits 15..22.
              const unsigned t = p == 0 ? word << 15 : p == 1 ? word << 7 : p == 2 ? word >> 1 : word >> 9;
              if constexpr (BITS == 4) {
                const float lo = __uint_as_float((t & 0x00078000u) | 0x43800000u);  // 256 + q
                const float hi = __uint_as_float((t & 0x00780000u) | 0x43800000u);  // 256 + 16 q
                dot[r] = fmaf(lo, xv[2 * p], dot[r]);
                dot[r] = fmaf(hi, xv[2 * p + 1], dot[r]);
              } else {
                const float v = __uint_as_float((t & 0x007f8000u) | 0x43800000u);  // 256 + q
                dot[r] = fmaf(v, xv[p], dot[r]);
              }
            }
          }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          acc[m][r] += sc[r] * (dot[r] - 256.0f * xoff) + bi[r] * xsum;
        }
      }
    }
  }

#pragma unroll
  for (int m = 0; m < MB; ++m) {
    if (m >= M) {
      break;
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float v = acc[m][r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
      }
      if (lane == 0 && row0 + r < N) {
        y[(size_t)m * N + row0 + r] = static_cast<InT>(v);
      }
    }
  }
)WEFT_QMV_CUDA";
}

}  // namespace weft_qmv
