// The per-tensor comparison helpers (tests/support/param_compare): they must pass identical
// models, catch and name a wrong tensor, and nudge parameters reproducibly by ulps.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>

#include "dp/error.hpp"
#include "dp/params.hpp"
#include "engine_test_util.hpp"
#include "support/module_check.hpp"
#include "support/param_compare.hpp"

namespace {

// Three tensors with gaps between them, as a registry lays them out (64-byte aligned).
std::vector<dptest::NamedSpan> three_tensors() {
  return {{"conv.weight", dp::Shape{4, 1, 3, 3}, 0, 36},
          {"conv.bias", dp::Shape{4}, 48, 4},
          {"fc.weight", dp::Shape{10, 4}, 64, 40}};
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) v[i] = scale * (static_cast<float>(i % 7) - 3.0f);
  return v;
}

}  // namespace

TEST_CASE("param_compare: identical models pass with every error zero", "[cpu][compare]") {
  const auto spans = three_tensors();
  const auto a = ramp(104, 0.1f);
  const auto r = dptest::compare_tensors("identical", spans, a, a, 0.0);
  CHECK(r.ok());
  CHECK(r.failures == 0);
  REQUIRE(r.tensors.size() == 3);
  for (const auto& t : r.tensors) CHECK(t.rel_error == 0.0);
}

TEST_CASE("param_compare: a wrong tensor fails, named first, the others pass", "[cpu][compare]") {
  const auto spans = three_tensors();
  const auto expected = ramp(104, 0.1f);
  auto actual = expected;
  // conv.bias off by 1 % of its own size: small next to the weights, large for a bias.
  for (size_t i = 48; i < 52; ++i) actual[i] = expected[i] * 1.01f;
  // Noise at 1e-7 relative everywhere: below every tolerance.
  for (size_t i = 0; i < 36; ++i) actual[i] = expected[i] * (1.0f + 1e-7f);
  const auto r = dptest::compare_tensors("one wrong bias", spans, actual, expected, 1e-3);
  CHECK_FALSE(r.ok());
  CHECK(r.failures == 1);
  REQUIRE(r.tensors.size() == 3);
  CHECK(r.tensors[0].name == "conv.bias");
  CHECK(r.tensors[0].rel_error == Approx(0.01).epsilon(1e-3));
  CHECK_FALSE(r.tensors[0].ok());
  CHECK(r.tensors[1].ok());
  CHECK(r.tensors[2].ok());
  const std::string table = r.table(2);
  INFO(table);
  CHECK(table.find("1 of 3 tensors over tolerance") != std::string::npos);
  CHECK(table.find("conv.bias") != std::string::npos);
  CHECK(table.find("(4)") != std::string::npos);  // its shape
  CHECK(table.find("FAIL") != std::string::npos);
  CHECK(table.find("fc.weight") == std::string::npos);  // only the 2 worst are listed
  // The same error held to a tolerance above it passes: the tolerance is per tensor.
  const auto loose = dptest::compare_tensors("bias held to 2 %", spans, actual, expected,
                                             std::vector<double>{1e-3, 2e-2, 1e-3});
  CHECK(loose.ok());
}

TEST_CASE("param_compare: padding is ignored, NaN fails, zero references are absolute",
          "[cpu][compare]") {
  const auto spans = three_tensors();
  const auto expected = ramp(104, 0.5f);
  auto actual = expected;
  actual[40] = 123.0f;  // padding between conv.weight and conv.bias
  CHECK(dptest::compare_tensors("padding", spans, actual, expected, 0.0).ok());
  actual[70] = std::numeric_limits<float>::quiet_NaN();
  const auto nan = dptest::compare_tensors("nan", spans, actual, expected, 1e9);
  CHECK_FALSE(nan.ok());
  CHECK(nan.tensors[0].name == "fc.weight");
  CHECK(std::isnan(nan.tensors[0].rel_error));
  // A tensor that should be all zeros is judged by its absolute size.
  std::vector<float> zeros(104, 0.0f), tiny(104, 0.0f);
  tiny[50] = 1e-20f;
  const auto z = dptest::compare_tensors("zeros", spans, tiny, zeros, 1.0);
  CHECK_FALSE(z.ok());
  CHECK(z.tensors[0].name == "conv.bias");
  CHECK_THROWS(dptest::compare_tensors("short", spans, std::vector<float>(60), zeros, 1.0));
}

TEST_CASE("param_compare: derived tolerances and the worst of several samples", "[cpu][compare]") {
  const auto spans = three_tensors();
  std::vector<dptest::TensorError> a(3), b(3);
  for (size_t i = 0; i < 3; ++i) a[i].name = b[i].name = spans[i].name;
  a[0].rel_error = 1e-6, a[1].rel_error = 0.5, a[2].rel_error = 0.0;
  b[0].rel_error = 2e-6, b[1].rel_error = 0.1, b[2].rel_error = std::nan("");
  const auto w = dptest::worst_of(a, b);
  CHECK(w[0].rel_error == 2e-6);
  CHECK(w[1].rel_error == 0.5);
  CHECK(std::isnan(w[2].rel_error));
  const auto t = dptest::scaled_tolerances(a, 10.0, 1e-5, 1.0);
  CHECK(t[0] == Approx(1e-5));  // the floor: 10 x 1e-6 is below it
  CHECK(t[1] == Approx(1.0));   // the cap
  CHECK(t[2] == Approx(1e-5));
  std::string name;
  CHECK(dptest::max_rel_error(a, &name) == 0.5);
  CHECK(name == "conv.bias");
}

TEST_CASE("param_compare: nudge_ulps moves each nonzero value by exactly n ulps, reproducibly",
          "[cpu][compare]") {
  const auto spans = three_tensors();
  auto flat = ramp(104, 0.25f);
  flat[40] = 7.0f;  // padding: must stay
  const auto one = dptest::nudge_ulps(flat, spans, 42, 1);
  CHECK(one == dptest::nudge_ulps(flat, spans, 42, 1));  // same seed, same signs
  CHECK(one != dptest::nudge_ulps(flat, spans, 43, 1));
  CHECK(one[40] == 7.0f);
  int up = 0, down = 0;
  for (const auto& s : spans) {
    for (size_t i = s.offset; i < s.offset + s.count; ++i) {
      if (flat[i] == 0.0f) {
        CHECK(one[i] == 0.0f);  // exact zeros stay (no rounding makes them nonzero)
        continue;
      }
      const float inf = std::numeric_limits<float>::infinity();
      const bool is_up = one[i] == std::nextafter(flat[i], inf);
      const bool is_down = one[i] == std::nextafter(flat[i], -inf);
      CHECK((is_up || is_down));
      up += is_up, down += is_down;
    }
  }
  CHECK(up > 10);
  CHECK(down > 10);
  // Many ulps at once equal as many std::nextafter steps, also across a power of two and
  // toward zero through the subnormals.
  for (float x : {0.1f, -0.1f, 1.0f, -1.0f, 2.0f, 3e-38f, -3e-38f, 1e-44f}) {
    std::vector<float> v(104, 0.0f);
    for (size_t i = 0; i < 36; ++i) v[i] = x;
    for (int ulps : {1, 4, 1024}) {
      const auto moved = dptest::nudge_ulps(v, spans, 7, ulps);
      const auto signs = dptest::nudge_ulps(v, spans, 7, 1);
      for (size_t i = 0; i < 36; ++i) {
        const float inf = std::numeric_limits<float>::infinity();
        float walk = x;
        for (int k = 0; k < ulps; ++k) walk = std::nextafter(walk, signs[i] > x ? inf : -inf);
        INFO(x << " moved " << ulps << " ulps, element " << i);
        CHECK(moved[i] == walk);
      }
    }
  }
}

TEST_CASE("param_compare: spans follow a registry's names, shapes and offsets", "[cpu][compare]") {
  auto model = enginetest::build_model("libdprun_lenet.so", "lenet");
  dptest::ModuleRunner runner(std::move(model), dp::Shape{2, 1, 28, 28});
  const auto spans = dptest::parameter_spans(runner.registry());
  REQUIRE(spans.size() == 8);  // 2 convs and 2 linears, weight and bias each
  CHECK(spans[0].name == "0.weight");
  CHECK(spans[0].shape == dp::Shape{20, 1, 3, 3});
  CHECK(spans[0].count == 180);
  size_t total = 0;
  for (const auto& s : spans) {
    CHECK(s.offset + s.count <= runner.registry().parameter_floats());
    total += s.count;
  }
  CHECK(total == runner.registry().parameter_count());
  CHECK(dptest::buffer_spans(runner.registry()).empty());  // LeNet has no batch norm
  // A wrong tensor in a real model is found by name.
  const auto p = runner.params();
  auto q = p;
  q[spans[5].offset] += 1.0f;
  const auto r = dptest::compare_tensors("lenet", spans, q, p, 1e-6);
  CHECK(r.failures == 1);
  CHECK(r.tensors[0].name == spans[5].name);
}
