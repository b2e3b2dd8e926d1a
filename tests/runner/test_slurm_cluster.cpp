// dprun submit on a real Slurm: a single-node slurmctld + slurmd started here, in a temporary
// folder, as the current user (no root, no munge, no systemd, no cgroups: auth/none, cred/none,
// proctrack/linuxproc, task/none, accounting off). A LeNet sweep goes in as a job array, is
// merged (twice: nothing changes), grows by two trials whose tasks are stopped mid-run (scancel,
// and SIGKILL of the task's dprun), and a resubmission completes them from their checkpoints
// without rerunning what was done.
// Skips, saying why, where Slurm's daemons are not installed or cannot start; stops them at the
// end whatever happens.
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <regex>
#include <thread>

#include "cli_helpers.hpp"
#include "base/command.hpp"
#include "base/os.hpp"
#include "dp/process_group.hpp"
#include "process/launch.hpp"
#include "slurm/slurm.hpp"
#include "support/env_var.hpp"

using Catch::Matchers::Contains;
using clitest::sql;
using clitest::sql1;

namespace fs = std::filesystem;

namespace {

// Generous bounds for a loaded 2-core machine; polling ends as soon as the condition holds.
constexpr double kStartSeconds = 60;
constexpr double kSweepSeconds = 300;

// Every wait of a test case ends by this time (set when its cluster starts), however many waits
// it has: the case then fails and stops its daemons well inside ctest's 900 s, whose kill would
// leave them running. Stopping the cluster waits on its own short bounds (capped = false).
constexpr double kCaseSeconds = 600;
std::chrono::steady_clock::time_point g_case_deadline =
    std::chrono::steady_clock::time_point::max();

bool poll(const std::function<bool()>& done, double seconds, bool capped = true) {
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(seconds));
  if (capped) deadline = std::min(deadline, g_case_deadline);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return done();
}

// A daemon on PATH or in the sbin folders a user's PATH often lacks; "" when there is none.
std::string find_daemon(const std::string& name) {
  if (std::string p = dprun::find_executable(name); !p.empty()) return p;
  for (const char* dir : {"/usr/sbin", "/usr/local/sbin", "/sbin"}) {
    const std::string p = std::string(dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// A TCP port nothing listens on now (the kernel's choice), for the daemons.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

std::string short_hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string s = name;
  return s.substr(0, s.find('.'));
}

std::string user_name() {
  const passwd* pw = ::getpwuid(::getuid());
  return pw ? pw->pw_name : std::to_string(::getuid());
}

dprun::CommandOutput slurm_command(const std::vector<std::string>& argv) {
  return dprun::run_captured(argv, 60);
}

// slurmctld and slurmd in the foreground, as children of this test, with their configuration,
// state, spool, logs and pid files in `dir`. `problem` is set when they cannot start. The
// destructor cancels every job of this private cluster and stops both daemons, whatever
// happened in between.
class SlurmCluster {
 public:
  explicit SlurmCluster(const std::string& dir) : dir_(dir) {
    const std::string ctld = find_daemon("slurmctld"), slurmd = find_daemon("slurmd");
    if (ctld.empty() || slurmd.empty() || dprun::find_executable("sbatch").empty() ||
        dprun::find_executable("squeue").empty()) {
      problem =
          "Slurm is not installed (slurmctld, slurmd, sbatch and squeue are needed; "
          "Debian: apt install slurmctld slurmd slurm-client)";
      return;
    }
    for (const char* sub : {"state", "spool", "log"}) fs::create_directories(dir_ + "/" + sub);
    const std::string host = short_hostname(), user = user_name();
    const int ctld_port = free_port();
    int slurmd_port = free_port();
    while (slurmd_port == ctld_port) slurmd_port = free_port();
    conf_ = dir_ + "/slurm.conf";
    const std::vector<std::string> lines = {
        "ClusterName=dpruntest", "SlurmctldHost=" + host + "(127.0.0.1)",
        "SlurmctldPort=" + std::to_string(ctld_port), "SlurmdPort=" + std::to_string(slurmd_port),
        // The current user runs everything: no root, no munge, no cgroups.
        "SlurmUser=" + user, "SlurmdUser=" + user, "AuthType=auth/none", "CredType=cred/none",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none",
        "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2",
        "MinJobAge=600",  // scontrol remembers ended tasks while the test asks
        "KillWait=10", "InactiveLimit=0",
        // The node is what this file says (2 CPUs), whatever the machine has.
        "SlurmdParameters=config_overrides", "StateSaveLocation=" + dir_ + "/state",
        "SlurmdSpoolDir=" + dir_ + "/spool", "SlurmctldPidFile=" + dir_ + "/slurmctld.pid",
        "SlurmdPidFile=" + dir_ + "/slurmd.pid", "SlurmctldLogFile=" + dir_ + "/log/slurmctld.log",
        "SlurmdLogFile=" + dir_ + "/log/slurmd.log", "SlurmctldDebug=info", "SlurmdDebug=info",
        "NodeName=" + host + " NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"};
    std::string text;
    for (const auto& line : lines) text += line + "\n";
    clitest::write_file(conf_, text);
    conf_env_.emplace("SLURM_CONF", conf_);
    g_case_deadline = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(kCaseSeconds));
    // -D: in the foreground, so that they are this test's children; -i: no saved state.
    ctld_ = spawn({ctld, "-D", "-i", "-f", conf_}, "slurmctld");
    slurmd_ = spawn({slurmd, "-D", "-f", conf_}, "slurmd");
    const bool up = poll(
        [&] {
          if (!alive(ctld_) || !alive(slurmd_)) return true;
          const auto s = slurm_command({"sinfo", "-h", "-o", "%T"});
          return s.ok() && s.out.rfind("idle", 0) == 0;
        },
        kStartSeconds);
    if (!up || !alive(ctld_) || !alive(slurmd_))
      problem = std::string(!alive(ctld_)     ? "slurmctld exited"
                            : !alive(slurmd_) ? "slurmd exited"
                                              : "the node did not become idle") +
                " (as user " + user + ", config " + conf_ + ")\n--- slurmctld log ---\n" +
                dprun::file_tail(dir_ + "/log/slurmctld.log", 1500) + "\n--- slurmd log ---\n" +
                dprun::file_tail(dir_ + "/log/slurmd.log", 1500);
  }

  ~SlurmCluster() {
    if (alive(ctld_)) {
      slurm_command({"scancel", "--user", user_name()});
      poll([] { return queue().empty(); }, 60, false);
    }
    for (pid_t pid : {slurmd_, ctld_}) stop(pid);
  }

  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  /// Every job and array task this cluster still lists ("" when none; "?" when squeue fails).
  static std::string queue() {
    const auto q = slurm_command({"squeue", "-h", "-r", "-o", "%i %T"});
    return q.ok() ? q.out : "?" + q.failure();
  }

  std::string problem;

 private:
  pid_t spawn(const std::vector<std::string>& argv, const std::string& name) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const std::string out = dir_ + "/log/" + name + ".stdout";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    if (posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    return pid;
  }

  // Once reaped, the number is forgotten: stop() must never signal a pid the kernel reused.
  static bool alive(pid_t& pid) {
    if (pid <= 0) return false;
    if (::waitpid(pid, nullptr, WNOHANG) == 0) return true;
    pid = -1;
    return false;
  }

  // SIGTERM, then SIGKILL when it has not exited after a while; reaped either way.
  static void stop(pid_t pid) {
    if (pid <= 0) return;
    ::kill(pid, SIGTERM);
    const bool gone = poll([&] { return ::waitpid(pid, nullptr, WNOHANG) != 0; }, 30, false);
    if (!gone) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }

  std::string dir_, conf_;
  std::optional<dptest::EnvVar> conf_env_;  // SLURM_CONF for every Slurm command and dprun
  pid_t ctld_ = -1, slurmd_ = -1;
};

std::string sweep_toml(const std::string& data, const std::string& lrs) {
  return "[experiment]\nname = \"sw\"\n[data]\ndataset = \"fashion-mnist\"\npath = \"" + data +
         "\"\n[train]\nmodel = \"lenet\"\nepochs = 2\nbatch_size = 64\nlr = 0.1\n"
         "train_limit = 512\ntest_limit = 256\nbackend = \"cpu\"\ncheckpoint = \"last\"\n"
         "[launch.slurm]\nmax_parallel = 2\n[sweep]\nlr = " +
         lrs + "\n";
}

// The job id `dprun submit` printed ("submitted Slurm job 12: ...").
std::string submitted_job(const clitest::Result& r) {
  std::smatch m;
  static const std::regex id(R"(submitted Slurm job (\d+))");
  return std::regex_search(r.out, m, id) ? m[1].str() : "";
}

// Every row of the experiment's database that a merge may touch, as text.
std::string dump(const std::string& db) {
  std::string out;
  for (const char* q : {"SELECT * FROM trials ORDER BY id", "SELECT * FROM epochs ORDER BY 1, 2",
                        "SELECT * FROM tasks ORDER BY 1, 2", "SELECT * FROM checkpoints"})
    for (const auto& row : sql(db, q)) {
      for (const auto& v : row) out += v + "|";
      out += "\n";
    }
  return out;
}

// Whether Slurm's queue is empty: every task submitted has ended.
bool all_ended() { return SlurmCluster::queue().empty(); }

// The sweep tests' set-up: a folder, a cluster started in it, the experiment file and its
// database.
struct ClusterSweep {
  dptest::TempDir dir;
  SlurmCluster cluster{dir.path() + "/slurm"};
  const std::string file = dir.path() + "/sw.toml";
  const std::string db = dir.path() + "/results/sw.db";
  /// True, with the reason noted, when the cluster could not start (the test then returns).
  bool skipped() const {
    if (cluster.problem.empty()) return false;
    DPTEST_SKIPPED("skipping the Slurm cluster test: " + cluster.problem);
    return true;
  }
};

}  // namespace

TEST_CASE_METHOD(ClusterSweep,
                 "slurm cluster: a sweep as a job array, merged, cancelled mid-run and resubmitted",
                 "[slurm][cluster]") {
  DPRUN_NEED_DATA(data);
  if (skipped()) return;

  // Phase 1: two trials, one array; every trial done once with all its epochs.
  clitest::write_file(file, sweep_toml(data, "[0.1, 0.05]"));
  const auto first = clitest::run({"submit", file, "--slurm", "--time=10"}, dir.path());
  DPRUN_REQUIRE_EXIT(first, 0);
  CHECK_THAT(first.out, Contains("2 to submit") && Contains("array 0-1, at most 2 at once"));
  REQUIRE(fs::exists(dir.path() + "/results/sw.tasks/s0001/job.sh"));
  REQUIRE(poll(all_ended, kSweepSeconds));
  const auto merged = clitest::run({"merge", file}, dir.path());
  DPRUN_REQUIRE_EXIT(merged, 0);
  CHECK_THAT(merged.out, Contains("collected 2 task results"));
  CHECK(sql1(db, "SELECT COUNT(*) FROM trials WHERE status = 'done' AND attempts = 1") == "2");
  CHECK(sql(db, "SELECT trial_id, COUNT(*) FROM epochs GROUP BY trial_id") ==
        std::vector<std::vector<std::string>>{{"1", "2"}, {"2", "2"}});
  // Merging again changes nothing.
  const std::string after_first_merge = dump(db);
  DPRUN_REQUIRE_EXIT(clitest::run({"merge", file}, dir.path()), 0);
  CHECK(dump(db) == after_first_merge);

  // Phase 2: two more trials, whose tasks hang after epoch 1; one is cancelled with scancel
  // (Slurm's SIGTERM reaches dprun), the other's dprun is killed with SIGKILL (no record of its
  // end: only Slurm can say what happened).
  clitest::write_file(file, sweep_toml(data, "[0.1, 0.05, 0.02, 0.01]"));
  const auto second = clitest::run({"submit", file, "--slurm"}, dir.path(), {"DPRUN_FAULT=hang@1"});
  DPRUN_REQUIRE_EXIT(second, 0);
  CHECK_THAT(second.out, Contains("2 to submit (2 done)"));
  const std::string job = submitted_job(second);
  REQUIRE(!job.empty());
  const std::string tasks = dir.path() + "/results/sw.tasks/s0002/";
  for (const char* task_db : {"t0000.db", "t0001.db"})
    REQUIRE(poll(
        [&] {
          try {
            return fs::exists(tasks + task_db) &&
                   sql1(tasks + task_db, "SELECT COUNT(*) FROM epochs") == "1";
          } catch (const std::exception&) {
            return false;  // being written
          }
        },
        kSweepSeconds));
  // While they run, status says so (and a local run would not run them a second time).
  const auto running = clitest::run({"status", file}, dir.path());
  DPRUN_CHECK_EXIT(running, 0);
  CHECK_THAT(running.out, Contains("4 trials: 2 done, 2 running"));
  // Their epochs so far, read from the tasks' own databases before any merge.
  CHECK_THAT(running.out, Contains("running  1/2") && Contains("RUNNING"));
  const auto cancel = slurm_command({"scancel", job + "_0"});
  INFO(cancel.failure());
  REQUIRE(cancel.ok());
  const pid_t task_dprun = std::stoi(sql1(tasks + "t0001.db", "SELECT runner_pid FROM trials"));
  REQUIRE(task_dprun > 0);
  ::kill(task_dprun, SIGKILL);
  REQUIRE(poll(all_ended, kSweepSeconds));
  const auto status = clitest::run({"status", file}, dir.path());
  DPRUN_REQUIRE_EXIT(status, 0);
  CHECK_THAT(status.out, Contains("4 trials: 2 done, 2 interrupted"));
  CHECK_THAT(sql1(db, "SELECT error FROM trials WHERE ordinal = 2"),
             Contains("cancelled by Slurm (scancel)") && Contains("after epoch 1"));
  CHECK_THAT(sql1(db, "SELECT error FROM trials WHERE ordinal = 3"),
             Contains("killed by SIGKILL") && Contains("after epoch 1"));

  // Resubmitting runs only the interrupted trials, from their checkpoints.
  const auto third = clitest::run({"submit", file, "--slurm"}, dir.path());
  DPRUN_REQUIRE_EXIT(third, 0);
  CHECK_THAT(third.out, Contains("2 to submit (2 done)"));
  REQUIRE(poll(all_ended, kSweepSeconds));
  DPRUN_REQUIRE_EXIT(clitest::run({"merge", file}, dir.path()), 0);
  CHECK(sql(db,
            "SELECT ordinal, status, attempts, ifnull(resumed_from_epoch, 0), epochs_done FROM "
            "trials JOIN (SELECT trial_id, COUNT(*) AS epochs_done FROM epochs GROUP BY "
            "trial_id) ON trial_id = id ORDER BY ordinal") ==
        std::vector<std::vector<std::string>>{{"0", "done", "1", "0", "2"},
                                              {"1", "done", "1", "0", "2"},
                                              {"2", "done", "2", "1", "2"},
                                              {"3", "done", "2", "1", "2"}});
  // Each trial was done by exactly one task; the stopped tasks are on record with their cause.
  CHECK(sql(db, "SELECT trial_id, COUNT(*) FROM tasks WHERE status = 'done' GROUP BY trial_id") ==
        std::vector<std::vector<std::string>>{{"1", "1"}, {"2", "1"}, {"3", "1"}, {"4", "1"}});
  CHECK(sql1(db, "SELECT COUNT(*) FROM tasks WHERE status = 'interrupted'") == "2");
  const auto final_status = clitest::run({"status", file}, dir.path());
  CHECK_THAT(final_status.out, Contains("4 trials: 4 done"));
  // The checkpoints the tasks wrote are found from the experiment's database (and their sha256
  // checked): those of a resumed trial too.
  const std::string resumed = sql1(db, "SELECT id FROM trials WHERE ordinal = 3");
  const auto exported = clitest::run(
      {"export", "--db", db, resumed, "--output", dir.path() + "/model.safetensors"}, dir.path());
  DPRUN_CHECK_EXIT(exported, 0);
  CHECK_THAT(exported.out, Contains("last checkpoint of epoch 2"));
}

TEST_CASE_METHOD(ClusterSweep,
                 "slurm cluster: asha as rounds of submissions, each promoting the best so far",
                 "[slurm][cluster][asha]") {
  DPRUN_NEED_DATA(data);
  if (skipped()) return;
  // Three trials, 2 epochs each, the first rung at epoch 1: each runs to epoch 1, the best one
  // (eta 3) goes on to epoch 2.
  std::string toml = sweep_toml(data, "[0.1, 0.05, 0.02]");
  toml.insert(toml.find("[launch.slurm]"),
              "[search]\nscheduler = \"asha\"\neta = 3\nmin_epochs = 1\n");
  clitest::write_file(file, toml);
  const auto first = clitest::run({"submit", file, "--slurm", "--time=10"}, dir.path());
  DPRUN_REQUIRE_EXIT(first, 0);
  CHECK_THAT(first.out, Contains("3 to submit") && Contains("submit again when these tasks"));
  REQUIRE(poll(all_ended, kSweepSeconds));
  // The second round merges the three results and submits the promotion of the best.
  const auto second = clitest::run({"submit", file, "--slurm"}, dir.path());
  DPRUN_REQUIRE_EXIT(second, 0);
  CHECK_THAT(second.out, Contains("1 to submit") && Contains("2 not now (asha)"));
  REQUIRE(poll(all_ended, kSweepSeconds));
  DPRUN_REQUIRE_EXIT(clitest::run({"merge", file}, dir.path()), 0);
  CHECK(sql(db,
            "SELECT status, rung, ifnull(resumed_from_epoch, 0), (SELECT COUNT(*) FROM epochs "
            "WHERE trial_id = id) FROM trials ORDER BY status, ordinal") ==
        std::vector<std::vector<std::string>>{{"done", "1", "1", "2"},
                                              {"pruned", "0", "0", "1"},
                                              {"pruned", "0", "0", "1"}});
  // The promoted trial was the best at the rung.
  CHECK(sql1(db, "SELECT t.status FROM trials t JOIN epochs e ON e.trial_id = t.id AND "
                 "e.epoch = 1 ORDER BY e.test_acc DESC, t.ordinal LIMIT 1") == "done");
  // Nothing is left to decide.
  const auto third = clitest::run({"submit", file, "--slurm"}, dir.path());
  DPRUN_REQUIRE_EXIT(third, 0);
  CHECK_THAT(third.out, Contains("nothing to submit"));
}

TEST_CASE("slurm cluster: a trial of 2 processes runs them with srun inside its task",
          "[slurm][cluster]") {
  DPRUN_NEED_DATA(data);
  if (!dp::mpi_compiled()) {
    DPTEST_SKIPPED("dprun was built without MPI: skipping the 2-process trial on Slurm");
    return;
  }
  dptest::TempDir dir;
  SlurmCluster cluster(dir.path() + "/slurm");
  if (!cluster.problem.empty()) {
    DPTEST_SKIPPED("skipping the Slurm cluster test: " + cluster.problem);
    return;
  }
  const auto plugins = slurm_command({"srun", "--mpi=list"});
  if (plugins.out.find("pmix") == std::string::npos &&
      plugins.err.find("pmix") == std::string::npos) {
    DPTEST_SKIPPED("Slurm has no pmix plugin (srun --mpi=list): skipping the 2-process trial");
    return;
  }
  // Open MPI as root needs consent; containers often lack the ptrace rights of its single-copy
  // shared memory (as for the mpi_np tests).
  std::optional<dptest::EnvVar> root, root_confirm;
  if (::getuid() == 0) {
    root.emplace("OMPI_ALLOW_RUN_AS_ROOT", "1");
    root_confirm.emplace("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  const dptest::EnvVar single_copy("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
  const std::string file = dir.path() + "/mp.toml";
  const std::string db = dir.path() + "/results/mp.db";
  clitest::write_file(
      file, "[experiment]\nname = \"mp\"\n[data]\ndataset = \"fashion-mnist\"\npath = \"" + data +
                "\"\n[train]\nmodel = \"lenet\"\nepochs = 2\nbatch_size = 64\nlr = 0.1\n"
                "train_limit = 512\ntest_limit = 256\nbackend = \"cpu\"\ngpus = 2\n"
                "processes = 2\n[launch]\nargs = [\"--mpi=pmix\"]\n");
  const auto submitted = clitest::run({"submit", file, "--slurm"}, dir.path());
  DPRUN_REQUIRE_EXIT(submitted, 0);
  CHECK_THAT(submitted.out, Contains("1 trial (2 processes x 1 CPU each)"));
  REQUIRE(poll(all_ended, kSweepSeconds));
  const auto merged = clitest::run({"merge", file}, dir.path());
  DPRUN_REQUIRE_EXIT(merged, 0);
  INFO(clitest::slurp(dir.path() + "/results/mp.tasks/s0001/t0000.out"));
  CHECK(sql(db, "SELECT status, error FROM trials") ==
        std::vector<std::vector<std::string>>{{"done", ""}});
  // Both processes ran, on this node: "node x2".
  CHECK_THAT(sql1(db, "SELECT hosts FROM trials"), Catch::Matchers::EndsWith(" x2"));
  CHECK_THAT(sql1(db, "SELECT launch FROM trials"),
             Contains("srun --ntasks=2 --kill-on-bad-exit=1 --input=0 --mpi=pmix"));
  CHECK(sql1(db, "SELECT COUNT(*) FROM epochs") == "2");
}
