// The int8-activation per-row kernels (qmm_kernel.h: quantize_x_int8, int8_kernel), compiled
// once per instruction set like qmm_kernel.cpp: build.rs defines WEFT_QMM_ISA and passes the -m
// flags (generic: the baseline; avx2: AVX2 + FMA + F16C; avx512vnni: AVX-512 VNNI + VL + BW on
// 256-bit vectors). The float kernel converts every 4-bit code to float and multiplies it per
// row of x; here a block of 32 codes meets 32 int8 activations in two or three integer
// instructions (u8 x i8 products summed into int32 lanes) and one float FMA per 8 lanes.
#include <cstddef>
#include <cstdint>

#include "qmm_kernel.h"

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#ifndef WEFT_QMM_ISA
#error "build.rs defines WEFT_QMM_ISA"
#endif

namespace weft_qmm {
namespace WEFT_QMM_ISA {
namespace {

#include "qmm_convert.h"

// Output rows whose scales are converted together (as the float kernel's decode blocks).
constexpr int N_BLOCK = 16;
// Longest weight row (bytes) that runs in passes of several rows (see rows_impl).
constexpr size_t MAX_MULTI_ROW_BYTES = 512;

template <int N>
struct Int {
  static constexpr int value = N;
};

inline float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

#if defined(__AVX2__)
// Rows of x that share one unpacked weight vector: their accumulators stay in registers
// (AVX2: 16 vector registers; the EVEX build has 32).
constexpr int MAX_MT = 8;

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Four u8 x i8 products summed per int32 lane, for `u` (codes, 0..15) against two halves of
// activations: lanes of lo . xlo + hi . xhi. 4-bit products cannot saturate vpmaddubsw's int16
// pairs (2 * 15 * 127 per pair, twice that after the add).
inline __m256i dot4(__m256i lo, __m256i hi, __m256i xlo, __m256i xhi) {
#if defined(__AVX512VNNI__)
  return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xlo), hi, xhi);
#else
  const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

inline __m128i dot4(__m128i lo, __m128i hi, __m128i xlo, __m128i xhi) {
#if defined(__AVX512VNNI__)
  return _mm_dpbusd_epi32(_mm_dpbusd_epi32(_mm_setzero_si128(), lo, xlo), hi, xhi);
#else
  const __m128i p = _mm_add_epi16(_mm_maddubs_epi16(lo, xlo), _mm_maddubs_epi16(hi, xhi));
  return _mm_madd_epi16(p, _mm_set1_epi16(1));
#endif
}

// An 8-bit weight vector as the integer step reads it: the codes themselves for vpdpbusd (no
// saturation: four products summed straight into int32); for vpmaddubsw, whose int16 pairs
// 2 * 255 * 127 would overflow, |q - 128| (at most 128, unsigned) and the sign of q - 128,
// moved onto x: pairs stay within 2 * 128 * 127, and 128 * sum(q_x) comes back through xc.
struct W8 {
  __m256i a, c;
};

inline W8 load8(const uint8_t* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
#if defined(__AVX512VNNI__)
  return {v, v};
#else
  const __m256i c = _mm256_xor_si256(v, _mm256_set1_epi8(char(0x80)));
  return {_mm256_abs_epi8(c), c};
#endif
}

inline __m256i dot8(const W8& w, __m256i x) {
#if defined(__AVX512VNNI__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w.a, x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w.a, _mm256_sign_epi8(x, w.c)), _mm256_set1_epi16(1));
#endif
}

// Whether xc's term applies (the vpmaddubsw form of 8-bit weights).
constexpr bool OFFSET8 =
#if defined(__AVX512VNNI__)
    false;
#else
    true;
#endif

// acc[r][m] = the block sums of NR weight rows (wrows: packed bytes; sc: float32 scales) and
// MT rows of x over all of K, in 8 lanes.
template <int NR, int MT, int BITS, int GS>
inline void segment(const uint8_t* const* wrows, const float* const* sc, const int8_t* const* xq,
                    const float* const* xd, int K, __m256 (*acc)[MT]) {
  for (int r = 0; r < NR; r++)
    for (int m = 0; m < MT; m++) acc[r][m] = _mm256_setzero_ps();
  if constexpr (BITS == 4) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    // Lanes 0-3 hold the chunk's first block, 4-7 its second.
    const __m256i halves = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    int k = 0;
    for (; k + 64 <= K; k += 64) {
      __m256i lo[NR], hi[NR];
      __m256 s[NR];
      for (int r = 0; r < NR; r++) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wrows[r] + k / 2));
        lo[r] = _mm256_and_si256(v, m4);
        hi[r] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if constexpr (GS == 32) {
          const __m128 two = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(sc[r] + k / 32)));
          s[r] = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two), halves);
        } else {
          s[r] = _mm256_set1_ps(sc[r][k / GS]);
        }
      }
      for (int m = 0; m < MT; m++) {
        const __m256i xlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[m] + k));
        const __m256i xhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[m] + k + 32));
        const __m256 d = _mm256_loadu_ps(xd[m] + k / 8);
        for (int r = 0; r < NR; r++) {
          const __m256 p = _mm256_cvtepi32_ps(dot4(lo[r], hi[r], xlo, xhi));
          acc[r][m] = _mm256_fmadd_ps(p, _mm256_mul_ps(s[r], d), acc[r][m]);
        }
      }
    }
    if (k < K) {
      // A last block of 32 (K an odd multiple of 32, groups of 32): 16 bytes, 4 lanes.
      const __m128i m4h = _mm_set1_epi8(0x0f);
      for (int r = 0; r < NR; r++) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wrows[r] + k / 2));
        const __m128i lo = _mm_and_si128(v, m4h), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4h);
        const __m128 s = _mm_set1_ps(sc[r][k / GS]);
        for (int m = 0; m < MT; m++) {
          const __m128i xlo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xq[m] + k));
          const __m128i xhi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xq[m] + k + 16));
          const __m128 p = _mm_mul_ps(_mm_cvtepi32_ps(dot4(lo, hi, xlo, xhi)), _mm_mul_ps(s, _mm_loadu_ps(xd[m] + k / 8)));
          acc[r][m] = _mm256_add_ps(acc[r][m], _mm256_insertf128_ps(_mm256_setzero_ps(), p, 0));
        }
      }
    }
  } else {
    for (int k = 0; k < K; k += 32) {
      W8 w[NR];
      __m256 s[NR];
      for (int r = 0; r < NR; r++) {
        w[r] = load8(wrows[r] + k);
        s[r] = _mm256_set1_ps(sc[r][k / GS]);
      }
      for (int m = 0; m < MT; m++) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[m] + k));
        const __m256 d = _mm256_set1_ps(xd[m][k / 8]);
        for (int r = 0; r < NR; r++) {
          const __m256 p = _mm256_cvtepi32_ps(dot8(w[r], x));
          acc[r][m] = _mm256_fmadd_ps(p, _mm256_mul_ps(s[r], d), acc[r][m]);
        }
      }
    }
  }
}

// a . b over n floats: the vector part added into acc's lanes, the scalar tail returned. (A
// scalar loop over the row's G groups is one chain of dependent FMAs: as long as the row's
// integer work at K = 576.)
inline float dot_into(const float* a, const float* b, int n, __m256& acc) {
  int i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = 0.0f;
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

// Weight rows a pass for MT rows of x: at M = 1, four rows' chains measured 1.1x (AVX2) to
// 1.2x (VNNI) faster than one on rows of 288 bytes (qmm_decode_bench, hot cache).
template <int MT>
constexpr int rows_per_pass() {
  return MT == 1 ? 4 : MT == 2 ? 2 : 1;
}
#else
// The baseline: scalar loops over the same layout and integer sums (GCC vectorizes the
// widening products where it can).
constexpr int MAX_MT = 4;

template <int NR, int MT, int BITS, int GS>
inline void segment(const uint8_t* const* wrows, const float* const* sc, const int8_t* const* xq,
                    const float* const* xd, int K, float (*res)[MT]) {
  for (int r = 0; r < NR; r++)
    for (int m = 0; m < MT; m++) {
      const uint8_t* w = wrows[r];
      const int8_t* x = xq[m];
      float tot = 0.0f;
      for (int k = 0; k < K; k += 32) {
        int32_t isum = 0;
        if constexpr (BITS == 4) {
          // The block's 16 bytes within its chunk of C elements: evens at x[c0 + j], odds at
          // x[c0 + C / 2 + j] (j the byte's index in the chunk).
          const int c0 = k / 64 * 64, C = K - c0 < 64 ? K - c0 : 64;
          const int j0 = (k - c0) / 2;
          for (int j = j0; j < j0 + 16; j++) {
            const int b = w[c0 / 2 + j];
            isum += (b & 15) * x[c0 + j] + (b >> 4) * x[c0 + C / 2 + j];
          }
        } else {
          for (int e = k; e < k + 32; e++) isum += int32_t(w[e]) * x[e];
        }
        tot += float(isum) * (sc[r][k / GS] * xd[m][k / 8]);
      }
      res[r][m] += tot;
    }
}

template <int MT>
constexpr int rows_per_pass() {
  return 1;
}
#endif

template <int NR, int MT, int BITS, int GS>
void tile(const Args& a, const uint8_t* wrow, size_t bytes, const float* sc, const float* bs, int m0,
          int n) {
  const int K = a.K, G = K / GS;
  const int8_t* xq[MT];
  const float* xd[MT];
  const uint8_t* wrows[NR];
  const float* scs[NR];
  for (int m = 0; m < MT; m++) {
    xq[m] = a.xq + size_t(m0 + m) * K;
    xd[m] = a.xd + size_t(m0 + m) * (K / 8);
  }
  for (int r = 0; r < NR; r++) {
    wrows[r] = wrow + r * bytes;
    scs[r] = sc + r * G;
  }
#if defined(__AVX2__)
  __m256 acc[NR][MT];
  segment<NR, MT, BITS, GS>(wrows, scs, xq, xd, K, acc);
  for (int r = 0; r < NR; r++)
    for (int m = 0; m < MT; m++) {
      // The bias term b . xsum (and the 8-bit offset's s . xc) in the same lanes.
      float tail = dot_into(bs + r * G, a.xsum + size_t(m0 + m) * G, G, acc[r][m]);
      if (BITS == 8 && OFFSET8) tail += dot_into(sc + r * G, a.xc + size_t(m0 + m) * G, G, acc[r][m]);
      a.y[size_t(m0 + m) * a.N + n + r] = hsum(acc[r][m]) + tail;
    }
#else
  float res[NR][MT] = {};
  segment<NR, MT, BITS, GS>(wrows, scs, xq, xd, K, res);
  for (int r = 0; r < NR; r++)
    for (int m = 0; m < MT; m++)
      a.y[size_t(m0 + m) * a.N + n + r] = res[r][m] + dot(bs + r * G, a.xsum + size_t(m0 + m) * G, G);
#endif
}

template <int BITS, int GS>
void rows_impl(const Args& a, int n0, int n1) {
  const int G = a.K / GS;
  const size_t bytes = size_t(a.K) * BITS / 8;
  const int ssize = a.sdtype == F32 ? 4 : 2;
  thread_local float* buf = nullptr;
  thread_local size_t buf_len = 0;
  if (a.sdtype != F32 && buf_len < size_t(N_BLOCK) * G * 2) {
    delete[] buf;
    buf_len = size_t(N_BLOCK) * G * 2;
    buf = new float[buf_len];
  }
  const auto* w = reinterpret_cast<const uint8_t*>(a.w);
  for (int nb0 = n0; nb0 < n1; nb0 += N_BLOCK) {
    const int nb1 = nb0 + N_BLOCK < n1 ? nb0 + N_BLOCK : n1;
    const float *scp, *bsp;
    if (a.sdtype == F32) {
      scp = static_cast<const float*>(a.scales) + size_t(nb0) * G;
      bsp = static_cast<const float*>(a.biases) + size_t(nb0) * G;
    } else {
      const size_t off = size_t(nb0) * G * ssize;
      to_f32(static_cast<const char*>(a.scales) + off, a.sdtype, (nb1 - nb0) * G, buf);
      to_f32(static_cast<const char*>(a.biases) + off, a.sdtype, (nb1 - nb0) * G, buf + size_t(N_BLOCK) * G);
      scp = buf;
      bsp = buf + size_t(N_BLOCK) * G;
    }
    int m = 0;
    auto tiles = [&](auto mt) {
      constexpr int MT = decltype(mt)::value;
      constexpr int NR = rows_per_pass<MT>();
      for (; m + MT <= a.M; m += MT) {
        int n = nb0;
        // Several weight rows a pass only while they are short: as in the float kernel, NR
        // interleaved streams of long rows (the 8-bit head's 576 bytes, down's 768) measured
        // up to 2.5x slower from DRAM on the Zen 4 VM.
        if (NR > 1 && bytes <= MAX_MULTI_ROW_BYTES)
          for (; n + NR <= nb1; n += NR)
          tile<NR, MT, BITS, GS>(a, w + size_t(n) * bytes, bytes, scp + (n - nb0) * G, bsp + (n - nb0) * G, m, n);
        for (; n < nb1; n++)
          tile<1, MT, BITS, GS>(a, w + size_t(n) * bytes, bytes, scp + (n - nb0) * G, bsp + (n - nb0) * G, m, n);
      }
    };
    tiles(Int<MAX_MT>{});
    if constexpr (MAX_MT > 4) tiles(Int<4>{});
    tiles(Int<2>{});
    tiles(Int<1>{});
  }
}

void rows(const Args& a, int n0, int n1) {
  if (a.bits == 4 && a.group_size == 32) rows_impl<4, 32>(a, n0, n1);
  else if (a.bits == 4 && a.group_size == 64) rows_impl<4, 64>(a, n0, n1);
  else if (a.bits == 8 && a.group_size == 32) rows_impl<8, 32>(a, n0, n1);
  else if (a.bits == 8 && a.group_size == 64) rows_impl<8, 64>(a, n0, n1);
}

}  // namespace

#define WEFT_STR2(x) #x
#define WEFT_STR(x) WEFT_STR2(x)
const Kernel int8_kernel = {rows, 8, WEFT_STR(WEFT_QMM_ISA) "-int8"};

}  // namespace WEFT_QMM_ISA
}  // namespace weft_qmm
