// The single-process group, the communicator timeout, and how a process knows it was started by
// an MPI launcher. The MPI group itself is in mpi/process_group_mpi.cpp (built with MPI only).
#include "dp/process_group.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "dp/error.hpp"

#ifdef DPRUN_GCOV_DUMP
extern "C" void __gcov_dump(void);  // libgcov (gcc --coverage)
#endif

namespace dp {

void write_coverage_counts() {
#ifdef DPRUN_GCOV_DUMP
  __gcov_dump();
#endif
}

void exit_now(int exit_code) {
  write_coverage_counts();
  std::_Exit(exit_code);
}

namespace {

class SingleProcessGroup final : public ProcessGroup {
 public:
  std::string kind() const override { return "single"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string host() const override {
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) != 0) return "localhost";
    return name;
  }
  void allreduce_sum(float*, size_t) override {}
  void allreduce_sum(double*, size_t) override {}
  void broadcast(std::string&, int root) override {
    DP_CHECK(root == 0,
             "broadcast: root " + std::to_string(root) + " is not a process of a group of 1");
  }
  void barrier() override {}
  std::unique_ptr<ProcessGroup> duplicate() const override {
    return std::make_unique<SingleProcessGroup>();
  }
  bool concurrent_collectives() const override { return true; }
  [[noreturn]] void abort(int exit_code, const std::string& why) override {
    std::fprintf(stderr, "dprun: %s\n", why.c_str());
    std::fflush(stderr);
    exit_now(exit_code);
  }
};

}  // namespace

std::unique_ptr<ProcessGroup> make_single_process_group() {
  return std::make_unique<SingleProcessGroup>();
}

bool under_mpi_launcher() {
  // Open MPI's mpirun, MPICH/Hydra and Slurm's srun with PMI/PMIx each set one of these.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* s = std::getenv(v); s != nullptr && *s != '\0') return true;
  }
  return false;
}

std::chrono::milliseconds comm_timeout() {
  static const std::chrono::milliseconds timeout = [] {
    double seconds = 300.0;
    if (const char* s = std::getenv("DPRUN_COMM_TIMEOUT_S")) {
      char* end = nullptr;
      const double v = std::strtod(s, &end);
      if (end != s && v > 0) seconds = v;
    }
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
  }();
  return timeout;
}

std::string comm_timeout_text() {
  char text[64];
  std::snprintf(text, sizeof text, "%g s (DPRUN_COMM_TIMEOUT_S)",
                static_cast<double>(comm_timeout().count()) / 1000.0);
  return text;
}

#ifndef DPRUN_WITH_MPI
bool mpi_compiled() { return false; }

std::unique_ptr<ProcessGroup> make_mpi_process_group() {
  DP_THROW(
      "dprun was built without MPI, so a trial cannot span processes: install Open MPI "
      "(Debian: libopenmpi-dev openmpi-bin) and rebuild, or use processes = 1");
}
#endif

}  // namespace dp
