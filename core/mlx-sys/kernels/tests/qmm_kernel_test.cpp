// Standalone check of one instruction set's quantized-matmul kernel (qmm_kernel.cpp, built
// with WEFT_QMM_ISA / WEFT_QMM_WIDTH) against a double-precision scalar reference, without MLX:
// scripts/test-kernel-aarch64 cross-compiles it for aarch64 (the NEON path) and runs it under
// qemu. The activation layout is built here from its description in qmm_kernel.h, so the test
// also pins that contract. Exits non-zero on any mismatch.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../qmm_kernel.h"

namespace weft_qmm {
namespace WEFT_QMM_ISA {
extern const Kernel kernel;
}
}  // namespace weft_qmm

using namespace weft_qmm;

#include "test_random.h"

// float -> float16 / bfloat16 bits (round to nearest even; the test values are normal floats).
static uint16_t to_bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return uint16_t((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t b = uint32_t(h) << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}
static uint16_t to_f16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  uint32_t sign = (b >> 16) & 0x8000;
  int exp = int((b >> 23) & 0xff) - 127 + 15;
  uint32_t man = b & 0x7fffff;
  if (exp <= 0) return uint16_t(sign);  // flush tiny values (not produced here)
  uint32_t h = (uint32_t(exp) << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return uint16_t(sign | h);
}
static float from_f16(uint16_t h) {
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v = exp == 0 ? std::ldexp(float(man), -24) : std::ldexp(float(man | 0x400), int(exp) - 25);
  return (h & 0x8000) ? -v : v;
}

static int check(int M, int N, int K, int bits, int gs, int sdtype) {
  const int G = K / gs;
  // qmm_kernel.h: 5-bit codes are read 4 per lane over at most 8 lanes.
  const int epu = bits == 5 ? 4 : 32 / bits;
  const int width = bits == 5 && WEFT_QMM_ISA::kernel.width > 8 ? 8 : WEFT_QMM_ISA::kernel.width;
  std::vector<float> x(size_t(M) * K), s(size_t(N) * G), b(size_t(N) * G);
  std::vector<uint8_t> q(size_t(N) * K);
  for (auto& v : x) v = uniform();
  for (auto& v : q) v = uint8_t(next_u32() & ((1u << bits) - 1));
  std::vector<uint16_t> s16(s.size()), b16(b.size());
  for (size_t i = 0; i < s.size(); i++) {
    s[i] = 0.01f + 0.05f * (uniform() + 1.0f);
    b[i] = 0.1f * uniform();
    if (sdtype == BF16) {
      s16[i] = to_bf16(s[i]), b16[i] = to_bf16(b[i]);
      s[i] = from_bf16(s16[i]), b[i] = from_bf16(b16[i]);
    } else if (sdtype == F16) {
      s16[i] = to_f16(s[i]), b16[i] = to_f16(b[i]);
      s[i] = from_f16(s16[i]), b[i] = from_f16(b16[i]);
    }
  }
  // MLX's packing: each row's codes as a little-endian stream of `bits`-bit fields.
  // (5-bit fields cross word boundaries: a field's bits past the word go to the next one).
  std::vector<uint32_t> w(size_t(N) * K * bits / 32, 0);
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) {
      const uint64_t bit = (uint64_t(n) * K + k) * bits;
      const uint64_t code = q[size_t(n) * K + k];
      w[bit / 32] |= uint32_t(code << (bit % 32));
      if (bit % 32 + bits > 32) w[bit / 32 + 1] |= uint32_t(code >> (32 - bit % 32));
    }
  // qmm_kernel.h's layout: within each block of L * epu elements (L = width, width / 2, ... 4),
  // element lane * epu + j goes to j * L + lane, times x_field_scale(bits, j); a remainder
  // keeps its order.
  std::vector<float> xp(x.size()), xsum(size_t(M) * G, 0.0f);
  for (int m = 0; m < M; m++) {
    const float* src = &x[size_t(m) * K];
    float* dst = &xp[size_t(m) * K];
    int k = 0;
    for (int L = width; L >= 4; L /= 2)
      for (; k + L * epu <= K; k += L * epu)
        for (int lane = 0; lane < L; lane++)
          for (int j = 0; j < epu; j++)
            dst[k + j * L + lane] = src[k + lane * epu + j] * x_field_scale(bits, j);
    for (; k < K; k++) dst[k] = src[k];
    for (int kk = 0; kk < K; kk++) xsum[size_t(m) * G + kk / gs] += src[kk];
  }
  std::vector<float> y(size_t(M) * N, NAN);
  Args a{xp.data(), xsum.data(), w.data(),
         sdtype == F32 ? static_cast<const void*>(s.data()) : s16.data(),
         sdtype == F32 ? static_cast<const void*>(b.data()) : b16.data(),
         sdtype, y.data(), M, N, K, bits, gs, x.data()};
  // Two calls over disjoint row ranges, as the thread pool splits the work.
  WEFT_QMM_ISA::kernel.rows(a, 0, N / 3);
  WEFT_QMM_ISA::kernel.rows(a, N / 3, N);
  int bad = 0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double ref = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        double wv = double(s[size_t(n) * G + k / gs]) * q[size_t(n) * K + k] + b[size_t(n) * G + k / gs];
        ref += x[size_t(m) * K + k] * wv;
        mag += std::fabs(x[size_t(m) * K + k] * wv);
      }
      double got = y[size_t(m) * N + n];
      // float32 sums in another order: K * eps32 * sum |x w| (the gamma_K bound), doubled.
      double tol = 2.0 * K * 1.2e-7 * mag + 1e-30;
      if (!(std::fabs(got - ref) <= tol)) {
        if (bad++ < 5)
          fprintf(stderr, "M=%d N=%d K=%d bits=%d gs=%d sdtype=%d: y[%d][%d] = %.9g, reference %.9g\n", M, N, K,
                  bits, gs, sdtype, m, n, got, ref);
      }
    }
  return bad;
}

int main() {
  int bad = 0, cases = 0;
  for (int bits : {4, 5, 8})
    for (int gs : {32, 64})
      for (int sdtype : {int(F32), int(F16), int(BF16)})
        // 1 to 9 rows: the per-row path (tiles of 8, 4, 2, 1 rows of x, each over passes of
        // 4, 2 or 1 weight rows; N = 37 and 38 end a 16-row block with 5 and 6 rows); 17 and
        // 40: the GEMM path with remainder tiles (N = 37: a partial slice; K = 576 and 1024:
        // several K chunks). K = 96 and 160 leave a part of K to the narrower blocks; K = 1536
        // (4-bit rows of 768 bytes) takes one weight row a pass.
        for (int M : {1, 2, 3, 4, 5, 8, 9, 17, 40})
          for (int K : {64, 96, 160, 576, 1024, 1536})
            for (int N : {37, 38}) {
              if (K % gs) continue;
              bad += check(M, N, K, bits, gs, sdtype);
              cases++;
            }
  printf("qmm kernel %s (width %d): %d cases, %d mismatching outputs\n", WEFT_QMM_ISA::kernel.name,
         WEFT_QMM_ISA::kernel.width, cases, bad);
  return bad == 0 ? 0 : 1;
}
