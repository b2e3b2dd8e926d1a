#include "dp/params.hpp"

#include <algorithm>

#include "dp/backend.hpp"
#include "dp/error.hpp"
#include "dp/random.hpp"

namespace dp {

namespace {

// Every entry starts on a 64-byte boundary (16 floats) so vectorised kernels and bucketed
// collectives never straddle two entries in one cache line.
constexpr size_t kAlignFloats = 16;

size_t align_up(size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// A rank-4 shape's values from (d0, d1, d2, d3) order into (d0, d2, d3, d1) order, or back.
void relay(const float* src, float* dst, const Shape& s, bool to_nhwc) {
  const int64_t c = s[1], hw = s[2] * s[3];
  for (int64_t n = 0; n < s[0]; ++n) {
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t i = 0; i < hw; ++i) {
        const int64_t nchw = (n * c + k) * hw + i, nhwc = (n * hw + i) * c + k;
        dst[to_nhwc ? nhwc : nchw] = src[to_nhwc ? nchw : nhwc];
      }
    }
  }
}

// Every trainable NHWC entry of `flat` relaid (to or from its reading order).
std::vector<float> relay_params(const std::vector<ParamRegistry::Entry>& entries, size_t floats,
                                std::vector<float> flat, bool to_nhwc, const char* op) {
  DP_CHECK(flat.size() == floats, std::string(op) + ": got " + std::to_string(flat.size()) +
                                      " floats, the model has " + std::to_string(floats) +
                                      " (padding included)");
  std::vector<float> entry;
  for (const ParamRegistry::Entry& e : entries) {
    if (!e.trainable || e.layout == Layout::nchw) continue;
    float* at = flat.data() + e.offset;
    entry.assign(at, at + e.shape.numel());
    relay(entry.data(), at, e.shape, to_nhwc);
  }
  return flat;
}

void fill_host(float* dst, int64_t n, const Init& init, Rng rng) {
  switch (init.kind) {
    case Init::Kind::constant:
      std::fill(dst, dst + n, init.a);
      break;
    case Init::Kind::normal:
      for (int64_t i = 0; i < n; ++i)
        dst[i] = static_cast<float>(init.a + static_cast<double>(init.b) * rng.normal());
      break;
    case Init::Kind::uniform:
      for (int64_t i = 0; i < n; ++i)
        dst[i] = static_cast<float>(init.a +
                                    (static_cast<double>(init.b) - init.a) * rng.uniform_double());
      break;
  }
}

}  // namespace

void ParamRegistry::set_layout(Layout layout) {
  DP_CHECK(entries_.empty(),
           "ParamRegistry::set_layout after '" +
               (entries_.empty() ? std::string() : entries_.front().name) +
               "' was declared: set the layout before the model declares its parameters");
  layout_ = layout;
}

ParamHandle ParamRegistry::add_parameter(const std::string& name, Shape shape, Init init,
                                         Layout layout) {
  return add(name, shape, init, true, layout);
}

ParamHandle ParamRegistry::add_buffer(const std::string& name, Shape shape, Init init) {
  return add(name, shape, init, false, Layout::nchw);
}

ParamHandle ParamRegistry::add(const std::string& name, Shape shape, Init init, bool trainable,
                               Layout layout) {
  DP_CHECK(!allocated(), "cannot declare '" + name +
                             "' after the parameter registry was allocated: declare every "
                             "parameter and buffer first");
  DP_CHECK(!name.empty(), "a parameter or buffer needs a non-empty name");
  for (const Entry& e : entries_)
    DP_CHECK(e.name != name, "duplicate parameter name '" + name +
                                 "': give each module in a Sequential a distinct name");
  DP_CHECK(shape.rank >= 1 && shape.numel() > 0,
           "parameter '" + name + "' has an empty shape " + shape.str());
  DP_CHECK(init.kind != Init::Kind::normal || init.b >= 0.0f,
           "parameter '" + name + "': a normal initialiser needs stddev >= 0");
  DP_CHECK(layout == Layout::nchw || shape.rank == 4,
           "parameter '" + name + "' of shape " + shape.str() + " cannot be stored " +
               layout_name(layout) + ": only a rank-4 shape has another memory order");
  Entry e;
  e.name = name;
  e.shape = shape;
  e.init = init;
  e.trainable = trainable;
  e.layout = layout;
  size_t& total = trainable ? param_floats_ : buffer_floats_;
  e.offset = total;
  total += align_up(static_cast<size_t>(shape.numel()));
  entries_.push_back(e);
  return ParamHandle{static_cast<int>(entries_.size()) - 1};
}

const ParamRegistry::Entry& ParamRegistry::entry(ParamHandle h) const {
  DP_ASSERT(h.index >= 0 && static_cast<size_t>(h.index) < entries_.size());
  return entries_[static_cast<size_t>(h.index)];
}

size_t ParamRegistry::parameter_count() const {
  size_t n = 0;
  for (const Entry& e : entries_)
    if (e.trainable) n += static_cast<size_t>(e.shape.numel());
  return n;
}

void ParamRegistry::allocate(Backend& backend, int state_buffers, bool packed_bf16) {
  DP_CHECK(!allocated(), "the parameter registry is already allocated");
  DP_CHECK(state_buffers >= 0, "allocate: state_buffers must be >= 0");
  backend_ = &backend;
  if (param_floats_ > 0) {
    params_ = static_cast<float*>(backend.allocate(param_floats_ * sizeof(float)));
    grads_ = static_cast<float*>(backend.allocate(param_floats_ * sizeof(float)));
    // Every gradient starts at 0, initialized or not: a convolution bias folded into a batch
    // norm has 0 for its gradient, which no backward pass writes (Conv2d::do_backward).
    backend.fill(grads_flat(), 0.0f);
  }
  for (int i = 0; i < state_buffers; ++i) {
    void* p = param_floats_ > 0 ? backend.allocate(param_floats_ * sizeof(float)) : nullptr;
    state_.emplace_back(p, Shape{static_cast<int64_t>(param_floats_)}, DType::f32,
                        backend.device());
  }
  if (buffer_floats_ > 0)
    buffers_ = static_cast<float*>(backend.allocate(buffer_floats_ * sizeof(float)));
  if (packed_bf16 && param_floats_ > 0) {
    auto* packed = static_cast<uint16_t*>(backend.allocate(param_floats_ * sizeof(uint16_t)));
    params_bf16_ =
        Tensor(packed, {static_cast<int64_t>(param_floats_)}, DType::bf16, backend.device());
    entries_bf16_.resize(entries_.size());
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (e.trainable)
        entries_bf16_[i] =
            Tensor(packed + e.offset, e.shape, DType::bf16, backend.device(), e.layout);
    }
    // Written by the first upload (initialize's), as the parameters are.
  }
}

ParamRegistry::~ParamRegistry() {
  if (!backend_) return;
  for (float* p : {params_, grads_, buffers_})
    if (p) backend_->release(p);
  for (const Tensor& t : state_)
    if (t.data) backend_->release(t.data);
  if (params_bf16_.data) backend_->release(params_bf16_.data);
}

void ParamRegistry::initialize(uint64_t seed) {
  DP_CHECK(allocated(), "initialize() needs allocate() first");
  // Generated on the host from one stream per entry (in declaration order), so the values of
  // an entry depend only on the seed and its index, identical on every replica and device.
  std::vector<float> params(param_floats_, 0.0f), buffers(buffer_floats_, 0.0f);
  const Rng root(seed);
  std::vector<float> reading;  // an NHWC entry's values in (d0, d1, d2, d3) order
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    float* dst = (e.trainable ? params.data() : buffers.data()) + e.offset;
    if (e.layout == Layout::nchw) {
      fill_host(dst, e.shape.numel(), e.init, root.fork(i));
      continue;
    }
    reading.resize(static_cast<size_t>(e.shape.numel()));
    fill_host(reading.data(), e.shape.numel(), e.init, root.fork(i));
    relay(reading.data(), dst, e.shape, true);
  }
  upload_params(params);
  upload_buffers(buffers);
  if (param_floats_ > 0) backend_->fill(grads_flat(), 0.0f);
  for (const Tensor& t : state_) backend_->fill(t, 0.0f);
}

Tensor ParamRegistry::param(ParamHandle h) const {
  const Entry& e = entry(h);
  DP_ASSERT(allocated() && e.trainable);
  return Tensor(params_ + e.offset, e.shape, DType::f32, backend_->device(), e.layout);
}

Tensor ParamRegistry::grad(ParamHandle h) const {
  const Entry& e = entry(h);
  DP_ASSERT(allocated() && e.trainable);
  return Tensor(grads_ + e.offset, e.shape, DType::f32, backend_->device(), e.layout);
}

const Tensor* ParamRegistry::param_bf16(ParamHandle h) const {
  const Entry& e = entry(h);
  DP_ASSERT(allocated() && e.trainable);
  return params_bf16_.data ? &entries_bf16_[static_cast<size_t>(h.index)] : nullptr;
}

const Tensor* ParamRegistry::params_bf16_flat() const {
  return params_bf16_.data ? &params_bf16_ : nullptr;
}

Tensor ParamRegistry::buffer(ParamHandle h) const {
  const Entry& e = entry(h);
  DP_ASSERT(allocated() && !e.trainable);
  return Tensor(buffers_ + e.offset, e.shape, DType::f32, backend_->device());
}

Tensor ParamRegistry::params_flat() const {
  DP_ASSERT(allocated());
  return Tensor(params_, {static_cast<int64_t>(param_floats_)}, DType::f32, backend_->device());
}

Tensor ParamRegistry::grads_flat() const {
  DP_ASSERT(allocated());
  return Tensor(grads_, {static_cast<int64_t>(param_floats_)}, DType::f32, backend_->device());
}


Tensor ParamRegistry::buffers_flat() const {
  DP_ASSERT(allocated());
  if (!buffers_) return Tensor();
  return Tensor(buffers_, {static_cast<int64_t>(buffer_floats_)}, DType::f32, backend_->device());
}

std::vector<float> ParamRegistry::download_params() const {
  DP_CHECK(allocated(), "download_params() needs allocate() first");
  std::vector<float> v(param_floats_);
  if (!v.empty()) backend_->download(v.data(), params_, v.size() * sizeof(float));
  return v;
}

std::vector<float> ParamRegistry::download_buffers() const {
  DP_CHECK(allocated(), "download_buffers() needs allocate() first");
  std::vector<float> v(buffer_floats_);
  if (!v.empty()) backend_->download(v.data(), buffers_, v.size() * sizeof(float));
  return v;
}

void ParamRegistry::upload_params(const std::vector<float>& flat) {
  DP_CHECK(allocated(), "upload_params() needs allocate() first");
  DP_CHECK(flat.size() == param_floats_, "upload_params: got " + std::to_string(flat.size()) +
                                             " floats, the model has " +
                                             std::to_string(param_floats_) + " (padding included)");
  if (flat.empty()) return;
  backend_->upload(params_, flat.data(), flat.size() * sizeof(float));
  // The packed copy follows every upload: initialize, checkpoints, set_parameters.
  if (params_bf16_.data) backend_->pack_bf16(params_flat(), params_bf16_);
}

std::vector<float> ParamRegistry::params_in_reading_order(std::vector<float> flat) const {
  return relay_params(entries_, param_floats_, std::move(flat), false, "params_in_reading_order");
}

std::vector<float> ParamRegistry::params_in_memory_order(std::vector<float> flat) const {
  return relay_params(entries_, param_floats_, std::move(flat), true, "params_in_memory_order");
}

void ParamRegistry::upload_buffers(const std::vector<float>& flat) {
  DP_CHECK(allocated(), "upload_buffers() needs allocate() first");
  DP_CHECK(flat.size() == buffer_floats_,
           "upload_buffers: got " + std::to_string(flat.size()) + " floats, the model has " +
               std::to_string(buffer_floats_) + " (padding included)");
  if (!flat.empty()) backend_->upload(buffers_, flat.data(), flat.size() * sizeof(float));
}

}  // namespace dp
