// Kernel-only benchmark of the decode (M = 1) shapes of SmolLM2-135M (fused QKV 576 -> 960,
// gate/up 576 -> 3072, down 1536 -> 576, o 576 -> 576, the 8-bit tied LM head 576 -> 49152),
// float16 scales as GGUF keeps them, on one thread, for M rows of x (argument; default 1: B=1
// decode; 8: a B=8 step): GB/s of weights + scales against a plain
// streaming read of the same weight bytes. Each shape cycles over ~200 MB of copies so the
// weights come from DRAM, as in a decode step. Thread CPU time, so a loaded machine skews it
// less. A fourth argument "int8" runs the int8-activation kernel (qmm_int8.cpp) instead, on x
// quantized as quantize_x_int8 describes (the quantization itself is not timed: the primitive
// does it once per call, for every output row). Not a test (no pass/fail); build and run:
//
//   cd core/mlx-sys/kernels && g++ -std=c++20 -O3 -ffp-contract=fast -mavx512f -mavx2 -mfma \
//     -mf16c -DWEFT_QMM_ISA=avx512 -DWEFT_QMM_WIDTH=16 -I. qmm_kernel.cpp \
//     tests/qmm_decode_bench.cpp -o /tmp/qmm-bench && taskset -c 1 /tmp/qmm-bench [M [shape [hot|dram [int8]]]]
//
// With the int8 kernel of another instruction set (avx2, or avx512vnni: add -mavx512bw
// -mavx512vl -mavx512vnni), compile its qmm_int8.cpp separately and name it:
//
//   g++ -std=c++20 -O3 -ffp-contract=fast -mavx2 -mfma -mf16c -DWEFT_QMM_ISA=avx2 -I. -c \
//     qmm_int8.cpp -o /tmp/qmm-int8.o && g++ ... -DWEFT_QMM_INT8_ISA=avx2 qmm_kernel.cpp \
//     tests/qmm_decode_bench.cpp /tmp/qmm-int8.o -o /tmp/qmm-bench
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../qmm_kernel.h"

namespace weft_qmm {
namespace WEFT_QMM_ISA {
extern const Kernel kernel;
}
#ifndef WEFT_QMM_INT8_ISA
#define WEFT_QMM_INT8_ISA WEFT_QMM_ISA
#endif
namespace WEFT_QMM_INT8_ISA {
extern const Kernel int8_kernel;
}
}  // namespace weft_qmm

using namespace weft_qmm;

static double cpu_now() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

#include "test_random.h"

int main(int argc, char** argv) {
  const int M = argc > 1 ? std::atoi(argv[1]) : 1;
  struct Shape {
    const char* name;
    int N, K, bits;
  } shapes[] = {{"qkv 576->960", 960, 576, 4},       {"gate/up 576->3072", 3072, 576, 4},
                {"down 1536->576", 576, 1536, 4},    {"o 576->576", 576, 576, 4},
                {"lm head 576->49152 8-bit", 49152, 576, 8}};
  const int gs = 32;
  for (const auto& s : shapes) {
    if (argc > 2 && !std::strstr(s.name, argv[2])) continue;
    const int G = s.K / gs;
    const size_t words = size_t(s.N) * s.K / 32 * s.bits;
    // A third argument "hot": one copy, so the weights stay in cache (compute bound).
    const int copies = argc > 3 && !std::strcmp(argv[3], "hot") ? 1 : int(200e6 / (words * 4.0)) + 1;
    std::vector<std::vector<uint32_t>> w(copies);
    std::vector<std::vector<uint16_t>> sc(copies), bs(copies);
    for (int c = 0; c < copies; c++) {
      w[c].resize(words);
      for (auto& v : w[c]) v = next_u32();
      sc[c].assign(size_t(s.N) * G, 0x2c00);  // float16 1/16
      bs[c].assign(size_t(s.N) * G, 0xac00);
    }
    std::vector<float> x(size_t(M) * s.K, 0.5f), xsum(size_t(M) * G, 16.0f), y(size_t(M) * s.N);
    const bool int8 = argc > 4 && !std::strcmp(argv[4], "int8");
    std::vector<int8_t> xq(size_t(M) * s.K);
    std::vector<float> xd(size_t(M) * s.K / 8, 0.5f / 127), xc(size_t(M) * G, 0.0f);
    for (auto& v : xq) v = int8_t(int(next_u32() % 255) - 127);
    const Kernel& kernel = int8 ? WEFT_QMM_INT8_ISA::int8_kernel : WEFT_QMM_ISA::kernel;
    const double bytes = words * 4.0 + 2.0 * s.N * G * 2;
    int iters = 0;
    double t0 = cpu_now(), t;
    do {
      const int c = iters++ % copies;
      Args a{x.data(), xsum.data(), w[c].data(), sc[c].data(), bs[c].data(), F16, y.data(),
             M,        s.N,         s.K,         s.bits,       gs};
      a.xq = xq.data();
      a.xd = xd.data();
      a.xc = xc.data();
      kernel.rows(a, 0, s.N);
    } while ((t = cpu_now() - t0) < 1.0);
    const double kernel_gbs = bytes * iters / t / 1e9;
    volatile uint64_t sink = 0;
    iters = 0;
    t0 = cpu_now();
    do {
      const uint64_t* p = reinterpret_cast<const uint64_t*>(w[iters++ % copies].data());
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (size_t i = 0; i + 4 <= words / 2; i += 4) {
        a0 ^= p[i];
        a1 ^= p[i + 1];
        a2 ^= p[i + 2];
        a3 ^= p[i + 3];
      }
      sink = a0 ^ a1 ^ a2 ^ a3;
    } while ((t = cpu_now() - t0) < 1.0);
    const double read_gbs = words * 4.0 * iters / t / 1e9;
    printf("M=%d %-26s %-16s kernel %6.2f GB/s %8.1f us/call   read %6.2f GB/s\n", M, s.name, kernel.name, kernel_gbs,
           bytes / kernel_gbs / 1e3, read_gbs);
  }
  return 0;
}
