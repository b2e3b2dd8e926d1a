#pragma once
// A small deterministic random generator (xoshiro256** seeded through splitmix64) with
// portable derived distributions, so a seed means the same numbers on every platform and
// standard library (std::normal_distribution is implementation-defined).
#include <cstdint>
#include <vector>

namespace dp {

/// splitmix64 of the state x: (x + 0x9E3779B97F4A7C15) through its finaliser, a bijection of 64
/// bits whose output bits all depend on every input bit. The building block of the counter-based
/// hashes (augmentation draws, sampled search), which need no generator state.
uint64_t mix64(uint64_t x);

class Rng {
 public:
  explicit Rng(uint64_t seed);
  /// Derives an independent stream, e.g. Rng(seed).fork(epoch).
  Rng fork(uint64_t stream) const;
  uint64_t next_u64();
  /// Uniform in [0, n), unbiased (n > 0).
  uint64_t below(uint64_t n);
  /// Uniform in [0, 1) with 24 random bits.
  float uniform();
  double uniform_double();  // [0,1), 53 bits
  /// Standard normal (Box-Muller on uniform_double).
  double normal();

 private:
  uint64_t s_[4];
};

/// 0..n-1 shuffled with Fisher-Yates driven by rng.
std::vector<int32_t> permutation(int64_t n, Rng& rng);

}  // namespace dp
