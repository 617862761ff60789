// Waits on the file descriptors libibverbs hands out (the async event fd, completion channels):
// each is made non-blocking and polled in slices, so a close() racing with a wait ends it.
#pragma once

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

namespace ferry::ibverbs {

using Clock = std::chrono::steady_clock;

// The longest a wait sleeps in poll() before it looks at the object's state again: a close()
// racing with a wait ends the wait within this bound.
inline constexpr int kWaitSliceMs = 100;

inline int setNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return errno;
  if (fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return errno;
  return 0;
}

// Waits until fd is readable or timeoutMs (at most kWaitSliceMs) passed; false on timeout.
inline bool waitReadable(int fd, int timeoutMs) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  const int ready = ::poll(&p, 1, std::min(timeoutMs, kWaitSliceMs));
  return ready > 0;
}

// Milliseconds until deadline, rounded up: a wait never ends before its timeout (0.4 ms left is a
// 1 ms poll, not none).
inline int msLeft(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

}  // namespace ferry::ibverbs
