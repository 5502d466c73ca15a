// Standalone check of one instruction set's attention kernel (attention_kernel.cpp, built with
// WEFT_QMM_ISA / WEFT_QMM_WIDTH) against a double-precision softmax(q k^T * scale + mask) v,
// without MLX: scripts/test-kernel-aarch64 cross-compiles it for aarch64 (the NEON path) and
// runs it under qemu. Decode and prefill shapes, GQA ratios 1/3/4, head dims 64/80/128, causal
// with Lq < Lk, boolean and additive masks (one row fully masked), strided keys and values, B > 1.
// Exits non-zero on any mismatch.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../attention_kernel.h"

namespace weft_attn {
namespace WEFT_QMM_ISA {
extern const Kernel kernel;
}
}  // namespace weft_attn

using namespace weft_attn;

#include "test_random.h"

// [B, H, L, D] stored as [B, L, H, D] (a transposed view, as attention's q) when `transposed`,
// else inside a [B, H, cap, D] buffer (a cache's slice) of cap = L + 5 rows.
struct View {
  std::vector<float> data;
  int64_t s[4];
  const float* at(int b, int h, int l, int d) const { return data.data() + b * s[0] + h * s[1] + l * s[2] + d * s[3]; }
};

static View make(int B, int H, int L, int D, bool transposed, float amp) {
  View v;
  if (transposed) {
    v.data.resize(size_t(B) * L * H * D);
    v.s[0] = int64_t(L) * H * D, v.s[1] = D, v.s[2] = int64_t(H) * D, v.s[3] = 1;
  } else {
    const int cap = L + 5;
    v.data.resize(size_t(B) * H * cap * D);
    v.s[0] = int64_t(H) * cap * D, v.s[1] = int64_t(cap) * D, v.s[2] = D, v.s[3] = 1;
  }
  for (auto& x : v.data) x = amp * uniform();
  return v;
}

static int check(int B, int Hq, int Hkv, int Lq, int Lk, int D, int mask) {
  const View q = make(B, Hq, Lq, D, true, 2.0f), k = make(B, Hkv, Lk, D, false, 2.0f),
             v = make(B, Hkv, Lk, D, Lk % 2 == 1, 1.0f);
  const float scale = 1.0f / std::sqrt(float(D));
  // Masks [B, 1, Lq, Lk] broadcast over the heads (stride 0), as the batch caches build them.
  std::vector<uint8_t> bm(size_t(B) * Lq * Lk);
  std::vector<float> am(size_t(B) * Lq * Lk);
  for (int b = 0; b < B; b++)
    for (int i = 0; i < Lq; i++)
      for (int j = 0; j < Lk; j++) {
        const size_t e = (size_t(b) * Lq + i) * Lk + j;
        // Row (b = 1, i = 0) sees no key: MLX's finite minimum makes it the mean of the values.
        bm[e] = !(b == 1 && i == 0) && (next_u32() % 4 != 0 || j == 0);
        am[e] = next_u32() % 5 == 0 ? -INFINITY : 0.5f * uniform();
        if (j == Lk - 1) am[e] = 0.25f;
      }
  std::vector<float> out(size_t(B) * Hq * Lq * D, NAN);
  Args a;
  a.q = q.data.data(), a.k = k.data.data(), a.v = v.data.data();
  for (int d = 0; d < 4; d++) a.qs[d] = q.s[d], a.ks[d] = k.s[d], a.vs[d] = v.s[d];
  a.out = out.data();
  a.B = B, a.Hq = Hq, a.Hkv = Hkv, a.Lq = Lq, a.Lk = Lk, a.D = D, a.Dv = D;
  a.scale = scale;
  a.mask = mask;
  a.m = mask == BOOL ? static_cast<const void*>(bm.data()) : static_cast<const void*>(am.data());
  a.ms[0] = int64_t(Lq) * Lk, a.ms[1] = 0, a.ms[2] = Lk, a.ms[3] = 1;
  a.q_block = query_block(Hq / Hkv, Lq);
  for (int it = items(a) - 1; it >= 0; it--) WEFT_QMM_ISA::kernel.item(a, it);

  int bad = 0;
  const int rep = Hq / Hkv;
  std::vector<double> s(static_cast<size_t>(Lk));
  for (int b = 0; b < B; b++)
    for (int hq = 0; hq < Hq; hq++)
      for (int i = 0; i < Lq; i++) {
        const int h = hq / rep;
        double mxs = -INFINITY;
        for (int j = 0; j < Lk; j++) {
          double dot = 0;
          for (int d = 0; d < D; d++) dot += double(*q.at(b, hq, i, d) * scale) * *k.at(b, h, j, d);
          const size_t e = (size_t(b) * Lq + i) * Lk + j;
          if (mask == CAUSAL && j > i + Lk - Lq) dot = -INFINITY;
          if (mask == BOOL && !bm[e]) dot = -3.4028234663852886e38;
          if (mask == ADDITIVE) dot += am[e];
          s[size_t(j)] = dot;
          mxs = std::fmax(mxs, dot);
        }
        double l = 0;
        for (int j = 0; j < Lk; j++) l += s[size_t(j)] = std::exp(s[size_t(j)] - mxs);
        for (int d = 0; d < D; d++) {
          double ref = 0, mag = 0;
          for (int j = 0; j < Lk; j++) {
            ref += s[size_t(j)] / l * *v.at(b, h, j, d);
            mag += s[size_t(j)] / l * std::fabs(*v.at(b, h, j, d));
          }
          const double got = out[((size_t(b) * Hq + hq) * Lq + i) * D + d];
          // float32 scores (D-term sums, |q k| <= 4 D * scale) and exp (a few ulps) move the
          // weights by ~1e-6 relative; the output by that much of the magnitude sum.
          const double tol = 2e-5 * mag + 1e-6;
          if (!(std::fabs(got - ref) <= tol)) {
            if (bad++ < 5)
              fprintf(stderr, "B=%d Hq=%d Hkv=%d Lq=%d Lk=%d D=%d mask=%d: out[%d][%d][%d][%d] = %.9g, reference %.9g\n",
                      B, Hq, Hkv, Lq, Lk, D, mask, b, hq, i, d, got, ref);
          }
        }
      }
  return bad;
}

int main() {
  int bad = 0, cases = 0;
  struct Case {
    int B, Hq, Hkv, Lq, Lk, D, mask;
  };
  const Case all[] = {
      {1, 9, 3, 1, 1, 64, NONE},       {1, 9, 3, 1, 37, 64, NONE},     {1, 8, 2, 1, 200, 128, NONE},
      {2, 4, 4, 1, 70, 80, NONE},      {1, 9, 3, 100, 100, 64, CAUSAL}, {1, 8, 2, 23, 150, 128, CAUSAL},
      {2, 4, 4, 70, 70, 64, CAUSAL},   {1, 3, 1, 1, 65, 64, CAUSAL},   {2, 9, 3, 5, 40, 64, BOOL},
      {2, 8, 2, 1, 130, 64, BOOL},     {2, 4, 1, 7, 66, 80, ADDITIVE}, {2, 9, 3, 1, 64, 64, ADDITIVE},
  };
  for (const Case& c : all) {
    bad += check(c.B, c.Hq, c.Hkv, c.Lq, c.Lk, c.D, c.mask);
    cases++;
  }
  printf("attention kernel %s (width %d): %d cases, %d mismatching outputs\n", WEFT_QMM_ISA::kernel.name,
         WEFT_QMM_ISA::kernel.width, cases, bad);
  return bad == 0 ? 0 : 1;
}
