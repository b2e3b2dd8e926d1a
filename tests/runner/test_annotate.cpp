// dprun tag, note and forget end to end, and --filter tag=NAME. The database is made in this
// process (the experiment's trials stored as a run stores them, a checkpoint's files written by
// hand), so nothing trains but the last case, which checks that a forgotten trial runs again.
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "cli_helpers.hpp"
#include "experiment/experiment.hpp"
#include "models/plugin_loader.hpp"
#include "settings/settings.hpp"
#include "sweep/sweep_runner.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using clitest::run;
using clitest::sql;
using clitest::sql1;

namespace {

// Two trials (gpus 1 and 2) of a LeNet experiment; planning it reads no data.
std::string annotate_toml(const std::string& data_dir, const std::string& gpus = "[1, 2]") {
  return "[experiment]\nname = \"notes\"\n\n[data]\ndataset = \"fashion-mnist\"\npath = \"" +
         data_dir +
         "\"\n\n[train]\nmodel = \"lenet\"\nepochs = 1\nbatch_size = 32\nlr = 0.1\n"
         "train_limit = 64\ntest_limit = 64\nbackend = \"cpu\"\n\n[sweep]\ngpus = " +
         gpus + "\n";
}

// The experiment file and its database, with the file's trials stored (pending) as a run would
// store them, trial 1 done with a 'last' checkpoint whose two files exist.
struct Annotated {
  dptest::TempDir dir;
  std::string file = dir.path() + "/notes.toml";
  std::string db = dir.path() + "/results/notes.db";
  std::vector<int64_t> ids;
  std::vector<std::string> files;  // trial 1's checkpoint files
  Annotated() {
    clitest::write_file(file, annotate_toml("/nonexistent"));
    dprun::ModelCatalog catalog;
    for (const auto& [name, m] : dprun::scan_plugins({}).models) catalog.models[name] = m.factory;
    const auto ex = dprun::load_experiment(file, catalog);
    dps::Store store(db, dps::Store::Mode::read_write, ex.settings->store_columns());
    const int64_t exp =
        store.upsert_experiment(ex.name, ex.description, ex.source, ex.settings->generation());
    for (const auto& spec : ex.trials)
      ids.push_back(
          store.ensure_trial(exp, spec.config_hash, spec.ordinal, dprun::to_store(spec.settings))
              .id);
    const int64_t first = ids.at(0);
    REQUIRE(store.claim_trial(first, dps::TrialStatus::pending, getpid(), "h"));
    store.start_trial(first, {});
    store.record_epoch(dpstest_epoch(first));
    const std::string folder = "notes.checkpoints/trial-" + std::to_string(first);
    fs::create_directories(dir.path() + "/results/" + folder);
    dps::CheckpointRow c;
    c.trial_id = first;
    c.role = "last";
    c.epoch = 1;
    c.path = folder + "/last.safetensors";
    c.optimizer_path = folder + "/last.optimizer.safetensors";
    c.sha256 = c.optimizer_sha256 = "00";
    for (const std::string& f : {c.path, c.optimizer_path}) {
      files.push_back(dir.path() + "/results/" + f);
      clitest::write_file(files.back(), "bytes");
    }
    store.record_checkpoint(c);
    store.finish_trial(first, dps::TrialStatus::done);
  }
  static dps::EpochRow dpstest_epoch(int64_t id) {
    dps::EpochRow e;
    e.trial_id = id;
    e.epoch = 1;
    e.test_acc = 0.5;
    e.seconds = 1;
    return e;
  }
  std::vector<std::string> with_db(std::vector<std::string> args) const {
    args.insert(args.begin() + 1, {"--db", db});
    return args;
  }
  std::string id(size_t i) const { return std::to_string(ids.at(i)); }
};

void check_sound(const std::string& db) {
  CHECK(sql1(db, "PRAGMA integrity_check") == "ok");
  CHECK(sql(db, "PRAGMA foreign_key_check").empty());
}

// dprun with a terminal as its standard input and output (a pseudo-terminal): reads until the
// output has `prompt`, then types `answer` and a newline, and reads to the end.
clitest::Result run_on_terminal(const std::vector<std::string>& args, const std::string& dir,
                                const std::string& prompt, const std::string& answer) {
  clitest::Result r;
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(126);
    std::vector<std::string> argv_s{DPRUN_TEST_EXE};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  REQUIRE(pid > 0);
  bool answered = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    pollfd p{master, POLLIN, 0};
    if (poll(&p, 1, 200) > 0) {
      char buf[4096];
      const ssize_t n = read(master, buf, sizeof buf);
      if (n <= 0) break;  // EIO: the terminal's other side closed
      r.out.append(buf, static_cast<size_t>(n));
    }
    if (!answered && r.out.find(prompt) != std::string::npos) {
      const std::string line = answer + "\n";
      REQUIRE(write(master, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
      answered = true;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      break;
    }
  }
  close(master);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

}  // namespace

TEST_CASE("tag: trials gain and lose tags, bad names and unknown ids change nothing",
          "[cli][annotate]") {
  Annotated a;
  auto r = run(a.with_db({"tag", a.id(0), a.id(1), "baseline"}), a.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out == "tagged 2 trials baseline\n");
  r = run(a.with_db({"tag", a.id(0), "baseline"}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out == "tagged 1 trial baseline; 1 had it already\n");
  DPRUN_CHECK_EXIT(run(a.with_db({"tag", a.id(0), "lr-0.1_a"}), a.dir.path()), 0);
  CHECK(sql1(a.db, "SELECT tags FROM trial_summary WHERE trial_id = " + a.id(0)) ==
        "baseline,lr-0.1_a");

  // All or nothing: one unknown id, and the others are not tagged either.
  r = run(a.with_db({"tag", a.id(1), "99", "new"}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("no trial with id 99; nothing was changed") &&
                        Contains("dprun query \"SELECT trial_id"));
  r = run(a.with_db({"tag", a.id(1), "bad tag"}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err,
             Contains("tag \"bad tag\": a tag is 1 to 64 of the characters A-Z a-z 0-9 _ . -"));
  r = run(a.with_db({"tag", "one", "x"}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("trial id \"one\": expected a positive integer"));
  r = run(a.with_db({"tag", "x"}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("dprun tag needs trial ids and a tag name"));
  CHECK(sql1(a.db, "SELECT COUNT(*) FROM trial_tags WHERE tag IN ('new', 'x', 'bad tag')") == "0");

  r = run(a.with_db({"tag", "--remove", a.id(0), a.id(1), "lr-0.1_a"}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out == "removed tag lr-0.1_a from 1 trial; 1 did not have it\n");
  CHECK(sql1(a.db, "SELECT group_concat(tags, '|') FROM trial_summary") == "baseline|baseline");

  // The text report: a tags column once a trial has tags.
  r = run(a.with_db({"report"}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK_THAT(r.out, Contains("backend  tags") && Contains("baseline"));
  DPRUN_CHECK_EXIT(run(a.with_db({"tag", "--remove", a.id(0), a.id(1), "baseline"}), a.dir.path()),
                   0);
  r = run(a.with_db({"report"}), a.dir.path());
  CHECK_FALSE(r.out.find("tags") != std::string::npos);
}

TEST_CASE("note: odd text is kept as given, shown escaped, and \"\" clears it", "[cli][annotate]") {
  Annotated a;
  const std::string odd = "it's \"odd\"; DROP TABLE trials; --\nsecond line \x1b[31mred ü";
  auto r = run(a.with_db({"note", a.id(1), odd}), a.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out == "noted trial " + a.id(1) + "\n");
  CHECK(sql1(a.db, "SELECT note FROM trials WHERE id = " + a.id(1)) == odd);
  CHECK(sql1(a.db, "SELECT note FROM trial_summary WHERE trial_id = " + a.id(1)) == odd);
  CHECK(sql1(a.db, "SELECT COUNT(*) FROM trials") == "2");
  // A text that starts with '-' follows --.
  DPRUN_CHECK_EXIT(run(a.with_db({"note", a.id(0), "--", "-0.5 after warm-up"}), a.dir.path()), 0);
  CHECK(sql1(a.db, "SELECT note FROM trials WHERE id = " + a.id(0)) == "-0.5 after warm-up");

  // The report lists notes under the table: line breaks indented, control characters escaped.
  r = run(a.with_db({"report"}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  // (the label is the report's: the settings that vary, per_gpu_batch too)
  CHECK_THAT(r.out, Contains("  notes:\n    trial " + a.id(0) + " (lenet gpus=1 ") &&
                        Contains("    trial " + a.id(1) + " (lenet gpus=2 ") &&
                        Contains("): it's \"odd\"; DROP TABLE trials; --\n      second line "
                                 "\\x1b[31mred ü\n"));
  CHECK(r.out.find('\x1b') == std::string::npos);

  r = run(a.with_db({"note", a.id(1), ""}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out == "cleared the note of trial " + a.id(1) + "\n");
  CHECK(sql1(a.db, "SELECT note IS NULL FROM trials WHERE id = " + a.id(1)) == "1");

  r = run(a.with_db({"note", "99", "x"}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("no trial with id 99"));
  r = run(a.with_db({"note", a.id(0)}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("dprun note needs a trial id and the text"));
}

TEST_CASE("filter: tag=NAME selects the trials with the tag", "[cli][annotate]") {
  Annotated a;
  DPRUN_REQUIRE_EXIT(run(a.with_db({"tag", a.id(1), "pick"}), a.dir.path()), 0);
  auto r = run({"plan", a.file, "--db", a.db, "--filter", "tag=pick"}, a.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.out, Contains("1 to run, 1 to skip") && Contains("skip: filtered out"));
  // A tag no trial has is a mistake, not an empty selection: exit 2, listing the tags there are.
  r = run({"run", a.file, "--db", a.db, "--dry-run", "--filter", "tag=nobody"}, a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("--filter tag=nobody: no trial of experiment") &&
                        Contains("has that tag (its tags: pick; dprun tag adds one)"));
  // With a setting, both must hold; one key twice: either.
  r = run({"plan", a.file, "--db", a.db, "--filter", "tag=pick", "--filter", "gpus=1"},
          a.dir.path());
  CHECK_THAT(r.out, Contains("0 to run, 2 to skip"));
  DPRUN_REQUIRE_EXIT(run(a.with_db({"tag", a.id(0), "other"}), a.dir.path()), 0);
  r = run(
      {"plan", a.file, "--db", a.db, "--filter", "tag=pick", "--filter", "tag=other", "--rerun"},
      a.dir.path());
  CHECK_THAT(r.out, Contains("2 to run, 0 to skip"));

  r = run({"plan", a.file, "--db", a.db, "--filter", "tag=a,b"}, a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("--filter tag=a,b: tag \"a,b\": a tag is"));
  r = run({"plan", a.file, "--db", a.db, "--filter", "tags=pick"}, a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("unknown setting \"tags\"; did you mean tag?"));

  // In process: a trial the database does not hold has no tags.
  dprun::ModelCatalog catalog;
  for (const auto& [name, m] : dprun::scan_plugins({}).models) catalog.models[name] = m.factory;
  const auto ex = dprun::load_experiment(a.file, catalog);
  using F = std::vector<std::pair<std::string, std::string>>;
  dps::TrialRow stored;
  stored.tags = {"pick"};
  CHECK(dprun::trial_matches(ex.trials[0], F{{"tag", "pick"}}, &stored));
  CHECK_FALSE(dprun::trial_matches(ex.trials[0], F{{"tag", "pick"}}));
  CHECK_FALSE(dprun::trial_matches(ex.trials[0], F{{"tag", "other"}}, &stored));
}

TEST_CASE("forget: lists what goes, needs --yes without a terminal, and deletes rows and files",
          "[cli][annotate]") {
  Annotated a;
  DPRUN_REQUIRE_EXIT(run(a.with_db({"tag", a.id(0), a.id(1), "t"}), a.dir.path()), 0);
  const std::string folder = fs::path(a.files[0]).parent_path().string();
  clitest::write_file(folder + "/last.safetensors.tmp", "left by a stopped run");

  // Standard input is not a terminal (the helper gives /dev/null): refused, nothing changed.
  auto r = run(a.with_db({"forget", a.id(0)}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.out, Contains("forget 1 trial of " + a.db) &&
                        Contains("trial " + a.id(0) + "  experiment notes: lenet gpus=1 ") &&
                        Contains(" (done, 1/1 epochs, tags t)\n") &&
                        Contains("delete " + a.files[0]) && Contains("delete " + a.files[1]) &&
                        Contains("delete " + folder + "/last.safetensors.tmp"));
  CHECK_THAT(r.err, Contains("standard input is not a terminal") && Contains("pass --yes"));
  CHECK(fs::exists(a.files[0]));
  CHECK(sql1(a.db, "SELECT COUNT(*) FROM trials") == "2");

  r = run(a.with_db({"forget", a.id(0), "99", "--yes"}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("no trial with id 99; nothing was changed"));
  CHECK(sql1(a.db, "SELECT COUNT(*) FROM trials") == "2");

  // A trial a live dprun runs (this test process stands in for it) is refused.
  {
    dps::Store store(a.db);
    REQUIRE(store.claim_trial(a.ids[1], dps::TrialStatus::pending, getpid(), dprun::host_name()));
  }
  r = run(a.with_db({"forget", a.id(0), a.id(1), "--yes"}), a.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("cannot forget trial " + a.id(1) + ": it is running in dprun pid " +
                             std::to_string(getpid()) + " on this host") &&
                        Contains("nothing was forgotten"));
  CHECK(sql1(a.db, "SELECT COUNT(*) FROM trials") == "2");

  r = run(a.with_db({"forget", a.id(0), "--yes"}), a.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.out, Contains("forgot 1 trial; removed 3 files"));
  CHECK_FALSE(fs::exists(folder));
  CHECK(sql1(a.db, "SELECT COUNT(*) FROM trials") == "1");
  for (const char* table : {"epochs", "attempts", "checkpoints", "trial_tags"})
    CHECK(sql1(a.db, std::string("SELECT COUNT(*) FROM ") + table +
                         " WHERE trial_id = " + a.id(0)) == "0");
  CHECK(sql1(a.db, "SELECT tags FROM trial_summary") == "t");  // the other trial keeps its own
  check_sound(a.db);
}

TEST_CASE("forget: on a terminal it asks, and only yes forgets", "[cli][annotate]") {
  Annotated a;
  auto r = run_on_terminal(a.with_db({"forget", a.id(0), a.id(1)}), a.dir.path(),
                           "forget 2 trials? [y/N]", "n");
  INFO(r.out);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Contains("nothing was forgotten"));
  CHECK(sql1(a.db, "SELECT COUNT(*) FROM trials") == "2");
  CHECK(fs::exists(a.files[0]));

  r = run_on_terminal(a.with_db({"forget", a.id(0), a.id(1)}), a.dir.path(),
                      "forget 2 trials? [y/N]", "y");
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("forgot 2 trials; removed 2 files"));
  CHECK(sql1(a.db, "SELECT COUNT(*) FROM trials") == "0");
  CHECK_FALSE(fs::exists(a.files[0]));
  check_sound(a.db);
}

TEST_CASE("forget: the next run runs a forgotten trial again", "[cli][annotate]") {
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  const std::string file = dir.path() + "/again.toml";
  const std::string db = dir.path() + "/again.db";
  clitest::write_file(file, annotate_toml(data, "[1]"));
  const std::vector<std::string> run_args{"run", file, "--db", db, "--threads", "1"};
  DPRUN_REQUIRE_EXIT(run(run_args, dir.path()), 0);
  const std::string id = sql1(db, "SELECT id FROM trials");
  const std::string folder = dir.path() + "/again.checkpoints/trial-" + id;
  REQUIRE(fs::exists(folder + "/last.safetensors"));
  DPRUN_REQUIRE_EXIT(run({"forget", "--db", db, "--yes", id}, dir.path()), 0);
  CHECK_FALSE(fs::exists(folder));
  CHECK(sql1(db, "SELECT COUNT(*) FROM trials") == "0");

  auto r = run(run_args, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.err, Contains("1 to run"));
  CHECK(sql1(db, "SELECT status || ' ' || attempts FROM trials") == "done 1");
  CHECK(sql1(db, "SELECT COUNT(*) FROM epochs") == "1");
  check_sound(db);
}

TEST_CASE("forget: refuses while a dprun runs the trial's experiment, and keeps files outside the "
          "trial's folder",
          "[cli][annotate]") {
  Annotated a;
  SECTION("a live runner of the experiment, though the trial is done") {
    // A process standing in for the sweep's dprun (liveness judges a runner by its pid and its
    // program's name), recorded as the runner of trial 2.
    const pid_t runner = fork();
    if (runner == 0) {
      execlp("sleep", "dprun-runner-stand-in", "600", static_cast<char*>(nullptr));
      _exit(127);
    }
    REQUIRE(runner > 0);
    {
      dps::Store store(a.db);
      REQUIRE(store.claim_trial(a.ids.at(1), dps::TrialStatus::pending, runner, dprun::host_name()));
    }
    const auto r = run(a.with_db({"forget", "--yes", a.id(0)}), a.dir.path());
    ::kill(runner, SIGKILL);
    waitpid(runner, nullptr, 0);
    DPRUN_CHECK_EXIT(r, 2);
    CHECK_THAT(r.err, Contains("still being run (dprun pid " + std::to_string(runner) +
                               " on this host)") &&
                          Contains("nothing was forgotten"));
    for (const auto& f : a.files) CHECK(fs::exists(f));
  }
  SECTION("a checkpoint row naming a file elsewhere leaves that file alone") {
    const std::string elsewhere = a.dir.path() + "/elsewhere.safetensors";
    clitest::write_file(elsewhere, "another database's model");
    {
      dps::Store store(a.db);
      dps::CheckpointRow c;
      c.trial_id = a.ids.at(0);
      c.role = "best";
      c.epoch = 1;
      c.path = elsewhere;
      c.sha256 = "00";
      store.record_checkpoint(c);
    }
    const auto r = run(a.with_db({"forget", "--yes", a.id(0)}), a.dir.path());
    DPRUN_CHECK_EXIT(r, 0);
    CHECK_THAT(r.out, Contains("keep " + elsewhere + " (outside the trial's folder"));
    CHECK(fs::exists(elsewhere));
    for (const auto& f : a.files) CHECK_FALSE(fs::exists(f));
  }
}
