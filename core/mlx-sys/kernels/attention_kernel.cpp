// The attention inner loops, compiled once per instruction set as qmm_kernel.cpp is (build.rs
// defines WEFT_QMM_ISA / WEFT_QMM_WIDTH and the -m flags); GCC vector extensions, so one source
// serves AVX-512, AVX2 and NEON. Only <cstdint> and our own header are included, for the reason
// qmm_kernel.cpp gives.
//
// One work item is one key/value head of one batch row and a block of query positions: its
// rows are the rep = Hq / Hkv query heads of that kv head at each position, so every key and
// value read serves all of them (GQA). Keys go by blocks of BK; for each block
//   S^T[j][r] = k_j . (q_r * scale)        (keys as rows: the softmax statistics of the rows
//                                           are then column-wise vector maxima and sums)
//   masks, then the online softmax: m' = max(m, max_j S), P = exp(S - m'),
//   l = l * exp(m - m') + sum_j P,  O = O * exp(m - m') + P^T V
// and out = O / l at the end. Under a causal mask the blocks past the item's last position are
// never visited.
#include <cstddef>
#include <cstdint>

#include "attention_kernel.h"

#ifndef WEFT_QMM_ISA
#error "build.rs defines WEFT_QMM_ISA and WEFT_QMM_WIDTH"
#endif

namespace weft_attn {
namespace WEFT_QMM_ISA {
namespace {

constexpr int W = WEFT_QMM_WIDTH;
// Rows of a register tile: MR x 2 vectors of accumulators (AVX2 and NEON/SSE have 16 or 32
// vector registers, AVX-512 32).
constexpr int MR = W >= 16 ? 8 : 4;
// Keys per block: S^T is BK x Rp floats (16 KB for 64 rows), in L1 with the block's keys.
constexpr int BK = 64;

typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));

inline vf load(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
inline vf splat(float x) { return vf{} + x; }
// Lane-wise c ? a : b for a comparison result c (all ones or all zeros per lane).
inline vf select(vi c, vf a, vf b) { return (vf)(((vi)a & c) | ((vi)b & ~c)); }
inline vf vmax(vf a, vf b) { return select(a > b, a, b); }

// e^x, lane-wise: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2, e^r by its Taylor
// polynomial of degree 7 (the remainder r^8 / 8! is below 6e-9 relative), times 2^n built in
// the exponent bits. Inputs are clamped to [ln(2^-126), 88] (x <= 0 here: scores minus their
// maximum) and anything below that range, -inf included, gives 0; NaN stays NaN.
inline vf vexp(vf x) {
  const vf lo = splat(-87.33654f), hi = splat(88.0f);
  const vi under = x < lo;
  x = select(under, lo, x);
  x = select(x > hi, hi, x);
  // Adding 1.5 * 2^23 rounds to an integer, which then sits in the low mantissa bits.
  const vf magic = splat(12582912.0f);
  const vf t = x * splat(1.44269502f) + magic;
  const vf n = t - magic;
  // ln 2 in two parts (the first exact in 16 bits), so n * ln2 subtracts without rounding.
  const vf r = (x - n * splat(0.693145751953125f)) - n * splat(1.42860677e-6f);
  vf p = splat(1.0f / 5040.0f);
  p = p * r + splat(1.0f / 720.0f);
  p = p * r + splat(1.0f / 120.0f);
  p = p * r + splat(1.0f / 24.0f);
  p = p * r + splat(1.0f / 6.0f);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.0f);
  p = p * r + splat(1.0f);
  const vi e = ((vi)t - (vi)magic + 127) << 23;
  return (vf)((vi)(p * (vf)e) & ~under);
}

// C[m][0, NV * W) = (ACC ? C[m] * cs[m] : 0) + sum_k A[m * am + k * ak] * B[k * ldb + 0, NV * W)
// for M rows held in registers (A is read one broadcast element at a time, so its strides are
// free: keys in place from a cache slice, or S^T read transposed).
template <int M, int NV, bool ACC>
inline void tile(const float* A, int64_t am, int64_t ak, const float* B, int64_t ldb, int K,
                 float* C, int ldc, const float* cs) {
  vf c[M][NV];
  for (int m = 0; m < M; m++)
    for (int v = 0; v < NV; v++)
      c[m][v] = ACC ? load(C + size_t(m) * ldc + v * W) * cs[m] : vf{};
  for (int k = 0; k < K; k++) {
    vf b[NV];
    for (int v = 0; v < NV; v++) b[v] = load(B + k * ldb + v * W);
    for (int m = 0; m < M; m++) {
      const vf a = splat(A[m * am + k * ak]);
      for (int v = 0; v < NV; v++) c[m][v] += a * b[v];
    }
  }
  for (int m = 0; m < M; m++)
    for (int v = 0; v < NV; v++) store(C + size_t(m) * ldc + v * W, c[m][v]);
}

template <int NV, bool ACC>
inline void tiles(int M, const float* A, int64_t am, int64_t ak, const float* B, int64_t ldb,
                  int K, float* C, int ldc, const float* cs) {
  int m = 0;
  auto at = [&](int m) { return ACC ? cs + m : nullptr; };
  for (; m + MR <= M; m += MR) tile<MR, NV, ACC>(A + m * am, am, ak, B, ldb, K, C + size_t(m) * ldc, ldc, at(m));
  if constexpr (MR > 4)
    if (m + 4 <= M) {
      tile<4, NV, ACC>(A + m * am, am, ak, B, ldb, K, C + size_t(m) * ldc, ldc, at(m));
      m += 4;
    }
  if (m + 2 <= M) {
    tile<2, NV, ACC>(A + m * am, am, ak, B, ldb, K, C + size_t(m) * ldc, ldc, at(m));
    m += 2;
  }
  if (m < M) tile<1, NV, ACC>(A + m * am, am, ak, B, ldb, K, C + size_t(m) * ldc, ldc, at(m));
}

// C [M][N] (N a multiple of W) from A [M][K] (strides am, ak) and B [K][N] (row stride ldb).
template <bool ACC>
void gemm(int M, int N, int K, const float* A, int64_t am, int64_t ak, const float* B,
          int64_t ldb, float* C, int ldc, const float* cs) {
  int n = 0;
  for (; n + 2 * W <= N; n += 2 * W) tiles<2, ACC>(M, A, am, ak, B + n, ldb, K, C + n, ldc, cs);
  for (; n < N; n += W) tiles<1, ACC>(M, A, am, ak, B + n, ldb, K, C + n, ldc, cs);
}

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// The calling thread's scratch (grown as needed, never freed: pool threads live forever).
float* scratch(size_t n) {
  thread_local float* buf = nullptr;
  thread_local size_t len = 0;
  if (len < n) {
    delete[] buf;
    len = n;
    buf = new float[n];
  }
  return buf;
}

void item(const Args& a, int it) {
  const int rep = a.Hq / a.Hkv;
  const int nqb = (a.Lq + a.q_block - 1) / a.q_block;
  const int per = a.B * a.Hkv;
  const int qb = nqb - 1 - it / per;
  const int b = it % per / a.Hkv, h = it % a.Hkv;
  const int i0 = qb * a.q_block, i1 = i0 + a.q_block < a.Lq ? i0 + a.q_block : a.Lq;
  const int R = (i1 - i0) * rep, Rp = round_up(R, W);
  const int D = a.D, Dv = a.Dv, Dvp = round_up(Dv, W);
  const int off = a.Lk - a.Lq;  // causal: query i sees keys j <= i + off
  // Values are read in place when their rows are contiguous vectors; else copied per block.
  const bool v_in_place = a.vs[3] == 1 && Dv % W == 0;

  float* qt = scratch(size_t(D) * Rp + size_t(BK) * Rp + size_t(R) * Dvp + 3 * size_t(Rp) +
                      (v_in_place ? 0 : size_t(BK) * Dvp));
  float* st = qt + size_t(D) * Rp;     // S^T [BK][Rp]
  float* o = st + size_t(BK) * Rp;     // O [R][Dvp]
  float* mx = o + size_t(R) * Dvp;     // running maximum per row
  float* l = mx + Rp;                  // running sum per row
  float* corr = l + Rp;                // exp(m - m') of the current block
  float* vb = corr + Rp;               // a block of values, when copied

  // Scaled queries, transposed: qt[d][r], row r = (i - i0) * rep + g for query head h * rep + g
  // (q * scale rounded first, as MLX's sdpa does); padding rows are zero.
  for (int r = 0; r < Rp; r++) {
    if (r >= R) {
      for (int d = 0; d < D; d++) qt[size_t(d) * Rp + r] = 0.0f;
      continue;
    }
    const int i = i0 + r / rep, hq = h * rep + r % rep;
    const float* qr = a.q + b * a.qs[0] + hq * a.qs[1] + i * a.qs[2];
    for (int d = 0; d < D; d++) qt[size_t(d) * Rp + r] = qr[d * a.qs[3]] * a.scale;
  }
  for (int r = 0; r < Rp; r++) mx[r] = -__builtin_inff(), l[r] = 0.0f;
  for (size_t e = 0; e < size_t(R) * Dvp; e++) o[e] = 0.0f;

  const float* kh = a.k + b * a.ks[0] + h * a.ks[1];
  const float* vh = a.v + b * a.vs[0] + h * a.vs[1];
  const int kend = a.mask == CAUSAL ? i1 + off : a.Lk;
  for (int kb = 0; kb < kend; kb += BK) {
    const int nk = kend - kb < BK ? kend - kb : BK;
    gemm<false>(nk, Rp, D, kh + kb * a.ks[2], a.ks[2], a.ks[3], qt, Rp, st, Rp, nullptr);

    if (a.mask == CAUSAL && kb + nk - 1 > i0 + off) {
      // Key kb + j is seen from position kb + j - off on: rows before that row get -inf.
      for (int j = 0; j < nk; j++) {
        int hide = (kb + j - off - i0) * rep;
        hide = hide < 0 ? 0 : hide > R ? R : hide;
        for (int r = 0; r < hide; r++) st[size_t(j) * Rp + r] = -__builtin_inff();
      }
    } else if (a.mask == BOOL || a.mask == ADDITIVE) {
      for (int r = 0; r < R; r++) {
        const int i = i0 + r / rep, hq = h * rep + r % rep;
        const int64_t at = b * a.ms[0] + hq * a.ms[1] + i * a.ms[2] + kb * a.ms[3];
        if (a.mask == BOOL) {
          // MLX: where(mask, scores, finfo(float32).min), a finite minimum (a row with no key
          // left then averages all values, as MLX's softmax does).
          const uint8_t* mr = static_cast<const uint8_t*>(a.m) + at;
          for (int j = 0; j < nk; j++)
            if (!mr[j * a.ms[3]]) st[size_t(j) * Rp + r] = -__FLT_MAX__;
        } else {
          const float* mr = static_cast<const float*>(a.m) + at;
          for (int j = 0; j < nk; j++) st[size_t(j) * Rp + r] += mr[j * a.ms[3]];
        }
      }
    }

    // Online softmax, W rows at a time (columns of S^T).
    for (int c = 0; c < Rp; c += W) {
      vf bm = splat(-__builtin_inff());
      for (int j = 0; j < nk; j++) bm = vmax(bm, load(st + size_t(j) * Rp + c));
      const vf m0 = load(mx + c), m1 = vmax(m0, bm);
      // A row with every score so far -inf keeps P = 0 (not exp(-inf - -inf)).
      const vf shift = select(m1 == splat(-__builtin_inff()), vf{}, m1);
      const vf cr = vexp(m0 - shift);
      vf sum = {};
      for (int j = 0; j < nk; j++) {
        const vf p = vexp(load(st + size_t(j) * Rp + c) - shift);
        store(st + size_t(j) * Rp + c, p);
        sum += p;
      }
      store(l + c, load(l + c) * cr + sum);
      store(mx + c, m1);
      store(corr + c, cr);
    }

    const float* vp = vh + kb * a.vs[2];
    int64_t ldv = a.vs[2];
    if (!v_in_place) {
      for (int j = 0; j < nk; j++)
        for (int d = 0; d < Dvp; d++) vb[size_t(j) * Dvp + d] = d < Dv ? vp[j * a.vs[2] + d * a.vs[3]] : 0.0f;
      vp = vb;
      ldv = Dvp;
    }
    gemm<true>(R, Dvp, nk, st, 1, Rp, vp, ldv, o, Dvp, corr);
  }

  for (int r = 0; r < R; r++) {
    const int i = i0 + r / rep, hq = h * rep + r % rep;
    float* dst = a.out + ((size_t(b) * a.Hq + hq) * a.Lq + i) * Dv;
    const float inv = 1.0f / l[r];
    for (int d = 0; d < Dv; d++) dst[d] = o[size_t(r) * Dvp + d] * inv;
  }
}

}  // namespace

#define WEFT_STR2(x) #x
#define WEFT_STR(x) WEFT_STR2(x)
const Kernel kernel = {item, W, WEFT_STR(WEFT_QMM_ISA)};

}  // namespace WEFT_QMM_ISA
}  // namespace weft_attn
