// Asynchronous successive halving (see asha.hpp).
#include "sweep/asha.hpp"

#include <algorithm>
#include <cmath>

#include "process/stop_rule.hpp"

namespace dprun {

std::vector<int64_t> rung_epochs(int64_t min_epochs, int64_t eta, int64_t max_epochs) {
  std::vector<int64_t> out;
  for (int64_t e = min_epochs; e < max_epochs; e *= eta) {
    out.push_back(e);
    if (e > max_epochs / eta) break;  // the next would pass max_epochs (and could overflow)
  }
  return out;
}

namespace {

// Where a trial sent to `rung` stops: that rung's epoch, or its own epochs after the last rung.
int64_t stop_epoch(const AshaTrial& t, int64_t rung, int64_t min_epochs, int64_t eta) {
  const auto rungs = rung_epochs(min_epochs, eta, t.epochs);
  return rung < static_cast<int64_t>(rungs.size()) ? rungs[static_cast<size_t>(rung)] : t.epochs;
}

bool never_runs(dps::TrialStatus s) {
  using S = dps::TrialStatus;
  return s == S::done || s == S::stopped;
}

// Runs again from the start, as a run without a scheduler does with them.
bool starts_again(dps::TrialStatus s) {
  using S = dps::TrialStatus;
  return s == S::diverged || s == S::skipped;
}

}  // namespace

std::optional<AshaJob> next_asha_job(const std::vector<AshaTrial>& trials, int64_t min_epochs,
                                     int64_t eta, bool higher_is_better) {
  using S = dps::TrialStatus;
  // A trial sent to a rung that did not get there goes on towards it.
  for (size_t i = 0; i < trials.size(); ++i) {
    const AshaTrial& t = trials[i];
    if (t.busy || t.rung < 0 || never_runs(t.status) || starts_again(t.status) ||
        t.status == S::pruned)
      continue;
    return AshaJob{i, t.rung, stop_epoch(t, t.rung, min_epochs, eta), AshaJob::Kind::resume,
                   t.status};
  }
  // Promotions, from the highest rung down.
  int64_t rungs = 0;
  for (const AshaTrial& t : trials)
    rungs = std::max(rungs, static_cast<int64_t>(rung_epochs(min_epochs, eta, t.epochs).size()));
  for (int64_t k = rungs - 1; k >= 0; --k) {
    int64_t epoch = min_epochs;
    for (int64_t j = 0; j < k; ++j) epoch *= eta;
    std::vector<std::pair<double, size_t>> reached;  // (value, trial)
    for (size_t i = 0; i < trials.size(); ++i) {
      const auto at = trials[i].metric.find(epoch);
      if (at != trials[i].metric.end() && epoch < trials[i].epochs)
        reached.emplace_back(at->second, i);
    }
    std::stable_sort(reached.begin(), reached.end(), [&](const auto& a, const auto& b) {
      return higher_is_better ? a.first > b.first : a.first < b.first;
    });
    const size_t keep = reached.size() / static_cast<size_t>(eta);
    for (size_t q = 0; q < keep; ++q) {
      const AshaTrial& t = trials[reached[q].second];
      if (t.busy || t.status != S::pruned || t.rung != k) continue;
      return AshaJob{reached[q].second, k + 1, stop_epoch(t, k + 1, min_epochs, eta),
                     AshaJob::Kind::promotion, t.status};
    }
  }
  // A trial not started yet, or one that diverged or was skipped (from the start again).
  for (size_t i = 0; i < trials.size(); ++i) {
    const AshaTrial& t = trials[i];
    if (t.busy || never_runs(t.status) || t.status == S::pruned) continue;
    if (t.rung >= 0 && !starts_again(t.status)) continue;
    return AshaJob{i, 0, stop_epoch(t, 0, min_epochs, eta), AshaJob::Kind::start, t.status};
  }
  return std::nullopt;
}

bool asha_gives_up(dps::TrialStatus status, bool taken) {
  using S = dps::TrialStatus;
  return !taken && (status == S::failed || status == S::diverged || status == S::skipped);
}

AshaDriver::AshaDriver(dps::Store& store, const SearchConfig& config,
                       const std::vector<PlannedTrial>& plan,
                       const std::vector<const PlannedTrial*>& work)
    : store_(store), config_(config), plan_(plan) {
  for (size_t i = 0; i < work.size(); ++i) work_index_[work[i]] = static_cast<int>(i);
}

std::optional<AshaJob> AshaDriver::next(const std::set<int>& busy) {
  // Every trial of the experiment: the ones this run may not start (done, filtered out, run
  // elsewhere) count in the rankings as busy.
  std::vector<AshaTrial> view(plan_.size());
  for (size_t i = 0; i < plan_.size(); ++i) {
    AshaTrial& t = view[i];
    t.epochs = plan_[i].spec->settings[key::epochs];
    const auto work = work_index_.find(&plan_[i]);
    t.busy = work == work_index_.end() || busy.count(work->second) > 0;
    const auto row = plan_[i].row ? store_.get_trial(plan_[i].row->id) : std::nullopt;
    if (!row) continue;
    t.status = row->status;
    t.rung = row->rung;
    t.busy = t.busy || row->status == dps::TrialStatus::running;
    for (const dps::EpochRow& e : store_.epochs(row->id)) {
      const double v = metric_value(e, config_.metric);
      if (std::isfinite(v)) t.metric[e.epoch] = v;
    }
  }
  auto job = next_asha_job(view, config_.min_epochs, config_.eta, higher_is_better(config_.metric));
  if (job) job->trial = static_cast<size_t>(work_index_.at(&plan_[job->trial]));
  return job;
}

}  // namespace dprun
