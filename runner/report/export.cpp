// `dprun export`: one trial's model checkpoint, copied out of the results after its sha256 is
// checked against the database's record (see export.hpp).
#include "report/export.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <variant>

#include "base/usage_error.hpp"
#include "dp/error.hpp"
#include "dp/safetensors.hpp"
#include "dpstore/store.hpp"
#include "process/checkpoint_files.hpp"

namespace dprun {

namespace {

std::string describe_kept(const std::vector<dps::CheckpointRow>& rows) {
  std::string out;
  for (const auto& c : rows)
    out += (out.empty() ? "" : ", ") + c.role + " (epoch " + std::to_string(c.epoch) + ")";
  return out.empty() ? "none" : out;
}

std::string setting_text(const dps::TrialRow& row, const std::string& column) {
  auto it = row.settings.find(column);
  if (it == row.settings.end()) return "";
  if (const auto* s = std::get_if<std::string>(&it->second)) return *s;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return std::to_string(*i);
  return "";
}

}  // namespace

dps::CheckpointRow choose_checkpoint(const dps::TrialRow& trial,
                                     const std::vector<dps::CheckpointRow>& rows,
                                     const ExportChoice& which) {
  const bool best = which.best;
  if (best && which.epoch) throw UsageError("--best and --epoch choose different checkpoints");
  const std::string id = "trial " + std::to_string(trial.id);
  if (rows.empty()) {
    const std::string mode = setting_text(trial, "checkpoint");
    std::string why;
    if (mode == "none")
      why = " (its checkpoint setting is \"none\"; set checkpoint = \"last\" and run it again)";
    else if (trial.status == dps::TrialStatus::pending)
      why = " (it has not run yet)";
    else if (trial.epochs_done == 0)
      why = " (it recorded no epoch)";
    throw UsageError(id + " kept no checkpoint" + why);
  }
  auto found = rows.end();
  std::string wanted;
  if (which.epoch) {
    const int64_t epoch = *which.epoch;
    wanted = "of epoch " + std::to_string(epoch);
    found = std::find_if(rows.begin(), rows.end(),
                         [&](const dps::CheckpointRow& c) { return c.epoch == epoch; });
  } else {
    const std::string role = best ? "best" : "last";
    wanted = role == "best" ? "best (checkpoint = \"best\" keeps it)" : "last";
    found = std::find_if(rows.begin(), rows.end(),
                         [&](const dps::CheckpointRow& c) { return c.role == role; });
  }
  if (found == rows.end())
    throw UsageError(id + " has no checkpoint " + wanted + "; it kept: " + describe_kept(rows));
  return *found;
}

int export_checkpoint(const std::string& db, int64_t trial_id, const ExportChoice& which,
                      const std::string& output_given) {
  dps::Store store(db, dps::Store::Mode::read_only);
  const auto trial = store.get_trial(trial_id);
  if (!trial) throw UsageError(db + " has no trial " + std::to_string(trial_id));
  const dps::CheckpointRow c = choose_checkpoint(*trial, store.checkpoints(trial_id), which);
  const std::string source = resolve_checkpoint_path(db, c.path);
  const std::string output = !output_given.empty()
                                 ? output_given
                                 : "trial-" + std::to_string(trial_id) + "-epoch-" +
                                       std::to_string(c.epoch) + ".safetensors";
  std::string bytes;
  {
    std::ifstream file(source, std::ios::binary);
    if (!file) {
      std::fprintf(stderr, "dprun: trial %lld's %s checkpoint %s is missing (moved or deleted?)\n",
                   static_cast<long long>(trial_id), c.role.c_str(), source.c_str());
      return 1;
    }
    bytes.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }
  const std::string sha = dps::sha256_hex(bytes);
  if (sha != c.sha256) {
    std::fprintf(stderr,
                 "dprun: %s has sha256 %s, the database recorded %s: it changed after trial %lld "
                 "wrote it; not exported\n",
                 source.c_str(), sha.c_str(), c.sha256.c_str(), static_cast<long long>(trial_id));
    return 1;
  }
  // A model file, readable as one (the record and the file agree, but say so before a user's
  // PyTorch does).
  const dp::SafeTensorsFile model = dp::decode_safetensors(bytes, source);
  dp::write_bytes_atomically(output, bytes);
  std::string acc;
  for (const auto& e : store.epochs(trial_id))
    if (e.epoch == c.epoch) {
      char buf[48];
      std::snprintf(buf, sizeof buf, ", test accuracy %.4f", e.test_acc);
      acc = buf;
    }
  std::printf(
      "wrote %s: trial %lld (%s, gpus %s), %s checkpoint of epoch %lld%s, %zu tensors, "
      "sha256 %s\n",
      output.c_str(), static_cast<long long>(trial_id), setting_text(*trial, "model").c_str(),
      setting_text(*trial, "gpus").c_str(), c.role.c_str(), static_cast<long long>(c.epoch),
      acc.c_str(), model.tensors.size(), sha.c_str());
  return 0;
}

}  // namespace dprun
