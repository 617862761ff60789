// Reactor: one thread that owns a set of file descriptors and timers and runs work posted to it.
//
// Idle costs nothing: the thread sleeps in epoll_wait until an fd is ready, a timer is due, or
// work is posted (an eventfd wake-up, coalesced so a burst of posts costs one write).
//
// Progress where the caller is: another thread may run the loop once itself (progressOnce()), as
// an application that polls for completions does, instead of waiting for the thread to wake up.
// Its run also calls the pollers: checks of work that raises no event while callers poll.
// Whoever runs the loop holds its lock, so the callbacks still run one at a time, and inLoop() is
// true for the thread running them.
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

struct epoll_event;

namespace ferry {

// Debug builds check that a function meant for the loop (its name ends in FromLoop) runs there:
// FERRY_ON_LOOP(reactor) as its first statement. Release builds compile it away.
#ifndef NDEBUG
#define FERRY_ON_LOOP(reactor) (reactor).checkOnLoop(__func__)
#else
#define FERRY_ON_LOOP(reactor) ((void)0)
#endif

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
  bool inLoop() const { return std::this_thread::get_id() == threadId_.load() || running_ == this; }
  // Whether the calling thread may do the loop's work: it runs the loop, or no thread does (before
  // start(), after stop()). What FERRY_ON_LOOP checks.
  bool ownsLoopWork() const { return inLoop() || threadId_.load() == std::thread::id(); }
  // Ends the process, naming `function`, unless ownsLoopWork(): the debug check of FERRY_ON_LOOP.
  void checkOnLoop(const char* function) const;
  // Whether the calling thread runs the loop as a caller (runHere(), progressOnce(), waitHere()),
  // not as the reactor's own thread.
  bool inCallersRun() const { return running_ == this; }
  // Runs the loop once on the calling thread, without waiting: the pollers, the fds that are
  // ready, the timers that are due, the work posted. `vouches`: the caller says it goes on calling
  // (an application polling a queue it has not armed); the pollers are told. Does nothing (false)
  // when another thread is running the loop, when called from inside the loop, or once the reactor
  // is stopped. Thread-safe.
  bool progressOnce(bool vouches = false);
  // Runs fn on the calling thread as the loop would (holding the loop, inLoop() true), when no
  // thread is running the loop; false (fn not run) when one is, when called from inside the loop,
  // or once the reactor is stopped. Thread-safe.
  bool runHere(const std::function<void()>& fn);

  // The following run on the reactor thread only (or in a caller's runHere()/progressOnce()).
  // The clock of the current run (the thread's pass over what is ready, or a caller's runHere()):
  // read when first asked and shared by whatever asks later in the same run, so that a run's
  // pollers, its timers and the progress stamps of its connections cost one reading. Read again
  // once the run has done kWorkBeforeNow of work since (noteWork), so it is behind the clock by a
  // fraction of a millisecond at most, however long the run: for deadlines and leases that may
  // come that much early or late, never to time a spin or to tell whether another thread's lease
  // still holds.
  Clock::time_point runNow() {
    if (runNow_ == Clock::time_point()) {
      runNow_ = Clock::now();
      workSinceNow_ = 0;
    }
    return runNow_;
  }
  // runNow() in nanoseconds of the steady clock (steadyNs()'s unit and epoch).
  int64_t runNowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(runNow().time_since_epoch()).count();
  }
  // The run moved `bytes` (a read or a write of a connection): what runNow() is behind by grows
  // with it. Each call counts kWorkPerCall more, for the work around the bytes.
  static constexpr size_t kWorkPerCall = 1024;
  static constexpr size_t kWorkBeforeNow = 256 * 1024;
  void noteWork(size_t bytes) {
    workSinceNow_ += bytes + kWorkPerCall;
    if (workSinceNow_ >= kWorkBeforeNow) runNow_ = Clock::time_point();
  }
  // What a watched fd brings, for callers' runs (progressOnce) to know how soon to look at it.
  //   kData     input that only its event announces (a socket's frames): a caller's run whose
  //             pollers found nothing looks at the fds, for as long as one such fd is watched.
  //   kControl  events that may wait a few runs (a listener; a ring's wake-up eventfd and hang-up
  //             socket, whose frames the pollers find): every kFdsAfterRuns-th caller's run looks.
  //             A loop without pollers looks at every fd as data.
  // The thread, when it does not sleep on the quiet set (attendUntil), watches both alike.
  enum class FdUse { kData, kControl };
  Status addFd(int fd, uint32_t events, FdCb cb, FdUse use = FdUse::kData);
  // Changes what a watched fd brings (a UDP socket is data while a QP reads it, else control).
  void setFdUse(int fd, FdUse use);
  // How many watched fds are FdUse::kData (for diagnostics and tests). Loop only.
  size_t dataFds() const { return dataFds_; }
  Status modFd(int fd, uint32_t events);
  void removeFd(int fd);
  TimerId addTimer(Clock::time_point when, std::function<void()> cb);
  void cancelTimer(TimerId id);
  // A poller runs in every caller's progressOnce(), first: it looks for work that raises no event
  // (a ring whose producer was told not to wake this process, because its application polls),
  // returns whether it found some, and is told whether the caller vouches (progressOnce). A run
  // whose pollers found work, or that watches no fd of FdUse::kData, leaves the fds to a later run,
  // so that a poll whose frame waits in a ring, or that finds nothing on a context whose
  // connections are all rings, makes no system call; every kFdsAfterRuns-th run in a row looks at
  // them all the same. The
  // thread runs the pollers (vouching for no one) when it wakes from a sleep while attended
  // (attendUntil), which it does at the latest when the lease ends, and once after every lease
  // that ended, however late it comes to run: what the callers left is taken.
  using PollerId = uint64_t;
  using Poller = std::function<bool(bool vouches)>;
  static constexpr int kFdsAfterRuns = 8;
  PollerId addPoller(Poller fn);
  void removePoller(PollerId id);
  // A caller vouches that callers run the loop often (progressOnce) until `until`: till then the
  // thread sleeps on posted work and timers only, not on the fds, whose events the callers take,
  // so that a socket's readiness wakes no thread; it looks at the fds again, and runs the pollers,
  // at `until`, or at once when a later call moves `until` earlier (Clock::time_point() ends it).
  void attendUntil(Clock::time_point until);
  // For a caller about to sleep on `alsoFd` (a completion channel's) until what the loop does next
  // makes it ready: the caller sleeps on the loop's fds as well, and runs the loop itself when they
  // are ready, so that a peer's frame wakes one thread (the caller) instead of the thread, which
  // then wakes the caller. Meanwhile the thread sleeps on the quiet set (a lease of `lease`,
  // renewed when less than half of it is left; the thread goes quiet when it next wakes, and
  // keeps the timers). The lease outlives the wait: for the rest of it, the fds' events wait for
  // the next caller or the lease's end (the thread looks then). Sleeps at most timeoutMs (-1: no
  // limit) and until the lease's end. Waits for a run of the loop by another thread to end (the
  // caller must hold no lock the loop's callbacks take). Thread-safe; never from inside the loop.
  //   kReady    the loop's fds were ready and the caller ran the loop (or the thread took them
  //             first), or alsoFd is ready: look at alsoFd.
  //   kIdle     neither was ready before the lease's end or timeoutMs: a caller that still waits
  //             should leave the loop to the thread and sleep on alsoFd alone, so that an idle
  //             wait costs no CPU.
  //   kRefused  called from inside the loop, or the reactor is stopped.
  enum class WaitHere { kReady, kIdle, kRefused };
  WaitHere waitHere(int alsoFd, int timeoutMs, Clock::duration lease);
  // How many of waitHere()'s runs took a watched fd's event (for diagnostics and tests).
  uint64_t fdsTakenByWaiters() const { return fdsTakenByWaiters_.load(std::memory_order_relaxed); }
  // Whether the thread is still to run the pollers for the current lease: one is set, the thread
  // sleeps on the quiet set (it runs them when it wakes, at the lease's end at the latest) and
  // has not run them since the lease ended. A lease a waiter began (waitHere) does not wake the
  // thread: until the thread next wakes, it runs no pollers for it. Loop only.
  bool leaseSweepAhead() const {
    return attendedUntil_ != Clock::time_point() && threadQuiet_ && sweptLease_ != attendedUntil_;
  }

 private:
  void loop();
  // loop()'s steps, under loopMu_ but the middle one: how long the thread sleeps (*quiet: on the
  // quiet fd, while callers attend), taking the lock back after the sleep, and the pollers' run
  // owed after a quiet sleep or an ended lease.
  int sleepTimeoutLocked(bool* quiet);
  void relockAfterSleep(std::unique_lock<std::mutex>& lock, bool quiet);
  void sweepEndedLeaseLocked(bool quiet);
  // Wakes whoever runs the loop next (posted work: a caller's run may take it).
  void wake();
  // Wakes the thread itself (a caller's run does not take this one): it must stop, or sleep less,
  // or go over to the other epoll set.
  void wakeThread();
  // Under loopMu_: runs the callbacks of n ready events, the timers due and the work posted;
  // returns how many fds' callbacks ran.
  int dispatchLocked(const ::epoll_event* events, int n);
  // Under loopMu_: whether the loop may run (the reactor is neither stopping nor stopped).
  bool openLocked() const { return !closed_ && epollFd_ >= 0 && !stopping_; }
  // Under loopMu_: dispatchLocked() over the fds ready now.
  int runReadyFdsLocked();
  // Under loopMu_, on a caller's thread: runs fn (returning int) as a run of the loop.
  template <typename Fn>
  int runLocked(Fn fn);
  bool runPollersLocked(bool vouches);  // whether a poller found work
  int timeoutMsLocked();

  int epollFd_ = -1;
  int wakeFd_ = -1;
  int threadWakeFd_ = -1;  // read by the thread only
  int quietFd_ = -1;       // an epoll set of the two wake-up fds alone: the thread's while attended
  std::thread thread_;
  std::atomic<std::thread::id> threadId_{};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> wakePending_{false};
  std::atomic<bool> threadWakePending_{false};
  std::atomic<uint64_t> fdsTakenByWaiters_{0};
  // Held by whoever runs the loop (the thread, or a caller of progressOnce()); guards fds_ and the
  // timers. progressed_ counts the callers' runs: events the thread's epoll_wait returned before one
  // may be stale (their fd read, or closed and its number reused), so the thread polls again.
  std::mutex loopMu_;
  uint64_t progressed_ = 0;                  // guarded by loopMu_
  std::vector<std::function<void()>> work_;  // guarded by loopMu_: the posted work being run
  bool closed_ = false;                      // guarded by loopMu_: the epoll set is gone
  // Guarded by loopMu_: when the thread's epoll_wait times out (the first timer, or the lease's
  // end while attended; max: never).
  Clock::time_point threadSleepsUntil_ = Clock::time_point::max();
  Clock::time_point attendedUntil_{};           // guarded by loopMu_
  Clock::time_point sweptLease_{};              // guarded by loopMu_: the last ended lease the thread swept
  Clock::time_point runNow_{};                  // guarded by loopMu_: runNow()'s reading (zero: none yet)
  size_t workSinceNow_ = 0;                     // guarded by loopMu_: noteWork() since that reading
  bool threadQuiet_ = false;                    // guarded by loopMu_: the thread sleeps on the quiet set
  static thread_local const Reactor* running_;  // the reactor a progressOnce() on this thread runs

  std::mutex postMu_;
  std::vector<std::function<void()>> posted_;
  // Whether posted_ may hold work: set under postMu_ with each post, cleared by the run that takes
  // it, so that a run with nothing posted (a caller's poll, most of them) takes no lock for it.
  std::atomic<bool> postedPending_{false};
  bool stopped_ = false;  // guarded by postMu_

  struct WatchedFd {
    std::shared_ptr<FdCb> cb;  // shared: a run keeps the callback alive if it removes its fd
    FdUse use = FdUse::kData;
  };
  std::unordered_map<int, WatchedFd> fds_;
  size_t dataFds_ = 0;  // the fds of fds_ that are FdUse::kData
  std::multimap<Clock::time_point, TimerId> timers_;
  std::unordered_map<TimerId, std::pair<Clock::time_point, std::function<void()>>> timerCbs_;
  TimerId nextTimerId_ = 1;
  std::vector<std::pair<PollerId, std::shared_ptr<Poller>>> pollers_;
  int runsWithoutFds_ = 0;  // guarded by loopMu_: callers' runs in a row that left the fds
  PollerId nextPollerId_ = 1;
};

}  // namespace ferry
