#include "base/suggest.hpp"

#include <algorithm>

namespace dprun {

namespace {

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
// neighbouring characters each cost one.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const size_t limit = std::max<size_t>(1, (word.size() + 2) / 3);
  const std::string* best = nullptr;
  size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (word.size() >= 2 && c.size() > word.size() && c.rfind(word, 0) == 0)
      d = std::min<size_t>(d, 1);
    if (d < best_d) best = &c, best_d = d;
  }
  return best ? *best : "";
}

}  // namespace dprun
