// The gated delta recurrence over all T tokens as one CUDA kernel, compiled at run time by
// MLX's fast::cuda_kernel (NVRTC), which wraps this body in a __global__ function whose
// parameters are the inputs (const T*), the q_shape it finds named here, then the outputs, and
// declares the template arguments (InT, GT, BT, Dk, Dv, Hk, Hv, HasMask) as constants.
//
// Inputs: q, k [B, T, Hk, Dk] InT; v [B, T, Hv, Dv] InT; g (decay, linear space), beta
// [B, T, Hv] (GT, BT); state_in [B, Hv, Dv, Dk] float32; mask [B, T] bool (read only when
// HasMask; a one-element placeholder otherwise, since a discarded `if constexpr` branch outside
// a template must still name declared things).
// Outputs: y [B, T, Hv, Dv] InT, state_out [B, Hv, Dv, Dk] float32.
// Launch: grid (32, Dv, B * Hv) threads, blocks (32, rows, 1). One warp owns one row
// (b, hv, dv) of the state, held in registers over every token: lane l keeps elements
// l, l + 32, ... of the row (coalesced loads of q and k). Per token, two warp sums (k . s and
// q . s). A masked step leaves the state as it was and writes y = 0, as MLX's fused op does.
// The next token's inputs are loaded before the current token's sums, to overlap the loads.
//
// The source is a raw string so that benches/gpu/gdn_nvrtc_check.py can extract it between
// the markers and compile it with NVRTC on a machine without a GPU.
#pragma once

namespace weft_gdn {

inline const char* cuda_source() {
  return R"WEFT_GDN_CUDA(
  constexpr int PER_LANE = (Dk + 31) / 32;
  const int lane = threadIdx.x;
  const int dv = blockIdx.y * blockDim.y + threadIdx.y;
  const int n = blockIdx.z * blockDim.z + threadIdx.z;
  // Whole warps leave together (a warp shares one dv), so the shuffles below stay full.
  if (dv >= Dv) {
    return;
  }
  const int b = n / Hv;
  const int hv = n % Hv;
  const int hk = hv / (Hv / Hk);
  const int T = q_shape[1];

  const float* s_in = state_in + ((size_t)n * Dv + dv) * Dk;
  float* s_out = state_out + ((size_t)n * Dv + dv) * Dk;
  float s[PER_LANE];
#pragma unroll
  for (int j = 0; j < PER_LANE; ++j) {
    const int i = lane + 32 * j;
    s[j] = (i < Dk) ? s_in[i] : 0.0f;
  }

  const size_t qk_step = (size_t)Hk * Dk;
  const size_t v_step = (size_t)Hv * Dv;
  const InT* qp = q + (size_t)b * T * qk_step + (size_t)hk * Dk;
  const InT* kp = k + (size_t)b * T * qk_step + (size_t)hk * Dk;
  const InT* vp = v + (size_t)b * T * v_step + (size_t)hv * Dv + dv;
  InT* yp = y + (size_t)b * T * v_step + (size_t)hv * Dv + dv;
  const GT* gp = g + (size_t)b * T * Hv + hv;
  const BT* bp = beta + (size_t)b * T * Hv + hv;

  // Registers of the token being computed (cur) and the next one (nxt).
  float kc[PER_LANE], qc[PER_LANE];
  float vc = 0.0f, gc = 0.0f, bc = 0.0f;
  auto load = [&](int t, float* kk, float* qq, float& vv, float& gg, float& bb) {
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
      const int i = lane + 32 * j;
      kk[j] = (i < Dk) ? static_cast<float>(kp[t * qk_step + i]) : 0.0f;
      qq[j] = (i < Dk) ? static_cast<float>(qp[t * qk_step + i]) : 0.0f;
    }
    vv = static_cast<float>(vp[t * v_step]);
    gg = static_cast<float>(gp[(size_t)t * Hv]);
    bb = static_cast<float>(bp[(size_t)t * Hv]);
  };
  if (T > 0) {
    load(0, kc, qc, vc, gc, bc);
  }
  for (int t = 0; t < T; ++t) {
    float kn[PER_LANE], qn[PER_LANE];
    float vn = 0.0f, gn = 0.0f, bn = 0.0f;
    if (t + 1 < T) {
      load(t + 1, kn, qn, vn, gn, bn);
    }
    bool live = true;
    if constexpr (HasMask) {
      live = mask[(size_t)b * T + t];
    }
    if (live) {
      float kv = 0.0f;
#pragma unroll
      for (int j = 0; j < PER_LANE; ++j) {
        s[j] *= gc;
        kv += s[j] * kc[j];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        kv += __shfl_xor_sync(0xffffffffu, kv, o);
      }
      const float delta = (vc - kv) * bc;
      float out = 0.0f;
#pragma unroll
      for (int j = 0; j < PER_LANE; ++j) {
        s[j] += kc[j] * delta;
        out += s[j] * qc[j];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        out += __shfl_xor_sync(0xffffffffu, out, o);
      }
      if (lane == 0) {
        yp[t * v_step] = static_cast<InT>(out);
      }
    } else if (lane == 0) {
      yp[t * v_step] = static_cast<InT>(0.0f);
    }
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
      kc[j] = kn[j];
      qc[j] = qn[j];
    }
    vc = vn;
    gc = gn;
    bc = bn;
  }
#pragma unroll
  for (int j = 0; j < PER_LANE; ++j) {
    const int i = lane + 32 * j;
    if (i < Dk) {
      s_out[i] = s[j];
    }
  }
)WEFT_GDN_CUDA";
}

}  // namespace weft_gdn
