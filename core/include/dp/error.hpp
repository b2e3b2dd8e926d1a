#pragma once
// Errors: every failure in dprun is a dp::Error (or a subclass) carrying a message that says what
// is wrong and, for internal failures, the source file:line.
#include <stdexcept>
#include <string>

namespace dp {

/// Any error raised by libdpcore. The message is meant for the user.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An internal invariant was broken (a bug in dprun, not bad input).
class InternalError : public Error {
 public:
  using Error::Error;
};

/// Raised on every rank when a collective was aborted because another rank failed.
class AbortedError : public Error {
 public:
  using Error::Error;
};

/// Raised when a step being captured (Backend::begin_capture) calls what needs the host, or
/// grows memory: that step cannot be captured, and runs as it is without graphs. The trainer's
/// graphs = "auto" catches it and trains without graphs.
class CaptureRefused : public Error {
 public:
  using Error::Error;
};

/// `message` followed by " (file:line)", the file without its folders: what throw_error throws.
std::string located(const char* file, int line, const std::string& message);
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
[[noreturn]] void throw_internal(const char* file, int line, const char* condition,
                                 const std::string& message);

}  // namespace dp

/// Throws dp::Error with `message` followed by " (file:line)".
#define DP_THROW(message) ::dp::throw_error(__FILE__, __LINE__, (message))
/// Checks a condition that depends on input (shapes, files, options): throws dp::Error.
#define DP_CHECK(condition, message)                   \
  do {                                                 \
    if (!(condition)) ::dp::throw_error(__FILE__, __LINE__, (message)); \
  } while (0)
/// Checks an internal invariant; on failure throws dp::InternalError naming the condition.
#define DP_ASSERT(condition)                                                      \
  do {                                                                            \
    if (!(condition)) ::dp::throw_internal(__FILE__, __LINE__, #condition, ""); \
  } while (0)
