#pragma once
// The argument checks shared by dp::Backend's public ops (the contract_*.cpp files): a Checker
// names the backend, the op and the argument in every message ("cpu backend: conv_forward: x has
// shape ..."), and the helpers check what several ops share. Internal to libdpcore.
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "dp/backend.hpp"
#include "dp/error.hpp"

namespace dp::checks {

/// The argument checks of one op call: each names the op and the argument in its message.
class Checker {
 public:
  Checker(const Backend& backend, const char* op)
      : prefix_(backend.name() + " backend: " + op + ": "), device_(backend.device()) {}

  [[noreturn]] void fail(const std::string& message) const { throw Error(prefix_ + message); }

  /// dtype, data (may be null only when there are no elements) and device.
  void tensor(const Tensor& t, DType dtype, const char* what) const {
    if (t.dtype != dtype) {
      fail(std::string(what) + " must be " + dtype_name(dtype) + ", got " + dtype_name(t.dtype));
    }
    if (t.data == nullptr && t.numel() > 0) fail(std::string(what) + " has no data (null pointer)");
    if (t.data != nullptr && !(t.device == device_)) {
      fail(std::string(what) + " lives on " + t.device.str() + " but this backend computes on " +
           device_.str() + "; allocate it with this backend");
    }
  }

  void shape(const Tensor& t, const Shape& expected, const char* what) const {
    if (t.shape != expected) {
      fail(std::string(what) + " has shape " + t.shape.str() + ", expected " + expected.str());
    }
  }

  /// An f32 tensor of exactly `expected` shape.
  void f32(const Tensor& t, const Shape& expected, const char* what) const {
    tensor(t, DType::f32, what);
    shape(t, expected, what);
  }

  /// A rank-4 activation of `dtype` (or rank 2 when allowed); returns its shape.
  Shape activation(const Tensor& t, const char* what, bool allow_rank2 = false,
                   DType dtype = DType::f32) const {
    tensor(t, dtype, what);
    if (t.shape.rank != 4 && !(allow_rank2 && t.shape.rank == 2)) {
      fail(std::string(what) + " has shape " + t.shape.str() + ", expected (N, C, H, W)" +
           (allow_rank2 ? " or (N, C)" : ""));
    }
    return t.shape;
  }

  /// `t` has the shape and (for rank 4) the layout of `like`, and is f32.
  void like(const Tensor& t, const Tensor& like, const char* what, const char* like_name) const {
    tensor(t, DType::f32, what);
    if (t.shape != like.shape) {
      fail(std::string(what) + " has shape " + t.shape.str() + " but " + like_name + " has " +
           like.shape.str() + "; they must match");
    }
    same_layout(t, like, what, like_name);
  }

  void same_layout(const Tensor& t, const Tensor& like, const char* what,
                   const char* like_name) const {
    if (t.shape.rank == 4 && like.shape.rank == 4 && t.layout != like.layout) {
      fail(std::string(what) + " is " + layout_name(t.layout) + " but " + like_name + " is " +
           layout_name(like.layout) + "; both must share one layout (convert explicitly)");
    }
  }

  void optional_f32(const Tensor* t, const Shape& expected, const char* what) const {
    if (t != nullptr) f32(*t, expected, what);
  }

  void finite(float v, const char* what) const {
    if (!std::isfinite(v)) fail(std::string(what) + " must be finite, got " + std::to_string(v));
  }

  void pointers(const void* dst, const void* src, size_t bytes) const {
    if (bytes > 0 && (dst == nullptr || src == nullptr)) {
      fail("a copy of " + std::to_string(bytes) + " bytes needs two non-null pointers");
    }
  }

 private:
  std::string prefix_;
  Device device_;
};

inline void plan_layout(const Checker& check, const ConvGeometry& g, const Tensor& t,
                        const char* what) {
  if (t.layout != g.layout) {
    check.fail(std::string(what) + " is " + layout_name(t.layout) + " but the plan is " +
               layout_name(g.layout));
  }
}

/// An activation of a convolution plan: (N <= max_batch, c, h, w) in the plan's layout.
/// Returns N.
inline int64_t plan_activation(const Checker& check, const ConvGeometry& g, const Tensor& t,
                               int64_t c, int64_t h, int64_t w, const char* what,
                               DType dtype = DType::f32) {
  const Shape s = check.activation(t, what, false, dtype);
  if (s[1] != c || s[2] != h || s[3] != w || s[0] > g.max_batch) {
    check.fail(std::string(what) + " has shape " + s.str() +
               ", expected (N <= " + std::to_string(g.max_batch) + ", " + std::to_string(c) + ", " +
               std::to_string(h) + ", " + std::to_string(w) + ") for the plan " + g.str());
  }
  plan_layout(check, g, t, what);
  return s[0];
}

inline Shape filter_shape(const ConvGeometry& g) {
  return {g.out_channels, g.in_channels, g.kernel_h, g.kernel_w};
}

/// The pooling window and the (N,C,H,W) input `in` / (N,C,P,Q) output `out` of one layout.
inline void check_pool(const Checker& check, const PoolGeometry& g, const Tensor& in,
                       const Tensor& out, const char* in_name, const char* out_name) {
  if (g.kernel_h < 1 || g.kernel_w < 1 || g.stride_h < 1 || g.stride_w < 1 || g.pad_h < 0 ||
      g.pad_w < 0 || 2 * g.pad_h > g.kernel_h || 2 * g.pad_w > g.kernel_w) {
    check.fail("pooling window " + std::to_string(g.kernel_h) + "x" + std::to_string(g.kernel_w) +
               " stride " + std::to_string(g.stride_h) + "x" + std::to_string(g.stride_w) +
               " pad " + std::to_string(g.pad_h) + "x" + std::to_string(g.pad_w) +
               " is invalid: kernel and stride must be >= 1, and padding at most half the kernel "
               "(never negative)");
  }
  const Shape x = check.activation(in, in_name);
  // Not just P, Q >= 1: C++ division truncates, so H + 2*pad - kernel in (-stride, 0) gives
  // P = 1 with a window that overhangs the padded input (PyTorch refuses it too).
  if (x[2] + 2 * g.pad_h < g.kernel_h || x[3] + 2 * g.pad_w < g.kernel_w) {
    check.fail(std::string(in_name) + " of shape " + x.str() +
               " is smaller than the pooling window " + std::to_string(g.kernel_h) + "x" +
               std::to_string(g.kernel_w) + " (padding " + std::to_string(g.pad_h) + "x" +
               std::to_string(g.pad_w) + ")");
  }
  check.f32(out, {x[0], x[1], g.out_h(x[2]), g.out_w(x[3])}, out_name);
  check.same_layout(out, in, out_name, in_name);
}

/// logits (N, K >= 1) f32, labels (N) i32, correct (1) i32 (a table when slotted: checked by
/// slot_tables). Returns N.
inline int64_t check_logits(const Checker& check, const Tensor& logits, const Tensor& labels,
                            const Tensor& correct, bool slotted) {
  check.tensor(logits, DType::f32, "logits");
  if (logits.shape.rank != 2 || logits.shape[1] < 1) {
    check.fail("logits has shape " + logits.shape.str() + ", expected (N, K) with K >= 1");
  }
  const int64_t n = logits.shape[0];
  check.tensor(labels, DType::i32, "labels");
  check.shape(labels, {n}, "labels");
  check.tensor(correct, DType::i32, "correct");
  if (!slotted) check.shape(correct, {1}, "correct");
  return n;
}

/// A per-channel vector (C) f32.
inline void channel_vectors(const Checker& check, int64_t c,
                            std::initializer_list<std::pair<const Tensor*, const char*>> vectors) {
  for (const auto& [t, what] : vectors) check.f32(*t, {c}, what);
}

/// Values per channel of a batch-norm input: N*H*W (N for rank 2).
inline int64_t per_channel(const Shape& s) { return s.rank == 4 ? s[0] * s[2] * s[3] : s[0]; }

// An optional argument kept by value inside a recorded op: the caller's object may be gone when
// the recording replays (Backend::run copies every argument into the op).
template <class T>
class Held {
 public:
  explicit Held(const T* t) : has_(t != nullptr) {
    if (t != nullptr) value_ = *t;
  }
  const T* get() const { return has_ ? &value_ : nullptr; }

 private:
  bool has_;
  T value_{};
};

struct HeldEpilogue {
  explicit HeldEpilogue(const BnEpilogue& e)
      : residual(e.residual), relu(e.relu), conv_bias(e.conv_bias) {}
  BnEpilogue get() const { return {residual.get(), relu, conv_bias.get()}; }
  Held<Tensor> residual;
  bool relu;
  Held<Tensor> conv_bias;
};

struct HeldEpilogueGrad {
  explicit HeldEpilogueGrad(const BnEpilogueGrad& e) : y(e.y), dz(e.dz) {}
  BnEpilogueGrad get() const { return {y.get(), dz.get()}; }
  Held<Tensor> y, dz;
};

/// A StepRow's table (rows, width) of `dtype` and its cursor (1) i32.
inline void step_row(const Checker& check, const StepRow& row, DType dtype, int64_t width,
                     const char* what) {
  const std::string name(what);
  check.tensor(row.table, dtype, (name + " table").c_str());
  if (row.table.shape.rank != 2 || row.table.shape[1] != width || row.table.shape[0] < 1) {
    check.fail(name + " table has shape " + row.table.shape.str() + ", expected (steps >= 1, " +
               std::to_string(width) + ")");
  }
  check.tensor(row.cursor, DType::i32, (name + " cursor").c_str());
  check.shape(row.cursor, {1}, (name + " cursor").c_str());
}

/// A slot (1) i32 and the tables it indexes, each (S) of its dtype.
inline void slot_tables(const Checker& check, const Tensor& slot,
                        std::initializer_list<std::pair<const Tensor*, const char*>> tables) {
  check.tensor(slot, DType::i32, "slot");
  check.shape(slot, {1}, "slot");
  for (const auto& [t, what] : tables) {
    if (t->shape.rank != 1 || t->shape[0] < 1) {
      check.fail(std::string(what) + " has shape " + t->shape.str() +
                 ", expected (S >= 1): with a slot it is a table");
    }
  }
}

}  // namespace dp::checks
