// A trial's identity: the canonical serialisation of its identity settings and the sha256 of it,
// the config hash under which the store keeps the trial. A trial whose hash is stored as done is
// never run again, so this text must stay the same for the same trial across dprun versions.
#include <cstdio>
#include <map>
#include <stdexcept>

#include "settings/settings.hpp"

namespace dprun {

namespace {

// The first line of every canonical text. dprun 0.1.0 called this a format version and would
// have bumped it with every new setting, changing every stored hash; now new settings leave the
// text alone unless they differ from their default, and the line never changes.
constexpr const char* kHeader = "dprun-trial-settings v1\n";

// The settings dprun 0.1.0 hashed, in its order: each is written whatever its value, because
// the hashes stored by that version include them all. Never edit this list; settings added
// later are written after these, by column name, and only when they differ from their default.
constexpr const char* kV1Settings[] = {
    "dataset",         "model",        "model_options", "gpus",   "batch_size",
    "per_gpu_batch",   "lr",           "epochs",        "seed",   "optimizer",
    "momentum",        "weight_decay", "precision",     "layout", "bn_mode",
    "eval_batch_size", "train_limit",  "test_limit"};

std::string exact(double d) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  return buf;
}

// One value as the canonical text writes it: strings JSON-quoted, floats exactly, the plugin
// options as their canonical JSON.
std::string canonical_value(const Setting& s, const SettingValue& v) {
  if (s.type == SettingType::json) return std::get<std::string>(v);
  if (auto* text = std::get_if<std::string>(&v)) return json_quote(*text);
  if (auto* d = std::get_if<double>(&v)) return exact(*d);
  if (auto* list = std::get_if<std::vector<double>>(&v)) {
    std::string out = "[";
    for (size_t i = 0; i < list->size(); ++i) out.append(i ? "," : "").append(exact((*list)[i]));
    return out + "]";
  }
  return setting_text(v);  // bool, integer
}

bool is_v1(const std::string& column) {
  for (const char* c : kV1Settings)
    if (column == c) return true;
  return false;
}

}  // namespace

std::string canonical_settings(const TrialSettings& settings) {
  const SettingTable& table = settings.table();
  std::string out = kHeader;
  for (const char* column : kV1Settings) {
    const Setting* row = table.by_column(column);
    if (!row || !row->identity)
      throw std::logic_error(std::string("canonical_settings: setting ") + column +
                             " of dprun 0.1.0 is not an identity setting of the table");
    out.append(column).append("=").append(canonical_value(*row, settings.get(column))).append("\n");
  }
  // Later settings by column name, not by their place in the table: moving a row (to keep
  // related settings together) must not change any stored trial's identity.
  std::map<std::string, std::string> later;
  const auto& recorded = table.recorded();
  for (size_t i = 0; i < recorded.size(); ++i) {
    const Setting& row = *recorded[i];
    // The first default: a trial's identity does not depend on its experiment's generation.
    if (!row.identity || is_v1(row.column) || settings.at(i) == row.first_default()) continue;
    later[row.column] = canonical_value(row, settings.at(i));
  }
  for (const auto& [column, value] : later)
    out.append(column).append("=").append(value).append("\n");
  return out;
}

std::string config_hash(const TrialSettings& settings) {
  return dps::sha256_hex(canonical_settings(settings));
}

}  // namespace dprun
