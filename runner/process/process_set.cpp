// The runner's wait (see process_set.hpp).
#include "process/process_set.hpp"

#include <errno.h>
#include <poll.h>

#include <system_error>

namespace dprun {

int wait_for_any(const std::vector<int>& fds, double seconds, SignalPipe& signals) {
  std::vector<pollfd> polled;
  polled.reserve(fds.size() + 1);
  for (int fd : fds) polled.push_back({fd, POLLIN, 0});
  polled.push_back({signals.fd(), POLLIN, 0});
  const int rc = ::poll(polled.data(), polled.size(), static_cast<int>(seconds * 1000) + 1);
  if (rc < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
  return signals.received();
}

}  // namespace dprun
