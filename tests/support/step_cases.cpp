// The per-step ops of a replayable step, against their host-valued twins and against a replayed
// capture, on any backend (step_cases.hpp).
#include "support/step_cases.hpp"

#include <cstdint>
#include <vector>

#include "dp/optimizer.hpp"
#include "support/check.hpp"

namespace dptest {

namespace {

using dp::DType;

std::vector<float> floats(const std::vector<int32_t>& v) { return {v.begin(), v.end()}; }

// A small u8 dataset on the backend: M examples of 1x3x3, labels in [0, 5).
struct Images {
  static constexpr int64_t kM = 10;
  explicit Images(dp::Backend& b)
      : images(b, {kM, 1, 3, 3}, DType::u8), labels(b, {kM}, DType::u8) {
    std::vector<uint8_t> px(static_cast<size_t>(kM * 9)), lb(static_cast<size_t>(kM));
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    for (size_t i = 0; i < lb.size(); ++i) lb[i] = static_cast<uint8_t>((i * 3) % 5);
    b.upload(images.tensor().data, px.data(), px.size());
    b.upload(labels.tensor().data, lb.data(), lb.size());
  }
  DeviceBuffer images, labels;
};

DeviceBuffer buffer(dp::Backend& b, const std::vector<float>& v, dp::Shape s) {
  DeviceBuffer d(b, s);
  d.upload(v);
  return d;
}

DeviceBuffer buffer(dp::Backend& b, const std::vector<int32_t>& v, dp::Shape s) {
  DeviceBuffer d(b, s, DType::i32);
  d.upload(v);
  return d;
}

}  // namespace

std::vector<SamePair> step_row_pairs(dp::Backend& b) {
  std::vector<SamePair> out;
  const Images data(b);
  DeviceBuffer cursor = buffer(b, std::vector<int32_t>{1}, {1});

  {  // gather: rows [start, start + 3) of a permutation, start = table[1] = 4
    const std::vector<int32_t> perm{7, 2, 9, 0, 5, 1, 8, 3};
    DeviceBuffer index = buffer(b, perm, {8});
    DeviceBuffer starts = buffer(b, std::vector<int32_t>{0, 4, 6}, {3, 1});
    DeviceBuffer x1(b, {3, 1, 3, 3}), x2(b, {3, 1, 3, 3});
    DeviceBuffer y1(b, {3}, DType::i32), y2(b, {3}, DType::i32);
    const dp::StepRow start{starts.tensor(), cursor.tensor()};
    b.gather_batch(data.images.tensor(), data.labels.tensor(), index.tensor(), x1.tensor(),
                   y1.tensor(), &start);
    b.gather_batch(data.images.tensor(), data.labels.tensor(), index.tensor().slice_batch(4, 3),
                   x2.tensor(), y2.tensor());
    out.push_back({"gather_batch x", x1.download_f32(), x2.download_f32()});
    out.push_back({"gather_batch y", floats(y1.download_i32()), floats(y2.download_i32())});
  }
  {  // softmax cross-entropy and count_correct: the results land in row 1 only
    const std::vector<float> lv = random_vector(4 * 5, 3, -3.0f, 3.0f);
    DeviceBuffer logits = buffer(b, lv, {4, 5});
    DeviceBuffer labels = buffer(b, std::vector<int32_t>{4, 0, 2, 2}, {4});
    DeviceBuffer d1(b, {4, 5}), d2(b, {4, 5});
    DeviceBuffer loss_table = buffer(b, std::vector<float>{-7.0f, -7.0f, -7.0f}, {3});
    DeviceBuffer correct_table = buffer(b, std::vector<int32_t>{-7, -7, -7}, {3});
    DeviceBuffer count_table = buffer(b, std::vector<int32_t>{-7, -7, -7}, {3});
    DeviceBuffer loss(b, {1}), correct(b, {1}, DType::i32);
    b.softmax_cross_entropy(logits.tensor(), labels.tensor(), 0.25f, d1.tensor(),
                            loss_table.tensor(), correct_table.tensor(), cursor.ptr());
    b.softmax_cross_entropy(logits.tensor(), labels.tensor(), 0.25f, d2.tensor(), loss.tensor(),
                            correct.tensor());
    b.count_correct(logits.tensor(), labels.tensor(), count_table.tensor(), cursor.ptr());
    const float l = loss.download_f32()[0];
    const auto c = static_cast<float>(correct.download_i32()[0]);
    out.push_back({"softmax_cross_entropy dlogits", d1.download_f32(), d2.download_f32()});
    out.push_back(
        {"softmax_cross_entropy loss slot", loss_table.download_f32(), {-7.0f, l, -7.0f}});
    out.push_back(
        {"softmax_cross_entropy correct slot", floats(correct_table.download_i32()), {-7, c, -7}});
    out.push_back({"count_correct slot", floats(count_table.download_i32()), {-7, c, -7}});
    // An empty batch writes zeros at its slot.
    const dp::Tensor none = d1.tensor().with_batch(0);
    b.softmax_cross_entropy(none, labels.tensor().slice_batch(0, 0), 1.0f, none,
                            loss_table.tensor(), correct_table.tensor(), cursor.ptr());
    out.push_back({"softmax_cross_entropy empty batch", loss_table.download_f32(), {-7, 0, -7}});
  }
  {  // sgd with momentum and Nesterov: lr from row 1 of a table whose other rows differ
    const int64_t n = 37;
    const std::vector<float> p0 = random_vector(n, 5), g = random_vector(n, 6);
    DeviceBuffer p1 = buffer(b, p0, {n}), p2 = buffer(b, p0, {n}), grads = buffer(b, g, {n});
    DeviceBuffer m1 = buffer(b, std::vector<float>(n, 0.5f), {n});
    DeviceBuffer m2 = buffer(b, std::vector<float>(n, 0.5f), {n});
    DeviceBuffer lrs = buffer(b, std::vector<float>{0.3f, 0.05f, 0.7f}, {3, 1});
    const dp::StepRow row{lrs.tensor(), cursor.tensor()};
    b.sgd_update(p1.tensor(), grads.tensor(), m1.ptr(), {0.0f, 0.9f, 1e-2f, true}, &row);
    b.sgd_update(p2.tensor(), grads.tensor(), m2.ptr(), {0.05f, 0.9f, 1e-2f, true});
    out.push_back({"sgd_update params", p1.download_f32(), p2.download_f32()});
    out.push_back({"sgd_update momentum", m1.download_f32(), m2.download_f32()});
  }
  {  // adamw at step 3: the row holds adamw_step's scalars, the host twin computes them
    const int64_t n = 29;
    const std::vector<float> p0 = random_vector(n, 7), g = random_vector(n, 8);
    const std::vector<float> v0 = random_vector(n, 9, 0.0f, 0.1f);
    DeviceBuffer p1 = buffer(b, p0, {n}), p2 = buffer(b, p0, {n}), grads = buffer(b, g, {n});
    DeviceBuffer m1 = buffer(b, g, {n}), m2 = buffer(b, g, {n});
    DeviceBuffer v1 = buffer(b, v0, {n}), v2 = buffer(b, v0, {n});
    const dp::AdamWParams hp{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 3};
    const dp::AdamWStep s = dp::adamw_step(hp);
    DeviceBuffer rows =
        buffer(b, std::vector<float>{1.0f, 1.0f, 1.0f, s.step_size, s.decay, s.bias2_sqrt, 2, 2, 2},
               {3, 3});
    const dp::StepRow row{rows.tensor(), cursor.tensor()};
    b.adamw_update(p1.tensor(), grads.tensor(), m1.tensor(), v1.tensor(),
                   {0.0f, 0.9f, 0.999f, 1e-8f, 0.1f, 1}, &row);
    b.adamw_update(p2.tensor(), grads.tensor(), m2.tensor(), v2.tensor(), hp);
    out.push_back({"adamw_update params", p1.download_f32(), p2.download_f32()});
    out.push_back({"adamw_update exp_avg", m1.download_f32(), m2.download_f32()});
    out.push_back({"adamw_update exp_avg_sq", v1.download_f32(), v2.download_f32()});
  }
  b.advance(cursor.tensor());
  b.advance(cursor.tensor());
  out.push_back({"advance", floats(cursor.download_i32()), {3}});
  return out;
}

std::vector<SamePair> capture_pairs(dp::Backend& b, int steps, size_t* ops) {
  const Images data(b);
  const std::vector<int32_t> perm{3, 8, 1, 6, 0, 9, 2, 5, 7, 4};
  const std::vector<int32_t> starts{0, 2, 5, 7, 1, 4};  // one row per step, windows of 3
  std::vector<float> lrs;
  for (size_t t = 0; t < starts.size(); ++t) lrs.push_back(0.1f * static_cast<float>(t + 1));
  const auto rows = static_cast<int64_t>(starts.size());
  const std::vector<float> p0 = random_vector(27, 12);

  struct Run {
    Run(dp::Backend& b, const std::vector<int32_t>& perm, const std::vector<int32_t>& starts,
        const std::vector<float>& lrs, const std::vector<float>& p0, int64_t rows)
        : index(buffer(b, perm, {10})),
          start(buffer(b, starts, {rows, 1})),
          lr(buffer(b, lrs, {rows, 1})),
          cursor(buffer(b, std::vector<int32_t>{0}, {1})),
          params(buffer(b, p0, {27})),
          loss(buffer(b, std::vector<float>(static_cast<size_t>(rows), -1.0f), {rows})),
          correct(buffer(b, std::vector<int32_t>(static_cast<size_t>(rows), -1), {rows})),
          x(b, {3, 1, 3, 3}),
          y(b, {3}, DType::i32),
          dlogits(b, {3, 9}) {}
    DeviceBuffer index, start, lr, cursor, params, loss, correct, x, y, dlogits;
  };
  auto step = [&](Run& r) {
    const dp::StepRow at{r.start.tensor(), r.cursor.tensor()};
    b.gather_batch(data.images.tensor(), data.labels.tensor(), r.index.tensor(), r.x.tensor(),
                   r.y.tensor(), &at);
    // The batch as logits of 9 classes: a loss at the cursor's slot and a gradient.
    const dp::Tensor logits(r.x.tensor().data, {3, 9}, DType::f32, b.device());
    b.softmax_cross_entropy(logits, r.y.tensor(), 1.0f / 3.0f, r.dlogits.tensor(), r.loss.tensor(),
                            r.correct.tensor(), r.cursor.ptr());
    const dp::Tensor grads(r.dlogits.tensor().data, {27}, DType::f32, b.device());
    const dp::StepRow lr{r.lr.tensor(), r.cursor.tensor()};
    b.sgd_update(r.params.tensor(), grads, nullptr, {0.0f, 0.0f, 0.0f, false}, &lr);
    b.advance(r.cursor.tensor());
  };

  Run eager(b, perm, starts, lrs, p0, rows), replayed(b, perm, starts, lrs, p0, rows);
  for (int s = 0; s < steps; ++s) step(eager);
  b.begin_capture();
  try {
    step(replayed);
  } catch (...) {
    b.discard_capture();
    throw;
  }
  const std::unique_ptr<dp::CapturedOps> captured = b.end_capture();
  if (ops != nullptr) *ops = captured->ops();
  for (int s = 0; s < steps; ++s) b.replay(*captured);
  return {
      {"params", replayed.params.download_f32(), eager.params.download_f32()},
      {"loss slots", replayed.loss.download_f32(), eager.loss.download_f32()},
      {"correct slots", floats(replayed.correct.download_i32()),
       floats(eager.correct.download_i32())},
      {"cursor", floats(replayed.cursor.download_i32()), floats(eager.cursor.download_i32())},
  };
}

}  // namespace dptest
