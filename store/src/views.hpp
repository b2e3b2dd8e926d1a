#pragma once
// The CREATE VIEW statements of trial_summary and scaling for a database's setting columns.
#include <set>
#include <string>
#include <vector>

namespace dps::detail {

/// `settings`: the setting columns of `trials`, in table order.
std::string trial_summary_view(const std::vector<std::string>& settings);
/// `may_differ`: the settings a trial's 1-GPU baseline may have other values of.
std::string scaling_view(const std::vector<std::string>& settings,
                         const std::set<std::string>& may_differ);

}  // namespace dps::detail
