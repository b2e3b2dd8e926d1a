// Catch2's main for the test executables, with one change: the exit status says skipped
// (kSkipReturnCode, which ctest reports as skipped) when a test case skipped a part it cannot run
// here, and 1, never a count that could read as a skip, when anything failed.

#include "support/catch_run.hpp"
#include "support/check.hpp"

int main(int argc, char** argv) {
  const dptest::CatchRun run = dptest::run_catch(argc, argv);
  return run.listing ? run.result : dptest::session_exit_code(run.result);
}
