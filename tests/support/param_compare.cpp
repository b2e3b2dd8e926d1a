#include "support/param_compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>

namespace dptest {

namespace {

std::vector<NamedSpan> spans_of(const dp::ParamRegistry& registry, bool trainable) {
  std::vector<NamedSpan> out;
  for (const auto& e : registry.entries()) {
    if (e.trainable != trainable) continue;
    out.push_back({e.name, e.shape, e.offset, static_cast<size_t>(e.shape.numel())});
  }
  return out;
}

// "(64,1,3,3)": Shape::str() with its spaces dropped, to keep the table narrow.
std::string shape_text(const dp::Shape& s) {
  std::string out = s.str();
  out.erase(std::remove(out.begin(), out.end(), ' '), out.end());
  return out;
}

void check_covers(const std::vector<NamedSpan>& spans, size_t size, const char* who) {
  for (const auto& s : spans) {
    if (s.offset + s.count > size)
      throw std::invalid_argument(std::string(who) + ": tensor " + s.name + " ends at " +
                                  std::to_string(s.offset + s.count) + " but the flat vector has " +
                                  std::to_string(size) + " floats (vectors of another model?)");
  }
}

}  // namespace

std::vector<NamedSpan> parameter_spans(const dp::ParamRegistry& registry) {
  return spans_of(registry, true);
}

std::vector<NamedSpan> buffer_spans(const dp::ParamRegistry& registry) {
  return spans_of(registry, false);
}

std::vector<float> difference(const std::vector<float>& after, const std::vector<float>& before) {
  if (after.size() != before.size())
    throw std::invalid_argument("difference: sizes differ (" + std::to_string(after.size()) +
                                " vs " + std::to_string(before.size()) + ")");
  std::vector<float> d(after.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = after[i] - before[i];
  return d;
}

double TensorError::excess() const {
  if (std::isnan(rel_error)) return std::numeric_limits<double>::infinity();
  if (tolerance <= 0) return rel_error > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  return rel_error / tolerance;
}

std::vector<TensorError> tensor_errors(const std::vector<NamedSpan>& spans,
                                       const std::vector<float>& actual,
                                       const std::vector<float>& expected) {
  if (actual.size() != expected.size())
    throw std::invalid_argument("tensor_errors: the flat vectors differ in size (" +
                                std::to_string(actual.size()) + " vs " +
                                std::to_string(expected.size()) + ")");
  check_covers(spans, actual.size(), "tensor_errors");
  std::vector<TensorError> out;
  out.reserve(spans.size());
  for (const auto& s : spans) {
    double aa = 0, bb = 0, dd = 0;
    for (size_t i = s.offset; i < s.offset + s.count; ++i) {
      const double a = actual[i], b = expected[i];
      aa += a * a;
      bb += b * b;
      dd += (a - b) * (a - b);
    }
    TensorError e;
    e.name = s.name;
    e.shape = s.shape;
    e.norm_actual = std::sqrt(aa);
    e.norm_expected = std::sqrt(bb);
    e.norm_diff = std::sqrt(dd);
    // A NaN or infinity anywhere makes dd NaN (inf - inf) or inf: the error says so.
    e.rel_error = std::isfinite(aa) && std::isfinite(bb)
                      ? e.norm_diff / std::max(e.norm_expected, kTinyNorm)
                      : std::numeric_limits<double>::quiet_NaN();
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<TensorError> worst_of(const std::vector<TensorError>& a,
                                  const std::vector<TensorError>& b) {
  if (a.size() != b.size())
    throw std::invalid_argument("worst_of: the error lists cover different tensors");
  std::vector<TensorError> out = a;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name)
      throw std::invalid_argument("worst_of: tensor " + a[i].name + " vs " + b[i].name);
    // NaN propagates: a NaN sample is the worst one.
    if (std::isnan(b[i].rel_error) || b[i].rel_error > a[i].rel_error) out[i] = b[i];
  }
  return out;
}

double max_rel_error(const std::vector<TensorError>& errors, std::string* name) {
  double worst = 0;
  for (const auto& e : errors) {
    if (std::isnan(e.rel_error) || e.rel_error > worst) {
      worst = e.rel_error;
      if (name) *name = e.name;
      if (std::isnan(worst)) break;
    }
  }
  return worst;
}

std::string TensorReport::table(size_t worst) const {
  // Two lines per tensor, each under 80 columns: Catch wraps longer INFO lines mid-number.
  std::ostringstream os;
  const size_t n = std::min(worst, tensors.size());
  os << what << ":\n  " << failures << " of " << tensors.size()
     << " tensors over tolerance (error = ||a-b||/||b||); the worst " << n << ":\n";
  char line[160];
  for (size_t i = 0; i < n; ++i) {
    const auto& t = tensors[i];
    os << "  " << t.name << " " << shape_text(t.shape) << (t.ok() ? "" : "  FAIL") << "\n";
    std::snprintf(line, sizeof line,
                  "      error %.3e  tolerance %.3e  x%.3g  |a| %.3e  |b| %.3e\n", t.rel_error,
                  t.tolerance, t.excess(), t.norm_actual, t.norm_expected);
    os << line;
  }
  return os.str();
}

TensorReport compare_tensors(const std::string& what, const std::vector<NamedSpan>& spans,
                             const std::vector<float>& actual, const std::vector<float>& expected,
                             const std::vector<double>& tolerances) {
  if (tolerances.size() != spans.size())
    throw std::invalid_argument("compare_tensors: " + std::to_string(tolerances.size()) +
                                " tolerances for " + std::to_string(spans.size()) + " tensors");
  TensorReport r;
  r.what = what;
  r.tensors = tensor_errors(spans, actual, expected);
  for (size_t i = 0; i < spans.size(); ++i) {
    r.tensors[i].tolerance = tolerances[i];
    if (!r.tensors[i].ok()) ++r.failures;
  }
  std::stable_sort(
      r.tensors.begin(), r.tensors.end(),
      [](const TensorError& a, const TensorError& b) { return a.excess() > b.excess(); });
  return r;
}

TensorReport compare_tensors(const std::string& what, const std::vector<NamedSpan>& spans,
                             const std::vector<float>& actual, const std::vector<float>& expected,
                             double tolerance) {
  return compare_tensors(what, spans, actual, expected,
                         std::vector<double>(spans.size(), tolerance));
}

std::vector<double> scaled_tolerances(const std::vector<TensorError>& noise, double factor,
                                      double floor, double cap) {
  std::vector<double> out;
  out.reserve(noise.size());
  for (const auto& n : noise) {
    const double scaled = std::isnan(n.rel_error) ? floor : factor * n.rel_error;
    out.push_back(std::min(std::max(scaled, floor), std::max(cap, floor)));
  }
  return out;
}

namespace {

// x moved `ulps` representable floats toward +inf (up) or -inf. Floats of one sign are ordered
// like their bit patterns, so that is an integer step on the magnitude; a step that would cross
// zero or reach infinity takes the slow, exact road of std::nextafter.
float step_ulps(float x, int ulps, bool up) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t sign = bits & 0x80000000u, magnitude = bits & 0x7fffffffu;
  const auto n = static_cast<uint32_t>(ulps);
  const bool away_from_zero = up == (sign == 0);
  if (away_from_zero && magnitude + n <= 0x7f7fffffu) {
    bits = sign | (magnitude + n);
  } else if (!away_from_zero && magnitude > n) {
    bits = sign | (magnitude - n);
  } else {
    const float inf = std::numeric_limits<float>::infinity();
    for (int k = 0; k < ulps; ++k) x = std::nextafter(x, up ? inf : -inf);
    return x;
  }
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

}  // namespace

std::vector<float> nudge_ulps(const std::vector<float>& flat, const std::vector<NamedSpan>& spans,
                              uint64_t seed, int ulps) {
  check_covers(spans, flat.size(), "nudge_ulps");
  std::vector<float> out = flat;
  // mt19937_64 and the bit test give the same signs on every platform (no distribution).
  std::mt19937_64 gen(seed);
  for (const auto& s : spans) {
    for (size_t i = s.offset; i < s.offset + s.count; ++i) {
      const bool up = (gen() >> 63) != 0;  // drawn for zeros too: stable signs
      // Exact zeros stay: no summation order rounds a zero bias, and a +-denormal bias would
      // flip every ReLU fed by a zero image patch (0 + b), a tie no implementation breaks.
      if (out[i] == 0.0f || ulps <= 0) continue;
      out[i] = step_ulps(out[i], ulps, up);
    }
  }
  return out;
}

}  // namespace dptest
