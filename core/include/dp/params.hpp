#pragma once
// The parameters, gradients and buffers of one replica's model, each kind in ONE flat buffer,
// so gradients are allreduced over contiguous memory and checkpoints are one write.
// Names are PyTorch-style dotted paths ("resnet_block2.0.conv1.weight").
//
// A rank-4 parameter may be stored in NHWC order, like an activation: a convolution's weight
// (K, C, R, S) in an NHWC model is kept as (K, R, S, C) (Entry::layout), the filter order of
// cuDNN's NHWC kernels, so no pass transposes it. Its Tensor says so (Tensor::layout), flat
// copies (download_params, the optimizer's state) hold it in that order, its values at
// initialisation are those of the (K, C, R, S) order, and checkpoints write PyTorch's order
// (params_in_reading_order).
#include <cstdint>
#include <string>
#include <vector>

#include "dp/tensor.hpp"

namespace dp {

class Backend;

/// How a parameter or buffer is initialised.
struct Init {
  enum class Kind { constant, normal, uniform };
  Kind kind = Kind::constant;
  float a = 0.0f;  // constant: value; normal: mean; uniform: low
  float b = 0.0f;  // normal: standard deviation; uniform: high
  static Init zeros() { return {Kind::constant, 0.0f, 0.0f}; }
  static Init ones() { return {Kind::constant, 1.0f, 0.0f}; }
  static Init constant(float v) { return {Kind::constant, v, 0.0f}; }
  static Init normal(float stddev, float mean = 0.0f) { return {Kind::normal, mean, stddev}; }
  static Init uniform(float low, float high) { return {Kind::uniform, low, high}; }
};

struct ParamHandle {
  int index = -1;
  bool valid() const { return index >= 0; }
};

class ParamRegistry {
 public:
  struct Entry {
    std::string name;
    Shape shape;
    Init init;
    bool trainable = true;  // false: a buffer (BN running statistics)
    size_t offset = 0;      // in floats, into the flat buffer of its kind (64-byte aligned)
    /// The memory order of a rank-4 shape (d0, d1, d2, d3): nchw as it reads, nhwc as
    /// (d0, d2, d3, d1). Always nchw for other ranks.
    Layout layout = Layout::nchw;
  };

  /// The activation layout of the model whose parameters this registry holds
  /// (SetupContext::layout), set before anything is declared (the trainer does): a layer may
  /// store a rank-4 weight in it, so that its passes read it as it is (Conv2d does). nchw
  /// unless set. Throws dp::Error after a declaration.
  void set_layout(Layout layout);
  Layout layout() const { return layout_; }

  /// Declares a trainable parameter. Names must be unique (throws dp::Error otherwise).
  /// `layout`: its memory order (Entry::layout); nhwc only for a rank-4 shape.
  ParamHandle add_parameter(const std::string& name, Shape shape, Init init,
                            Layout layout = Layout::nchw);
  /// Declares a non-trainable buffer (averaged across replicas before evaluation).
  ParamHandle add_buffer(const std::string& name, Shape shape, Init init);

  const std::vector<Entry>& entries() const { return entries_; }
  const Entry& entry(ParamHandle h) const;
  /// Floats in the flat parameter buffer (= gradient buffer) and in the flat buffer of buffers,
  /// padding included.
  size_t parameter_floats() const { return param_floats_; }
  size_t buffer_floats() const { return buffer_floats_; }
  /// Number of trainable scalars (no padding).
  size_t parameter_count() const;

  /// Allocates the flat buffers on the backend: params, grads, buffers, and `state_buffers`
  /// more of the parameters' length for the optimizer's state (Optimizer::state_buffers()).
  /// With `packed_bf16`, a copy of the parameters rounded to bf16 and packed (2 bytes a value),
  /// which every upload writes and the optimizer's update keeps current (its params_bf16): the
  /// weights that precision bf16's passes read (Conv2d gives it as conv_forward's and
  /// conv_backward_data's w_bf16, Linear as linear_forward's and linear_backward's), so no pass
  /// rounds them again. It mirrors the flat parameters value for value, so each entry's copy
  /// starts 32-byte aligned (the fp32 entries: 64). Writing parameters other than through
  /// upload_params or the optimizer leaves it stale.
  /// Every gradient starts at 0: a convolution bias folded into a batch norm keeps that as its
  /// gradient, which no backward pass writes (Conv2d::bias_folded), so nothing may leave another
  /// value in a gradient it does not own. Freed by the destructor.
  void allocate(Backend& backend, int state_buffers = 0, bool packed_bf16 = false);
  bool allocated() const { return backend_ != nullptr; }
  /// Fills parameters and buffers from `seed`, identically for every registry with the same
  /// declarations; gradients and optimizer state are zeroed. A parameter stored in NHWC order
  /// gets the values it would get stored as it reads (the same tensor, in its own order).
  void initialize(uint64_t seed);

  Tensor param(ParamHandle h) const;
  Tensor grad(ParamHandle h) const;
  /// The packed bf16 copy of a parameter (allocate's packed_bf16), of its shape and layout;
  /// null when there is none.
  const Tensor* param_bf16(ParamHandle h) const;
  /// The whole packed copy, (parameter_floats) bf16; null when there is none.
  const Tensor* params_bf16_flat() const;
  Tensor buffer(ParamHandle h) const;
  Tensor params_flat() const;    // (parameter_floats)
  Tensor grads_flat() const;     // (parameter_floats)
  /// The optimizer's state buffers, (parameter_floats) each, in the optimizer's order.
  const std::vector<Tensor>& state_flat() const { return state_; }
  Tensor buffers_flat() const;   // (buffer_floats); may be empty

  /// Host copies (downloaded; for checkpoints and tests), in flat order: each entry in its own
  /// memory order (Entry::layout).
  std::vector<float> download_params() const;
  std::vector<float> download_buffers() const;
  void upload_params(const std::vector<float>& flat);
  void upload_buffers(const std::vector<float>& flat);
  /// A flat copy of the parameters (download_params' offsets) with each entry stored in NHWC
  /// order (Entry::layout) put in the order its shape reads, (d0, d1, d2, d3): the same vector
  /// for the same model whichever layout the registry keeps (for tests comparing layouts). And
  /// back. Neither needs the registry allocated.
  std::vector<float> params_in_reading_order(std::vector<float> flat) const;
  std::vector<float> params_in_memory_order(std::vector<float> flat) const;

  ParamRegistry() = default;
  ParamRegistry(const ParamRegistry&) = delete;
  ParamRegistry& operator=(const ParamRegistry&) = delete;
  ~ParamRegistry();

 private:
  ParamHandle add(const std::string& name, Shape shape, Init init, bool trainable, Layout layout);
  std::vector<Entry> entries_;
  Layout layout_ = Layout::nchw;
  size_t param_floats_ = 0;
  size_t buffer_floats_ = 0;
  Backend* backend_ = nullptr;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  std::vector<Tensor> state_;
  float* buffers_ = nullptr;
  Tensor params_bf16_;                // empty unless allocated with packed_bf16
  std::vector<Tensor> entries_bf16_;  // per entry: its view of params_bf16_ (trainable only)
};

}  // namespace dp
