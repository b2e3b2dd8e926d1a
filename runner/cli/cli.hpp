#pragma once
// The dprun command line: subcommands, options, help. Exit status: 0 all done or skipped,
// 1 a trial failed or diverged, 2 a bad command line or experiment file, 128+N when stopped by
// signal N.
namespace dprun {

/// Runs the command line and returns the exit status.
int main_cli(int argc, char** argv);

}  // namespace dprun
