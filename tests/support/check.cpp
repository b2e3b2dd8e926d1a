// The shared test helpers declared in check.hpp.
#include "support/check.hpp"

#include <unistd.h>

#include <atomic>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <system_error>

#include "dp/error.hpp"
#include "dp/random.hpp"

namespace dptest {

namespace {

template <typename T>
Comparison compare_impl(const std::vector<T>& actual, const std::vector<T>& expected,
                        double rel_tol, double abs_tol, double rel_floor) {
  Comparison c;
  std::ostringstream msg;
  msg.precision(9);
  if (actual.size() != expected.size()) {
    c.ok = false;
    msg << "size mismatch: actual has " << actual.size() << " elements, expected "
        << expected.size();
    c.message = msg.str();
    return c;
  }
  int64_t failures = 0;
  int64_t first_failure = -1;
  double worst_badness = -1;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = static_cast<double>(actual[i]);
    const double b = static_cast<double>(expected[i]);
    const double abs_err = std::fabs(a - b);
    const double rel_err = abs_err / std::max({std::fabs(a), std::fabs(b), rel_floor});
    const bool finite = std::isfinite(a) && std::isfinite(b);
    // NaN or infinity on either side fails unless both are the same infinity.
    const bool same_inf = std::isinf(a) && std::isinf(b) && a == b;
    const bool pass = same_inf || (finite && (abs_err <= abs_tol || rel_err <= rel_tol));
    if (finite) {
      c.max_abs_error = std::max(c.max_abs_error, abs_err);
      c.max_rel_error = std::max(c.max_rel_error, rel_err);
    }
    // The worst element: any failure beats any pass; among equals, the largest relative error.
    const double badness = (pass ? 0.0 : 1e300) + (finite ? rel_err : 1e299);
    if (badness > worst_badness) {
      worst_badness = badness;
      c.worst_index = static_cast<int64_t>(i);
      c.a_at_worst = a;
      c.b_at_worst = b;
    }
    if (!pass) {
      ++failures;
      if (first_failure < 0) first_failure = static_cast<int64_t>(i);
    }
  }
  c.ok = failures == 0;
  msg << actual.size() << " elements, " << failures << " outside tolerance (rel " << rel_tol
      << ", abs " << abs_tol << ", floor " << rel_floor << "); max abs error " << c.max_abs_error
      << ", max rel error " << c.max_rel_error;
  if (c.worst_index >= 0) {
    msg << "; worst at [" << c.worst_index << "]: actual " << c.a_at_worst << " vs expected "
        << c.b_at_worst;
  }
  if (first_failure >= 0 && first_failure != c.worst_index) {
    const auto i = static_cast<size_t>(first_failure);
    msg << "; first mismatch at [" << first_failure << "]: actual " << actual[i] << " vs expected "
        << expected[i];
  }
  c.message = msg.str();
  return c;
}

}  // namespace

Comparison compare(const std::vector<float>& actual, const std::vector<float>& expected,
                   double rel_tol, double abs_tol, double rel_floor) {
  return compare_impl(actual, expected, rel_tol, abs_tol, rel_floor);
}

Comparison compare(const std::vector<double>& actual, const std::vector<double>& expected,
                   double rel_tol, double abs_tol, double rel_floor) {
  return compare_impl(actual, expected, rel_tol, abs_tol, rel_floor);
}

std::vector<float> random_vector(int64_t n, uint64_t seed, float lo, float hi) {
  dp::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = lo + (hi - lo) * rng.uniform();
  return v;
}

std::vector<float> to_nhwc(const std::vector<float>& v, int64_t n, int64_t c, int64_t h, int64_t w) {
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t j = 0; j < h * w; ++j)
        out[static_cast<size_t>((i * h * w + j) * c + ch)] =
            v[static_cast<size_t>((i * c + ch) * h * w + j)];
  return out;
}

std::vector<float> to_nchw(const std::vector<float>& v, int64_t n, int64_t c, int64_t h, int64_t w) {
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t j = 0; j < h * w; ++j)
        out[static_cast<size_t>((i * c + ch) * h * w + j)] =
            v[static_cast<size_t>((i * h * w + j) * c + ch)];
  return out;
}

std::vector<double> numeric_gradient(const std::function<double(const std::vector<double>&)>& f,
                                     std::vector<double> x, double h) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = f(x);
    x[i] = saved - h;
    const double minus = f(x);
    x[i] = saved;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

Comparison check_gradient(const std::function<double(const std::vector<double>&)>& f,
                          const std::vector<double>& x, const std::vector<double>& analytic,
                          const GradCheckOptions& options) {
  if (analytic.size() != x.size()) {
    Comparison c;
    c.ok = false;
    c.message = "analytic gradient has " + std::to_string(analytic.size()) + " elements, x has " +
                std::to_string(x.size());
    return c;
  }
  const std::vector<double> numeric = numeric_gradient(f, x, options.step);
  // Kinks are excluded by comparing equal values there.
  std::vector<double> a = analytic, b = numeric;
  int64_t skipped = 0;
  if (options.kink) {
    for (size_t i = 0; i < x.size(); ++i) {
      if (options.kink(x, static_cast<int64_t>(i))) {
        a[i] = b[i] = 0;
        ++skipped;
      }
    }
  }
  Comparison c = compare(a, b, options.rel_tol, options.abs_tol, 1.0);
  c.message = "gradient check (step " + std::to_string(options.step) + ", " +
              std::to_string(skipped) + " kink coordinates skipped; actual = analytic, " +
              "expected = numeric): " + c.message;
  return c;
}

dp::Tensor host_tensor(std::vector<float>& v, dp::Shape s, dp::Layout l) {
  DP_CHECK(static_cast<int64_t>(v.size()) == s.numel(),
           "host_tensor: vector of " + std::to_string(v.size()) + " floats for shape " + s.str());
  return dp::Tensor(v.data(), s, dp::DType::f32, dp::Device{}, l);
}

dp::Tensor host_tensor(std::vector<int32_t>& v, dp::Shape s) {
  DP_CHECK(static_cast<int64_t>(v.size()) == s.numel(),
           "host_tensor: vector of " + std::to_string(v.size()) + " ints for shape " + s.str());
  return dp::Tensor(v.data(), s, dp::DType::i32, dp::Device{}, dp::Layout::nchw);
}

DeviceBuffer::DeviceBuffer(dp::Backend& b, dp::Shape s, dp::DType t, dp::Layout l) : b_(&b) {
  const size_t bytes = static_cast<size_t>(s.numel()) * dp::dtype_size(t);
  t_ = dp::Tensor(b.allocate(bytes), s, t, b.device(), l);
}

DeviceBuffer::~DeviceBuffer() {
  if (b_ && t_.data) b_->release(t_.data);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : b_(o.b_), t_(o.t_) {
  o.b_ = nullptr;
  o.t_.data = nullptr;
}

void DeviceBuffer::upload(const std::vector<float>& v) {
  DP_CHECK(t_.dtype == dp::DType::f32 && static_cast<int64_t>(v.size()) == t_.numel(),
           "DeviceBuffer::upload: " + std::to_string(v.size()) + " floats into a " +
               dp::dtype_name(t_.dtype) + " buffer of shape " + t_.shape.str());
  b_->upload(t_.data, v.data(), t_.bytes());
}

void DeviceBuffer::upload(const std::vector<int32_t>& v) {
  DP_CHECK(t_.dtype == dp::DType::i32 && static_cast<int64_t>(v.size()) == t_.numel(),
           "DeviceBuffer::upload: " + std::to_string(v.size()) + " ints into a " +
               dp::dtype_name(t_.dtype) + " buffer of shape " + t_.shape.str());
  b_->upload(t_.data, v.data(), t_.bytes());
}

std::vector<float> DeviceBuffer::download_f32() const {
  DP_CHECK(t_.dtype == dp::DType::f32,
           std::string("DeviceBuffer::download_f32 of a ") + dp::dtype_name(t_.dtype) + " buffer");
  std::vector<float> v(static_cast<size_t>(t_.numel()));
  b_->download(v.data(), t_.data, t_.bytes());
  return v;
}

std::vector<int32_t> DeviceBuffer::download_i32() const {
  DP_CHECK(t_.dtype == dp::DType::i32,
           std::string("DeviceBuffer::download_i32 of a ") + dp::dtype_name(t_.dtype) + " buffer");
  std::vector<int32_t> v(static_cast<size_t>(t_.numel()));
  b_->download(v.data(), t_.data, t_.bytes());
  return v;
}

namespace {
std::atomic<int> skips{0};
}  // namespace

int skipped_count() { return skips.load(); }

int session_exit_code(int catch_result) {
  if (catch_result != 0) return 1;
  return skipped_count() > 0 ? kSkipReturnCode : 0;
}

void note_skipped(const std::string& reason) {
  ++skips;
  const char* log = std::getenv("DPRUN_SKIP_LOG");
  if (log == nullptr || *log == '\0') return;
  // One short line appended in one write: tests running in parallel do not interleave. No ';'
  // or line break in it: ctest's summary reads the file as a CMake list of lines.
  std::string text = reason;
  for (char& c : text)
    if (c == ';' || c == '\n') c = c == ';' ? ',' : ' ';
  const std::string line = "- " + text + "\n";
  if (std::FILE* f = std::fopen(log, "a")) {
    std::fwrite(line.data(), 1, line.size(), f);
    std::fclose(f);
  }
}

std::string plugin_dir() {
  if (const char* env = std::getenv("DPRUN_PLUGIN_DIR"); env != nullptr && *env != '\0') return env;
  return DPRUN_TEST_PLUGIN_DIR;
}

std::string fashion_mnist_dir() {
  if (const char* env = std::getenv("DPRUN_DATA"); env != nullptr && *env != '\0') return env;
  const std::string standard = "/usr/share/datasets/fashion-mnist";
  std::error_code ec;
  if (std::filesystem::is_directory(standard, ec)) return standard;
  return "";
}

TempDir::TempDir() {
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string pattern = (base / "dprun-test-XXXXXX").string();
  DP_CHECK(::mkdtemp(pattern.data()) != nullptr,
           "TempDir: cannot create a temporary folder under " + base.string());
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;  // never throw from a destructor; a leftover folder is harmless
  std::filesystem::remove_all(path_, ec);
}

}  // namespace dptest
