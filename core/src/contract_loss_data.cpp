// The contracts of dp::Backend's loss, metrics and batch-gathering ops.
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend_checker.hpp"
#include "dp/augment.hpp"

namespace dp {

using namespace checks;

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

// ---- data ---------------------------------------------------------------------------------------

namespace {

// A transform's host values, and its draws table beside the index buffer.
void check_transform(const Checker& check, const GatherTransform& t, const Tensor& indices,
                     int64_t channels) {
  if (t.crop_padding < 0 || t.crop_padding > kMaxCropPadding) {
    check.fail("transform.crop_padding is " + std::to_string(t.crop_padding) +
               ", expected 0 .. " + std::to_string(kMaxCropPadding));
  }
  if (t.draws != nullptr) {
    check.tensor(*t.draws, DType::i32, "transform.draws");
    check.shape(*t.draws, indices.shape, "transform.draws");
  }
  for (const auto* values : {&t.mean, &t.std}) {
    const char* what = values == &t.mean ? "transform.mean" : "transform.std";
    if (!values->empty() && static_cast<int64_t>(values->size()) != channels) {
      check.fail(std::string(what) + " has " + std::to_string(values->size()) +
                 " values, expected none or one per channel (" + std::to_string(channels) + ")");
    }
    for (float v : *values) check.finite(v, what);
  }
  if (t.mean.size() != t.std.size()) {
    check.fail("transform.mean and transform.std must both be empty or both be given");
  }
  for (float v : t.std) {
    if (!(v > 0.0f)) check.fail("transform.std holds " + std::to_string(v) + ", expected > 0");
  }
}

}  // namespace

void Backend::gather_batch(const Tensor& images, const Tensor& labels, const Tensor& indices,
                           const Tensor& x, const Tensor& y, const StepRow* start,
                           const GatherTransform* transform) {
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
  if (transform != nullptr) check_transform(check, *transform, indices, s[1]);
  if (n > 0) {
    // The transform is copied into the op (a recorded step outlives the caller's), its draws
    // table with it.
    struct HeldTransform {
      GatherTransform transform;
      Tensor draws;
    };
    std::shared_ptr<HeldTransform> held;
    if (transform != nullptr) {
      held = std::make_shared<HeldTransform>(HeldTransform{*transform, Tensor()});
      if (transform->draws != nullptr) {
        held->draws = *transform->draws;
        held->transform.draws = &held->draws;
      }
    }
    run([=, this, hs = Held(start)] {
      gather_batch_impl(images, labels, indices, x, y, hs.get(),
                        held != nullptr ? &held->transform : nullptr);
    });
  }
}

}  // namespace dp
