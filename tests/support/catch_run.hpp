#pragma once
// For the test mains: Catch2's session, run once. Its implementation (and Catch2's, which is
// large) is compiled once, in catch_run.cpp, not in every main.

namespace dptest {

/// What Catch::Session().run(argc, argv) gave, and whether it only listed (--list-tests,
/// --list-test-names-only, --list-tags, --list-reporters). A listing's result is the number of
/// entries listed, as Catch2 2 (and CMake's catch_discover_tests) expect: a main returns it as
/// it is, never through session_exit_code, which would read a count as failures.
struct CatchRun {
  int result = 0;
  bool listing = false;
};

CatchRun run_catch(int argc, char** argv);

}  // namespace dptest
