// ParamRegistry: names, alignment, deterministic initialisation, distributions; the ResNet-18
// names; model option resolution.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <set>

#include "dp/bf16.hpp"
#include "dp/error.hpp"
#include "dp/layers.hpp"
#include "engine_test_util.hpp"

namespace {

std::unique_ptr<dp::Backend> cpu() {
  dp::BackendOptions o;
  o.cpu_threads = 1;
  return dp::create_backend(o);
}

void declare_sample(dp::ParamRegistry& r, bool extra) {
  r.add_parameter("a.weight", {5, 3, 3, 3}, dp::Init::normal(0.5f));
  r.add_parameter("a.bias", {5}, dp::Init::constant(0.25f));
  r.add_buffer("bn.running_var", {7}, dp::Init::ones());
  if (extra) r.add_parameter("extra", {3}, dp::Init::normal(1.0f));
  r.add_parameter("b.weight", {17}, dp::Init::uniform(-2.0f, 3.0f));
}

std::vector<float> values(const dp::ParamRegistry& r, const std::vector<float>& flat,
                          const std::string& name) {
  for (const auto& e : r.entries())
    if (e.name == name) {
      auto b = flat.begin() + static_cast<std::ptrdiff_t>(e.offset);
      return {b, b + e.shape.numel()};
    }
  return {};
}

}  // namespace

TEST_CASE("ParamRegistry: unique names, aligned offsets, zero padding", "[engine][params]") {
  auto b = cpu();
  dp::ParamRegistry r;
  declare_sample(r, false);
  CHECK_THROWS_WITH(r.add_parameter("a.bias", {2}, dp::Init::zeros()),
                    Catch::Contains("duplicate") && Catch::Contains("a.bias"));
  CHECK_THROWS_AS(r.add_buffer("a.weight", {2}, dp::Init::zeros()), dp::Error);
  CHECK(r.parameter_count() == 135 + 5 + 17);
  for (const auto& e : r.entries()) CHECK(e.offset % 16 == 0);
  CHECK(r.parameter_floats() == 144 + 16 + 32);
  CHECK(r.buffer_floats() == 16);
  r.allocate(*b, 1);
  CHECK_THROWS_AS(r.add_parameter("late", {1}, dp::Init::zeros()), dp::Error);
  r.initialize(3);
  const auto p = r.download_params();
  for (size_t i = 135; i < 144; ++i) CHECK(p[i] == 0.0f);
  CHECK(values(r, p, "a.bias") == std::vector<float>(5, 0.25f));
  CHECK(values(r, r.download_buffers(), "bn.running_var") == std::vector<float>(7, 1.0f));
  for (float v : values(r, p, "b.weight")) CHECK((v >= -2.0f && v < 3.0f));
  // Gradients and momentum start at zero.
  std::vector<float> g(r.parameter_floats()), m(r.parameter_floats());
  b->download(g.data(), r.grads_flat().data, g.size() * 4);
  b->download(m.data(), r.state_flat()[0].data, m.size() * 4);
  CHECK(g == std::vector<float>(g.size(), 0.0f));
  CHECK(m == std::vector<float>(m.size(), 0.0f));
  // Views point into the flat buffers.
  CHECK(r.param(dp::ParamHandle{1}).data ==
        static_cast<float*>(r.params_flat().data) + r.entries()[1].offset);
  CHECK(r.buffer(dp::ParamHandle{2}).shape == dp::Shape{7});
  CHECK_THROWS_AS(r.upload_params(std::vector<float>(3)), dp::Error);
}

TEST_CASE("ParamRegistry: the packed bf16 copy is the parameters' rounding after every upload",
          "[engine][params]") {
  auto b = cpu();
  dp::ParamRegistry plain;
  declare_sample(plain, false);
  plain.allocate(*b);
  CHECK(plain.params_bf16_flat() == nullptr);
  CHECK(plain.param_bf16(dp::ParamHandle{0}) == nullptr);

  dp::ParamRegistry r;
  r.set_layout(dp::Layout::nhwc);
  // declare_sample's entries, a.weight kept as (K, R, S, C): its copy is in that order too.
  r.add_parameter("a.weight", {5, 3, 3, 3}, dp::Init::normal(0.5f), dp::Layout::nhwc);
  r.add_parameter("a.bias", {5}, dp::Init::constant(0.25f));
  r.add_buffer("bn.running_var", {7}, dp::Init::ones());
  r.add_parameter("b.weight", {17}, dp::Init::uniform(-2.0f, 3.0f));
  r.allocate(*b, 0, true);
  const auto copy_bits = [&] {
    std::vector<uint16_t> bits(r.parameter_floats());
    b->download(bits.data(), r.params_bf16_flat()->data, bits.size() * sizeof(uint16_t));
    return bits;
  };
  const auto rounding = [](const std::vector<float>& v) {
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      bits[i] = dp::packed_bf16_bits(std::bit_cast<uint32_t>(v[i]));
    return bits;
  };
  REQUIRE(r.params_bf16_flat() != nullptr);
  CHECK(r.params_bf16_flat()->dtype == dp::DType::bf16);
  CHECK(r.params_bf16_flat()->shape == dp::Shape{static_cast<int64_t>(r.parameter_floats())});
  for (const int index : {0, 1, 3}) {  // a.weight, a.bias, b.weight (2 is a buffer)
    const dp::ParamHandle h{index};
    const dp::Tensor* w16 = r.param_bf16(h);
    REQUIRE(w16 != nullptr);
    CHECK(w16->shape == r.param(h).shape);
    CHECK(w16->layout == r.param(h).layout);
    CHECK(static_cast<const uint16_t*>(w16->data) ==
          static_cast<const uint16_t*>(r.params_bf16_flat()->data) + r.entries()[index].offset);
  }
  CHECK(r.param(dp::ParamHandle{0}).layout == dp::Layout::nhwc);
  r.initialize(5);
  CHECK(copy_bits() == rounding(r.download_params()));
  // Values whose rounding is not their truncation (the copy is not the high halves).
  std::vector<float> next = r.download_params();
  for (size_t i = 0; i < next.size(); ++i)
    next[i] = 1.0f + static_cast<float>(i % 7) * 0x1p-9f + 0x1p-20f;
  r.upload_params(next);
  CHECK(copy_bits() == rounding(next));
}

TEST_CASE("ParamRegistry: a seed means the same values, entries do not shift each other",
          "[engine][params]") {
  auto b = cpu();
  dp::ParamRegistry r1, r2, r3, r4;
  for (auto* r : {&r1, &r2, &r3}) declare_sample(*r, false);
  declare_sample(r4, true);
  for (auto* r : {&r1, &r2, &r3, &r4}) r->allocate(*b);
  r1.initialize(7);
  r2.initialize(7);
  r3.initialize(8);
  r4.initialize(7);
  CHECK(r1.state_flat().empty());
  CHECK(r1.download_params() == r2.download_params());
  CHECK(r1.download_params() != r3.download_params());
  // Streams are per entry index: entries declared before the extra one are unchanged.
  CHECK(values(r1, r1.download_params(), "a.weight") ==
        values(r4, r4.download_params(), "a.weight"));
  // Re-initialising gives the same values again.
  const auto before = r1.download_params();
  r1.initialize(7);
  CHECK(r1.download_params() == before);
}

TEST_CASE(
    "ParamRegistry: a weight stored in NHWC order holds the values it holds stored as it reads, "
    "in (K, R, S, C) order",
    "[engine][params]") {
  auto b = cpu();
  dp::ParamRegistry plain, nhwc;
  nhwc.set_layout(dp::Layout::nhwc);
  CHECK(plain.layout() == dp::Layout::nchw);
  for (auto* r : {&plain, &nhwc}) {
    r->add_parameter("a.weight", {5, 3, 2, 4}, dp::Init::normal(0.5f), r->layout());
    r->add_parameter("a.bias", {5}, dp::Init::uniform(-1.0f, 1.0f));
    r->allocate(*b);
    r->initialize(11);
  }
  CHECK(nhwc.entries()[0].layout == dp::Layout::nhwc);
  CHECK(nhwc.entries()[1].layout == dp::Layout::nchw);
  CHECK(nhwc.param(dp::ParamHandle{0}).layout == dp::Layout::nhwc);
  CHECK(nhwc.grad(dp::ParamHandle{0}).layout == dp::Layout::nhwc);
  CHECK(plain.param(dp::ParamHandle{0}).layout == dp::Layout::nchw);
  const auto kcrs = values(plain, plain.download_params(), "a.weight");
  const auto krsc = values(nhwc, nhwc.download_params(), "a.weight");
  REQUIRE(kcrs.size() == krsc.size());
  for (int64_t k = 0; k < 5; ++k)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t t = 0; t < 8; ++t)
        CHECK(krsc[static_cast<size_t>((k * 8 + t) * 3 + c)] ==
              kcrs[static_cast<size_t>((k * 3 + c) * 8 + t)]);
  CHECK(values(nhwc, nhwc.download_params(), "a.bias") ==
        values(plain, plain.download_params(), "a.bias"));

  // The layout comes before the declarations; only a rank-4 shape has another order.
  CHECK_THROWS_WITH(nhwc.set_layout(dp::Layout::nchw),
                    Catch::Contains("set_layout") && Catch::Contains("a.weight"));
  // The reading-order copies: the inverse of each other, (K, C, R, S) for the NHWC weight, and
  // a copy of another length refused.
  const auto stored = nhwc.download_params();
  const auto reading = nhwc.params_in_reading_order(stored);
  CHECK(values(nhwc, reading, "a.weight") == kcrs);
  CHECK(nhwc.params_in_memory_order(reading) == stored);
  CHECK(plain.params_in_reading_order(plain.download_params()) == plain.download_params());
  CHECK_THROWS_WITH(nhwc.params_in_memory_order(std::vector<float>(7)),
                    Catch::Contains("params_in_memory_order: got 7 floats"));
  CHECK_THROWS_WITH(nhwc.params_in_reading_order(std::vector<float>(7)),
                    Catch::Contains("params_in_reading_order: got 7 floats"));
  dp::ParamRegistry r;
  CHECK_THROWS_WITH(r.add_parameter("w", {4, 6}, dp::Init::zeros(), dp::Layout::nhwc),
                    Catch::Contains("'w'") && Catch::Contains("rank-4"));
}

TEST_CASE("ParamRegistry: initial distributions", "[engine][params]") {
  auto b = cpu();
  dp::ParamRegistry r;
  r.add_parameter("n", {200000}, dp::Init::normal(0.5f, 2.0f));
  r.add_parameter("u", {200000}, dp::Init::uniform(-1.0f, 3.0f));
  r.allocate(*b);
  r.initialize(1);
  const auto p = r.download_params();
  auto stats = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x;
    const double mean = s / static_cast<double>(v.size());
    for (float x : v) s2 += (x - mean) * (x - mean);
    return std::pair<double, double>(mean, std::sqrt(s2 / static_cast<double>(v.size())));
  };
  // Standard errors: 0.5 / sqrt(2e5) ~ 0.0011 for the mean; well inside these bounds.
  const auto [nm, ns] = stats(values(r, p, "n"));
  CHECK(nm == Approx(2.0).margin(0.006));
  CHECK(ns == Approx(0.5).margin(0.005));
  const auto u = values(r, p, "u");
  const auto [um, us] = stats(u);
  CHECK(um == Approx(1.0).margin(0.02));
  CHECK(us == Approx(4.0 / std::sqrt(12.0)).margin(0.01));
  CHECK(*std::min_element(u.begin(), u.end()) >= -1.0f);
  CHECK(*std::max_element(u.begin(), u.end()) < 3.0f);
}

TEST_CASE("ResNet-18 from its plugin: PyTorch names, unique, the d2l parameter count",
          "[engine][params]") {
  auto model = enginetest::build_model("libdprun_resnet18.so", "resnet18");
  dp::ParamRegistry r;
  model->declare(r, "");
  std::set<std::string> names;
  for (const auto& e : r.entries()) names.insert(e.name);
  CHECK(names.size() == r.entries().size());
  for (const char* n :
       {"0.weight", "0.bias", "1.weight", "1.running_mean", "resnet_block1.0.conv1.weight",
        "resnet_block2.0.conv1.weight", "resnet_block2.0.conv3.weight",
        "resnet_block4.1.bn2.running_var", "fc.1.weight", "fc.1.bias"})
    CHECK(names.count(n) == 1);
  CHECK(names.count("resnet_block1.0.conv3.weight") == 0);
  // d2l's ResNet-18 for one input channel and 10 classes (with conv biases): 11,175,818.
  CHECK(r.parameter_count() == 11175818);
}

TEST_CASE("Model options: defaults, type checks, helpful errors", "[engine][params]") {
  const dp::ModelFactory lenet = enginetest::plugin_model("libdprun_lenet.so", "lenet");
  const auto all = dp::resolve_model_options(lenet, {});
  CHECK(std::get<int64_t>(all.at("hidden")) == 128);
  CHECK(std::get<std::string>(all.at("pool")) == "avg");
  // An int is accepted for a float option.
  const auto o = dp::resolve_model_options(lenet, {{"init_std", int64_t{1}}});
  CHECK(std::get<double>(o.at("init_std")) == 1.0);
  CHECK_THROWS_WITH(dp::resolve_model_options(lenet, {{"hiden", int64_t{3}}}),
                    Catch::Contains("lenet") && Catch::Contains("hiden") &&
                        Catch::Contains("hidden (int, default 128)") &&
                        Catch::Contains("pool (string"));
  CHECK_THROWS_WITH(dp::resolve_model_options(lenet, {{"hidden", std::string("two")}}),
                    Catch::Contains("lenet") && Catch::Contains("'hidden'") &&
                        Catch::Contains("expects int") && Catch::Contains("got string \"two\""));
  CHECK_THROWS_WITH(dp::resolve_model_options(lenet, {{"pool", 2.5}}),
                    Catch::Contains("expects string, got float 2.5"));

  CHECK(dp::option_to_string(true) == "true");
  CHECK(dp::option_to_string(int64_t{-3}) == "-3");
  CHECK(dp::option_to_string(0.1) == "0.1");
  CHECK(dp::option_to_string(2.0) == "2.0");
  CHECK(dp::option_to_string(std::string("a\"b")) == "\"a\\\"b\"");
  CHECK(dp::option_type_name(1.0) == "float");
  CHECK(dp::option_type_name(std::string()) == "string");
}
