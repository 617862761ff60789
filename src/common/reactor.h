// Reactor: one thread that owns a set of file descriptors and timers and runs work posted to it.
//
// Idle costs nothing: the thread sleeps in epoll_wait until an fd is ready, a timer is due, or
// work is posted (an eventfd wake-up, coalesced so a burst of posts costs one write).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ferry/common/status.h"

namespace ferry {

class Reactor {
 public:
  using Clock = std::chrono::steady_clock;
  using FdCb = std::function<void(uint32_t events)>;
  using TimerId = uint64_t;

  Reactor() = default;
  ~Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  // Creates the epoll set and starts the thread (named `name` for debuggers).
  Status start(const std::string& name);
  // Runs what was posted so far, then stops and joins the thread. Idempotent. Not from the loop.
  void stop();

  // Runs fn on the reactor thread soon. Thread-safe. Dropped (not run) after stop().
  void post(std::function<void()> fn);
  // Runs fn on the reactor thread and waits for it; runs it inline when called on that thread.
  // Returns kClosed (without running fn) once the reactor is stopped.
  Status runSync(const std::function<void()>& fn);
  bool inLoop() const { return std::this_thread::get_id() == threadId_.load(); }

  // The following run on the reactor thread only.
  Status addFd(int fd, uint32_t events, FdCb cb);
  Status modFd(int fd, uint32_t events);
  void removeFd(int fd);
  TimerId addTimer(Clock::time_point when, std::function<void()> cb);
  void cancelTimer(TimerId id);

 private:
  void loop();
  void wake();

  int epollFd_ = -1;
  int wakeFd_ = -1;
  std::thread thread_;
  std::atomic<std::thread::id> threadId_{};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> wakePending_{false};

  std::mutex postMu_;
  std::vector<std::function<void()>> posted_;
  bool stopped_ = false;  // guarded by postMu_

  std::unordered_map<int, std::shared_ptr<FdCb>> fds_;
  std::multimap<Clock::time_point, TimerId> timers_;
  std::unordered_map<TimerId, std::pair<Clock::time_point, std::function<void()>>> timerCbs_;
  TimerId nextTimerId_ = 1;
};

}  // namespace ferry
