#pragma once
// bfloat16 rounding, the one definition every backend's precision = "bf16" follows
// (dp::Precision). Header-only so the tests, the cpu backend and the CUDA kernels
// (elementwise.cu, through round_bits_to_bf16) use the same bits.
#include <cstdint>
#if __cplusplus >= 202002L
#include <bit>
#endif

namespace dp {

/// The bits of the bfloat16 nearest to the float with bits `bits` (round to nearest, ties to
/// even), as float bits: the low 16 bits rounded away. Overflow goes to +-inf as in IEEE
/// rounding; subnormals round like any other value (bf16 has float's exponent range); -0 stays
/// -0; a NaN stays a NaN of the same sign (quietened, as rounding its payload away could
/// otherwise leave an infinity). Integer-only and constexpr, so device code calls it too
/// (nvcc's --expt-relaxed-constexpr); branch-free apart from the NaN select, so loops over it
/// vectorise.
constexpr uint32_t round_bits_to_bf16(uint32_t bits) {
  const uint32_t lsb = (bits >> 16) & 1u;  // ties go to the even neighbour
  const uint32_t rounded = (bits + 0x7FFFu + lsb) & 0xFFFF0000u;
  const uint32_t nan = (bits | 0x00400000u) & 0xFFFF0000u;
  const bool is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return is_nan ? nan : rounded;
}

/// The bfloat16 nearest to the float with bits `bits`, packed: round_bits_to_bf16's high half,
/// the 2 bytes a bf16 tensor holds (cuDNN's and cuBLAS's bf16 operands).
constexpr uint16_t packed_bf16_bits(uint32_t bits) {
  return static_cast<uint16_t>(round_bits_to_bf16(bits) >> 16);
}

#if __cplusplus >= 202002L
/// The bfloat16 nearest to x, as a float (round_bits_to_bf16 on x's bits).
inline float round_to_bf16(float x) {
  return std::bit_cast<float>(round_bits_to_bf16(std::bit_cast<uint32_t>(x)));
}
#endif

}  // namespace dp
