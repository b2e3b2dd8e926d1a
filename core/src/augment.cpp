// The per-example draws of augmentation: a counter-based hash, so a draw depends only on the
// seed, the stream (the epoch) and the example's position in that stream's global order.
#include "dp/augment.hpp"

#include <string>

#include "dp/error.hpp"
#include "dp/random.hpp"

namespace dp {

int32_t augment_draw(uint64_t seed, uint64_t stream, uint64_t position, int64_t crop_padding,
                     bool flip) {
  DP_CHECK(crop_padding >= 0 && crop_padding <= kMaxCropPadding,
           "augment: crop padding " + std::to_string(crop_padding) + " is outside [0, " +
               std::to_string(kMaxCropPadding) + "]");
  const uint64_t h = mix64(mix64(mix64(seed) ^ stream) ^ position);
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
