// Batch norm over the shapes where a layout or indexing mistake shows: C in {1, 3, 4, 8, 64},
// H != W, N in {1, 3}; training (output, running statistics, dx, dgamma, dbeta) and evaluation,
// plain and with the fused ReLU, in both layouts, on every backend present (the CUDA pass runs on
// the GPU machine), each against a naive reference in double. Found by the first GPU run: an NHWC
// module was once compared with an NCHW oracle fed the same memory, which looked like a wrong
// CUDA batch norm at (N 3, C 4, H 5, W 3).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dp/layers.hpp"
#include "support/bn_reference.hpp"
#include "support/check.hpp"
#include "support/module_check.hpp"

using dptest::entry_values;
using dptest::ModuleRunner;

namespace {

constexpr double kEps = 1e-5, kMomentum = 0.1;

}  // namespace

TEST_CASE("BatchNorm2d over channel counts, non-square images and batches of 1 and 3",
          "[engine][layers][batchnorm]") {
  const int64_t c = GENERATE(1, 3, 4, 8, 64);
  const int64_t n = GENERATE(1, 3);
  const auto hw_pair = GENERATE(std::pair<int64_t, int64_t>{5, 3}, std::pair<int64_t, int64_t>{2, 7});
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  const bool relu = GENERATE(false, true);
  const auto [h, w] = hw_pair;
  const dp::Shape in{n, c, h, w};
  INFO("N " << n << " C " << c << " H " << h << " W " << w << ", " << dp::layout_name(layout)
            << (relu ? ", fused ReLU" : ", plain"));
  DP_FOR_EACH_BACKEND(kind) {
    ModuleRunner run(std::make_unique<dp::BatchNorm2d>(c, static_cast<float>(kEps),
                                                       static_cast<float>(kMomentum),
                                                       dp::BatchNorm2d::Fused{false, relu}),
                     in, 3, kind, layout);
    // gamma of both signs and away from 1, beta away from 0; inputs with a per-channel offset so
    // the means differ between channels (a channel mix-up changes the result).
    std::vector<float> params = run.params();
    const auto& reg = run.registry();
    for (const auto& e : reg.entries()) {
      if (!e.trainable) continue;
      const auto v = dptest::random_vector(e.shape.numel(), e.name == "weight" ? 5 : 6, -1.5f, 1.5f);
      for (size_t i = 0; i < v.size(); ++i) params[e.offset + i] = v[i];
    }
    run.set_params(params);
    std::vector<float> x = dptest::random_vector(in.numel(), 7, -2.0f, 2.0f);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t i = 0; i < h * w; ++i)
          x[static_cast<size_t>((b * c + ch) * h * w + i)] += 0.5f * static_cast<float>(ch % 5);
    const std::vector<float> dy = dptest::random_vector(in.numel(), 8);
    const bool nhwc = layout == dp::Layout::nhwc;
    const auto mine = [&](const std::vector<float>& v) {
      return nhwc ? dptest::to_nhwc(v, n, c, h, w) : v;
    };
    const auto nchw = [&](const std::vector<float>& v) {
      return nhwc ? dptest::to_nchw(v, n, c, h, w) : v;
    };

    const std::vector<float> buffers0 = reg.download_buffers();
    const std::vector<float> y = nchw(run.forward(mine(x), true));
    const std::vector<float> dx = nchw(run.backward(mine(dy)));
    const std::vector<float> grads = run.grads();
    const std::vector<float> buffers = reg.download_buffers();
    const std::vector<float> y_eval = nchw(run.forward(mine(x), false));

    const dptest::BnReference ref = dptest::bn_reference(
        x, dy, entry_values(reg, params, "weight"), entry_values(reg, params, "bias"),
        entry_values(reg, buffers0, "running_mean"), entry_values(reg, buffers0, "running_var"), y,
        n, c, h * w, relu, kEps, kMomentum);
    dptest::check_bn_close("training output", y, ref.y);
    dptest::check_bn_close("dx", dx, ref.dx);
    dptest::check_bn_close("dgamma", entry_values(reg, grads, "weight"), ref.dgamma);
    dptest::check_bn_close("dbeta", entry_values(reg, grads, "bias"), ref.dbeta);
    dptest::check_bn_close("running mean", entry_values(reg, buffers, "running_mean"),
                           ref.running_mean);
    dptest::check_bn_close("running var", entry_values(reg, buffers, "running_var"),
                           ref.running_var);
    dptest::check_bn_close("evaluation output", y_eval, ref.y_eval);
  }
}
