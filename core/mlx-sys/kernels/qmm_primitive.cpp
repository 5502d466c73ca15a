// An MLX Primitive for affine-quantized `x @ W^T` on the CPU (MLX's layout: packed uint32
// weights, per-group scale and bias), its thread pool, and the extern "C" entry point Rust calls.
// MLX's own CPU kernel is a scalar single-threaded loop; this one is SIMD (qmm_kernel.cpp),
// splits the output rows over a small persistent pool, dequantizes each weight vector once for
// the few rows of a batched decode step, and in prefill (GEMM_MIN_ROWS rows on) once per panel
// for all rows.
#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"

#include "qmm_kernel.h"
#include "thread_pool.h"
#include "weft_kernels.h"

namespace mx = mlx::core;

namespace weft_qmm {

#if defined(__x86_64__)
// permute_x's 8-lane blocks of one row for 4- and 8-bit codes as register transposes (8 x 8
// and 8 x 4): the element-by-element loop was a few microseconds of every B=8 matmul, on the
// stream thread while the pool waits. Returns where the 8-lane blocks end.
__attribute__((target("avx2,fma"))) static int permute_row8_avx2(const float* src, float* dst,
                                                                 int K, int bits) {
  const int epu = 32 / bits, block = 8 * epu;
  __m256 fs[8];
  for (int j = 0; j < epu; j++) fs[j] = _mm256_set1_ps(x_field_scale(bits, j));
  int k = 0;
  for (; k + block <= K; k += block) {
    const float* s = src + k;
    float* d = dst + k;
    if (bits == 4) {
      __m256 r[8], t[8], u[8];
      for (int l = 0; l < 8; l++) r[l] = _mm256_loadu_ps(s + l * 8);
      for (int l = 0; l < 8; l += 2) {
        t[l] = _mm256_unpacklo_ps(r[l], r[l + 1]);
        t[l + 1] = _mm256_unpackhi_ps(r[l], r[l + 1]);
      }
      for (int h = 0; h < 8; h += 4) {
        u[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44);
        u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xee);
        u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44);
        u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xee);
      }
      // u[j] (u[j + 4]): element j of rows 0-3 (4-7) in the low half, element j + 4 in the high.
      for (int j = 0; j < 4; j++) {
        _mm256_storeu_ps(d + j * 8, _mm256_mul_ps(_mm256_permute2f128_ps(u[j], u[j + 4], 0x20), fs[j]));
        _mm256_storeu_ps(d + (j + 4) * 8, _mm256_mul_ps(_mm256_permute2f128_ps(u[j], u[j + 4], 0x31), fs[j + 4]));
      }
    } else {
      __m256 a[4], t[4];
      for (int l = 0; l < 4; l++)
        a[l] = _mm256_set_m128(_mm_loadu_ps(s + (l + 4) * 4), _mm_loadu_ps(s + l * 4));
      t[0] = _mm256_unpacklo_ps(a[0], a[1]);
      t[1] = _mm256_unpackhi_ps(a[0], a[1]);
      t[2] = _mm256_unpacklo_ps(a[2], a[3]);
      t[3] = _mm256_unpackhi_ps(a[2], a[3]);
      _mm256_storeu_ps(d, _mm256_mul_ps(_mm256_shuffle_ps(t[0], t[2], 0x44), fs[0]));
      _mm256_storeu_ps(d + 8, _mm256_mul_ps(_mm256_shuffle_ps(t[0], t[2], 0xee), fs[1]));
      _mm256_storeu_ps(d + 16, _mm256_mul_ps(_mm256_shuffle_ps(t[1], t[3], 0x44), fs[2]));
      _mm256_storeu_ps(d + 24, _mm256_mul_ps(_mm256_shuffle_ps(t[1], t[3], 0xee), fs[3]));
    }
  }
  return k;
}
#endif

void permute_x(const float* x, float* xp, int M, int K, int bits, int width) {
  const int epu = bits == 5 ? 4 : 32 / bits;
  if (bits == 5) width = std::min(width, 8);
  for (int m = 0; m < M; m++) {
    const float* src = x + size_t(m) * K;
    float* dst = xp + size_t(m) * K;
    int k = 0;
#if defined(__x86_64__)
    if (width == 8 && bits != 5 && weft_kernels::isa_level() <= 1) k = permute_row8_avx2(src, dst, K, bits);
#endif
    for (int L = width; L >= 4; L /= 2) {
      const int block = L * epu;
      for (; k + block <= K; k += block)
        for (int lane = 0; lane < L; lane++)
          for (int j = 0; j < epu; j++)
            dst[k + j * L + lane] = src[k + lane * epu + j] * x_field_scale(bits, j);
    }
    for (; k < K; k++) dst[k] = src[k];
  }
}

void quantize_x_int8(const float* x, int8_t* xq, float* xd, float* xc, int M, int K, int bits,
                     int group_size) {
  const int G = K / group_size;
  for (int m = 0; m < M; m++) {
    const float* src = x + size_t(m) * K;
    int8_t* dst = xq + size_t(m) * K;
    float* d_row = xd + size_t(m) * (K / 8);
    if (xc) std::fill(xc + size_t(m) * G, xc + size_t(m + 1) * G, 0.0f);
    for (int b = 0; b < K / 32; b++) {
      const float* p = src + b * 32;
      float amax = 0.0f;
      bool finite = true;
      for (int e = 0; e < 32; e++) {
        const float a = std::fabs(p[e]);
        finite &= a <= std::numeric_limits<float>::max();
        amax = a > amax ? a : amax;
      }
      const float d = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
      // (A block of subnormals whose d underflows, or whose 1 / d overflows, rounds to zeros.)
      const float id = finite && d > 0.0f && 1.0f / d <= std::numeric_limits<float>::max() ? 1.0f / d : 0.0f;
      int8_t q[32];
      int qsum = 0;
      for (int e = 0; e < 32; e++) {
        // Rounded half away from zero; |p| <= amax keeps it within [-127, 127].
        const float v = p[e] * id;
        const int r = int(v + (v >= 0.0f ? 0.5f : -0.5f));
        q[e] = int8_t(r > 127 ? 127 : r < -127 ? -127 : r);
        qsum += q[e];
      }
      const int k = b * 32;
      if (bits == 4) {
        // Evens then odds within the 64-element chunk (or the last 32 of K).
        const int c0 = k / 64 * 64, C = std::min(64, K - c0), off = (k - c0) / 2;
        for (int j = 0; j < 16; j++) {
          dst[c0 + off + j] = q[2 * j];
          dst[c0 + C / 2 + off + j] = q[2 * j + 1];
        }
      } else {
        std::memcpy(dst + k, q, 32);
      }
      for (int i = 0; i < 4; i++) d_row[b * 4 + i] = d;
      if (xc) xc[size_t(m) * G + k / group_size] += 128.0f * d * float(qsum);
    }
  }
}

namespace {

// ---------------------------------------------------------------------------------------------
// Thread pool: workers spin briefly between jobs (a decode step runs a few hundred matmuls
// microseconds apart), then sleep on a futex. The calling thread (MLX's stream thread) works
// too and never waits for a worker that has not started: on a loaded machine a descheduled
// worker simply gets no chunks, and the caller waits only for chunks already taken.

class Pool {
 public:
  static Pool& get() {
    // Never destroyed: at exit a stream thread may still be inside a job.
    static Pool* pool = new Pool;
    return *pool;
  }

  int threads() const { return int(workers_.size()) + 1; }

  // Runs fn(ctx, chunk) for every chunk in [0, chunks), spread over the pool.
  void run(int chunks, void (*fn)(void*, int), void* ctx) {
    if (workers_.empty() || chunks <= 1 || !busy_.try_lock()) {
      // Busy (another stream's matmul) or nothing to share: run here.
      for (int c = 0; c < chunks; c++) fn(ctx, c);
      return;
    }
    fn_ = fn;
    ctx_ = ctx;
    chunks_ = chunks;
    next_.store(0, std::memory_order_relaxed);
    active_.store(true, std::memory_order_seq_cst);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    generation_.notify_all();
    work();
    // Every chunk is taken; no worker may start one after this, and those inside finish.
    active_.store(false, std::memory_order_seq_cst);
    while (inside_.load(std::memory_order_seq_cst) != 0) pause();
    busy_.unlock();
  }

 private:
  Pool() {
    int n = configured_threads();
    for (int i = 1; i < n; i++) workers_.emplace_back([this] { loop(); });
  }

  static int configured_threads() {
    if (const char* env = std::getenv("WEFT_CPU_THREADS")) {
      int n = std::atoi(env);
      if (n >= 1) return std::min(n, 256);
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1u, std::thread::hardware_concurrency());
  }

  static void pause() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  void work() {
    for (;;) {
      int c = next_.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks_) return;
      fn_(ctx_, c);
    }
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      // Spin ~100 us for the next job before sleeping.
      auto start = std::chrono::steady_clock::now();
      uint64_t g;
      for (int i = 0;; i++) {
        g = generation_.load(std::memory_order_acquire);
        if (g != seen) break;
        pause();
        if ((i & 63) == 63 &&
            std::chrono::steady_clock::now() - start > std::chrono::microseconds(100)) {
          generation_.wait(seen, std::memory_order_acquire);
        }
      }
      seen = g;
      // Join only a job still being handed out (its fields are published before active_).
      inside_.fetch_add(1, std::memory_order_seq_cst);
      if (active_.load(std::memory_order_seq_cst)) work();
      inside_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex busy_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> next_{0};
  std::atomic<int> inside_{0};
  std::atomic<bool> active_{false};
  void (*fn_)(void*, int) = nullptr;
  void* ctx_ = nullptr;
  int chunks_ = 0;
};

// ---------------------------------------------------------------------------------------------

// 0: the best this CPU has; 1: at most AVX2; 2: generic (tests run every kernel this way).
int cap_of(const char* isa) {
  if (std::strcmp(isa, "avx512") == 0) return 0;
  if (std::strcmp(isa, "avx2") == 0) return 1;
  if (std::strcmp(isa, "generic") == 0) return 2;
  return -1;
}

int initial_cap() {
  const char* env = std::getenv("WEFT_CPU_ISA");
  return env && cap_of(env) >= 0 ? cap_of(env) : 0;
}

std::atomic<int> isa_cap{initial_cap()};

// `M`: rows of x; below GEMM_MIN_ROWS the per-row (decode) path runs.
const Kernel& select_kernel(int K, int bits, size_t M = GEMM_MIN_ROWS) {
#if defined(__x86_64__)
  const int level = weft_kernels::isa_level();
  // AMD's Zen 4 runs 512-bit ops as two 256-bit halves: there the AVX-512 per-row kernel
  // measured 1.4-2.1x slower than the AVX2 one on SmolLM2's decode shapes
  // (kernels/tests/qmm_decode_bench.cpp), so AMD CPUs decode with AVX2.
  static const bool amd = __builtin_cpu_is("amd");
  const bool rows_on_avx2 = amd && M < size_t(GEMM_MIN_ROWS);
  // The 16-lane kernel only when a 16-lane block fits K at least once (5-bit weights are read
  // 8 lanes at a time by every x86 kernel; the AVX-512 build runs them with its registers).
  if (level == 0 && !rows_on_avx2 && K >= 16 * (bits == 5 ? 4 : 32 / bits)) return avx512::kernel;
  if (level <= 1) return avx2::kernel;
#else
  (void)K;
  (void)bits;
  (void)M;
#endif
  return generic::kernel;
}

// The int8-activation kernel (qmm_int8.cpp) under the same cap: VNNI on 256-bit vectors where
// the CPU has AVX-512 VNNI (+ VL, BW), else AVX2's vpmaddubsw, else the scalar baseline.
// AVX-512 without VNNI runs the AVX2 kernel: 512-bit vectors would need K to be a multiple of
// 128 elements (576 is not), and Zen 4 splits them in two 256-bit halves anyway.
const Kernel& select_int8_kernel() {
#if defined(__x86_64__)
  const int level = weft_kernels::isa_level();
  static const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                           __builtin_cpu_supports("avx512bw");
  if (level == 0 && vnni) return avx512vnni::int8_kernel;
  if (level <= 1) return avx2::int8_kernel;
#endif
  return generic::int8_kernel;
}

// Whether a call of M rows runs the int8 kernel when int8 activations are asked for: the
// per-row path with 4- or 8-bit weights (5-bit codes and the GEMM path stay on float32 x).
bool int8_applies(size_t M, int bits) { return M < size_t(GEMM_MIN_ROWS) && (bits == 4 || bits == 8); }

int dtype_code(mx::Dtype d) {
  if (d == mx::float32) return F32;
  if (d == mx::float16) return F16;
  return BF16;
}

// x (any float dtype, any strides) into float32 row-major [M][K].
void gather_x(const mx::array& x, float* dst, size_t M, int K) {
  const auto& shape = x.shape();
  const auto& strides = x.strides();
  const int nd = int(shape.size());
  auto convert = [&](auto tag) {
    using T = decltype(tag);
    const T* base = x.data<T>();
    if (x.flags().row_contiguous) {
      for (size_t i = 0, n = M * size_t(K); i < n; i++) dst[i] = static_cast<float>(base[i]);
      return;
    }
    std::vector<int> idx(nd, 0);
    for (size_t m = 0; m < M; m++) {
      int64_t off = 0;
      for (int d = 0; d < nd - 1; d++) off += int64_t(idx[d]) * strides[d];
      const int64_t ks = strides[nd - 1];
      for (int k = 0; k < K; k++) dst[m * K + k] = static_cast<float>(base[off + k * ks]);
      for (int d = nd - 2; d >= 0; d--) {
        if (++idx[d] < shape[d]) break;
        idx[d] = 0;
      }
    }
  };
  if (x.dtype() == mx::float32) convert(float{});
  else if (x.dtype() == mx::float16) convert(mx::float16_t{});
  else convert(mx::bfloat16_t{});
}

struct Job {
  const Kernel* kernel;
  Args args;
  int rows_per_chunk;
  // Chunks of rows_per_chunk rows, then (when tail_rows > 0) the rest in chunks of tail_rows.
  int full_chunks = 0;
  int tail_rows = 0;
};

void run_chunk(void* ctx, int c) {
  auto* job = static_cast<Job*>(ctx);
  int n0 = c * job->rows_per_chunk, size = job->rows_per_chunk;
  if (job->tail_rows > 0 && c >= job->full_chunks) {
    n0 = job->full_chunks * job->rows_per_chunk + (c - job->full_chunks) * job->tail_rows;
    size = job->tail_rows;
  }
  int n1 = std::min(job->args.N, n0 + size);
  job->kernel->rows(job->args, n0, n1);
}

// Pool chunks of a job: the per-row path from 4 rows of x ends in chunks of TAIL_ROWS rows, so
// the thread that takes the last one keeps the other waiting for less (at 8 rows a 32-row chunk
// is several microseconds, and the stream thread waited out the worker's last one on each of
// a step's ~120 matmuls).
constexpr int TAIL_ROWS = 8;

int job_chunks(Job& job, size_t M) {
  const int N = job.args.N, rows = job.rows_per_chunk;
  if (M >= 4 && M < size_t(GEMM_MIN_ROWS) && N > rows) {
    job.full_chunks = (N - 1) / rows;
    job.tail_rows = TAIL_ROWS;
    const int rest = N - job.full_chunks * rows;
    return job.full_chunks + (rest + TAIL_ROWS - 1) / TAIL_ROWS;
  }
  return (N + rows - 1) / rows;
}

// exp_lanes on 32-byte vectors is only ever inlined into swiglu_row_avx2: GCC's note on their
// argument-passing ABI does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#include "vec_exp.h"

// One row of silu(gate) * up as mlx-lm's swiglu computes it (gate * sigmoid(gate), then times
// up), exp L lanes at a time: a scalar libm exp per element was ~45 us of each down projection
// of a B=8 step, on the stream thread while the pool waits.
template <class F, class I>
static inline __attribute__((always_inline)) void swiglu_row_lanes(const float* g, const float* u,
                                                                   float* dst, int K) {
  constexpr int L = int(sizeof(F) / 4);
  int k = 0;
  for (; k + L <= K; k += L) {
    F gv, uv;
    std::memcpy(&gv, g + k, sizeof gv);
    std::memcpy(&uv, u + k, sizeof uv);
    const F r = gv * ((F{} + 1.0f) / ((F{} + 1.0f) + exp_lanes<F, I>(-gv))) * uv;
    std::memcpy(dst + k, &r, sizeof r);
  }
  for (; k < K; k++) {
    const float silu = g[k] * (1.0f / (1.0f + std::exp(-g[k])));
    dst[k] = silu * u[k];
  }
}

#if defined(__x86_64__)
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
__attribute__((target("avx2,fma"))) void swiglu_row_avx2(const float* g, const float* u, float* dst,
                                                         int K) {
  swiglu_row_lanes<vf8, vi8>(g, u, dst, K);
}
#endif

#if defined(__x86_64__)
// Per-group sums of x (group_size a multiple of 16) eight lanes at a time.
__attribute__((target("avx2,fma"))) void group_sums_avx2(const float* x, float* xsum, size_t M, int K,
                                                         int group_size) {
  const int G = K / group_size;
  for (size_t m = 0; m < M; m++)
    for (int g = 0; g < G; g++) {
      const float* p = x + m * K + size_t(g) * group_size;
      __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
      for (int k = 16; k < group_size; k += 16) {
        a = _mm256_add_ps(a, _mm256_loadu_ps(p + k));
        b = _mm256_add_ps(b, _mm256_loadu_ps(p + k + 8));
      }
      a = _mm256_add_ps(a, b);
      __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
      h = _mm_add_ps(h, _mm_movehl_ps(h, h));
      h = _mm_add_ss(h, _mm_movehdup_ps(h));
      xsum[m * G + g] = _mm_cvtss_f32(h);
    }
}
#endif

// `lanes`: the vector exp; without it libm's exp per element. Int8 activations keep libm's
// (at every row count): their next-token bounds and greedy checks against exact mode were
// fitted with it, and a last-bit change of silu moves some of their roundings and near ties.
void swiglu_row(const float* g, const float* u, float* dst, int K, bool lanes) {
  if (!lanes) {
    for (int k = 0; k < K; k++) {
      const float silu = g[k] * (1.0f / (1.0f + std::exp(-g[k])));
      dst[k] = silu * u[k];
    }
    return;
  }
#if defined(__x86_64__)
  if (weft_kernels::isa_level() <= 1) return swiglu_row_avx2(g, u, dst, K);
#endif
  swiglu_row_lanes<vf4, vi4>(g, u, dst, K);
}

// x as the kernel reads it: float32 in its lane order plus per-group sums (thread-local
// buffers of the stream thread, valid until its next call).
struct PreparedX {
  const Kernel* kernel;
  const float* xp;
  const float* xsum;
  const float* x;  // row-major, the GEMM path's input
  // The int8 kernel's input (quantize_x_int8), when it runs.
  const int8_t* xq = nullptr;
  const float* xd = nullptr;
  const float* xc = nullptr;
};

// `swiglu`: x holds 2K columns, gate then up; the kernel reads silu(gate) * up (mlx-lm's
// swiglu: gate * sigmoid(gate), then times up, each product rounded to float32).
// `gemm_only`: every call takes the GEMM path (M >= GEMM_MIN_ROWS), which reads only the
// row-major x: the lane order and group sums are not built. `int8`: the int8 kernel runs
// (int8_applies): x is quantized for it instead of laid out for the float kernel.
PreparedX prepare_x(const mx::array& x, size_t M, int K, int group_size, int bits,
                    bool swiglu = false, bool gemm_only = false, bool int8 = false,
                    bool swiglu_lanes = true) {
  const int G = K / group_size;
  thread_local std::vector<float> xf, xp, xsum, gate_up;
  xf.resize(M * K);
  if (swiglu) {
    gate_up.resize(M * 2 * size_t(K));
    gather_x(x, gate_up.data(), M, 2 * K);
    for (size_t m = 0; m < M; m++) {
      const float* g = gate_up.data() + m * 2 * K;
      const float* u = g + K;
      swiglu_row(g, u, xf.data() + m * K, K, swiglu_lanes);
    }
  } else {
    gather_x(x, xf.data(), M, K);
  }
  const Kernel& kernel = int8 ? select_int8_kernel() : select_kernel(K, bits, M);
  if (gemm_only) return {&kernel, nullptr, nullptr, xf.data()};
  xsum.resize(M * G);
  if (int8) {
    thread_local std::vector<int8_t> xq;
    thread_local std::vector<float> xd, xc;
    xq.resize(M * K);
    xd.resize(M * K / 8);
    xc.resize(M * G);
    quantize_x_int8(xf.data(), xq.data(), xd.data(), xc.data(), int(M), K, bits, group_size);
    // The bias term sums the quantized x (xc / 128, exact), as llama.cpp's q8_1 sum: then y is
    // the dequantized weights times the quantized x, whose rounding error sum_k w_k e_k stays
    // centred. With the float sum it is sum_k (w_k - b) e_k, b the group's minimum: ~6x the
    // next-token KL on SmolLM2 (docs/benchmarks.md).
    for (size_t i = 0; i < M * G; i++) xsum[i] = xc[i] * (1.0f / 128.0f);
    return {&kernel, nullptr, xsum.data(), xf.data(), xq.data(), xd.data(), bits == 8 ? xc.data() : nullptr};
  }
#if defined(__x86_64__)
  if (group_size % 16 == 0 && weft_kernels::isa_level() <= 1) group_sums_avx2(xf.data(), xsum.data(), M, K, group_size);
  else
#endif
  for (size_t m = 0; m < M; m++)
    for (int g = 0; g < G; g++) {
      float s = 0;
      const float* p = xf.data() + m * K + size_t(g) * group_size;
      for (int k = 0; k < group_size; k++) s += p[k];
      xsum[m * G + g] = s;
    }
  xp.resize(M * K);
  permute_x(xf.data(), xp.data(), int(M), K, bits, kernel.width);
  return {&kernel, xp.data(), xsum.data(), xf.data()};
}

// Where the kernel writes y: the output itself when it is float32, else a buffer that
// store_output converts from.
float* output_f32(mx::array& out, size_t n) {
  thread_local std::vector<float> y;
  if (out.dtype() == mx::float32) return out.data<float>();
  y.resize(n);
  return y.data();
}

void store_output(mx::array& out, const float* y, size_t n) {
  if (out.dtype() == mx::float16) {
    auto* o = out.data<mx::float16_t>();
    for (size_t i = 0; i < n; i++) o[i] = mx::float16_t(y[i]);
  } else if (out.dtype() == mx::bfloat16) {
    auto* o = out.data<mx::bfloat16_t>();
    for (size_t i = 0; i < n; i++) o[i] = mx::bfloat16_t(y[i]);
  }
}

// Rows of y per chunk: enough chunks to balance the pool, each large enough to amortize its
// setup.
int chunk_rows(size_t M, int N) {
  if (M >= size_t(GEMM_MIN_ROWS)) return GEMM_CHUNK_ROWS;
  // From 4 rows: 32-row chunks (a few us each at 8 rows), so the pool's last chunk leaves
  // little idle (64 made N = 576 nine chunks over two threads).
  return M >= 4 ? 32 : std::max(16, N / (Pool::get().threads() * 8));
}

// `int8`: int8 activations where int8_applies.
void compute(const mx::array& x, const mx::array& w, const mx::array& scales,
             const mx::array& biases, mx::array& out, int group_size, int bits, bool swiglu,
             bool int8) {
  const int K = x.shape().back() / (swiglu ? 2 : 1);
  const int N = w.shape(0);
  const size_t M = x.size() / size_t(x.shape().back());
  // Int8 activations asked (every row count, prefill too) keep libm's exp in SwiGLU.
  const bool swiglu_lanes = !int8;
  int8 = int8 && int8_applies(M, bits);
  const PreparedX px =
      prepare_x(x, M, K, group_size, bits, swiglu, M >= size_t(GEMM_MIN_ROWS), int8, swiglu_lanes);
  float* y = output_f32(out, M * size_t(N));
  Job job;
  job.kernel = px.kernel;
  job.args = Args{px.xp, px.xsum, w.data<uint32_t>(), scales.data<void>(), biases.data<void>(),
                  dtype_code(scales.dtype()), y, int(M), N, K, bits, group_size, px.x};
  job.args.xq = px.xq;
  job.args.xd = px.xd;
  job.args.xc = px.xc;
  job.rows_per_chunk = chunk_rows(M, N);
  Pool::get().run(job_chunks(job, M), run_chunk, &job);
  store_output(out, y, M * size_t(N));
}

// gather_qmm's form (mixture-of-experts layers): P pairs of M rows of x and an expert id e_p,
// out[p] = x[p] @ W[e_p]^T. A run of consecutive pairs with one expert (routing sorted by
// expert, as in prefill) is one call of M * run rows, so that expert's weights are read once.
struct GatherJob {
  const Kernel* kernel;
  struct Piece {
    Args args;
    int n0, n1;
  };
  std::vector<Piece> pieces;
};

void run_gather_chunk(void* ctx, int c) {
  auto* job = static_cast<GatherJob*>(ctx);
  const auto& piece = job->pieces[size_t(c)];
  job->kernel->rows(piece.args, piece.n0, piece.n1);
}

void compute_gather(const mx::array& x, const mx::array& w, const mx::array& scales,
                    const mx::array& biases, const mx::array& ids, mx::array& out, int group_size,
                    int bits) {
  const int K = x.shape().back();
  const int E = w.shape(0), N = w.shape(1);
  const size_t P = ids.size();
  if (P == 0 || x.size() == 0) return;
  const size_t M = x.size() / size_t(K) / P;
  const int G = K / group_size;
  const size_t words = size_t(K) / 32 * bits;
  const size_t sbytes = size_t(N) * G * scales.itemsize();
  const PreparedX px = prepare_x(x, P * M, K, group_size, bits);
  float* y = output_f32(out, P * M * size_t(N));
  const uint32_t* e = ids.data<uint32_t>();
  const auto* w0 = w.data<uint32_t>();
  const auto* s0 = static_cast<const char*>(scales.data<void>());
  const auto* b0 = static_cast<const char*>(biases.data<void>());
  thread_local GatherJob job;
  job.kernel = px.kernel;
  job.pieces.clear();
  for (size_t p0 = 0, p1; p0 < P; p0 = p1) {
    for (p1 = p0 + 1; p1 < P && e[p1] == e[p0];) p1++;
    const size_t rows = (p1 - p0) * M;
    float* yp = y + p0 * M * size_t(N);
    if (e[p0] >= uint32_t(E)) {
      // No such expert: NaN rows rather than a read past the weights.
      std::fill(yp, yp + rows * size_t(N), std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const Args a{px.xp + p0 * M * K, px.xsum + p0 * M * G, w0 + e[p0] * size_t(N) * words,
                 s0 + e[p0] * sbytes, b0 + e[p0] * sbytes, dtype_code(scales.dtype()), yp,
                 int(rows), N, K, bits, group_size, px.x + p0 * M * K};
    const int step = chunk_rows(rows, N);
    for (int n0 = 0; n0 < N; n0 += step) job.pieces.push_back({a, n0, std::min(N, n0 + step)});
  }
  Pool::get().run(int(job.pieces.size()), run_gather_chunk, &job);
  store_output(out, y, P * M * size_t(N));
}

class QuantizedMatmul : public mx::Primitive {
 public:
  // `swiglu`: the input is a gate/up pair and the matmul reads silu(gate) * up. `int8`: int8
  // activations (the int8 kernel) where they apply.
  QuantizedMatmul(mx::Stream stream, int group_size, int bits, bool swiglu, bool int8)
      : mx::Primitive(stream), group_size_(group_size), bits_(bits), swiglu_(swiglu), int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.dispatch([x = inputs[0], w = inputs[1], s = inputs[2], b = inputs[3],
                      out = mx::array::unsafe_weak_copy(out), gs = group_size_, bits = bits_,
                      swiglu = swiglu_, int8 = int8_]() mutable { compute(x, w, s, b, out, gs, bits, swiglu, int8); });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("weft QuantizedMatmul runs on the CPU; GPU streams use MLX's own");
  }

  const char* name() const override { return swiglu_ ? "WeftSwigluQuantizedMatmul" : "WeftQuantizedMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const QuantizedMatmul*>(&other);
    return o && o->group_size_ == group_size_ && o->bits_ == bits_ && o->swiglu_ == swiglu_ && o->int8_ == int8_;
  }

 private:
  int group_size_;
  int bits_;
  bool swiglu_;
  bool int8_;
};

class GatherQuantizedMatmul : public mx::Primitive {
 public:
  GatherQuantizedMatmul(mx::Stream stream, int group_size, int bits)
      : mx::Primitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.dispatch([x = inputs[0], w = inputs[1], s = inputs[2], b = inputs[3], ids = inputs[4],
                      out = mx::array::unsafe_weak_copy(out), gs = group_size_,
                      bits = bits_]() mutable { compute_gather(x, w, s, b, ids, out, gs, bits); });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("weft GatherQuantizedMatmul runs on the CPU; GPU streams use MLX's own");
  }

  const char* name() const override { return "WeftGatherQuantizedMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const GatherQuantizedMatmul*>(&other);
    return o && o->group_size_ == group_size_ && o->bits_ == bits_;
  }

 private:
  int group_size_;
  int bits_;
};

thread_local std::string last_error;

bool is_float(mx::Dtype d) { return d == mx::float32 || d == mx::float16 || d == mx::bfloat16; }

// Our kernel's domain; anything else goes to MLX's op (which also reports errors). `experts`:
// w, scales and biases carry a leading expert axis (gather form).
// `x_k`: the inner dimension the kernel reads (x's last axis, or half of it for swiglu).
bool supported(const mx::array& x, const mx::array& w, const mx::array& s, const mx::array& b,
               int group_size, int bits, const mx::Stream& stream, bool experts = false,
               int x_k = -1) {
  if (stream.device.type != mx::Device::DeviceType::cpu) return false;
  if (!(bits == 4 || bits == 5 || bits == 8) || !(group_size == 32 || group_size == 64)) return false;
  const size_t nd = experts ? 3 : 2;
  if (x.ndim() < (experts ? 2u : 1u) || w.ndim() != nd || s.ndim() != nd || b.ndim() != nd) return false;
  if (!is_float(x.dtype()) || w.dtype() != mx::uint32) return false;
  if (!is_float(s.dtype()) || s.dtype() != b.dtype()) return false;
  const int K = x_k >= 0 ? x_k : x.shape().back();
  const int N = w.shape(-2);
  if (K <= 0 || N <= 0 || int64_t(w.shape(-1)) * 32 != int64_t(K) * bits || K % group_size != 0)
    return false;
  if (s.shape(-2) != N || s.shape(-1) != K / group_size || b.shape() != s.shape()) return false;
  if (experts && (s.shape(0) != w.shape(0) || w.shape(0) <= 0)) return false;
  return true;
}

mx::array contiguous_rows(const mx::array& a, const mx::Stream& s) {
  // Weights are normally loaded contiguous and already evaluated: no extra op then.
  if (a.is_available() && a.flags().row_contiguous) return a;
  return mx::contiguous(a, false, s);
}

}  // namespace
}  // namespace weft_qmm

namespace weft_kernels {

void parallel_for(int chunks, void (*fn)(void*, int), void* ctx) { weft_qmm::Pool::get().run(chunks, fn, ctx); }

int pool_threads() { return weft_qmm::Pool::get().threads(); }

int isa_level() {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("f16c");
  const int cap = weft_qmm::isa_cap.load(std::memory_order_relaxed);
  if (avx512 && avx2 && cap == 0) return 0;
  if (avx2 && cap <= 1) return 1;
#endif
  return 2;
}

}  // namespace weft_kernels

using namespace weft_qmm;

extern "C" int weft_quantized_matmul(mlx_array* res, const mlx_array x, const mlx_array w,
                                     const mlx_array scales, const mlx_array biases,
                                     int group_size, int bits, int int8_activations,
                                     const mlx_stream stream) {
  try {
    const auto& xa = mlx_array_get_(x);
    const auto& wa = mlx_array_get_(w);
    const auto& sa = mlx_array_get_(scales);
    const auto& ba = mlx_array_get_(biases);
    const auto& st = mlx_stream_get_(stream);
    if (!supported(xa, wa, sa, ba, group_size, bits, st)) {
      mlx_array_set_(*res, mx::quantized_matmul(xa, wa, sa, ba, true, group_size, bits, "affine", st));
      return 0;
    }
    auto shape = xa.shape();
    shape.back() = wa.shape(0);
    auto prim = std::make_shared<QuantizedMatmul>(st, group_size, bits, false, int8_activations != 0);
    mlx_array_set_(*res, mx::array(shape, xa.dtype(), prim,
                                   {xa, contiguous_rows(wa, st), contiguous_rows(sa, st),
                                    contiguous_rows(ba, st)}));
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

extern "C" int weft_swiglu_quantized_matmul(mlx_array* res, const mlx_array gate_up,
                                            const mlx_array w, const mlx_array scales,
                                            const mlx_array biases, int group_size, int bits,
                                            int int8_activations, const mlx_stream stream) {
  try {
    const auto& xa = mlx_array_get_(gate_up);
    const auto& wa = mlx_array_get_(w);
    const auto& sa = mlx_array_get_(scales);
    const auto& ba = mlx_array_get_(biases);
    const auto& st = mlx_stream_get_(stream);
    const int two_k = xa.ndim() ? xa.shape().back() : 0;
    const bool ok = xa.dtype() == mx::float32 && two_k > 0 && two_k % 2 == 0 &&
                    supported(xa, wa, sa, ba, group_size, bits, st, false, two_k / 2);
    if (!ok) {
      // MLX's ops: swiglu as mlx-lm writes it, then the matmul.
      auto halves = mx::split(xa, 2, -1, st);
      auto h = mx::multiply(mx::multiply(halves[0], mx::sigmoid(halves[0], st), st), halves[1], st);
      mlx_array_set_(*res, mx::quantized_matmul(h, wa, sa, ba, true, group_size, bits, "affine", st));
      return 0;
    }
    auto shape = xa.shape();
    shape.back() = wa.shape(0);
    auto prim = std::make_shared<QuantizedMatmul>(st, group_size, bits, true, int8_activations != 0);
    mlx_array_set_(*res, mx::array(shape, xa.dtype(), prim,
                                   {xa, contiguous_rows(wa, st), contiguous_rows(sa, st),
                                    contiguous_rows(ba, st)}));
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

extern "C" int weft_gather_qmm(mlx_array* res, const mlx_array x, const mlx_array w,
                               const mlx_array scales, const mlx_array biases,
                               const mlx_array indices, int group_size, int bits,
                               const mlx_stream stream) {
  try {
    const auto& xa = mlx_array_get_(x);
    const auto& wa = mlx_array_get_(w);
    const auto& sa = mlx_array_get_(scales);
    const auto& ba = mlx_array_get_(biases);
    const auto& ia = mlx_array_get_(indices);
    const auto& st = mlx_stream_get_(stream);
    const bool int_ids = ia.dtype() == mx::uint32 || ia.dtype() == mx::int32;
    if (!int_ids || !supported(xa, wa, sa, ba, group_size, bits, st, true)) {
      mlx_array_set_(*res, mx::gather_qmm(xa, wa, sa, ba, std::nullopt, ia, true, group_size, bits,
                                          "affine", /*global_scale=*/std::nullopt, false, st));
      return 0;
    }
    // As gather_qmm: x's batch dimensions broadcast against the indices' shape; each position
    // of the broadcast shape is one (M x K rows, expert) pair.
    const int M = xa.shape(-2), K = xa.shape(-1);
    mx::Shape batch(xa.shape().begin(), xa.shape().end() - 2);
    batch = mx::broadcast_shapes(batch, ia.shape());
    mx::Shape x_shape = batch;
    x_shape.push_back(M);
    x_shape.push_back(K);
    auto xb = xa.shape() == x_shape ? xa : mx::broadcast_to(xa, x_shape, st);
    auto ids = mx::contiguous(mx::astype(mx::broadcast_to(ia, batch, st), mx::uint32, st), false, st);
    mx::Shape out_shape = batch;
    out_shape.push_back(M);
    out_shape.push_back(wa.shape(1));
    auto prim = std::make_shared<GatherQuantizedMatmul>(st, group_size, bits);
    mlx_array_set_(*res, mx::array(out_shape, xa.dtype(), prim,
                                   {xb, contiguous_rows(wa, st), contiguous_rows(sa, st),
                                    contiguous_rows(ba, st), ids}));
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

extern "C" const char* weft_kernels_last_error(void) { return last_error.c_str(); }

extern "C" const char* weft_kernels_isa(int k, int bits) {
  // Prefill's kernel, and decode's when it differs: the one pair that can (AMD, see select_kernel).
  const char* prefill = select_kernel(k, bits).name;
  return select_kernel(k, bits, 1).name == prefill ? prefill : "avx512 (decode avx2)";
}

extern "C" const char* weft_kernels_int8_isa(void) { return select_int8_kernel().name; }

extern "C" int weft_kernels_limit_isa(const char* isa) {
  int cap = cap_of(isa);
  if (cap < 0) return 1;
  isa_cap = cap;
  return 0;
}

extern "C" int weft_kernels_threads(void) { return Pool::get().threads(); }
