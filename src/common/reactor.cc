#include "common/reactor.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <condition_variable>

#include "common/log.h"

namespace ferry {

Reactor::~Reactor() { stop(); }

Status Reactor::start(const std::string& name) {
  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epollFd_ < 0) return ioError("epoll_create1");
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakeFd_ < 0) return ioError("eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wakeFd_;
  if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev) != 0) return ioError("epoll_ctl(wake fd)");
  thread_ = std::thread([this, name] {
    threadId_ = std::this_thread::get_id();
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    loop();
  });
  return Status::ok();
}

void Reactor::stop() {
  if (!thread_.joinable()) {
    if (epollFd_ >= 0) close(epollFd_), epollFd_ = -1;
    if (wakeFd_ >= 0) close(wakeFd_), wakeFd_ = -1;
    return;
  }
  stopping_ = true;
  wake();
  thread_.join();
  {
    std::lock_guard<std::mutex> lock(postMu_);
    stopped_ = true;
    posted_.clear();
  }
  fds_.clear();
  timers_.clear();
  timerCbs_.clear();
  close(epollFd_);
  close(wakeFd_);
  epollFd_ = wakeFd_ = -1;
}

void Reactor::wake() {
  if (wakePending_.exchange(true)) return;
  uint64_t one = 1;
  ssize_t n = write(wakeFd_, &one, sizeof one);
  (void)n;
}

void Reactor::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(postMu_);
    if (stopped_) return;
    posted_.push_back(std::move(fn));
  }
  wake();
}

Status Reactor::runSync(const std::function<void()>& fn) {
  if (inLoop()) {
    fn();
    return Status::ok();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(postMu_);
    if (stopped_ || stopping_) return Status(StatusCode::kClosed, "the context is closed", EBADF);
    posted_.push_back([&] {
      fn();
      std::lock_guard<std::mutex> l(mu);
      done = true;
      cv.notify_one();
    });
  }
  wake();
  std::unique_lock<std::mutex> lock(mu);
  // The loop runs every posted task before it exits, so this wait always ends.
  cv.wait(lock, [&] { return done; });
  return Status::ok();
}

Status Reactor::addFd(int fd, uint32_t events, FdCb cb) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) return ioError("epoll_ctl(add)");
  fds_[fd] = std::make_shared<FdCb>(std::move(cb));
  return Status::ok();
}

Status Reactor::modFd(int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(epollFd_, EPOLL_CTL_MOD, fd, &ev) != 0) return ioError("epoll_ctl(mod)");
  return Status::ok();
}

void Reactor::removeFd(int fd) {
  if (fds_.erase(fd) > 0) epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr);
}

Reactor::TimerId Reactor::addTimer(Clock::time_point when, std::function<void()> cb) {
  TimerId id = nextTimerId_++;
  timers_.emplace(when, id);
  timerCbs_.emplace(id, std::make_pair(when, std::move(cb)));
  return id;
}

void Reactor::cancelTimer(TimerId id) {
  auto it = timerCbs_.find(id);
  if (it == timerCbs_.end()) return;
  auto range = timers_.equal_range(it->second.first);
  for (auto t = range.first; t != range.second; ++t) {
    if (t->second == id) {
      timers_.erase(t);
      break;
    }
  }
  timerCbs_.erase(it);
}

void Reactor::loop() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  std::vector<std::function<void()>> work;
  for (;;) {
    int timeoutMs = -1;
    if (!timers_.empty()) {
      auto delta = timers_.begin()->first - Clock::now();
      auto us = std::chrono::duration_cast<std::chrono::microseconds>(delta).count();
      timeoutMs = us <= 0 ? 0 : static_cast<int>((us + 999) / 1000);
    }
    {
      std::lock_guard<std::mutex> lock(postMu_);
      if (!posted_.empty()) timeoutMs = 0;
    }
    if (stopping_) timeoutMs = 0;
    int n = epoll_wait(epollFd_, events, kMaxEvents, timeoutMs);
    if (n < 0 && errno != EINTR) {
      FERRY_LOG(kError, "epoll_wait failed: errno %d", errno);
      break;
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wakeFd_) {
        uint64_t value;
        ssize_t r = read(wakeFd_, &value, sizeof value);
        (void)r;
        wakePending_ = false;
        continue;
      }
      auto it = fds_.find(fd);
      if (it == fds_.end()) continue;
      std::shared_ptr<FdCb> cb = it->second;  // keeps the callback alive if it removes itself
      (*cb)(events[i].events);
    }
    // Timers due now.
    auto now = Clock::now();
    while (!timers_.empty() && timers_.begin()->first <= now) {
      TimerId id = timers_.begin()->second;
      timers_.erase(timers_.begin());
      auto it = timerCbs_.find(id);
      if (it == timerCbs_.end()) continue;
      auto cb = std::move(it->second.second);
      timerCbs_.erase(it);
      cb();
    }
    {
      std::lock_guard<std::mutex> lock(postMu_);
      work.swap(posted_);
    }
    for (auto& fn : work) fn();
    work.clear();
    if (stopping_) {
      std::lock_guard<std::mutex> lock(postMu_);
      if (posted_.empty()) {
        stopped_ = true;
        break;
      }
    }
  }
}

}  // namespace ferry
