// The views, generated from the setting columns: trial_summary lists every setting of a trial,
// and scaling matches a trial with its 1-GPU baseline on every setting but those allowed to
// differ. Their column names are a documented interface (users query them), so a generated view
// keeps every column the views of schema version 1 had. trial_summary reads trial_tags and
// trials.note (schema 6), trials.data_residence (7), trials.layout_used (8) and
// trials.graphs_used (9): the views are generated only on databases migrated that far.
#include "views.hpp"

#include <algorithm>

namespace dps::detail {

namespace {

// The items, each after `prefix`, separated by `sep` and broken into lines of at most ~96
// characters that start with `indent`.
std::string wrapped(const std::vector<std::string>& items, const std::string& prefix,
                    const std::string& indent, const std::string& sep = ",") {
  std::string out, line = indent;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string item = prefix + items[i] + (i + 1 < items.size() ? sep : "");
    if (line.size() > indent.size() && line.size() + 1 + item.size() > 96) {
      out += line + "\n";
      line = indent;
    }
    line += (line.size() > indent.size() ? " " : "") + item;
  }
  return out + line;
}

}  // namespace

std::string trial_summary_view(const std::vector<std::string>& settings) {
  return R"SQL(CREATE VIEW trial_summary AS
-- One row per trial: its settings, status and what its epochs achieved.
--   final_test_acc / final_train_loss: of the last recorded epoch.
--   best_test_acc: the highest test accuracy over all epochs.
--   mean_seconds_per_epoch: mean of epochs.seconds EXCLUDING EPOCH 1 when the trial has more
--     than one epoch, because epoch 1 includes warm-up (allocations, library autotuning, first
--     touch of the data) and would bias timings and speedups; with a single epoch it is that
--     epoch's seconds. total_seconds sums every epoch, warm-up included.
--   mean_examples_per_second: training throughput, epoch 1 excluded as for the seconds;
--     peak_memory_bytes: the most memory one replica held (GPU memory on CUDA) in any epoch.
--   tags: the trial's tags (dprun tag), sorted, separated by commas; note: its note (dprun note).
--     NULL when it has none.
SELECT
  e.name AS experiment, t.experiment_id, t.id AS trial_id, t.ordinal, t.config_hash,
)SQL" + wrapped(settings, "t.", "  ") +
         R"SQL(,
  t.status, t.error, t.attempts,
  COALESCE(a.n, 0) AS epochs_done,
  last.test_acc AS final_test_acc,
  a.best_test_acc,
  CASE WHEN a.n > 1 THEN a.mean_after_first ELSE a.mean_all END AS mean_seconds_per_epoch,
  last.train_loss AS final_train_loss,
  a.total_seconds,
  CASE WHEN a.n > 1 THEN a.eps_after_first ELSE a.eps_all END AS mean_examples_per_second,
  a.peak_memory_bytes,
  t.backend, t.devices, t.oversubscribed, t.host, t.started_at, t.finished_at,
  t.hosts, t.launch, t.device_set,
  (SELECT group_concat(tag, ',')
   FROM (SELECT g.tag FROM trial_tags g WHERE g.trial_id = t.id ORDER BY g.tag)) AS tags,
  t.note, t.data_residence, t.layout_used, t.graphs_used
FROM trials t
JOIN experiments e ON e.id = t.experiment_id
LEFT JOIN (
  SELECT trial_id, COUNT(*) AS n, MAX(epoch) AS last_epoch, MAX(test_acc) AS best_test_acc,
         AVG(seconds) AS mean_all, AVG(CASE WHEN epoch > 1 THEN seconds END) AS mean_after_first,
         SUM(seconds) AS total_seconds, AVG(examples_per_second) AS eps_all,
         AVG(CASE WHEN epoch > 1 THEN examples_per_second END) AS eps_after_first,
         MAX(peak_memory_bytes) AS peak_memory_bytes
  FROM epochs GROUP BY trial_id
) a ON a.trial_id = t.id
LEFT JOIN epochs last ON last.trial_id = t.id AND last.epoch = a.last_epoch)SQL";
}

std::string scaling_view(const std::vector<std::string>& settings,
                         const std::set<std::string>& may_differ) {
  // The GPU count is what the view compares; every other setting is matched unless allowed to
  // differ. The backend that ran is not a setting but is matched too: cpu and cuda timings
  // are not comparable.
  std::vector<std::string> matched{"experiment_id", "backend"};
  std::vector<std::string> differ;
  for (const auto& s : settings) {
    if (s == "gpus") continue;
    (may_differ.count(s) ? differ : matched).push_back(s);
  }
  std::vector<std::string> on;
  for (const auto& m : matched) on.push_back("b." + m + " IS s." + m);
  // Captured steps (graphs) take less time: a trial is compared with a baseline that ran the same
  // way. graphs = "auto" resolves per trial (replicas sharing a GPU are not captured); a trial
  // of an older dprun (graphs_used NULL) ran its graphs setting as given.
  std::vector<std::string> select = matched, group = matched;
  if (std::find(settings.begin(), settings.end(), "graphs") != settings.end()) {
    select.push_back("COALESCE(graphs_used, graphs) AS ran_graphs");
    group.push_back("COALESCE(graphs_used, graphs)");
    on.push_back("b.ran_graphs IS COALESCE(s.graphs_used, s.graphs)");
  }
  return R"SQL(CREATE VIEW scaling AS
-- Done trials with their speedup over the 1-GPU trial of the same configuration:
--   speedup = baseline seconds / this trial's mean_seconds_per_epoch; efficiency = speedup / gpus.
-- The baseline is the done 1-GPU trial of the same experiment and backend, whose steps were
-- captured or not as this trial's were (graphs_used), that shares every setting but gpus and
-- those that may legitimately vary with gpus or between repeats:
)SQL" + wrapped(differ, "", "--   ") +
         R"SQL(.
-- A 1-GPU trial is its own baseline (speedup 1), whatever the others of its kind took: in a
-- sweep of batch sizes at one GPU, each would otherwise be compared with their mean.
-- Several matching 1-GPU trials (e.g. a seed sweep) are averaged. speedup and efficiency are NULL
-- when there is no such 1-GPU trial. Seconds are mean_seconds_per_epoch of trial_summary (epoch 1,
-- the warm-up, excluded).
SELECT
  s.experiment, s.experiment_id, s.trial_id,
)SQL" + wrapped(settings, "s.", "  ") +
         R"SQL(,
  s.backend, s.mean_seconds_per_epoch,
  CASE WHEN s.gpus = 1 AND s.mean_seconds_per_epoch IS NOT NULL THEN 1.0
       ELSE b.base_seconds / s.mean_seconds_per_epoch END AS speedup,
  CASE WHEN s.gpus = 1 AND s.mean_seconds_per_epoch IS NOT NULL THEN 1.0
       ELSE b.base_seconds / s.mean_seconds_per_epoch / s.gpus END AS efficiency,
  s.final_test_acc
FROM trial_summary s
LEFT JOIN (
  SELECT
)SQL" + wrapped(select, "", "    ") +
         R"SQL(,
    AVG(mean_seconds_per_epoch) AS base_seconds
  FROM trial_summary
  WHERE status = 'done' AND gpus = 1
  GROUP BY
)SQL" + wrapped(group, "", "    ") +
         "\n) b ON\n" + wrapped(on, "", "  ", " AND") + "\nWHERE s.status = 'done'";
}

}  // namespace dps::detail
