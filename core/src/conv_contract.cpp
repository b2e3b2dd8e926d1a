// The precision contract of GPU convolutions (dp/conv_contract.hpp): cuDNN's algorithm numbers
// per direction, what family each belongs to, and what each contract allows. No CUDA here; the
// numbers are checked against cudnn.h where the CUDA backend is compiled (cuda_conv.cpp).
#include "dp/conv_contract.hpp"

#include <array>
#include <string>

#include "dp/error.hpp"
#ifdef DPRUN_WITH_CUDA
#include "cuda/cuda_entry.hpp"
#endif

namespace dp {
namespace {

struct AlgoInfo {
  const char* name;
  ConvFamily family;
};

// Indexed by cuDNN's enum values (cudnn_ops.h, cuDNN 8 and 9).
constexpr std::array<AlgoInfo, 8> kForward = {{{"IMPLICIT_GEMM", ConvFamily::gemm},
                                                {"IMPLICIT_PRECOMP_GEMM", ConvFamily::gemm},
                                                {"GEMM", ConvFamily::gemm},
                                                {"DIRECT", ConvFamily::direct},
                                                {"FFT", ConvFamily::fft},
                                                {"FFT_TILING", ConvFamily::fft},
                                                {"WINOGRAD", ConvFamily::winograd},
                                                {"WINOGRAD_NONFUSED", ConvFamily::winograd}}};
// ALGO_0 and ALGO_1 are sums of products (ALGO_0 in a non-deterministic order).
constexpr std::array<AlgoInfo, 6> kBackwardData = {{{"ALGO_0", ConvFamily::gemm},
                                                     {"ALGO_1", ConvFamily::gemm},
                                                     {"FFT", ConvFamily::fft},
                                                     {"FFT_TILING", ConvFamily::fft},
                                                     {"WINOGRAD", ConvFamily::winograd},
                                                     {"WINOGRAD_NONFUSED", ConvFamily::winograd}}};
// ALGO_0, ALGO_1 and ALGO_3 are sums of products (0 and 3 in a non-deterministic order).
constexpr std::array<AlgoInfo, 7> kBackwardFilter = {{{"ALGO_0", ConvFamily::gemm},
                                                       {"ALGO_1", ConvFamily::gemm},
                                                       {"FFT", ConvFamily::fft},
                                                       {"ALGO_3", ConvFamily::gemm},
                                                       {"WINOGRAD", ConvFamily::winograd},
                                                       {"WINOGRAD_NONFUSED", ConvFamily::winograd},
                                                       {"FFT_TILING", ConvFamily::fft}}};

constexpr AlgoInfo kDprunGemm1x1 = {"DPRUN_GEMM_1X1", ConvFamily::gemm};
constexpr AlgoInfo kDprunSmallC = {"DPRUN_DIRECT_SMALL_C", ConvFamily::direct};

const AlgoInfo* find(ConvDirection d, int algo) {
  if (algo < 0) return nullptr;
  if (algo == kConvAlgoDprunGemm1x1) return d == ConvDirection::forward ? &kDprunGemm1x1 : nullptr;
  if (algo == kConvAlgoDprunSmallC)
    return d == ConvDirection::backward_data ? nullptr : &kDprunSmallC;
  const auto i = static_cast<size_t>(algo);
  switch (d) {
    case ConvDirection::forward:
      return i < kForward.size() ? &kForward[i] : nullptr;
    case ConvDirection::backward_data:
      return i < kBackwardData.size() ? &kBackwardData[i] : nullptr;
    case ConvDirection::backward_filter:
      return i < kBackwardFilter.size() ? &kBackwardFilter[i] : nullptr;
  }
  return nullptr;
}

bool known_math(ConvMath m) {
  return m == ConvMath::default_math || m == ConvMath::tensor_op ||
         m == ConvMath::tensor_op_allow_conversion || m == ConvMath::fma;
}

#ifndef DPRUN_WITH_CUDA
[[noreturn]] void no_cuda(const char* what) {
  DP_THROW(std::string(what) +
           ": dprun was built without CUDA: the convolution algorithms are cuDNN's");
}
#endif

}  // namespace

ConvContract conv_contract(Precision precision, bool allow_tf32) {
  if (precision == Precision::bf16) return ConvContract::bf16;
  return allow_tf32 ? ConvContract::tf32 : ConvContract::fp32_exact;
}

const char* conv_contract_name(ConvContract c) {
  switch (c) {
    case ConvContract::fp32_exact:
      return "fp32-exact";
    case ConvContract::tf32:
      return "tf32";
    case ConvContract::bf16:
      return "bf16";
  }
  return "?";
}

const char* conv_direction_name(ConvDirection d) {
  switch (d) {
    case ConvDirection::forward:
      return "forward";
    case ConvDirection::backward_data:
      return "backward-data";
    case ConvDirection::backward_filter:
      return "backward-filter";
  }
  return "?";
}

const char* conv_family_name(ConvFamily f) {
  switch (f) {
    case ConvFamily::gemm:
      return "gemm";
    case ConvFamily::direct:
      return "direct";
    case ConvFamily::fft:
      return "fft";
    case ConvFamily::winograd:
      return "winograd";
    case ConvFamily::unknown:
      return "unknown";
  }
  return "?";
}

ConvFamily conv_family(ConvDirection d, int algo) {
  const AlgoInfo* info = find(d, algo);
  return info != nullptr ? info->family : ConvFamily::unknown;
}

std::string conv_algorithm_name(ConvDirection d, int algo) {
  const AlgoInfo* info = find(d, algo);
  return info != nullptr ? info->name : "algorithm " + std::to_string(algo);
}

const char* conv_math_name(ConvMath m) {
  switch (m) {
    case ConvMath::default_math:
      return "default";
    case ConvMath::tensor_op:
      return "tensor-op";
    case ConvMath::tensor_op_allow_conversion:
      return "tensor-op-conversion";
    case ConvMath::fma:
      return "fma";
  }
  return "?";
}

std::string conv_contract_refusal(ConvContract c, ConvDirection d, int algo, ConvMath m) {
  const std::string what = std::string(conv_direction_name(d)) + " " + conv_algorithm_name(d, algo);
  const ConvFamily family = conv_family(d, algo);
  const std::string contract = conv_contract_name(c);
  if (family == ConvFamily::unknown) {
    return contract + " allows the algorithms whose arithmetic dprun knows: " + what +
           " is neither one of cuDNN 9's nor dprun's own";
  }
  if (!known_math(m)) {
    return contract + ": math type " + std::to_string(static_cast<int>(m)) + " is not one of cuDNN's";
  }
  if (m == ConvMath::tensor_op_allow_conversion) {
    return contract + " never down-converts: " + what +
           " with tensor-op-conversion math would round the inputs to fp16";
  }
  if (c == ConvContract::fp32_exact || c == ConvContract::bf16) {
    if (family != ConvFamily::gemm && family != ConvFamily::direct) {
      return contract + " allows GEMM and direct algorithms only: " + what + " is " +
             (family == ConvFamily::fft ? "an FFT" : "a Winograd transform") +
             (c == ConvContract::bf16 ? ", whose transform would round the bf16 operands again"
                                      : ", whose rounding is not that of an fp32 dot product");
    }
    if (c == ConvContract::fp32_exact && m != ConvMath::fma) {
      return contract + " runs with FMA math only: " + what + " with " + conv_math_name(m) +
             " math may use TF32 tensor cores";
    }
  }
  return "";
}

ConvMath conv_contract_math(ConvContract c, ConvMath suggested) {
  if (c == ConvContract::fp32_exact) return ConvMath::fma;
  return suggested == ConvMath::tensor_op_allow_conversion ? ConvMath::tensor_op : suggested;
}

std::string conv_contract_text() {
  return "Convolutions on the GPU compute under one of three contracts, set by the trial's\n"
         "settings and never by timing: cuDNN's algorithms are timed (or its heuristics asked)\n"
         "only among those the contract allows.\n"
         "  fp32-exact (precision = \"fp32\", allow_tf32 = false): GEMM and direct algorithms\n"
         "    with FMA math only, so every output is an fp32 dot product of the fp32 inputs;\n"
         "    no FFT, no Winograd, no TF32.\n"
         "  tf32 (precision = \"fp32\", allow_tf32 = true, the default): whatever cuDNN offers\n"
         "    for fp32 data with TF32 math (inputs rounded to a 10-bit mantissa, fp32 sums), FFT\n"
         "    and Winograd included, as PyTorch's convolutions by default.\n"
         "  bf16 (precision = \"bf16\"): the operands of each pass rounded to bf16, every\n"
         "    product summed in fp32 (exact products of bf16 values), the activation, input\n"
         "    gradient or weight gradient rounded to bf16 once: GEMM and direct algorithms with\n"
         "    tensor-core or FMA math; no FFT, no Winograd, whose transforms would round the\n"
         "    operands again.\n"
         "No contract down-converts to fp16. A non-deterministic algorithm is taken only when no\n"
         "deterministic one fits, with a warning.\n";
}

std::string ConvAlgorithm::str() const {
  return std::string(conv_direction_name(direction)) + " batch " + std::to_string(batch) + ": " +
         conv_algorithm_name(direction, algo) + " (" + conv_family_name(conv_family(direction, algo)) +
         "), " + conv_math_name(math) + " math, workspace " + std::to_string(workspace) +
         " bytes" + (deterministic ? "" : ", non-deterministic");
}

#ifdef DPRUN_WITH_CUDA
std::vector<ConvAlgorithm> cuda_conv_algorithms(Backend& backend, ConvPlan& plan, ConvDirection d,
                                                int64_t batch) {
  return cuda::conv_algorithms(backend, plan, d, batch);
}
ConvAlgorithm cuda_conv_choice(Backend& backend, ConvPlan& plan, ConvDirection d, int64_t batch) {
  return cuda::conv_choice(backend, plan, d, batch);
}
void cuda_use_conv_algorithm(Backend& backend, ConvPlan& plan, const ConvAlgorithm& a) {
  cuda::use_conv_algorithm(backend, plan, a);
}
ConvChoiceKey cuda_conv_choice_key(Backend& backend, ConvPlan& plan, ConvDirection d,
                                   int64_t batch) {
  return cuda::conv_choice_key(backend, plan, d, batch);
}
#else
std::vector<ConvAlgorithm> cuda_conv_algorithms(Backend&, ConvPlan&, ConvDirection, int64_t) {
  no_cuda("cuda_conv_algorithms");
}
ConvAlgorithm cuda_conv_choice(Backend&, ConvPlan&, ConvDirection, int64_t) {
  no_cuda("cuda_conv_choice");
}
void cuda_use_conv_algorithm(Backend&, ConvPlan&, const ConvAlgorithm&) {
  no_cuda("cuda_use_conv_algorithm");
}
ConvChoiceKey cuda_conv_choice_key(Backend&, ConvPlan&, ConvDirection, int64_t) {
  no_cuda("cuda_conv_choice_key");
}
#endif

}  // namespace dp
