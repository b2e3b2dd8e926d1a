// Hidden cases ([.]) that tests/scripts/test_skip_status.sh runs one at a time to hold the exit
// status every test executable gives ctest (support/catch_main.cpp): 0 when all passed, 77
// (skipped) when a part was skipped and nothing failed, and 1 for any failure, even 77 of them.
#include <catch2/catch.hpp>

#include "support/check.hpp"

TEST_CASE("skip status: a passing case", "[.skip-status][passes]") { CHECK(1 + 1 == 2); }

TEST_CASE("skip status: a case that skips a part", "[.skip-status][skips]") {
  CHECK(1 + 1 == 2);
  // A ';' would split the line in ctest's summary (a CMake list): it is written as ','.
  DPTEST_SKIPPED("the planted skip of test_skip_status.sh; one line");
}

TEST_CASE("skip status: a case with exactly 77 failed checks", "[.skip-status][fails77]") {
  for (int i = 0; i < 77; ++i) CHECK(i < 0);
}

TEST_CASE("skip status: a case that skips a part and fails", "[.skip-status][skips-and-fails]") {
  DPTEST_SKIPPED("the planted skip of test_skip_status.sh");
  CHECK(1 + 1 == 3);
}
