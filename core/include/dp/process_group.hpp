#pragma once
// The processes of one trial. A trial's replicas are `processes` x local replicas: one process
// per host (or per GPU) started by mpirun or srun, local replicas in threads. Inside a process
// nothing changes; between processes, one process group carries what must cross: the request,
// the NCCL unique id, CPU gradient sums, metrics. The collectives of one group are called by one
// thread of each process at a time, in the same order on every process; two groups (duplicate())
// may be used by two threads at once where concurrent_collectives() says so.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace dp {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual std::string kind() const = 0;  // "single", "mpi"
  virtual int rank() const = 0;          // this process, 0 .. size - 1
  virtual int size() const = 0;
  /// Processes on this process's host and this one's index among them (MPI's shared-memory
  /// split): a process picks its GPUs from its local rank.
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  /// This process's host name.
  virtual std::string host() const = 0;

  /// In place, host memory: data = sum over processes, added in process order 0, 1, ... so the
  /// result is the same bits on every process and in every run. Throws dp::Error when a peer has
  /// not joined within comm_timeout() (it died or hangs).
  virtual void allreduce_sum(float* data, size_t count) = 0;
  virtual void allreduce_sum(double* data, size_t count) = 0;
  /// `bytes` of `root` to every process (any length).
  virtual void broadcast(std::string& bytes, int root) = 0;
  virtual void barrier() = 0;
  /// The same processes with their own channel (MPI_Comm_dup): collectives of two groups never
  /// match each other, so each may have its own thread.
  virtual std::unique_ptr<ProcessGroup> duplicate() const = 0;
  /// Whether two threads of a process may run collectives of two groups at the same time
  /// (MPI_THREAD_MULTIPLE); otherwise one thread at a time per process.
  virtual bool concurrent_collectives() const = 0;
  /// Ends every process of the group now (MPI_Abort): for a process that failed, so its peers
  /// do not wait for it until their timeout. Prints `why` first.
  [[noreturn]] virtual void abort(int exit_code, const std::string& why) = 0;
};

/// Ends this process at once with `exit_code`, without exit()'s handlers (std::_Exit). In a
/// coverage build (DPRUN_GCOV_DUMP defined) it first writes the gcov counts, which only exit()
/// would otherwise write, so the paths that end a process count as run.
[[noreturn]] void exit_now(int exit_code);
/// Coverage builds: writes the gcov counts now (before MPI_Abort, which ends the process
/// without exit()). A no-op in every other build.
void write_coverage_counts();

/// The group of this process alone (every collective is a no-op).
std::unique_ptr<ProcessGroup> make_single_process_group();

/// True when libdpcore was built with MPI.
bool mpi_compiled();
/// True when this process was started by an MPI launcher (mpirun, or srun with PMI): the
/// launcher's environment says so (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK, ...).
bool under_mpi_launcher();
/// MPI_COMM_WORLD: initialises MPI (once per process; finalised at exit). Throws dp::Error when
/// built without MPI.
std::unique_ptr<ProcessGroup> make_mpi_process_group();

/// How long a rank waits for its peers in a collective before the group is declared dead:
/// $DPRUN_COMM_TIMEOUT_S seconds (default 300), read once.
std::chrono::milliseconds comm_timeout();
/// "300 s (DPRUN_COMM_TIMEOUT_S)"
std::string comm_timeout_text();

}  // namespace dp
