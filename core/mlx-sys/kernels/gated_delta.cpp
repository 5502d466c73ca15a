// The gated delta recurrence of hybrid models (Qwen3-Next / Qwen3.5 gated DeltaNet) as one op
// per layer call, instead of ~10 ops per token:
// - weft_gated_delta_fused: MLX's fast::gated_delta_update (a Metal kernel; on CUDA and the CPU
//   MLX runs its fallback graph).
// - weft_gated_delta_cuda: Weft's CUDA kernel (gated_delta_cuda.h) through fast::cuda_kernel,
//   compiled by MLX at run time on the first call of each shape.
// - weft_gated_delta_cpu: one CPU primitive (the fast kernel mode): per token and state row one
//   pass over the row in L1 instead of ~10 ops each streaming the whole state. Its sums are
//   ordered differently from MLX's: fast mode only.
// Both take q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g (decay in linear space) and beta
// [B, T, Hv], state [B, Hv, Dv, Dk] (empty: zeros) and mask [B, T] bool (empty: none), and
// return y [B, T, Hv, Dv] (q's dtype) and the new float32 state.
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"

#include "gated_delta.h"
#include "gated_delta_cuda.h"
#include "thread_pool.h"

namespace mx = mlx::core;

namespace {

thread_local std::string last_error;

std::optional<mx::array> optional_of(const mlx_array a) {
  if (!a.ctx) return std::nullopt;
  return mlx_array_get_(a);
}

void check_shapes(const mx::array& q, const mx::array& k, const mx::array& v, const mx::array& g,
                  const mx::array& beta, const std::optional<mx::array>& state,
                  const std::optional<mx::array>& mask) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("gated delta: " + what); };
  if (q.ndim() != 4 || k.shape() != q.shape() || v.ndim() != 4) fail("q, k must be [B,T,Hk,Dk], v [B,T,Hv,Dv]");
  const int B = q.shape(0), T = q.shape(1), Hk = q.shape(2), Dk = q.shape(3);
  const int Hv = v.shape(2), Dv = v.shape(3);
  if (v.shape(0) != B || v.shape(1) != T) fail("v's batch and time must be q's");
  if (Hk <= 0 || Hv % Hk != 0) fail("value heads must be a multiple of key heads");
  const mx::Shape gates{B, T, Hv};
  if (g.shape() != gates || beta.shape() != gates) fail("g and beta must be [B,T,Hv]");
  if (state && state->shape() != mx::Shape{B, Hv, Dv, Dk}) fail("state must be [B,Hv,Dv,Dk]");
  if (mask && (mask->shape() != mx::Shape{B, T} || mask->dtype() != mx::bool_)) fail("mask must be [B,T] bool");
}

// One kernel per mask presence (the input list is fixed when the kernel is made).
const mx::fast::CustomKernelFunction& cuda_kernel() {
  static const mx::fast::CustomKernelFunction kernel = mx::fast::cuda_kernel(
      "weft_gated_delta", {"q", "k", "v", "g", "beta", "state_in", "mask"}, {"y", "state_out"},
      weft_gdn::cuda_source(), "", /*ensure_row_contiguous=*/true, /*shared_memory=*/0);
  return kernel;
}


// ---------------------------------------------------------------------------------------------
// CPU primitive. Inputs (row-contiguous): q, k [B,T,Hk,Dk] and v [B,T,Hv,Dv] of one float type,
// g and beta [B,T,Hv] float32, state [B,Hv,Dv,Dk] float32, optionally mask [B,T] bool.
// Work items: (b, hv, block of state rows); every row runs its own recurrence over T.

constexpr int kRowsPerItem = 16;

struct CpuArgs {
  const void* q;
  const void* k;
  const void* v;
  const float* g;
  const float* beta;
  const float* state_in;
  const bool* mask;
  void* y;
  float* state_out;
  int B, T, Hk, Hv, Dk, Dv;
  int row_blocks;
};

template <class T>
float to_float(T x) { return static_cast<float>(x); }

// Dot product with eight partial sums (one chain would wait on each add's latency).
#define WEFT_GDN_INLINE inline __attribute__((always_inline))

WEFT_GDN_INLINE float decay_dot(float* s, const float* k, float g, int n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) {
      s[i + j] *= g;
      part[j] += s[i + j] * k[i + j];
    }
  for (; i < n; i++) {
    s[i] *= g;
    part[i % 8] += s[i] * k[i];
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

WEFT_GDN_INLINE float update_dot(float* s, const float* k, float delta, const float* q, int n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) {
      s[i + j] += k[i + j] * delta;
      part[j] += s[i + j] * q[i + j];
    }
  for (; i < n; i++) {
    s[i] += k[i] * delta;
    part[i % 8] += s[i] * q[i];
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

template <class InT>
WEFT_GDN_INLINE void cpu_item_body(const CpuArgs& a, int item) {
  const int n = item / a.row_blocks;  // b * Hv + hv
  const int r0 = (item % a.row_blocks) * kRowsPerItem;
  const int r1 = std::min(a.Dv, r0 + kRowsPerItem);
  const int b = n / a.Hv, hv = n % a.Hv, hk = hv / (a.Hv / a.Hk);
  const int Dk = a.Dk, Dv = a.Dv, T = a.T;
  const auto* q = static_cast<const InT*>(a.q);
  const auto* k = static_cast<const InT*>(a.k);
  const auto* v = static_cast<const InT*>(a.v);
  auto* y = static_cast<InT*>(a.y);
  float* S = a.state_out + size_t(n) * Dv * Dk;
  std::copy(a.state_in + size_t(n) * Dv * Dk + size_t(r0) * Dk, a.state_in + size_t(n) * Dv * Dk + size_t(r1) * Dk,
            S + size_t(r0) * Dk);
  std::vector<float> kq(size_t(2 * Dk));
  float* kf = kq.data();
  float* qf = kq.data() + Dk;
  for (int t = 0; t < T; t++) {
    const size_t bt = size_t(b) * T + t;
    InT* yt = y + (bt * a.Hv + hv) * Dv;
    if (a.mask && !a.mask[bt]) {
      for (int r = r0; r < r1; r++) yt[r] = InT(0.0f);
      continue;
    }
    const size_t qk = (bt * a.Hk + hk) * Dk;
    for (int i = 0; i < Dk; i++) {
      kf[i] = to_float(k[qk + i]);
      qf[i] = to_float(q[qk + i]);
    }
    const float g = a.g[bt * a.Hv + hv], beta = a.beta[bt * a.Hv + hv];
    const InT* vt = v + (bt * a.Hv + hv) * Dv;
    for (int r = r0; r < r1; r++) {
      float* s = S + size_t(r) * Dk;
      const float kv = decay_dot(s, kf, g, Dk);
      const float delta = (to_float(vt[r]) - kv) * beta;
      yt[r] = InT(update_dot(s, kf, delta, qf, Dk));
    }
  }
}

// The body compiled twice: for the baseline and (x86-64) for AVX2 + FMA, picked at run time
// under the kernels' instruction-set cap (weft_kernels::isa_level).
template <class InT>
void cpu_item(const CpuArgs& a, int item) {
  cpu_item_body<InT>(a, item);
}

#if defined(__x86_64__)
template <class InT>
__attribute__((target("avx2,fma,f16c"))) void cpu_item_avx2(const CpuArgs& a, int item) {
  cpu_item_body<InT>(a, item);
}
#endif

template <class InT>
void (*pick_item())(const CpuArgs&, int) {
#if defined(__x86_64__)
  if (weft_kernels::isa_level() <= 1) return cpu_item_avx2<InT>;
#endif
  return cpu_item<InT>;
}

struct CpuJob {
  CpuArgs args;
  void (*item)(const CpuArgs&, int);
};

void run_cpu_item(void* ctx, int it) {
  auto* job = static_cast<CpuJob*>(ctx);
  job->item(job->args, it);
}

class GatedDeltaCpu : public mx::Primitive {
 public:
  explicit GatedDeltaCpu(mx::Stream s) : mx::Primitive(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (auto& in : inputs) encoder.set_input_array(in);
    for (auto& out : outputs) encoder.set_output_array(out);
    encoder.dispatch([inputs, y = mx::array::unsafe_weak_copy(outputs[0]),
                      st = mx::array::unsafe_weak_copy(outputs[1])]() mutable {
      const auto& q = inputs[0];
      CpuJob job;
      CpuArgs& a = job.args;
      a.q = q.data<void>();
      a.k = inputs[1].data<void>();
      a.v = inputs[2].data<void>();
      a.g = inputs[3].data<float>();
      a.beta = inputs[4].data<float>();
      a.state_in = inputs[5].data<float>();
      a.mask = inputs.size() > 6 ? inputs[6].data<bool>() : nullptr;
      a.y = y.data<void>();
      a.state_out = st.data<float>();
      a.B = q.shape(0), a.T = q.shape(1), a.Hk = q.shape(2), a.Dk = q.shape(3);
      a.Hv = inputs[2].shape(2), a.Dv = inputs[2].shape(3);
      a.row_blocks = (a.Dv + kRowsPerItem - 1) / kRowsPerItem;
      switch (q.dtype()) {
        case mx::float32: job.item = pick_item<float>(); break;
        case mx::bfloat16: job.item = pick_item<mx::bfloat16_t>(); break;
        default: job.item = pick_item<mx::float16_t>(); break;
      }
      const int items = a.B * a.Hv * a.row_blocks;
      // Below ~2^16 multiply-adds the pool's hand-off costs more than it saves (decode of a
      // tiny model).
      const double work = double(a.B) * a.Hv * a.Dv * a.Dk * double(a.T);
      if (items == 1 || work < double(1 << 16)) {
        for (int it = 0; it < items; it++) job.item(a, it);
      } else {
        weft_kernels::parallel_for(items, run_cpu_item, &job);
      }
    });
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("weft GatedDeltaCpu runs on the CPU");
  }
  const char* name() const override { return "WeftGatedDeltaCpu"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const GatedDeltaCpu*>(&other) != nullptr;
  }
};

}  // namespace

// The arguments of one recurrence as the three entry points below receive them, checked.
struct Call {
  const mx::array& q;
  const mx::array& k;
  const mx::array& v;
  const mx::array& g;
  const mx::array& beta;
  std::optional<mx::array> state;
  std::optional<mx::array> mask;
  const mx::Stream& s;
};

// Runs `body` on the unwrapped, shape-checked arguments and stores its {y, state}; C++
// exceptions become status 1 with the message in `last_error` (nothing crosses into Rust).
template <class Body>
int guarded(mlx_array* y, mlx_array* state_out, const mlx_array q, const mlx_array k,
            const mlx_array v, const mlx_array g, const mlx_array beta, const mlx_array state,
            const mlx_array mask, const mlx_stream stream, Body body) {
  try {
    Call c{mlx_array_get_(q),   mlx_array_get_(k),  mlx_array_get_(v),
           mlx_array_get_(g),   mlx_array_get_(beta), optional_of(state),
           optional_of(mask),   mlx_stream_get_(stream)};
    check_shapes(c.q, c.k, c.v, c.g, c.beta, c.state, c.mask);
    std::vector<mx::array> out = body(c);
    if (out.size() != 2) throw std::runtime_error("gated delta: " + std::to_string(out.size()) + " outputs, not 2");
    mlx_array_set_(*y, out[0]);
    mlx_array_set_(*state_out, out[1]);
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

#define WEFT_GATED_DELTA_ARGS                                                                 \
  mlx_array *y, mlx_array *state_out, const mlx_array q, const mlx_array k, const mlx_array v, \
      const mlx_array g, const mlx_array beta, const mlx_array state, const mlx_array mask,     \
      const mlx_stream stream
#define WEFT_GATED_DELTA_PASS y, state_out, q, k, v, g, beta, state, mask, stream

extern "C" int weft_gated_delta_fused(WEFT_GATED_DELTA_ARGS) {
  return guarded(WEFT_GATED_DELTA_PASS, [](const Call& c) {
    return mx::fast::gated_delta_update(c.q, c.k, c.v, c.g, c.beta, c.state, c.mask, c.s);
  });
}

extern "C" int weft_gated_delta_cuda(WEFT_GATED_DELTA_ARGS) {
  return guarded(WEFT_GATED_DELTA_PASS, [](const Call& c) {
    const auto& s = c.s;
    if (s.device.type != mx::Device::DeviceType::gpu) throw std::invalid_argument("gated delta CUDA kernel: not a GPU stream");
    const int B = c.q.shape(0), Hk = c.q.shape(2), Dk = c.q.shape(3), Hv = c.v.shape(2), Dv = c.v.shape(3);
    const auto in_type = c.q.dtype();
    // The kernel reads q, k, v as one type and keeps the state in float32.
    auto kb = mx::astype(c.k, in_type, s);
    auto vb = mx::astype(c.v, in_type, s);
    auto state_in = c.state ? mx::astype(*c.state, mx::float32, s) : mx::zeros({B, Hv, Dv, Dk}, mx::float32, s);
    auto mask_in = c.mask ? *c.mask : mx::array(true);
    return cuda_kernel()(
        {c.q, kb, vb, c.g, c.beta, state_in, mask_in}, {c.v.shape(), state_in.shape()}, {in_type, mx::float32},
        {32, Dv, B * Hv}, {32, 4, 1},
        {{"InT", in_type}, {"GT", c.g.dtype()}, {"BT", c.beta.dtype()}, {"Dk", Dk}, {"Dv", Dv}, {"Hk", Hk},
         {"Hv", Hv}, {"HasMask", c.mask.has_value()}},
        std::nullopt, false, s);
  });
}

extern "C" int weft_gated_delta_cpu(WEFT_GATED_DELTA_ARGS) {
  return guarded(WEFT_GATED_DELTA_PASS, [](const Call& c) {
    const auto& s = c.s;
    if (s.device.type != mx::Device::DeviceType::cpu) throw std::invalid_argument("gated delta CPU kernel: not a CPU stream");
    const auto in_type = c.q.dtype();
    if (in_type != mx::float32 && in_type != mx::bfloat16 && in_type != mx::float16)
      throw std::invalid_argument("gated delta CPU kernel: q must be float32, bfloat16 or float16");
    const int B = c.q.shape(0), Dk = c.q.shape(3), Hv = c.v.shape(2), Dv = c.v.shape(3);
    auto cont = [&](const mx::array& a, mx::Dtype t) { return mx::contiguous(mx::astype(a, t, s), false, s); };
    std::vector<mx::array> inputs{cont(c.q, in_type), cont(c.k, in_type), cont(c.v, in_type),
                                  cont(c.g, mx::float32), cont(c.beta, mx::float32),
                                  c.state ? cont(*c.state, mx::float32) : mx::zeros({B, Hv, Dv, Dk}, mx::float32, s)};
    if (c.mask) inputs.push_back(cont(*c.mask, mx::bool_));
    return mx::array::make_arrays({c.v.shape(), {B, Hv, Dv, Dk}}, {in_type, mx::float32},
                                  std::make_shared<GatedDeltaCpu>(s), std::move(inputs));
  });
}

extern "C" const char* weft_gated_delta_last_error(void) { return last_error.c_str(); }
