#pragma once
// The SQLite store of dprun: experiments, trials and epochs. Knows nothing of training.
// One file per database: WAL, foreign keys on, busy timeout; schema versioned with
// PRAGMA user_version and migrated forward; a database from a newer dprun is refused.
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace dps {

/// Any store failure. Messages name the database file and what went wrong.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The schema version this build writes and reads.
int schema_version();

/// A value as SQLite holds it: NULL, INTEGER, REAL or TEXT.
using SqlValue = std::variant<std::monostate, int64_t, double, std::string>;

/// A trial's settings by column name. The store knows settings only as columns of `trials`
/// that its callers describe (SettingColumn); what they mean is not its business.
using SettingValues = std::map<std::string, SqlValue>;

/// A column of `trials` that records one trial setting. Opening a database read-write adds a
/// described column the database lacks, filled with the default for the trials already there
/// (a setting added in a later dprun needs no migration of its own), and regenerates the views,
/// which list every setting column.
struct SettingColumn {
  std::string name;        // [a-z][a-z0-9_]*, not one of the store's own trial columns
  SqlValue default_value;  // its type is the column's: INTEGER, REAL or TEXT; never NULL
  /// The scaling view's 1-GPU baseline may have another value (the setting varies with the GPU
  /// count, like lr, or between repeats, like seed); every other setting column must match.
  bool baseline_may_differ = false;
};

/// stopped: its stopping rule (stop.patience, stop.target) ended it before its last epoch, the
/// reason in its error. pruned: a [search] scheduler did not promote it past the epoch it
/// reached (yet: a later run may).
enum class TrialStatus {
  pending,
  running,
  done,
  failed,
  diverged,
  interrupted,
  skipped,
  stopped,
  pruned
};
const char* status_name(TrialStatus s);
TrialStatus parse_status(const std::string& s);  // throws StoreError on an unknown name

struct TrialRow {
  int64_t id = 0;
  int64_t experiment_id = 0;
  std::string config_hash;
  int64_t ordinal = 0;     // position in the expanded sweep
  SettingValues settings;  // every setting column of the database
  TrialStatus status = TrialStatus::pending;
  std::string error;
  int64_t attempts = 0;
  std::string backend;  // what ran: "cpu" / "cuda"
  std::string devices;
  bool oversubscribed = false;
  std::string host;
  std::string dprun_version;
  std::string plugin_path, plugin_sha256;
  std::string created_at, started_at, finished_at, heartbeat_at;  // ISO 8601 UTC
  int64_t runner_pid = 0;
  int64_t epochs_done = 0;         // rows in `epochs`
  std::string hosts;               // the host of each process, grouped: "nodeA x8, nodeB x8"
  std::string launch;              // the command that started the trial process
  std::string device_set;          // the GPUs or cores --jobs gave it ("gpus 2,3"); "": the machine
  int64_t resumed_from_epoch = 0;  // the checkpoint its last attempt continued from; 0: epoch 1
  int64_t last_checkpoint_epoch = 0;  // the epoch of its 'last' checkpoint; 0: none
  /// Under a [search] scheduler (schema 5): the rung it may run to; -1: none (NULL).
  int64_t rung = -1;
  /// The user's words about it (schema 6; dprun tag, dprun note): its tags, sorted, and its note
  /// ("": none). Empty on a database older than schema 6 opened read-only.
  std::vector<std::string> tags;
  std::string note;
  /// Where its last attempt kept the datasets (schema 7): "device" or "streamed" (beyond the
  /// data_budget_mib setting); "": not started, or run by an older dprun (on the device).
  std::string data_residence;
  /// The activation layout its last attempt ran with (schema 8): "nchw" or "nhwc"; "": not
  /// started, or run by an older dprun (which ran its layout setting as given).
  std::string layout_used;
  /// Whether its last attempt captured its steps (schema 9): 1 (CUDA graphs, or the CPU's
  /// recording) or 0; -1 (NULL): not started, or run by an older dprun (which ran its graphs
  /// setting as given).
  int64_t graphs_used = -1;
};

/// Why `tag` is not a tag name, naming it ("" when it is one): a tag is 1 to 64 of the
/// characters A-Z a-z 0-9 _ . - (no spaces or commas: the trial_summary view lists a trial's tags
/// separated by commas).
std::string tag_name_problem(const std::string& tag);

struct EpochRow {
  int64_t trial_id = 0;
  int64_t epoch = 0;  // 1-based
  double train_loss = 0, train_acc = 0, test_acc = 0;
  double seconds = 0, examples_per_second = 0;
  double lr = 0;
  double eval_seconds = 0;
  int64_t peak_memory_bytes = 0;
  double test_loss = 0;  // mean over the test set
  /// On the validation split (the validation setting); NaN (stored as NULL) without one.
  double val_loss = std::nan(""), val_acc = std::nan("");
  std::string recorded_at;  // ISO 8601 UTC; read from the store, kept by put_trial_state
};

/// One measured value of an epoch: a column of the epochs table and a member of EpochRow (and, of
/// the same name, of the runner's epoch record). The store's reads and writes and the runner's
/// record codec go through this list, so a new epoch metric is one member of EpochRow and one row
/// of epoch_metrics() (store/src/epoch_metrics.cpp), plus where it is measured. A database that
/// lacks a metric's column gets it when opened read-write (NULL for the epochs already there); one
/// opened read-only reads it as missing: NaN, or 0 for an integer.
struct EpochMetric {
  const char* name;
  double EpochRow::*real = nullptr;  // exactly one of the two
  int64_t EpochRow::*integer = nullptr;
};
/// Every measured column of the epochs table after trial_id and epoch, in table order.
const std::vector<EpochMetric>& epoch_metrics();

/// One finished attempt at a trial (schema 5).
struct AttemptRow {
  int64_t trial_id = 0;
  int64_t attempt = 0;  // 1-based
  TrialStatus status = TrialStatus::failed;
  std::string error;
  std::string started_at, finished_at;
  int64_t resumed_from_epoch = 0;  // 0: it started at epoch 1
  int64_t epochs_done = 0;         // the trial's epochs when it ended
};

/// A model file a trial keeps (see the checkpoints table in schema.cpp).
struct CheckpointRow {
  int64_t trial_id = 0;
  std::string role;  // "last" (with the optimizer's state, for resuming), "best" or "epoch"
  int64_t epoch = 0;
  std::string path;  // relative to the database's folder unless absolute
  std::string sha256;
  int64_t bytes = 0;
  std::string optimizer_path, optimizer_sha256;  // role last; "" otherwise
  std::string recorded_at;                       // ISO 8601 UTC (read only)
};

/// Everything the store records of one trial: its row, its epochs and its checkpoints (paths as
/// stored). A trial travels between databases in this form: into a task's own database before
/// the task runs it elsewhere, and back into the experiment's database when a merge collects it.
struct TrialState {
  TrialRow trial;
  std::vector<EpochRow> epochs;
  std::vector<CheckpointRow> checkpoints;
};

/// One job handed to a batch scheduler (a Slurm job array): its tasks run trials elsewhere, each
/// into its own database, which a merge folds back (see the submissions and tasks tables).
struct SubmissionRow {
  int64_t id = 0;
  int64_t experiment_id = 0;
  std::string scheduler;  // "slurm"
  std::string job_id;     // the scheduler's id of the job; "" until it answered
  std::string folder;     // where the task databases are: relative to the database's folder
  std::string command;    // how it was submitted (sbatch ...)
  std::string submitted_at;
};

/// One task of a submission: one attempt at one trial, written to its own database.
enum class TaskState {
  submitted,  // its result has not been collected yet
  merged,     // its database was folded into this one
  lost,       // it ended without a result (cancelled before it started, its database unreadable)
};
const char* task_state_name(TaskState s);

struct TaskRow {
  int64_t submission_id = 0;
  int64_t index = 0;  // the array index
  int64_t trial_id = 0;
  std::string config_hash;  // of the trial (read only)
  std::string database;     // the task's database: relative to this database's folder
  /// The trial's attempts when submitted: more in the task's database means the task started it.
  int64_t base_attempts = 0;
  TaskState state = TaskState::submitted;
  std::string status;  // merged: the trial status the task ended with
  std::string error;   // merged: its error; lost: why no result came
  std::string closed_at;
  // Of its submission (read only).
  std::string scheduler, job_id, folder;
};

/// What merge_task did with a task's result.
enum class MergeOutcome {
  applied,     // the trial now holds the task's state
  superseded,  // a task of a later submission of the same trial was merged first: kept as is
  closed,      // the task was already merged or lost: nothing changed
};

/// What the runner learns when it starts a trial.
struct TrialStart {
  std::string backend, devices, host, dprun_version, plugin_path, plugin_sha256;
  bool oversubscribed = false;
  int64_t runner_pid = 0;
  std::string hosts, launch, device_set;  // as in TrialRow ("" is stored as NULL)
  std::string data_residence;             // as in TrialRow
  std::string layout_used;                // as in TrialRow
  int64_t graphs_used = -1;               // as in TrialRow
};

/// The defaults generation experiment `name` was begun with in the database at `path`
/// (ExperimentRow::defaults), read without writing; nullopt when there is no such file, when a
/// dprun is creating it right now (no schema and no tables yet), or when it has no such
/// experiment. StoreError as Store's read-only open for a file that is no dprun database.
std::optional<int> experiment_defaults(const std::string& path, const std::string& name);

/// One experiment of the database.
struct ExperimentRow {
  int64_t id = 0;
  std::string name, description;
  std::string toml_sha256;             // of the experiment file last run
  /// The generation of the settings' defaults it was begun with (schema 8; 1: begun by an
  /// older dprun). Its file's omitted keys take that generation's defaults.
  int defaults = 1;
  std::string created_at, updated_at;  // ISO 8601 UTC
};

/// A trial with what its epochs achieved, as the trial_summary and scaling views compute it
/// (see the views for the definitions). Empty optionals: no epoch yet, or no 1-GPU baseline.
struct TrialSummary {
  TrialRow trial;
  std::optional<double> final_test_acc, best_test_acc, final_train_loss;
  std::optional<double> mean_seconds_per_epoch;  // epoch 1 (warm-up) excluded when there are more
  std::optional<double> total_seconds;
  std::optional<double> speedup, efficiency;  // over the matching 1-GPU trial
};

/// Result of a read-only query: column names and every value as text (NULL as nullopt).
struct QueryResult {
  std::vector<std::string> columns;
  std::vector<std::vector<std::optional<std::string>>> rows;
};

class Store {
 public:
  enum class Mode { read_write, read_only };
  /// How writes reach the file. wal: readers (dprun query) run while a runner writes; every
  /// process must be on one host. rollback: SQLite's rollback journal, for a database that one
  /// process on some host writes and others read only after it finished, as a Slurm task's
  /// database on a network file system (where WAL's shared memory does not work).
  enum class Journal { wal, rollback };
  /// Opens (read_write: creating the file and parent folders, migrating, and adding the
  /// described setting columns it lacks) the database. read_only: the file must exist and is
  /// read as it is, never migrated (the store's columns of a later schema read as empty);
  /// every statement that would write fails.
  Store(const std::string& path, Mode mode = Mode::read_write,
        const std::vector<SettingColumn>& settings = {}, Journal journal = Journal::wal);
  ~Store();
  Store(Store&&) noexcept;
  Store& operator=(Store&&) noexcept;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& path() const;
  int user_version() const;
  /// The setting columns of this database's `trials`, in table order.
  const std::vector<std::string>& setting_columns() const;

  /// Finds the experiment by name, or creates it with the defaults generation `defaults`; stores
  /// the TOML source and its sha256 (updated when the file changed). An experiment that exists
  /// keeps its generation, and one of another generation than `defaults` is a StoreError that
  /// changes nothing (its file was read with other defaults). Returns its id.
  int64_t upsert_experiment(const std::string& name, const std::string& description,
                            const std::string& toml_source, int defaults);

  /// The experiment of that name, if the database has it.
  std::optional<ExperimentRow> find_experiment(const std::string& name);
  /// Every experiment, oldest first.
  std::vector<ExperimentRow> experiments();

  /// Finds a trial of the experiment by config hash.
  std::optional<TrialRow> find_trial(int64_t experiment_id, const std::string& config_hash);
  /// Inserts a pending trial (or returns the existing one with that hash, its ordinal updated).
  /// A setting column not given takes its default; one the database lacks is an error.
  TrialRow ensure_trial(int64_t experiment_id, const std::string& config_hash, int64_t ordinal,
                        const SettingValues& settings);
  std::optional<TrialRow> get_trial(int64_t trial_id);
  std::vector<TrialRow> trials(int64_t experiment_id);

  /// Claims a trial for this runner before its process starts: `expected` -> running, only if
  /// the trial's status is still `expected` (another dprun on the same database may have claimed
  /// or finished it since this runner read it). Records runner_pid, host and a heartbeat; keeps
  /// everything else (start_trial follows). Returns false, changing nothing, when the status
  /// is no longer `expected`. (Added in review: the check and the write are one transaction.)
  bool claim_trial(int64_t trial_id, TrialStatus expected, int64_t runner_pid,
                   const std::string& host);
  /// pending/failed/interrupted/... -> running: increments attempts, records start info and
  /// heartbeat, clears the error. resume_epoch 0: a start from scratch, which deletes the epochs
  /// and checkpoints of earlier attempts; e > 0: the attempt continues from the checkpoint of
  /// epoch e, keeping epochs 1..e and deleting later ones (and checkpoints after e), recorded
  /// as resumed_from_epoch.
  void start_trial(int64_t trial_id, const TrialStart& start, int64_t resume_epoch = 0);
  /// Records a checkpoint file in one transaction: a 'last' or 'best' row replaces the trial's
  /// earlier one of that role, an 'epoch' row is kept beside the others.
  void record_checkpoint(const CheckpointRow& row);
  /// The trial's checkpoints, by role then epoch (empty on a database older than schema 3).
  std::vector<CheckpointRow> checkpoints(int64_t trial_id);
  /// Writes one epoch row idempotently (INSERT OR REPLACE on (trial_id, epoch)) and refreshes
  /// the heartbeat, in one transaction.
  void record_epoch(const EpochRow& row);
  void heartbeat(int64_t trial_id);
  /// running -> done / failed / diverged / interrupted / skipped / stopped / pruned, with an
  /// error or reason; the attempt is recorded in `attempts` (see attempts()).
  void finish_trial(int64_t trial_id, TrialStatus status, const std::string& error = "");
  /// The finished attempts at a trial, oldest first (empty on a database older than schema 5).
  std::vector<AttemptRow> attempts(int64_t trial_id);
  /// Sets the rung a trial may run to under a [search] scheduler (-1: none).
  void set_rung(int64_t trial_id, int64_t rung);
  /// Trials left `running` whose runner process is gone (pid not alive on this host) or whose
  /// heartbeat is older than `stale_seconds` become `interrupted`. Returns how many.
  int recover_stale(int64_t experiment_id, double stale_seconds);

  std::vector<EpochRow> epochs(int64_t trial_id);
  /// Every trial of the experiment in sweep order, with its results (for summaries and reports).
  std::vector<TrialSummary> trial_summaries(int64_t experiment_id);

  /// The trial's row, epochs and checkpoints. Throws StoreError when there is no such trial.
  TrialState trial_state(int64_t trial_id);
  /// Makes the experiment's trial of state.trial.config_hash hold exactly `state`, in one
  /// transaction: inserted with its settings when missing (ordinal and settings of an existing
  /// one are kept); status, error, attempts and how it ran replaced; its epochs and checkpoints
  /// replaced by the state's (recorded_at kept when given). Returns the trial's id here.
  int64_t put_trial_state(int64_t experiment_id, const TrialState& state);

  // Trials run elsewhere (schema 4): submissions of tasks to a batch scheduler.

  /// Records a submission and its tasks (state submitted) in one transaction, before the
  /// scheduler is asked: a task whose job was accepted is never unknown here. Returns its id.
  int64_t add_submission(const SubmissionRow& submission, const std::vector<TaskRow>& tasks);
  /// The scheduler's job id, once it answered.
  void set_submission_job(int64_t submission_id, const std::string& job_id);
  /// Forgets a submission the scheduler refused, with its tasks.
  void delete_submission(int64_t submission_id);
  std::vector<SubmissionRow> submissions(int64_t experiment_id);
  /// The tasks of the experiment's submissions, oldest first; open_only: those still submitted.
  /// Empty on a database older than schema 4.
  std::vector<TaskRow> tasks(int64_t experiment_id, bool open_only);
  /// Collects a task's result in one transaction: the trial takes `state` (put_trial_state)
  /// unless a task of a later submission of the same trial was merged already, and the task is
  /// closed as merged with the state's status and error. A task already closed changes nothing,
  /// so merging the same task twice is harmless.
  MergeOutcome merge_task(int64_t submission_id, int64_t index, const TrialState& state);
  /// Closes a task that ended without a result (why: the cause). False when it was closed.
  bool close_lost_task(int64_t submission_id, int64_t index, const std::string& why);

  // The user's words about trials (schema 6): tags and notes; and forgetting trials. Each call
  // is one transaction that checks every trial id first: an unknown one changes nothing.

  /// Gives each trial the tag (a trial that has it keeps it). Returns how many trials gained it.
  /// StoreError, changing nothing, for a bad tag name or trial ids the database does not have
  /// (naming them all).
  int64_t tag_trials(const std::vector<int64_t>& trial_ids, const std::string& tag);
  /// Takes the tag from each trial that has it. Returns how many had it. Errors as tag_trials.
  int64_t untag_trials(const std::vector<int64_t>& trial_ids, const std::string& tag);
  /// Sets the trial's note; "" clears it. StoreError when there is no such trial.
  void set_note(int64_t trial_id, const std::string& note);
  /// Why the trial must not be forgotten now, "" when it may: it is running under a live runner
  /// (its process exists on this host, or, on another host, its heartbeat is younger than
  /// stale_seconds, as recover_stale judges), or a Slurm task holds it and was not collected yet.
  /// StoreError when there is no such trial.
  std::string forget_refusal(int64_t trial_id, double stale_seconds);
  /// Deletes the trials with their epochs, attempts, checkpoint rows, tags and Slurm tasks (the
  /// foreign keys cascade), in one transaction. Returns the checkpoint rows deleted: removing the
  /// files is the caller's, after this returned, so no row ever names a missing file. StoreError,
  /// changing nothing, for an unknown trial id or one forget_refusal refuses.
  std::vector<CheckpointRow> forget_trials(const std::vector<int64_t>& trial_ids,
                                           double stale_seconds);

  /// Runs one SQL statement with no side effects (the connection is opened read-only for
  /// read_only stores; for read_write stores sqlite3_stmt_readonly is checked). A statement
  /// that writes gives StoreError "query: only read-only statements are allowed".
  QueryResult query(const std::string& sql);

 private:
  struct Impl;
  Impl* impl_;
};

/// Hex sha256 of a byte string (used for config hashes, TOML sources and plugin files).
std::string sha256_hex(const std::string& bytes);

}  // namespace dps
