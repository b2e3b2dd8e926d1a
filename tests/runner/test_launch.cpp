// Trials of several processes and several trials at once, below the process level: the
// launcher's command line, [launch] in experiment files, reading what failed from a launcher's
// output, and the scheduler's device sets (with a simulated list of GPUs).
#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <set>

#include "experiment_helpers.hpp"
#include "base/os.hpp"
#include "process/launch.hpp"
#include "sweep/scheduler.hpp"
#include "support/check.hpp"

using Catch::Matchers::Contains;
using dprun::DeviceKind;
using dprun::DeviceNeed;
using dprun::DeviceSet;
using dprun::LaunchConfig;
using exptest::error_of;
using exptest::kHead;
using exptest::parse;
using Words = std::vector<std::string>;

TEST_CASE("launch: mpirun and srun command lines", "[launch]") {
  const Words program{"/opt/dprun", "__trial", "--records", "stdout"};
  LaunchConfig c;
  CHECK(dprun::effective_launcher(c, false) == "mpirun");
  CHECK(dprun::effective_launcher(c, true) == "srun");  // inside a Slurm allocation
  CHECK(dprun::launch_command(c, "mpirun", 2, program, {}) ==
        Words{"mpirun", "-np", "2", "--bind-to", "none", "/opt/dprun", "__trial", "--records",
              "stdout"});

  c.hostfile = "hosts.txt";
  c.args = {"--mca", "btl", "tcp,self"};
  CHECK(dprun::effective_launcher(c, true) == "mpirun");  // a hostfile is mpirun's
  CHECK(dprun::launch_command(c, "/usr/bin/mpirun", 4, program, {"DPRUN_COMM_TIMEOUT_S"}) ==
        Words{"/usr/bin/mpirun", "-np", "4", "--bind-to", "none", "--hostfile", "hosts.txt", "-x",
              "DPRUN_COMM_TIMEOUT_S", "--mca", "btl", "tcp,self", "/opt/dprun", "__trial",
              "--records", "stdout"});

  LaunchConfig s;
  s.launcher = "srun";
  s.args = {"--ntasks-per-node=1"};
  CHECK(dprun::effective_launcher(s, false) == "srun");
  CHECK(dprun::launch_command(s, "srun", 2, program, {"DPRUN_FAULT"}) ==
        Words{"srun", "--ntasks=2", "--kill-on-bad-exit=1", "--input=0", "--ntasks-per-node=1",
              "/opt/dprun", "__trial", "--records", "stdout"});

  CHECK(dprun::command_text({"mpirun", "-x", "A B", "it's"}) == "mpirun -x 'A B' 'it'\\''s'");
  CHECK(dprun::find_executable("sh").find("/sh") != std::string::npos);
  CHECK(dprun::find_executable("no-such-launcher-here").empty());
}

TEST_CASE("launch: a trial that cannot be launched says why", "[launch]") {
  CHECK(dprun::launch_problem(2, true, "mpirun", "/usr/bin/mpirun").empty());
  CHECK_THAT(dprun::launch_problem(2, false, "mpirun", "/usr/bin/mpirun"),
             Contains("processes = 2 needs MPI, but this dprun was built without it") &&
                 Contains("libopenmpi-dev"));
  CHECK_THAT(dprun::launch_problem(2, true, "mpirun", ""),
             Contains("mpirun, which is not on PATH") && Contains("openmpi-bin"));
  CHECK_THAT(dprun::launch_problem(3, true, "srun", ""),
             Contains("srun, which is not on PATH") && Contains("Slurm allocation"));
}

TEST_CASE("launch: hosts grouped in rank order", "[launch]") {
  CHECK(dprun::group_hosts({"nodeA"}) == "nodeA");
  CHECK(dprun::group_hosts({"nodeA", "nodeA"}) == "nodeA x2");
  CHECK(dprun::group_hosts({"nodeA", "nodeA", "nodeB", "nodeB"}) == "nodeA x2, nodeB x2");
}

TEST_CASE("launch: which process failed, from the processes and the launcher", "[launch]") {
  const dprun::RankReport r{1, 2, "nodeB", "cannot read the data: no such file"};
  const std::string line = dprun::rank_report_line(r);
  CHECK(line == "dprun: process 1 of 2 on nodeB: cannot read the data: no such file");
  auto back = dprun::parse_rank_report(line);
  REQUIRE(back);
  CHECK(back->rank == 1);
  CHECK(back->size == 2);
  CHECK(back->host == "nodeB");
  CHECK(back->message == r.message);
  CHECK_FALSE(dprun::parse_rank_report("dprun: some other error"));

  // Open MPI 4's report of a process killed by a signal, as it prints it.
  const Words mpirun{
      "Primary job  terminated normally, but 1 process returned",
      "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."};
  CHECK_FALSE(dprun::is_failure_line(mpirun[0]));
  CHECK(dprun::is_failure_line(mpirun[1]));
  const std::string when = "after epoch 2";
  CHECK(dprun::launcher_failure({mpirun[1]}, when) ==
        "mpirun: process 1 on vm exited on signal 9 (Killed) after epoch 2");
  // What the launcher saw comes first: a process that reports afterwards was stopped by it.
  CHECK(dprun::launcher_failure({line, mpirun[1]}, when) ==
        "mpirun: process 1 on vm exited on signal 9 (Killed) after epoch 2");
  CHECK(dprun::launcher_failure({line}, when) ==
        "process 1 of 2 on nodeB: cannot read the data: no such file");
  CHECK(dprun::launcher_failure({"srun: error: nodeB: task 3: Killed"}, when) ==
        "srun: process 3 on nodeB: Killed after epoch 2");
  CHECK(dprun::launcher_failure({}, when).empty());
}

TEST_CASE("launch: a timeout names the processes that did not report it", "[launch]") {
  const std::string timeout =
      "allreduce_sum across processes: process 0 of 3 on a waited 10 s (DPRUN_COMM_TIMEOUT_S) "
      "for the others (one died or hangs)";
  const Words reports{"dprun: process 0 of 3 on a: " + timeout,
                      "dprun: process 2 of 3 on c: allreduce_sum across processes: process 2 of "
                      "3 on c waited 10 s (DPRUN_COMM_TIMEOUT_S) for the others"};
  CHECK(dprun::explain_timeout(timeout, 3, reports, {"a", "b", "c"}) ==
        "process 1 on b (of 3) stopped responding (hangs or died): " + timeout);
  CHECK(dprun::explain_timeout(timeout, 3, {reports[0]}, {}) ==
        "processes 1, 2 (of 3) stopped responding (hangs or died): " + timeout);
  // Process 0 hangs: process 1 reports the timeout, and nobody else.
  const std::string from_1 =
      "process 1 of 2 on b: allreduce_sum across processes: process 1 of "
      "2 on b waited 10 s (DPRUN_COMM_TIMEOUT_S) for the others";
  CHECK(dprun::explain_timeout(from_1, 2, {"dprun: " + from_1}, {"a", "b"}, 1) ==
        "process 0 on a (of 2) stopped responding (hangs or died): " + from_1);
  CHECK(dprun::explain_timeout("some other error", 3, {}, {}) == "some other error");
  CHECK(dprun::explain_timeout(timeout, 1, {}, {}) == timeout);
}

TEST_CASE("[launch] and processes in experiment files", "[launch][experiment]") {
  dptest::TempDir dir;
  const std::string hostfile = dir.path() + "/hosts";
  std::ofstream(hostfile) << "nodeA slots=8\nnodeB slots=8\n";
  auto ex = parse(kHead + "[train]\nmodel = \"lenet\"\ngpus = 16\nprocesses = 2\n[launch]\n" +
                  "hostfile = \"" + hostfile + "\"\nargs = [\"--mca\", \"btl\", \"tcp,self\"]\n");
  REQUIRE(ex.trials.size() == 1);
  CHECK(ex.trials[0].settings.integer("processes") == 2);
  CHECK(ex.launch.hostfile == hostfile);
  CHECK(ex.launch.args == Words{"--mca", "btl", "tcp,self"});
  CHECK(ex.launch.launcher.empty());
  // processes = 1 (the default) leaves a trial's identity as it was.
  CHECK(parse(kHead + "[train]\nmodel = \"lenet\"\nprocesses = 1\n").trials[0].config_hash ==
        parse(kHead + "[train]\nmodel = \"lenet\"\n").trials[0].config_hash);

  auto e = error_of(kHead + "[train]\nmodel = \"lenet\"\n[sweep]\ngpus = [2, 3]\nprocesses = 2\n");
  CHECK(std::string(e.what()) ==
        "t.toml:7:13: sweep.processes: gpus 3 (sweep.gpus[1]) is not divisible by processes 2: "
        "each process runs gpus / processes replicas (e.g. gpus = 16, processes = 2 is 2 hosts x "
        "8 GPUs)");
  e = error_of(kHead + "[train]\nmodel = \"lenet\"\n[launch]\nlaunchr = \"srun\"\n");
  CHECK_THAT(std::string(e.what()), Contains("t.toml:6:1: launch.launchr: unknown key; did you "
                                             "mean \"launcher\"?"));
  e = error_of(kHead + "[train]\nmodel = \"lenet\"\n[launch]\nlauncher = \"mpiexec\"\n");
  CHECK_THAT(std::string(e.what()),
             Contains("t.toml:6:12: launch.launcher: unknown launcher \"mpiexec\"") &&
                 Contains("(known launchers: mpirun, srun)"));
  e = error_of(kHead + "[train]\nmodel = \"lenet\"\n[launch]\nhostfile = \"nowhere/hosts\"\n");
  CHECK_THAT(std::string(e.what()),
             Contains("t.toml:6:12: launch.hostfile: no such file \"nowhere/hosts\""));
  e = error_of(kHead + "[train]\nmodel = \"lenet\"\n[launch]\nlauncher = \"srun\"\nhostfile = \"" +
               hostfile + "\"\n");
  CHECK_THAT(std::string(e.what()), Contains("launch.hostfile: a hostfile is for mpirun"));
  e = error_of(kHead + "[train]\nmodel = \"lenet\"\n[launch]\nargs = \"--oversubscribe\"\n");
  CHECK_THAT(std::string(e.what()),
             Contains("t.toml:6:8: launch.args: expected a list of strings") &&
                 Contains("got \"--oversubscribe\""));
}

namespace {

// Every device of the running sets is given to one trial only.
void check_disjoint(const std::vector<std::pair<int, DeviceSet>>& running) {
  std::multiset<std::string> gpus;
  std::multiset<int> cores;
  for (const auto& [id, set] : running) {
    gpus.insert(set.gpus.begin(), set.gpus.end());
    cores.insert(set.cores.begin(), set.cores.end());
  }
  for (const auto& g : gpus) CHECK(gpus.count(g) == 1);
  for (int c : cores) CHECK(cores.count(c) == 1);
}

DeviceNeed gpus(int n) { return {DeviceKind::gpu, n, false}; }

}  // namespace

TEST_CASE("scheduler: largest first, small trials backfill, devices never shared", "[scheduler]") {
  // A simulated machine with 8 GPUs, as CUDA_VISIBLE_DEVICES names them.
  dprun::DeviceInventory machine;
  machine.gpus = {"0", "1", "2", "3", "4", "5", "6", "7"};
  dprun::Scheduler s(machine, 0);  // --jobs auto
  // Trials 0..5 need 1, 4, 2, 8, 2, 1 GPUs.
  const int need[] = {1, 4, 2, 8, 2, 1};
  for (int i = 0; i < 6; ++i) s.add(i, gpus(need[i]));

  auto started = s.start_now();  // the 8-GPU trial first; nothing else fits beside it
  REQUIRE(started.size() == 1);
  CHECK(started[0].first == 3);
  CHECK(started[0].second.text() == "gpus 0,1,2,3,4,5,6,7");
  CHECK(started[0].second.visible_devices() == "0,1,2,3,4,5,6,7");
  CHECK(s.start_now().empty());

  s.release(3);
  std::vector<std::pair<int, DeviceSet>> running = s.start_now();  // 4 + 2 + 2 fill the machine
  REQUIRE(running.size() == 3);
  CHECK(running[0].first == 1);
  CHECK(running[0].second.text() == "gpus 0,1,2,3");
  CHECK(running[1].first == 2);
  CHECK(running[1].second.text() == "gpus 4,5");
  CHECK(running[2].first == 4);
  CHECK(running[2].second.text() == "gpus 6,7");
  check_disjoint(running);

  s.release(2);  // GPUs 4 and 5 free: both 1-GPU trials backfill them
  auto more = s.start_now();
  REQUIRE(more.size() == 2);
  CHECK(more[0].first == 0);
  CHECK(more[0].second.text() == "gpus 4");
  CHECK(more[1].first == 5);
  CHECK(more[1].second.text() == "gpus 5");
  running.erase(running.begin() + 1);
  running.insert(running.end(), more.begin(), more.end());
  check_disjoint(running);
  CHECK_FALSE(s.waiting());
  CHECK(s.running() == 4);
}

TEST_CASE(
    "scheduler: at most N at once, CPU cores, trials larger than the machine, exclusive "
    "trials",
    "[scheduler]") {
  dprun::DeviceInventory machine;
  machine.cores = {0, 1, 2, 3, 6, 7};  // an affinity mask with a gap
  machine.gpus = {"GPU-a", "GPU-b"};
  dprun::Scheduler s(machine, 2);  // --jobs 2
  s.add(0, {DeviceKind::cpu, 1, false});
  s.add(1, {DeviceKind::cpu, 2, false});
  s.add(2, {DeviceKind::cpu, 2, false});
  s.add(3, gpus(4));  // more GPUs than there are: all of them (the trial then decides)
  auto started = s.start_now();
  REQUIRE(started.size() == 2);  // at most 2 at once, the larger ones first
  CHECK(started[0].first == 1);
  CHECK(started[0].second.text() == "cores 0,1");
  CHECK(started[1].first == 2);
  CHECK(started[1].second.text() == "cores 2,3");
  s.release(1);
  started = s.start_now();
  REQUIRE(started.size() == 1);
  CHECK(started[0].first == 3);
  CHECK(started[0].second.text() == "gpus GPU-a,GPU-b");
  s.release(2);
  started = s.start_now();
  REQUIRE(started.size() == 1);
  CHECK(started[0].first == 0);
  CHECK(started[0].second.text() == "cores 0");

  // A trial whose processes run elsewhere runs alone.
  dprun::Scheduler x(machine, 0);
  x.add(0, {DeviceKind::cpu, 1, false});
  x.add(1, {DeviceKind::gpu, 2, true});
  x.add(2, {DeviceKind::cpu, 1, false});
  started = x.start_now();
  REQUIRE(started.size() == 1);
  CHECK(started[0].first == 1);
  CHECK(started[0].second.exclusive);
  x.release(1);
  CHECK(x.start_now().size() == 2);

  DeviceSet cores{DeviceKind::cpu, {}, {0, 1, 2, 3, 6, 8}, false};
  CHECK(cores.text() == "cores 0-3,6,8");
}
