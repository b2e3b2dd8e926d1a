#pragma once
// "Did you mean": the one place that decides which known word a mistyped one was meant to be,
// for experiment-file keys and values, commands, options, models and --filter keys alike.
#include <string>
#include <vector>

namespace dprun {

/// The candidate closest to `word`, or "" when none is close enough to be a likely typo.
/// Closeness is the edit distance counting a swap of two neighbours as one edit ("nwhc" is one
/// edit from "nhwc"); a word that starts a candidate ("plug" for "plugins") counts as one edit.
/// Close enough: at most max(1, (length + 2) / 3) edits. Ties go to the earlier candidate.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace dprun
