#include "common/reactor.h"

#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "common/cpu_relax.h"
#include "common/log.h"

namespace ferry {

thread_local const Reactor* Reactor::running_ = nullptr;

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
  threadWakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (threadWakeFd_ < 0) return ioError("eventfd");
  quietFd_ = epoll_create1(EPOLL_CLOEXEC);
  if (quietFd_ < 0) return ioError("epoll_create1");
  if (epoll_ctl(quietFd_, EPOLL_CTL_ADD, wakeFd_, &ev) != 0) return ioError("epoll_ctl(wake fd)");
  ev.data.fd = threadWakeFd_;
  if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, threadWakeFd_, &ev) != 0) return ioError("epoll_ctl(wake fd)");
  if (epoll_ctl(quietFd_, EPOLL_CTL_ADD, threadWakeFd_, &ev) != 0) return ioError("epoll_ctl(wake fd)");
  thread_ = std::thread([this, name] {
    threadId_ = std::this_thread::get_id();
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    loop();
  });
  return Status::ok();
}

void Reactor::checkOnLoop(const char* function) const {
  if (ownsLoopWork()) return;
  std::fprintf(stderr, "ferry: %s runs off its loop's thread\n", function);
  std::abort();
}

void Reactor::stop() {
  if (!thread_.joinable()) {
    if (epollFd_ >= 0) close(epollFd_), epollFd_ = -1;
    if (wakeFd_ >= 0) close(wakeFd_), wakeFd_ = -1;
    if (threadWakeFd_ >= 0) close(threadWakeFd_), threadWakeFd_ = -1;
    if (quietFd_ >= 0) close(quietFd_), quietFd_ = -1;
    return;
  }
  stopping_ = true;
  wakeThread();
  thread_.join();
  threadId_ = std::thread::id();
  {
    std::lock_guard<std::mutex> lock(postMu_);
    stopped_ = true;
    posted_.clear();
  }
  std::lock_guard<std::mutex> loopLock(loopMu_);  // a caller's progressOnce() ends first
  closed_ = true;
  fds_.clear();
  dataFds_ = 0;
  timers_.clear();
  timerCbs_.clear();
  pollers_.clear();
  close(epollFd_);
  close(wakeFd_);
  close(threadWakeFd_);
  close(quietFd_);
  epollFd_ = wakeFd_ = threadWakeFd_ = quietFd_ = -1;
}

void Reactor::wake() {
  if (wakePending_.exchange(true)) return;
  uint64_t one = 1;
  ssize_t n = write(wakeFd_, &one, sizeof one);
  (void)n;
}

void Reactor::wakeThread() {
  if (threadWakePending_.exchange(true)) return;
  uint64_t one = 1;
  ssize_t n = write(threadWakeFd_, &one, sizeof one);
  (void)n;
}

void Reactor::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(postMu_);
    if (stopped_) return;
    posted_.push_back(std::move(fn));
    postedPending_.store(true);
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
    postedPending_.store(true);
  }
  wake();
  std::unique_lock<std::mutex> lock(mu);
  // The loop runs every posted task before it exits, so this wait always ends.
  cv.wait(lock, [&] { return done; });
  return Status::ok();
}

Status Reactor::addFd(int fd, uint32_t events, FdCb cb, FdUse use) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) return ioError("epoll_ctl(add)");
  WatchedFd& watched = fds_[fd];
  // An entry there already is stale (the epoll set accepted the fd, so that one was closed
  // without removeFd, which its owner should have called): the new one replaces it.
  if (watched.cb) {
    FERRY_LOG(kWarn, "fd %d was closed while watched: its old entry is replaced", fd);
    if (watched.use == FdUse::kData) --dataFds_;
  }
  watched = WatchedFd{std::make_shared<FdCb>(std::move(cb)), use};
  if (use == FdUse::kData) ++dataFds_;
  return Status::ok();
}

void Reactor::setFdUse(int fd, FdUse use) {
  auto it = fds_.find(fd);
  if (it == fds_.end() || it->second.use == use) return;
  it->second.use = use;
  if (use == FdUse::kData) {
    ++dataFds_;
  } else {
    --dataFds_;
  }
}

Status Reactor::modFd(int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(epollFd_, EPOLL_CTL_MOD, fd, &ev) != 0) return ioError("epoll_ctl(mod)");
  return Status::ok();
}

void Reactor::removeFd(int fd) {
  auto it = fds_.find(fd);
  if (it == fds_.end()) return;
  if (it->second.use == FdUse::kData) --dataFds_;
  fds_.erase(it);
  epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr);
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

Reactor::PollerId Reactor::addPoller(Poller fn) {
  PollerId id = nextPollerId_++;
  pollers_.emplace_back(id, std::make_shared<Poller>(std::move(fn)));
  return id;
}

void Reactor::removePoller(PollerId id) {
  std::erase_if(pollers_, [id](const auto& p) { return p.first == id; });
}

void Reactor::attendUntil(Clock::time_point until) {
  const bool sooner = until < attendedUntil_;
  attendedUntil_ = until;
  // Sooner: the thread may sleep on the quiet set until the old end. Begun: it sleeps on the fds,
  // and goes over to the quiet set once woken. (A wake-up a caller's run could take would leave
  // the thread asleep on the fds past the lease's end, and what producers left unannounced with it.)
  if (sooner || (!threadQuiet_ && until > Clock::now() && std::this_thread::get_id() != threadId_.load())) {
    wakeThread();
  }
}

int Reactor::timeoutMsLocked() {
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
  return timeoutMs;
}

int Reactor::dispatchLocked(const epoll_event* events, int n) {
  int ran = 0;
  for (int i = 0; i < n; ++i) {  // n < 0 (a failed or interrupted wait): no events
    int fd = events[i].data.fd;
    if (fd == wakeFd_) {
      uint64_t value;
      ssize_t r = read(wakeFd_, &value, sizeof value);
      (void)r;
      wakePending_ = false;
      continue;
    }
    if (fd == threadWakeFd_) {
      if (std::this_thread::get_id() == threadId_.load()) {
        // Read, then clear (as for wakeFd_): a wakeThread() in between writes nothing, but its
        // callers change what it is for under loopMu_, which this thread holds, or (stop()) set
        // stopping_ first, which the loop looks at after this.
        uint64_t value;
        ssize_t r = read(threadWakeFd_, &value, sizeof value);
        (void)r;
        threadWakePending_ = false;
      }
      continue;
    }
    auto it = fds_.find(fd);
    if (it == fds_.end()) continue;
    std::shared_ptr<FdCb> cb = it->second.cb;  // keeps the callback alive if it removes itself
    (*cb)(events[i].events);
    ++ran;
  }
  // Timers due now.
  const auto now = timers_.empty() ? Clock::time_point() : runNow();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    TimerId id = timers_.begin()->second;
    timers_.erase(timers_.begin());
    auto it = timerCbs_.find(id);
    if (it == timerCbs_.end()) continue;
    auto cb = std::move(it->second.second);
    timerCbs_.erase(it);
    cb();
  }
  if (postedPending_.load()) {
    std::lock_guard<std::mutex> lock(postMu_);
    work_.swap(posted_);
    postedPending_.store(false);
  }
  for (auto& fn : work_) fn();
  work_.clear();
  return ran;
}

bool Reactor::progressOnce(bool vouches) {
  return runHere([this, vouches] {
    // Work the pollers found is what the caller polls for: the fds can wait for the next run. So
    // can fds none of which brings data (FdUse): the pollers find what this loop's peers send
    // (with no poller, every fd is looked at as data).
    const bool found = runPollersLocked(vouches);
    const bool dataFds = pollers_.empty() || dataFds_ > 0;
    if ((!found && dataFds) || ++runsWithoutFds_ >= kFdsAfterRuns) {
      runsWithoutFds_ = 0;
      (void)runReadyFdsLocked();
    } else {
      dispatchLocked(nullptr, 0);
    }
  });
}

int Reactor::runReadyFdsLocked() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  const int n = epoll_wait(epollFd_, events, kMaxEvents, 0);
  return dispatchLocked(events, n);
}

Reactor::WaitHere Reactor::waitHere(int alsoFd, int timeoutMs, Clock::duration lease) {
  if (inLoop()) return WaitHere::kRefused;
  int epollFd = -1;
  Clock::time_point until;
  {
    // Blocking: whoever runs the loop holds it for one pass. A wait that gave up here would sleep
    // on alsoFd alone while its lease, if it holds, keeps the thread off the fds.
    std::lock_guard<std::mutex> lock(loopMu_);
    if (!openLocked()) return WaitHere::kRefused;
    // The pollers first, as a caller's run: what an earlier run left for the next one (an ACK it
    // deferred) goes now, and what they find (a ring's frame) ends the wait at once.
    if (runLocked([this] { return runPollersLocked(false) ? 1 : 0; }) != 0) return WaitHere::kReady;
    const auto now = Clock::now();
    // Renewed, never moved sooner: the thread need not be woken. Asleep on the fds, it sees the
    // lease when it next wakes (a frame this caller may take as well) and sleeps quiet from then
    // on. Woken now, it would make the fds' set readable (its wake-up fd is in it) until it ran,
    // and this caller spin on it.
    if (attendedUntil_ - now < lease / 2) attendedUntil_ = now + lease;
    until = attendedUntil_;
    epollFd = epollFd_;
  }
  auto left = until - Clock::now();
  if (timeoutMs >= 0) left = std::min<Clock::duration>(left, std::chrono::milliseconds(timeoutMs));
  left = std::max<Clock::duration>(left, Clock::duration::zero());
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  const timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  // An epoll set is readable while one of its fds is ready. (Were the reactor stopped meanwhile and
  // the number reused, the run below is refused: no worse than a spurious wake-up.)
  pollfd fds[2] = {{epollFd, POLLIN, 0}, {alsoFd, POLLIN, 0}};
  const int ready = ::ppoll(fds, 2, &ts, nullptr);
  if (ready <= 0) return ready == 0 ? WaitHere::kIdle : WaitHere::kReady;  // EINTR: look again
  if (fds[0].revents != 0) {
    std::unique_lock<std::mutex> lock(loopMu_);  // the thread may be taking them too: after it
    if (openLocked()) {
      const int taken = runLocked([this] { return runReadyFdsLocked(); });
      if (taken > 0) fdsTakenByWaiters_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return WaitHere::kReady;
}

bool Reactor::runPollersLocked(bool vouches) {
  bool found = false;
  for (size_t i = 0; i < pollers_.size(); ++i) {
    std::shared_ptr<Poller> fn = pollers_[i].second;  // alive if it removes itself
    found = (*fn)(vouches) || found;
  }
  return found;
}

bool Reactor::runHere(const std::function<void()>& fn) {
  if (inLoop()) return false;
  std::unique_lock<std::mutex> lock(loopMu_, std::try_to_lock);
  if (!lock.owns_lock() || !openLocked()) return false;
  runLocked([&fn] {
    fn();
    return 0;
  });
  return true;
}

template <typename Fn>
int Reactor::runLocked(Fn fn) {
  ++progressed_;
  running_ = this;
  runNow_ = Clock::time_point();
  const int result = fn();
  running_ = nullptr;
  // A timer fn added that falls due before the thread's own wake-up: the thread must sleep less.
  if (!timers_.empty() && timers_.begin()->first < threadSleepsUntil_) wakeThread();
  return result;
}

void Reactor::loop() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  std::unique_lock<std::mutex> lock(loopMu_);
  for (;;) {
    bool quiet = false;
    const int timeoutMs = sleepTimeoutLocked(&quiet);
    const uint64_t progressed = progressed_;
    lock.unlock();
    int n = epoll_wait(quiet ? quietFd_ : epollFd_, events, kMaxEvents, timeoutMs);
    int err = errno;
    relockAfterSleep(lock, quiet);
    if (n >= 0 && (quiet || progressed_ != progressed)) {
      // A caller ran the loop meanwhile: what epoll_wait returned may be stale. Ask again. After a
      // quiet sleep, the fds are looked at too: what the callers left.
      n = epoll_wait(epollFd_, events, kMaxEvents, 0);
      err = errno;
    }
    if (n < 0 && err != EINTR) {
      FERRY_LOG(kError, "epoll_wait failed: errno %d", err);
      break;
    }
    runNow_ = Clock::time_point();
    dispatchLocked(events, n);
    sweepEndedLeaseLocked(quiet);
    if (stopping_) {
      std::lock_guard<std::mutex> postLock(postMu_);
      if (posted_.empty()) {
        stopped_ = true;
        break;
      }
    }
  }
}

int Reactor::sleepTimeoutLocked(bool* quiet) {
  int timeoutMs = timeoutMsLocked();
  threadSleepsUntil_ = timers_.empty() ? Clock::time_point::max() : timers_.begin()->first;
  // Attended: the callers take the fds' events; sleep on posted work and timers until the end.
  const auto now = Clock::now();
  *quiet = attendedUntil_ > now;
  threadQuiet_ = *quiet;
  if (*quiet) {
    const int untilEnd =
        static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(attendedUntil_ - now).count());
    timeoutMs = timeoutMs < 0 ? untilEnd : std::min(timeoutMs, untilEnd);
    // A timer a caller adds that falls due after the lease's end wakes nobody: the thread looks
    // at the timers again then.
    threadSleepsUntil_ = std::min(threadSleepsUntil_, attendedUntil_);
  }
  return timeoutMs;
}

void Reactor::relockAfterSleep(std::unique_lock<std::mutex>& lock, bool quiet) {
  // A caller running the loop holds it for a few microseconds: wait for it without sleeping on
  // the lock at first, so that its unlock wakes no one (a futex system call on its thread). Not
  // after a quiet sleep: the callers run the loop over and over while their lease holds (a caller
  // waiting on a completion channel holds it across most of its waits), and a spin for each of
  // the thread's look at the lease took a core's worth from them.
  for (int spin = 0; !lock.try_lock(); ++spin) {
    if (quiet || spin >= 2000) {
      lock.lock();
      return;
    }
    cpuRelax();
  }
}

void Reactor::sweepEndedLeaseLocked(bool quiet) {
  // The work the callers were to find, when they stopped coming: after a quiet sleep, and once
  // for every lease that has ended, however late the thread comes (a lease may begin and end
  // while the thread waits for a core, and a producer that saw it woke nobody).
  const auto after = Clock::now();
  const bool ended = attendedUntil_ != Clock::time_point() && attendedUntil_ <= after;
  if (quiet || (ended && sweptLease_ != attendedUntil_)) {
    runNow_ = after;  // a reading from before the lease's end would have the pollers see it hold
    (void)runPollersLocked(false);
    if (ended) sweptLease_ = attendedUntil_;
  }
}

}  // namespace ferry
