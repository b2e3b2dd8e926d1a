// dprun submit's side of the handshake with sbatch, with sbatch played by a script on PATH that
// records its arguments and answers as told: what is recorded before sbatch is asked, what a
// refusal leaves behind (nothing), --dry-run, and command lines refused before anything runs.
// The real Slurm is test_slurm_cluster.cpp.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "cli_helpers.hpp"
#include "support/env_var.hpp"

using Catch::Matchers::Contains;
using clitest::run;
using clitest::sql;
using clitest::sql1;

namespace fs = std::filesystem;

namespace {

// A folder with an experiment file, a fake sbatch whose answer and exit status a test sets, and a
// fake squeue that lists every task as pending.
struct Submitter {
  dptest::TempDir dir;
  std::string file = dir.path() + "/sw.toml";
  std::string db = dir.path() + "/results/sw.db";
  std::string bin = dir.path() + "/bin";
  std::string calls = dir.path() + "/sbatch-calls.txt";
  // dprun inherits it: the fake sbatch and squeue come first.
  dptest::EnvVar path{"PATH",
                      bin + ":" + std::string(std::getenv("PATH") ? std::getenv("PATH") : "")};

  explicit Submitter(const std::string& toml) {
    clitest::write_file(file, toml);
    fs::create_directories(bin);
    answer("12", 0);
    // Slurm lists both arrays' tasks as pending (both have the fake job id 12, index 0).
    clitest::write_file(bin + "/squeue", "#!/bin/sh\necho '12|0|PENDING'\n");
    ::chmod((bin + "/squeue").c_str(), 0755);
  }
  // sbatch prints `out` and exits with `status`, after appending its arguments to `calls`.
  void answer(const std::string& out, int status) {
    const std::string script = bin + "/sbatch";
    clitest::write_file(script, "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '" + calls + "'\necho '" +
                                    out + "'\nexit " + std::to_string(status) + "\n");
    ::chmod(script.c_str(), 0755);
  }
  clitest::Result operator()(const std::vector<std::string>& args) {
    std::vector<std::string> argv{"submit", file};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, dir.path());
  }
  std::string sbatch_calls() const { return clitest::slurp(calls); }
};

std::string sweep(const std::string& data, const std::string& extra = "") {
  return clitest::experiment_toml("sw", data, "[1, 2]", 2) + extra;
}

}  // namespace

TEST_CASE("submit: the plan is recorded, then one array is asked of sbatch", "[submit]") {
  DPRUN_NEED_DATA(data);
  Submitter s(sweep(data, "[launch.slurm]\npartition = \"debug\"\nmax_parallel = 1\n"));
  const auto r = s({"--slurm", "--time=5", "--qos=low"});
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.out, Contains("2 trials, 2 to submit") &&
                        Contains("submitted Slurm job 12: 1 trial (1 process, 1 CPU each), "
                                 "array 0-0, at most 1 at once"));
  // Trials of 1 and 2 replicas on the CPU backend ask for 1 and 2 cores: two arrays.
  const std::string folder = s.dir.path() + "/results/sw.tasks/s0001";
  CHECK_THAT(s.sbatch_calls(),
             Contains("--parsable --job-name=dprun-sw --array=0-0%1 --output=" + folder +
                      "/t%4a.out --ntasks=1 --cpus-per-task=1 --partition=debug --time=5 "
                      "--qos=low " +
                      folder + "/job.sh"));
  CHECK_THAT(s.sbatch_calls(), Contains("--cpus-per-task=2"));
  CHECK(sql1(s.db, "SELECT group_concat(job_id || ':' || folder, ' ') FROM submissions") ==
        "12:sw.tasks/s0001 12:sw.tasks/s0002");
  CHECK(sql1(s.db, "SELECT group_concat(state, ' ') FROM tasks") == "submitted submitted");
  // Each task has its own database, seeded with its trial; the folder holds what it runs.
  for (const char* f : {"job.sh", "submission.json", "experiment.toml", "t0000.db"})
    CHECK(fs::exists(folder + "/" + f));
  CHECK(sql1(folder + "/t0000.db", "SELECT COUNT(*) FROM trials") == "1");
  CHECK(sql1(folder + "/t0000.db", "SELECT status FROM trials") == "pending");
  CHECK_THAT(clitest::slurp(folder + "/job.sh"), Contains(" __slurm-task " + folder + "\n"));

  // The tasks have not run: a second submit submits nothing and a local run would not run them.
  const auto again = s({"--slurm"});
  DPRUN_REQUIRE_EXIT(again, 0);
  CHECK_THAT(again.out, Contains("0 to submit (2 submitted)") && Contains("nothing to submit"));
  const auto plan = run({"plan", s.file}, s.dir.path());
  CHECK_THAT(plan.out, Contains("skip: submitted: Slurm job 12_0"));
}

TEST_CASE("submit: sbatch refusing the array leaves nothing behind", "[submit]") {
  DPRUN_NEED_DATA(data);
  Submitter s(sweep(data));
  s.answer("sbatch: error: invalid partition specified: gpu", 1);
  const auto r = s({"--slurm", "--partition=gpu"});
  DPRUN_REQUIRE_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("sbatch refused the job array (exit status 1") &&
                        Contains("invalid partition specified") &&
                        Contains("the command was: sbatch --parsable"));
  CHECK(sql1(s.db, "SELECT COUNT(*) FROM submissions") == "0");
  CHECK(sql1(s.db, "SELECT COUNT(*) FROM tasks") == "0");
  CHECK(fs::is_empty(s.dir.path() + "/results/sw.tasks"));
}

TEST_CASE("submit: --dry-run prints the sbatch command and the job script", "[submit]") {
  DPRUN_NEED_DATA(data);
  Submitter s(sweep(data));
  const auto r = s({"--dry-run", "--slurm", "--", "-p", "debug"});
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.out, Contains("would submit 1 trial (1 process, 1 CPU each):") &&
                        Contains("--ntasks=1 --cpus-per-task=2 -p debug ") &&
                        Contains("sw.tasks/sNNNN/job.sh:\n#!/bin/sh\n") &&
                        Contains("__slurm-task "));
  CHECK(s.sbatch_calls().empty());
  CHECK_FALSE(fs::exists(s.db));
}

TEST_CASE("submit: a command line or file it cannot use is refused with exit status 2",
          "[submit]") {
  DPRUN_NEED_DATA(data);
  Submitter s(sweep(data));
  auto r = s({"--slurm", "--array=0-9"});
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("--slurm: sbatch option --array=0-9 cannot be given"));
  r = s({"--slurm", "-p", "debug", "extra"});
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("'extra' is not an option"));
  r = s({});
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("dprun submit needs --slurm [sbatch options] or a [launch.slurm]"));
  r = s({"--max-parallel", "0", "--slurm"});
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("--max-parallel 0: expected a positive integer"));
  r = run({"submit", "--slurm", s.file}, s.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("give the experiment file before --slurm"));
  clitest::write_file(s.file, sweep(data, "[launch.slurm]\ntime = \"soon\"\n"));
  r = s({"--slurm"});
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("sw.toml:21:8: launch.slurm.time: expected a Slurm time limit"));
  CHECK(s.sbatch_calls().empty());
  CHECK_FALSE(fs::exists(s.db));
}

TEST_CASE("submit: under asha each task carries the rung it runs to, and a task stops there",
          "[submit][asha]") {
  DPRUN_NEED_DATA(data);
  Submitter s(clitest::experiment_toml("sw", data, "[1]", 3) +
              "[search]\nscheduler = \"asha\"\neta = 3\nmin_epochs = 1\n");
  auto dry = s({"--dry-run", "--slurm"});
  DPRUN_REQUIRE_EXIT(dry, 0);
  CHECK_THAT(dry.out, Contains("asha: to rung 0 (epoch 1)"));
  const auto r = s({"--slurm"});
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.out, Contains("1 to submit") && Contains("submit again when these tasks"));
  const std::string folder = s.dir.path() + "/results/sw.tasks/s0001";
  CHECK_THAT(clitest::slurp(folder + "/submission.json"),
             Contains("\"rung\":0,\"stop_after\":1"));
  // The task, run by hand as Slurm would, runs its trial to the rung and pauses it there.
  const auto task = run({"__slurm-task", folder, "--index", "0"}, s.dir.path());
  DPRUN_CHECK_EXIT(task, 0);
  CHECK(sql1(folder + "/t0000.db", "SELECT status || ' ' || rung FROM trials") == "pruned 0");
  CHECK(sql1(folder + "/t0000.db", "SELECT COUNT(*) FROM epochs") == "1");
}
