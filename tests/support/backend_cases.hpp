#pragma once
// Calls of every public Backend op with one bad argument each, and calls with empty batches that
// every backend must accept. The table is built against any backend, so the cpu tests
// (tests/core) and the cuda tests (tests/cuda) hold both backends to the same inputs: each bad
// call must throw dp::Error naming the backend, the op and what is wrong, with the same text on
// every backend after the "<name> backend: " prefix.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "support/check.hpp"

namespace dptest {

struct BadCall {
  std::string op;                     // the op the message must name
  std::string what;                   // what is wrong, for the test's report
  std::vector<std::string> mentions;  // substrings the message must contain
  std::function<void()> call;
};

/// Owns the (small, uninitialised) buffers the calls use; they stay valid while it lives.
class BackendCases {
 public:
  explicit BackendCases(dp::Backend& backend);
  ~BackendCases();
  BackendCases(const BackendCases&) = delete;
  BackendCases& operator=(const BackendCases&) = delete;

  /// Every call throws dp::Error.
  const std::vector<BadCall>& bad_calls() const { return bad_; }

  /// Empty batches and empty tensors without memory: every call returns, and the outputs that a
  /// sum over no examples defines are written: returns the named results (downloaded) that must
  /// all be zero ("conv dw", "linear db", "loss_sum", ...).
  std::vector<std::pair<std::string, std::vector<float>>> run_empty_calls();

 private:
  struct Storage;
  dp::Backend& backend_;
  std::unique_ptr<Storage> storage_;
  std::vector<BadCall> bad_;
};

/// The message of a dp::Error thrown by `call`, or "" when it returned (a non-dp::Error escapes).
std::string error_of(const std::function<void()>& call);

}  // namespace dptest
