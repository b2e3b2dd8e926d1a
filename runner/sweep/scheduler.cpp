// Device sets for trials that run at once (see scheduler.hpp), and finding what the machine has.
#include "sweep/scheduler.hpp"

#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "dp/backend.hpp"

extern char** environ;

namespace dprun {

namespace {

// "0-3,6": runs of consecutive ids written as ranges. (Appends only: GCC 12 warns falsely,
// -Wrestrict, on "literal" + string.)
std::string ranges(const std::vector<int>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ids[i]);
    if (j > i) {
      out += j == i + 1 ? ',' : '-';
      out += std::to_string(ids[j]);
    }
    i = j + 1;
  }
  return out;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ',';
    out += item;
  }
  return out;
}

// Positions of `count` free slots: the first run of consecutive free ones long enough (GPUs
// next to each other often share a faster link, cores a cache), else the first free ones.
std::vector<size_t> pick(const std::vector<bool>& busy, size_t count) {
  for (size_t start = 0; start + count <= busy.size(); ++start) {
    size_t n = 0;
    while (n < count && !busy[start + n]) ++n;
    if (n == count) {
      std::vector<size_t> run(count);
      for (size_t i = 0; i < count; ++i) run[i] = start + i;
      return run;
    }
  }
  std::vector<size_t> first;
  for (size_t i = 0; i < busy.size() && first.size() < count; ++i)
    if (!busy[i]) first.push_back(i);
  return first.size() == count ? first : std::vector<size_t>{};
}

}  // namespace

std::string DeviceSet::text() const {
  if (exclusive) return "exclusive";
  std::string out = kind == DeviceKind::gpu ? "gpus " : "cores ";
  const std::string ids = kind == DeviceKind::gpu ? joined(gpus) : ranges(cores);
  out += ids.empty() ? std::string("none") : ids;
  return out;
}

std::string DeviceSet::visible_devices() const { return joined(gpus); }

Scheduler::Scheduler(DeviceInventory inventory, int max_jobs)
    : inventory_(std::move(inventory)),
      max_jobs_(max_jobs),
      gpu_busy_(inventory_.gpus.size(), false),
      core_busy_(inventory_.cores.size(), false) {}

DeviceNeed Scheduler::clamped(DeviceNeed need) const {
  const size_t have =
      need.kind == DeviceKind::gpu ? inventory_.gpus.size() : inventory_.cores.size();
  // A trial larger than the machine gets all of it, as it would without --jobs (a CUDA trial
  // then decides itself: skipped, or --oversubscribe).
  need.count =
      static_cast<int>(std::min<size_t>(static_cast<size_t>(std::max(need.count, 0)), have));
  return need;
}

bool Scheduler::could_start_any() const {
  if (max_jobs_ > 0 && running() >= max_jobs_) return false;
  if (!running_.empty() && running_.front().second.exclusive) return false;
  if (inventory_.gpus.empty() && inventory_.cores.empty()) return running_.empty();
  return std::find(gpu_busy_.begin(), gpu_busy_.end(), false) != gpu_busy_.end() ||
         std::find(core_busy_.begin(), core_busy_.end(), false) != core_busy_.end();
}

bool Scheduler::fits_now(const DeviceNeed& need) const {
  if (max_jobs_ > 0 && running() >= max_jobs_) return false;
  Scheduler trial = *this;  // take() marks devices busy: try it on a copy
  DeviceSet set;
  return trial.take(clamped(need), set);
}

void Scheduler::add(int id, DeviceNeed need) {
  need = clamped(need);
  // Largest first; among equals, the order of the sweep (stable).
  auto size = [](const DeviceNeed& n) { return n.exclusive ? INT64_MAX : int64_t{n.count}; };
  auto at = std::find_if(waiting_.begin(), waiting_.end(),
                         [&](const Waiting& w) { return size(w.need) < size(need); });
  waiting_.insert(at, Waiting{id, need});
}

bool Scheduler::take(const DeviceNeed& need, DeviceSet& set) {
  set = DeviceSet{};
  set.kind = need.kind;
  if (need.exclusive) {
    if (!running_.empty()) return false;
    set.exclusive = true;
    return true;
  }
  // An exclusive trial runs alone.
  if (!running_.empty() && running_.front().second.exclusive) return false;
  auto& busy = need.kind == DeviceKind::gpu ? gpu_busy_ : core_busy_;
  const auto slots = pick(busy, static_cast<size_t>(need.count));
  if (slots.size() != static_cast<size_t>(need.count)) return false;
  for (size_t s : slots) {
    busy[s] = true;
    if (need.kind == DeviceKind::gpu)
      set.gpus.push_back(inventory_.gpus[s]);
    else
      set.cores.push_back(inventory_.cores[s]);
  }
  return true;
}

std::vector<std::pair<int, DeviceSet>> Scheduler::start_now() {
  std::vector<std::pair<int, DeviceSet>> started;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (max_jobs_ > 0 && running() >= max_jobs_) break;
    DeviceSet set;
    if (!take(it->need, set)) {
      ++it;
      continue;
    }
    running_.emplace_back(it->id, set);
    started.emplace_back(it->id, set);
    it = waiting_.erase(it);
  }
  return started;
}

void Scheduler::release(int id) {
  auto it =
      std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r.first == id; });
  if (it == running_.end()) return;
  const DeviceSet& set = it->second;
  for (const auto& g : set.gpus) {
    auto pos = std::find(inventory_.gpus.begin(), inventory_.gpus.end(), g);
    gpu_busy_[static_cast<size_t>(pos - inventory_.gpus.begin())] = false;
  }
  for (int c : set.cores) {
    auto pos = std::find(inventory_.cores.begin(), inventory_.cores.end(), c);
    core_busy_[static_cast<size_t>(pos - inventory_.cores.begin())] = false;
  }
  running_.erase(it);
}

// ---- what the machine has ----------------------------------------------------------------------

std::vector<int> affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cores.push_back(c);
  }
  if (cores.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < std::max(1L, n); ++c) cores.push_back(c);
  }
  return cores;
}

std::vector<std::string> visible_gpus(const std::string& dprun_exe) {
  if (!dp::cuda_compiled()) return {};
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipe_fds[1], 1);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  char* argv[] = {const_cast<char*>("dprun"), const_cast<char*>("__devices"), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, dprun_exe.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(pipe_fds[1]);
  std::string out;
  if (rc == 0) {
    char buf[64];
    for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) != 0;) {
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      out.append(buf, static_cast<size_t>(n));
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  ::close(pipe_fds[0]);
  const int count = std::atoi(out.c_str());
  std::vector<std::string> ids;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    const std::string list = visible;
    for (size_t start = 0; start <= list.size() && static_cast<int>(ids.size()) < count;) {
      size_t comma = list.find(',', start);
      if (comma == std::string::npos) comma = list.size();
      if (comma > start) ids.push_back(list.substr(start, comma - start));
      start = comma + 1;
    }
  } else {
    for (int i = 0; i < count; ++i) ids.push_back(std::to_string(i));
  }
  return ids;
}

int devices_child_main() {
  std::printf("%d\n", dp::cuda_compiled() ? dp::cuda_device_count() : 0);
  return 0;
}

}  // namespace dprun
