// The precision contract of GPU convolutions (dp/conv_contract.hpp) is a pure function of the
// settings: held here without a GPU. The [cuda] tests hold the CUDA backend to it (every allowed
// algorithm computes within the contract's tolerance; a forbidden one is refused).
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/conv_contract.hpp"
#include "dp/error.hpp"

using dp::ConvContract;
using dp::ConvDirection;
using dp::ConvFamily;
using dp::ConvMath;

namespace {

struct Algo {
  ConvDirection d;
  int algo;
  const char* name;
  ConvFamily family;
};

// cuDNN 9's algorithm numbers (cudnn_ops.h), each with the family dprun files it under.
const std::vector<Algo>& every_algorithm() {
  static const std::vector<Algo> all = {
      {ConvDirection::forward, 0, "IMPLICIT_GEMM", ConvFamily::gemm},
      {ConvDirection::forward, 1, "IMPLICIT_PRECOMP_GEMM", ConvFamily::gemm},
      {ConvDirection::forward, 2, "GEMM", ConvFamily::gemm},
      {ConvDirection::forward, 3, "DIRECT", ConvFamily::direct},
      {ConvDirection::forward, 4, "FFT", ConvFamily::fft},
      {ConvDirection::forward, 5, "FFT_TILING", ConvFamily::fft},
      {ConvDirection::forward, 6, "WINOGRAD", ConvFamily::winograd},
      {ConvDirection::forward, 7, "WINOGRAD_NONFUSED", ConvFamily::winograd},
      {ConvDirection::backward_data, 0, "ALGO_0", ConvFamily::gemm},
      {ConvDirection::backward_data, 1, "ALGO_1", ConvFamily::gemm},
      {ConvDirection::backward_data, 2, "FFT", ConvFamily::fft},
      {ConvDirection::backward_data, 3, "FFT_TILING", ConvFamily::fft},
      {ConvDirection::backward_data, 4, "WINOGRAD", ConvFamily::winograd},
      {ConvDirection::backward_data, 5, "WINOGRAD_NONFUSED", ConvFamily::winograd},
      {ConvDirection::backward_filter, 0, "ALGO_0", ConvFamily::gemm},
      {ConvDirection::backward_filter, 1, "ALGO_1", ConvFamily::gemm},
      {ConvDirection::backward_filter, 2, "FFT", ConvFamily::fft},
      {ConvDirection::backward_filter, 3, "ALGO_3", ConvFamily::gemm},
      {ConvDirection::backward_filter, 4, "WINOGRAD", ConvFamily::winograd},
      {ConvDirection::backward_filter, 5, "WINOGRAD_NONFUSED", ConvFamily::winograd},
      {ConvDirection::backward_filter, 6, "FFT_TILING", ConvFamily::fft},
  };
  return all;
}

const std::vector<ConvMath> kMaths = {ConvMath::default_math, ConvMath::tensor_op,
                                      ConvMath::tensor_op_allow_conversion, ConvMath::fma};

}  // namespace

TEST_CASE("conv contract: the settings decide the contract", "[conv_contract]") {
  CHECK(dp::conv_contract(dp::Precision::fp32, false) == ConvContract::fp32_exact);
  CHECK(dp::conv_contract(dp::Precision::fp32, true) == ConvContract::tf32);
  CHECK(dp::conv_contract(dp::Precision::bf16, true) == ConvContract::bf16);
  CHECK(dp::conv_contract(dp::Precision::bf16, false) == ConvContract::bf16);
  CHECK(std::string(dp::conv_contract_name(ConvContract::fp32_exact)) == "fp32-exact");
  CHECK(std::string(dp::conv_contract_name(ConvContract::tf32)) == "tf32");
  CHECK(std::string(dp::conv_contract_name(ConvContract::bf16)) == "bf16");
}

TEST_CASE("conv contract: cuDNN's algorithms by number, name and family", "[conv_contract]") {
  for (const Algo& a : every_algorithm()) {
    INFO(dp::conv_direction_name(a.d) << " " << a.algo);
    CHECK(dp::conv_algorithm_name(a.d, a.algo) == a.name);
    CHECK(dp::conv_family(a.d, a.algo) == a.family);
  }
  // One past the last of each direction, and negative numbers: unknown.
  CHECK(dp::conv_family(ConvDirection::forward, 8) == ConvFamily::unknown);
  CHECK(dp::conv_family(ConvDirection::backward_data, 6) == ConvFamily::unknown);
  CHECK(dp::conv_family(ConvDirection::backward_filter, 7) == ConvFamily::unknown);
  CHECK(dp::conv_family(ConvDirection::forward, -1) == ConvFamily::unknown);
  CHECK(dp::conv_algorithm_name(ConvDirection::forward, 9) == "algorithm 9");
  // dprun's own 1x1 forward: a GEMM, forward only, held to the contracts as cuDNN's GEMMs are.
  CHECK(dp::conv_algorithm_name(ConvDirection::forward, dp::kConvAlgoDprunGemm1x1) ==
        "DPRUN_GEMM_1X1");
  CHECK(dp::conv_family(ConvDirection::forward, dp::kConvAlgoDprunGemm1x1) == ConvFamily::gemm);
  CHECK(dp::conv_family(ConvDirection::backward_data, dp::kConvAlgoDprunGemm1x1) ==
        ConvFamily::unknown);
  CHECK(dp::conv_family(ConvDirection::backward_filter, dp::kConvAlgoDprunGemm1x1) ==
        ConvFamily::unknown);
  const auto forward = ConvDirection::forward;
  const int own = dp::kConvAlgoDprunGemm1x1;
  CHECK(dp::conv_contract_allows(ConvContract::fp32_exact, forward, own, ConvMath::fma));
  CHECK_FALSE(
      dp::conv_contract_allows(ConvContract::fp32_exact, forward, own, ConvMath::default_math));
  CHECK(dp::conv_contract_allows(ConvContract::tf32, forward, own, ConvMath::default_math));
  CHECK(dp::conv_contract_allows(ConvContract::bf16, forward, own, ConvMath::default_math));
  CHECK_THAT(dp::conv_contract_refusal(ConvContract::tf32, ConvDirection::backward_data, own,
                                       ConvMath::fma),
             Catch::Contains("neither one of cuDNN 9's nor dprun's own"));
  // dprun's few-channel passes: direct, forward and filter gradient, FMA math under every
  // contract; no input gradient.
  const int small = dp::kConvAlgoDprunSmallC;
  for (const ConvDirection d : {ConvDirection::forward, ConvDirection::backward_filter}) {
    INFO(dp::conv_direction_name(d));
    CHECK(dp::conv_algorithm_name(d, small) == "DPRUN_DIRECT_SMALL_C");
    CHECK(dp::conv_family(d, small) == ConvFamily::direct);
    for (const ConvContract c : {ConvContract::fp32_exact, ConvContract::tf32, ConvContract::bf16})
      CHECK(dp::conv_contract_allows(c, d, small, ConvMath::fma));
  }
  CHECK(dp::conv_family(ConvDirection::backward_data, small) == ConvFamily::unknown);
  CHECK_FALSE(dp::conv_contract_allows(ConvContract::tf32, ConvDirection::backward_data, small,
                                       ConvMath::fma));
}

TEST_CASE("conv contract: fp32-exact allows GEMM and direct algorithms with FMA math only",
          "[conv_contract]") {
  for (const Algo& a : every_algorithm()) {
    for (ConvMath m : kMaths) {
      INFO(dp::conv_direction_name(a.d) << " " << a.name << " " << dp::conv_math_name(m));
      const bool dot_product = a.family == ConvFamily::gemm || a.family == ConvFamily::direct;
      CHECK(dp::conv_contract_allows(ConvContract::fp32_exact, a.d, a.algo, m) ==
            (dot_product && m == ConvMath::fma));
    }
  }
  // The H100 run's case: timing under compute-sanitizer picked WINOGRAD_NONFUSED with FMA math
  // for LeNet's 20->50 5x5 convolution, which is off by up to 1.85e-2.
  const std::string why = dp::conv_contract_refusal(ConvContract::fp32_exact,
                                                    ConvDirection::forward, 7, ConvMath::fma);
  CHECK_THAT(why, Catch::Contains("fp32-exact") && Catch::Contains("WINOGRAD_NONFUSED") &&
                      Catch::Contains("Winograd"));
  CHECK_THAT(dp::conv_contract_refusal(ConvContract::fp32_exact, ConvDirection::forward, 1,
                                       ConvMath::default_math),
             Catch::Contains("FMA math only") && Catch::Contains("TF32"));
  CHECK_THAT(dp::conv_contract_refusal(ConvContract::fp32_exact, ConvDirection::backward_filter,
                                       2, ConvMath::fma),
             Catch::Contains("an FFT"));
}

TEST_CASE(
    "conv contract: tf32 allows every known algorithm, bf16 GEMM and direct ones with "
    "tensor-core or FMA math, never a down-conversion",
    "[conv_contract]") {
  for (ConvContract c : {ConvContract::tf32, ConvContract::bf16}) {
    for (const Algo& a : every_algorithm()) {
      for (ConvMath m : kMaths) {
        INFO(dp::conv_contract_name(c) << " " << dp::conv_direction_name(a.d) << " " << a.name
                                       << " " << dp::conv_math_name(m));
        // bf16's operands are bf16 values: a dot product of them is exact products summed in
        // fp32 with either math (TF32 holds a bf16 significand); an FFT or Winograd transform
        // rounds again.
        const bool dot_product = a.family == ConvFamily::gemm || a.family == ConvFamily::direct;
        CHECK(dp::conv_contract_allows(c, a.d, a.algo, m) ==
              (m != ConvMath::tensor_op_allow_conversion &&
               (c == ConvContract::tf32 || dot_product)));
      }
    }
    CHECK_THAT(dp::conv_contract_refusal(c, ConvDirection::forward, 1,
                                         ConvMath::tensor_op_allow_conversion),
               Catch::Contains("fp16"));
    // An algorithm this dprun does not know has no known rounding: refused by every contract.
    CHECK_THAT(dp::conv_contract_refusal(c, ConvDirection::forward, 8, ConvMath::default_math),
               Catch::Contains("algorithm 8"));
    CHECK_FALSE(dp::conv_contract_allows(c, ConvDirection::forward, 1, static_cast<ConvMath>(7)));
  }
  CHECK_THAT(dp::conv_contract_refusal(ConvContract::bf16, ConvDirection::backward_data, 5,
                                       ConvMath::default_math),
             Catch::Contains("bf16") && Catch::Contains("WINOGRAD_NONFUSED") &&
                 Catch::Contains("round the bf16 operands"));
  CHECK_THAT(
      dp::conv_contract_refusal(ConvContract::bf16, ConvDirection::forward, 4, ConvMath::tensor_op),
      Catch::Contains("an FFT"));
}

TEST_CASE("conv contract: the math an algorithm runs with", "[conv_contract]") {
  for (ConvMath m : kMaths) {
    INFO(dp::conv_math_name(m));
    CHECK(dp::conv_contract_math(ConvContract::fp32_exact, m) == ConvMath::fma);
    const ConvMath expected = m == ConvMath::tensor_op_allow_conversion ? ConvMath::tensor_op : m;
    CHECK(dp::conv_contract_math(ConvContract::tf32, m) == expected);
    CHECK(dp::conv_contract_math(ConvContract::bf16, m) == expected);
    // Whatever the heuristics suggest, the math the contract picks for a GEMM is allowed.
    for (ConvContract c : {ConvContract::fp32_exact, ConvContract::tf32, ConvContract::bf16}) {
      CHECK(dp::conv_contract_allows(c, ConvDirection::forward, 1, dp::conv_contract_math(c, m)));
    }
  }
}

TEST_CASE("conv contract: the text names every contract and its rule", "[conv_contract]") {
  const std::string text = dp::conv_contract_text();
  for (const char* s : {"fp32-exact", "allow_tf32 = false", "GEMM and direct", "FMA", "tf32",
                        "FFT", "Winograd", "bf16", "fp16", "never by timing"}) {
    CHECK_THAT(text, Catch::Contains(s));
  }
}

TEST_CASE("conv contract: the CUDA introspection refuses a CPU backend", "[conv_contract]") {
  dp::BackendOptions o;
  o.kind = dp::BackendKind::cpu;
  o.cpu_threads = 1;
  auto cpu = dp::create_backend(o);
  dp::ConvGeometry g;
  g.max_batch = 2;
  g.in_channels = 3;
  g.in_h = g.in_w = 5;
  g.out_channels = 4;
  g.kernel_h = g.kernel_w = 3;
  auto plan = cpu->plan_conv(g, {});
  const auto expected = Catch::Contains("cuDNN");
  CHECK_THROWS_WITH(dp::cuda_conv_algorithms(*cpu, *plan, ConvDirection::forward, 2), expected);
  CHECK_THROWS_WITH(dp::cuda_conv_choice(*cpu, *plan, ConvDirection::forward, 2), expected);
  CHECK_THROWS_WITH(dp::cuda_use_conv_algorithm(*cpu, *plan, dp::ConvAlgorithm{}), expected);
  CHECK_THROWS_WITH(dp::cuda_conv_choice_key(*cpu, *plan, ConvDirection::forward, 2), expected);
}

TEST_CASE("conv contract: an algorithm in words", "[conv_contract]") {
  dp::ConvAlgorithm a{ConvDirection::backward_filter, 256, 3, ConvMath::fma, 1024, false};
  CHECK(a.str() ==
        "backward-filter batch 256: ALGO_3 (gemm), fma math, workspace 1024 bytes, "
        "non-deterministic");
}
