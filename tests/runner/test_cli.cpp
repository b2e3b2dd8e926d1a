// End-to-end tests of the dprun binary: sweeps, reconciliation with the database, the query /
// plan / plugins / report / train commands and command-line errors. Failure paths (killed
// trials, signals) are in test_run_faults.cpp.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "cli_helpers.hpp"
#include "dp/backend.hpp"
#include "dp/plugin.hpp"
#include "support/cifar10_files.hpp"

namespace fs = std::filesystem;
using clitest::run;
using clitest::sql;
using clitest::sql1;

TEST_CASE("a sweep runs, a re-run skips done trials, --rerun and new trials", "[cli]") {
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  const std::string file = dir.path() + "/sweep.toml";
  const std::string db = dir.path() + "/out/sweep.db";
  clitest::write_file(file, clitest::experiment_toml("sweep", data));
  const std::vector<std::string> base{"run", file, "--db", db, "--threads", "2"};

  auto r = run(base, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(sql1(db, "SELECT COUNT(*) FROM trials") == "2");
  CHECK(sql1(db, "SELECT COUNT(*) FROM trials WHERE status = 'done'") == "2");
  CHECK(sql1(db, "SELECT COUNT(*) FROM epochs") == "4");
  for (const auto& row : sql(db,
                             "SELECT gpus, COUNT(e.epoch), MIN(e.test_acc), MAX(e.test_acc), "
                             "t.backend, t.devices, t.attempts, t.plugin_sha256 FROM trials t "
                             "JOIN epochs e ON e.trial_id = t.id GROUP BY t.id")) {
    INFO("gpus=" << row[0]);
    CHECK(row[1] == "2");
    CHECK(std::stod(row[2]) > 0.0);
    CHECK(std::stod(row[3]) <= 1.0);
    CHECK(row[4] == "cpu");
    CHECK_FALSE(row[5].empty());
    CHECK(row[6] == "1");
    CHECK(row[7].size() == 64);
  }
  // The summary names the database and a query to try.
  CHECK(r.out.find(db) != std::string::npos);
  CHECK(r.out.find("dprun query --db") != std::string::npos);
  // Progress lines (not a terminal): one per epoch.
  CHECK(r.err.find("[1/2] lenet gpus=1 epoch 1/2 loss") != std::string::npos);
  CHECK(r.err.find("[2/2] lenet gpus=2 epoch 2/2 loss") != std::string::npos);
  // Where each trial runs, said once it is known: gpus=2 on the CPU is two CPU threads.
  CHECK_THAT(r.err, Catch::Matchers::Contains("[2/2] lenet gpus=2 on cpu: CPU (") &&
                        Catch::Matchers::Contains("(CPU backend: each replica is a CPU thread)"));

  // A re-run skips both: no new attempts, no new epochs.
  r = run(base, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.err.find("0 to run") != std::string::npos);
  CHECK(sql1(db, "SELECT SUM(attempts) FROM trials") == "2");
  CHECK(sql1(db, "SELECT COUNT(*) FROM epochs") == "4");

  // --rerun runs them again.
  auto rerun = base;
  rerun.push_back("--rerun");
  r = run(rerun, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(sql1(db, "SELECT MIN(attempts) || ',' || MAX(attempts) FROM trials") == "2,2");
  CHECK(sql1(db, "SELECT COUNT(*) FROM epochs") == "4");

  // A third GPU count: only the new trial runs, in the same experiment.
  const std::string experiment_id = sql1(db, "SELECT id FROM experiments");
  clitest::write_file(file, clitest::experiment_toml("sweep", data, "[1, 2, 4]"));
  r = run(base, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(sql1(db, "SELECT COUNT(*) FROM experiments") == "1");
  CHECK(sql1(db, "SELECT id FROM experiments") == experiment_id);
  CHECK(sql1(db, "SELECT COUNT(*) FROM trials WHERE status = 'done'") == "3");
  CHECK(sql1(db, "SELECT attempts FROM trials WHERE gpus = 4") == "1");
  CHECK(sql1(db, "SELECT SUM(attempts) FROM trials") == "5");

  // --filter runs only the matching trial.
  auto filtered = base;
  for (const char* a : {"--rerun", "--filter", "gpus=4"}) filtered.push_back(a);
  r = run(filtered, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(sql1(db, "SELECT attempts FROM trials WHERE gpus = 4") == "2");
  CHECK(sql1(db, "SELECT SUM(attempts) FROM trials") == "6");

  // query: table, csv and json; a writing statement is refused.
  r = run({"query", "--db", db, "SELECT gpus, status FROM trials ORDER BY gpus"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("gpus  status") != std::string::npos);
  CHECK(r.out.find("(3 rows)") != std::string::npos);
  r = run({"query", "--db", db, "--format", "csv",
           "SELECT gpus, 'a,\"b\"' AS odd, NULL AS missing FROM trials ORDER BY gpus"},
          dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out ==
        "gpus,odd,missing\r\n1,\"a,\"\"b\"\"\",\r\n2,\"a,\"\"b\"\"\",\r\n4,\"a,\"\"b\"\"\",\r\n");
  r = run({"query", "--db", db, "--format=json",
           "SELECT gpus, status, NULL AS missing FROM trials WHERE gpus = 2"},
          dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out == "[\n {\"gpus\":2,\"status\":\"done\",\"missing\":null}\n]\n");
  r = run({"query", "--db", db,
           "INSERT INTO experiments(name, toml_source, toml_sha256) "
           "VALUES ('x', '', '')"},
          dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("read-only") != std::string::npos);
  CHECK(sql1(db, "SELECT COUNT(*) FROM experiments") == "1");

  // report: one block per experiment.
  r = run({"report", "--db", db}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("experiment sweep") != std::string::npos);
  CHECK(r.out.find("speedup") != std::string::npos);
  CHECK(r.out.find("1.00x") != std::string::npos);  // the 1-GPU trial against itself
  // The 2-GPU trial's dash says why: its per-GPU batch is not the 1-GPU trial's.
  CHECK(r.out.find("lenet gpus=2 per_gpu_batch=32: no speedup: its per_gpu_batch is 32, the "
                   "1-GPU trial's 64") != std::string::npos);
  CHECK(r.out.find("gpus=1 per_gpu_batch=64: no speedup") == std::string::npos);

  // plan: all done now.
  r = run({"plan", file, "--db", db}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("skip: done") != std::string::npos);
  CHECK(r.out.find("0 to run, 3 to skip") != std::string::npos);
}

TEST_CASE("plan and --dry-run read the database without creating it", "[cli]") {
  dptest::TempDir dir;
  const std::string file = dir.path() + "/plan.toml";
  clitest::write_file(file, clitest::experiment_toml("plan", "/nonexistent", "[1, 2, 4]"));
  const std::string db = dir.path() + "/plan.db";
  auto r = run({"plan", file, "--db", db}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("lenet gpus=1") != std::string::npos);
  CHECK(r.out.find("lenet gpus=4") != std::string::npos);
  CHECK(r.out.find("3 to run, 0 to skip") != std::string::npos);
  CHECK(r.out.find("not created yet") != std::string::npos);
  r = run({file, "--db", db, "--dry-run", "--filter", "gpus=2"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("1 to run, 2 to skip") != std::string::npos);
  CHECK(r.out.find("skip: filtered out") != std::string::npos);
  CHECK_FALSE(fs::exists(db));
  r = run({file, "--db", db, "--dry-run", "--filter", "gpu=2"}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("unknown setting \"gpu\"") != std::string::npos);
  // A misspelt model option would filter out every trial: an error, with the known options.
  r = run({file, "--db", db, "--dry-run", "--filter", "option.hiden=64"}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("no model of this sweep has an option \"hiden\"") != std::string::npos);
  CHECK(r.err.find("did you mean option.hidden?") != std::string::npos);
  r = run({file, "--db", db, "--dry-run", "--filter", "option.hidden=64"}, dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out.find("0 to run, 3 to skip") != std::string::npos);
  CHECK_FALSE(fs::exists(db));
}

TEST_CASE("bad experiment files give file:line:column and create no database", "[cli]") {
  dptest::TempDir dir;
  const std::string file = dir.path() + "/bad.toml";
  const std::string db = dir.path() + "/bad.db";
  clitest::write_file(file,
                      "[experiment]\nname = \"bad\"\n\n[train]\nmodel = \"lenet\"\n"
                      "epochs = \"two\"\n\n[sweep]\ngpus = [1, \"two\"]\n");
  auto r = run({"run", file, "--db", db}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find(file + ":6:") != std::string::npos);
  CHECK(r.err.find(file + ":9:") != std::string::npos);
  CHECK_FALSE(fs::exists(db));
  CHECK_FALSE(fs::exists(dir.path() + "/results"));

  // A folder named like an experiment file is named as the mistake, not read as an empty file.
  fs::create_directories(dir.path() + "/folder.toml");
  r = run({"run", dir.path() + "/folder.toml", "--db", db}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("folder.toml: it is a folder") != std::string::npos);
  CHECK(r.err.find("missing") == std::string::npos);

  clitest::write_file(file, "[experiment]\nname = \"bad\"\n[train]\nmodel = \"lenett\"\n");
  r = run({file, "--db", db}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find(file + ":4:") != std::string::npos);
  CHECK_FALSE(fs::exists(db));

  r = run({dir.path() + "/missing.toml", "--db", db}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("missing.toml") != std::string::npos);
  CHECK_FALSE(fs::exists(db));
}

TEST_CASE("command line: help, version, unknown commands and options", "[cli]") {
  dptest::TempDir dir;
  auto r = run({"--help"}, dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  for (const char* word : {"run", "plan", "plugins", "query", "report", "train", "help faults"})
    CHECK(r.out.find(word) != std::string::npos);
  // The testing section has its own topic: the main help stays about using dprun.
  CHECK(r.out.find("garble") == std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') < 30);
  r = run({"help", "faults"}, dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  for (const char* word : {"DPRUN_FAULT=KIND@EPOCH", "kill", "abort", "throw", "nan", "inf", "hang",
                           "garble", "DPRUN_COMM_TIMEOUT_S"})
    CHECK(r.out.find(word) != std::string::npos);
  r = run({"help", "fault"}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("no help on 'fault'; did you mean 'faults'?") != std::string::npos);
  r = run({"help", "plan"}, dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out.find("usage: dprun plan") != std::string::npos);
  r = run({"run", "--help"}, dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  for (const char* word : {"--db", "--dry-run", "--rerun", "--filter", "--oversubscribe",
                           "--threads", "--trial-timeout", "dprun help faults"})
    CHECK(r.out.find(word) != std::string::npos);
  r = run({"query", "--help"}, dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out.find("--format") != std::string::npos);
  r = run({"--version"}, dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out.rfind("dprun ", 0) == 0);
  // Which CPU kernels run here: oneDNN with its instruction set, or OpenBLAS with its core.
  CHECK_THAT(r.out, Catch::Matches("(.|\n)*CPU kernels: (oneDNN [0-9.]+ [a-z0-9_]+|OpenBLAS "
                                   "(.|\n)*)\n(.|\n)*"));
  CHECK_THAT(r.out, Catch::Contains("CUDA backend: "));

  r = run({"plna", "x.toml"}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("unknown command 'plna'; did you mean 'plan'?") != std::string::npos);
  r = run({"run", "x.toml", "--rerunn"}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("unknown option --rerunn") != std::string::npos);
  CHECK(r.err.find("did you mean --rerun?") != std::string::npos);
  r = run({"run", "x.toml", "--threads", "zero"}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("--threads zero") != std::string::npos);
  r = run({"query", "SELECT 1"}, dir.path());  // no --db and no results/*.db here
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("--db") != std::string::npos);
  r = run({"train", "--model", "lenett"}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("did you mean lenet?") != std::string::npos);
  r = run({"train", "--model", "lenet", "--option", "hidden=wide"}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("hidden=wide") != std::string::npos);

  // Every experiment-file key is an option of train, checked as in a file.
  r = run({"train", "--help"}, dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  for (const char* option : {"--per-gpu-batch N", "--lr-scaling none|linear", "--base-batch N",
                             "--bn per-replica", "--dataset NAME", "arrays, cifar10, fashion-mnist, mnist"})
    CHECK(r.out.find(option) != std::string::npos);
  r = run({"train", "--model", "lenet", "--gpus", "0"}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("--gpus 0: must be at least 1, got 0") != std::string::npos);
  r = run({"train", "--model", "lenet", "--layout", "nwhc"}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("did you mean \"nhwc\"?") != std::string::npos);

  // The settings an experiment file can give, as the README documents them.
  r = run({"settings"}, dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out.find("| `per_gpu_batch` | int ≥ 1 | batch_size / gpus |") != std::string::npos);
}

TEST_CASE("plugins lists the models with their options", "[cli]") {
  dptest::TempDir dir;
  auto r = run({"plugins", "--plugins", DPRUN_TEST_PLUGIN_DIR}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("lenet:") != std::string::npos);
  CHECK(r.out.find("resnet18:") != std::string::npos);
  CHECK(r.out.find("ABI version " + std::to_string(DPRUN_PLUGIN_ABI_VERSION)) !=
        std::string::npos);
  CHECK(r.out.find("hidden") != std::string::npos);  // a LeNet option with its type and default
  CHECK(r.out.find("int") != std::string::npos);
  CHECK(r.out.find("128") != std::string::npos);
  // A --plugins path that does not exist is reported, and the exit status says so.
  r = run({"plugins", "--plugins", dir.path() + "/no-such-folder"}, dir.path());
  DPRUN_CHECK_EXIT(r, 1);
  CHECK(r.err.find("no-such-folder") != std::string::npos);
}

TEST_CASE("train runs one model in process and prints one line per epoch", "[cli]") {
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  auto r = run({"train", "--model",   "lenet",    "--gpus",        "2",   "--batch-size",
                "64",    "--epochs",  "2",        "--train-limit", "256", "--test-limit",
                "128",   "--backend", "cpu",      "--threads",     "2",   "--data",
                data,    "--option",  "hidden=64"},
               dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("lenet on cpu") != std::string::npos);
  CHECK(r.out.find("test_acc") != std::string::npos);
  std::istringstream lines(r.out);
  int epoch_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    int epoch = 0;
    double loss = 0, train_acc = 0, test_acc = 0, seconds = 0, rate = 0;
    if (fields >> epoch >> loss >> train_acc >> test_acc >> seconds >> rate) {
      ++epoch_lines;
      CHECK(epoch == epoch_lines);
      CHECK(std::isfinite(loss));
      CHECK(test_acc > 0.0);
      CHECK(test_acc <= 1.0);
    }
  }
  CHECK(epoch_lines == 2);
}

TEST_CASE("train runs LeNet on CIFAR-10 batches unpacked under --data", "[cli][cifar10]") {
  dptest::TempDir dir;
  // Batches of 16 records, as the archive unpacks them (its own folder under the given path).
  dptest::write_cifar10_folder(dir.path() + "/cifar-10-batches-bin", 16, 64);
  auto r = run({"train", "--model", "lenet", "--dataset", "cifar10", "--data", dir.path(),
                "--epochs", "1", "--train-limit", "64", "--test-limit", "64", "--batch-size", "32",
                "--backend", "cpu", "--threads", "1"},
               dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("lenet on cpu") != std::string::npos);
  std::istringstream lines(r.out);
  int epoch_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    int epoch = 0;
    double loss = 0, train_acc = 0, test_acc = 0, seconds = 0, rate = 0;
    if (fields >> epoch >> loss >> train_acc >> test_acc >> seconds >> rate) {
      ++epoch_lines;
      CHECK(std::isfinite(loss));
      CHECK(test_acc >= 0.0);
      CHECK(test_acc <= 1.0);
    }
  }
  CHECK(epoch_lines == 1);

  // Without the files: the places tried and where to download them.
  r = run({"train", "--model", "lenet", "--dataset", "cifar10", "--data", dir.path() + "/none",
           "--epochs", "1", "--backend", "cpu"},
          dir.path());
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("dataset cifar10 not found") != std::string::npos);
  CHECK(r.err.find("cifar-10-binary.tar.gz") != std::string::npos);
}

TEST_CASE("default database path, query without --db, --backend override", "[cli]") {
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  // No [experiment].database and no --db: results/<name>.db in the current folder.
  clitest::write_file(dir.path() + "/cuda.toml", clitest::experiment_toml("cuda", data, "[1]"));
  const bool has_gpu = dp::cuda_device_count() > 0;
  auto r = run({"cuda.toml", "--backend", "cuda", "--threads", "1"}, dir.path());
  const std::string db = dir.path() + "/results/cuda.db";
  REQUIRE(fs::exists(db));
  if (!dp::cuda_compiled()) {
    // Built without CUDA: the trial fails and says to rebuild; the sweep goes on.
    DPRUN_CHECK_EXIT(r, 1);
    CHECK(sql1(db, "SELECT status FROM trials") == "failed");
    CHECK(sql1(db, "SELECT error FROM trials").find("built without CUDA") != std::string::npos);
  } else if (!has_gpu) {
    // No device here: the trial is skipped with the reason (the machine cannot run it).
    DPRUN_CHECK_EXIT(r, 0);
    CHECK(sql1(db, "SELECT status FROM trials") == "skipped");
    CHECK(sql1(db, "SELECT error FROM trials").find("none visible") != std::string::npos);
  } else {
    DPRUN_CHECK_EXIT(r, 0);
    CHECK(sql1(db, "SELECT backend FROM trials") == "cuda");
  }
  // The file says cpu; --backend overrode it for the run, not in the settings.
  CHECK(sql1(db, "SELECT backend_request FROM trials") == "cpu");

  r = run({"query", "SELECT COUNT(*) AS n FROM trials"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.err.find("using results/cuda.db") != std::string::npos);
  CHECK(r.out.find("n\n-\n1\n(1 row)") != std::string::npos);
}

TEST_CASE("bn = \"sync\" trains with statistics over every replica and is recorded", "[cli]") {
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  const std::string file = dir.path() + "/sync.toml";
  const std::string db = dir.path() + "/sync.db";
  // A narrow ResNet-18, so the run takes seconds; 2 replicas with per-replica and with
  // synchronised batch norm.
  clitest::write_file(file, "[experiment]\nname = \"sync\"\n[data]\npath = \"" + data +
                                "\"\n[train]\nmodel = \"resnet18\"\nepochs = 1\nbatch_size = 32\n"
                                "gpus = 2\ntrain_limit = 96\ntest_limit = 64\nbackend = \"cpu\"\n"
                                "[model.resnet18]\nwidth = 4\n[sweep]\nbn = [\"per-replica\", "
                                "\"sync\"]\n");
  const auto r = run({"run", file, "--db", db, "--threads", "2"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(sql1(db,
             "SELECT group_concat(bn_mode || ':' || status, ',') FROM (SELECT * FROM trials "
             "ORDER BY bn_mode)") == "per-replica:done,sync:done");
  // Different statistics, different training: the two trials' losses differ.
  CHECK(sql1(db, "SELECT COUNT(DISTINCT e.train_loss) FROM epochs e") == "2");
}

TEST_CASE(
    "precision = \"bf16\" trains on the cpu backend and is recorded, cuda takes it where it takes "
    "fp32",
    "[cli]") {
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  const std::string file = dir.path() + "/bf16.toml";
  const std::string db = dir.path() + "/bf16.db";
  auto toml = [&](const std::string& backend) {
    return "[experiment]\nname = \"bf16\"\n[data]\npath = \"" + data +
           "\"\n[train]\nmodel = \"lenet\"\nepochs = 1\nbatch_size = 32\ntrain_limit = 96\n"
           "test_limit = 64\nbackend = \"" +
           backend + "\"\n[sweep]\nprecision = [\"fp32\", \"bf16\"]\n";
  };
  clitest::write_file(file, toml("cpu"));
  auto r = run({"run", file, "--db", db, "--threads", "2"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(sql1(db,
             "SELECT group_concat(precision || ':' || status, ',') FROM (SELECT * FROM trials "
             "ORDER BY precision)") == "bf16:done,fp32:done");
  // Other arithmetic, other training.
  CHECK(sql1(db, "SELECT COUNT(DISTINCT e.train_loss) FROM epochs e") == "2");

  // On the cuda backend bf16 runs where fp32 does: here (no GPU, or a build without CUDA) both
  // trials end alike for the same reason, and neither is refused for its precision.
  const std::string cuda_file = dir.path() + "/bf16_cuda.toml";
  const std::string cuda_db = dir.path() + "/bf16_cuda.db";
  clitest::write_file(cuda_file, toml("cuda"));
  r = run({"run", cuda_file, "--db", cuda_db, "--threads", "2"}, dir.path());
  INFO(r.out << r.err);
  CHECK(sql1(cuda_db, "SELECT COUNT(*) FROM trials") == "2");
  CHECK(sql1(cuda_db, "SELECT COUNT(DISTINCT status || ':' || coalesce(error, '')) FROM trials") ==
        "1");
  CHECK(sql1(cuda_db, "SELECT coalesce(error, '') FROM trials WHERE precision = 'bf16'")
            .find("bf16") == std::string::npos);
}

TEST_CASE("allow_tf32 is recorded with each trial and false is another trial", "[cli]") {
  // TF32 is the fp32 default on GPUs, as in PyTorch; the database says which a trial asked for.
  // The CPU backend computes exact fp32 either way, so both trials here train alike.
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  const std::string file = dir.path() + "/tf32.toml";
  const std::string db = dir.path() + "/tf32.db";
  clitest::write_file(file, "[experiment]\nname = \"tf32\"\n[data]\npath = \"" + data +
                                "\"\n[train]\nmodel = \"lenet\"\nepochs = 1\nbatch_size = "
                                "32\ntrain_limit = 64\ntest_limit = 32\nbackend = \"cpu\"\n"
                                "[sweep]\nallow_tf32 = [true, false]\n");
  auto r = run({"run", file, "--db", db, "--threads", "1"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(sql1(db,
             "SELECT group_concat(allow_tf32 || ':' || status, ',') FROM (SELECT * FROM "
             "trials ORDER BY allow_tf32)") == "0:done,1:done");
  CHECK(sql1(db, "SELECT COUNT(DISTINCT config_hash) FROM trials") == "2");
  CHECK(sql1(db, "SELECT COUNT(DISTINCT e.train_loss) FROM epochs e") == "1");
}

TEST_CASE(
    "conv_choice is recorded with each trial, heuristic is another trial, and the default "
    "keeps a trial's identity",
    "[cli]") {
  // How cuDNN's algorithms are picked can change a GPU trial's bits, so a sweep over it runs both
  // trials. The CPU backend has no cuDNN algorithms: both train alike here.
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  const std::string file = dir.path() + "/choice.toml";
  const std::string db = dir.path() + "/choice.db";
  const std::string head = "[experiment]\nname = \"choice\"\n[data]\npath = \"" + data +
                           "\"\n[train]\nmodel = \"lenet\"\nepochs = 1\nbatch_size = 32\n"
                           "train_limit = 64\ntest_limit = 32\nbackend = \"cpu\"\n";
  clitest::write_file(file, head + "[sweep]\nconv_choice = [\"measured\", \"heuristic\"]\n");
  auto r = run({"run", file, "--db", db, "--threads", "1"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(sql1(db,
             "SELECT group_concat(conv_choice || ':' || status, ',') FROM (SELECT * FROM trials "
             "ORDER BY conv_choice)") == "heuristic:done,measured:done");
  CHECK(sql1(db, "SELECT COUNT(DISTINCT config_hash) FROM trials") == "2");
  CHECK(sql1(db, "SELECT COUNT(DISTINCT e.train_loss) FROM epochs e") == "1");
  // A file that does not name conv_choice is the measured trial: nothing runs again.
  clitest::write_file(file, head);
  auto again = run({"run", file, "--db", db, "--threads", "1"}, dir.path());
  DPRUN_REQUIRE_EXIT(again, 0);
  CHECK(sql1(db, "SELECT COUNT(*) FROM trials") == "2");
  CHECK(sql1(db, "SELECT COUNT(*) FROM epochs") == "2");
  // A value outside the two is refused where it stands.
  clitest::write_file(file, head + "conv_choice = \"fastest\"\n");
  auto bad = run({"run", file, "--db", db}, dir.path());
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("conv_choice") && Catch::Contains("fastest"));
}

TEST_CASE("AdamW with a warm-up and a cosine schedule: every epoch's learning rate is recorded",
          "[cli]") {
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  const std::string file = dir.path() + "/adamw.toml";
  const std::string db = dir.path() + "/adamw.db";
  // 256 examples in batches of 64: 4 steps per epoch, the first epoch warming up.
  clitest::write_file(file, "[experiment]\nname = \"adamw\"\n[data]\npath = \"" + data +
                                "\"\n[train]\nmodel = \"lenet\"\nepochs = 3\nbatch_size = 64\n"
                                "train_limit = 256\ntest_limit = 128\nbackend = \"cpu\"\n"
                                "optimizer = \"adamw\"\nlr = 0.002\nweight_decay = 0.01\n"
                                "lr_schedule = \"cosine\"\nwarmup_epochs = 1\n");
  const auto r = run({"run", file, "--db", db, "--threads", "2"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(sql1(db,
             "SELECT optimizer || ' ' || lr_schedule || ' ' || warmup_epochs || ' ' || "
             "status FROM trials") == "adamw cosine 1.0 done");
  const auto lrs = sql(db, "SELECT lr FROM epochs ORDER BY epoch");
  REQUIRE(lrs.size() == 3);
  // The last step of each epoch: 0.002 at the end of the warm-up, then the cosine over the 8
  // steps after it, at steps 4 and 8 of 8 (steps 7 and 11 of the run).
  CHECK(std::stod(lrs[0][0]) == Approx(0.002));
  CHECK(std::stod(lrs[1][0]) == Approx(0.002 * 0.5 * (1 + std::cos(M_PI * 3.0 / 8.0))));
  CHECK(std::stod(lrs[2][0]) == Approx(0.002 * 0.5 * (1 + std::cos(M_PI * 7.0 / 8.0))));
}

TEST_CASE("the command a run suggests works as printed, installed or not", "[cli]") {
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  clitest::write_file(dir.path() + "/hint.toml", clitest::experiment_toml("hint", data, "[1]", 1));
  const std::string bin = fs::path(DPRUN_TEST_EXE).parent_path().lexically_normal().string();
  const char* inherited = std::getenv("PATH");
  const std::string path = inherited ? inherited : "/usr/bin:/bin";
  // The hint's line, run by a shell in the same folder with the same PATH: its exit status.
  auto hint_of = [&](const clitest::Result& r) {
    const auto at = r.out.find("try: ");
    REQUIRE(at != std::string::npos);
    return r.out.substr(at + 5, r.out.find('\n', at) - at - 5);
  };
  auto runs = [&](const std::string& command, const std::string& with_path) {
    const std::string sh =
        "cd " + dir.path() + " && PATH='" + with_path + "' " + command + " >/dev/null 2>&1";
    return std::system(sh.c_str()) == 0;
  };
  SECTION("not on PATH: the hint names this dprun's path") {
    std::string without;  // PATH without any folder that holds a dprun
    for (std::string rest = path; !rest.empty();) {
      const auto colon = rest.find(':');
      const std::string d = rest.substr(0, colon);
      rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
      if (!fs::exists(d + "/dprun")) without += (without.empty() ? "" : ":") + d;
    }
    auto r = run({"run", "hint.toml", "--threads", "1"}, dir.path(), {"PATH=" + without});
    DPRUN_REQUIRE_EXIT(r, 0);
    const std::string hint = hint_of(r);
    CHECK_THAT(hint, Catch::StartsWith(fs::path(DPRUN_TEST_EXE).lexically_normal().string() +
                                       " query --db results/hint.db"));
    CHECK(runs(hint, without));
  }
  SECTION("on PATH: the hint says dprun") {
    auto r = run({"run", "hint.toml", "--threads", "1"}, dir.path(), {"PATH=" + bin + ":" + path});
    DPRUN_REQUIRE_EXIT(r, 0);
    const std::string hint = hint_of(r);
    CHECK_THAT(hint, Catch::StartsWith("dprun query --db results/hint.db"));
    CHECK(runs(hint, bin + ":" + path));
  }
}
