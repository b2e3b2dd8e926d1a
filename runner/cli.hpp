#pragma once
// The dprun command line: subcommands, options, help. Exit status: 0 all done or skipped,
// 1 a trial failed or diverged, 2 a bad command line or experiment file, 128+N when stopped by
// signal N.
#include <string>
#include <vector>

namespace dprun {

/// Runs the command line and returns the exit status.
int main_cli(int argc, char** argv);

/// The closest of `candidates` to `word` within a small edit distance, or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace dprun
