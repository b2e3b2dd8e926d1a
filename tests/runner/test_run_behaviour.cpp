// README's "How a run behaves" and the command line it documents, held end to end against the
// real dprun binary: a diverged trial is run again from the start, an infinite loss diverges, a
// trial asking for more GPUs than the machine has is skipped, the runner never initialises CUDA,
// the launch options and --jobs auto on the command line, and experiments/lr-scaling.toml. Each
// case is listed in tests/readme_claims.txt with the README sentence it holds.
#include <dlfcn.h>
#include <link.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <sstream>

#include "cli_helpers.hpp"
#include "dp/backend.hpp"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using clitest::run;
using clitest::sql;
using clitest::sql1;

namespace {

// A small LeNet sweep on the CPU backend; `train` adds to [train], `sweep` is [sweep]'s body.
struct Sweep {
  dptest::TempDir dir;
  std::string file, db;
  Sweep(const std::string& name, const std::string& data, const std::string& sweep,
        const std::string& train = "backend = \"cpu\"\n") {
    file = dir.path() + "/" + name + ".toml";
    db = dir.path() + "/" + name + ".db";
    clitest::write_file(file, "[experiment]\nname = \"" + name + "\"\n\n[data]\npath = \"" + data +
                                  "\"\n\n[train]\nmodel = \"lenet\"\nepochs = 2\nbatch_size = "
                                  "64\nlr = 0.1\ntrain_limit = 512\ntest_limit = 256\n" +
                                  train + "\n[sweep]\n" + sweep + "\n");
  }
  std::vector<std::string> args(std::initializer_list<std::string> more = {}) const {
    std::vector<std::string> a{"run", file, "--db", db, "--threads", "1"};
    a.insert(a.end(), more);
    return a;
  }
  std::string column(const std::string& name, const std::string& where = "1") const {
    return sql1(db, "SELECT " + name + " FROM trials WHERE " + where);
  }
  std::string epochs() const {
    return sql1(db,
                "SELECT group_concat(epoch, ',') FROM (SELECT epoch FROM epochs ORDER BY epoch)");
  }
};

}  // namespace

TEST_CASE("a diverged trial is run again from the start on the next run", "[cli][readme]") {
  DPRUN_NEED_DATA(data);
  Sweep s("diverged_rerun", data, "gpus = 1");
  // Diverges at epoch 2: epoch 1 and its checkpoint are kept.
  auto r = run(s.args(), s.dir.path(), {"DPRUN_FAULT=nan@2"});
  DPRUN_REQUIRE_EXIT(r, 1);
  REQUIRE(s.column("status") == "diverged");
  CHECK(s.column("error") == "loss became NaN at epoch 2");
  CHECK(s.epochs() == "1");
  REQUIRE(sql1(s.db, "SELECT MAX(epoch) FROM checkpoints WHERE role = 'last'") == "1");
  // The plan says so, and the run does it: from epoch 1, not from the checkpoint of epoch 1.
  auto plan = run({"plan", s.file, "--db", s.db}, s.dir.path());
  DPRUN_REQUIRE_EXIT(plan, 0);
  CHECK_THAT(plan.out, Contains("rerun: diverged"));
  r = run(s.args(), s.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(s.column("status") == "done");
  CHECK(s.column("attempts") == "2");
  CHECK(s.column("resumed_from_epoch").empty());
  CHECK(s.column("error").empty());
  // Epoch 1 trained again: the diverged attempt's epoch is replaced, not continued.
  CHECK(s.epochs() == "1,2");
  CHECK(sql1(s.db, "SELECT COUNT(*) FROM epochs") == "2");
  // The same two epochs as a trial that never diverged (same seed, same steps).
  Sweep clean("diverged_rerun_clean", data, "gpus = 1");
  DPRUN_REQUIRE_EXIT(run(clean.args(), clean.dir.path()), 0);
  CHECK(sql(s.db, "SELECT epoch, train_loss, test_acc FROM epochs ORDER BY epoch") ==
        sql(clean.db, "SELECT epoch, train_loss, test_acc FROM epochs ORDER BY epoch"));
}

TEST_CASE("an infinite loss marks the trial diverged and keeps the epochs before it",
          "[cli][readme]") {
  DPRUN_NEED_DATA(data);
  Sweep s("infinite", data, "gpus = [1, 2]");
  // Only the first trial (sweep position 0) gets an infinite loss at epoch 2.
  auto r = run(s.args(), s.dir.path(), {"DPRUN_FAULT=inf@2#0"});
  DPRUN_CHECK_EXIT(r, 1);
  CHECK(s.column("status", "gpus = 1") == "diverged");
  CHECK(s.column("error", "gpus = 1") == "loss became infinite at epoch 2");
  CHECK(sql1(s.db,
             "SELECT group_concat(e.epoch) FROM epochs e JOIN trials t ON t.id = "
             "e.trial_id WHERE t.gpus = 1") == "1");
  CHECK(s.column("status", "gpus = 2") == "done");  // the sweep went on
  CHECK_THAT(r.out + r.err, Contains("diverged"));
}

TEST_CASE("a trial asking for more GPUs than this machine has is skipped with the reason",
          "[cli][readme]") {
  DPRUN_NEED_DATA(data);
  if (!dp::cuda_compiled()) {
    DPTEST_SKIPPED(
        "dprun built without CUDA: a backend = \"cuda\" trial is refused (an error "
        "that says to rebuild), not skipped; the GPU count is never asked");
    return;
  }
  const int devices = dp::cuda_device_count();  // this test process, not the runner
  const int too_many = devices + 1;
  Sweep s("too_many_gpus", data, "gpus = " + std::to_string(too_many) + "\nseed = [0, 1]",
          "backend = \"cuda\"\n");
  auto r = run(s.args(), s.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);  // skipped trials are not failures
  CHECK(sql1(s.db, "SELECT group_concat(status) FROM trials") == "skipped,skipped");
  const std::string why = s.column("error", "seed = 0");
  CHECK_THAT(why, Contains("trial needs " + std::to_string(too_many) + " GPUs"));
  CHECK_THAT(why, Contains(devices == 0 ? std::string("has none visible")
                                        : "this machine has " + std::to_string(devices)));
  CHECK(sql1(s.db, "SELECT COUNT(*) FROM epochs") == "0");
  CHECK_THAT(r.out, Contains("skipped"));
  // A skipped trial is tried again on the next run (the machine may have changed).
  auto plan = run({"plan", s.file, "--db", s.db}, s.dir.path());
  DPRUN_REQUIRE_EXIT(plan, 0);
  CHECK_THAT(plan.out, Contains("rerun: skipped before"));
}

TEST_CASE("the runner never initialises CUDA, its trial processes do", "[cli][readme]") {
  DPRUN_NEED_DATA(data);
#ifndef DPRUN_TEST_FAKE_CUDA_DIR
  DPTEST_SKIPPED("dprun built without CUDA: no process of it can initialise CUDA");
  return;
#else
  // A stand-in driver first on the library path logs every process that calls cuInit (and says
  // there is no device, so "auto" trials run on the CPU). --jobs 2 makes the runner count the
  // GPUs its trials may use, in a child process.
  dptest::TempDir logs;
  const std::string log = logs.path() + "/cuinit.log";
  Sweep s("no_cuda_in_runner", data, "gpus = 1\nseed = [0, 1]", "backend = \"auto\"\n");
  const char* inherited = std::getenv("LD_LIBRARY_PATH");
  const std::string path = std::string(DPRUN_TEST_FAKE_CUDA_DIR) +
                           (inherited && *inherited ? ":" + std::string(inherited) : "");
  clitest::Dprun runner({"run", s.file, "--db", s.db, "--jobs", "2"}, s.dir.path(),
                        {"LD_LIBRARY_PATH=" + path, "DPRUN_FAKE_CUDA_LOG=" + log});
  const pid_t runner_pid = runner.pid();
  auto r = runner.wait();
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(sql1(s.db, "SELECT group_concat(status) FROM trials") == "done,done");
  // Who called cuInit: the two trials and the GPU count, never the runner.
  std::istringstream lines(clitest::slurp(log));
  int trials = 0, counts = 0;
  for (std::string line; std::getline(lines, line);) {
    INFO(line);
    CHECK_THAT(line, !StartsWith("cuInit pid " + std::to_string(runner_pid) + ":"));
    if (line.find(" __trial ") != std::string::npos) ++trials;
    if (line.find(" __devices") != std::string::npos) ++counts;
  }
  INFO("the cuInit log:\n" << clitest::slurp(log));
  CHECK(trials == 2);  // the stand-in works: the processes that should, did
  CHECK(counts >= 1);
#endif
}

TEST_CASE("dprun starts without loading cuBLAS, which a CUDA backend loads when it starts",
          "[cli][cuda][readme]") {
#ifndef DPRUN_TEST_FAKE_CUDA_DIR
  DPTEST_SKIPPED("dprun built without CUDA: it has no cuBLAS to load");
  return;
#else
  // libcublas (with libcublasLt) cost every process that loaded libdpcore 361 ms of CPU at
  // startup: it is loaded on first use now (core/src/cuda/cublas_lazy.cpp). The loader's own
  // account (LD_DEBUG=files) of a dprun command names every object it loads.
  dptest::TempDir dir;
  auto r = run({"--version"}, dir.path(), {"LD_DEBUG=files"});
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.err, Contains("file=libcudnn.so"));  // the account lists what was loaded
  CHECK_THAT(r.err, !Contains("libcublas"));
  // In this process: what loads cuBLAS works (cuda_versions asks it its version, as a CUDA
  // backend's start creates its handle), it is then loaded, and libdpcore exports none of the
  // cuBLAS functions it defines (so it interposes on no other cuBLAS in the process).
  const auto loaded = [] {
    bool found = false;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* data) {
          if (info->dlpi_name != nullptr &&
              std::strstr(info->dlpi_name, "/libcublas.so") != nullptr)
            *static_cast<bool*>(data) = true;
          return 0;
        },
        &found);
    return found;
  };
  CHECK(dlsym(RTLD_DEFAULT, "cublasCreate_v2") == nullptr);
  const dp::CudaVersions v = dp::cuda_versions();
  CHECK(v.cublas >= 110000);  // 11.0.0 or later, as major * 10000 + minor * 100 + patch
  CHECK(loaded());
  CHECK(dlsym(RTLD_DEFAULT, "cublasCreate_v2") == nullptr);
#endif
}

TEST_CASE("the options --launcher, --hostfile and --launch-arg override [launch]",
          "[cli][mpi][readme]") {
  DPRUN_NEED_DATA(data);
  DPRUN_NEED_MPI();
  // [launch] names srun, which cannot start anything outside a Slurm allocation: only the
  // command line's launcher can run the trial. Every argument is harmless to mpirun (-x exports
  // a variable to the processes).
  Sweep s("launch_options", data, "gpus = 2\nprocesses = 2",
          "backend = \"cpu\"\n\n[launch]\nlauncher = \"srun\"\nargs = [\"-x\", "
          "\"DPRUN_FROM_FILE=1\"]\n");
  const std::string hostfile = s.dir.path() + "/hosts.txt";
  clitest::write_file(hostfile, "localhost slots=4\n");
  auto r =
      run(s.args({"--launcher", "mpirun", "--hostfile", hostfile, "--launch-arg", "--oversubscribe",
                  "--launch-arg", "-x", "--launch-arg", "DPRUN_FROM_CLI=1"}),
          s.dir.path(), clitest::kMpiEnv);
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(s.column("status") == "done");
  const std::string launch = s.column("launch");
  INFO(launch);
  CHECK_THAT(launch, StartsWith("mpirun -np 2 ") || Contains("/mpirun -np 2 "));
  CHECK_THAT(launch, Contains("--hostfile " + hostfile));
  // [launch].args first, then each --launch-arg in order.
  const auto file_arg = launch.find("-x DPRUN_FROM_FILE=1");
  const auto first = launch.find("--oversubscribe");
  const auto second = launch.find("-x DPRUN_FROM_CLI=1");
  CHECK(file_arg != std::string::npos);
  CHECK(first != std::string::npos);
  CHECK(second != std::string::npos);
  CHECK(file_arg < first);
  CHECK(first < second);
  CHECK_THAT(launch, !Contains("srun"));
}

TEST_CASE("the option --jobs auto runs as many trials at once as the cores allow",
          "[cli][jobs][readme]") {
  DPRUN_NEED_DATA(data);
  DPRUN_NEED_TWO_CORES();
  const size_t cores = dprun::affinity_cores().size();
  // Every trial hangs after its first epoch: as many epochs get recorded as trials run at once
  // (one core each with one replica), and no more.
  std::string seeds = "seed = [0";
  for (size_t i = 1; i <= cores; ++i) seeds += ", " + std::to_string(i);
  Sweep s("jobs_auto", data, "gpus = 1\n" + seeds + "]");
  clitest::Dprun runner({"run", s.file, "--db", s.db, "--jobs", "auto"}, s.dir.path(),
                        {"DPRUN_FAULT=hang@1"});
  REQUIRE(runner.pid() > 0);
  REQUIRE(clitest::wait_for_epochs(s.db, static_cast<int>(cores)));
  ::kill(runner.pid(), SIGINT);
  auto r = runner.wait();
  DPRUN_CHECK_EXIT(r, 130);
  CHECK(sql1(s.db, "SELECT COUNT(*) FROM epochs") == std::to_string(cores));
  CHECK(sql1(s.db, "SELECT COUNT(*) FROM trials WHERE status = 'interrupted'") ==
        std::to_string(cores));
  CHECK(sql1(s.db, "SELECT COUNT(*) FROM trials WHERE status = 'pending'") == "1");
  for (const auto& row : sql(s.db, "SELECT device_set FROM trials WHERE status = 'interrupted'"))
    CHECK_THAT(row[0], StartsWith("cores "));
  CHECK(sql1(s.db,
             "SELECT COUNT(DISTINCT device_set) FROM trials WHERE status = "
             "'interrupted'") == std::to_string(cores));
}

TEST_CASE("experiments/lr-scaling.toml parses and plans its 18 trials", "[cli][readme]") {
  dptest::TempDir dir;
  const std::string file = std::string(DPRUN_TEST_SOURCE_DIR) + "/experiments/lr-scaling.toml";
  auto r = run({"plan", file, "--db", dir.path() + "/lr.db"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.out, Contains("experiment lr-scaling: 18 trials"));
  CHECK_THAT(r.out, Contains("18 to run, 0 to skip"));
  // lr x gpus (linear scaling from a base batch of 64), each with and without warm-up.
  for (const char* label : {"lenet lr=0.05 gpus=1 warmup_epochs=0",
                            "lenet lr=0.2 gpus=4 "
                            "warmup_epochs=1",
                            "lenet lr=0.8 gpus=4 warmup_epochs=1"})
    CHECK_THAT(r.out, Contains(label));
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/lr.db"));  // plan creates nothing
}
