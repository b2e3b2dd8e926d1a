// One trial as several processes started by a launcher (mpirun, srun): the child side of a
// trial with processes > 1 (`dprun __trial --records stdout`) and `dprun train` under mpirun.
// Every process runs the same trial (run_trial with the trial's process group); process 0 alone
// talks to the runner. A process that fails says so on stderr, in the one form the runner reads
// (launch.hpp's rank report), and ends the others at once instead of letting them wait for it
// until the communicator timeout.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

#include "dp/error.hpp"
#include "dp/process_group.hpp"
#include "process/launch.hpp"
#include "trial/trial_main.hpp"

namespace dprun {

namespace {

// How long a failed process waits before it ends the trial. When a process stops responding,
// every other process reaches the communicator timeout within moments of each other; waiting
// lets each of them report it, so the runner can tell which process did not (the one that
// hangs). Any process's MPI_Abort ends the wait for everyone.
constexpr auto kReportGrace = std::chrono::seconds(2);

[[noreturn]] void end_trial(dp::ProcessGroup& group, const std::string& why) {
  std::fprintf(stderr, "%s\n",
               rank_report_line({group.rank(), group.size(), group.host(), why}).c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(kReportGrace);
  group.abort(1, "ending the trial's processes after the error above");
  dp::exit_now(1);  // abort() does not return; the compiler cannot see that through the call
}

// The rank the launcher gave this process, before MPI is up (to know who writes the record
// when MPI itself cannot start). -1 when no launcher says.
int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* s = std::getenv(v); s && *s) return std::atoi(s);
  }
  return -1;
}

}  // namespace

int trial_process_of_many() {
  // Die with whoever started this process (mpirun, its daemon on another host, slurmstepd), so
  // no process of a trial outlives it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Records go alone on the original stdout; anything else printed to stdout goes to stderr.
  const int record_fd = fcntl(1, F_DUPFD_CLOEXEC, 10);
  if (record_fd < 0 || dup2(2, 1) < 0) {
    std::perror("dprun: __trial: setting up the record stream");
    return 1;
  }
  RecordWriter writer(record_fd, kRecordPrefix);
  auto final_record = [&](TrialRecord::Kind kind, const std::string& message) {
    TrialRecord r;
    r.kind = kind;
    r.message = message;
    try {
      writer.write(r);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dprun: %s\n", e.what());
    }
  };

  std::unique_ptr<dp::ProcessGroup> group;
  try {
    group = dp::make_mpi_process_group();
  } catch (const std::exception& e) {
    const std::string why = std::string("cannot join the trial's processes: ") + e.what();
    if (launcher_rank() <= 0) final_record(TrialRecord::Kind::error, why);
    std::fprintf(stderr, "dprun: %s\n", why.c_str());
    return 1;
  }
  const bool first = group->rank() == 0;

  // The launcher gave the request (stdin) to process 0 only.
  TrialRequest request;
  try {
    std::string text;
    if (first) {
      std::ostringstream in;
      in << std::cin.rdbuf();
      text = in.str();
    }
    group->broadcast(text, 0);
    request = request_from_json(Json::parse(text));
  } catch (const std::exception& e) {
    const std::string why = std::string("bad trial request: ") + e.what();
    if (first) final_record(TrialRecord::Kind::error, why);
    end_trial(*group, why);
  }

  RecordSink records(writer);
  SilentSink silent;
  const TrialResult result =
      run_trial(request, first ? static_cast<TrialSink&>(records) : silent, group.get());
  if (result.kind == TrialRecord::Kind::error) {
    // Process 0 records the error before anyone ends the trial.
    if (first) final_record(result.kind, result.message);
    end_trial(*group, result.message);
  }
  if (first) final_record(result.kind, result.message);
  return 0;
}

int run_train_processes(TrialRequest request) {
  auto group = dp::make_mpi_process_group();
  request.settings.set("processes", int64_t{group->size()});
  PrintSink print(request);
  SilentSink silent;
  const bool first = group->rank() == 0;
  const TrialResult result =
      run_trial(request, first ? static_cast<TrialSink&>(print) : silent, group.get());
  switch (result.kind) {
    case TrialRecord::Kind::done:
      return 0;
    case TrialRecord::Kind::stopped:
    case TrialRecord::Kind::paused:
      if (first) std::fprintf(stderr, "dprun: %s\n", result.message.c_str());
      return 0;
    case TrialRecord::Kind::error:
      end_trial(*group, result.message);
    default:
      if (first)
        std::fprintf(stderr, "dprun: %s: %s\n",
                     result.kind == TrialRecord::Kind::diverged ? "diverged" : "skipped",
                     result.message.c_str());
      return 1;
  }
}

}  // namespace dprun
