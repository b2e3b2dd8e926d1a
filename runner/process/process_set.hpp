#pragma once
// The runner's wait on every trial it runs at once, and on SIGINT/SIGTERM, in one place (as
// ninja's SubprocessSet owns its loop): members are added as they start; wait() returns when a
// pipe of one of them is readable, one of them has a duty due (a heartbeat, a timeout) or a
// signal came, after pumping every member; the members that finished are then taken out.
//
// A Member is what runs one trial (sweep/trial_run.hpp's TrialRun): it has
//   std::vector<int> poll_fds() const;      the descriptors to wait on
//   double seconds_to_next_duty() const;    how long the wait may last before pump() is due
//   void pump();                            reads what arrived, does what is due
//   bool done() const;                      finished: its outcome is decided and recorded
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "process/trial_process.hpp"

namespace dprun {

/// Waits until one of `fds` or the signal pipe is readable, or `seconds` passed (EINTR is a
/// wake-up); returns the first signal the pipe received (0: none). std::system_error when poll
/// fails.
int wait_for_any(const std::vector<int>& fds, double seconds, SignalPipe& signals);

template <class Member>
class ProcessSet {
 public:
  explicit ProcessSet(SignalPipe& signals) : signals_(signals) {}

  void add(int key, std::unique_ptr<Member> member) { running_.emplace(key, std::move(member)); }
  bool empty() const { return running_.empty(); }

  /// Waits at most `max_seconds` (less when a member's duty is due sooner), then pumps every
  /// member. Returns the signal received while waiting (0: none); then nothing is pumped.
  int wait(double max_seconds) {
    std::vector<int> fds;
    double wait = max_seconds;
    for (const auto& [key, member] : running_) {
      for (int fd : member->poll_fds()) fds.push_back(fd);
      wait = std::min(wait, member->seconds_to_next_duty());
    }
    if (int sig = wait_for_any(fds, std::max(wait, 0.0), signals_)) return sig;
    for (auto& [key, member] : running_) member->pump();
    return 0;
  }

  /// The members that are done, taken out of the set, by key.
  std::vector<std::pair<int, std::unique_ptr<Member>>> take_finished() {
    std::vector<std::pair<int, std::unique_ptr<Member>>> out;
    for (auto it = running_.begin(); it != running_.end();) {
      if (it->second->done()) {
        out.emplace_back(it->first, std::move(it->second));
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

  /// Every member, taken out (to stop them).
  std::vector<std::pair<int, std::unique_ptr<Member>>> take_all() {
    std::vector<std::pair<int, std::unique_ptr<Member>>> out;
    for (auto& [key, member] : running_) out.emplace_back(key, std::move(member));
    running_.clear();
    return out;
  }

 private:
  SignalPipe& signals_;
  std::map<int, std::unique_ptr<Member>> running_;
};

}  // namespace dprun
