// The main of test_mpi, run by ctest under mpirun (-np 2 and -np 3): one MPI process group for
// the whole run, Catch2 on every process, and one verdict for all (a failure on any process
// fails every process, so mpirun's exit status tells).
#include <cstdio>

#include "dp/error.hpp"
#include "dp/process_group.hpp"
#include "mpi_test_util.hpp"
#include "support/catch_run.hpp"
#include "support/check.hpp"

namespace mpitest {
namespace {
dp::ProcessGroup* the_group = nullptr;
}
dp::ProcessGroup& group() { return *the_group; }
}  // namespace mpitest

int main(int argc, char** argv) {
  if (!dp::mpi_compiled()) {
    std::puts("test_mpi: dprun was built without MPI: skipping");
    dptest::note_skipped("mpi tests: dprun was built without MPI (install libopenmpi-dev)");
    return dptest::kSkipReturnCode;
  }
  if (!dp::under_mpi_launcher()) {
    std::puts("test_mpi: not started by mpirun (run it as `mpirun -np 2 test_mpi`): skipping");
    return dptest::kSkipReturnCode;
  }
  auto group = dp::make_mpi_process_group();
  mpitest::the_group = group.get();
  const dptest::CatchRun run = dptest::run_catch(argc, argv);
  if (run.listing) return run.result;
  const int failed = run.result;
  double failures = failed != 0 ? 1 : 0;
  try {
    group->allreduce_sum(&failures, 1);
  } catch (const dp::Error& e) {
    std::fprintf(stderr, "test_mpi: the processes could not agree on the verdict: %s\n", e.what());
    return 1;
  }
  // A skip on any process (the same tests run on each) makes mpirun's status 77: skipped.
  return failures > 0 ? 1 : (dptest::skipped_count() > 0 ? dptest::kSkipReturnCode : 0);
}
