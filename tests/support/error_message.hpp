#pragma once
// The message a call fails with, for tests that check what an error says.
#include <catch2/catch.hpp>
#include <string>

#include "dp/error.hpp"

namespace dptest {

/// The message of the dp::Error that `f` throws ("" and a failed check when it throws none).
template <typename F>
std::string error_message_of(F&& f) {
  try {
    f();
  } catch (const dp::Error& e) {
    return e.what();
  }
  FAIL_CHECK("expected a dp::Error, none was thrown");
  return "";
}

}  // namespace dptest
