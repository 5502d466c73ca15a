// The quantized-matmul inner loops, compiled once per instruction set: build.rs defines
// WEFT_QMM_ISA (the namespace) and WEFT_QMM_WIDTH (floats per vector) and passes the -m flags.
// Written with GCC/Clang vector extensions so one source serves AVX-512, AVX2 and NEON.
//
// Only <cstdint> is included and everything but the Kernel table is internal: an inline
// function from a shared header compiled here with -mavx2 could otherwise be picked by the
// linker for callers on machines without AVX2.
#include <cstddef>
#include <cstdint>

#include "qmm_kernel.h"

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#ifndef WEFT_QMM_ISA
#error "build.rs defines WEFT_QMM_ISA and WEFT_QMM_WIDTH"
#endif

namespace weft_qmm {
namespace WEFT_QMM_ISA {
namespace {

constexpr int W = WEFT_QMM_WIDTH;
// Rows of x that share one dequantized weight vector (batched decode; from GEMM_MIN_ROWS rows
// the GEMM path below): the accumulators of all rows stay in registers (AVX2 has 16 vector
// registers, AVX-512 32). AVX2 takes 8 rows only in the prescaled form (see `prescaled`).
#if defined(__AVX2__)
constexpr int MAX_MT = 8;
#else
constexpr int MAX_MT = W >= 16 ? 8 : 4;
#endif
// From this many rows of x a block of N_BLOCK_PREFILL weight rows shares one scale conversion.
constexpr int BLOCK_ROWS_MIN = W >= 16 ? 8 : 4;

// Whether a tile multiplies each code vector by its scale before the FMAs (one multiply per
// code vector, one accumulator per row of x) instead of scaling a block's partial sums into a
// total (two accumulators per row): 8 rows of x fit AVX2's 16 registers only this way, and one
// 8-row tile converts each weight once where two 4-row tiles convert it twice.
template <int NR, int MT>
constexpr bool prescaled() {
  return W < 16 && MT > 4;
}
// Output rows whose scales are converted together and whose weights stay in cache while every
// tile of x passes over them.
constexpr int N_BLOCK = 16;
constexpr int N_BLOCK_PREFILL = 64;

template <int N>
struct Int {
  static constexpr int value = N;
};

template <int L>
struct V {
  typedef float f __attribute__((vector_size(L * 4)));
  typedef int32_t i __attribute__((vector_size(L * 4)));
  typedef uint32_t u __attribute__((vector_size(L * 4)));
};

template <int L>
inline typename V<L>::f load_f(const float* p) {
  typename V<L>::f v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

template <int L>
inline typename V<L>::u load_u(const uint32_t* p) {
  typename V<L>::u v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

template <int L>
inline float hsum(typename V<L>::f v) {
  if constexpr (L == 1) {
    return v[0];
  } else {
    // Pairwise halves: the shuffles a compiler emits for a horizontal add.
    typedef typename V<L / 2>::f half;
    half lo, hi;
    __builtin_memcpy(&lo, &v, sizeof lo);
    __builtin_memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
    return hsum<L / 2>(lo + hi);
  }
}

#include "qmm_convert.h"

// Accumulates, for MT rows of x and NR weight rows, the dot products over the blocks of L
// packed words in [k0, k1) (elements). `sc[r]` holds weight row r's scales as float32. Each
// load of x serves the NR weight rows, and the NR * MT accumulators are independent chains of
// FMAs (one row alone is one chain, bound by the FMA latency rather than by memory).
// Full-width vector accumulators of a prescaled tile (see `tile`): where given, the W-lane
// segment leaves its sums here unreduced.
template <int MT>
using VSink = typename V<W>::f (*)[MT];

// A prescaled pass's accumulators: left unreduced in `sink` (full-width segments only), else
// reduced into `res`.
template <int L, int NR, int MT>
inline void finish_prescaled(typename V<L>::f (&acc)[NR][MT], float (*res)[MT], VSink<MT> sink) {
  if constexpr (L == W) {
    if (sink) {
      for (int r = 0; r < NR; r++)
        for (int m = 0; m < MT; m++) sink[r][m] += acc[r][m];
      return;
    }
  }
  for (int r = 0; r < NR; r++)
    for (int m = 0; m < MT; m++) res[r][m] += hsum<L>(acc[r][m]);
}

template <int L, int NR, int MT, int BITS, int GS>
inline void segment(const uint32_t* const* wrows, const float* const* xrows,
                    const float* const* sc, int k0, int k1, float (*res)[MT],
                    VSink<MT> sink = nullptr) {
  constexpr int EPU = 32 / BITS;
  constexpr int BLOCK = L * EPU;
  constexpr uint32_t MASK = (1u << BITS) - 1;
  typedef typename V<L>::f vf;
  typedef typename V<L>::i vi;
  typedef typename V<L>::u vu;
  auto block_scale = [&](int r, int k) {
    vf s;
    if constexpr (BLOCK <= GS) {
      s = vf{} + sc[r][k / GS];  // a broadcast (a lane-by-lane fill compiles to inserts)
    } else {
      // A block spans several groups: GS / EPU lanes each.
      constexpr int LPG = GS / EPU;
#if defined(__AVX2__)
      if constexpr (L == 8 && LPG == 4) {
        // Two groups: one 8-byte load and a lane permute (a lane-by-lane fill is 8 inserts).
        const __m128 two = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(sc[r] + k / GS)));
        const __m256 v = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two),
                                                  _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
        __builtin_memcpy(&s, &v, sizeof s);
        return s;
      }
#endif
      for (int i = 0; i < L; i++) s[i] = sc[r][k / GS + i / LPG];
    }
    return s;
  };
  if constexpr (prescaled<NR, MT>()) {
    vf acc[NR][MT];
    for (int r = 0; r < NR; r++)
      for (int m = 0; m < MT; m++) acc[r][m] = vf{};
    for (int k = k0; k < k1; k += BLOCK) {
      vu v[NR];
      vf s[NR];
      for (int r = 0; r < NR; r++) {
        v[r] = load_u<L>(wrows[r] + k / EPU);
        s[r] = block_scale(r, k);
      }
#pragma GCC unroll 8
      for (int j = 0; j < EPU; j++) {
        for (int r = 0; r < NR; r++) {
          const vu c = j == EPU - 1 ? v[r] >> (BITS * j) : v[r] & (MASK << (BITS * j));
          const vf q = __builtin_convertvector((vi)c, vf) * s[r];
          for (int m = 0; m < MT; m++) acc[r][m] += q * load_f<L>(xrows[m] + k + j * L);
        }
      }
    }
    finish_prescaled<L, NR, MT>(acc, res, sink);
    return;
  }
  vf tot[NR][MT];
  for (int r = 0; r < NR; r++)
    for (int m = 0; m < MT; m++) tot[r][m] = vf{};
  for (int k = k0; k < k1; k += BLOCK) {
    vu v[NR];
    for (int r = 0; r < NR; r++) v[r] = load_u<L>(wrows[r] + k / EPU);
    vf acc[NR][MT];
    for (int r = 0; r < NR; r++)
      for (int m = 0; m < MT; m++) acc[r][m] = vf{};
#pragma GCC unroll 8
    for (int j = 0; j < EPU; j++) {
      vf xv[MT];
      for (int m = 0; m < MT; m++) xv[m] = load_f<L>(xrows[m] + k + j * L);
      for (int r = 0; r < NR; r++) {
        // In place (x carries 2^-(BITS * j): x_field_scale), the top field by a shift.
        const vu c = j == EPU - 1 ? v[r] >> (BITS * j) : v[r] & (MASK << (BITS * j));
        vf q = __builtin_convertvector((vi)c, vf);
        for (int m = 0; m < MT; m++) acc[r][m] += q * xv[m];
      }
    }
    for (int r = 0; r < NR; r++) {
      const vf s = block_scale(r, k);
      for (int m = 0; m < MT; m++) tot[r][m] += acc[r][m] * s;
    }
  }
  for (int r = 0; r < NR; r++)
    for (int m = 0; m < MT; m++) res[r][m] += hsum<L>(tot[r][m]);
}

// The layout permute_x builds: blocks of W lanes, then of W/2, ..., down to 4 lanes (K is a
// multiple of 32, so 4-lane blocks, 16 or 32 elements, always finish it).
template <int L, int NR, int MT, int BITS, int GS>
inline void segments(const uint32_t* const* wrows, const float* const* xrows,
                     const float* const* sc, int k, int K, float (*res)[MT],
                     VSink<MT> sink = nullptr) {
  constexpr int BLOCK = L * (32 / BITS);
  int k1 = k + (K - k) / BLOCK * BLOCK;
  if (k1 > k) segment<L, NR, MT, BITS, GS>(wrows, xrows, sc, k, k1, res, sink);
  if constexpr (L > 4) segments<L / 2, NR, MT, BITS, GS>(wrows, xrows, sc, k1, K, res);
}

// 5-bit codes: MLX's bit stream puts a 32-element group in 20 bytes (five words), so codes
// cross word boundaries and no shift of a whole word lines up across lanes. Instead lane l of
// an 8-lane view takes elements 4l..4l+3 (bits 20l..20l+19): the 32-bit window at byte
// 20l / 8, shifted right by 4 when l is odd, holds them at bits 0, 5, 10, 15. A byte shuffle
// (pshufb / tbl) builds the windows from two 16-byte loads inside the group (bytes 0..15 and
// 4..19: nothing past the group is read); with 4 lanes the group takes two vectors.
constexpr int L5 = W >= 8 ? 8 : 4;

inline void windows5(const uint8_t* g, typename V<L5>::u* out) {
#if defined(__AVX2__)
  static_assert(L5 == 8, "the AVX2 windows are one 8-lane vector");
  __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g));
  __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 4));
  __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  // Lanes 0..3 at bytes 0, 2, 5, 7 of the low load; lanes 4..7 at bytes 10, 12, 15, 17 of the
  // group, i.e. 6, 8, 11, 13 of the high one (the fourth byte of odd lanes is never read).
  const __m256i idx = _mm256_setr_epi8(0, 1, 2, 3, 2, 3, 4, 5, 5, 6, 7, 8, 7, 8, 9, -128,  //
                                       6, 7, 8, 9, 8, 9, 10, 11, 11, 12, 13, 14, 13, 14, 15, -128);
  v = _mm256_srlv_epi32(_mm256_shuffle_epi8(v, idx), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
  __builtin_memcpy(out, &v, sizeof v);
#else
  static_assert(L5 == 4, "without AVX2 the windows are two 4-lane vectors");
  typedef uint8_t u8x16 __attribute__((vector_size(16)));
  u8x16 lo, hi;
  __builtin_memcpy(&lo, g, 16);
  __builtin_memcpy(&hi, g + 4, 16);
  const u8x16 ilo = {0, 1, 2, 3, 2, 3, 4, 5, 5, 6, 7, 8, 7, 8, 9, 9};
  const u8x16 ihi = {6, 7, 8, 9, 8, 9, 10, 11, 11, 12, 13, 14, 13, 14, 15, 15};
  u8x16 a = __builtin_shuffle(lo, ilo), b = __builtin_shuffle(hi, ihi);
  __builtin_memcpy(&out[0], &a, 16);
  __builtin_memcpy(&out[1], &b, 16);
  const typename V<4>::u shift = {0, 4, 0, 4};
  out[0] >>= shift;
  out[1] >>= shift;
#endif
}

// The 5-bit form of `segments` over the whole row (K is a multiple of 32, one group a block;
// permute_x lays x out for L5 lanes with 4 elements each), NR weight rows a pass.
template <int NR, int MT, int GS>
inline void segments5(const uint32_t* const* wrows, const float* const* xrows,
                      const float* const* sc, int K, float (*res)[MT], VSink<MT> sink = nullptr) {
  constexpr int L = L5;
  constexpr int NV = 8 / L;  // vectors per 32-element group
  typedef typename V<L>::f vf;
  typedef typename V<L>::i vi;
  typedef typename V<L>::u vu;
  if constexpr (prescaled<NR, MT>()) {
    vf acc[NR][MT];
    for (int r = 0; r < NR; r++)
      for (int m = 0; m < MT; m++) acc[r][m] = vf{};
    for (int k = 0; k < K; k += 32) {
      vu win[NR][NV];
      vf s[NR];
      for (int r = 0; r < NR; r++) {
        windows5(reinterpret_cast<const uint8_t*>(wrows[r]) + k / 32 * 20, win[r]);
        s[r] = vf{} + sc[r][k / GS];
      }
      for (int h = 0; h < NV; h++) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
          for (int r = 0; r < NR; r++) {
            const vf q = __builtin_convertvector((vi)(win[r][h] & (31u << (5 * j))), vf) * s[r];
            for (int m = 0; m < MT; m++) acc[r][m] += q * load_f<L>(xrows[m] + k + h * 4 * L + j * L);
          }
        }
      }
    }
    finish_prescaled<L, NR, MT>(acc, res, sink);
    return;
  }
  vf tot[NR][MT];
  for (int r = 0; r < NR; r++)
    for (int m = 0; m < MT; m++) tot[r][m] = vf{};
  for (int k = 0; k < K; k += 32) {
    vu win[NR][NV];
    for (int r = 0; r < NR; r++)
      windows5(reinterpret_cast<const uint8_t*>(wrows[r]) + k / 32 * 20, win[r]);
    vf acc[NR][MT];
    for (int r = 0; r < NR; r++)
      for (int m = 0; m < MT; m++) acc[r][m] = vf{};
    for (int h = 0; h < NV; h++) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; j++) {
        vf xv[MT];
        for (int m = 0; m < MT; m++) xv[m] = load_f<L>(xrows[m] + k + h * 4 * L + j * L);
        for (int r = 0; r < NR; r++) {
          vf q = __builtin_convertvector((vi)(win[r][h] & (31u << (5 * j))), vf);
          for (int m = 0; m < MT; m++) acc[r][m] += q * xv[m];
        }
      }
    }
    for (int r = 0; r < NR; r++) {
      const vf s = vf{} + sc[r][k / GS];
      for (int m = 0; m < MT; m++) tot[r][m] += acc[r][m] * s;
    }
  }
  for (int r = 0; r < NR; r++)
    for (int m = 0; m < MT; m++) res[r][m] += hsum<L>(tot[r][m]);
}

template <int L>
inline float dot(const float* a, const float* b, int n) {
  typedef typename V<L>::f vf;
  vf acc = {};
  int i = 0;
  for (; i + L <= n; i += L) acc += load_f<L>(a + i) * load_f<L>(b + i);
  float s = hsum<L>(acc);
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

// y[m0 .. m0 + MT)[n .. n + NR): weight rows n.. at wrow, wrow + words, ...; their float32
// scales and biases G apart from sc and bs.
// `xst`: the prescaled 8-row tile's group sums of x transposed, [G][8] (see rows_impl).
template <int NR, int MT, int BITS, int GS>
void tile(const Args& a, const uint32_t* wrow, size_t words, const float* sc, const float* bs,
          int m0, int n, const float* xst = nullptr) {
  const int K = a.K;
  const int G = K / GS;
  const float* xrows[MT];
  const uint32_t* wrows[NR];
  const float* scs[NR];
  float res[NR][MT];
  for (int m = 0; m < MT; m++) xrows[m] = a.xp + size_t(m0 + m) * K;
  for (int r = 0; r < NR; r++) {
    wrows[r] = wrow + r * words;
    scs[r] = sc + r * G;
    for (int m = 0; m < MT; m++) res[r][m] = 0.0f;
  }
#if defined(__AVX2__)
  if constexpr (prescaled<NR, MT>() && W == 8 && MT == 8) {
    // The 8 rows' sums reduced together (a horizontal-add tree, one vector of 8 results) and
    // their bias terms as one vector FMA per group: per weight row, ~40 ops where 8 separate
    // horizontal sums and group dots took ~200 (a fifth of the row's work at K = 576).
    typename V<W>::f sink[NR][MT];
    for (int r = 0; r < NR; r++)
      for (int m = 0; m < MT; m++) sink[r][m] = typename V<W>::f{};
    if constexpr (BITS == 5) segments5<NR, MT, GS>(wrows, xrows, scs, K, res, sink);
    else segments<W, NR, MT, BITS, GS>(wrows, xrows, scs, 0, K, res, sink);
    for (int r = 0; r < NR; r++) {
      __m256 v[8];
      __builtin_memcpy(v, sink[r], sizeof v);
      const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
      const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
      const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
      __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
      const float* b = bs + r * G;
      __m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps();
      int g = 0;
      for (; g + 2 <= G; g += 2) {
        bias0 = _mm256_fmadd_ps(_mm256_set1_ps(b[g]), _mm256_loadu_ps(xst + g * 8), bias0);
        bias1 = _mm256_fmadd_ps(_mm256_set1_ps(b[g + 1]), _mm256_loadu_ps(xst + (g + 1) * 8), bias1);
      }
      if (g < G) bias0 = _mm256_fmadd_ps(_mm256_set1_ps(b[g]), _mm256_loadu_ps(xst + g * 8), bias0);
      sum = _mm256_add_ps(_mm256_add_ps(sum, _mm256_loadu_ps(res[r])), _mm256_add_ps(bias0, bias1));
      float out[8];
      _mm256_storeu_ps(out, sum);
      for (int m = 0; m < 8; m++) a.y[size_t(m0 + m) * a.N + n + r] = out[m];
    }
    return;
  }
#endif
  if constexpr (BITS == 5) segments5<NR, MT, GS>(wrows, xrows, scs, K, res);
  else segments<W, NR, MT, BITS, GS>(wrows, xrows, scs, 0, K, res);
  for (int r = 0; r < NR; r++)
    for (int m = 0; m < MT; m++)
      a.y[size_t(m0 + m) * a.N + n + r] = res[r][m] + dot<W>(bs + r * G, a.xsum + size_t(m0 + m) * G, G);
}

// Weight rows a pass for MT rows of x: accumulators (and their block partials) of NR * MT
// chains plus NR packed vectors and MT activations stay in registers (16 vector registers on
// AVX2 and SSE2, 32 on AVX-512 and NEON).
template <int MT>
constexpr int rows_per_pass() {
#if WEFT_QMM_WIDTH >= 16 || defined(__aarch64__)
  return MT <= 2 ? 4 : MT <= 4 ? 2 : 1;
#else
  return MT == 1 ? 4 : MT == 2 ? 2 : 1;
#endif
}

// Largest tile of x (MT rows of K floats) that runs 8 rows at once (see rows_impl).
constexpr size_t MAX_TILE_X_BYTES = 24 * 1024;

// Longest weight row (bytes) that runs in passes of several rows (see rows_impl).
constexpr int MAX_MULTI_ROW_BYTES = 512;

template <int BITS, int GS>
void rows_impl(const Args& a, int n0, int n1) {
  const int G = a.K / GS;
  const int words = a.K / 32 * BITS;
  const int ssize = a.sdtype == F32 ? 4 : 2;
  // Scales and biases of a block of rows as float32. Prefill converts more rows at once so
  // that the weights of the block stay in cache while every tile of x passes over them.
  const int nb = a.M >= BLOCK_ROWS_MIN ? N_BLOCK_PREFILL : N_BLOCK;
  // A buffer per thread, grown as needed (no allocation per call).
  thread_local float* buf = nullptr;
  thread_local size_t buf_len = 0;
  if (a.sdtype != F32 && buf_len < size_t(nb) * G * 2) {
    delete[] buf;
    buf_len = size_t(nb) * G * 2;
    buf = new float[buf_len];
  }
  float* scp = a.sdtype == F32 ? nullptr : buf;
  float* bsp = scp ? scp + size_t(nb) * G : nullptr;
  float* const sc_buf = scp;
  float* const bs_buf = bsp;
  // The prescaled 8-row tile's group sums of x, [G][8] (transposed: one vector per group).
  thread_local float* xst = nullptr;
  thread_local size_t xst_len = 0;
  if (prescaled<1, MAX_MT>() && MAX_MT == 8 && a.M >= 8) {
    if (xst_len < size_t(G) * 8) {
      delete[] xst;
      xst_len = size_t(G) * 8;
      xst = new float[xst_len];
    }
  }
  for (int nb0 = n0; nb0 < n1; nb0 += nb) {
    int nb1 = nb0 + nb < n1 ? nb0 + nb : n1;
    if (a.sdtype == F32) {
      // Already float32: read in place.
      scp = const_cast<float*>(static_cast<const float*>(a.scales)) + size_t(nb0) * G;
      bsp = const_cast<float*>(static_cast<const float*>(a.biases)) + size_t(nb0) * G;
    } else if (a.M < GEMM_MIN_ROWS) {
      // Decode: the block's rows are contiguous, so one conversion each for scales and biases
      // (row by row, G values leave a scalar tail every row: G = 18 for K = 576).
      auto off = size_t(nb0) * G * ssize;
      to_f32(static_cast<const char*>(a.scales) + off, a.sdtype, (nb1 - nb0) * G, sc_buf);
      to_f32(static_cast<const char*>(a.biases) + off, a.sdtype, (nb1 - nb0) * G, bs_buf);
    } else {
      // Prefill without the GEMM path: row by row, as measured fastest there.
      for (int n = nb0; n < nb1; n++) {
        auto off = size_t(n) * G * ssize;
        to_f32(static_cast<const char*>(a.scales) + off, a.sdtype, G, sc_buf + (n - nb0) * G);
        to_f32(static_cast<const char*>(a.biases) + off, a.sdtype, G, bs_buf + (n - nb0) * G);
      }
    }
    int m = 0;
    auto tiles = [&](auto mt) {
      constexpr int MT = decltype(mt)::value;
      constexpr int NR = rows_per_pass<MT>();
      for (; m + MT <= a.M; m += MT) {
        const float* xs = nullptr;
        if constexpr (prescaled<NR, MT>() && MT == 8) {
          for (int g = 0; g < G; g++)
            for (int i = 0; i < 8; i++) xst[g * 8 + i] = a.xsum[size_t(m + i) * G + g];
          xs = xst;
        }
        int n = nb0;
        // Several weight rows a pass only while they are short: NR interleaved streams of
        // longer rows (down 1536 -> 576: 768 bytes; the 8-bit head: 576) measured up to 2x
        // slower from DRAM on the Zen 4 VM, short ones (288 bytes) 10-15% faster.
        if (NR == 1 || words * 4 <= MAX_MULTI_ROW_BYTES)
          for (; n + NR <= nb1; n += NR)
          tile<NR, MT, BITS, GS>(a, a.w + size_t(n) * words, words, scp + (n - nb0) * G,
                                 bsp + (n - nb0) * G, m, n, xs);
        if (NR > 2 && words * 4 <= MAX_MULTI_ROW_BYTES)
          for (; n + 2 <= nb1; n += 2)
            tile<2, MT, BITS, GS>(a, a.w + size_t(n) * words, words, scp + (n - nb0) * G,
                                  bsp + (n - nb0) * G, m, n, xs);
        for (; n < nb1; n++)
          tile<1, MT, BITS, GS>(a, a.w + size_t(n) * words, words, scp + (n - nb0) * G,
                                bsp + (n - nb0) * G, m, n, xs);
      }
    };
    // AVX2's 8 rows of x only while they fit L1 beside the weights (24 KB: K <= 768); longer
    // rows (down 1536 -> 576: 48 KB) measured 7% slower than two 4-row tiles, x coming from L2
    // (and splitting K into parts of 768 as slow: the weights no longer stream row by row).
    if (!prescaled<1, MAX_MT>() || size_t(MAX_MT) * a.K * 4 <= MAX_TILE_X_BYTES) tiles(Int<MAX_MT>{});
    if constexpr (MAX_MT > 4) tiles(Int<4>{});
    tiles(Int<2>{});
    tiles(Int<1>{});
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM path (M >= GEMM_MIN_ROWS). For a slice of NR output rows and a chunk of KC elements the
// weights are dequantized once (s * q + b, float32) into a panel laid out [k][NR], which stays
// in L1 while every tile of MR rows of x passes over it: per k, NV vector loads of the panel,
// MR broadcasts of x and MR * NV independent FMAs into accumulators held in registers.
#if WEFT_QMM_WIDTH >= 16
constexpr int GEMM_MR = 8;  // 16 of AVX-512's 32 registers accumulate
#else
constexpr int GEMM_MR = 6;  // 12 of 16 (AVX2, SSE2; NEON has 32)
#endif
constexpr int GEMM_NV = 2;
constexpr int NR = GEMM_NV * W;
// Elements of K per panel: KC * NR floats (16 KB at 16 lanes) fit L1 beside the tiles of x.
// A multiple of 64, so a chunk starts on a group of either size and on a 5-bit word boundary.
constexpr int KC = 128;
static_assert(GEMM_CHUNK_ROWS % NR == 0, "pool chunks hold whole slices");

// y[i][0..ncols) (+)= x[i] . panel for i < MR: the register tile over kc elements.
template <int MR>
inline void micro(const float* x, size_t ldx, const float* panel, int kc, float* y, size_t ldy,
                  bool add, int ncols) {
  typedef typename V<W>::f vf;
  vf acc[MR][GEMM_NV];
  for (int i = 0; i < MR; i++)
    for (int v = 0; v < GEMM_NV; v++) acc[i][v] = vf{};
  for (int k = 0; k < kc; k++) {
    vf b[GEMM_NV];
    for (int v = 0; v < GEMM_NV; v++) b[v] = load_f<W>(panel + size_t(k) * NR + v * W);
    for (int i = 0; i < MR; i++) {
      const float xv = x[i * ldx + k];
      for (int v = 0; v < GEMM_NV; v++) acc[i][v] += b[v] * xv;
    }
  }
  for (int i = 0; i < MR; i++) {
    float* row = y + i * ldy;
    if (ncols == NR) {
      for (int v = 0; v < GEMM_NV; v++) {
        vf r = acc[i][v];
        if (add) r += load_f<W>(row + v * W);
        __builtin_memcpy(row + v * W, &r, sizeof r);
      }
    } else {
      // The last slice of a matrix whose N is not a multiple of NR.
      float t[NR];
      __builtin_memcpy(t, acc[i], sizeof t);
      for (int c = 0; c < ncols; c++) row[c] = add ? row[c] + t[c] : t[c];
    }
  }
}

inline float scale_at(const void* p, int dtype, size_t i) {
  if (dtype == F32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  if (dtype == BF16) {
    uint32_t bits = uint32_t(h) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }
  return half_to_float(h);
}

// Per-thread panel buffers (~40 KB), allocated on a thread's first GEMM call and freed when the
// thread exits.
struct PanelBufs {
  uint32_t* words = nullptr;  // [KC * bits / 32][NR]: the slice's packed words, transposed
  float* sc = nullptr;        // [KC / 32][NR] scales and biases of the chunk's groups, transposed
  float* bs = nullptr;
  float* panel = nullptr;     // [KC][NR]
  ~PanelBufs() {
    delete[] words;
    delete[] sc;
    delete[] bs;
    delete[] panel;
  }
};

const PanelBufs& panel_bufs() {
  thread_local PanelBufs b;
  if (!b.panel) {
    b.words = new uint32_t[size_t(KC) / 4 * NR];
    b.sc = new float[size_t(KC) / 32 * NR];
    b.bs = new float[size_t(KC) / 32 * NR];
    b.panel = new float[size_t(KC) * NR];
  }
  return b;
}

// Dequantizes rows [n, n + nc) (nc <= NR; the rest of the slice is zero) over [k0, k1) into
// b.panel. The words are transposed first so that one vector load takes the same word of NR
// rows: every lane then shifts by the same amount and meets its own row's scale and bias.
template <int BITS, int GS>
void dequant_panel(const Args& a, int n, int nc, int k0, int k1, const PanelBufs& b) {
  typedef typename V<W>::f vf;
  typedef typename V<W>::i vi;
  typedef typename V<W>::u vu;
  constexpr uint32_t MASK = (1u << BITS) - 1;
  const size_t row_words = size_t(a.K) / 32 * BITS;
  const int w0 = k0 / 32 * BITS, nw = (k1 - k0) / 32 * BITS;
  const size_t G = size_t(a.K) / GS;
  const int g0 = k0 / GS, ng = (k1 - k0) / GS;
  for (int r = 0; r < NR; r++) {
    if (r < nc) {
      const uint32_t* src = a.w + size_t(n + r) * row_words + w0;
      for (int i = 0; i < nw; i++) b.words[i * NR + r] = src[i];
      for (int g = 0; g < ng; g++) {
        b.sc[g * NR + r] = scale_at(a.scales, a.sdtype, (n + r) * G + g0 + g);
        b.bs[g * NR + r] = scale_at(a.biases, a.sdtype, (n + r) * G + g0 + g);
      }
    } else {
      for (int i = 0; i < nw; i++) b.words[i * NR + r] = 0;
      for (int g = 0; g < ng; g++) b.sc[g * NR + r] = b.bs[g * NR + r] = 0.0f;
    }
  }
  for (int v = 0; v < GEMM_NV; v++) {
    const uint32_t* wv = b.words + v * W;
    float* out = b.panel + v * W;
    auto put = [&](int k, vu code, int g) {
      const vf q = __builtin_convertvector((vi)code, vf);
      const vf r = q * load_f<W>(b.sc + g * NR + v * W) + load_f<W>(b.bs + g * NR + v * W);
      __builtin_memcpy(out + size_t(k) * NR, &r, sizeof r);
    };
    if constexpr (BITS == 5) {
      // A 32-element group is five words; element e sits at bit 5e of them.
      for (int k = 0; k < k1 - k0; k += 32) {
        vu u[5];
        for (int i = 0; i < 5; i++) u[i] = load_u<W>(wv + (k / 32 * 5 + i) * NR);
        const int g = k / GS;
#pragma GCC unroll 32
        for (int e = 0; e < 32; e++) {
          const int bit = 5 * e, i = bit / 32, sh = bit % 32;
          vu c = u[i] >> sh;
          if (sh > 27) c |= u[i + 1] << (32 - sh);
          put(k + e, c & 31u, g);
        }
      }
    } else {
      constexpr int EPU = 32 / BITS;
      for (int i = 0; i < nw; i++) {
        const vu u = load_u<W>(wv + i * NR);
        const int g = i * EPU / GS;
#pragma GCC unroll 8
        for (int j = 0; j < EPU; j++) put(i * EPU + j, (u >> (BITS * j)) & MASK, g);
      }
    }
  }
}

template <int BITS, int GS>
void gemm_impl(const Args& a, int n0, int n1) {
  const PanelBufs& b = panel_bufs();
  const size_t K = size_t(a.K), N = size_t(a.N);
  for (int n = n0; n < n1; n += NR) {
    const int nc = n1 - n < NR ? n1 - n : NR;
    for (int k0 = 0; k0 < a.K; k0 += KC) {
      const int k1 = k0 + KC < a.K ? k0 + KC : a.K;
      dequant_panel<BITS, GS>(a, n, nc, k0, k1, b);
      const bool add = k0 > 0;
      int m = 0;
      auto tiles = [&](auto mr) {
        constexpr int MR = decltype(mr)::value;
        for (; m + MR <= a.M; m += MR)
          micro<MR>(a.x + m * K + k0, K, b.panel, k1 - k0, a.y + m * N + n, N, add, nc);
      };
      tiles(Int<GEMM_MR>{});
      tiles(Int<4>{});
      tiles(Int<2>{});
      tiles(Int<1>{});
    }
  }
}

template <int BITS, int GS>
void dispatch(const Args& a, int n0, int n1) {
  if (a.x && a.M >= GEMM_MIN_ROWS) gemm_impl<BITS, GS>(a, n0, n1);
  else rows_impl<BITS, GS>(a, n0, n1);
}

void rows(const Args& a, int n0, int n1) {
  if (a.bits == 4 && a.group_size == 32) dispatch<4, 32>(a, n0, n1);
  else if (a.bits == 4 && a.group_size == 64) dispatch<4, 64>(a, n0, n1);
  else if (a.bits == 5 && a.group_size == 32) dispatch<5, 32>(a, n0, n1);
  else if (a.bits == 5 && a.group_size == 64) dispatch<5, 64>(a, n0, n1);
  else if (a.bits == 8 && a.group_size == 32) dispatch<8, 32>(a, n0, n1);
  else if (a.bits == 8 && a.group_size == 64) dispatch<8, 64>(a, n0, n1);
}

}  // namespace

#define WEFT_STR2(x) #x
#define WEFT_STR(x) WEFT_STR2(x)
const Kernel kernel = {rows, W, WEFT_STR(WEFT_QMM_ISA)};

}  // namespace WEFT_QMM_ISA
}  // namespace weft_qmm
