// The Reactor run by its callers (progressOnce(), runHere()): callbacks run on the calling thread
// as the loop's, never beside the thread's own run of it, and never once the reactor stopped; its
// pollers run in the callers' runs only.
#include "common/reactor.h"

#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace ferry {
namespace {

using namespace std::chrono_literals;

// runHere() until the reactor's thread is asleep and lets us run fn; false if it never does.
bool runHereSoon(Reactor& r, const std::function<void()>& fn) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until) {
    if (r.runHere(fn)) return true;
    std::this_thread::sleep_for(100us);
  }
  return false;
}

// An eventfd in the reactor's set whose events are counted by who took them: the thread, or the
// caller (the test's thread). signal() makes it ready.
struct CountedFd {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::atomic<int> byThread{0}, byCaller{0};
  const std::thread::id caller = std::this_thread::get_id();

  ~CountedFd() { close(fd); }
  bool addTo(Reactor& r, Reactor::FdUse use = Reactor::FdUse::kData) {
    bool added = false;
    bool ran = r.runSync([&] {
                  added = r.addFd(
                               fd, EPOLLIN,
                               [this](uint32_t) {
                                 uint64_t v;
                                 if (read(fd, &v, sizeof v) != sizeof v) return;
                                 if (std::this_thread::get_id() == caller)
                                   ++byCaller;
                                 else
                                   ++byThread;
                               },
                               use)
                              .isOk();
                }).isOk();
    return fd >= 0 && ran && added;
  }
  void signal() const {
    uint64_t one = 1;
    ASSERT_EQ(write(fd, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  }
};

TEST(Reactor, RunHereRunsOnTheCallerAsTheLoop) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  EXPECT_FALSE(r.inLoop());
  bool ran = false, inLoop = false, nestedInline = false, nestedRefused = false;
  std::thread::id on;
  ASSERT_TRUE(runHereSoon(r, [&] {
    ran = true;
    on = std::this_thread::get_id();
    inLoop = r.inLoop();
    // From inside the loop: runSync runs inline (it would wait for itself otherwise), and the
    // loop is not entered twice.
    EXPECT_TRUE(r.runSync([&] { nestedInline = true; }).isOk());
    nestedRefused = !r.runHere([] {}) && !r.progressOnce();
  }));
  EXPECT_TRUE(ran);
  EXPECT_EQ(on, std::this_thread::get_id());
  EXPECT_TRUE(inLoop);
  EXPECT_TRUE(nestedInline);
  EXPECT_TRUE(nestedRefused);
  EXPECT_FALSE(r.inLoop()) << "after the run, the caller is not in the loop any more";
  r.stop();
}

// A timer a caller adds falls due on time though the thread sleeps with no timer of its own.
TEST(Reactor, ATimerACallerAddsWakesTheSleepingThread) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  std::promise<std::thread::id> fired;
  ASSERT_TRUE(runHereSoon(r, [&] {
    r.addTimer(Reactor::Clock::now() + 20ms, [&fired] { fired.set_value(std::this_thread::get_id()); });
  }));
  auto f = fired.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the timer never fired";
  EXPECT_NE(f.get(), std::this_thread::get_id()) << "nobody but the thread ran the loop since";
  r.stop();
}

// A poller runs in the callers' runs of the loop (progressOnce), on their thread, and not in the
// thread's own while nothing is attended; once removed, it runs no more, and one may remove itself.
TEST(Reactor, PollersRunInTheCallersProgressOnly) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  std::atomic<int> polls{0}, selfRemoving{0};
  std::atomic<bool> offThread{false};
  const auto caller = std::this_thread::get_id();
  Reactor::PollerId id = 0, once = 0;
  ASSERT_TRUE(r.runSync([&] {
                 id = r.addPoller([&](bool) {
                   ++polls;
                   if (std::this_thread::get_id() != caller) offThread = true;
                   return false;
                 });
                 once = r.addPoller([&](bool) {
                   ++selfRemoving;
                   r.removePoller(once);
                   return false;
                 });
               }).isOk());
  // The thread runs the loop (posted work, a timer): no poller with it.
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(r.runSync([] {}).isOk());
  EXPECT_EQ(polls.load(), 0);
  int runs = 0;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (runs < 5 && std::chrono::steady_clock::now() < until) {
    if (r.progressOnce())
      ++runs;
    else
      std::this_thread::sleep_for(100us);
  }
  ASSERT_EQ(runs, 5);
  EXPECT_EQ(polls.load(), 5);
  EXPECT_EQ(selfRemoving.load(), 1) << "a poller that removed itself ran again";
  EXPECT_FALSE(offThread.load());
  ASSERT_TRUE(runHereSoon(r, [&] { r.removePoller(id); }));
  ASSERT_TRUE(runHereSoon(r, [] {}));
  while (!r.progressOnce()) std::this_thread::sleep_for(100us);
  EXPECT_EQ(polls.load(), 5) << "a removed poller ran";
  r.stop();
}

// While attended, a ready fd does not wake the thread: a caller's progressOnce takes it. The thread
// takes it again once the lease runs out (and runs the pollers then), or at once when the lease is
// ended early.
TEST(Reactor, AnAttendedReactorLeavesReadyFdsToItsCallers) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  CountedFd efd;
  ASSERT_TRUE(efd.addTo(r));
  // Attended for 10 s: the event waits for a caller. (The thread goes over to the quiet set when
  // it next wakes, which it is made to at once; a loaded machine may take a while, so a few tries.)
  ASSERT_TRUE(runHereSoon(r, [&] { r.attendUntil(Reactor::Clock::now() + 10s); }));
  int taken = 0;
  bool left = false;
  for (int attempt = 1; attempt <= 5 && !left; ++attempt) {
    std::this_thread::sleep_for(attempt * 20ms);
    efd.signal();
    std::this_thread::sleep_for(50ms);
    left = efd.byThread.load() == taken;
    taken = efd.byThread.load();
  }
  EXPECT_TRUE(left) << "the thread woke for an fd while attended, five times";
  // A caller's run (with no poller that found work) takes it.
  while (!r.progressOnce()) std::this_thread::sleep_for(100us);
  EXPECT_EQ(efd.byCaller.load(), 1);
  // Ended early: the thread takes the next event itself.
  ASSERT_TRUE(runHereSoon(r, [&] { r.attendUntil(Reactor::Clock::time_point()); }));
  efd.signal();
  for (int i = 0; i < 10000 && efd.byThread.load() == taken; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(efd.byThread.load(), taken + 1) << "the thread did not come back to the fds when the lease ended";
  // A short lease that runs out by itself: the thread takes what waited, and runs the pollers
  // (the work no fd announces) once.
  std::atomic<int> threadPolls{0};
  ASSERT_TRUE(runHereSoon(r, [&] {
    r.addPoller([&](bool) {
      if (std::this_thread::get_id() != efd.caller) ++threadPolls;
      return false;
    });
    r.attendUntil(Reactor::Clock::now() + 30ms);
  }));
  efd.signal();
  for (int i = 0; i < 10000 && efd.byThread.load() == taken + 1; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(efd.byThread.load(), taken + 2) << "an event that came during the lease was never taken";
  EXPECT_EQ(efd.byCaller.load(), 1);
  for (int i = 0; i < 10000 && threadPolls.load() == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_GT(threadPolls.load(), 0) << "the thread did not run the pollers when the lease ran out";
  r.stop();
}

// A caller's run whose pollers found work leaves the ready fds to a later run, so that a poll
// whose frame waits in a ring makes no system call; but every kFdsAfterRuns-th run in a row looks
// at them, and a run whose pollers find nothing looks at once. The pollers learn whether the
// caller vouches.
TEST(Reactor, APollThatFindsWorkLeavesTheFdsToALaterRunForAFewRunsAtMost) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  CountedFd efd;
  ASSERT_TRUE(efd.addTo(r));
  std::atomic<bool> finds{true};
  std::atomic<int> vouched{-1};
  ASSERT_TRUE(r.runSync([&] {
                 r.addPoller([&](bool vouches) {
                   if (std::this_thread::get_id() == efd.caller) vouched = vouches ? 1 : 0;
                   return finds.load();
                 });
               }).isOk());
  // One successful caller's run (the thread may hold the loop for a moment).
  auto run = [&](bool vouches) {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!r.progressOnce(vouches) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(100us);
  };
  // Attended, so that the thread leaves the fd to the callers (as in the test above, a loaded
  // machine may take a while to put the thread on its quiet set: a few tries).
  ASSERT_TRUE(runHereSoon(r, [&] { r.attendUntil(Reactor::Clock::now() + 60s); }));
  bool checked = false;
  for (int attempt = 1; attempt <= 5 && !checked; ++attempt) {
    std::this_thread::sleep_for(attempt * 20ms);
    finds = false;
    run(false);  // a run that looks at the fds: the count of runs that left them starts again
    finds = true;
    const int before = efd.byCaller.load(), thread = efd.byThread.load();
    efd.signal();
    for (int i = 1; i < Reactor::kFdsAfterRuns; ++i) run(true);
    const int afterSkipping = efd.byCaller.load(), vouchedThen = vouched.load();
    run(false);
    const int afterLooking = efd.byCaller.load();
    // Judged once the event was taken: by the thread (it was not on its quiet set yet), try again.
    if (efd.byThread.load() != thread) continue;
    EXPECT_EQ(afterSkipping, before) << "a run whose pollers found work looked at the fds";
    EXPECT_EQ(vouchedThen, 1);
    EXPECT_EQ(vouched.load(), 0);
    EXPECT_EQ(afterLooking, before + 1) << "the fds waited more than kFdsAfterRuns runs";
    checked = true;
  }
  ASSERT_TRUE(checked) << "the thread woke for an fd while attended, five times";
  // Pollers that find nothing: the fds are looked at in the same run (the thread, quiet, sleeps).
  finds = false;
  const int before = efd.byCaller.load(), thread = efd.byThread.load();
  efd.signal();
  run(true);
  if (efd.byThread.load() == thread) {
    EXPECT_EQ(efd.byCaller.load(), before + 1) << "a run whose pollers found nothing left the fds";
  }
  r.stop();
}

// With only control fds watched (Reactor::FdUse: a listener, a ring's eventfd), a caller's run
// whose pollers found nothing leaves them too, to every kFdsAfterRuns-th run in a row: an empty poll
// on a context whose connections are all rings makes no system call. A data fd is looked at in
// the first run again, and so is a control fd on a loop without pollers.
TEST(Reactor, ControlFdsWaitAFewRunsEvenWhenThePollersFindNothing) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  CountedFd control;
  ASSERT_TRUE(control.addTo(r, Reactor::FdUse::kControl));
  auto run = [&] {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!r.progressOnce(true) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(100us);
  };
  // No poller yet: the control fd is looked at in the first run (the thread may take it first).
  ASSERT_TRUE(runHereSoon(r, [&] { r.attendUntil(Reactor::Clock::now() + 60s); }));
  std::this_thread::sleep_for(20ms);
  {
    const int before = control.byCaller.load(), thread = control.byThread.load();
    control.signal();
    run();
    if (control.byThread.load() == thread) {
      EXPECT_EQ(control.byCaller.load(), before + 1) << "a loop without pollers left its fds";
    }
  }
  ASSERT_TRUE(r.runSync([&] { r.addPoller([](bool) { return false; }); }).isOk());
  bool checked = false;
  for (int attempt = 1; attempt <= 5 && !checked; ++attempt) {
    std::this_thread::sleep_for(attempt * 20ms);
    // Runs until one looks at the fds, so that the count of runs that left them starts again.
    control.signal();
    const int seen = control.byCaller.load() + control.byThread.load();
    for (int i = 0; i < Reactor::kFdsAfterRuns && control.byCaller.load() + control.byThread.load() == seen;
         ++i)
      run();
    const int before = control.byCaller.load(), thread = control.byThread.load();
    control.signal();
    for (int i = 1; i < Reactor::kFdsAfterRuns; ++i) run();
    const int afterSkipping = control.byCaller.load();
    run();
    const int afterLooking = control.byCaller.load();
    if (control.byThread.load() != thread) continue;  // the thread took it: not attended yet
    EXPECT_EQ(afterSkipping, before) << "an empty run looked at control fds";
    EXPECT_EQ(afterLooking, before + 1) << "control fds waited more than kFdsAfterRuns runs";
    checked = true;
  }
  ASSERT_TRUE(checked) << "the thread woke for an fd while attended, five times";
  // The same fd as data: looked at in the first empty run.
  ASSERT_TRUE(r.runSync([&] { r.setFdUse(control.fd, Reactor::FdUse::kData); }).isOk());
  const int before = control.byCaller.load(), thread = control.byThread.load();
  control.signal();
  run();
  if (control.byThread.load() == thread) {
    EXPECT_EQ(control.byCaller.load(), before + 1) << "a run whose pollers found nothing left a data fd";
  }
  r.stop();
}

// A lease begun in a caller's run (by a poller, as a soft device's poll does) must reach the
// thread, which sleeps on the fds with no timeout: the caller's own look at the fds, right after,
// does not take that wake-up. So when the caller stops, the thread runs the pollers at the lease's
// end (a ring's unannounced frame is taken). Several leases, each from a fresh sleep.
// A run's clock is read once and shared, until the run has done kWorkBeforeNow of work since
// (noteWork): then it is read again, so a long run does not leave it far behind. The next run reads
// it afresh.
TEST(Reactor, TheRunsClockIsReadAgainAfterEnoughWork) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  Reactor::Clock::time_point first, unchanged, belowLimit, afterLimit;
  ASSERT_TRUE(r.runSync([&] {
                 r.noteWork(Reactor::kWorkBeforeNow);  // whatever the run did before: a fresh reading next
                 first = r.runNow();
                 std::this_thread::sleep_for(2ms);
                 unchanged = r.runNow();
                 // With the call's own kWorkPerCall: kWorkBeforeNow - kWorkPerCall, short of it.
                 r.noteWork(Reactor::kWorkBeforeNow - 2 * Reactor::kWorkPerCall);
                 belowLimit = r.runNow();
                 r.noteWork(0);  // kWorkPerCall more: reaches it
                 afterLimit = r.runNow();
               }).isOk());
  EXPECT_EQ(unchanged, first) << "one reading per run";
  EXPECT_EQ(belowLimit, first) << "read again before kWorkBeforeNow of work";
  EXPECT_GE(afterLimit - first, 2ms) << "not read again after kWorkBeforeNow of work";
  Reactor::Clock::time_point next;
  std::this_thread::sleep_for(2ms);
  ASSERT_TRUE(r.runSync([&] { next = r.runNow(); }).isOk());
  EXPECT_GE(next - afterLimit, 2ms) << "a new run kept the last one's reading";
}

// A started reactor watching a counted fd, and an fd of the caller's own to wait on beside it.
class ReactorWait : public ::testing::Test {
 protected:
  using Wait = Reactor::WaitHere;
  void SetUp() override {
    ASSERT_GE(own, 0);
    ASSERT_TRUE(r.start("test-reactor").isOk());
    ASSERT_TRUE(watched.addTo(r));
  }
  void TearDown() override {
    r.stop();
    if (own >= 0) close(own);
  }
  Reactor r;
  CountedFd watched;
  const int own = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
};

// A caller about to sleep on an fd of its own (a completion channel's) sleeps on the loop's fds
// too (waitHere): what they bring, it takes itself, while the thread sleeps on the quiet set.
TEST_F(ReactorWait, AWaitingCallerTakesWhatTheLoopsFdsBringItself) {
  // Waits until something was taken or the own fd is ready; what the last wait said.
  auto waitUntil = [&](auto done) {
    Wait last = Wait::kRefused;
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!done() && std::chrono::steady_clock::now() < until) {
      last = r.waitHere(own, 100, 10s);
      if (last == Wait::kRefused) std::this_thread::sleep_for(100us);
    }
    return last;
  };
  bool checked = false;
  for (int attempt = 1; attempt <= 5 && !checked; ++attempt) {
    const int caller = watched.byCaller.load(), thread = watched.byThread.load();
    std::thread signaler([&] {
      std::this_thread::sleep_for(attempt * 10ms);  // the caller sleeps by then, the thread is quiet
      watched.signal();
    });
    const Wait last =
        waitUntil([&] { return watched.byCaller.load() + watched.byThread.load() > caller + thread; });
    signaler.join();
    if (watched.byThread.load() != thread) continue;  // the thread took it before it went quiet
    EXPECT_EQ(watched.byCaller.load(), caller + 1) << "the waiting caller did not take the fd's event";
    EXPECT_EQ(last, Wait::kReady);
    checked = true;
  }
  ASSERT_TRUE(checked) << "the thread took the event from a waiting caller, five times";
  // Its own fd ready: the wait ends at once, and says so.
  uint64_t one = 1;
  ASSERT_EQ(write(own, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  Wait ownReady = Wait::kRefused;
  for (int i = 0; i < 1000 && ownReady == Wait::kRefused; ++i) ownReady = r.waitHere(own, 10000, 10s);
  EXPECT_EQ(ownReady, Wait::kReady) << "the own fd's readiness did not end the wait";
  uint64_t value;
  ASSERT_EQ(read(own, &value, sizeof value), static_cast<ssize_t>(sizeof value));
  // Nothing ready before the lease's end or the timeout: idle (the caller then sleeps on its own
  // fd alone).
  Wait idle = Wait::kRefused;
  for (int i = 0; i < 1000 && idle == Wait::kRefused; ++i) idle = r.waitHere(own, 20, 10s);
  EXPECT_EQ(idle, Wait::kIdle);
  // Refused inside the loop, and once the reactor is stopped.
  Wait inside = Wait::kReady;
  ASSERT_TRUE(r.runSync([&] { inside = r.waitHere(own, 0, 10s); }).isOk());
  EXPECT_EQ(inside, Wait::kRefused);
  r.stop();
  EXPECT_EQ(r.waitHere(own, 0, 10s), Wait::kRefused);
}

// A wait whose lease ends with nothing ready is idle, however long its timeout, and the thread
// watches the fds again from then on: the next event is its, with no caller left to take it.
TEST_F(ReactorWait, AWaitIdleAtItsLeasesEndLeavesTheFdsToTheThread) {
  // First the thread goes quiet: an event in a waiter's lease wakes it (it sees the lease then),
  // unless the waiter takes it first; after the thread's, the waiter takes the next. On two cores
  // busy with other tests under a sanitizer, five attempts once all went to the thread (the waiter
  // kept from its core past the event): up to fifty, each a few milliseconds when it works.
  for (int i = 0; i < 50 && watched.byCaller.load() == 0; ++i) {
    std::thread signaler([&] {
      std::this_thread::sleep_for(10ms);
      watched.signal();
    });
    const int before = watched.byCaller.load() + watched.byThread.load();
    for (int w = 0; w < 1000 && watched.byCaller.load() + watched.byThread.load() == before; ++w) {
      (void)r.waitHere(own, 1000, 200ms);
    }
    signaler.join();
  }
  ASSERT_GT(watched.byCaller.load(), 0) << "in fifty attempts, the waiting caller never took an event";
  // A wait of 10 s in a lease of 50 ms: idle at the lease's end.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(r.waitHere(own, 10000, 50ms), Wait::kIdle);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "the wait outlived its lease";
  // No caller waits now: the thread takes the next event once the lease is over.
  const int thread = watched.byThread.load();
  watched.signal();
  for (int i = 0; i < 10000 && watched.byThread.load() == thread; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(watched.byThread.load(), thread + 1) << "the thread did not take the fds back";
}

// An fd closed while watched (no removeFd) and its number reused: the new watch replaces the stale
// entry, counted once, and the new callback is the one that runs.
TEST(Reactor, AWatchOfAReusedFdNumberReplacesTheStaleEntry) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  const int first = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(first, 0);
  std::atomic<int> oldRan{0}, newRan{0};
  size_t data = 0;
  ASSERT_TRUE(
      r.runSync([&] { ASSERT_TRUE(r.addFd(first, EPOLLIN, [&](uint32_t) { ++oldRan; }).isOk()); }).isOk());
  close(first);  // the epoll set forgets a closed fd; fds_ still holds it
  const int second = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_EQ(second, first) << "the number was not reused (the test needs it)";
  ASSERT_TRUE(r.runSync([&] {
                 ASSERT_TRUE(r.addFd(second, EPOLLIN, [&](uint32_t) {
                                uint64_t v;
                                if (read(second, &v, sizeof v) == sizeof v) ++newRan;
                              }).isOk());
                 data = r.dataFds();
               }).isOk());
  EXPECT_EQ(data, 1u) << "the stale entry was counted as well";
  uint64_t one = 1;
  ASSERT_EQ(write(second, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  for (int i = 0; i < 10000 && newRan.load() == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(newRan.load(), 1);
  EXPECT_EQ(oldRan.load(), 0);
  ASSERT_TRUE(r.runSync([&] {
                 r.removeFd(second);
                 data = r.dataFds();
               }).isOk());
  EXPECT_EQ(data, 0u);
  r.stop();
  close(second);
}

TEST(Reactor, ALeaseBegunInACallersRunWakesTheThreadItself) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  const auto caller = std::this_thread::get_id();
  std::atomic<int> threadPolls{0};
  std::atomic<bool> begin{false};
  ASSERT_TRUE(r.runSync([&] {
                 r.addPoller([&](bool) {
                   if (std::this_thread::get_id() != caller)
                     ++threadPolls;
                   else if (begin.exchange(false))
                     r.attendUntil(Reactor::Clock::now() + 5ms);
                   return false;
                 });
               }).isOk());
  for (int lease = 0; lease < 20; ++lease) {
    std::this_thread::sleep_for(10ms);  // the last lease over: the thread asleep on the fds, no timeout
    const int before = threadPolls.load();
    begin = true;
    while (begin.load()) {
      if (!r.progressOnce(true)) std::this_thread::sleep_for(100us);
    }
    for (int i = 0; i < 10000 && threadPolls.load() == before; ++i) std::this_thread::sleep_for(1ms);
    ASSERT_GT(threadPolls.load(), before) << "lease " << lease << ": the thread slept past the lease's end";
  }
  r.stop();
}

// A lease that begins and ends while the thread waits for the loop (here a caller holds it; on a
// busy machine the thread may simply not get a core in time) is swept all the same when the thread
// comes: it runs the pollers once, although it never slept while attended.
TEST(Reactor, ALeaseThatEndedBeforeTheThreadCameIsSweptOnce) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  const auto caller = std::this_thread::get_id();
  std::atomic<int> threadPolls{0};
  ASSERT_TRUE(r.runSync([&] {
                 r.addPoller([&](bool) {
                   if (std::this_thread::get_id() != caller) ++threadPolls;
                   return false;
                 });
               }).isOk());
  std::this_thread::sleep_for(20ms);  // the thread asleep on the fds, with no timeout
  ASSERT_TRUE(runHereSoon(r, [&] {
    r.attendUntil(Reactor::Clock::now() + 2ms);  // wakes the thread, which waits for the loop
    std::this_thread::sleep_for(20ms);           // meanwhile the lease ends
  }));
  for (int i = 0; i < 10000 && threadPolls.load() == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(threadPolls.load(), 1) << "the thread did not sweep a lease that ended before it came";
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(threadPolls.load(), 1) << "the thread swept the same lease again";
  r.stop();
}

TEST(Reactor, CallersAreRefusedWhileTheThreadRunsTheLoopAndAfterStop) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  r.post([&entered, released] {
    entered.set_value();
    released.wait();
  });
  ASSERT_EQ(entered.get_future().wait_for(10s), std::future_status::ready);
  bool ran = false;
  EXPECT_FALSE(r.runHere([&] { ran = true; }));
  EXPECT_FALSE(r.progressOnce());
  EXPECT_FALSE(ran);
  release.set_value();
  r.stop();
  EXPECT_FALSE(r.runHere([&] { ran = true; }));
  EXPECT_FALSE(r.progressOnce());
  EXPECT_FALSE(ran);
}

// Events of an fd are taken by whichever thread runs the loop, one run at a time: the callback
// never runs twice at once, and every count written to the eventfd is read exactly once.
TEST(Reactor, CallersAndTheThreadShareTheLoopOneAtATime) {
  Reactor r;
  ASSERT_TRUE(r.start("test-reactor").isOk());
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::atomic<int> inside{0}, overlaps{0}, byCaller{0};
  std::atomic<uint64_t> total{0};
  const auto caller = std::this_thread::get_id();
  ASSERT_TRUE(r.runSync([&] {
                 ASSERT_TRUE(r.addFd(fd, EPOLLIN, [&](uint32_t) {
                                if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
                                if (std::this_thread::get_id() == caller) byCaller.fetch_add(1);
                                uint64_t v = 0;
                                if (::read(fd, &v, sizeof v) == sizeof v) total.fetch_add(v);
                                std::this_thread::sleep_for(5us);
                                inside.fetch_sub(1);
                              }).isOk());
               }).isOk());
  // Each write finds the thread asleep (the pause), so the caller's progressOnce() right after it
  // races the thread's wake-up: both take events, one at a time.
  constexpr uint64_t kWrites = 500;
  for (uint64_t i = 0; i < kWrites; ++i) {
    std::this_thread::sleep_for(200us);
    uint64_t one = 1;
    ASSERT_EQ(::write(fd, &one, sizeof one), static_cast<ssize_t>(sizeof one));
    r.progressOnce();
  }
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (total.load() < kWrites && std::chrono::steady_clock::now() < until) {
    r.progressOnce();
    std::this_thread::sleep_for(100us);
  }
  EXPECT_EQ(total.load(), kWrites);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_GT(byCaller.load(), 0) << "the caller never ran the loop";
  ASSERT_TRUE(r.runSync([&] { r.removeFd(fd); }).isOk());
  r.stop();
  ::close(fd);
}

}  // namespace
}  // namespace ferry
