#pragma once
// bfloat16 rounding, the one definition every backend's precision = "bf16" follows
// (dp::Precision). Header-only so the tests and, later, device code use the same bits.
#include <bit>
#include <cstdint>

namespace dp {

/// The bfloat16 nearest to x (round to nearest, ties to even), as a float: x's low 16 bits
/// rounded away. Overflow goes to +-inf as in IEEE rounding; subnormals round like any other
/// value (bf16 has float's exponent range); -0 stays -0; a NaN stays a NaN of the same sign
/// (quietened, as rounding its payload away could otherwise leave an infinity). Branch-free
/// apart from the NaN select, so loops over it vectorise.
inline float round_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t lsb = (bits >> 16) & 1u;  // ties go to the even neighbour
  const uint32_t rounded = (bits + 0x7FFFu + lsb) & 0xFFFF0000u;
  const uint32_t nan = (bits | 0x00400000u) & 0xFFFF0000u;
  const bool is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return std::bit_cast<float>(is_nan ? nan : rounded);
}

}  // namespace dp
