// Checkpoints end to end: what each `checkpoint` mode keeps and records, a trial killed by
// DPRUN_FAULT resuming to epochs bit-identical to an uninterrupted run, --restart, a changed
// checkpoint file, `dprun export`, `dprun train --checkpoint-dir`, and Debian's PyTorch loading
// the checkpoints into the d2l models with the accuracy dprun recorded, well above chance.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli_helpers.hpp"

using clitest::run;
using clitest::sql;
using clitest::sql1;

namespace fs = std::filesystem;

namespace {

// ResNet-18 (width 4, batch norm) on 2 replicas with momentum and a cosine schedule: resuming
// must restore parameters, batch-norm buffers, momentum and the step count.
std::string resnet_toml(const std::string& name, const std::string& data,
                        const std::string& checkpoint = "last") {
  return "[experiment]\nname = \"" + name + "\"\n[data]\ndataset = \"fashion-mnist\"\npath = \"" +
         data +
         "\"\n[train]\nmodel = \"resnet18\"\nepochs = 3\nbatch_size = 32\nlr = 0.05\n"
         "momentum = 0.9\nlr_schedule = \"cosine\"\ntrain_limit = 192\ntest_limit = 96\n"
         "backend = \"cpu\"\ngpus = 2\ncheckpoint = \"" +
         checkpoint + "\"\n[model.resnet18]\nwidth = 4\n";
}

struct Run {
  dptest::TempDir dir;
  std::string file, db;
  Run(const std::string& name, const std::string& toml) {
    file = dir.path() + "/" + name + ".toml";
    db = dir.path() + "/results/" + name + ".db";
    clitest::write_file(file, toml);
  }
  clitest::Result operator()(const std::vector<std::string>& extra = {},
                             const std::vector<std::string>& env = {}) const {
    std::vector<std::string> args{"run", file, "--db", db, "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args, dir.path(), env);
  }
  std::string q(const std::string& query) const { return sql1(db, query); }
  std::string folder(int64_t trial = 1) const {
    return fs::path(db).parent_path().string() + "/" + fs::path(db).stem().string() +
           ".checkpoints/trial-" + std::to_string(trial);
  }
  // Every epoch's metrics at full precision: bit-identical runs print the same text.
  std::string epochs() const {
    std::string out;
    for (const auto& row : sql(db,
                               "SELECT epoch, printf('%.17g|%.17g|%.17g|%.17g', train_loss, "
                               "train_acc, test_acc, lr) FROM epochs ORDER BY epoch"))
      out += row[0] + ": " + row[1] + "\n";
    return out;
  }
};

std::string file_sha256(const std::string& path) {
  return dps::sha256_hex(clitest::slurp(path));
}

}  // namespace

TEST_CASE("a killed trial resumes from its checkpoint, bit-identical to an uninterrupted run",
          "[cli][checkpoint]") {
  DPRUN_NEED_DATA(data);
  Run clean("clean", resnet_toml("clean", data));
  DPRUN_REQUIRE_EXIT(clean(), 0);
  CHECK(clean.q("SELECT COUNT(*) FROM epochs") == "3");

  Run resumed("resumed", resnet_toml("resumed", data));
  auto r = resumed({}, {"DPRUN_FAULT=kill@2"});
  DPRUN_REQUIRE_EXIT(r, 1);
  CHECK(resumed.q("SELECT status FROM trials") == "failed");
  CHECK(resumed.q("SELECT epoch FROM checkpoints WHERE role = 'last'") == "2");
  CHECK(fs::exists(resumed.folder() + "/last.safetensors"));
  CHECK(fs::exists(resumed.folder() + "/last.optimizer.safetensors"));
  auto plan = run({"plan", resumed.file, "--db", resumed.db}, resumed.dir.path());
  CHECK(plan.out.find("resume after epoch 2: failed") != std::string::npos);

  r = resumed();
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.err.find("resuming after epoch 2 from its checkpoint") != std::string::npos);
  CHECK(resumed.q("SELECT status || ' ' || attempts || ' ' || resumed_from_epoch FROM trials") ==
        "done 2 2");
  // Epochs 1 and 2 of the first attempt and 3 of the second: the same bits as one run.
  CHECK(resumed.epochs() == clean.epochs());
  CHECK(file_sha256(resumed.folder() + "/last.safetensors") ==
        file_sha256(clean.folder() + "/last.safetensors"));
  CHECK(file_sha256(resumed.folder() + "/last.optimizer.safetensors") ==
        file_sha256(clean.folder() + "/last.optimizer.safetensors"));
  // The database's record is the file's (its path relative to the database's folder).
  CHECK(resumed.q("SELECT path FROM checkpoints WHERE role = 'last'") ==
        "resumed.checkpoints/trial-1/last.safetensors");
  CHECK(resumed.q("SELECT sha256 FROM checkpoints WHERE role = 'last'") ==
        file_sha256(resumed.folder() + "/last.safetensors"));
  CHECK(resumed.q("SELECT bytes FROM checkpoints WHERE role = 'last'") ==
        std::to_string(fs::file_size(resumed.folder() + "/last.safetensors")));
}

TEST_CASE("restart: --restart, a changed checkpoint or checkpoint = none start at epoch 1",
          "[cli][checkpoint]") {
  DPRUN_NEED_DATA(data);
  SECTION("--restart") {
    Run s("restart", resnet_toml("restart", data));
    DPRUN_REQUIRE_EXIT(s({}, {"DPRUN_FAULT=kill@2"}), 1);
    auto plan = run({"plan", s.file, "--db", s.db, "--restart"}, s.dir.path());
    CHECK(plan.out.find("rerun: failed") != std::string::npos);
    auto r = s({"--restart"});
    DPRUN_REQUIRE_EXIT(r, 0);
    CHECK(r.err.find("resuming") == std::string::npos);
    CHECK(s.q("SELECT attempts || ' ' || COALESCE(resumed_from_epoch, 'NULL') FROM trials") ==
          "2 NULL");
    CHECK(s.q("SELECT COUNT(*) FROM epochs") == "3");
  }
  SECTION("a checkpoint file changed since it was written") {
    Run s("changed", resnet_toml("changed", data));
    DPRUN_REQUIRE_EXIT(s({}, {"DPRUN_FAULT=kill@2"}), 1);
    {
      std::fstream f(s.folder() + "/last.safetensors", std::ios::in | std::ios::out |
                                                           std::ios::binary);
      f.seekp(-4, std::ios::end);
      f.write("\x7f\x7f\x7f\x7f", 4);
    }
    auto r = s();
    DPRUN_REQUIRE_EXIT(r, 0);
    CHECK(r.err.find("cannot resume from its last checkpoint") != std::string::npos);
    CHECK(r.err.find("has changed since it was written") != std::string::npos);
    CHECK(r.err.find("starting at epoch 1") != std::string::npos);
    CHECK(s.q("SELECT attempts || ' ' || COALESCE(resumed_from_epoch, 'NULL') FROM trials") ==
          "2 NULL");
    // The new attempt's checkpoint replaced the changed file.
    CHECK(s.q("SELECT sha256 FROM checkpoints WHERE role = 'last'") ==
          file_sha256(s.folder() + "/last.safetensors"));
  }
  SECTION("checkpoint = none") {
    Run s("none", resnet_toml("none", data, "none"));
    DPRUN_REQUIRE_EXIT(s({}, {"DPRUN_FAULT=kill@2"}), 1);
    CHECK_FALSE(fs::exists(s.folder()));
    CHECK(s.q("SELECT COUNT(*) FROM checkpoints") == "0");
    auto plan = run({"plan", s.file, "--db", s.db}, s.dir.path());
    CHECK(plan.out.find("rerun: failed") != std::string::npos);
    DPRUN_REQUIRE_EXIT(s(), 0);
    CHECK(s.q("SELECT COALESCE(resumed_from_epoch, 'NULL') FROM trials") == "NULL");
  }
}

TEST_CASE("best and every keep their files and dprun export copies one after checking it",
          "[cli][checkpoint]") {
  DPRUN_NEED_DATA(data);
  Run every("every", resnet_toml("every", data, "every"));
  DPRUN_REQUIRE_EXIT(every(), 0);
  CHECK(sql(every.db, "SELECT role || epoch FROM checkpoints ORDER BY role, epoch") ==
        std::vector<std::vector<std::string>>{{"epoch1"}, {"epoch2"}, {"epoch3"}, {"last3"}});
  for (const char* f : {"epoch-0001", "epoch-0002", "epoch-0003", "last"})
    CHECK(fs::exists(every.folder() + "/" + f + ".safetensors"));
  // The last epoch's model is the same file under both names.
  CHECK(file_sha256(every.folder() + "/epoch-0003.safetensors") ==
        file_sha256(every.folder() + "/last.safetensors"));

  Run best("best", resnet_toml("best", data, "best"));
  DPRUN_REQUIRE_EXIT(best(), 0);
  // The best epoch is the first of the highest test accuracy.
  const std::string best_epoch = best.q(
      "SELECT epoch FROM epochs ORDER BY test_acc DESC, epoch ASC LIMIT 1");
  CHECK(best.q("SELECT epoch FROM checkpoints WHERE role = 'best'") == best_epoch);
  CHECK(best.q("SELECT COUNT(*) FROM checkpoints") == "2");

  const std::string out = every.dir.path() + "/exported.safetensors";
  auto r = run({"export", "--db", every.db, "1", "--epoch", "2", "--output", out},
               every.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("epoch checkpoint of epoch 2") != std::string::npos);
  CHECK(file_sha256(out) == file_sha256(every.folder() + "/epoch-0002.safetensors"));
  // The default: the last checkpoint, named after the trial and epoch, here.
  r = run({"export", "--db", every.db, "1"}, every.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(file_sha256(every.dir.path() + "/trial-1-epoch-3.safetensors") ==
        file_sha256(every.folder() + "/last.safetensors"));
  r = run({"export", "--db", best.db, "1", "--best", "--output", out}, best.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(file_sha256(out) == file_sha256(best.folder() + "/best.safetensors"));

  // What cannot be exported says why.
  r = run({"export", "--db", every.db, "1", "--best"}, every.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("trial 1 has no checkpoint best") != std::string::npos);
  CHECK(r.err.find("it kept: epoch (epoch 1), epoch (epoch 2), epoch (epoch 3), last (epoch 3)") !=
        std::string::npos);
  r = run({"export", "--db", every.db, "9"}, every.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("has no trial 9") != std::string::npos);
  r = run({"export", "--db", every.db, "1", "--epoch", "7"}, every.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("has no checkpoint of epoch 7") != std::string::npos);
  {
    std::ofstream f(every.folder() + "/epoch-0001.safetensors", std::ios::app | std::ios::binary);
    f << "x";
  }
  r = run({"export", "--db", every.db, "1", "--epoch", "1", "--output", out}, every.dir.path());
  DPRUN_CHECK_EXIT(r, 1);
  CHECK(r.err.find("it changed after trial 1 wrote it; not exported") != std::string::npos);
}

TEST_CASE("dprun train writes checkpoints only where --checkpoint-dir says", "[cli][checkpoint]") {
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  const std::vector<std::string> base{"train",         "--model",      "lenet",  "--data",
                                      data,            "--epochs",     "1",      "--train-limit",
                                      "256",           "--test-limit", "64",     "--batch-size",
                                      "64",            "--threads",    "1",      "--backend",
                                      "cpu"};
  auto args = base;
  args.insert(args.end(), {"--checkpoint", "best"});
  auto r = run(args, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("writes checkpoints only with --checkpoint-dir DIR") != std::string::npos);
  args = base;
  args.insert(args.end(), {"--checkpoint-dir", "ck"});
  r = run(args, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("checkpoint (last): " + dir.path() + "/ck/last.safetensors") !=
        std::string::npos);
  CHECK(fs::exists(dir.path() + "/ck/last.optimizer.safetensors"));
}

namespace {

// A Python 3 that imports torch: $DPRUN_TEST_PYTHON, else Debian's (python3-torch), else the
// first python3 on PATH; "" with the reason when none does.
std::string python_with_torch(std::string& why) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("DPRUN_TEST_PYTHON"); p && *p) candidates.push_back(p);
  candidates.push_back("/usr/bin/python3");
  if (const char* path = std::getenv("PATH"))
    for (std::string rest = path; !rest.empty();) {
      const auto colon = rest.find(':');
      candidates.push_back(rest.substr(0, colon) + "/python3");
      rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
    }
  for (const auto& c : candidates) {
    if (!fs::exists(c)) continue;
    const std::string cmd = c + " -c 'import torch, numpy' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return c;
  }
  why = "no python3 here imports torch and numpy (Debian: apt-get install python3-torch, or "
        "scripts/install-deps --tests; or set DPRUN_TEST_PYTHON)";
  return "";
}

}  // namespace

TEST_CASE("PyTorch loads the checkpoints into the d2l models and gets dprun's test accuracy",
          "[cli][checkpoint][pytorch]") {
  DPRUN_NEED_DATA(data);
  std::string why;
  const std::string python = python_with_torch(why);
  if (python.empty()) {
    DPTEST_SKIPPED(why);
    return;
  }
  const std::string script = std::string(DPRUN_TEST_SOURCE_DIR) +
                             "/tests/runner/pytorch_load_checkpoint.py";
  struct Case {
    const char* name;
    std::string train;
    std::vector<std::string> args;
    int test_examples;    // the test set's examples it is evaluated on
    double min_accuracy;  // PyTorch's test accuracy must reach it
  };
  // Agreement with dprun alone would pass a model that predicts one class whatever its weights,
  // so each case is trained well above chance and checked against a floor, and its predictions
  // must cover several classes. Chance on Fashion-MNIST's 10 balanced classes is 0.10; a
  // one-class model gets its class's share (0.10 of the whole test set, at most 0.13 of the
  // first 500 examples).
  //
  // Measured (PyTorch's accuracy, always equal to dprun's): each configuration with seeds 0-4
  // (the test runs seed 0), with oneDNN's AVX-512 kernels and capped to AVX2
  // (ONEDNN_MAX_CPU_ISA=AVX2: other kernels, other rounding) and with 1 and 2 threads (the
  // same bits either way):
  // - LeNet, NCHW and NHWC: 0.674-0.719 on the whole test set over 15 runs (seed 0: 0.6924
  //   NCHW, 0.7084 NHWC), every run predicting all 10 classes. Floor 0.50: 0.17 below the
  //   lowest run, 0.40 above chance.
  // - ResNet-18 (width 16, so CI can afford it) on 500 test examples: trained on 1024 examples
  //   it ranged 0.19-0.60 over 10 runs (seed 0: 0.604 with AVX-512, 0.526 capped to AVX2), one
  //   run collapsing to 3 classes, so no floor was both safe and meaningful; on 2048 examples
  //   (about twice the time) 0.538-0.712 (seed 0: 0.594 and 0.686), 8-10 classes. Floor 0.35:
  //   0.19 below the lowest run (the largest change a seed's numerics made was 0.09), 0.22
  //   above a one-class model.
  // - At least 6 distinct predicted classes: every trained run above covered 8 or more, the
  //   collapsed one 3.
  // NHWC LeNet stores its first linear layer's columns in (H, W, C) order and its filters as
  // (K, R, S, C): the checkpoint must be PyTorch's model all the same.
  const Case cases[] = {
      {"lenet",
       "model = \"lenet\"\nepochs = 2\nbatch_size = 64\nlr = 0.1\ntrain_limit = 4096\n"
       "[model.lenet]\ninit_std = 0.1\n",
       {"--model", "lenet"},
       10000,
       0.50},
      {"lenet-nhwc",
       "model = \"lenet\"\nepochs = 2\nbatch_size = 64\nlr = 0.1\ntrain_limit = 4096\n"
       "layout = \"nhwc\"\n[model.lenet]\ninit_std = 0.1\n",
       {"--model", "lenet"},
       10000,
       0.50},
      {"resnet18",
       "model = \"resnet18\"\nepochs = 2\nbatch_size = 32\nlr = 0.05\ntrain_limit = 2048\n"
       "test_limit = 500\n[model.resnet18]\nwidth = 16\n",
       {"--model", "resnet18", "--width", "16"},
       500,
       0.35},
  };
  constexpr int min_classes = 6;
  for (const Case& c : cases) {
    INFO(c.name);
    Run trial(c.name, "[experiment]\nname = \"" + std::string(c.name) +
                          "\"\n[data]\ndataset = \"fashion-mnist\"\npath = \"" + data +
                          "\"\n[train]\nbackend = \"cpu\"\ngpus = 2\n" + c.train);
    DPRUN_REQUIRE_EXIT(trial({"--threads", "2"}), 0);
    char floor[32];
    std::snprintf(floor, sizeof floor, "%.4f", c.min_accuracy);
    std::vector<std::string> args{script, "--db", trial.db, "--trial", "1", "--data", data};
    args.insert(args.end(),
                {"--min-accuracy", floor, "--min-classes", std::to_string(min_classes)});
    args.insert(args.end(), c.args.begin(), c.args.end());
    const auto r = clitest::Dprun(args, trial.dir.path(), {}, "python", false, python).wait();
    INFO(clitest::describe(r));
    // The script checks agreement, floor and classes itself (its stderr says which failed); its
    // last line gives the numbers, checked here too so that each shows in a failure.
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("loaded strict") != std::string::npos);
    double accuracy = -1, recorded = -1;
    int classes = -1, examples = -1;
    const size_t at = r.out.rfind("result: ");
    REQUIRE(at != std::string::npos);
    REQUIRE(std::sscanf(r.out.c_str() + at,
                        "result: accuracy=%lf recorded=%lf classes=%d examples=%d", &accuracy,
                        &recorded, &classes, &examples) == 4);
    CHECK(std::fabs(accuracy - recorded) <= 0.002);
    CHECK(accuracy >= c.min_accuracy);
    CHECK(classes >= min_classes);
    CHECK(examples == c.test_examples);
    std::fputs(r.out.c_str(), stdout);  // the accuracies and predicted classes, for the log
  }
}
