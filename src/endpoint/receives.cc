// Messages and immediates arriving: receive buffers kept posted on every queue pair, fragments
// matched to their recv() in order or kept aside until it comes (copied up to maxUnexpectedBytes,
// beyond that held in their buffers), and write_with_imm's immediates matched across the queue
// pairs and handed to immRecv() once each.
#include <algorithm>
#include <cstring>

#include "common/cuda_driver.h"
#include "endpoint/endpoint_internal.h"
#include "endpoint/endpoint_qp.h"

namespace ferry::endpoint {
namespace {

namespace v = ferry::verbs;

Status protocolError(const std::string& what) { return Status(StatusCode::kProtocolError, what); }

}  // namespace

Result<RecvFuture> EndpointImpl::recv(std::span<const Chunk> chunks) {
  FERRY_ASSIGN_OR_RETURN(auto op, resolvePieces(OpKind::kRecv, chunks));
  std::shared_ptr<Worker> worker;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kShutdown || state_ == State::kFailed) return notUsableLocked();
    op->messageSeq = recvSeq_++;
    auto in = incoming_.find(op->messageSeq);
    if (in != incoming_.end()) {
      // The message (or its start) came first: hand it over and give its receive buffers back.
      for (Fragment& f : in->second.fragments) {
        if (f.buffer >= 0) {
          copyIntoRecvLocked(*op, recvSlab_.get() + uint64_t(f.buffer) * options_.recvBufferSize, f.length);
          repostLocked(static_cast<uint32_t>(f.buffer));
        } else {
          copyIntoRecvLocked(*op, f.copy.data(), f.length);
          unexpectedBytes_ -= f.copy.size();
        }
      }
      bool complete = in->second.complete;
      incoming_.erase(in);
      if (complete) {
        finishRecvLocked(op);
        return RecvFuture(std::move(op));
      }
    }
    recvWaiting_[op->messageSeq] = op;
    bool had = wantsProbe();
    updateProbeLocked();
    if (!had && wantsProbe()) worker = worker_;
  }
  if (worker) worker->wake();
  return RecvFuture(std::move(op));
}

Result<ImmRecvFuture> EndpointImpl::immRecv() {
  auto op = newOp(OpKind::kImmRecv);
  std::shared_ptr<Worker> worker;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kShutdown || state_ == State::kFailed) return notUsableLocked();
    if (!immArrived_.empty()) {
      op->complete(Status::ok(), immArrived_.front());
      immArrived_.pop_front();
      return ImmRecvFuture(std::move(op));
    }
    immWaiting_.push_back(op);
    bool had = wantsProbe();
    updateProbeLocked();
    if (!had && wantsProbe()) worker = worker_;
  }
  if (worker) worker->wake();
  return ImmRecvFuture(std::move(op));
}

void EndpointImpl::handleRecvCompletionLocked(EndpointQp& qp, const v::WorkCompletion& wc) {
  const uint32_t buffer = static_cast<uint32_t>(wc.wrId & 0xffffffffu);
  if (qp.receivesPosted > 0) --qp.receivesPosted;
  if (state_ != State::kConnected) return;  // flushed receives of a failed endpoint
  if (wc.status != v::WcStatus::kSuccess) {
    failLocked(workCompletionStatus(wc, qp.index, failure_, options_.transportFailureIsPeerGone));
    return;
  }
  peerSeen_ = true;
  if (wc.opcode == v::WcOpcode::kRecvRdmaWithImm) {
    qp.immediates.push_back(wc.immData);
    repostLocked(buffer);
    matchImmediatesLocked();
    return;
  }
  if (wc.opcode != v::WcOpcode::kRecv || !(wc.wcFlags & v::wc_flags::kWithImm)) {
    failLocked(protocolError("the peer sent a message without ferry's fragment header (queue pair " +
                             std::to_string(qp.index) + ")"));
    return;
  }
  const uint32_t seq31 = wc.immData & kMessageSeqMask;
  if (seq31 != (qp.nextMessage & kMessageSeqMask) || wc.byteLen > options_.recvBufferSize) {
    failLocked(protocolError("message fragment out of order or oversized on queue pair " +
                             std::to_string(qp.index)));
    return;
  }
  const uint64_t seq = qp.nextMessage;
  const bool last = (wc.immData & kLastFragment) != 0;
  if (last) qp.nextMessage += qps_.size();
  deliverFragmentLocked(seq, last, recvSlab_.get() + uint64_t{buffer} * options_.recvBufferSize, wc.byteLen,
                        buffer);
}

void EndpointImpl::deliverFragmentLocked(uint64_t seq, bool last, const uint8_t* data, uint32_t length,
                                         uint32_t buffer) {
  auto waiting = recvWaiting_.find(seq);
  if (waiting != recvWaiting_.end()) {
    copyIntoRecvLocked(*waiting->second, data, length);
    repostLocked(buffer);
    if (last) {
      std::shared_ptr<OpState> op = std::move(waiting->second);
      recvWaiting_.erase(waiting);
      finishRecvLocked(op);
    }
    return;
  }
  // Ahead of its recv(): copy it aside while that stays within bounds, else keep the receive
  // buffer (the peer then slows down until a recv() takes the message).
  IncomingMessage& message = incoming_[seq];
  Fragment f;
  f.length = length;
  if (unexpectedBytes_ + length <= options_.maxUnexpectedBytes) {
    f.copy.assign(data, data + length);
    unexpectedBytes_ += length;
    repostLocked(buffer);
  } else {
    f.buffer = buffer;
  }
  message.fragments.push_back(std::move(f));
  if (last) message.complete = true;
}

void EndpointImpl::copyIntoRecvLocked(OpState& op, const uint8_t* data, uint64_t length) {
  op.movedBytes += length;
  while (length > 0 && op.nextPiece < op.pieces.size()) {
    const MessagePiece& p = op.pieces[op.nextPiece];
    const uint64_t take = std::min(length, p.length - op.pieceOffset);
    {
      // The copy bypasses the device: make sure the region is still registered (and stays so).
      auto pin = pool_->pinRegion(p.mr, p.lkey);
      if (!pin.owns_lock()) {
        if (op.firstError.isOk()) {
          op.firstError =
              Status(StatusCode::kNotFound, "recv: the receive region was unregistered while waiting");
        }
        op.nextPiece = op.pieces.size();
        return;
      }
      void* at = reinterpret_cast<void*>(p.addr + op.pieceOffset);
      if (!p.location.onDevice()) {
        std::memcpy(at, data, take);
      } else if (Status copied = cuda::copy(at, p.location, data, MemoryLocation{}, take); !copied.isOk()) {
        if (op.firstError.isOk()) op.firstError = Status(copied.code(), "recv: " + copied.message());
        op.nextPiece = op.pieces.size();
        return;
      }
    }
    data += take;
    length -= take;
    op.pieceOffset += take;
    if (op.pieceOffset == p.length) {
      ++op.nextPiece;
      op.pieceOffset = 0;
    }
  }
  if (length > 0) op.overflow = true;
}

void EndpointImpl::finishRecvLocked(const std::shared_ptr<OpState>& op) {
  if (!op->firstError.isOk()) {
    op->complete(op->firstError);
  } else if (op->overflow) {
    op->complete(invalidArgument("recv: the message is " + std::to_string(op->movedBytes) +
                                 " bytes, longer than the receive buffer (" + std::to_string(op->totalBytes) +
                                 " bytes); only the first " + std::to_string(op->totalBytes) +
                                 " bytes were written"));
  } else {
    op->complete(Status::ok(), 0, op->movedBytes);
  }
  std::vector<MessagePiece>().swap(op->pieces);
}

void EndpointImpl::matchImmediatesLocked() {
  for (;;) {
    for (const auto& qp : qps_) {
      if (qp->immediates.empty()) return;
    }
    const uint32_t value = qps_.front()->immediates.front();
    bool same = true;
    for (auto& qp : qps_) {
      same = same && qp->immediates.front() == value;
      qp->immediates.pop_front();
    }
    if (!same) {
      failLocked(protocolError("the immediates of one write_with_imm differ between queue pairs"));
      return;
    }
    if (!immWaiting_.empty()) {
      std::shared_ptr<OpState> op = std::move(immWaiting_.front());
      immWaiting_.pop_front();
      op->complete(Status::ok(), value);
    } else {
      immArrived_.push_back(value);
    }
  }
}

void EndpointImpl::repostLocked(uint32_t buffer) {
  if (state_ == State::kShutdown || state_ == State::kFailed) return;
  EndpointQp& qp = *qps_[buffer / options_.recvDepth];
  v::Sge sge{.addr = reinterpret_cast<uint64_t>(recvSlab_.get()) + uint64_t{buffer} * options_.recvBufferSize,
             .length = options_.recvBufferSize,
             .lkey = recvMr_.lkey()};
  v::RecvWr wr{.wrId = kRecvWrFlag | buffer, .sgList = std::span<const v::Sge>(&sge, 1)};
  Status st = qp.queuePair.postRecv(wr);
  if (!st.isOk()) {
    failLocked(Status(
        st.code(), "posting a receive to queue pair " + std::to_string(qp.index) + " failed: " + st.message(),
        st.cause()));
    return;
  }
  ++qp.receivesPosted;
}

}  // namespace ferry::endpoint
