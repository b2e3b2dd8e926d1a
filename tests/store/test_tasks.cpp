// Trials run elsewhere (schema 4): a trial's whole record copied between databases, submissions
// and their tasks, and merging a task's result: idempotent, ordered by submission.
#include <filesystem>

#include "store_test_util.hpp"

using dps::Store;
using dps::TrialStatus;
using dpstest::ScratchDir;

namespace {

dps::CheckpointRow checkpoint(int64_t trial, const std::string& role, int64_t epoch,
                              const std::string& path) {
  dps::CheckpointRow c;
  c.trial_id = trial;
  c.role = role;
  c.epoch = epoch;
  c.path = path;
  c.sha256 = "sha-" + path;
  c.bytes = 100 + epoch;
  if (role == "last") {
    c.optimizer_path = path + ".optimizer";
    c.optimizer_sha256 = "osha-" + path;
  }
  return c;
}

// A trial that failed after two epochs with a checkpoint of each kind.
int64_t failed_trial(Store& store, int64_t exp, const std::string& hash) {
  const auto row = store.ensure_trial(exp, hash, 4, dpstest::settings("lenet", 2));
  dps::TrialStart start;
  start.backend = "cpu";
  start.host = "nodeA";
  start.runner_pid = 4242;
  store.start_trial(row.id, start);
  store.record_epoch(dpstest::epoch_row(row.id, 1, 0.5, 2.0));
  store.record_epoch(dpstest::epoch_row(row.id, 2, 0.6, 2.0));
  store.record_checkpoint(checkpoint(row.id, "best", 2, "ck/best.safetensors"));
  store.record_checkpoint(checkpoint(row.id, "last", 2, "ck/last.safetensors"));
  store.finish_trial(row.id, TrialStatus::failed, "out of memory");
  return row.id;
}

// Every row of the tables a merge may touch, as text: equal dumps mean nothing changed.
std::string dump(const std::string& path) {
  std::string out;
  for (const char* sql :
       {"SELECT group_concat(quote(id) || quote(status) || quote(error) || quote(attempts) || "
        "quote(host) || quote(started_at) || quote(finished_at) || quote(resumed_from_epoch), '|') "
        "FROM trials",
        "SELECT group_concat(trial_id || ':' || epoch || ':' || quote(test_acc) || "
        "quote(recorded_at),"
        " '|') FROM epochs",
        "SELECT group_concat(trial_id || role || epoch || path || quote(recorded_at), '|') FROM "
        "checkpoints",
        "SELECT group_concat(submission_id || ':' || task_index || state || quote(status) || "
        "quote(error) || quote(closed_at), '|') FROM tasks"})
    out += dpstest::raw_scalar(path, sql) + "\n";
  return out;
}

}  // namespace

TEST_CASE("a trial's whole record moves to another database and back", "[store][tasks]") {
  ScratchDir dir;
  Store from = dpstest::open_store(dir.file("results.db"));
  const int64_t exp = from.upsert_experiment("e", "", "x = 1", 1);
  const int64_t id = failed_trial(from, exp, "h1");
  const dps::TrialState state = from.trial_state(id);
  REQUIRE(state.epochs.size() == 2);
  REQUIRE(state.checkpoints.size() == 2);
  CHECK_FALSE(state.epochs[0].recorded_at.empty());

  Store to(dir.file("task.db"), Store::Mode::read_write, dpstest::setting_columns(),
           Store::Journal::rollback);
  const int64_t to_exp = to.upsert_experiment("e", "", "x = 1", 1);
  const int64_t copied = to.put_trial_state(to_exp, state);
  const dps::TrialState back = to.trial_state(copied);
  CHECK(back.trial.config_hash == "h1");
  CHECK(back.trial.ordinal == 4);
  CHECK(back.trial.status == TrialStatus::failed);
  CHECK(back.trial.error == "out of memory");
  CHECK(back.trial.attempts == 1);
  CHECK(back.trial.host == "nodeA");
  CHECK(back.trial.runner_pid == 4242);
  CHECK(back.trial.started_at == state.trial.started_at);
  CHECK(back.trial.settings == state.trial.settings);
  CHECK(back.trial.last_checkpoint_epoch == 2);
  REQUIRE(back.epochs.size() == 2);
  CHECK(back.epochs[1].test_acc == 0.6);
  CHECK(back.epochs[1].recorded_at == state.epochs[1].recorded_at);
  REQUIRE(back.checkpoints.size() == 2);
  CHECK(back.checkpoints[1].optimizer_path == "ck/last.safetensors.optimizer");
  CHECK(back.checkpoints[1].recorded_at == state.checkpoints[1].recorded_at);
  // The task database is a rollback-journal file: nothing of WAL beside it.
  CHECK(dpstest::raw_scalar(dir.file("task.db"), "PRAGMA journal_mode") == "delete");

  SECTION("an existing trial takes the state, epochs and checkpoints replaced") {
    dps::TrialState later = back;
    later.trial.status = TrialStatus::done;
    later.trial.error = "";
    later.trial.attempts = 2;
    later.trial.resumed_from_epoch = 2;
    later.epochs.push_back(dpstest::epoch_row(copied, 3, 0.7, 2.0));
    later.checkpoints = {checkpoint(copied, "last", 3, "t/last.safetensors")};
    CHECK(from.put_trial_state(exp, later) == id);
    const dps::TrialState now = from.trial_state(id);
    CHECK(now.trial.status == TrialStatus::done);
    CHECK(now.trial.error.empty());
    CHECK(now.trial.attempts == 2);
    CHECK(now.trial.resumed_from_epoch == 2);
    CHECK(now.trial.ordinal == 4);
    REQUIRE(now.epochs.size() == 3);
    CHECK(now.epochs[0].recorded_at == state.epochs[0].recorded_at);
    CHECK_FALSE(now.epochs[2].recorded_at.empty());
    REQUIRE(now.checkpoints.size() == 1);
    CHECK(now.checkpoints[0].path == "t/last.safetensors");
  }
}

TEST_CASE("merging a task's result applies it once, in submission order", "[store][tasks]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  Store store = dpstest::open_store(path);
  const int64_t exp = store.upsert_experiment("e", "", "x = 1", 1);
  const int64_t id = failed_trial(store, exp, "h1");
  const auto other = store.ensure_trial(exp, "h2", 5, dpstest::settings("lenet", 1));

  auto submit = [&](const std::string& folder) {
    dps::SubmissionRow s;
    s.experiment_id = exp;
    s.scheduler = "slurm";
    s.folder = folder;
    s.command = "sbatch --array=0-1 job.sh";
    std::vector<dps::TaskRow> tasks(2);
    tasks[0].index = 0;
    tasks[0].trial_id = id;
    tasks[0].database = folder + "/t0000.db";
    tasks[0].base_attempts = 1;
    tasks[1].index = 1;
    tasks[1].trial_id = other.id;
    tasks[1].database = folder + "/t0001.db";
    return store.add_submission(s, tasks);
  };
  const int64_t first = submit("e.tasks/s0001");
  const int64_t second = submit("e.tasks/s0002");
  store.set_submission_job(first, "12");
  REQUIRE(store.submissions(exp).size() == 2);
  CHECK(store.submissions(exp)[0].job_id == "12");
  CHECK(store.submissions(exp)[1].job_id.empty());
  auto open = store.tasks(exp, true);
  REQUIRE(open.size() == 4);
  CHECK(open[0].config_hash == "h1");
  CHECK(open[0].job_id == "12");
  CHECK(open[0].folder == "e.tasks/s0001");
  CHECK(open[0].base_attempts == 1);

  dps::TrialState done = store.trial_state(id);
  done.trial.status = TrialStatus::done;
  done.trial.error = "";
  done.trial.attempts = 2;
  done.epochs.push_back(dpstest::epoch_row(id, 3, 0.7, 2.0));

  SECTION("twice: the second merge changes nothing") {
    CHECK(store.merge_task(first, 0, done) == dps::MergeOutcome::applied);
    CHECK(store.trial_state(id).epochs.size() == 3);
    const std::string before = dump(path);
    CHECK(store.merge_task(first, 0, done) == dps::MergeOutcome::closed);
    CHECK(dump(path) == before);
    const auto tasks = store.tasks(exp, false);
    CHECK(tasks[0].state == dps::TaskState::merged);
    CHECK(tasks[0].status == "done");
    CHECK(store.tasks(exp, true).size() == 3);
  }
  SECTION("an older submission's result arriving late does not undo a newer one") {
    CHECK(store.merge_task(second, 0, done) == dps::MergeOutcome::applied);
    dps::TrialState interrupted = store.trial_state(id);
    interrupted.trial.status = TrialStatus::interrupted;
    interrupted.trial.error = "cancelled by Slurm (scancel)";
    interrupted.epochs.resize(2);
    CHECK(store.merge_task(first, 0, interrupted) == dps::MergeOutcome::superseded);
    const auto now = store.trial_state(id);
    CHECK(now.trial.status == TrialStatus::done);
    CHECK(now.epochs.size() == 3);
    // The older task is closed with its own outcome, for the record.
    const auto tasks = store.tasks(exp, false);
    CHECK(tasks[0].state == dps::TaskState::merged);
    CHECK(tasks[0].error == "cancelled by Slurm (scancel)");
  }
  SECTION("a result short of done never replaces a trial another attempt finished") {
    // The newer submission's task fails after the older one (or a local run) finished the trial.
    CHECK(store.merge_task(first, 0, done) == dps::MergeOutcome::applied);
    dps::TrialState failed = store.trial_state(id);
    failed.trial.status = TrialStatus::failed;
    failed.trial.error = "out of memory";
    failed.epochs.resize(1);
    const std::string before = dump(path);
    CHECK(store.merge_task(second, 0, failed) == dps::MergeOutcome::superseded);
    const auto now = store.trial_state(id);
    CHECK(now.trial.status == TrialStatus::done);
    CHECK(now.epochs.size() == 3);
    CHECK(store.tasks(exp, false)[2].error == "out of memory");  // closed with its own outcome
    CHECK(dump(path) != before);                                 // (only the task row changed)
  }
  SECTION("a task that ended without a result is closed as lost, once") {
    CHECK(store.close_lost_task(first, 1, "cancelled before it started"));
    CHECK_FALSE(store.close_lost_task(first, 1, "again"));
    CHECK(store.merge_task(first, 1, store.trial_state(other.id)) == dps::MergeOutcome::closed);
    const auto tasks = store.tasks(exp, false);
    CHECK(tasks[1].state == dps::TaskState::lost);
    CHECK(tasks[1].error == "cancelled before it started");
    CHECK(store.get_trial(other.id)->status == TrialStatus::pending);
  }
  SECTION("a result for another trial is refused") {
    REQUIRE_THROWS_WITH(store.merge_task(first, 1, done),
                        Catch::Matchers::Contains("was submitted for"));
  }
  SECTION("a refused submission is forgotten with its tasks") {
    store.delete_submission(second);
    CHECK(store.submissions(exp).size() == 1);
    CHECK(store.tasks(exp, false).size() == 2);
  }
}
