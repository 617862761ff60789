// The owner's transfer: the operation's bytes cut into batches of at most chunk_bytes, posted
// while the window has room, and the operation ended when the last batch landed.

#include "connect/connector_impl.h"

namespace ferry::connect {

Status Connector::Impl::transferFailed(const OpPtr& op, const Status& st) {
  return Status(st.code(), "the transfer " + std::string(op->kind == OperationKind::kRead ? "to" : "from") +
                               " worker '" + op->peerAlias + "' failed: " + st.message());
}

void Connector::Impl::pumpLocked(const OpPtr& op, std::unique_lock<std::mutex>& lock) {
  while (!op->ended && !op->stopping && op->inflight < opts.window &&
         op->cursorDescriptor < op->buffers.size()) {
    std::vector<ep::Assignment> batch;
    uint64_t bytes = 0;
    while (op->cursorDescriptor < op->buffers.size() && bytes < opts.chunkBytes &&
           batch.size() < kMaxPiecesPerBatch) {
      size_t i = op->cursorDescriptor;
      uint64_t n = std::min(op->buffers[i].length - op->cursorOffset, opts.chunkBytes - bytes);
      batch.push_back({.local = op->local[i],
                       .remote = op->remote[i],
                       .localOffset = op->cursorOffset,
                       .remoteOffset = op->cursorOffset,
                       .length = n});
      bytes += n;
      op->cursorOffset += n;
      if (op->cursorOffset == op->buffers[i].length) {
        ++op->cursorDescriptor;
        op->cursorOffset = 0;
      }
    }
    // A readable's owner writes its bytes into the reader's buffers; a writable's reads the
    // writer's into its own.
    auto f = op->kind == OperationKind::kRead ? op->endpoint->write(batch) : op->endpoint->read(batch);
    if (!f.isOk()) {
      lock.unlock();
      finish(op, OperationStatus::kErrored, transferFailed(op, f.status()));
      lock.lock();
      return;
    }
    ++op->inflight;
    std::weak_ptr<Impl> weak = weak_from_this();
    f->state()->onDone([weak, op, bytes](const Completion& d) {
      Status st = d.status();
      if (auto self = weak.lock())
        self->agent->post([weak, op, bytes, st] {
          if (auto s = weak.lock()) s->batchDone(op, bytes, st);
        });
    });
  }
  if (!op->ended && op->inflight == 0 && (op->stopping || op->cursorDescriptor == op->buffers.size())) {
    bool stopped = op->stopping, byPeer = op->peerCancelled;
    Status why = op->stopReason;
    if (!stopped) stats.bytesMoved += op->total;
    lock.unlock();
    if (!stopped) {
      finish(op, OperationStatus::kComplete, Status::ok());
    } else if (byPeer) {
      finish(op, OperationStatus::kErrored, why);  // the peer's CANCEL
    } else {
      cv.notify_all();  // our own cancel() waits for this, then finishes the operation
    }
    lock.lock();
  }
}

void Connector::Impl::batchDone(const OpPtr& op, uint64_t bytes, const Status& st) {
  std::unique_lock<std::mutex> lock(mu);
  --op->inflight;
  if (op->ended) {
    lock.unlock();
    cv.notify_all();
    return;
  }
  if (!st.isOk()) {
    lock.unlock();
    finish(op, OperationStatus::kErrored, transferFailed(op, st));
    return;
  }
  op->bytes += bytes;
  pumpLocked(op, lock);
}

}  // namespace ferry::connect
