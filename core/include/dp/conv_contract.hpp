#pragma once
// The precision contract of a trial's convolutions on the GPU: which of cuDNN's algorithms, run
// with which math type, may compute them. The contract follows from the trial's settings alone
// (precision, allow_tf32), never from timing: the CUDA backend chooses, by timing or by cuDNN's
// heuristics, only among what the contract allows (cuda_conv.cpp), and refuses a cached or forced
// choice outside it. The rules are pure functions, so CI holds them without a GPU
// (tests/core/test_conv_contract.cpp); `dprun train --help` and the README print
// conv_contract_text().
//
// Introspection for tests and benchmarks (cuda_conv_algorithms, ...) is at the end; it needs the
// CUDA backend.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dp/backend.hpp"

namespace dp {

/// What a convolution's arithmetic promises.
enum class ConvContract {
  /// precision fp32, allow_tf32 = false: every output is an fp32 dot product of the fp32 inputs
  /// (implicit or explicit GEMM, or direct; FMA math). Differs from the CPU only by summation
  /// order: about 1e-6 relative to sum |a b|.
  fp32_exact,
  /// precision fp32, allow_tf32 = true: whatever cuDNN offers for fp32 data with TF32 math
  /// (inputs rounded to a 10-bit mantissa, fp32 sums), FFT and Winograd included.
  tf32,
  /// precision bf16: the operands rounded to bf16, the exact products summed in fp32 (GEMM and
  /// direct algorithms, tensor-core or FMA math; no FFT or Winograd, whose transforms round the
  /// operands again); outputs rounded to bf16 as dp::Precision says. The CUDA backend runs these
  /// on fp32 copies of the bf16 values, where TF32 tensor-core math is exact (bf16's 8-bit
  /// significand fits TF32's 11), so it computes what native bf16 kernels with fp32
  /// accumulation compute.
  bf16,
};
ConvContract conv_contract(Precision precision, bool allow_tf32);
const char* conv_contract_name(ConvContract c);  // "fp32-exact", "tf32", "bf16"

/// The three passes of a convolution.
enum class ConvDirection { forward = 0, backward_data = 1, backward_filter = 2 };
const char* conv_direction_name(ConvDirection d);  // "forward", "backward-data", ...

/// dprun's own forward of an NHWC 1x1 convolution without padding, beside cuDNN's numbered ones:
/// the strided pixels gathered into rows (with bf16 their rounded copy), then one cuBLAS GEMM
/// against the (K, C) filter (a GEMM family algorithm, fp32 sums; TF32 where the contract
/// allows it). On the H200, cuDNN's fastest forward for ResNet-18's strided 1x1 shortcuts was a
/// kernel without tensor cores (127-152 us a launch); the measured choice times this against
/// cuDNN's and keeps the faster.
inline constexpr int kConvAlgoDprunGemm1x1 = 100;
/// dprun's own forward and filter gradient of an NHWC convolution with few input channels (at
/// most 4, an image model's first layer; the limits are kernels::small_conv_fits'): a direct
/// family algorithm, every output an fp32 sum of products in the filter's (c, r, s) order, FMA
/// math under every contract (with bf16 the operands rounded first). On the H200, cuDNN took
/// 64 us forward and 294 us for the filter gradient of ResNet-18's first convolution (1 -> 64
/// channels, 3x3, batch 256), where the data moved takes about 13 us; the measured choice times
/// this against cuDNN's and keeps the faster.
inline constexpr int kConvAlgoDprunSmallC = 101;

/// How an algorithm computes, which decides its rounding: an fp32 dot product (gemm, direct) or
/// a transform of the inputs (fft, winograd), whose errors are of another kind.
enum class ConvFamily { gemm, direct, fft, winograd, unknown };
const char* conv_family_name(ConvFamily f);
/// The family of cuDNN's algorithm number `algo` (cudnnConvolutionFwdAlgo_t,
/// cudnnConvolutionBwdDataAlgo_t, cudnnConvolutionBwdFilterAlgo_t) in direction d.
ConvFamily conv_family(ConvDirection d, int algo);
/// cuDNN's name without the prefix: "IMPLICIT_PRECOMP_GEMM", "ALGO_1", "WINOGRAD_NONFUSED",
/// "DPRUN_GEMM_1X1" (kConvAlgoDprunGemm1x1), "DPRUN_DIRECT_SMALL_C" (kConvAlgoDprunSmallC), or
/// "algorithm 9" for a number this dprun does not know.
std::string conv_algorithm_name(ConvDirection d, int algo);

/// cuDNN's math types, with cudnnMathType_t's numbers (cuda_conv.cpp checks them against cudnn.h).
enum class ConvMath { default_math = 0, tensor_op = 1, tensor_op_allow_conversion = 2, fma = 3 };
const char* conv_math_name(ConvMath m);  // "default", "tensor-op", "tensor-op-conversion", "fma"

/// Empty when contract c allows cuDNN algorithm `algo` run with math type m in direction d;
/// otherwise why not, in words ("fp32-exact allows GEMM and direct algorithms only: forward
/// WINOGRAD_NONFUSED is a Winograd transform").
std::string conv_contract_refusal(ConvContract c, ConvDirection d, int algo, ConvMath m);
inline bool conv_contract_allows(ConvContract c, ConvDirection d, int algo, ConvMath m) {
  return conv_contract_refusal(c, d, algo, m).empty();
}
/// The math type an algorithm runs with under contract c when cuDNN's heuristics suggest
/// `suggested`: fp32-exact always FMA; otherwise the suggestion, with a down-conversion
/// (tensor-op-conversion, fp32 to fp16) replaced by tensor-op.
ConvMath conv_contract_math(ConvContract c, ConvMath suggested);

/// The contracts in words, one paragraph each, for `dprun train --help` and the README.
std::string conv_contract_text();

// ---- introspection of the CUDA backend (tests, benchmarks) --------------------------------------

/// One way the CUDA backend can compute one direction of a plan at one batch size.
struct ConvAlgorithm {
  ConvDirection direction = ConvDirection::forward;
  int64_t batch = 0;
  int algo = 0;
  ConvMath math = ConvMath::fma;
  size_t workspace = 0;
  bool deterministic = true;
  /// "forward batch 256: IMPLICIT_PRECOMP_GEMM (gemm), fma math, workspace 0 bytes"
  std::string str() const;
};

/// Every algorithm cuDNN offers for (plan, d, batch) that the backend's contract allows and that
/// runs within the backend's workspace limit, deterministic or not. Plan-time only (not while
/// capturing). Throw dp::Error for a backend that is not CUDA, or in a build without CUDA.
std::vector<ConvAlgorithm> cuda_conv_algorithms(Backend& backend, ConvPlan& plan, ConvDirection d,
                                                int64_t batch);
/// The algorithm the backend has chosen for (plan, d, batch), choosing it now (as a step would)
/// when it has not yet.
ConvAlgorithm cuda_conv_choice(Backend& backend, ConvPlan& plan, ConvDirection d, int64_t batch);
/// Makes the plan run `a` from now on (its workspace reserved now). Throws dp::Error, and
/// changes nothing, when the backend's contract forbids it or cuDNN cannot run it.
void cuda_use_conv_algorithm(Backend& backend, ConvPlan& plan, const ConvAlgorithm& a);
/// Where the measured choice for (plan, d, batch) at plan time is kept (dp::ChoiceCache): the
/// cache's scope (cuDNN, CUDA runtime, device) and the entry's key, which names the contract.
struct ConvChoiceKey {
  std::string scope, key;
};
ConvChoiceKey cuda_conv_choice_key(Backend& backend, ConvPlan& plan, ConvDirection d,
                                   int64_t batch);

}  // namespace dp
