// Catch2's implementation, compiled once for every test executable (it is most of a main's
// compile time, and more under the sanitizers), and the session the mains run.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_run.hpp"

namespace dptest {

CatchRun run_catch(int argc, char** argv) {
  Catch::Session session;
  const int bad_command_line = session.applyCommandLine(argc, argv);
  if (bad_command_line != 0) return {bad_command_line, false};
  const Catch::ConfigData& config = session.configData();
  const bool listing =
      config.listTests || config.listTestNamesOnly || config.listTags || config.listReporters;
  return {session.run(), listing};
}

}  // namespace dptest
