#pragma once
// Whether a sweep is still going, judged one way by every command that waits on one or must not
// disturb one: `dprun status --watch`, `dprun report --refresh` and `dprun forget`.
#include <cstdint>
#include <string>

#include "dpstore/store.hpp"

namespace dprun::cli {

/// A dprun process of this host with that pid: a pid the system has given another program since
/// does not count, nor does this process.
bool dprun_alive(int64_t pid);

/// What keeps the experiment's sweep going, "" when nothing does:
///  - a dprun of this host that ran one of its trials and is still alive, whether or not a trial
///    runs this moment (between two trials none does);
///  - a trial `running` on another host whose heartbeat is younger than `stale_seconds` (a
///    runner there cannot be asked; one that crashed stops beating);
///  - a Slurm task of it submitted and not collected yet.
/// The text says which ("dprun pid 123 on this host", "trial 7 on node3 (heartbeat 4 s ago)",
/// "Slurm task 4242_3").
std::string sweep_activity(dps::Store& store, int64_t experiment_id, double stale_seconds);

}  // namespace dprun::cli
