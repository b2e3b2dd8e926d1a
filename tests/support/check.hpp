#pragma once
// Test helpers shared by every op and layer test: comparing tensors with a tolerance, a
// central-difference gradient checker (Caffe's GradientChecker habits: relative error scaled by
// max(|a|, |b|, 1), a kink window for ReLU/max-pool), random inputs, and locating test data.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/tensor.hpp"

namespace dptest {

/// Result of comparing two arrays.
struct Comparison {
  bool ok = true;
  double max_abs_error = 0;
  double max_rel_error = 0;  // |a-b| / max(|a|, |b|, floor)
  int64_t worst_index = -1;
  double a_at_worst = 0, b_at_worst = 0;
  std::string message;  // human readable summary (first mismatch, shapes)
};

/// Element i passes when |a-b| <= abs_tol OR |a-b| / max(|a|,|b|,rel_floor) <= rel_tol.
Comparison compare(const std::vector<float>& actual, const std::vector<float>& expected,
                   double rel_tol, double abs_tol = 0.0, double rel_floor = 1.0);
Comparison compare(const std::vector<double>& actual, const std::vector<double>& expected,
                   double rel_tol, double abs_tol = 0.0, double rel_floor = 1.0);

/// Catch2 helper: CHECK that compare(...) is ok, printing the message on failure.
#define DP_CHECK_CLOSE(actual, expected, rel_tol)                      \
  do {                                                                 \
    auto dp_cmp_ = ::dptest::compare((actual), (expected), (rel_tol)); \
    INFO(dp_cmp_.message);                                             \
    CHECK(dp_cmp_.ok);                                                 \
  } while (0)

/// Deterministic random values in [lo, hi).
std::vector<float> random_vector(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

/// A convolution's plan geometry: batch up to max_batch, (C, H, W) in, K filters of R x S, the
/// strides and paddings (height, width).
inline dp::ConvGeometry conv_geometry(int64_t max_batch, int64_t c, int64_t h, int64_t w, int64_t k,
                                      int64_t r, int64_t s, int64_t stride_h, int64_t stride_w,
                                      int64_t pad_h, int64_t pad_w,
                                      dp::Layout layout = dp::Layout::nchw) {
  dp::ConvGeometry g;
  g.max_batch = max_batch;
  g.in_channels = c;
  g.in_h = h;
  g.in_w = w;
  g.out_channels = k;
  g.kernel_h = r;
  g.kernel_w = s;
  g.stride_h = stride_h;
  g.stride_w = stride_w;
  g.pad_h = pad_h;
  g.pad_w = pad_w;
  g.layout = layout;
  return g;
}

/// An (N, C, H, W) array from NCHW order to NHWC order, and back (host layout conversions for
/// every test that runs a layout against another).
std::vector<float> to_nhwc(const std::vector<float>& v, int64_t n, int64_t c, int64_t h, int64_t w);
std::vector<float> to_nchw(const std::vector<float>& v, int64_t n, int64_t c, int64_t h, int64_t w);

/// Central finite differences of a scalar function f(x) (computed in double precision),
/// step h. Returns df/dx_i for every i.
std::vector<double> numeric_gradient(const std::function<double(const std::vector<double>&)>& f,
                                     std::vector<double> x, double h = 1e-3);

struct GradCheckOptions {
  double step = 1e-3;
  double rel_tol = 1e-4;
  double abs_tol = 1e-6;
  /// Skip coordinates where the function is not smooth within +-step (ReLU at 0, max-pool
  /// ties): the caller says which by `kink(x, i)`; may be empty.
  std::function<bool(const std::vector<double>& x, int64_t i)> kink;
};

/// Checks an analytic gradient of f at x against central differences. Returns the comparison
/// (skipped coordinates are excluded).
Comparison check_gradient(const std::function<double(const std::vector<double>&)>& f,
                          const std::vector<double>& x, const std::vector<double>& analytic,
                          const GradCheckOptions& options = {});

/// Host tensor helpers for the CPU backend: a Tensor view over a std::vector.
dp::Tensor host_tensor(std::vector<float>& v, dp::Shape s, dp::Layout l = dp::Layout::nchw);
dp::Tensor host_tensor(std::vector<int32_t>& v, dp::Shape s);

/// Uploads host data to a backend and downloads it back, owning the device memory.
class DeviceBuffer {
 public:
  DeviceBuffer(dp::Backend& b, dp::Shape s, dp::DType t = dp::DType::f32,
               dp::Layout l = dp::Layout::nchw);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&&) noexcept;
  const dp::Tensor& tensor() const { return t_; }
  const dp::Tensor* ptr() const { return &t_; }
  void upload(const std::vector<float>& v);
  void upload(const std::vector<int32_t>& v);
  std::vector<float> download_f32() const;
  std::vector<int32_t> download_i32() const;

 private:
  dp::Backend* b_;
  dp::Tensor t_;
};

/// A part of a test that cannot run on this machine, with the reason: appended to the file
/// $DPRUN_SKIP_LOG (ctest sets it and prints the file after the run, so the reason reaches
/// ctest's normal output instead of hiding behind -V), and counted, so the test process exits
/// with kSkipReturnCode and ctest reports the test skipped, not passed (session_exit_code).
/// Use DPTEST_SKIPPED, which also WARNs.
void note_skipped(const std::string& reason);
/// How many skips this process noted.
int skipped_count();

/// The exit status ctest takes as "skipped" (SKIP_RETURN_CODE of every test entry).
constexpr int kSkipReturnCode = 77;
/// A test process's exit status from Catch2's (which counts failed assertions, up to 255, so
/// it could itself be 77): 1 when anything failed, kSkipReturnCode when nothing failed but
/// something was skipped, else 0.
int session_exit_code(int catch_result);
#define DPTEST_SKIPPED(reason)                                                     \
  do {                                                                             \
    const std::string dptest_reason_ = (reason);                                   \
    WARN(dptest_reason_);                                                          \
    ::dptest::note_skipped(Catch::getResultCapture().getCurrentTestName() + ": " + \
                           dptest_reason_);                                        \
  } while (0)

/// The folder of the model plugins: $DPRUN_PLUGIN_DIR (the GPU machine, where the build tree is
/// elsewhere), else the build tree's plugin folder.
std::string plugin_dir();

/// The Fashion-MNIST folder for tests: $DPRUN_DATA, else /usr/share/datasets/fashion-mnist,
/// else "" (tests that need it then skip with a message).
std::string fashion_mnist_dir();
/// A fresh temporary folder, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace dptest
