// The few-row quantized matmul CUDA kernel's entry point (source in qmv_cuda.h): checks the
// arguments, flattens x to [M, K], launches through MLX's fast::cuda_kernel and shapes y back.
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"

#include "qmv.h"
#include "qmv_cuda.h"

namespace mx = mlx::core;

namespace {

thread_local std::string last_error;

const mx::fast::CustomKernelFunction& kernel() {
  static const mx::fast::CustomKernelFunction k = mx::fast::cuda_kernel(
      "weft_qmv", {"x", "w", "scales", "biases"}, {"y"}, weft_qmv::cuda_source(), "",
      /*ensure_row_contiguous=*/true, /*shared_memory=*/0);
  return k;
}

// fast::cuda_kernel's function object rebuilds the kernel's ~7 KB source string on every call,
// and a decode step makes a few hundred: the primitive it makes for one configuration (template
// arguments, grid, stream) is kept and shared by later calls' outputs, as mx.compile's replay
// shares primitives between calls. `make` runs once per key.
using Key = std::array<int, 9>;  // x and scale dtypes, MB, K, N, bits, group, rows, stream

template <class Make>
std::shared_ptr<mx::Primitive> primitive_for(const Key& key, Make make) {
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<mx::Primitive>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make()).first;
  return it->second;
}

int x_kind(mx::Dtype t) {
  if (t == mx::float32) return 0;
  if (t == mx::float16) return 1;
  if (t == mx::bfloat16) return 2;
  throw std::invalid_argument("weft qmv: x must be float32, float16 or bfloat16");
}

// The kernel's row capacity for M rows of x: one compiled kernel per bucket, not per M.
int row_bucket(int M) { return M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8; }

// One row of W per warp for many x rows (registers) or few output rows (more warps to spread
// over the GPU); four for wide products over a short K (the H100 measured 1.4x over two on
// 14336 x 4096 and 128256 x 4096); two otherwise, sharing each x load between them.
int default_rows_per_warp(int M, int N, int K) {
  if (M > 4 || N < 2048) return 1;
  if (N >= 8192 && K <= 4096) return 4;
  return 2;
}

mx::array qmv(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
              int group_size, int bits, int rows_per_warp, const mx::Stream& s) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("weft qmv: " + what); };
  if (s.device.type != mx::Device::DeviceType::gpu) fail("not a GPU stream");
  if (bits != 4 && bits != 8) fail("bits must be 4 or 8, not " + std::to_string(bits));
  if (x.ndim() < 1 || w.ndim() != 2 || w.dtype() != mx::uint32) fail("w must be [N, K * bits / 32] uint32");
  const int K = x.shape(-1);
  const int N = w.shape(0);
  const int M = K > 0 ? int(x.size() / K) : 0;
  if (M < 1 || M > WEFT_QMV_MAX_ROWS) fail("x has " + std::to_string(M) + " rows; at most " + std::to_string(WEFT_QMV_MAX_ROWS));
  if (int64_t(w.shape(1)) * 32 != int64_t(K) * bits) fail("w's packed width does not match x's K");
  const int codes_per_chunk = 4 * (32 / bits);
  if (K % codes_per_chunk != 0) fail("K must be a multiple of " + std::to_string(codes_per_chunk));
  if (group_size <= 0 || group_size % codes_per_chunk != 0 || K % group_size != 0)
    fail("group size " + std::to_string(group_size) + " must divide K and be a multiple of " + std::to_string(codes_per_chunk));
  const mx::Shape groups{N, K / group_size};
  if (scales.shape() != groups || biases.shape() != groups || scales.dtype() != biases.dtype())
    fail("scales and biases must be [N, K / group_size] of one dtype");
  const int xk = x_kind(x.dtype());
  x_kind(scales.dtype());
  const int rows = rows_per_warp > 0 ? rows_per_warp : default_rows_per_warp(M, N, K);
  if (rows != 1 && rows != 2 && rows != 4) fail("rows per warp must be 1, 2 or 4");
  auto x2 = mx::reshape(x, {M, K}, s);
  const int mb = row_bucket(M);
  const Key key{int(x.dtype().val()), int(scales.dtype().val()), mb, K, N, bits, group_size, rows, s.index};
  auto prim = primitive_for(key, [&] {
    auto first = kernel()(
        {x2, w, scales, biases}, {{M, N}}, {x.dtype()}, {32, (N + rows - 1) / rows, 1}, {32, 4, 1},
        {{"InT", x.dtype()}, {"ST", scales.dtype()}, {"XKind", xk}, {"MB", mb}, {"K", K}, {"BITS", bits},
         {"GS", group_size}, {"ROWS", rows}},
        std::nullopt, false, s);
    return first[0].primitive_ptr();
  });
  auto out = mx::array::make_arrays({{M, N}}, {x.dtype()}, prim, {x2, w, scales, biases});
  auto shape = x.shape();
  shape.back() = N;
  return mx::reshape(out[0], shape, s);
}

}  // namespace

extern "C" int weft_qmv_cuda(mlx_array* y, const mlx_array x, const mlx_array w, const mlx_array scales,
                             const mlx_array biases, int group_size, int bits, int rows_per_warp,
                             const mlx_stream stream) {
  try {
    mlx_array_set_(*y, qmv(mlx_array_get_(x), mlx_array_get_(w), mlx_array_get_(scales), mlx_array_get_(biases),
                           group_size, bits, rows_per_warp, mlx_stream_get_(stream)));
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

extern "C" const char* weft_qmv_last_error(void) { return last_error.c_str(); }
