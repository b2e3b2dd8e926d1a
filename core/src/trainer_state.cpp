// Checkpoints: the trainer's state as safetensors. The model file is what PyTorch's
// load_state_dict(strict=True) takes (PyTorch's names, shapes and element order, batch norm's
// num_batches_tracked); the optimizer file holds the optimizer's state per parameter and the
// steps done, in PyTorch's element order too (only dprun reads it back), so a trial resumes in
// either layout whichever it was saved in.
#include <algorithm>
#include <string>

#include "dp/trainer.hpp"
#include "trainer_impl.hpp"

namespace dp {

namespace {

constexpr const char* kModelFormat = "dprun-model v1";
// v2: every tensor in PyTorch's element order. v1 (dprun before 2026-12-07): each in the element
// order the trainer kept, which was PyTorch's but for a Linear after a Flatten in NHWC (its
// (H, W, C) columns); it is still read, into a trainer of the layout that wrote it.
constexpr const char* kOptimizerFormat = "dprun-optimizer-state v2";
constexpr const char* kOptimizerFormatV1 = "dprun-optimizer-state v1";

std::vector<int64_t> dims(const Shape& s) {
  return std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.rank);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

/// The entry's values from a flat buffer, in PyTorch's order when `order` is given. The flat
/// buffers of parameters here are in reading order (ParamRegistry::params_in_reading_order: a
/// weight stored (K, R, S, C) as (K, C, R, S)); `order` is a Module's own (a Linear's columns).
std::vector<float> take(const std::vector<float>& flat, const ParamRegistry::Entry& e,
                        const ParamOrder* order) {
  const auto n = static_cast<size_t>(e.shape.numel());
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = flat[e.offset + i];
    if (order) {
      out[static_cast<size_t>(order->pytorch_index[i])] = v;
    } else {
      out[i] = v;
    }
  }
  return out;
}

/// The inverse of take(): PyTorch-ordered values into the flat buffer.
void put(std::vector<float>& flat, const ParamRegistry::Entry& e, const ParamOrder* order,
         const std::vector<float>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    flat[e.offset + i] = values[order ? static_cast<size_t>(order->pytorch_index[i]) : i];
  }
}

const ParamOrder* order_of(const std::vector<ParamOrder>& orders, int index) {
  for (const auto& o : orders)
    if (o.parameter.index == index) return &o;
  return nullptr;
}

const SafeTensor& find(const SafeTensorsFile& file, const std::string& name, const Shape& shape,
                       const char* what) {
  auto it = file.tensors.find(name);
  if (it == file.tensors.end()) {
    throw Error(std::string(what) + " has no tensor " + name +
                " (is it a checkpoint of this model?)");
  }
  const SafeTensor& t = it->second;
  if (t.type != SafeTensor::Type::f32) {
    throw Error(std::string(what) + ": tensor " + name + " is not F32");
  }
  if (t.shape != dims(shape)) {
    std::string found = "(";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      found += (i ? ", " : "") + std::to_string(t.shape[i]);
    }
    throw Error(std::string(what) + ": tensor " + name + " has shape " + found +
                "), this model's is " + shape.str());
  }
  return t;
}

/// The file's format: `expected`, or `older` where that is given (and not null).
std::string check_format(const SafeTensorsFile& file, const char* expected, const char* what,
                         const char* older = nullptr) {
  auto it = file.metadata.find("format");
  const std::string found = it == file.metadata.end() ? "(none)" : it->second;
  if (older != nullptr && found == older) return found;
  if (found != expected) {
    throw Error(std::string(what) + " is in format \"" + found + "\", this dprun reads \"" +
                expected + "\"" + (older != nullptr ? std::string(" and \"") + older + "\"" : ""));
  }
  return found;
}

}  // namespace

SafeTensorsFile Trainer::model_state() const {
  const Impl& s = *impl_;
  const ParamRegistry& reg = *s.replicas[0].params;
  const std::vector<float> params = reg.params_in_reading_order(reg.download_params()),
                           buffers = reg.download_buffers();
  SafeTensorsFile file;
  const auto& entries = reg.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    SafeTensor t;
    t.shape = dims(e.shape);
    t.f32 = take(e.trainable ? params : buffers, e,
                 e.trainable ? order_of(s.orders, static_cast<int>(i)) : nullptr);
    file.tensors[e.name] = std::move(t);
    // PyTorch's BatchNorm2d counts its training batches beside its running statistics, and a
    // strict load_state_dict wants the count too: here, the steps trained.
    if (ends_with(e.name, "running_var")) {
      SafeTensor count;
      count.type = SafeTensor::Type::i64;
      count.i64 = {s.steps_done};
      file.tensors[e.name.substr(0, e.name.size() - 11) + "num_batches_tracked"] = count;
    }
  }
  file.metadata["format"] = kModelFormat;
  file.metadata["steps"] = std::to_string(s.steps_done);
  file.metadata["layout"] = layout_name(s.options.layout);
  return file;
}

SafeTensorsFile Trainer::optimizer_state() const {
  const Impl& s = *impl_;
  const Impl::Replica& r = s.replicas[0];
  const ParamRegistry& reg = *r.params;
  const std::vector<std::string> names = r.optimizer->state_names();
  SafeTensorsFile file;
  for (size_t b = 0; b < names.size(); ++b) {
    const Tensor& state = reg.state_flat()[b];
    std::vector<float> flat(static_cast<size_t>(state.numel()));
    if (!flat.empty()) r.backend->download(flat.data(), state.data, state.bytes());
    flat = reg.params_in_reading_order(std::move(flat));
    const auto& entries = reg.entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      if (!e.trainable) continue;
      SafeTensor t;
      t.shape = dims(e.shape);
      t.f32 = take(flat, e, order_of(s.orders, static_cast<int>(i)));
      file.tensors[names[b] + "." + e.name] = std::move(t);
    }
  }
  file.metadata["format"] = kOptimizerFormat;
  file.metadata["optimizer"] = r.optimizer->name();
  file.metadata["steps"] = std::to_string(s.steps_done);
  return file;
}

void Trainer::load_state(const SafeTensorsFile& model, const SafeTensorsFile* optimizer) {
  Impl& s = *impl_;
  check_format(model, kModelFormat, "the model checkpoint");
  const ParamRegistry& reg0 = *s.replicas[0].params;
  std::vector<float> params(reg0.parameter_floats(), 0.0f), buffers(reg0.buffer_floats(), 0.0f);
  const auto& entries = reg0.entries();
  size_t expected = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const SafeTensor& t = find(model, e.name, e.shape, "the model checkpoint");
    put(e.trainable ? params : buffers, e,
        e.trainable ? order_of(s.orders, static_cast<int>(i)) : nullptr, t.f32);
    ++expected;
    if (ends_with(e.name, "running_var")) ++expected;  // num_batches_tracked
  }
  if (model.tensors.size() != expected) {
    for (const auto& [name, t] : model.tensors) {
      const bool known = std::any_of(entries.begin(), entries.end(), [&](const auto& e) {
        return e.name == name || (ends_with(name, "num_batches_tracked") &&
                                  e.name == name.substr(0, name.size() - 19) + "running_var");
      });
      if (!known) throw Error("the model checkpoint has a tensor this model lacks: " + name);
    }
  }
  std::vector<std::vector<float>> states;
  if (optimizer != nullptr) {
    const bool v1 = check_format(*optimizer, kOptimizerFormat, "the optimizer state",
                                 kOptimizerFormatV1) == kOptimizerFormatV1;
    const auto& r = s.replicas[0];
    const auto it = optimizer->metadata.find("optimizer");
    if (it == optimizer->metadata.end() || it->second != r.optimizer->name()) {
      throw Error("the optimizer state is of optimizer \"" +
                  (it == optimizer->metadata.end() ? std::string("?") : it->second) +
                  "\", this trainer runs \"" + r.optimizer->name() + "\"");
    }
    for (const std::string& name : r.optimizer->state_names()) {
      std::vector<float> flat(reg0.parameter_floats(), 0.0f);
      for (size_t i = 0; i < entries.size(); ++i) {
        const auto& e = entries[i];
        if (!e.trainable) continue;
        put(flat, e, v1 ? nullptr : order_of(s.orders, static_cast<int>(i)),
            find(*optimizer, name + "." + e.name, e.shape, "the optimizer state").f32);
      }
      // v1 held every (K, C, R, S) weight in that order (no weight was stored otherwise then),
      // the rest as stored: reading order too, but for a Module's own orders.
      states.push_back(reg0.params_in_memory_order(std::move(flat)));
    }
    const auto steps = optimizer->metadata.find("steps");
    if (steps != optimizer->metadata.end()) s.steps_done = std::stoll(steps->second);
  }
  params = reg0.params_in_memory_order(std::move(params));
  for (auto& r : s.replicas) {
    r.params->upload_params(params);
    r.params->upload_buffers(buffers);
    for (size_t b = 0; b < states.size(); ++b) {
      const Tensor& t = r.params->state_flat()[b];
      if (t.numel() > 0) r.backend->upload(t.data, states[b].data(), t.bytes());
    }
  }
  // The restored buffers are the same on every replica: nothing to average before evaluating.
  s.buffers_differ = false;
}

}  // namespace dp
