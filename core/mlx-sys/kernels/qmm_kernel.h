// Weft's CPU affine-quantized matmul: y[m][n] = sum_k x[m][k] * (s[n][g] * q[n][k] + b[n][g]).
// The inner loops live in qmm_kernel.cpp, compiled once per instruction set (AVX-512, AVX2+FMA,
// and the baseline: SSE2 on x86-64, NEON on aarch64); qmm_primitive.cpp picks one at run time.
#pragma once

#include <cstdint>

namespace weft_qmm {

enum DType : int { F32 = 0, F16 = 1, BF16 = 2 };

struct Args {
  // Activations as float32 in the kernel's lane order (see permute_x), [M][K], and the
  // per-group sums of x, [M][K / group_size]: the bias term is b[n][g] * xsum[m][g].
  const float* xp;
  const float* xsum;
  const uint32_t* w;  // [N][K * bits / 32], MLX's packing: each row a little-endian bit stream
  const void* scales; // [N][K / group_size], dtype `sdtype`
  const void* biases; // same
  int sdtype;
  float* y;           // [M][N] float32
  int M, N, K, bits, group_size;  // bits 4, 5 or 8; group_size 32 or 64
  // The same activations in their own order, [M][K] float32, for the GEMM path (from
  // GEMM_MIN_ROWS rows); null keeps every M on the per-row path.
  const float* x;
  // Int8 activations (the int8 kernels only, M < GEMM_MIN_ROWS, 4- or 8-bit weights; built by
  // quantize_x_int8): x quantized per block of 32 elements, x ~= d * q with q in [-127, 127].
  const int8_t* xq = nullptr;  // [M][K], in quantize_x_int8's order
  const float* xd = nullptr;   // [M][K / 8]: each block's d, four times (one 4-lane quarter each)
  const float* xc = nullptr;   // [M][K / group_size], 8-bit: 128 * sum over the group's blocks of d * sum(q)
};

// From this many rows of x (prefill) a kernel dequantizes a panel of weights once into a
// buffer and multiplies it with register-blocked tiles of x; below it (decode, small batches)
// each weight vector is dequantized in registers for the few rows.
constexpr int GEMM_MIN_ROWS = 16;
// Output rows per pool chunk in the GEMM path: a multiple of every kernel's register tile.
constexpr int GEMM_CHUNK_ROWS = 32;

// One instruction set's kernel: rows [n0, n1) of y for every m.
using RowsFn = void (*)(const Args&, int n0, int n1);

// Vector width (floats) the kernel's activation layout is built for.
struct Kernel {
  RowsFn rows;
  int width;
  const char* name;
};

namespace generic { extern const Kernel kernel; }
#if defined(__x86_64__)
namespace avx2 { extern const Kernel kernel; }
namespace avx512 { extern const Kernel kernel; }
#endif

// The int8-activation per-row kernels (qmm_int8.cpp): y from Args::xq / xd / xc, 4- and 8-bit
// weights, M < GEMM_MIN_ROWS. Per block of 32 elements the integer sum of q_w * q_x (exact in
// int32) times d_w * d_x, plus the bias term b[n][g] * xsum[m][g] (the caller passes the
// quantized x's sums, sum of d * sum(q), as llama.cpp's q4_1 x q8_1 dot). Every instruction
// set computes the same integer sums.
namespace generic { extern const Kernel int8_kernel; }
#if defined(__x86_64__)
namespace avx2 { extern const Kernel int8_kernel; }       // vpmaddubsw + vpmaddwd
namespace avx512vnni { extern const Kernel int8_kernel; } // vpdpbusd on 256-bit vectors
#endif

// x (float32, row-major [M][K]) quantized for the int8 kernels, per block of 32 elements:
// d = max |x| / 127, q = round(x / d). 4-bit weights: within each chunk of C = min(64, K - k)
// elements from k (k a multiple of 64), the even elements x[k], x[k + 2], ... go to
// xq[k .. k + C / 2) and the odd ones to xq[k + C / 2 .. k + C): a 4-bit weight byte holds an
// even element in its low nibble and the next odd one in its high nibble, so the low and high
// nibbles of C / 2 bytes meet C / 2 contiguous activations each. 8-bit weights: xq in x's
// order. xd: each block's d, four times. xc (may be null): per group, 128 * sum over its blocks
// of d * sum(q) (the maddubs kernel multiplies q_w - 128; / 128 it is the bias term's sum). A block
// with a NaN or infinite value gets d = NaN, so the outputs it touches are NaN.
void quantize_x_int8(const float* x, int8_t* xq, float* xd, float* xc, int M, int K, int bits,
                     int group_size);

// x (float32, row-major [M][K]) into the layout a kernel of `width` lanes reads: within each
// block of width * (32 / bits) elements, element lane * epu + j goes to j * width + lane, so one
// shifted-and-masked load of `width` packed words meets `width` contiguous activations. The
// remainder of K that does not fill a block keeps its order. 5-bit weights (codes cross word
// boundaries) are read as 4 codes per lane of at most 8 lanes: the same permutation with
// 32 / bits replaced by 4 and width by min(width, 8) (blocks of 32 or 16 elements fill K).
// The kernel reads field j of a word (or 5-bit window) by masking it in place, so its code
// arrives multiplied by 2^(bits * j): x at field j is stored times x_field_scale(bits, j), a
// power of two, which leaves every product exact and the same as with shifted codes. The top
// field of a 4- or 8-bit word is shifted down instead (masked in place it would turn negative
// as an int32), so its scale is 1, like field 0's.
void permute_x(const float* x, float* xp, int M, int K, int bits, int width);

inline float x_field_scale(int bits, int j) {
  const int epu = bits == 5 ? 4 : 32 / bits;
  if (j == 0 || (bits != 5 && j == epu - 1)) return 1.0f;
  // 2^-(bits * j) built from its exponent bits (bits * j <= 24: a normal float).
  const unsigned e = unsigned(127 - bits * j) << 23;
  float f;
  __builtin_memcpy(&f, &e, 4);
  return f;
}

}  // namespace weft_qmm
