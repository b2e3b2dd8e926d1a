// Typed reads: experiments, trials, epochs and the per-trial summaries of the views. Columns
// are read by name, so a reader never depends on the order of a column list.
#include <algorithm>

#include "sqlite_util.hpp"
#include "store_impl.hpp"

namespace dps {

using detail::Stmt;

namespace detail {

std::string select_trials(const std::vector<std::string>& setting_columns,
                          const std::vector<std::string>& absent, bool has_checkpoints,
                          bool has_tags, const std::string& where,
                          const std::string& more_columns) {
  // Qualified and named with AS: the statement may join other tables, and SQLite promises a
  // result column's name only when AS gives it. Setting columns are quoted identifiers.
  std::string sql = "SELECT ";
  for (const auto& c : own_trial_columns()) {
    const bool missing = std::find(absent.begin(), absent.end(), c) != absent.end();
    sql += (missing ? "NULL" : "trials." + c) + " AS " + c + ", ";
  }
  for (const auto& c : setting_columns) sql += "trials.\"" + c + "\" AS \"setting:" + c + "\", ";
  sql += has_checkpoints ? "(SELECT MAX(c.epoch) FROM checkpoints c WHERE c.trial_id = trials.id "
                           "AND c.role = 'last')"
                         : "NULL";
  // Tags never hold a comma (their CHECK), so the list splits back as it was.
  sql += has_tags ? " AS last_checkpoint_epoch, (SELECT group_concat(g.tag, ',') FROM trial_tags g "
                    "WHERE g.trial_id = trials.id)"
                  : " AS last_checkpoint_epoch, NULL";
  return sql + " AS tags, " +
         "(SELECT COUNT(*) FROM epochs WHERE epochs.trial_id = trials.id) AS epochs_done" +
         more_columns + " FROM trials " + where;
}


TrialRow read_trial(const std::vector<std::string>& setting_columns, const Stmt& s) {
  TrialRow r;
  r.id = s.int64("id");
  r.experiment_id = s.int64("experiment_id");
  r.config_hash = s.text("config_hash");
  r.ordinal = s.int64("ordinal");
  for (const auto& c : setting_columns) r.settings[c] = s.value(s.column("setting:" + c));
  r.status = parse_status(s.text("status"));
  r.error = s.text("error");
  r.attempts = s.int64("attempts");
  r.backend = s.text("backend");
  r.devices = s.text("devices");
  r.oversubscribed = s.int64("oversubscribed") != 0;
  r.host = s.text("host");
  r.dprun_version = s.text("dprun_version");
  r.plugin_path = s.text("plugin_path");
  r.plugin_sha256 = s.text("plugin_sha256");
  r.runner_pid = s.int64("runner_pid");
  r.created_at = s.text("created_at");
  r.started_at = s.text("started_at");
  r.finished_at = s.text("finished_at");
  r.heartbeat_at = s.text("heartbeat_at");
  r.hosts = s.text("hosts");
  r.launch = s.text("launch");
  r.device_set = s.text("device_set");
  r.resumed_from_epoch = s.int64("resumed_from_epoch");
  r.rung = s.is_null("rung") ? -1 : s.int64("rung");
  r.last_checkpoint_epoch = s.int64("last_checkpoint_epoch");
  r.epochs_done = s.int64("epochs_done");
  r.note = s.text("note");
  r.data_residence = s.text("data_residence");
  r.layout_used = s.text("layout_used");
  r.graphs_used = s.is_null("graphs_used") ? -1 : s.int64("graphs_used");
  const std::string tags = s.text("tags");
  for (size_t begin = 0; begin < tags.size();) {
    const size_t end = std::min(tags.find(',', begin), tags.size());
    r.tags.push_back(tags.substr(begin, end - begin));
    begin = end + 1;
  }
  std::sort(r.tags.begin(), r.tags.end());
  return r;
}

}  // namespace detail

namespace {

// An older database opened read-only has no experiments.defaults (schema 8): generation 1.
std::string select_experiments(int user_version) {
  return std::string("SELECT id, name, description, toml_sha256, created_at, updated_at, ") +
         (user_version >= 8 ? "defaults" : "1 AS defaults") + " FROM experiments ";
}

ExperimentRow read_experiment(const Stmt& s) {
  ExperimentRow e;
  e.id = s.int64("id");
  e.name = s.text("name");
  e.description = s.text("description");
  e.toml_sha256 = s.text("toml_sha256");
  e.created_at = s.text("created_at");
  e.updated_at = s.text("updated_at");
  e.defaults = static_cast<int>(s.int64("defaults"));
  return e;
}

}  // namespace

std::optional<ExperimentRow> Store::find_experiment(const std::string& name) {
  Stmt s(impl_->db, (select_experiments(impl_->user_version) + "WHERE name = ?1").c_str());
  s.bind(1, name);
  if (!s.step()) return std::nullopt;
  return read_experiment(s);
}

std::vector<ExperimentRow> Store::experiments() {
  Stmt s(impl_->db, (select_experiments(impl_->user_version) + "ORDER BY id").c_str());
  std::vector<ExperimentRow> rows;
  while (s.step()) rows.push_back(read_experiment(s));
  return rows;
}

std::optional<TrialRow> Store::find_trial(int64_t experiment_id, const std::string& config_hash) {
  Stmt s(impl_->db, detail::select_trials(
                        impl_->setting_columns, impl_->absent_columns, impl_->has_checkpoints(),
                        impl_->has_tags(),
                        "WHERE trials.experiment_id = ?1 AND trials.config_hash = ?2")
                        .c_str());
  s.bind(1, experiment_id).bind(2, config_hash);
  if (!s.step()) return std::nullopt;
  return detail::read_trial(impl_->setting_columns, s);
}

std::optional<TrialRow> Store::get_trial(int64_t trial_id) {
  Stmt s(impl_->db,
         detail::select_trials(impl_->setting_columns, impl_->absent_columns,
                               impl_->has_checkpoints(), impl_->has_tags(), "WHERE trials.id = ?1")
             .c_str());
  s.bind(1, trial_id);
  if (!s.step()) return std::nullopt;
  return detail::read_trial(impl_->setting_columns, s);
}

std::vector<TrialRow> Store::trials(int64_t experiment_id) {
  Stmt s(impl_->db,
         detail::select_trials(impl_->setting_columns, impl_->absent_columns,
                               impl_->has_checkpoints(), impl_->has_tags(),
                               "WHERE trials.experiment_id = ?1 ORDER BY trials.ordinal, trials.id")
             .c_str());
  s.bind(1, experiment_id);
  std::vector<TrialRow> rows;
  while (s.step()) rows.push_back(detail::read_trial(impl_->setting_columns, s));
  return rows;
}

std::vector<EpochRow> Store::epochs(int64_t trial_id) {
  const std::string sql = detail::epoch_select_sql(impl_->db);
  Stmt s(impl_->db, sql.c_str());
  s.bind(1, trial_id);
  std::vector<EpochRow> rows;
  while (s.step()) rows.push_back(detail::read_epoch(s));
  return rows;
}

std::vector<CheckpointRow> Store::checkpoints(int64_t trial_id) {
  if (impl_->user_version < 3) return {};  // an older database opened read-only
  Stmt s(impl_->db,
         "SELECT trial_id, role, epoch, path, sha256, bytes, optimizer_path, optimizer_sha256, "
         "recorded_at FROM checkpoints WHERE trial_id = ?1 ORDER BY role, epoch");
  s.bind(1, trial_id);
  std::vector<CheckpointRow> rows;
  while (s.step()) {
    CheckpointRow r;
    r.trial_id = s.int64("trial_id");
    r.role = s.text("role");
    r.epoch = s.int64("epoch");
    r.path = s.text("path");
    r.sha256 = s.text("sha256");
    r.bytes = s.int64("bytes");
    r.optimizer_path = s.text("optimizer_path");
    r.optimizer_sha256 = s.text("optimizer_sha256");
    r.recorded_at = s.text("recorded_at");
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<AttemptRow> Store::attempts(int64_t trial_id) {
  if (impl_->user_version < 5) return {};  // an older database opened read-only
  Stmt s(impl_->db,
         "SELECT trial_id, attempt, status, error, started_at, finished_at, resumed_from_epoch, "
         "epochs_done FROM attempts WHERE trial_id = ?1 ORDER BY attempt");
  s.bind(1, trial_id);
  std::vector<AttemptRow> rows;
  while (s.step()) {
    AttemptRow r;
    r.trial_id = s.int64("trial_id");
    r.attempt = s.int64("attempt");
    r.status = parse_status(s.text("status"));
    r.error = s.text("error");
    r.started_at = s.text("started_at");
    r.finished_at = s.text("finished_at");
    r.resumed_from_epoch = s.int64("resumed_from_epoch");
    r.epochs_done = s.int64("epochs_done");
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<TrialSummary> Store::trial_summaries(int64_t experiment_id) {
  // The trial's own columns come from `trials`, its results from the views.
  const std::string sql = detail::select_trials(
      impl_->setting_columns, impl_->absent_columns, impl_->has_checkpoints(), impl_->has_tags(),
      "JOIN trial_summary s ON s.trial_id = trials.id "
      "LEFT JOIN scaling c ON c.trial_id = trials.id "
      "WHERE trials.experiment_id = ?1 ORDER BY trials.ordinal, trials.id",
      ", s.final_test_acc AS final_test_acc, s.best_test_acc AS best_test_acc, "
      "s.final_train_loss AS final_train_loss, "
      "s.mean_seconds_per_epoch AS mean_seconds_per_epoch, s.total_seconds AS total_seconds, "
      "c.speedup AS speedup, c.efficiency AS efficiency");
  Stmt s(impl_->db, sql.c_str());
  s.bind(1, experiment_id);
  std::vector<TrialSummary> rows;
  while (s.step()) {
    TrialSummary t;
    t.trial = detail::read_trial(impl_->setting_columns, s);
    t.final_test_acc = s.real_or_null("final_test_acc");
    t.best_test_acc = s.real_or_null("best_test_acc");
    t.final_train_loss = s.real_or_null("final_train_loss");
    t.mean_seconds_per_epoch = s.real_or_null("mean_seconds_per_epoch");
    t.total_seconds = s.real_or_null("total_seconds");
    t.speedup = s.real_or_null("speedup");
    t.efficiency = s.real_or_null("efficiency");
    rows.push_back(std::move(t));
  }
  return rows;
}

}  // namespace dps
