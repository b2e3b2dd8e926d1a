#pragma once
// Helpers for the CPU op tests (test_cpu_*.cpp): backends, float/double conversion, and the
// gradient check every backward op goes through: loss = sum(y * r) with random weights r, so
// every output matters, differentiated by central differences in double precision while the
// op itself runs in float.
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/error.hpp"
#include "support/check.hpp"

namespace cputest {

using fvec = std::vector<float>;
using dvec = std::vector<double>;

inline std::unique_ptr<dp::Backend> make_cpu(int threads = 2,
                                             dp::CpuKernels kernels = dp::CpuKernels::automatic) {
  dp::BackendOptions options;
  options.kind = dp::BackendKind::cpu;
  options.cpu_threads = threads;
  options.cpu_kernels = kernels;
  return dp::create_backend(options);
}

/// Both kernel selections of the cpu backend, for GENERATE: every op test runs on each.
#define CPU_KERNELS_UNDER_TEST() GENERATE(dp::CpuKernels::onednn, dp::CpuKernels::blas)

/// Layout conversions (tests/support/check.hpp).
using dptest::to_nchw;
using dptest::to_nhwc;
/// `v` (N, C, H, W) in NCHW order, laid out for `layout`; and back.
inline fvec to_layout(const fvec& v, dp::Layout layout, int64_t n, int64_t c, int64_t h,
                      int64_t w) {
  return layout == dp::Layout::nhwc ? to_nhwc(v, n, c, h, w) : v;
}
inline fvec from_layout(const fvec& v, dp::Layout layout, int64_t n, int64_t c, int64_t h,
                        int64_t w) {
  return layout == dp::Layout::nhwc ? to_nchw(v, n, c, h, w) : v;
}

inline dvec to_double(const fvec& v) { return dvec(v.begin(), v.end()); }
inline fvec to_float(const dvec& v) {
  fvec f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
  return f;
}

inline double weighted_sum(const fvec& y, const fvec& r) {
  REQUIRE(y.size() == r.size());
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
  return s;
}

/// Finite differences of an op evaluated in float: a step of 1e-2 keeps float rounding in the
/// loss (~1e-7 relative) well below the difference it measures, and a relative tolerance of
/// 1e-2 scaled by max(|a|, |b|, 1) is Caffe's GradientChecker threshold.
inline dptest::GradCheckOptions fd_options() {
  dptest::GradCheckOptions o;
  o.step = 1e-2;
  o.rel_tol = 1e-2;
  o.abs_tol = 1e-6;
  return o;
}

/// CHECKs `analytic` (the op's backward with dy = r) against central differences of
/// sum(forward(x) * r).
inline void check_finite_differences(const std::function<fvec(const fvec&)>& forward, const fvec& x,
                                     const fvec& r, const fvec& analytic,
                                     const dptest::GradCheckOptions& options = fd_options()) {
  auto loss = [&](const dvec& xd) { return weighted_sum(forward(to_float(xd)), r); };
  const dptest::Comparison c =
      dptest::check_gradient(loss, to_double(x), to_double(analytic), options);
  INFO(c.message);
  CHECK(c.ok);
}

/// CHECKs a float result against a double-precision reference, relative tolerance rel_tol
/// scaled by max(|a|, |b|, 1).
inline void check_close(const fvec& actual, const dvec& expected, double rel_tol) {
  const dptest::Comparison c = dptest::compare(to_double(actual), expected, rel_tol);
  INFO(c.message);
  CHECK(c.ok);
}

/// CHECKs that `body` throws dp::Error whose message contains every one of `parts`.
inline void check_error_mentions(const std::function<void()>& body,
                                 const std::vector<std::string>& parts) {
  try {
    body();
    FAIL("expected a dp::Error mentioning " + parts.front());
  } catch (const dp::Error& e) {
    const std::string what = e.what();
    INFO(what);
    for (const auto& p : parts) CHECK(what.find(p) != std::string::npos);
  }
}

}  // namespace cputest
