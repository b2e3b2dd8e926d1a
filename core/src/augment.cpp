// The per-example draws of augmentation: a counter-based hash, so a draw depends only on the
// seed, the stream (the epoch) and the example's position in that stream's global order.
#include "dp/augment.hpp"

#include <string>

#include "dp/error.hpp"

namespace dp {

namespace {
// splitmix64's finaliser: a bijection of 64 bits whose output bits all depend on every input bit.
uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

int32_t augment_draw(uint64_t seed, uint64_t stream, uint64_t position, int64_t crop_padding,
                     bool flip) {
  DP_CHECK(crop_padding >= 0 && crop_padding <= kMaxCropPadding,
           "augment: crop padding " + std::to_string(crop_padding) + " is outside [0, " +
               std::to_string(kMaxCropPadding) + "]");
  const uint64_t h = mix(mix(mix(seed) ^ stream) ^ position);
  const auto span = static_cast<uint64_t>(2 * crop_padding + 1);
  // Two offsets from disjoint 30-bit fields, the flip from the top bit.
  const auto oy = static_cast<int64_t>((h & 0x3fffffffull) % span);
  const auto ox = static_cast<int64_t>(((h >> 30) & 0x3fffffffull) % span);
  return pack_draw(oy, ox, flip && (h >> 63) != 0);
}

std::vector<int32_t> augment_draws(uint64_t seed, uint64_t stream, uint64_t first, int64_t count,
                                   int64_t crop_padding, bool flip) {
  std::vector<int32_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    out[static_cast<size_t>(i)] =
        augment_draw(seed, stream, first + static_cast<uint64_t>(i), crop_padding, flip);
  return out;
}

}  // namespace dp
