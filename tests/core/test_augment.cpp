// Augmentation on the device: gather_batch's transform (crop with zero padding, flip,
// normalisation) on the CPU backend against a naive reference written from torchvision's
// definition, its contract, and the counter-based draws.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "dp/augment.hpp"
#include "dp/backend.hpp"
#include "dp/random.hpp"
#include "support/check.hpp"
#include "test_cpu_util.hpp"

using namespace cputest;
using dptest::host_tensor;

namespace {

// torchvision's RandomCrop(padding=P) on the uint8 image with the given offsets, then the flip,
// then ToTensor and Normalize, as three separate images: the reference is that definition,
// not the backend's index arithmetic. Returns (C, H, W).
std::vector<float> reference_example(const std::vector<uint8_t>& images, int64_t e, int64_t c,
                                     int64_t h, int64_t w, int64_t pad, int64_t oy, int64_t ox,
                                     bool flip, const std::vector<float>& mean,
                                     const std::vector<float>& stdev) {
  const int64_t hp = h + 2 * pad, wp = w + 2 * pad;
  std::vector<uint8_t> padded(static_cast<size_t>(c * hp * wp), 0);
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t r = 0; r < h; ++r)
      for (int64_t q = 0; q < w; ++q)
        padded[static_cast<size_t>((ch * hp + r + pad) * wp + q + pad)] =
            images[static_cast<size_t>(((e * c + ch) * h + r) * w + q)];
  std::vector<uint8_t> cropped(static_cast<size_t>(c * h * w));
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t r = 0; r < h; ++r)
      for (int64_t q = 0; q < w; ++q)
        cropped[static_cast<size_t>((ch * h + r) * w + q)] =
            padded[static_cast<size_t>((ch * hp + r + oy) * wp + q + ox)];
  std::vector<float> out(cropped.size());
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t r = 0; r < h; ++r)
      for (int64_t q = 0; q < w; ++q) {
        const uint8_t v = cropped[static_cast<size_t>((ch * h + r) * w + (flip ? w - 1 - q : q))];
        float x = static_cast<float>(v) / 255.0f;
        if (!mean.empty()) x = (x - mean[static_cast<size_t>(ch)]) / stdev[static_cast<size_t>(ch)];
        out[static_cast<size_t>((ch * h + r) * w + q)] = x;
      }
  return out;
}

struct Data {
  int64_t m = 6, c = 3, h = 5, w = 4;
  std::vector<uint8_t> images, labels;
  Data() {
    images.resize(static_cast<size_t>(m * c * h * w));
    labels.resize(static_cast<size_t>(m));
    dp::Rng rng(77);
    for (auto& v : images) v = static_cast<uint8_t>(1 + rng.below(255));  // 0 only in padding
    for (auto& v : labels) v = static_cast<uint8_t>(rng.below(10));
  }
  dp::Tensor images_t() { return dp::Tensor(images.data(), {m, c, h, w}, dp::DType::u8); }
  dp::Tensor labels_t() { return dp::Tensor(labels.data(), {m}, dp::DType::u8); }
};

}  // namespace

TEST_CASE("gather_batch's transform equals the naive reference at every crop offset and flip",
          "[cpu][ops][augment]") {
  auto backend = make_cpu();
  Data d;
  const int64_t pad = 2, span = 2 * pad + 1;
  // Every (oy, ox, flip), border offsets included, over the examples, read through a StepRow
  // window of a longer buffer (the rows a training step reads).
  std::vector<int32_t> index, draws;
  for (int64_t oy = 0; oy < span; ++oy)
    for (int64_t ox = 0; ox < span; ++ox)
      for (int flip = 0; flip < 2; ++flip) {
        index.push_back(static_cast<int32_t>(index.size() % static_cast<size_t>(d.m)));
        draws.push_back(dp::pack_draw(oy, ox, flip != 0));
      }
  const auto n = static_cast<int64_t>(index.size());
  std::vector<int32_t> buffer(3, 0), draw_buffer(3, 0);  // the window starts at row 3
  buffer.insert(buffer.end(), index.begin(), index.end());
  draw_buffer.insert(draw_buffer.end(), draws.begin(), draws.end());
  std::vector<int32_t> table = {0, 3}, cursor = {1};
  const dp::StepRow start{host_tensor(table, {2, 1}), host_tensor(cursor, {1})};
  const auto rows = static_cast<int64_t>(buffer.size());
  const dp::Tensor draws_t = host_tensor(draw_buffer, {rows});
  for (const bool normalise : {false, true}) {
    dp::GatherTransform t;
    t.crop_padding = pad;
    t.draws = &draws_t;
    if (normalise) {
      t.mean = {0.4914f, 0.4822f, 0.4465f};
      t.std = {0.2470f, 0.2435f, 0.2616f};
    }
    for (auto layout : {dp::Layout::nchw, dp::Layout::nhwc}) {
      INFO("layout " << dp::layout_name(layout) << (normalise ? ", normalised" : ""));
      fvec x(static_cast<size_t>(n * d.c * d.h * d.w), -7.0f);
      std::vector<int32_t> y(static_cast<size_t>(n), -1);
      backend->gather_batch(d.images_t(), d.labels_t(), host_tensor(buffer, {rows}),
                            host_tensor(x, {n, d.c, d.h, d.w}, layout), host_tensor(y, {n}), &start,
                            &t);
      const fvec got = from_layout(x, layout, n, d.c, d.h, d.w);
      const int64_t chw = d.c * d.h * d.w;
      for (int64_t i = 0; i < n; ++i) {
        const int32_t dr = draws[static_cast<size_t>(i)];
        const auto ref =
            reference_example(d.images, index[static_cast<size_t>(i)], d.c, d.h, d.w, pad,
                              dp::draw_oy(dr), dp::draw_ox(dr), dp::draw_flip(dr), t.mean, t.std);
        const fvec row(got.begin() + i * chw, got.begin() + (i + 1) * chw);
        INFO("example " << i << ": oy " << dp::draw_oy(dr) << " ox " << dp::draw_ox(dr) << " flip "
                        << dp::draw_flip(dr));
        CHECK(row == ref);  // the same float operations: the same bits
        CHECK(y[static_cast<size_t>(i)] ==
              d.labels[static_cast<size_t>(index[static_cast<size_t>(i)])]);
      }
    }
  }
}

TEST_CASE("a transform that asks for nothing leaves x = v / 255 bit for bit",
          "[cpu][ops][augment]") {
  auto backend = make_cpu();
  Data d;
  std::vector<int32_t> index = {5, 0, 3, 3};
  const auto n = static_cast<int64_t>(index.size());
  std::vector<int32_t> centre(index.size(), dp::pack_draw(3, 3, false));
  const dp::Tensor centre_t = host_tensor(centre, {n});
  for (auto layout : {dp::Layout::nchw, dp::Layout::nhwc}) {
    fvec plain(static_cast<size_t>(n * d.c * d.h * d.w)), x(plain.size());
    std::vector<int32_t> y(static_cast<size_t>(n));
    backend->gather_batch(d.images_t(), d.labels_t(), host_tensor(index, {n}),
                          host_tensor(plain, {n, d.c, d.h, d.w}, layout), host_tensor(y, {n}));
    dp::GatherTransform none;  // no crop, no draws, no normalisation
    backend->gather_batch(d.images_t(), d.labels_t(), host_tensor(index, {n}),
                          host_tensor(x, {n, d.c, d.h, d.w}, layout), host_tensor(y, {n}), nullptr,
                          &none);
    CHECK(x == plain);
    dp::GatherTransform identity;  // the centre crop of padding 3, mean 0, std 1
    identity.crop_padding = 3;
    identity.draws = &centre_t;
    identity.mean = {0.0f, 0.0f, 0.0f};
    identity.std = {1.0f, 1.0f, 1.0f};
    std::fill(x.begin(), x.end(), -1.0f);
    backend->gather_batch(d.images_t(), d.labels_t(), host_tensor(index, {n}),
                          host_tensor(x, {n, d.c, d.h, d.w}, layout), host_tensor(y, {n}), nullptr,
                          &identity);
    CHECK(x == plain);
  }
}

TEST_CASE("gather_batch's transform is checked like every argument", "[cpu][ops][augment]") {
  auto backend = make_cpu();
  Data d;
  std::vector<int32_t> index = {1, 2};
  fvec x(static_cast<size_t>(2 * d.c * d.h * d.w));
  std::vector<int32_t> y(2);
  auto gather = [&](const dp::GatherTransform& t) {
    backend->gather_batch(d.images_t(), d.labels_t(), host_tensor(index, {2}),
                          host_tensor(x, {2, d.c, d.h, d.w}), host_tensor(y, {2}), nullptr, &t);
  };
  dp::GatherTransform t;
  t.mean = {0.5f, 0.5f};
  t.std = {0.2f, 0.2f};
  check_error_mentions([&] { gather(t); }, {"gather_batch", "transform.mean has 2 values"});
  t.mean = {0.5f, 0.5f, 0.5f};
  t.std = {0.2f, 0.0f, 0.2f};
  check_error_mentions([&] { gather(t); }, {"transform.std", "expected > 0"});
  t = {};
  t.crop_padding = -1;
  check_error_mentions([&] { gather(t); }, {"transform.crop_padding is -1"});
  std::vector<int32_t> short_draws = {0};
  const dp::Tensor short_t = host_tensor(short_draws, {1});
  t = {};
  t.draws = &short_t;
  check_error_mentions([&] { gather(t); }, {"transform.draws"});
  // A draw's offset beyond 2P is a value in device memory: refused when the op runs.
  std::vector<int32_t> bad = {dp::pack_draw(0, 0, false), dp::pack_draw(5, 0, false)};
  const dp::Tensor bad_t = host_tensor(bad, {2});
  t = {};
  t.crop_padding = 2;
  t.draws = &bad_t;
  check_error_mentions([&] { gather(t); }, {"transform.draws[1]", "outside [0, 4]"});
}

TEST_CASE("augmentation draws depend on seed, stream and position only", "[augment]") {
  const int64_t pad = 4;
  const auto a = dp::augment_draws(9, 3, 0, 4000, pad, true);
  CHECK(a == dp::augment_draws(9, 3, 0, 4000, pad, true));
  // A window of the same stream is the same draws: a replica's shard, a resumed epoch.
  const auto tail = dp::augment_draws(9, 3, 1000, 3000, pad, true);
  CHECK(std::vector<int32_t>(a.begin() + 1000, a.end()) == tail);
  CHECK(a != dp::augment_draws(10, 3, 0, 4000, pad, true));
  CHECK(a != dp::augment_draws(9, 4, 0, 4000, pad, true));
  std::set<int64_t> oys, oxs;
  int flips = 0;
  for (int32_t d : a) {
    CHECK(dp::draw_oy(d) <= 2 * pad);
    CHECK(dp::draw_ox(d) <= 2 * pad);
    oys.insert(dp::draw_oy(d));
    oxs.insert(dp::draw_ox(d));
    flips += dp::draw_flip(d) ? 1 : 0;
  }
  CHECK(oys.size() == 9);
  CHECK(oxs.size() == 9);
  CHECK(flips > 1800);  // 2000 expected; 4.5 standard deviations either way
  CHECK(flips < 2200);
  // What is not asked for is the centre and no flip.
  for (int32_t d : dp::augment_draws(9, 3, 0, 100, 0, false))
    CHECK(d == dp::pack_draw(0, 0, false));
  for (int32_t d : dp::augment_draws(9, 3, 0, 100, 2, false)) CHECK(!dp::draw_flip(d));
  for (int32_t d : dp::augment_draws(9, 3, 0, 100, 0, true)) CHECK(dp::draw_oy(d) == 0);
}
