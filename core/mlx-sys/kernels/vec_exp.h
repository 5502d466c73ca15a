// Cephes' single-precision exp (a couple of ulps) four lanes at a time in GCC vector types (one
// SSE2 / NEON register on the baseline build). Included inside a file's own anonymous namespace
// (row_ops.cpp: log-softmax; qmm_primitive.cpp: the SwiGLU read by the down projection), so each
// file gets its own internal copy. Needs <cstring> and <cstdint>.
#pragma once

typedef float vf4 __attribute__((vector_size(16)));
typedef int32_t vi4 __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) vf4 splat(float v) { return vf4{v, v, v, v}; }

// Any lane count: F a float vector type, I the int32 vector of the same lanes.
template <class F, class I>
static inline __attribute__((always_inline)) F exp_lanes(F x) {
  const F one = F{} + 1.0f;
  x = x < F{} - 87.3f ? F{} - 87.3f : x;  // exp(-87.3) is still a normal float
  x = x > F{} + 88.3f ? F{} + 88.3f : x;
  F fx = x * 1.44269504088896341f + 0.5f;
  I n = __builtin_convertvector(fx, I);
  n = __builtin_convertvector(n, F) > fx ? n - 1 : n;  // floor
  const F t = __builtin_convertvector(n, F);
  x = x - t * 0.693359375f - t * -2.12194440e-4f;
  F y = F{} + 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * (x * x) + x + one;
  I e = (n + 127) << 23;
  F p;
  std::memcpy(&p, &e, sizeof p);
  return y * p;
}

static inline __attribute__((always_inline)) vf4 exp4(vf4 x) { return exp_lanes<vf4, vi4>(x); }

static inline __attribute__((always_inline)) vf4 load4(const float* p) {
  vf4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
