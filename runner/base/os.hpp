#pragma once
// What the rooms of runner/ ask of the operating system and the shell, in one place: this host's
// name, this program's path, finding a program on PATH, quoting for a POSIX shell, the end of a
// file, the names of signals.
#include <cstddef>
#include <string>
#include <vector>

namespace dprun {

/// This host's name; "localhost" when the system does not say (as dp::ProcessGroup::host()).
std::string host_name();

/// This dprun's executable (what /proc/self/exe links to), as a launcher or a Slurm job script
/// must start it; "/proc/self/exe" when the link cannot be read.
std::string self_exe();

/// An executable's path: `name` itself when it contains a '/', else the first match on $PATH;
/// "" when there is none.
std::string find_executable(const std::string& name);

/// How the user can start this dprun again, for the commands dprun suggests: "dprun" when the
/// `dprun` on PATH is this executable, else this executable's path (relative to the current
/// folder when inside it: "build/bin/dprun").
std::string command_name();

/// `s` as one word for a POSIX shell (unchanged when it needs no quoting), for the commands
/// dprun prints for the user to run.
std::string shell_quote(const std::string& s);

/// The words of a command for a POSIX shell, joined (how the store records a launch).
std::string command_text(const std::vector<std::string>& words);

/// The last `bytes` of a file ("" when it cannot be read).
std::string file_tail(const std::string& path, size_t bytes = 65536);

/// "SIGKILL" for 9, "SIGABRT" for 6, ...; "signal N" when unknown.
std::string signal_name(int sig);

}  // namespace dprun
