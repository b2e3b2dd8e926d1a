#pragma once
// Several trials at once on disjoint devices (`dprun run --jobs N`). The runner hands each trial
// its own GPUs (the trial process's CUDA_VISIBLE_DEVICES) or CPU cores (its affinity and thread
// count), largest trials first, smaller ones filling the devices left over, and gives a trial's
// devices to the next ones when it ends. Pure bookkeeping: what the machine has is found by
// find_devices(), and the runner starts the processes.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dprun {

enum class DeviceKind { cpu, gpu };

/// What the runner may hand out.
struct DeviceInventory {
  std::vector<std::string> gpus;  // as CUDA_VISIBLE_DEVICES names them: "0", "3", "GPU-1a2b..."
  std::vector<int> cores;         // CPU ids of the runner's affinity mask
};

/// What one trial asks for.
struct DeviceNeed {
  DeviceKind kind = DeviceKind::cpu;
  int count = 1;  // GPUs or cores; more than the machine has: all of them
  /// Runs alone: nothing starts beside it (its processes are on hosts the runner does not see).
  bool exclusive = false;
};

/// The devices of one trial.
struct DeviceSet {
  DeviceKind kind = DeviceKind::cpu;
  std::vector<std::string> gpus;
  std::vector<int> cores;
  bool exclusive = false;
  /// "gpus 2,3", "cores 0-3,6", "exclusive" (what the store and the summary show).
  std::string text() const;
  /// The value of CUDA_VISIBLE_DEVICES for it: "2,3".
  std::string visible_devices() const;
};

/// Which waiting trials start when, on which devices.
class Scheduler {
 public:
  /// max_jobs: at most this many trials at once; 0: as many as the devices allow.
  Scheduler(DeviceInventory inventory, int max_jobs);

  /// A trial waits to start; id is the caller's.
  void add(int id, DeviceNeed need);
  /// The waiting trials that start now, each with its devices: in order of size (largest
  /// first, then in the order they were added), every trial that fits in what is free, so
  /// smaller trials backfill devices a larger one cannot use yet.
  std::vector<std::pair<int, DeviceSet>> start_now();
  /// The trial ended (or never ran): its devices are free again.
  void release(int id);
  /// Whether a trial could start now (a free job slot and a free device of some kind): a cheap
  /// test before deciding what to run next.
  bool could_start_any() const;
  /// Whether a trial with this need would start now if added (nothing is taken).
  bool fits_now(const DeviceNeed& need) const;

  bool waiting() const { return !waiting_.empty(); }
  int running() const { return static_cast<int>(running_.size()); }
  const DeviceInventory& inventory() const { return inventory_; }

 private:
  struct Waiting {
    int id;
    DeviceNeed need;
  };
  bool take(const DeviceNeed& need, DeviceSet& set);
  DeviceNeed clamped(DeviceNeed need) const;

  DeviceInventory inventory_;
  int max_jobs_;
  std::vector<bool> gpu_busy_, core_busy_;
  std::vector<Waiting> waiting_;
  std::vector<std::pair<int, DeviceSet>> running_;
};

/// The CPU cores this process may run on (its affinity mask).
std::vector<int> affinity_cores();

/// The GPUs a trial process would see: CUDA_VISIBLE_DEVICES's entries (or 0 .. n-1 without it),
/// n counted by `dprun_exe __devices` in a child process, since the runner itself never
/// initialises CUDA. Empty for a dprun built without CUDA.
std::vector<std::string> visible_gpus(const std::string& dprun_exe);

/// `dprun __devices`: prints the number of CUDA devices this process sees. Returns 0.
int devices_child_main();

}  // namespace dprun
