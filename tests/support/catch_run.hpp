#pragma once
// For the test mains only, after #define CATCH_CONFIG_RUNNER and <catch2/catch.hpp> (where
// Catch::Session is declared).
#include <catch2/catch.hpp>

namespace dptest {

/// What Catch::Session().run(argc, argv) gave, and whether it only listed (--list-tests,
/// --list-test-names-only, --list-tags, --list-reporters). A listing's result is the number of
/// entries listed, as Catch2 2 (and CMake's catch_discover_tests) expect: a main returns it as
/// it is, never through session_exit_code, which would read a count as failures.
struct CatchRun {
  int result = 0;
  bool listing = false;
};

inline CatchRun run_catch(int argc, char** argv) {
  Catch::Session session;
  const int bad_command_line = session.applyCommandLine(argc, argv);
  if (bad_command_line != 0) return {bad_command_line, false};
  const Catch::ConfigData& config = session.configData();
  const bool listing =
      config.listTests || config.listTestNamesOnly || config.listTags || config.listReporters;
  return {session.run(), listing};
}

}  // namespace dptest
