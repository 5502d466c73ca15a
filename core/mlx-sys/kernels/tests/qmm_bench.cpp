// Kernel-only timing of one instruction set's quantized matmul (not run by CI or any test):
// GFLOP/s of the per-row path (Args::x null) and of the GEMM path on given shapes, on one
// thread (its CPU time) and split over T threads as the pool splits it (wall time). Build and
// run by hand, e.g. for AVX-512:
//
//   cd core/mlx-sys/kernels
//   g++ -std=c++20 -O3 -ffp-contract=fast -DWEFT_QMM_ISA=avx512 -DWEFT_QMM_WIDTH=16 \
//     -mavx512f -mavx2 -mfma -mf16c -I. tests/qmm_bench.cpp qmm_kernel.cpp -lpthread -o /tmp/qb
//   /tmp/qb [bits] [group] [threads] [M...]     (default: 4 32 2, M = 512)
//
// Shapes: SmolLM2-135M's prefill matmuls (q, k/v, fused q/k/v, fused gate/up, down, lm head).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <vector>

#include "../qmm_kernel.h"

namespace weft_qmm {
namespace WEFT_QMM_ISA {
extern const Kernel kernel;
}
}  // namespace weft_qmm

using namespace weft_qmm;

static double thread_cpu() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static double wall() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The pool's split: chunks of `step` output rows handed out from a shared counter.
static void run(const Args& a, int threads, int step) {
  std::atomic<int> next{0};
  auto work = [&] {
    for (;;) {
      int n0 = next.fetch_add(step);
      if (n0 >= a.N) return;
      WEFT_QMM_ISA::kernel.rows(a, n0, n0 + step < a.N ? n0 + step : a.N);
    }
  };
  std::vector<std::thread> ts;
  for (int t = 1; t < threads; t++) ts.emplace_back(work);
  work();
  for (auto& t : ts) t.join();
}

int main(int argc, char** argv) {
  const int bits = argc > 1 ? atoi(argv[1]) : 4, gs = argc > 2 ? atoi(argv[2]) : 32;
  const int threads = argc > 3 ? atoi(argv[3]) : 2;
  std::vector<int> ms;
  for (int i = 4; i < argc; i++) ms.push_back(atoi(argv[i]));
  if (ms.empty()) ms.push_back(512);
  const int shapes[][2] = {{576, 576}, {192, 576}, {960, 576}, {3072, 576}, {576, 1536}, {49152, 576}};
  printf("%s bits %d group %d, %d threads: GFLOP/s (1 thread CPU time | %d threads wall)\n",
         WEFT_QMM_ISA::kernel.name, bits, gs, threads, threads);
  printf("%6s %6s %5s | %8s %8s | %8s %8s\n", "N", "K", "M", "rows 1t", "gemm 1t", "rows Tt", "gemm Tt");
  uint32_t state = 12345;
  auto rnd = [&] { return state = state * 1664525u + 1013904223u; };
  for (int M : ms)
    for (auto& s : shapes) {
      const int N = s[0], K = s[1], G = K / gs;
      std::vector<float> x(size_t(M) * K), xsum(size_t(M) * G, 0.0f), y(size_t(M) * N);
      for (auto& v : x) v = (rnd() >> 8) * (1.0f / 16777216.0f) - 0.5f;
      std::vector<uint32_t> w(size_t(N) * K / 32 * bits);
      for (auto& v : w) v = rnd();
      std::vector<uint16_t> sc(size_t(N) * G, 0x2000), bs(size_t(N) * G, 0xa000);  // float16
      // The per-row path reads its own lane order; its timing does not depend on the values.
      Args a{x.data(), xsum.data(), w.data(), sc.data(), bs.data(), F16, y.data(), M, N, K, bits, gs, nullptr};
      const double flop = 2.0 * M * N * K;
      double r[4];
      for (int path = 0; path < 2; path++) {
        a.x = path ? x.data() : nullptr;
        const int step = path && M >= GEMM_MIN_ROWS ? GEMM_CHUNK_ROWS : 64;
        // Enough repeats for ~0.2 s of work, best of them.
        const int reps = std::max(1, int(2e8 / flop * 10));
        double best1 = 1e30, bestT = 1e30;
        for (int rep = 0; rep < reps; rep++) {
          double t0 = thread_cpu();
          run(a, 1, step);
          best1 = std::min(best1, thread_cpu() - t0);
          t0 = wall();
          run(a, threads, step);
          bestT = std::min(bestT, wall() - t0);
        }
        r[path] = flop / best1 * 1e-9;
        r[2 + path] = flop / bestT * 1e-9;
      }
      printf("%6d %6d %5d | %8.1f %8.1f | %8.1f %8.1f\n", N, K, M, r[0], r[1], r[2], r[3]);
    }
  return 0;
}
