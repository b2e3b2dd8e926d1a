// The public ops of dp::Backend: every argument is checked here, once for every backend, then the
// backend's *_impl runs (the tiny-cuda-nn pattern). Empty batches are handled here too, so no
// backend needs its own rule for them. Errors read "<backend> backend: <op>: <what is wrong>".
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "dp/backend.hpp"
#include "dp/error.hpp"

namespace dp {

namespace {

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

  /// A rank-4 f32 activation (or rank 2 when allowed); returns its shape.
  Shape activation(const Tensor& t, const char* what, bool allow_rank2 = false) const {
    tensor(t, DType::f32, what);
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

void plan_layout(const Checker& check, const ConvGeometry& g, const Tensor& t, const char* what) {
  if (t.layout != g.layout) {
    check.fail(std::string(what) + " is " + layout_name(t.layout) + " but the plan is " +
               layout_name(g.layout));
  }
}

/// An activation of a convolution plan: (N <= max_batch, c, h, w) in the plan's layout.
/// Returns N.
int64_t plan_activation(const Checker& check, const ConvGeometry& g, const Tensor& t, int64_t c,
                        int64_t h, int64_t w, const char* what) {
  const Shape s = check.activation(t, what);
  if (s[1] != c || s[2] != h || s[3] != w || s[0] > g.max_batch) {
    check.fail(std::string(what) + " has shape " + s.str() +
               ", expected (N <= " + std::to_string(g.max_batch) + ", " + std::to_string(c) + ", " +
               std::to_string(h) + ", " + std::to_string(w) + ") for the plan " + g.str());
  }
  plan_layout(check, g, t, what);
  return s[0];
}

Shape filter_shape(const ConvGeometry& g) {
  return {g.out_channels, g.in_channels, g.kernel_h, g.kernel_w};
}

/// The pooling window and the (N,C,H,W) input `in` / (N,C,P,Q) output `out` of one layout.
void check_pool(const Checker& check, const PoolGeometry& g, const Tensor& in, const Tensor& out,
                const char* in_name, const char* out_name) {
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
int64_t check_logits(const Checker& check, const Tensor& logits, const Tensor& labels,
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
void channel_vectors(const Checker& check, int64_t c,
                     std::initializer_list<std::pair<const Tensor*, const char*>> vectors) {
  for (const auto& [t, what] : vectors) check.f32(*t, {c}, what);
}

/// Values per channel of a batch-norm input: N*H*W (N for rank 2).
int64_t per_channel(const Shape& s) { return s.rank == 4 ? s[0] * s[2] * s[3] : s[0]; }

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
  explicit HeldEpilogue(const BnEpilogue& e) : residual(e.residual), relu(e.relu) {}
  BnEpilogue get() const { return {residual.get(), relu}; }
  Held<Tensor> residual;
  bool relu;
};

struct HeldEpilogueGrad {
  explicit HeldEpilogueGrad(const BnEpilogueGrad& e) : y(e.y), dz(e.dz) {}
  BnEpilogueGrad get() const { return {y.get(), dz.get()}; }
  Held<Tensor> y, dz;
};

/// A StepRow's table (rows, width) of `dtype` and its cursor (1) i32.
void step_row(const Checker& check, const StepRow& row, DType dtype, int64_t width,
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
void slot_tables(const Checker& check, const Tensor& slot,
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

}  // namespace

std::string Backend::prefix(const char* op) const { return name() + " backend: " + op + ": "; }

// ---- step capture -------------------------------------------------------------------------------

class Backend::Recording final : public CapturedOps {
 public:
  size_t ops() const override { return ops_.size(); }
  void add(std::function<void()> op) { ops_.push_back(std::move(op)); }
  void run() const {
    for (const auto& op : ops_) op();
  }

 private:
  std::vector<std::function<void()>> ops_;
};

Backend::Backend() = default;
Backend::~Backend() = default;

void Backend::record(std::function<void()> op) { recording_->add(std::move(op)); }

void Backend::refuse_while_capturing(const char* what) const {
  if (capturing_) {
    throw Error(prefix(what) +
                "called while a step is being captured: it needs the host, and a captured step "
                "replays without it (do it before begin_capture or after end_capture)");
  }
}

void Backend::begin_capture() {
  refuse_while_capturing("begin_capture");
  if (native_capture()) {
    begin_capture_impl();
  } else {
    recording_ = std::make_unique<Recording>();
  }
  capturing_ = true;
}

std::unique_ptr<CapturedOps> Backend::end_capture() {
  if (!capturing_) throw Error(prefix("end_capture") + "no capture was begun");
  capturing_ = false;
  std::unique_ptr<CapturedOps> ops =
      native_capture() ? end_capture_impl() : std::unique_ptr<CapturedOps>(std::move(recording_));
  ops->owner_ = this;
  return ops;
}

void Backend::discard_capture() noexcept {
  if (!capturing_) return;
  capturing_ = false;
  if (native_capture()) {
    discard_capture_impl();
  } else {
    recording_.reset();
  }
}

void Backend::replay(const CapturedOps& ops) {
  refuse_while_capturing("replay");
  if (ops.owner_ != this) {
    throw Error(prefix("replay") +
                "the step was captured by another backend; replay it on the one that captured it");
  }
  if (native_capture()) {
    replay_impl(ops);
  } else {
    static_cast<const Recording&>(ops).run();
  }
}

void Backend::host_work(std::function<void()> work) {
  if (capturing_ && native_capture()) {
    throw Error(prefix("host_work") +
                "host work cannot be part of a captured step on this backend (its capture is the "
                "device's own, a CUDA graph)");
  }
  run(std::move(work));
}

// ---- memory -------------------------------------------------------------------------------------

void* Backend::allocate(size_t bytes) {
  refuse_while_capturing("allocate");
  return allocate_impl(bytes);
}

void Backend::synchronize() {
  refuse_while_capturing("synchronize");
  synchronize_impl();
}

void Backend::upload(void* dst, const void* host_src, size_t bytes) {
  refuse_while_capturing("upload");
  Checker(*this, "upload").pointers(dst, host_src, bytes);
  if (bytes > 0) upload_impl(dst, host_src, bytes);
}

void Backend::download(void* host_dst, const void* src, size_t bytes) {
  refuse_while_capturing("download");
  Checker(*this, "download").pointers(host_dst, src, bytes);
  if (bytes > 0) download_impl(host_dst, src, bytes);
}

void Backend::copy(void* dst, const void* src, size_t bytes) {
  Checker(*this, "copy").pointers(dst, src, bytes);
  if (bytes > 0 && dst != src) run([=, this] { copy_impl(dst, src, bytes); });
}

void Backend::fill(const Tensor& t, float value) {
  const Checker check(*this, "fill");
  if (t.dtype != DType::f32 && t.dtype != DType::i32) {
    check.fail(std::string("t must be f32 or i32, got ") + dtype_name(t.dtype));
  }
  check.tensor(t, t.dtype, "t");
  if (t.dtype == DType::i32) check.finite(value, "value");
  if (t.numel() > 0) run([=, this] { fill_impl(t, value); });
}

// ---- convolution --------------------------------------------------------------------------------

std::unique_ptr<ConvPlan> Backend::plan_conv(const ConvGeometry& g, const ConvUse& use) {
  refuse_while_capturing("plan_conv");
  const Checker check(*this, "plan_conv");
  if (g.max_batch < 1 || g.in_channels < 1 || g.in_h < 1 || g.in_w < 1 || g.out_channels < 1 ||
      g.kernel_h < 1 || g.kernel_w < 1 || g.stride_h < 1 || g.stride_w < 1 || g.pad_h < 0 ||
      g.pad_w < 0) {
    check.fail("every size must be positive and padding non-negative, got " + g.str());
  }
  // out_h() >= 1 is not enough: the division truncates toward zero.
  if (g.in_h + 2 * g.pad_h < g.kernel_h || g.in_w + 2 * g.pad_w < g.kernel_w) {
    check.fail("the kernel is larger than the padded input in " + g.str());
  }
  for (const auto* list : {&use.train_batches, &use.infer_batches}) {
    for (int64_t n : *list) {
      if (n < 1 || n > g.max_batch) {
        check.fail("batch size " + std::to_string(n) + " declared for " +
                   (use.layer.empty() ? std::string("the plan") : use.layer) +
                   " is outside [1, max_batch = " + std::to_string(g.max_batch) + "] of " +
                   g.str());
      }
    }
  }
  std::unique_ptr<ConvPlan> plan = plan_conv_impl(g, use);
  DP_ASSERT(plan != nullptr);
  plan->owner_ = this;
  return plan;
}

const ConvGeometry& Backend::check_plan(const ConvPlan& plan, const char* op) const {
  if (plan.owner_ != this) {
    throw Error(prefix(op) +
                "the plan was made by another backend; make it with this backend's plan_conv");
  }
  return plan.geometry();
}

void Backend::conv_forward(ConvPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                           const Tensor& y) {
  const char* op = "conv_forward";
  const ConvGeometry& g = check_plan(plan, op);
  const Checker check(*this, op);
  const int64_t n = plan_activation(check, g, x, g.in_channels, g.in_h, g.in_w, "x");
  check.f32(w, filter_shape(g), "w");
  check.optional_f32(b, {g.out_channels}, "b");
  check.f32(y, {n, g.out_channels, g.out_h(), g.out_w()}, "y");
  plan_layout(check, g, y, "y");
  if (n > 0) run([=, this, &plan, hb = Held(b)] { conv_forward_impl(plan, x, w, hb.get(), y); });
}

void Backend::conv_backward_data(ConvPlan& plan, const Tensor& dy, const Tensor& w,
                                 const Tensor& dx) {
  const char* op = "conv_backward_data";
  const ConvGeometry& g = check_plan(plan, op);
  const Checker check(*this, op);
  const int64_t n = plan_activation(check, g, dy, g.out_channels, g.out_h(), g.out_w(), "dy");
  check.f32(w, filter_shape(g), "w");
  check.f32(dx, {n, g.in_channels, g.in_h, g.in_w}, "dx");
  plan_layout(check, g, dx, "dx");
  if (n > 0) run([=, this, &plan] { conv_backward_data_impl(plan, dy, w, dx); });
}

void Backend::conv_backward_filter(ConvPlan& plan, const Tensor& x, const Tensor& dy,
                                   const Tensor& dw, const Tensor* db) {
  const char* op = "conv_backward_filter";
  const ConvGeometry& g = check_plan(plan, op);
  const Checker check(*this, op);
  const int64_t n = plan_activation(check, g, x, g.in_channels, g.in_h, g.in_w, "x");
  check.f32(dy, {n, g.out_channels, g.out_h(), g.out_w()}, "dy");
  plan_layout(check, g, dy, "dy");
  check.f32(dw, filter_shape(g), "dw");
  check.optional_f32(db, {g.out_channels}, "db");
  run([=, this, &plan, hdb = Held(db)] {
    if (n > 0) {
      conv_backward_filter_impl(plan, x, dy, dw, hdb.get());
    } else {  // the sum over no examples
      fill_impl(dw, 0.0f);
      if (hdb.get() != nullptr) fill_impl(*hdb.get(), 0.0f);
    }
  });
}

// ---- linear -------------------------------------------------------------------------------------

namespace {
struct LinearDims {
  int64_t n, in, out;
};

LinearDims check_linear(const Checker& check, const Tensor& x, const Tensor& w) {
  check.tensor(x, DType::f32, "x");
  check.tensor(w, DType::f32, "w");
  if (x.shape.rank != 2 || w.shape.rank != 2 || x.shape[1] != w.shape[1]) {
    check.fail("x has shape " + x.shape.str() + " and w has shape " + w.shape.str() +
               ", expected x (N, IN) and w (OUT, IN) with the same IN (flatten x first)");
  }
  return {x.shape[0], x.shape[1], w.shape[0]};
}
}  // namespace

void Backend::prepare_linear(int64_t max_batch, int64_t in, int64_t out) {
  refuse_while_capturing("prepare_linear");
  const Checker check(*this, "prepare_linear");
  if (max_batch < 1 || in < 1 || out < 1) {
    check.fail("max_batch, in and out must be >= 1, got " + std::to_string(max_batch) + ", " +
               std::to_string(in) + ", " + std::to_string(out));
  }
  prepare_linear_impl(max_batch, in, out);
}

void Backend::prepare_batchnorm(const Shape& max_input, Layout layout) {
  refuse_while_capturing("prepare_batchnorm");
  const Checker check(*this, "prepare_batchnorm");
  if (max_input.rank != 4 && max_input.rank != 2) {
    check.fail("expected an (N, C, H, W) or (N, C) input, got " + max_input.str());
  }
  for (int i = 0; i < max_input.rank; ++i) {
    if (max_input[i] < 1) check.fail("every dimension must be >= 1, got " + max_input.str());
  }
  prepare_batchnorm_impl(max_input, layout);
}

void Backend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y) {
  const Checker check(*this, "linear_forward");
  const LinearDims d = check_linear(check, x, w);
  check.optional_f32(b, {d.out}, "b");
  check.f32(y, {d.n, d.out}, "y");
  if (d.n > 0) run([=, this, hb = Held(b)] { linear_forward_impl(x, w, hb.get(), y); });
}

void Backend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor* dx,
                              const Tensor& dw, const Tensor* db) {
  const Checker check(*this, "linear_backward");
  const LinearDims d = check_linear(check, x, w);
  check.f32(dy, {d.n, d.out}, "dy");
  check.optional_f32(dx, {d.n, d.in}, "dx");
  check.f32(dw, {d.out, d.in}, "dw");
  check.optional_f32(db, {d.out}, "db");
  run([=, this, hdx = Held(dx), hdb = Held(db), n = d.n] {
    if (n > 0) {
      linear_backward_impl(x, w, dy, hdx.get(), dw, hdb.get());
    } else {  // sums over no examples
      fill_impl(dw, 0.0f);
      if (hdb.get() != nullptr) fill_impl(*hdb.get(), 0.0f);
    }
  });
}

// ---- batch norm ---------------------------------------------------------------------------------

namespace {
void check_count(const Checker& check, int64_t count) {
  if (count < 2) {
    check.fail("count is " + std::to_string(count) +
               ": batch norm in training needs more than one value per channel over every "
               "replica; use a larger batch");
  }
}
void check_eps(const Checker& check, float eps) {
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    check.fail("eps must be positive, got " + std::to_string(eps));
  }
}
void check_momentum_eps(const Checker& check, float momentum, float eps) {
  if (!(momentum >= 0.0f && momentum <= 1.0f)) {
    check.fail("momentum must be in [0, 1], got " + std::to_string(momentum));
  }
  check_eps(check, eps);
}
bool same_data(const Tensor& a, const Tensor& b) {
  return a.data != nullptr && a.data == b.data && a.numel() > 0;
}
void check_epilogue(const Checker& check, const BnEpilogue& e, const Tensor& x, const Tensor& y) {
  if (e.residual == nullptr) return;
  check.like(*e.residual, x, "residual", "x");
  if (same_data(*e.residual, y)) {
    check.fail("the epilogue's residual and y share their data; y must be another tensor");
  }
}
void check_epilogue_grad(const Checker& check, const BnEpilogueGrad& e, const Tensor& x,
                         const Tensor& dy) {
  if ((e.y == nullptr) != (e.dz == nullptr)) {
    check.fail(std::string("the ReLU epilogue's gradient needs both y (the forward's output) and "
                           "dz (where the masked gradient goes); got only ") +
               (e.y != nullptr ? "y" : "dz"));
  }
  if (e.y == nullptr) return;
  check.like(*e.y, x, "epilogue y", "x");
  check.like(*e.dz, x, "dz", "x");
  for (const auto& [t, name] :
       {std::pair{&dy, "dy"}, std::pair{e.y, "epilogue y"}, std::pair{&x, "x"}}) {
    if (same_data(*e.dz, *t)) {
      check.fail(std::string("dz and ") + name + " share their data; dz must be another tensor");
    }
  }
}
}  // namespace

void Backend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var,
                                      float momentum, float eps, const Tensor& save_mean,
                                      const Tensor& save_invstd, const Tensor& y,
                                      const BnEpilogue& epilogue) {
  const Checker check(*this, "batchnorm_forward_train");
  const Shape s = check.activation(x, "x", /*allow_rank2=*/true);
  check.like(y, x, "y", "x");
  check_epilogue(check, epilogue, x, y);
  channel_vectors(check, s[1],
                  {{&gamma, "gamma"},
                   {&beta, "beta"},
                   {&running_mean, "running_mean"},
                   {&running_var, "running_var"},
                   {&save_mean, "save_mean"},
                   {&save_invstd, "save_invstd"}});
  check_momentum_eps(check, momentum, eps);
  if (per_channel(s) < 2) {
    check.fail("x has shape " + s.str() +
               ": batch norm in training needs more than one value per channel (N*H*W > 1), as "
               "PyTorch; use a larger batch per replica");
  }
  run([=, this, e = HeldEpilogue(epilogue)] {
    batchnorm_forward_train_impl(x, gamma, beta, running_mean, running_var, momentum, eps,
                                 save_mean, save_invstd, y, e.get());
  });
}

void Backend::batchnorm_forward_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var,
                                      float eps, const Tensor& y, const BnEpilogue& epilogue) {
  const Checker check(*this, "batchnorm_forward_infer");
  const Shape s = check.activation(x, "x", /*allow_rank2=*/true);
  check.like(y, x, "y", "x");
  check_epilogue(check, epilogue, x, y);
  channel_vectors(check, s[1],
                  {{&gamma, "gamma"},
                   {&beta, "beta"},
                   {&running_mean, "running_mean"},
                   {&running_var, "running_var"}});
  check_eps(check, eps);
  if (s[0] > 0) {
    run([=, this, e = HeldEpilogue(epilogue)] {
      batchnorm_forward_infer_impl(x, gamma, beta, running_mean, running_var, eps, y, e.get());
    });
  }
}

void Backend::batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                 const Tensor& save_mean, const Tensor& save_invstd, float eps,
                                 const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                                 const BnEpilogueGrad& epilogue) {
  const Checker check(*this, "batchnorm_backward");
  const Shape s = check.activation(x, "x", /*allow_rank2=*/true);
  check.like(dy, x, "dy", "x");
  check.like(dx, x, "dx", "x");
  check_epilogue_grad(check, epilogue, x, dy);
  channel_vectors(check, s[1],
                  {{&gamma, "gamma"},
                   {&save_mean, "save_mean"},
                   {&save_invstd, "save_invstd"},
                   {&dgamma, "dgamma"},
                   {&dbeta, "dbeta"}});
  check_eps(check, eps);
  if (per_channel(s) < 2) {
    check.fail("x has shape " + s.str() +
               ": batch norm in training needs more than one value per channel (N*H*W > 1)");
  }
  run([=, this, e = HeldEpilogueGrad(epilogue)] {
    batchnorm_backward_impl(x, dy, gamma, save_mean, save_invstd, eps, dx, dgamma, dbeta, e.get());
  });
}

// ---- batch norm with statistics over every replica ----------------------------------------------

void Backend::batchnorm_sums(const Tensor& x, const Tensor* mean, const Tensor& sums) {
  const Checker check(*this, "batchnorm_sums");
  const Shape s = check.activation(x, "x", /*allow_rank2=*/true);
  check.optional_f32(mean, {s[1]}, "mean");
  check.f32(sums, {s[1]}, "sums");
  // Also for N = 0: the sums are then zero.
  run([=, this, hm = Held(mean)] { batchnorm_sums_impl(x, hm.get(), sums); });
}

void Backend::batchnorm_apply_stats(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    const Tensor& mean, const Tensor& var,
                                    const Tensor& running_mean, const Tensor& running_var,
                                    float momentum, float eps, int64_t count,
                                    const Tensor& save_mean, const Tensor& save_invstd,
                                    const Tensor& y, const BnEpilogue& epilogue) {
  const Checker check(*this, "batchnorm_apply_stats");
  const Shape s = check.activation(x, "x", /*allow_rank2=*/true);
  check.like(y, x, "y", "x");
  check_epilogue(check, epilogue, x, y);
  channel_vectors(check, s[1],
                  {{&gamma, "gamma"},
                   {&beta, "beta"},
                   {&mean, "mean"},
                   {&var, "var"},
                   {&running_mean, "running_mean"},
                   {&running_var, "running_var"},
                   {&save_mean, "save_mean"},
                   {&save_invstd, "save_invstd"}});
  check_momentum_eps(check, momentum, eps);
  check_count(check, count);
  if (per_channel(s) > count) {
    check.fail("x holds " + std::to_string(per_channel(s)) +
               " values per channel, more than "
               "the count of every replica's, " +
               std::to_string(count));
  }
  // Runs for N = 0 too: the running statistics and saved statistics are still written.
  run([=, this, e = HeldEpilogue(epilogue)] {
    batchnorm_apply_stats_impl(x, gamma, beta, mean, var, running_mean, running_var, momentum, eps,
                               count, save_mean, save_invstd, y, e.get());
  });
}

void Backend::batchnorm_backward_sums(const Tensor& x, const Tensor& dy, const Tensor& save_mean,
                                      const Tensor& save_invstd, const Tensor& sums,
                                      const BnEpilogueGrad& epilogue) {
  const Checker check(*this, "batchnorm_backward_sums");
  const Shape s = check.activation(x, "x", /*allow_rank2=*/true);
  check.like(dy, x, "dy", "x");
  check_epilogue_grad(check, epilogue, x, dy);
  channel_vectors(check, s[1], {{&save_mean, "save_mean"}, {&save_invstd, "save_invstd"}});
  check.f32(sums, {2 * s[1]}, "sums");
  run([=, this, e = HeldEpilogueGrad(epilogue)] {
    batchnorm_backward_sums_impl(x, dy, save_mean, save_invstd, sums, e.get());
  });
}

void Backend::batchnorm_backward_apply(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                       const Tensor& save_mean, const Tensor& save_invstd,
                                       const Tensor& sums, int64_t count, const Tensor& dx) {
  const Checker check(*this, "batchnorm_backward_apply");
  const Shape s = check.activation(x, "x", /*allow_rank2=*/true);
  check.like(dy, x, "dy", "x");
  check.like(dx, x, "dx", "x");
  channel_vectors(check, s[1],
                  {{&gamma, "gamma"}, {&save_mean, "save_mean"}, {&save_invstd, "save_invstd"}});
  check.f32(sums, {2 * s[1]}, "sums");
  check_count(check, count);
  if (s[0] > 0) {
    run([=, this] {
      batchnorm_backward_apply_impl(x, dy, gamma, save_mean, save_invstd, sums, count, dx);
    });
  }
}

// ---- activation and elementwise -----------------------------------------------------------------

void Backend::relu_forward(const Tensor& x, const Tensor& y) {
  const Checker check(*this, "relu_forward");
  check.tensor(x, DType::f32, "x");
  check.like(y, x, "y", "x");
  if (x.numel() > 0) run([=, this] { relu_forward_impl(x, y); });
}

void Backend::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const Checker check(*this, "relu_backward");
  check.tensor(y, DType::f32, "y");
  check.like(dy, y, "dy", "y");
  check.like(dx, y, "dx", "y");
  if (y.numel() > 0) run([=, this] { relu_backward_impl(y, dy, dx); });
}

void Backend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  const Checker check(*this, "add");
  check.tensor(a, DType::f32, "a");
  check.like(b, a, "b", "a");
  check.like(y, a, "y", "a");
  if (a.numel() > 0) run([=, this] { add_impl(a, b, y); });
}

void Backend::scale(const Tensor& t, float alpha) {
  const Checker check(*this, "scale");
  check.tensor(t, DType::f32, "t");
  if (t.numel() > 0) run([=, this] { scale_impl(t, alpha); });
}

// ---- pooling ------------------------------------------------------------------------------------

void Backend::avgpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y) {
  const Checker check(*this, "avgpool_forward");
  check_pool(check, g, x, y, "x", "y");
  if (x.numel() > 0) run([=, this] { avgpool_forward_impl(g, x, y); });
}

void Backend::avgpool_backward(const PoolGeometry& g, const Tensor& dy, const Tensor& dx) {
  const Checker check(*this, "avgpool_backward");
  check_pool(check, g, dx, dy, "dx", "dy");
  if (dx.numel() > 0) run([=, this] { avgpool_backward_impl(g, dy, dx); });
}

void Backend::maxpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y) {
  const Checker check(*this, "maxpool_forward");
  check_pool(check, g, x, y, "x", "y");
  if (x.numel() > 0) run([=, this] { maxpool_forward_impl(g, x, y); });
}

void Backend::maxpool_backward(const PoolGeometry& g, const Tensor& x, const Tensor& y,
                               const Tensor& dy, const Tensor& dx) {
  const Checker check(*this, "maxpool_backward");
  check_pool(check, g, x, y, "x", "y");
  check.like(dy, y, "dy", "y");
  check.like(dx, x, "dx", "x");
  if (x.numel() > 0) run([=, this] { maxpool_backward_impl(g, x, y, dy, dx); });
}

void Backend::global_avgpool_forward(const Tensor& x, const Tensor& y) {
  const Checker check(*this, "global_avgpool_forward");
  const Shape s = check.activation(x, "x");
  check.f32(y, {s[0], s[1], 1, 1}, "y");
  check.same_layout(y, x, "y", "x");
  if (x.numel() > 0) run([=, this] { global_avgpool_forward_impl(x, y); });
}

void Backend::global_avgpool_backward(const Tensor& dy, const Tensor& dx) {
  const Checker check(*this, "global_avgpool_backward");
  const Shape s = check.activation(dx, "dx");
  check.f32(dy, {s[0], s[1], 1, 1}, "dy");
  check.same_layout(dy, dx, "dy", "dx");
  if (dx.numel() > 0) run([=, this] { global_avgpool_backward_impl(dy, dx); });
}

// ---- loss and metrics ---------------------------------------------------------------------------

void Backend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                                    const Tensor& dlogits, const Tensor& loss_sum,
                                    const Tensor& correct, const Tensor* slot) {
  const Checker check(*this, "softmax_cross_entropy");
  check_logits(check, logits, labels, correct, slot != nullptr);
  check.f32(dlogits, logits.shape, "dlogits");
  check.tensor(loss_sum, DType::f32, "loss_sum");
  if (slot != nullptr) {
    slot_tables(check, *slot, {{&loss_sum, "loss_sum"}, {&correct, "correct"}});
    check.shape(loss_sum, correct.shape, "loss_sum");
  } else {
    check.shape(loss_sum, {1}, "loss_sum");
  }
  check.finite(grad_scale, "grad_scale");
  // Runs for N = 0 too (zeros are written), so an empty shard's slot is written where it says.
  run([=, this, hs = Held(slot)] {
    softmax_cross_entropy_impl(logits, labels, grad_scale, dlogits, loss_sum, correct, hs.get());
  });
}

void Backend::count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct,
                            const Tensor* slot) {
  const Checker check(*this, "count_correct");
  check_logits(check, logits, labels, correct, slot != nullptr);
  if (slot != nullptr) slot_tables(check, *slot, {{&correct, "correct"}});
  run([=, this, hs = Held(slot)] { count_correct_impl(logits, labels, correct, hs.get()); });
}

// ---- optimizer ----------------------------------------------------------------------------------

void Backend::sgd_update(const Tensor& params, const Tensor& grads, const Tensor* momentum_buf,
                         const SgdParams& p, const StepRow* lr_row) {
  const Checker check(*this, "sgd_update");
  check.tensor(params, DType::f32, "params");
  check.f32(grads, params.shape, "grads");
  for (const auto& [v, what] :
       {std::pair{p.lr, "lr"}, {p.momentum, "momentum"}, {p.weight_decay, "weight_decay"}}) {
    if (!(v >= 0.0f) || !std::isfinite(v)) {
      check.fail(std::string(what) + " must be finite and >= 0, got " + std::to_string(v));
    }
  }
  if (p.nesterov && p.momentum == 0.0f) {
    check.fail("Nesterov momentum needs a momentum above 0 (as PyTorch's SGD)");
  }
  if (p.momentum != 0.0f) {
    if (momentum_buf == nullptr) {
      check.fail("momentum is " + std::to_string(p.momentum) +
                 " but no momentum buffer was given; allocate one (zeroed) per parameter buffer");
    }
    check.f32(*momentum_buf, params.shape, "momentum_buf");
  }
  if (lr_row != nullptr) step_row(check, *lr_row, DType::f32, 1, "lr_row");
  if (params.numel() > 0) {
    run([=, this, hm = Held(momentum_buf), hr = Held(lr_row)] {
      sgd_update_impl(params, grads, hm.get(), p, hr.get());
    });
  }
}

void Backend::adamw_update(const Tensor& params, const Tensor& grads, const Tensor& exp_avg,
                           const Tensor& exp_avg_sq, const AdamWParams& p,
                           const StepRow* step_row_) {
  const Checker check(*this, "adamw_update");
  check.tensor(params, DType::f32, "params");
  check.f32(grads, params.shape, "grads");
  check.f32(exp_avg, params.shape, "exp_avg");
  check.f32(exp_avg_sq, params.shape, "exp_avg_sq");
  for (const auto& [v, what] : {std::pair{p.lr, "lr"}, {p.weight_decay, "weight_decay"}}) {
    if (!(v >= 0.0f) || !std::isfinite(v)) {
      check.fail(std::string(what) + " must be finite and >= 0, got " + std::to_string(v));
    }
  }
  for (const auto& [v, what] : {std::pair{p.beta1, "beta1"}, {p.beta2, "beta2"}}) {
    if (!(v >= 0.0f && v < 1.0f)) {
      check.fail(std::string(what) + " must be in [0, 1), got " + std::to_string(v));
    }
  }
  if (!(p.eps > 0.0f) || !std::isfinite(p.eps)) {
    check.fail("eps must be positive, got " + std::to_string(p.eps));
  }
  if (p.step < 1) check.fail("step counts from 1, got " + std::to_string(p.step));
  if (step_row_ != nullptr) step_row(check, *step_row_, DType::f32, 3, "step_row");
  if (params.numel() > 0) {
    run([=, this, hr = Held(step_row_)] {
      adamw_update_impl(params, grads, exp_avg, exp_avg_sq, p, hr.get());
    });
  }
}

void Backend::advance(const Tensor& cursor) {
  const Checker check(*this, "advance");
  check.tensor(cursor, DType::i32, "cursor");
  check.shape(cursor, {1}, "cursor");
  run([=, this] { advance_impl(cursor); });
}

AdamWStep adamw_step(const AdamWParams& p) {
  const auto t = static_cast<double>(p.step);
  const auto bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), t));
  AdamWStep s;
  s.step_size = p.lr / bias1;
  s.decay = 1.0f - p.lr * p.weight_decay;
  s.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(p.beta2), t)));
  return s;
}

// ---- data ---------------------------------------------------------------------------------------

void Backend::gather_batch(const Tensor& images, const Tensor& labels, const Tensor& indices,
                           const Tensor& x, const Tensor& y, const StepRow* start) {
  const Checker check(*this, "gather_batch");
  check.tensor(images, DType::u8, "images");
  if (images.shape.rank != 4) {
    check.fail("images has shape " + images.shape.str() + ", expected (M, C, H, W)");
  }
  if (images.layout != Layout::nchw) {
    check.fail(std::string("images is ") + layout_name(images.layout) +
               ", expected nchw (datasets are stored as read from their files)");
  }
  const Shape s = images.shape;
  check.tensor(labels, DType::u8, "labels");
  check.shape(labels, {s[0]}, "labels");
  check.tensor(indices, DType::i32, "indices");
  if (indices.shape.rank != 1) {
    check.fail("indices has shape " + indices.shape.str() + ", expected (n)");
  }
  // With a start the rows are a window of indices, x's batch long.
  const int64_t n = start != nullptr ? x.shape[0] : indices.shape[0];
  if (start != nullptr) {
    step_row(check, *start, DType::i32, 1, "start");
    if (x.shape.rank != 4 || n > indices.shape[0]) {
      check.fail("x has shape " + x.shape.str() + " but the index buffer holds " +
                 std::to_string(indices.shape[0]) +
                 " entries; expected (n <= " + std::to_string(indices.shape[0]) + ", C, H, W)");
    }
  }
  check.tensor(x, DType::f32, "x");
  check.shape(x, {n, s[1], s[2], s[3]}, "x");
  check.tensor(y, DType::i32, "y");
  check.shape(y, {n}, "y");
  if (n > 0) {
    run([=, this, hs = Held(start)] {
      gather_batch_impl(images, labels, indices, x, y, hs.get());
    });
  }
}

}  // namespace dp
