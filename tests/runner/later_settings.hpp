#pragma once
// The table of settings of a later dprun: today's rows plus settings the next issues will add
// (one of each type), so tests can show what adding a setting does to files, hashes and
// databases of today.
#include "settings/settings.hpp"

namespace settingstest {

inline const dprun::SettingTable& later_settings() {
  static const dprun::SettingTable table([] {
    using namespace std::string_literals;
    using T = dprun::SettingType;
    std::vector<dprun::Setting> rows = dprun::builtin_settings().rows();
    // Rows this dprun already has stay as they are (the later settings arrive one by one).
    auto add = [&rows](dprun::Setting row) {
      for (const auto& r : rows)
        if (r.column == row.column) return;
      rows.push_back(std::move(row));
    };
    add({.key = "grad_accum",
         .column = "grad_accum",
         .default_value = int64_t{1},
         .range = dprun::at_least(1),
         .identity = true,
         .help = "micro-batches summed per step"});
    add({.key = "checkpoint",
                    .column = "checkpoint",
                    .type = T::choice,
                    .default_value = "last"s,
                    .choices = {"none", "last", "best", "every"},
                    .baseline_may_differ = true,
                    .help = "which checkpoints to keep"});
    add({.key = "betas",
                    .column = "betas",
                    .type = T::numbers,
                    .default_value = std::vector<double>{0.9, 0.999},
                    .range = dprun::from_to_below(0, 1),
                    .count = 2,
                    .identity = true,
                    .help = "Adam's betas"});
    add({.key = "nesterov",
                    .column = "nesterov",
                    .type = T::boolean,
                    .default_value = false,
                    .identity = true,
                    .help = "Nesterov momentum"});
    return rows;
  }());
  return table;
}

}  // namespace settingstest
