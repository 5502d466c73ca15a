// Scaled-dot-product attention as one MLX primitive on the CPU. MLX's
// fast::scaled_dot_product_attention has no CPU kernel: there it runs its fallback graph (the
// q * scale product, GQA reshapes, a matmul through the wheel's reference BLAS, the mask, a
// softmax with a scalar exp, a second matmul): 6-8 op dispatches per layer in decode and, in a
// long prefill, the Lq x Lk scores written and read several times. Here it is one pass per
// block of queries over the keys (attention_kernel.cpp) on the kernels' thread pool. Its sums
// and exp round differently from MLX's: fast mode only, bounded by tests/cpu_kernels.rs.
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"

#include "attention_kernel.h"
#include "thread_pool.h"
#include "weft_kernels.h"

namespace mx = mlx::core;

namespace weft_attn {
namespace {

thread_local std::string last_error;

const Kernel& select_kernel() {
#if defined(__x86_64__)
  const int level = weft_kernels::isa_level();
  if (level == 0) return avx512::kernel;
  if (level == 1) return avx2::kernel;
#endif
  return generic::kernel;
}

struct Job {
  const Kernel* kernel;
  Args args;
};

void run_item(void* ctx, int it) {
  auto* job = static_cast<Job*>(ctx);
  job->kernel->item(job->args, it);
}

void strides_of(const mx::array& a, int64_t* s) {
  for (int d = 0; d < 4; d++) s[d] = int64_t(a.strides()[size_t(d)]);
}

void compute(const mx::array& q, const mx::array& k, const mx::array& v, const mx::array* mask,
             int mode, float scale, mx::array& out) {
  Job job;
  job.kernel = &select_kernel();
  Args& a = job.args;
  a.q = q.data<float>();
  a.k = k.data<float>();
  a.v = v.data<float>();
  strides_of(q, a.qs);
  strides_of(k, a.ks);
  strides_of(v, a.vs);
  a.out = out.data<float>();
  a.B = q.shape(0), a.Hq = q.shape(1), a.Lq = q.shape(2), a.D = q.shape(3);
  a.Hkv = k.shape(1), a.Lk = k.shape(2), a.Dv = v.shape(3);
  a.scale = scale;
  a.mask = mode;
  a.m = nullptr;
  for (auto& s : a.ms) s = 0;
  if (mask) {
    a.m = mask->dtype() == mx::bool_ ? static_cast<const void*>(mask->data<bool>())
                                     : static_cast<const void*>(mask->data<float>());
    strides_of(*mask, a.ms);
  }
  a.q_block = query_block(a.Hq / a.Hkv, a.Lq);
  // A short chunk over a long history (a reused prompt's new tokens) makes one item per kv
  // head, fewer than the pool's threads can share evenly (3 items on 2 threads take as long as
  // 4): smaller query blocks give every thread two or more. Each query row's arithmetic does
  // not depend on its block, so the result is the same.
  const int threads = weft_kernels::pool_threads();
  if (items(a) < 2 * threads && a.Lq > 1) {
    const int per = a.B * a.Hkv, want = (2 * threads + per - 1) / per;
    a.q_block = (a.Lq + want - 1) / want;
  }
#if defined(__x86_64__)
  // A decode step's item holds rep query rows (3 on SmolLM2) and S^T is padded to the vector
  // width: 16 lanes would be 13 of padding, 8 lanes waste 5. Each lane's arithmetic is the same
  // in both kernels, so the result is too.
  if (job.kernel == &avx512::kernel && std::min(a.q_block, a.Lq) * (a.Hq / a.Hkv) <= 8) job.kernel = &avx2::kernel;
#endif
  const int n = items(a);
  // Multiply-adds of the whole call (causal: about half): below ~2^18 the pool's hand-off
  // costs more than it saves (a decode step over a short history).
  const double work = double(a.B) * a.Hq * a.Lq * double(a.Lk) * (a.D + a.Dv);
  if (n == 1 || work < double(1 << 18)) {
    for (int it = 0; it < n; it++) job.kernel->item(a, it);
  } else {
    weft_kernels::parallel_for(n, run_item, &job);
  }
}

class Sdpa : public mx::Primitive {
 public:
  Sdpa(mx::Stream s, float scale, int mode) : mx::Primitive(s), scale_(scale), mode_(mode) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    std::optional<mx::array> mask;
    if (inputs.size() > 3) mask = inputs[3];
    encoder.dispatch([q = inputs[0], k = inputs[1], v = inputs[2], mask,
                      out = mx::array::unsafe_weak_copy(out), scale = scale_, mode = mode_]() mutable {
      compute(q, k, v, mask ? &*mask : nullptr, mode, scale, out);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("weft Sdpa runs on the CPU; GPU streams use MLX's own");
  }
  const char* name() const override { return "WeftSdpa"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const Sdpa*>(&other);
    return o && o->scale_ == scale_ && o->mode_ == mode_;
  }

 private:
  float scale_;
  int mode_;
};

bool is_float(mx::Dtype d) { return d == mx::float32 || d == mx::float16 || d == mx::bfloat16; }

// Whether `m`'s shape broadcasts to `to` (numpy rules, m of at most to's rank).
bool broadcasts(const mx::Shape& m, const mx::Shape& to) {
  if (m.size() > to.size()) return false;
  for (size_t i = 0; i < m.size(); i++) {
    const int a = m[m.size() - 1 - i], b = to[to.size() - 1 - i];
    if (a != 1 && a != b) return false;
  }
  return true;
}

}  // namespace
}  // namespace weft_attn

using namespace weft_attn;

extern "C" int weft_sdpa(mlx_array* res, const mlx_array queries, const mlx_array keys,
                         const mlx_array values, float scale, const char* mask_mode,
                         const mlx_array mask, const mlx_stream stream) {
  try {
    const auto& q = mlx_array_get_(queries);
    const auto& k = mlx_array_get_(keys);
    const auto& v = mlx_array_get_(values);
    const auto& st = mlx_stream_get_(stream);
    const std::string mode_name = mask_mode ? mask_mode : "";
    std::optional<mx::array> m;
    if (mask.ctx) m = mlx_array_get_(mask);
    // MLX's op: outside the primitive's domain, and for every error it reports itself.
    auto mlx_op = [&] {
      mlx_array_set_(*res, mx::fast::scaled_dot_product_attention(q, k, v, scale, mode_name, m, std::nullopt,
                                                                  false, st));
      return 0;
    };
    if (st.device.type != mx::Device::DeviceType::cpu) return mlx_op();
    if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4) return mlx_op();
    if (q.dtype() != mx::float32 || k.dtype() != mx::float32 || v.dtype() != mx::float32) return mlx_op();
    const int B = q.shape(0), Hq = q.shape(1), Lq = q.shape(2), D = q.shape(3);
    const int Hkv = k.shape(1), Lk = k.shape(2), Dv = v.shape(3);
    const bool shapes_ok = B > 0 && Hq > 0 && Lq > 0 && D > 0 && Hkv > 0 && Lk > 0 && Dv > 0 &&
                           k.shape(0) == B && v.shape(0) == B && k.shape(3) == D && v.shape(1) == Hkv &&
                           v.shape(2) == Lk && Hq % Hkv == 0;
    if (!shapes_ok) return mlx_op();
    int mode;
    std::vector<mx::array> inputs{q, k, v};
    if (mode_name.empty() && !m) {
      mode = NONE;
    } else if (mode_name == "causal" && !m) {
      // Lq > Lk leaves the first queries no key: MLX's op defines that case.
      if (Lq > Lk) return mlx_op();
      mode = CAUSAL;
    } else if (mode_name == "array" && m) {
      const mx::Shape full{B, Hq, Lq, Lk};
      if (!broadcasts(m->shape(), full)) return mlx_op();
      if (m->dtype() == mx::bool_) {
        mode = BOOL;
        inputs.push_back(mx::broadcast_to(*m, full, st));
      } else if (is_float(m->dtype())) {
        // MLX adds a float mask in the output's dtype (float32 here).
        mode = ADDITIVE;
        inputs.push_back(mx::broadcast_to(mx::astype(*m, mx::float32, st), full, st));
      } else {
        return mlx_op();
      }
    } else {
      return mlx_op();
    }
    auto prim = std::make_shared<Sdpa>(st, scale, mode);
    mlx_array_set_(*res, mx::array({B, Hq, Lq, Dv}, mx::float32, prim, std::move(inputs)));
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

extern "C" const char* weft_sdpa_last_error(void) { return last_error.c_str(); }

extern "C" const char* weft_sdpa_isa(void) { return select_kernel().name; }
