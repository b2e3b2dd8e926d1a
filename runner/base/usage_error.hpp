#pragma once
// A bad command line: dprun prints "dprun: " + what() and exits with status 2.
#include <stdexcept>

namespace dprun {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace dprun
