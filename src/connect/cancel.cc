// Cancelling an operation: an owner stops its own batches and lets those in flight land; a reader
// or writer asks the owner to stop (CANCEL) and waits for it up to cancel_grace.

#include "connect/connector_impl.h"

namespace ferry::connect {

void Connector::Impl::cancel(const OpPtr& op) {
  std::unique_lock<std::mutex> lock(mu);
  if (op->ended) return;
  auto deadline = Clock::now() + opts.cancelGrace;
  bool mayWait = !agent->onAgentThread();
  if (op->passive) {
    if (op->status == OperationStatus::kInProgress) {
      // Stop our own batches, and let those in flight land (they are ours: they end promptly).
      op->stopping = true;
      op->stopReason = Status(StatusCode::kCancelled, "cancelled");
      if (mayWait) cv.wait_until(lock, deadline, [&] { return op->inflight == 0 || op->ended; });
    }
  } else if (op->beginSent) {
    // Ask the owner to stop moving bytes into or out of our buffers, and wait for it a while.
    op->cancelling = true;
    Message cancel = messageOf(MessageType::kCancel, op->id);
    cancel.operation = op->metadata.operation;
    auto peer = op->peer;
    lock.unlock();
    (void)peer->sendMessage(kChannel, encodeMessage(cancel));
    lock.lock();
    if (mayWait) cv.wait_until(lock, deadline, [&] { return op->ownerStopped || op->ended; });
    op->ownerStopped = true;  // no second CANCEL from finish()
  }
  lock.unlock();
  finish(op, OperationStatus::kCancelled,
         Status(StatusCode::kCancelled,
                std::string("the ") +
                    (op->passive ? (op->kind == OperationKind::kRead ? "readable" : "writable")
                                 : kindVerb(op->kind)) +
                    " operation was cancelled"));
}

}  // namespace ferry::connect
