// Completion (ferry/common/completion.h): the one primitive behind every layer's futures.
#include "ferry/common/completion.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace ferry {
namespace {

using namespace std::chrono_literals;

TEST(Completion, TheFirstCompleteWinsAndLaterOnesChangeNothing) {
  Completion c;
  EXPECT_FALSE(c.done());
  EXPECT_EQ(c.status().code(), StatusCode::kBusy);
  EXPECT_TRUE(c.complete(Status::ok(), 7, 4096));
  EXPECT_FALSE(c.complete(Status(StatusCode::kCancelled, "late"), 9, 1));
  EXPECT_TRUE(c.done());
  EXPECT_TRUE(c.status().isOk());
  EXPECT_EQ(c.immData(), 7u);
  EXPECT_EQ(c.bytes(), 4096u);
}

TEST(Completion, AWaitThatEndsFirstSaysTimedOutAndTheWorkGoesOn) {
  Completion c;
  Status st = c.waitUntil(Completion::Clock::now() + 20ms);
  EXPECT_EQ(st.code(), StatusCode::kTimedOut);
  EXPECT_FALSE(c.done());
  c.complete(Status(StatusCode::kPeerGone, "the peer left"));
  EXPECT_EQ(c.waitUntil(Completion::Clock::now()).code(), StatusCode::kPeerGone);
}

TEST(Completion, WaitersOnOtherThreadsWakeWithTheStatus) {
  Completion c;
  std::vector<std::thread> waiters;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      if (c.waitUntil(Completion::Clock::now() + 10s).isOk()) ok.fetch_add(1);
    });
  }
  std::this_thread::sleep_for(10ms);
  c.complete(Status::ok());
  for (auto& t : waiters) t.join();
  EXPECT_EQ(ok.load(), 4);
}

TEST(Completion, CallbacksRunOnceOnTheCompletingThreadOrAtOnceWhenDone) {
  Completion c;
  std::thread::id ranOn;
  int runs = 0;
  c.onDone([&](const Completion& done) {
    ++runs;
    ranOn = std::this_thread::get_id();
    EXPECT_TRUE(done.done());  // the state is final when callbacks run
    EXPECT_EQ(done.bytes(), 12u);
  });
  std::thread completer([&] { c.complete(Status::ok(), 0, 12); });
  const std::thread::id completerId = completer.get_id();
  completer.join();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(ranOn, completerId);

  bool late = false;
  c.onDone([&](const Completion&) { late = true; });
  EXPECT_TRUE(late);  // registered after completion: ran before onDone returned
  c.complete(Status::ok());
  EXPECT_EQ(runs, 1);
}

// A progressor that completes its work on the n-th progressOnce() and counts the calls it gets.
class CountingProgressor : public Progressor {
 public:
  explicit CountingProgressor(Completion& work, int completeAt) : work_(work), completeAt_(completeAt) {}
  void progressOnce() override {
    if (++polls == completeAt_) work_.complete(Status::ok());
  }
  void pollBegins() override { ++pollers; }
  void pollEnds(bool) override { --pollers; }
  void watchBegins(bool) override { ++watchers; }
  void watchEnds() override { --watchers; }

  int polls = 0;
  std::atomic<int> pollers{0};
  std::atomic<int> watchers{0};

 private:
  Completion& work_;
  const int completeAt_;
};

TEST(Completion, AWaiterPollsItsProgressorAndNeedsNoOtherThread) {
  auto c = std::make_shared<Completion>();
  auto progressor = std::make_shared<CountingProgressor>(*c, 3);
  c->setProgressor(progressor);
  EXPECT_FALSE(c->pollOnce());
  EXPECT_EQ(progressor->polls, 1);
  EXPECT_TRUE(c->waitUntil(Completion::Clock::now() + 10s).isOk());
  EXPECT_EQ(progressor->polls, 3);
  EXPECT_EQ(progressor->pollers.load(), 0);   // every pollBegins had its pollEnds
  EXPECT_EQ(progressor->watchers.load(), 0);  // it never slept
  EXPECT_TRUE(c->pollOnce());
  EXPECT_EQ(progressor->polls, 3);  // nothing polled once done
}

TEST(Completion, ACallbackOrASleepingWaiterIsWatchedUntilTheEnd) {
  auto c = std::make_shared<Completion>();
  auto progressor = std::make_shared<CountingProgressor>(*c, -1);  // never completes it
  c->setProgressor(progressor);
  c->onDone([](const Completion&) {});
  EXPECT_EQ(progressor->watchers.load(), 1);
  c->onDone([](const Completion&) {});
  EXPECT_EQ(progressor->watchers.load(), 1);  // one watch per completion
  EXPECT_EQ(c->waitUntil(Completion::Clock::now() + 5ms).code(), StatusCode::kTimedOut);
  EXPECT_EQ(progressor->watchers.load(), 1);  // the sleeper's watch ended with its wait
  c->complete(Status::ok());
  EXPECT_EQ(progressor->watchers.load(), 0);

  // Dropped while watched: the watch ends with it.
  auto dropped = std::make_shared<Completion>();
  dropped->setProgressor(progressor);
  dropped->onDone([](const Completion&) {});
  EXPECT_EQ(progressor->watchers.load(), 1);
  dropped.reset();
  EXPECT_EQ(progressor->watchers.load(), 0);
}

}  // namespace
}  // namespace ferry
