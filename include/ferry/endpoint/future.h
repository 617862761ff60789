// Futures: the handles an endpoint returns for its asynchronous operations.
//
// A future is a cheap, copyable reference to its operation's own state (a Completion,
// completion.h): copies see the same operation, and a future stays valid after its endpoint is
// gone. Every operation completes
// exactly once, on the thread that observes its last completion (the endpoint's progress thread,
// or the calling thread when nothing was left to wait for): with success, a work-completion error
// (a dead peer gives RETRY_EXC_ERR or WR_FLUSH_ERR, never a hang), kCancelled when the endpoint
// is shut down, or the error that failed the endpoint's connection.
//
// Buffers: the memory an operation reads or writes belongs to the endpoint until wait() returned
// for it (successfully or not); then it may be reused or freed.
//
// Thread safety: any number of threads may wait on the same future at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "ferry/common/completion.h"
#include "ferry/common/status.h"
#include "ferry/endpoint/assignment.h"

namespace ferry::endpoint {

class Future {
 public:
  Future() = default;
  // A future of any completion: an endpoint's operation (OpState), or the work of a layer above
  // (the agent's queued operations and peer states, the connector's operations).
  explicit Future(std::shared_ptr<Completion> op) : op_(std::move(op)) {}

  bool valid() const { return op_ != nullptr; }
  bool done() const { return op_ && op_->done(); }
  // Takes the completions that are there once, on this thread, without blocking, and says whether
  // the operation is done: a poll loop's step (done() alone waits for another thread to take them).
  bool poll() const { return op_ && op_->pollOnce(); }
  // Waits up to `timeout` for the operation: its status when it completed, kTimedOut when it is
  // still running (it goes on; wait again), kInvalidArgument for an empty future.
  Status wait(std::chrono::milliseconds timeout) const;
  // Waits until the operation completes. Every operation does complete (see above), but a recv()
  // or immRecv() waits for the peer to send: prefer the timed form where the peer may stay silent.
  Status wait() const;
  // The status once done; kBusy while running.
  Status status() const { return op_ ? op_->status() : invalidArgument("empty future"); }
  const std::shared_ptr<Completion>& state() const { return op_; }

 protected:
  std::shared_ptr<Completion> op_;
};

// read(), write(), writeWithImm(): done when every byte of the batch is placed (at the peer for
// WRITE, locally for READ).
class ReadWriteFuture : public Future {
 public:
  using Future::Future;
};

// send(): done when the whole message is placed in the peer's receive buffers.
class SendFuture : public Future {
 public:
  using Future::Future;
};

// recv(): done when a whole message is in the scatter list.
class RecvFuture : public Future {
 public:
  using Future::Future;
  // The message's length in bytes (valid once done successfully).
  uint64_t bytes() const { return op_ ? op_->bytes() : 0; }
};

// immRecv(): done when the peer's next WRITE_WITH_IMM (in the order the peer issued them) has
// placed all its data here.
class ImmRecvFuture : public Future {
 public:
  using Future::Future;
  // The immediate value (valid once done successfully).
  uint32_t immData() const { return op_ ? op_->immData() : 0; }
};

}  // namespace ferry::endpoint
