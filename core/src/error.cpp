#include "dp/error.hpp"

#include <cstring>

namespace dp {

namespace {
std::string where(const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}
}  // namespace

std::string located(const char* file, int line, const std::string& message) {
  return message + " (" + where(file, line) + ")";
}

void throw_error(const char* file, int line, const std::string& message) {
  throw Error(located(file, line, message));
}

void throw_internal(const char* file, int line, const char* condition,
                    const std::string& message) {
  std::string m = "internal error: " + std::string(condition) + " failed";
  if (!message.empty()) m += ": " + message;
  throw InternalError(m + " (" + where(file, line) + ")");
}

}  // namespace dp
