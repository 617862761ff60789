// EventQueue<T>: a thread-safe queue whose file descriptor is readable while it holds events.
//
// An eventfd in semaphore mode counts the queued events, so the fd works with poll, select and
// epoll, and take() consumes exactly one event. Used for completion channels and async events.
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>

#include "ferry/common/status.h"

namespace ferry {

template <typename T>
class EventQueue {
 public:
  EventQueue() : fd_(eventfd(0, EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~EventQueue() {
    if (fd_ >= 0) ::close(fd_);
  }
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  void push(T event) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
    uint64_t one = 1;
    ssize_t n = ::write(fd_, &one, sizeof one);
    (void)n;
  }

  // Waits up to timeoutMs for an event and takes it; kTimedOut when none came.
  Result<T> take(int timeoutMs) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        uint64_t value;
        // The fd counts the events (push writes it under this lock): an empty queue needs no read.
        if (!events_.empty() && ::read(fd_, &value, sizeof value) == sizeof value) {
          T event = std::move(events_.front());
          events_.pop_front();
          return event;
        }
      }
      // Rounded up: a wait never ends before its timeout (0.4 ms left is a 1 ms poll, not none).
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return Status(StatusCode::kTimedOut, "no event within the timeout", ETIMEDOUT);
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno != EINTR) return ioError("poll");
    }
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_.size();
  }

 private:
  int fd_;
  mutable std::mutex mu_;
  std::deque<T> events_;
};

}  // namespace ferry
