// RMSNorm and RoPE as one MLX primitive each on the CPU. MLX's fast::rms_norm and fast::rope
// have no CPU kernel: on a CPU stream they expand into their fallback graphs (RMSNorm ~6 ops,
// RoPE ~20: aranges, exp, cos, sin, slices, products, a concatenate), so a decode step of a
// 30-layer model spends ~1,500 op dispatches on them. Here each is one pass over the rows, in
// float32, with the fallback's formulas (sums and the cos/sin implementation differ in the last
// bits: fast mode only, bounded by tests/cpu_kernels.rs). Also the sampling tail's log-softmax
// (`x - logsumexp(x)`): MLX's CPU logsumexp calls a scalar exp (with a libm fma) per element,
// ~0.8 ms a step over a 49,152-token vocabulary; here it is vectorized.
#include <cmath>
#include <cstring>
#include <limits>
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

#include "thread_pool.h"
#include "weft_kernels.h"

namespace mx = mlx::core;

namespace weft_row_ops {
namespace {

thread_local std::string last_error;

// Calls fn(row index, pointer to the row's first element) for every row (last axis) of x, in
// row-major order, whatever x's strides (the RoPE input is usually a transposed view).
template <class F>
void for_each_row(const mx::array& x, F&& fn) {
  const auto& shape = x.shape();
  const auto& strides = x.strides();
  const int nd = int(shape.size());
  const float* base = x.data<float>();
  const size_t rows = x.size() / size_t(shape.back());
  std::vector<int> idx(size_t(nd), 0);
  for (size_t r = 0; r < rows; r++) {
    int64_t off = 0;
    for (int d = 0; d < nd - 1; d++) off += int64_t(idx[size_t(d)]) * strides[size_t(d)];
    fn(r, base + off, idx);
    for (int d = nd - 2; d >= 0; d--) {
      if (++idx[size_t(d)] < shape[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm: y = (x * rsqrt(mean(x^2) + eps)) * w, rounded as the fallback rounds (float32).

void rms_norm(const mx::array& x, const mx::array* w, float eps, mx::array& out) {
  const int D = x.shape().back();
  const int64_t ks = x.strides().back();
  const float* wp = w ? w->data<float>() : nullptr;
  float* o = out.data<float>();
  for_each_row(x, [&](size_t r, const float* row, const std::vector<int>&) {
    // Eight partial sums: one chain would wait on each add's latency.
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int k = 0;
    if (ks == 1)
      for (; k + 8 <= D; k += 8)
        for (int j = 0; j < 8; j++) part[j] += row[k + j] * row[k + j];
    for (; k < D; k++) part[k % 8] += row[k * ks] * row[k * ks];
    float ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    const float inv = 1.0f / std::sqrt(ss * (1.0f / float(D)) + eps);
    float* y = o + r * size_t(D);
    if (wp)
      for (int i = 0; i < D; i++) y[i] = (row[i * ks] * inv) * wp[i];
    else
      for (int i = 0; i < D; i++) y[i] = row[i * ks] * inv;
  });
}

class RmsNorm : public mx::Primitive {
 public:
  RmsNorm(mx::Stream s, float eps) : mx::Primitive(s), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    std::optional<mx::array> w;
    if (inputs.size() > 1) w = inputs[1];
    encoder.dispatch([x = inputs[0], w, out = mx::array::unsafe_weak_copy(out), eps = eps_]() mutable {
      rms_norm(x, w ? &*w : nullptr, eps, out);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("weft RmsNorm runs on the CPU");
  }
  const char* name() const override { return "WeftRmsNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const RmsNorm*>(&other);
    return o && o->eps_ == eps_;
  }

 private:
  float eps_;
};

// ---------------------------------------------------------------------------------------------
// The residual add and the next RMSNorm in one pass (a decoder layer's `h = x + r` and
// `norm(h)`): outputs h (the float32 sum, as MLX's add gives it) and the RMSNorm of h, with
// rms_norm's arithmetic, so both are bit for bit the separate ops' results. Saves the add's op
// (its dispatch and a pass over the rows) twice per layer.

// Offset of row `r` (row-major over all axes but the last) of an array with these strides.
int64_t row_offset(const mx::array& a, size_t r) {
  int64_t off = 0;
  const auto& shape = a.shape();
  for (int d = int(shape.size()) - 2; d >= 0; d--) {
    const size_t n = size_t(shape[size_t(d)]);
    off += int64_t(r % n) * a.strides()[size_t(d)];
    r /= n;
  }
  return off;
}

void add_rms_norm(const mx::array& x, const mx::array& res, const mx::array& w, float eps, mx::array& sum,
                  mx::array& out) {
  const int D = x.shape().back();
  const size_t rows = x.size() / size_t(D);
  const int64_t xs = x.strides().back(), rs = res.strides().back();
  const float* wp = w.data<float>();
  float* sp = sum.data<float>();
  float* o = out.data<float>();
  for (size_t r = 0; r < rows; r++) {
    const float* xr = x.data<float>() + row_offset(x, r);
    const float* rr = res.data<float>() + row_offset(res, r);
    float* h = sp + r * size_t(D);
    for (int i = 0; i < D; i++) h[i] = xr[i * xs] + rr[i * rs];
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int k = 0;
    for (; k + 8 <= D; k += 8)
      for (int j = 0; j < 8; j++) part[j] += h[k + j] * h[k + j];
    for (; k < D; k++) part[k % 8] += h[k] * h[k];
    float ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    const float inv = 1.0f / std::sqrt(ss * (1.0f / float(D)) + eps);
    float* y = o + r * size_t(D);
    for (int i = 0; i < D; i++) y[i] = (h[i] * inv) * wp[i];
  }
}

class AddRmsNorm : public mx::Primitive {
 public:
  AddRmsNorm(mx::Stream s, float eps) : mx::Primitive(s), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& o : outputs) o.set_data(mx::allocator::malloc(o.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.dispatch([x = inputs[0], r = inputs[1], w = inputs[2], sum = mx::array::unsafe_weak_copy(outputs[0]),
                      out = mx::array::unsafe_weak_copy(outputs[1]), eps = eps_]() mutable {
      add_rms_norm(x, r, w, eps, sum, out);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("weft AddRmsNorm runs on the CPU");
  }
  const char* name() const override { return "WeftAddRmsNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const AddRmsNorm*>(&other);
    return o && o->eps_ == eps_;
  }

 private:
  float eps_;
};

// ---------------------------------------------------------------------------------------------
// RoPE over the first `dims` features of x [..., L, D] at positions (offset + l) * scale, with
// inverse frequencies base^(-i / (dims / 2)) (as the fallback: exp(-i * log(base) / half)) or
// 1 / freqs[i]. Per-row offsets: one per index of x's first axis.

struct RopeParams {
  int dims;
  bool traditional;
  float base;  // NaN: use freqs
  float scale;
};

void rope(const mx::array& x, const RopeParams& p, const mx::array& offsets, const mx::array* freqs,
          mx::array& out) {
  const int nd = x.ndim();
  const int L = x.shape(nd - 2), D = x.shape(nd - 1);
  const int half = p.dims / 2;
  const int64_t ks = x.strides().back();
  std::vector<float> inv(static_cast<size_t>(half));
  if (freqs) {
    const float* f = freqs->data<float>();
    for (int i = 0; i < half; i++) inv[size_t(i)] = 1.0f / f[i];
  } else {
    const float c = std::log(p.base) / float(half);
    for (int i = 0; i < half; i++) inv[size_t(i)] = std::exp(float(-i) * c);
  }
  const int32_t* offs = offsets.data<int32_t>();
  const bool per_row = offsets.size() > 1;
  // cos / sin tables [L][half] for the current offset (rebuilt when it changes).
  std::vector<float> cs(size_t(L) * half), sn(size_t(L) * half);
  int64_t table_offset = INT64_MIN;
  float* o = out.data<float>();
  for_each_row(x, [&](size_t r, const float* row, const std::vector<int>& idx) {
    const int64_t off = per_row ? offs[idx[0]] : offs[0];
    if (off != table_offset) {
      for (int l = 0; l < L; l++) {
        const float pos = (float(l) + float(off)) * p.scale;
        for (int i = 0; i < half; i++) {
          const float t = pos * inv[size_t(i)];
          cs[size_t(l) * half + i] = std::cos(t);
          sn[size_t(l) * half + i] = std::sin(t);
        }
      }
      table_offset = off;
    }
    const int l = idx[size_t(nd - 2)];
    const float* c = cs.data() + size_t(l) * half;
    const float* s = sn.data() + size_t(l) * half;
    float* y = o + r * size_t(D);
    if (p.traditional) {
      for (int i = 0; i < half; i++) {
        const float x1 = row[(2 * i) * ks], x2 = row[(2 * i + 1) * ks];
        y[2 * i] = x1 * c[i] - x2 * s[i];
        y[2 * i + 1] = x1 * s[i] + x2 * c[i];
      }
    } else {
      for (int i = 0; i < half; i++) {
        const float x1 = row[i * ks], x2 = row[(half + i) * ks];
        y[i] = x1 * c[i] - x2 * s[i];
        y[half + i] = x1 * s[i] + x2 * c[i];
      }
    }
    for (int i = p.dims; i < D; i++) y[i] = row[i * ks];
  });
}

class Rope : public mx::Primitive {
 public:
  Rope(mx::Stream s, RopeParams p) : mx::Primitive(s), p_(p) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    std::optional<mx::array> freqs;
    if (inputs.size() > 2) freqs = inputs[2];
    encoder.dispatch([x = inputs[0], offsets = inputs[1], freqs, out = mx::array::unsafe_weak_copy(out),
                      p = p_]() mutable { rope(x, p, offsets, freqs ? &*freqs : nullptr, out); });
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("weft Rope runs on the CPU");
  }
  const char* name() const override { return "WeftRope"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const Rope*>(&other);
    return o && o->p_.dims == p_.dims && o->p_.traditional == p_.traditional &&
           (o->p_.base == p_.base || (std::isnan(o->p_.base) && std::isnan(p_.base))) &&
           o->p_.scale == p_.scale;
  }

 private:
  RopeParams p_;
};

// ---------------------------------------------------------------------------------------------
// Log-softmax over the last axis: y = x - (max + log(sum exp(x - max))), logsumexp's formula
// (an infinite max is the logsumexp itself). exp is Cephes' single-precision polynomial (a
// couple of ulps), four lanes at a time in GCC vector types (one SSE2 / NEON register on the
// baseline build), so the only difference from MLX is that rounding and the order of the sum.

#include "vec_exp.h"

// One contiguous row of D floats into y.
void log_softmax_row(const float* x, float* y, int D) {
  const float inf = std::numeric_limits<float>::infinity();
  int k = 0;
  float mx = -inf;
  if (D >= 8) {
    vf4 m0 = load4(x), m1 = load4(x + 4);
    for (k = 8; k + 8 <= D; k += 8) {
      const vf4 a = load4(x + k), b = load4(x + k + 4);
      m0 = a > m0 ? a : m0;
      m1 = b > m1 ? b : m1;
    }
    m0 = m1 > m0 ? m1 : m0;
    mx = std::max(std::max(m0[0], m0[1]), std::max(m0[2], m0[3]));
  }
  for (; k < D; k++) mx = std::max(mx, x[k]);
  float lse = mx;
  if (std::isfinite(mx)) {
    // Two accumulators: the exps are independent, the adds would chain.
    vf4 a0 = splat(0.0f), a1 = splat(0.0f);
    const vf4 vm = splat(mx);
    for (k = 0; k + 8 <= D; k += 8) {
      a0 += exp4(load4(x + k) - vm);
      a1 += exp4(load4(x + k + 4) - vm);
    }
    const vf4 acc = a0 + a1;
    float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (; k < D; k++) sum += std::exp(x[k] - mx);
    lse = mx + std::log(sum);
  }
  for (int i = 0; i < D; i++) y[i] = x[i] - lse;
}

struct LogSoftmaxJob {
  const float* x;
  float* y;
  int D;
};

void log_softmax_rows(void* ctx, int r) {
  auto* j = static_cast<LogSoftmaxJob*>(ctx);
  log_softmax_row(j->x + size_t(r) * j->D, j->y + size_t(r) * j->D, j->D);
}

class LogSoftmax : public mx::Primitive {
 public:
  explicit LogSoftmax(mx::Stream s) : mx::Primitive(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.dispatch([x = inputs[0], out = mx::array::unsafe_weak_copy(out)]() mutable {
      const int D = x.shape().back();
      const int rows = int(x.size() / size_t(D));
      float* o = out.data<float>();
      if (!x.flags().row_contiguous) {
        // A view (the last position of [B, L, V] logits): rows wherever they are.
        std::vector<float> tmp(x.strides().back() == 1 ? 0 : size_t(D));
        for_each_row(x, [&](size_t r, const float* row, const std::vector<int>&) {
          if (!tmp.empty()) {
            for (int i = 0; i < D; i++) tmp[size_t(i)] = row[int64_t(i) * x.strides().back()];
            row = tmp.data();
          }
          log_softmax_row(row, o + r * size_t(D), D);
        });
        return;
      }
      LogSoftmaxJob job{x.data<float>(), o, D};
      // One row (a B=1 step: ~50 us) runs here; a batch's rows go over the pool.
      if (rows == 1)
        log_softmax_rows(&job, 0);
      else
        weft_kernels::parallel_for(rows, log_softmax_rows, &job);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("weft LogSoftmax runs on the CPU");
  }
  const char* name() const override { return "WeftLogSoftmax"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const LogSoftmax*>(&other) != nullptr;
  }
};

bool on_cpu(const mx::Stream& s) { return s.device.type == mx::Device::DeviceType::cpu; }

// Weights, offsets and frequencies are normally evaluated and contiguous already: no extra op.
mx::array contiguous_input(const mx::array& a, const mx::Stream& s) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  return mx::contiguous(a, false, s);
}

}  // namespace
}  // namespace weft_row_ops

using namespace weft_row_ops;

extern "C" int weft_rms_norm(mlx_array* res, const mlx_array x, const mlx_array weight, float eps,
                             const mlx_stream stream) {
  try {
    const auto& xa = mlx_array_get_(x);
    const auto& st = mlx_stream_get_(stream);
    std::optional<mx::array> w;
    if (weight.ctx) w = mlx_array_get_(weight);
    const int D = xa.ndim() ? xa.shape().back() : 0;
    const bool ok = on_cpu(st) && xa.dtype() == mx::float32 && xa.ndim() >= 1 && D > 0 &&
                    (!w || (w->dtype() == mx::float32 && w->ndim() == 1 && w->shape(0) == D));
    if (!ok) {
      mlx_array_set_(*res, mx::fast::rms_norm(xa, w, eps, st));
      return 0;
    }
    std::vector<mx::array> inputs{xa};
    if (w) inputs.push_back(contiguous_input(*w, st));
    mlx_array_set_(*res, mx::array(xa.shape(), mx::float32, std::make_shared<RmsNorm>(st, eps), inputs));
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

extern "C" int weft_rope(mlx_array* res, const mlx_array x, int dims, int traditional, float base,
                         float scale, const mlx_array offset, const mlx_array freqs,
                         const mlx_stream stream) {
  try {
    const auto& xa = mlx_array_get_(x);
    const auto& oa = mlx_array_get_(offset);
    const auto& st = mlx_stream_get_(stream);
    std::optional<mx::array> fa;
    if (freqs.ctx) fa = mlx_array_get_(freqs);
    const std::optional<float> base_opt = std::isnan(base) ? std::nullopt : std::optional<float>(base);
    const int nd = xa.ndim();
    const bool offsets_ok = (oa.dtype() == mx::int32 || oa.dtype() == mx::uint32) &&
                            (oa.size() == 1 || (oa.ndim() == 1 && nd >= 3 && oa.shape(0) == xa.shape(0)));
    const bool ok = on_cpu(st) && xa.dtype() == mx::float32 && nd >= 3 && dims > 0 && dims % 2 == 0 &&
                    dims <= xa.shape(-1) && offsets_ok && (fa.has_value() != base_opt.has_value()) &&
                    (!fa || (fa->dtype() == mx::float32 && fa->size() == size_t(dims / 2)));
    if (!ok) {
      mlx_array_set_(*res, mx::fast::rope(xa, dims, traditional != 0, base_opt, scale, oa, fa, st));
      return 0;
    }
    std::vector<mx::array> inputs{xa, contiguous_input(oa.dtype() == mx::int32 ? oa : mx::astype(oa, mx::int32, st), st)};
    if (fa) inputs.push_back(contiguous_input(*fa, st));
    auto prim = std::make_shared<Rope>(st, RopeParams{dims, traditional != 0, base, scale});
    mlx_array_set_(*res, mx::array(xa.shape(), mx::float32, prim, inputs));
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

extern "C" int weft_add_rms_norm(mlx_array* sum, mlx_array* res, const mlx_array x, const mlx_array residual,
                                 const mlx_array weight, float eps, const mlx_stream stream) {
  try {
    const auto& xa = mlx_array_get_(x);
    const auto& ra = mlx_array_get_(residual);
    const auto& wa = mlx_array_get_(weight);
    const auto& st = mlx_stream_get_(stream);
    const int D = xa.ndim() ? xa.shape().back() : 0;
    const bool ok = on_cpu(st) && xa.dtype() == mx::float32 && ra.dtype() == mx::float32 && xa.shape() == ra.shape() &&
                    D > 0 && wa.dtype() == mx::float32 && wa.ndim() == 1 && wa.shape(0) == D;
    if (!ok) {
      auto h = mx::add(xa, ra, st);
      mlx_array_set_(*res, mx::fast::rms_norm(h, wa, eps, st));
      mlx_array_set_(*sum, h);
      return 0;
    }
    auto outs = mx::array::make_arrays({xa.shape(), xa.shape()}, {mx::float32, mx::float32},
                                       std::make_shared<AddRmsNorm>(st, eps), {xa, ra, contiguous_input(wa, st)});
    mlx_array_set_(*sum, outs[0]);
    mlx_array_set_(*res, outs[1]);
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

extern "C" int weft_log_softmax(mlx_array* res, const mlx_array x, const mlx_stream stream) {
  try {
    const auto& xa = mlx_array_get_(x);
    const auto& st = mlx_stream_get_(stream);
    const bool ok = on_cpu(st) && xa.dtype() == mx::float32 && xa.ndim() >= 1 && xa.shape().back() > 0;
    if (!ok) {
      mlx_array_set_(*res, mx::subtract(xa, mx::logsumexp(xa, -1, true, st), st));
      return 0;
    }
    mlx_array_set_(*res, mx::array(xa.shape(), mx::float32, std::make_shared<LogSoftmax>(st), {xa}));
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

extern "C" const char* weft_row_ops_last_error(void) { return last_error.c_str(); }
