#pragma once
// For the test mains only, after #define CATCH_CONFIG_RUNNER and <catch2/catch.hpp> (where
// Catch::Session is declared).
#include <catch2/catch.hpp>

namespace dptest {

/// Catch::Session().run(argc, argv), except that a listing (--list-tests,
/// --list-test-names-only, --list-tags, --list-reporters) gives 0: Catch2 2 returns the number
/// of entries it listed, which session_exit_code would read as a failure (and `.ci/run`, which
/// lists the [mpi] cases under `set -o pipefail`, stopped there).
inline int run_catch(int argc, char** argv) {
  Catch::Session session;
  const int bad_command_line = session.applyCommandLine(argc, argv);
  if (bad_command_line != 0) return bad_command_line;
  const Catch::ConfigData& config = session.configData();
  const bool listing =
      config.listTests || config.listTestNamesOnly || config.listTags || config.listReporters;
  const int result = session.run();
  return listing ? 0 : result;
}

}  // namespace dptest
