// Completion: the end of one asynchronous piece of work, as every layer hands it out. It completes
// exactly once (with success or an error), wakes every waiter, then runs the callbacks registered
// with onDone(). The endpoint's operations (src/endpoint/op_state.h), the agent's queued operations and peer
// states, and the connector's operations are all completions; their futures hold one.
//
// Progress: a completion may name a Progressor, the object that takes the completions of the work
// it waits for (the endpoint). Then a waiter polls through it for a while before it sleeps
// (FERRY_WAIT_SPIN_US), so a completion that is already there, or comes within that time, costs
// no thread wake-up. docs/threading.md says how this lease composes with the soft provider's.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "ferry/common/status.h"

namespace ferry {

// Who can progress work from the thread that waits for it.
class Progressor {
 public:
  virtual ~Progressor() = default;
  // Takes the completions there are, without blocking (nothing when another thread is at it).
  virtual void progressOnce() = 0;

  // A waiter polls through progressOnce() from pollBegins() to pollEnds(). While one polls, and
  // for FERRY_WAIT_LEASE_US after one stopped with its work done, the progressor may leave its
  // completions to the pollers instead of waking a thread of its own for each of them.
  virtual void pollBegins() {}
  virtual void pollEnds(bool operationDone) { (void)operationDone; }
  // Someone waits for a completion without polling (a waiter that sleeps, a callback of
  // onDone()): from watchBegins() to watchEnds() the progressor's own thread takes every
  // completion at once. `mayBlock`: the caller holds no lock, so the progressor may wait for its
  // own and hand its completions to its thread before returning; otherwise that happens at the
  // pollers' next progressOnce(), or at the end of the lease at the latest.
  virtual void watchBegins(bool mayBlock) { (void)mayBlock; }
  virtual void watchEnds() {}
};

class Completion {
 public:
  using Clock = std::chrono::steady_clock;

  Completion() = default;
  virtual ~Completion();
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;

  bool done() const { return done_.load(std::memory_order_acquire); }
  // One progressOnce() of the progressor, as a polling waiter (pollBegins/pollEnds), unless the
  // work is done already; returns done().
  bool pollOnce() const;

  // Completes the work with its status and results (the bytes it moved, an immediate value it
  // received); the first call wins and wakes every waiter, later calls change nothing. Returns
  // whether this call completed it.
  bool complete(Status status, uint32_t immData = 0, uint64_t bytes = 0);

  // Runs cb once the work is done: at once (on the calling thread) when it is done already, else
  // on the thread that completes it, after the waiters were woken. cb must not block; it may
  // complete other work.
  using DoneCb = std::function<void(const Completion&)>;
  void onDone(DoneCb cb);

  // Waits until done or the deadline: the status when done, else kTimedOut. With a progressor,
  // polls through it first (FERRY_WAIT_SPIN_US), then sleeps.
  Status waitUntil(Clock::time_point deadline) const;
  // Set before the completion is handed out.
  void setProgressor(std::weak_ptr<Progressor> progressor) { progressor_ = std::move(progressor); }

  // The status once done (kBusy while still running), and the results complete() was given.
  Status status() const;
  uint32_t immData() const;
  uint64_t bytes() const;

 protected:
  // Called once, by the call of complete() that wins, before waiters wake, with the final status
  // and bytes (for the records of a subclass; no lock is held).
  virtual void completed(const Status& status, uint64_t bytes) {
    (void)status;
    (void)bytes;
  }

 private:
  std::weak_ptr<Progressor> progressor_;
  bool watched_ = false;  // under mu_: the progressor was told that a callback waits (watchBegins)
  std::atomic<bool> done_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Status status_;
  std::vector<DoneCb> doneCbs_;
  uint32_t immData_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace ferry
