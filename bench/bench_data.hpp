#pragma once
// Data the benchmarks make for themselves: bench_gpu times on it when the real files are absent;
// bench_memory and bench_launches count bytes and launches, which no value changes.
#include <cstdint>
#include <random>
#include <string>

#include "dp/data.hpp"

namespace dprun_bench {

/// `count` random images of Fashion-MNIST's shape and labels in [0, 10), the same every run.
inline dp::Dataset synthetic(int64_t count, const std::string& name = "synthetic") {
  dp::Dataset d;
  d.name = name;
  d.count = count;
  d.images.resize(static_cast<size_t>(count * d.example_bytes()));
  d.labels.resize(static_cast<size_t>(count));
  std::mt19937 rng(1);
  for (auto& b : d.images) b = static_cast<uint8_t>(rng() & 0xff);
  for (auto& l : d.labels) l = static_cast<uint8_t>(rng() % 10);
  return d;
}

}  // namespace dprun_bench
