#pragma once
// Comparing whole models tensor by tensor. A flat parameter vector (ParamRegistry's layout) is
// cut into its named tensors and each pair is compared by the norm-relative error
//   e = ||a - b||_2 / max(||b||_2, tiny)
// so that a tensor of small values (a bias, a BN shift) is judged against its own size and not
// against the largest value in the model, and a failure names the tensors that differ. Used by
// the [cuda] train tests, the rounding-sensitivity bench and the tests of these helpers; no
// Catch2 here, so a bench can link it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dp/params.hpp"
#include "dp/tensor.hpp"

namespace dptest {

/// One named tensor inside a flat buffer (a ParamRegistry entry: name, shape, offset).
struct NamedSpan {
  std::string name;
  dp::Shape shape;
  size_t offset = 0;  // in floats
  size_t count = 0;   // shape.numel()
};

/// The trainable parameters of a registry, in flat order (parameters() / grads layout).
std::vector<NamedSpan> parameter_spans(const dp::ParamRegistry& registry);
/// The buffers (BN running statistics) of a registry, in flat order (buffers() layout).
std::vector<NamedSpan> buffer_spans(const dp::ParamRegistry& registry);

/// after - before, element by element: the update a run applied.
std::vector<float> difference(const std::vector<float>& after, const std::vector<float>& before);

/// Denominator floor of the relative error: a tensor whose reference is all zeros is judged by
/// its absolute difference (then e is huge unless both are zero).
inline constexpr double kTinyNorm = 1e-30;

/// One tensor's comparison. Norms in double over the tensor's elements.
struct TensorError {
  std::string name;
  dp::Shape shape;
  double norm_actual = 0, norm_expected = 0, norm_diff = 0;
  double rel_error = 0;  // norm_diff / max(norm_expected, kTinyNorm); NaN when either has one
  double tolerance = 0;  // what compare_tensors held it to
  bool ok() const { return rel_error <= tolerance; }  // NaN fails
  /// How far over (> 1) or under (<= 1) its tolerance it is; NaN counts as infinitely over.
  double excess() const;
};

/// The norm-relative error of every span, in span order (tolerance left 0).
std::vector<TensorError> tensor_errors(const std::vector<NamedSpan>& spans,
                                       const std::vector<float>& actual,
                                       const std::vector<float>& expected);

/// Element-wise worst of two error lists over the same spans (e.g. two noise samples).
std::vector<TensorError> worst_of(const std::vector<TensorError>& a,
                                  const std::vector<TensorError>& b);
/// The largest rel_error of a list (NaN if any is NaN), and the tensor it belongs to.
double max_rel_error(const std::vector<TensorError>& errors, std::string* name = nullptr);

/// A model-wide comparison: every tensor with its tolerance, worst first (by rel/tolerance).
struct TensorReport {
  std::string what;  // "updates of 2 steps", says which comparison failed
  std::vector<TensorError> tensors;
  size_t failures = 0;
  bool ok() const { return failures == 0 && !tensors.empty(); }
  /// How many of how many failed, then the `worst` first tensors: name, shape, error,
  /// tolerance, error/tolerance and the norms of both.
  std::string table(size_t worst = 8) const;
};

/// Holds tensor i (span order) to tolerances[i].
TensorReport compare_tensors(const std::string& what, const std::vector<NamedSpan>& spans,
                             const std::vector<float>& actual, const std::vector<float>& expected,
                             const std::vector<double>& tolerances);
/// Holds every tensor to the same tolerance.
TensorReport compare_tensors(const std::string& what, const std::vector<NamedSpan>& spans,
                             const std::vector<float>& actual, const std::vector<float>& expected,
                             double tolerance);

/// Tolerances derived from measured noise: max(factor * noise[i].rel_error, floor), capped at
/// `cap` so that a tensor whose noise is O(1) (the update of a conv bias that batch norm
/// cancels) is still held to something. A NaN noise gives the floor (and fails elsewhere).
std::vector<double> scaled_tolerances(const std::vector<TensorError>& noise, double factor,
                                      double floor, double cap);

/// A copy of `flat` with every nonzero element of every span moved `ulps` steps of
/// std::nextafter up or down, the signs drawn from a generator seeded by `seed`: a reproducible
/// rounding-level nudge of a whole model. Exact zeros (biases at initialisation) and the padding
/// between spans are left alone: rounding never makes a zero nonzero.
std::vector<float> nudge_ulps(const std::vector<float>& flat, const std::vector<NamedSpan>& spans,
                              uint64_t seed, int ulps = 1);

}  // namespace dptest
