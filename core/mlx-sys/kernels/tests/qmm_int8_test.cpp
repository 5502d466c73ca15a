// Standalone check of one instruction set's int8-activation kernel (qmm_int8.cpp, built with
// WEFT_QMM_ISA and that ISA's -m flags), without MLX. The activation layout is built here from
// its description in qmm_kernel.h (quantize_x_int8), so the test also pins that contract.
// 1. Integer inputs (codes over their full ranges, d and scales 1 or 2, small integer biases,
//    K small enough that every partial sum is an integer below 2^24): y must equal the int64
//    reference exactly, so any wrong code, lane, block, group or saturated pair shows.
// 2. Float inputs quantized as described: y within the float32 reordering bound of the double
//    reference of the same quantized math, and within the activation-quantization bound
//    (half a step of each block, sum_k d_b / 2 * |w_k|) of the float reference x . w.
// Run by tests/cpu_kernels.rs (every x86 ISA this CPU has) and scripts/test-kernel-aarch64
// (NEON, the generic build). Exits non-zero on any mismatch.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../qmm_kernel.h"

namespace weft_qmm {
namespace WEFT_QMM_ISA {
extern const Kernel int8_kernel;
}
}  // namespace weft_qmm

using namespace weft_qmm;

#include "test_random.h"

static uint16_t to_half_exact(float f, int sdtype) {
  // Only for the values this test uses (small integers, powers of two, or bf16/f16 rounded
  // below): exact in both formats.
  uint32_t b;
  memcpy(&b, &f, 4);
  if (sdtype == BF16) return uint16_t(b >> 16);
  if (f == 0.0f) return uint16_t((b >> 16) & 0x8000);
  const uint32_t sign = (b >> 16) & 0x8000;
  const int exp = int((b >> 23) & 0xff) - 127 + 15;
  return uint16_t(sign | (uint32_t(exp) << 10) | ((b & 0x7fffff) >> 13));
}

// Rounds f to a value both float16 and bfloat16 hold (8 significant bits, a normal exponent).
static float round8(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  b &= 0xffff0000u;
  memcpy(&f, &b, 4);
  return f;
}

struct Case {
  int M, N, K, bits, gs, sdtype;
  std::vector<uint8_t> q;    // [N][K] weight codes
  std::vector<float> s, b;   // [N][G]
  std::vector<int8_t> qx;    // [M][K] activation codes, x's order
  std::vector<float> d;      // [M][K / 32]
  std::vector<float> xsum;   // [M][G]
};

// Packs, lays out and runs the kernel over two disjoint row ranges; returns y.
static std::vector<float> run(const Case& c) {
  const int M = c.M, N = c.N, K = c.K, bits = c.bits, G = K / c.gs;
  std::vector<uint32_t> w(size_t(N) * K * bits / 32, 0);
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) {
      const uint64_t bit = (uint64_t(n) * K + k) * bits;
      w[bit / 32] |= uint32_t(c.q[size_t(n) * K + k]) << (bit % 32);
    }
  // quantize_x_int8's order and side arrays.
  std::vector<int8_t> xq(size_t(M) * K);
  std::vector<float> xd(size_t(M) * K / 8), xc(size_t(M) * G, 0.0f);
  for (int m = 0; m < M; m++) {
    const int8_t* src = &c.qx[size_t(m) * K];
    int8_t* dst = &xq[size_t(m) * K];
    if (bits == 4) {
      for (int k = 0; k < K; k += 64) {
        const int C = K - k < 64 ? K - k : 64;
        for (int e = 0; e < C; e++) dst[k + (e % 2) * (C / 2) + e / 2] = src[k + e];
      }
    } else {
      memcpy(dst, src, size_t(K));
    }
    for (int blk = 0; blk < K / 32; blk++) {
      int qs = 0;
      for (int e = 0; e < 32; e++) qs += src[blk * 32 + e];
      for (int i = 0; i < 4; i++) xd[size_t(m) * K / 8 + blk * 4 + i] = c.d[size_t(m) * (K / 32) + blk];
      xc[size_t(m) * G + blk * 32 / c.gs] += 128.0f * c.d[size_t(m) * (K / 32) + blk] * float(qs);
    }
  }
  std::vector<uint16_t> s16(c.s.size()), b16(c.b.size());
  for (size_t i = 0; i < c.s.size(); i++) s16[i] = to_half_exact(c.s[i], c.sdtype), b16[i] = to_half_exact(c.b[i], c.sdtype);
  std::vector<float> y(size_t(M) * N, NAN);
  Args a{nullptr, c.xsum.data(), w.data(),
         c.sdtype == F32 ? static_cast<const void*>(c.s.data()) : s16.data(),
         c.sdtype == F32 ? static_cast<const void*>(c.b.data()) : b16.data(),
         c.sdtype, y.data(), M, N, K, bits, c.gs, nullptr};
  a.xq = xq.data();
  a.xd = xd.data();
  a.xc = xc.data();
  WEFT_QMM_ISA::int8_kernel.rows(a, 0, N / 3);
  WEFT_QMM_ISA::int8_kernel.rows(a, N / 3, N);
  return y;
}

static Case make(int M, int N, int K, int bits, int gs, int sdtype) {
  Case c{M, N, K, bits, gs, sdtype, {}, {}, {}, {}, {}, {}};
  const int G = K / gs;
  c.q.resize(size_t(N) * K);
  c.s.resize(size_t(N) * G);
  c.b.resize(size_t(N) * G);
  c.qx.resize(size_t(M) * K);
  c.d.resize(size_t(M) * K / 32);
  c.xsum.resize(size_t(M) * G);
  return c;
}

// 1: integer inputs, exact.
static int check_exact(int M, int N, int K, int bits, int gs, int sdtype, bool extreme) {
  Case c = make(M, N, K, bits, gs, sdtype);
  const int G = K / gs, qmax = (1 << bits) - 1;
  for (size_t i = 0; i < c.q.size(); i++) c.q[i] = extreme ? uint8_t(qmax) : uint8_t(next_u32() & qmax);
  for (size_t i = 0; i < c.qx.size(); i++) {
    // Extreme: whole blocks of +127 or -127 (the pairs vpmaddubsw must not saturate).
    c.qx[i] = extreme ? int8_t((i / 32) % 3 == 1 ? -127 : 127) : int8_t(int(next_u32() % 255) - 127);
  }
  for (auto& v : c.s) v = float(1 + next_u32() % 2);
  for (auto& v : c.b) v = float(int(next_u32() % 5) - 2);
  for (auto& v : c.d) v = float(1 + next_u32() % 2);
  for (auto& v : c.xsum) v = float(int(next_u32() % 201) - 100);
  const std::vector<float> y = run(c);
  int bad = 0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      int64_t ref = 0;
      for (int k = 0; k < K; k++)
        ref += int64_t(c.q[size_t(n) * K + k]) * c.qx[size_t(m) * K + k] * int64_t(c.s[size_t(n) * G + k / gs]) *
               int64_t(c.d[size_t(m) * (K / 32) + k / 32]);
      for (int g = 0; g < G; g++) ref += int64_t(c.b[size_t(n) * G + g]) * int64_t(c.xsum[size_t(m) * G + g]);
      const float got = y[size_t(m) * N + n];
      if (!(double(got) == double(ref)) && bad++ < 5)
        fprintf(stderr, "exact M=%d N=%d K=%d bits=%d gs=%d sdtype=%d%s: y[%d][%d] = %.9g, reference %lld\n", M, N,
                K, bits, gs, sdtype, extreme ? " extreme" : "", m, n, got, (long long)ref);
    }
  return bad;
}

// 2: float inputs quantized as quantize_x_int8 describes.
static int check_float(int M, int N, int K, int bits, int gs, int sdtype) {
  Case c = make(M, N, K, bits, gs, sdtype);
  const int G = K / gs;
  std::vector<float> x(size_t(M) * K);
  for (auto& v : x) v = uniform() * (1.0f + 3.0f * float(next_u32() % 4 == 0));
  for (auto& v : c.q) v = uint8_t(next_u32() & ((1u << bits) - 1));
  for (size_t i = 0; i < c.s.size(); i++) {
    c.s[i] = round8(0.01f + 0.05f * (uniform() + 1.0f));
    c.b[i] = round8(0.1f * uniform());
    if (std::fabs(c.b[i]) < 1e-3f) c.b[i] = 0.0f;  // float16 subnormals are not built here
  }
  for (int m = 0; m < M; m++) {
    for (int blk = 0; blk < K / 32; blk++) {
      const float* xb = &x[size_t(m) * K + blk * 32];
      float amax = 0.0f;
      for (int e = 0; e < 32; e++) amax = std::fmax(amax, std::fabs(xb[e]));
      const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
      c.d[size_t(m) * (K / 32) + blk] = d;
      for (int e = 0; e < 32; e++) c.qx[size_t(m) * K + blk * 32 + e] = int8_t(std::lrint(xb[e] * id));
    }
    for (int k = 0; k < K; k++) c.xsum[size_t(m) * G + k / gs] += x[size_t(m) * K + k];
  }
  const std::vector<float> y = run(c);
  int bad = 0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double ref_q = 0, ref_f = 0, mag = 0, qbound = 0;
      for (int k = 0; k < K; k++) {
        const double sw = c.s[size_t(n) * G + k / gs], bw = c.b[size_t(n) * G + k / gs];
        const double q = c.q[size_t(n) * K + k], dx = c.d[size_t(m) * (K / 32) + k / 32];
        const double xk = x[size_t(m) * K + k], xhat = dx * c.qx[size_t(m) * K + k];
        ref_q += sw * q * xhat + bw * xk;
        ref_f += (sw * q + bw) * xk;
        mag += std::fabs(sw * q * xhat) + std::fabs(bw * xk);
        qbound += std::fabs(sw * q) * dx / 2;
      }
      const double got = y[size_t(m) * N + n];
      const double tol = 2.0 * K * 1.2e-7 * mag + 1e-30;
      if (!(std::fabs(got - ref_q) <= tol) || !(std::fabs(got - ref_f) <= qbound + tol)) {
        if (bad++ < 5)
          fprintf(stderr, "float M=%d N=%d K=%d bits=%d gs=%d sdtype=%d: y[%d][%d] = %.9g, quantized-x reference %.9g, float reference %.9g\n",
                  M, N, K, bits, gs, sdtype, m, n, got, ref_q, ref_f);
      }
    }
  return bad;
}

int main() {
  int bad = 0, cases = 0;
  for (int bits : {4, 8})
    for (int gs : {32, 64})
      for (int sdtype : {int(F32), int(F16), int(BF16)})
        // 1 to 15 rows: tiles of 8, 4, 2 and 1 rows of x (N = 37, 38: passes of two weight rows
        // and a remainder, a 16-row block ending short). K = 32, 96, 160 (4-bit: a last block of
        // 32 after the 64-element chunks), 576, 1536: the default model's shapes.
        for (int M : {1, 2, 3, 5, 8, 9, 15})
          for (int K : {32, 64, 96, 128, 160, 576, 1536})
            for (int N : {37, 38}) {
              if (K % gs) continue;
              // Exact integer sums need every partial sum below 2^24.
              const double worst = double(K) * ((1 << bits) - 1) * 127 * 4 + 100.0 * 2 * K / gs;
              if (worst < 16777216.0) {
                bad += check_exact(M, N, K, bits, gs, sdtype, false);
                bad += check_exact(M, N, K, bits, gs, sdtype, true);
                cases += 2;
              }
              bad += check_float(M, N, K, bits, gs, sdtype);
              cases++;
            }
  printf("qmm int8 kernel %s: %d cases, %d mismatching outputs\n", WEFT_QMM_ISA::int8_kernel.name, cases, bad);
  return bad == 0 ? 0 : 1;
}
