// The commands that write the user's words about trials into a results database (`dprun tag`,
// `dprun note`) and the one that deletes trials with their checkpoint files (`dprun forget`).
// The store writes the rows; these parse, confirm and say what was done.
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>

#include "base/usage_error.hpp"
#include "cli/commands.hpp"
#include "cli/liveness.hpp"
#include "dpstore/store.hpp"
#include "process/checkpoint_files.hpp"
#include "report/report.hpp"
#include "settings/settings.hpp"
#include "slurm/merge.hpp"
#include "sweep/sweep_runner.hpp"

namespace dprun::cli {

namespace {

namespace fs = std::filesystem;

const char* const kTrialIdsHint =
    "trial ids: dprun query \"SELECT trial_id, experiment, model, gpus, status, tags FROM "
    "trial_summary\"";

std::vector<int64_t> trial_ids(const std::vector<std::string>& texts) {
  std::vector<int64_t> ids;
  for (const std::string& text : texts) {
    int64_t id = 0;
    auto res = std::from_chars(text.data(), text.data() + text.size(), id);
    if (res.ec != std::errc() || res.ptr != text.data() + text.size() || id < 1)
      throw UsageError("trial id \"" + text + "\": expected a positive integer (" + kTrialIdsHint +
                       ")");
    ids.push_back(id);
  }
  return ids;
}

// Read-write with this dprun's setting columns, as `dprun run` opens it: a database of an older
// schema is migrated and its views regenerated, so trial_summary lists tags and notes at once.
dps::Store open_for_writing(const std::string& db) {
  return dps::Store(db, dps::Store::Mode::read_write, builtin_settings().store_columns());
}

std::string plural(size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// The unknown ids, as a usage error that says where to find the known ones.
void require_trials(dps::Store& store, const std::vector<int64_t>& ids, const std::string& db) {
  std::set<int64_t> missing;
  for (int64_t id : ids)
    if (!store.get_trial(id)) missing.insert(id);
  if (missing.empty()) return;
  std::string list;
  for (int64_t id : missing) list += (list.empty() ? "" : ", ") + std::to_string(id);
  throw UsageError(db + ": " + (missing.size() == 1 ? "no trial with id " : "no trials with ids ") +
                   list + "; nothing was changed (" + kTrialIdsHint + ")");
}

// What `dprun forget` shows of one trial before it asks.
struct Doomed {
  int64_t id = 0;
  std::string description;         // "experiment quick: lenet gpus=2 (done, 2/2 epochs)"
  std::vector<std::string> files;  // absolute
  std::vector<std::string> kept;   // named by its checkpoint rows, outside its folder: not removed
};

// Whether `path` lies in the trial's own checkpoint folder.
bool in_trial_folder(const std::string& db, int64_t id, const std::string& path) {
  const std::string own = fs::path(trial_checkpoint_dir(db, id)).lexically_normal().string() + "/";
  return fs::path(path).lexically_normal().string().rfind(own, 0) == 0;
}

// The files forget removes: those in the trial's own folder. A checkpoint row naming a file
// elsewhere (a database copied with absolute paths, a path edited by hand) is left alone: that
// file may belong to another database's trial.
std::vector<std::string> files_of(dps::Store& store, const std::string& db, int64_t id,
                                  std::vector<std::string>& kept) {
  std::vector<std::string> files;
  std::set<std::string> seen;
  auto add = [&](const std::string& path) {
    if (path.empty() || !seen.insert(path).second) return;
    if (in_trial_folder(db, id, path))
      files.push_back(path);
    else
      kept.push_back(path);
  };
  for (const dps::CheckpointRow& c : store.checkpoints(id)) {
    add(resolve_checkpoint_path(db, c.path));
    if (!c.optimizer_path.empty()) add(resolve_checkpoint_path(db, c.optimizer_path));
  }
  // Its folder may hold more than the rows name (a file being replaced when its run stopped);
  // a trial created later may get the same id, and must not find them.
  std::error_code ec;
  const fs::path folder = trial_checkpoint_dir(db, id);
  if (fs::is_directory(folder, ec))
    for (const auto& e : fs::recursive_directory_iterator(folder, ec))
      if (e.is_regular_file(ec)) add(e.path().string());
  return files;
}

std::vector<Doomed> describe_doomed(dps::Store& store, const std::string& db,
                                    const std::vector<int64_t>& ids) {
  const std::set<int64_t> wanted(ids.begin(), ids.end());
  std::vector<Doomed> out;
  for (const ExperimentTrials& x : experiment_trials(store, builtin_settings())) {
    for (size_t i = 0; i < x.trials.size(); ++i) {
      const dps::TrialRow& t = x.trials[i].trial;
      if (!wanted.count(t.id)) continue;
      Doomed d;
      d.id = t.id;
      std::string tags;
      for (const std::string& tag : t.tags) tags += (tags.empty() ? "" : ",") + tag;
      d.description = "experiment " + x.experiment.name + ": " + x.label(i) + " (" +
                      dps::status_name(t.status) + ", " + std::to_string(t.epochs_done) + "/" +
                      x.setting(i, "epochs") + " epochs" + (tags.empty() ? "" : ", tags " + tags) +
                      ")";
      d.files = files_of(store, db, t.id, d.kept);
      out.push_back(std::move(d));
    }
  }
  return out;
}

// Asks on the terminal; false for anything but yes.
bool confirmed(size_t trials) {
  if (!isatty(STDIN_FILENO))
    throw UsageError(
        "forget: nothing was forgotten: standard input is not a terminal, so dprun cannot ask; "
        "pass --yes to forget these trials");
  std::fprintf(stderr, "forget %s? [y/N] ", plural(trials, "trial", "trials").c_str());
  std::fflush(stderr);
  std::string answer;
  if (!std::getline(std::cin, answer)) return false;
  return answer == "y" || answer == "Y" || answer == "yes" || answer == "Yes" || answer == "YES";
}

// Removes the files and the trials' folders; returns how many files went, and names those that
// would not go in `left`.
size_t remove_files(const std::string& db, const std::vector<Doomed>& doomed,
                    const std::vector<dps::CheckpointRow>& forgotten,
                    std::vector<std::string>& left) {
  std::vector<std::string> files;
  for (const Doomed& d : doomed) files.insert(files.end(), d.files.begin(), d.files.end());
  // The rows deleted are what counts: a checkpoint recorded after the list was shown goes too.
  for (const dps::CheckpointRow& c : forgotten)
    for (const std::string& path : {c.path, c.optimizer_path})
      if (!path.empty() && in_trial_folder(db, c.trial_id, resolve_checkpoint_path(db, path)))
        files.push_back(resolve_checkpoint_path(db, path));
  size_t removed = 0;
  std::set<std::string> done;
  for (const std::string& f : files) {
    if (!done.insert(f).second) continue;
    std::error_code ec;
    if (fs::remove(f, ec)) {
      ++removed;
    } else if (ec) {
      left.push_back(f + ": " + ec.message());
    }
  }
  for (const Doomed& d : doomed) {
    std::error_code ec;
    fs::remove_all(trial_checkpoint_dir(db, d.id), ec);
    if (ec) left.push_back(trial_checkpoint_dir(db, d.id) + ": " + ec.message());
  }
  return removed;
}

}  // namespace

int tag_command(const Invocation& in) {
  const Args& a = in.args;
  const bool remove = a.flag("--remove");
  if (a.positional.size() < 2)
    throw UsageError(std::string("dprun tag needs trial ids and a tag name, e.g. dprun tag ") +
                     (remove ? "--remove " : "") + "3 7 baseline (see dprun tag --help)");
  const std::string tag = a.positional.back();
  if (const std::string problem = dps::tag_name_problem(tag); !problem.empty())
    throw UsageError(problem + " (the tag name comes last: dprun tag TRIAL... NAME)");
  const std::vector<int64_t> ids =
      trial_ids(std::vector<std::string>(a.positional.begin(), a.positional.end() - 1));
  const size_t n = std::set<int64_t>(ids.begin(), ids.end()).size();
  const std::string db = results_database(a, "tag");
  dps::Store store = open_for_writing(db);
  require_trials(store, ids, db);
  if (remove) {
    const auto had = static_cast<size_t>(store.untag_trials(ids, tag));
    std::printf("removed tag %s from %s", tag.c_str(), plural(had, "trial", "trials").c_str());
    if (had < n) std::printf("; %zu did not have it", n - had);
  } else {
    const auto gained = static_cast<size_t>(store.tag_trials(ids, tag));
    std::printf("tagged %s %s", plural(n, "trial", "trials").c_str(), tag.c_str());
    if (gained < n) std::printf("; %zu had it already", n - gained);
  }
  std::printf("\n");
  return 0;
}

int note_command(const Invocation& in) {
  const Args& a = in.args;
  if (a.positional.size() != 2)
    throw UsageError(
        "dprun note needs a trial id and the text in quotes, e.g. dprun note 3 \"lr too high\" "
        "(\"\" clears the note; -- before a text that starts with -)");
  const int64_t id = trial_ids({a.positional[0]}).front();
  const std::string& text = a.positional[1];
  const std::string db = results_database(a, "note");
  dps::Store store = open_for_writing(db);
  require_trials(store, {id}, db);
  store.set_note(id, text);
  if (text.empty()) {
    std::printf("cleared the note of trial %lld\n", static_cast<long long>(id));
  } else {
    std::printf("noted trial %lld\n", static_cast<long long>(id));
  }
  return 0;
}

int forget_command(const Invocation& in) {
  const Args& a = in.args;
  if (a.positional.empty())
    throw UsageError("dprun forget needs the ids of the trials to forget, e.g. dprun forget 3 7 (" +
                     std::string(kTrialIdsHint) + ")");
  const std::vector<int64_t> ids = trial_ids(a.positional);
  const std::string db = results_database(a, "forget");
  // A trial whose Slurm task ended but was not collected yet is collected, not refused.
  merge_if_needed(db);
  dps::Store store = open_for_writing(db);
  require_trials(store, ids, db);
  const double stale_seconds = SweepOptions{}.stale_seconds;
  std::string refused;
  for (int64_t id : std::set<int64_t>(ids.begin(), ids.end()))
    if (const std::string why = store.forget_refusal(id, stale_seconds); !why.empty())
      refused += (refused.empty() ? "" : "; ") + ("trial " + std::to_string(id) + ": " + why);
  // Nor while a dprun runs the trial's experiment: it holds the trial's row, and a forgotten
  // trial's id may be given to a trial created meanwhile.
  std::set<int64_t> experiments;
  for (int64_t id : ids) experiments.insert(store.get_trial(id)->experiment_id);
  for (int64_t e : experiments)
    if (const std::string who = sweep_activity(store, e, stale_seconds); !who.empty())
      refused += std::string(refused.empty() ? "" : "; ") +
                 "trials of an experiment that is still being run (" + who +
                 "): let it finish or stop it, then forget them";
  if (!refused.empty()) throw UsageError("cannot forget " + refused + "; nothing was forgotten");

  const std::vector<Doomed> doomed = describe_doomed(store, db, ids);
  std::printf("forget %s of %s, with their epochs, attempts and checkpoints:\n",
              plural(doomed.size(), "trial", "trials").c_str(), db.c_str());
  for (const Doomed& d : doomed) {
    std::printf("  trial %lld  %s\n", static_cast<long long>(d.id), d.description.c_str());
    if (d.files.empty()) std::printf("    no checkpoint files\n");
    for (const std::string& f : d.files) std::printf("    delete %s\n", f.c_str());
    for (const std::string& f : d.kept)
      std::printf("    keep %s (outside the trial's folder %s)\n", f.c_str(),
                  trial_checkpoint_dir(db, d.id).c_str());
  }
  std::fflush(stdout);
  if (!a.flag("--yes") && !confirmed(doomed.size())) {
    std::printf("nothing was forgotten\n");
    return 1;
  }
  const std::vector<dps::CheckpointRow> forgotten = store.forget_trials(ids, stale_seconds);
  std::vector<std::string> left;
  const size_t removed = remove_files(db, doomed, forgotten, left);
  std::printf("forgot %s; removed %s\n", plural(doomed.size(), "trial", "trials").c_str(),
              plural(removed, "file", "files").c_str());
  for (const std::string& l : left) std::fprintf(stderr, "dprun: could not remove %s\n", l.c_str());
  return left.empty() ? 0 : 1;
}

}  // namespace dprun::cli
