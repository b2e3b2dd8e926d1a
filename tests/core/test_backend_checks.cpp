// The argument checks every backend shares (dp::Backend's public ops): each bad call is refused
// with a message naming the backend, the op and what is wrong, before the backend's code runs;
// empty batches and empty tensors without memory are accepted, with sums over no examples zero.
// tests/cuda runs the same table on the GPU and compares the messages with these.
#include <catch2/catch.hpp>
#include <string>

#include "support/backend_cases.hpp"
#include "test_cpu_util.hpp"

TEST_CASE("cpu backend: every op refuses bad arguments with a message naming it", "[cpu][ops]") {
  auto backend = cputest::make_cpu();
  dptest::BackendCases cases(*backend);
  REQUIRE(cases.bad_calls().size() >= 40);
  for (const auto& c : cases.bad_calls()) {
    INFO(c.op << ": " << c.what);
    const std::string message = dptest::error_of(c.call);
    INFO("message: " << message);
    REQUIRE(!message.empty());
    CHECK(message.rfind("cpu backend: " + c.op + ": ", 0) == 0);
    for (const auto& m : c.mentions) CHECK_THAT(message, Catch::Contains(m));
  }
}

TEST_CASE("cpu backend: empty batches are accepted and sums over them are zero", "[cpu][ops]") {
  auto backend = cputest::make_cpu();
  dptest::BackendCases cases(*backend);
  const auto results = cases.run_empty_calls();
  CHECK(results.size() == 9);
  for (const auto& [name, values] : results) {
    INFO(name);
    CHECK(!values.empty());
    for (float v : values) CHECK(v == 0.0f);
  }
}

TEST_CASE("cpu backend: what it does not implement is named as such", "[cpu][ops]") {
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();
  auto backend = cputest::make_cpu(2, kernels);
  dp::ConvGeometry g;
  g.dtype = dp::DType::bf16;
  cputest::check_error_mentions([&] { backend->plan_conv(g); },
                                {"cpu backend: plan_conv", "bf16", "use f32"});
}
