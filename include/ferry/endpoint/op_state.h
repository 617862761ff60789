// OpState: the state of one operation of an endpoint, shared by the endpoint and the operation's
// futures. Internal to the endpoint layer: users see it only through a Future (future.h).
//
// Every operation has its own OpState (never a slot reused by a counter), so a late completion can
// only ever reach the operation it belongs to. It completes exactly once: with success, an error,
// a cancellation or a failure of the connection.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "ferry/common/metrics.h"
#include "ferry/common/status.h"
#include "ferry/endpoint/assignment.h"

namespace ferry::endpoint {

// A resolved range of a one-sided transfer: addresses and keys, checked against both regions.
struct Transfer {
  uint64_t localAddr = 0;
  uint64_t remoteAddr = 0;
  uint64_t length = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

// A resolved piece of a message (a send's gather list or a recv's scatter list).
struct MessagePiece {
  MrHandle mr = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t lkey = 0;
};

// Who can progress operations from the thread that waits for one (the endpoint): a waiter polls
// for a short while (FERRY_WAIT_SPIN_US) before it sleeps, so a completion that is already there,
// or comes within that time, costs no thread wake-up.
class Progressor {
 public:
  virtual ~Progressor() = default;
  // Takes the completions there are, without blocking (nothing when another thread is at it).
  virtual void progressOnce() = 0;

  // A waiter polls through progressOnce() from pollBegins() to pollEnds(). While one polls, and
  // for FERRY_WAIT_LEASE_US after one stopped with its operation done, the progressor may leave
  // its completions to the pollers instead of waking a thread of its own for each of them.
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

class OpState {
 public:
  using Clock = std::chrono::steady_clock;

  explicit OpState(OpKind kind) : kind_(kind) {}
  ~OpState();
  OpState(const OpState&) = delete;
  OpState& operator=(const OpState&) = delete;

  OpKind kind() const { return kind_; }
  bool done() const { return done_.load(std::memory_order_acquire); }
  // One progressOnce() of the progressor, as a polling waiter (pollBegins/pollEnds), unless the
  // operation is done already; returns done().
  bool pollOnce() const;

  // Completes the operation; the first call wins and wakes every waiter, later calls change
  // nothing. Returns whether this call completed it.
  bool complete(Status status, uint32_t immData = 0, uint64_t bytes = 0);

  // Runs cb once the operation is done: at once (on the calling thread) when it is done already,
  // else on the thread that completes it, after the waiters were woken. For layers that hand out
  // a future of their own before the operation they wrap exists (the agent's queued operations).
  // cb must not block; it may complete other operations.
  using DoneCb = std::function<void(const OpState&)>;
  void onDone(DoneCb cb);

  // Records the operation in these metrics when it completes (kind, status, bytes, the time from
  // this call to completion). Set once, by the endpoint that creates the operation.
  void track(std::shared_ptr<Metrics> endpoint, std::shared_ptr<Metrics> context);

  // Waits until done or the deadline; the operation's status when done, else kTimedOut. With a
  // progressor, polls through it first (FERRY_WAIT_SPIN_US), then sleeps.
  Status waitUntil(Clock::time_point deadline) const;
  // Set by the endpoint before the operation is handed out.
  void setProgressor(std::weak_ptr<Progressor> progressor) { progressor_ = std::move(progressor); }
  // The status once done (kBusy while still running).
  Status status() const;
  uint32_t immData() const;
  uint64_t bytes() const;

  // ---- Progress state: owned by the endpoint, touched only under its lock. ----
  std::vector<Transfer> transfers;  // READ / WRITE / WRITE_WITH_IMM
  size_t nextTransfer = 0;
  uint64_t transferOffset = 0;       // bytes of transfers[nextTransfer] already posted
  std::vector<MessagePiece> pieces;  // send: gather list; recv: scatter list
  size_t nextPiece = 0;
  uint64_t pieceOffset = 0;
  uint64_t totalBytes = 0;   // send: message length; recv: room of the scatter list
  uint64_t movedBytes = 0;   // send: bytes posted; recv: bytes received so far
  uint32_t imm = 0;          // WRITE_WITH_IMM: the immediate to deliver
  size_t markersPosted = 0;  // WRITE_WITH_IMM: lanes that carry the immediate already
  uint64_t messageSeq = 0;   // send / recv: the message's number
  uint64_t wrsInFlight = 0;  // work requests posted and not completed yet
  bool allPosted = false;
  bool overflow = false;  // recv: the message was longer than the scatter list
  Status firstError;

 private:
  const OpKind kind_;
  std::shared_ptr<Metrics> metrics_[2];
  std::weak_ptr<Progressor> progressor_;
  bool watched_ = false;  // under mu_: the progressor was told that a callback waits (watchBegins)
  Clock::time_point started_{};
  std::atomic<bool> done_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Status status_;
  std::vector<DoneCb> doneCbs_;
  uint32_t immData_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace ferry::endpoint
