// Posting (under the endpoint's lock): the queued operations, in order, cut into work requests
// (ranges split and striped over the queue pairs, messages cut into fragments, an immediate after
// every queue pair's share), at most sendDepth outstanding per queue pair, and posted in batches.
#include <algorithm>

#include "endpoint/endpoint_internal.h"
#include "endpoint/endpoint_qp.h"

namespace ferry::endpoint {
namespace {

namespace v = ferry::verbs;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Posting

int EndpointImpl::pickQpLocked() {
  const size_t n = qps_.size();
  for (size_t k = 0; k < n; ++k) {
    size_t i = (rr_ + k) % n;
    if (qps_[i]->outstanding < options_.sendDepth) {
      rr_ = i + 1;
      return static_cast<int>(i);
    }
  }
  return -1;
}

bool EndpointImpl::postTransfersLocked(OpState& op, const std::shared_ptr<OpState>& ref) {
  const size_t n = qps_.size();
  const v::WrOpcode opcode = op.kind() == OpKind::kRead ? v::WrOpcode::kRdmaRead : v::WrOpcode::kRdmaWrite;
  while (op.nextTransfer < op.transfers.size()) {
    const Transfer& t = op.transfers[op.nextTransfer];
    // One range: pieces of at most maxWorkRequestBytes; with several queue pairs, about an equal
    // share each, but no smaller than minStripeBytes.
    uint64_t piece = t.length;
    if (n > 1) piece = std::max(options_.minStripeBytes, (t.length + n - 1) / n);
    piece = std::min(piece, options_.maxWorkRequestBytes);
    const uint64_t len = std::min(piece, t.length - op.transferOffset);
    const int qi = pickQpLocked();
    if (qi < 0) return false;
    EndpointQp& qp = *qps_[qi];
    v::Sge sge{.addr = t.localAddr + op.transferOffset, .length = static_cast<uint32_t>(len), .lkey = t.lkey};
    v::SendWr wr;
    wr.wrId = qp.nextSeq;
    wr.opcode = opcode;
    wr.rdma = {.remoteAddr = t.remoteAddr + op.transferOffset, .rkey = t.rkey};
    qp.append(wr, std::span<const v::Sge>(&sge, 1));
    qp.inflight.push_back({qp.nextSeq++, ref});
    ++qp.outstanding;
    ++op.wrsInFlight;
    qp.bytes += len;
    op.transferOffset += len;
    if (op.transferOffset == t.length) {
      ++op.nextTransfer;
      op.transferOffset = 0;
    }
  }
  if (op.kind() == OpKind::kWriteWithImm) {
    // The immediate goes on every queue pair after that pair's share of the data: RC order per
    // pair means the peer sees it only once all the data is in place. It matches them up again.
    while (op.markersPosted < n) {
      EndpointQp& qp = *qps_[op.markersPosted];
      if (qp.outstanding >= options_.sendDepth) return false;
      v::SendWr wr;
      wr.wrId = qp.nextSeq;
      wr.opcode = v::WrOpcode::kRdmaWriteWithImm;
      wr.immData = op.imm;
      qp.append(wr, {});
      qp.inflight.push_back({qp.nextSeq++, ref});
      ++qp.outstanding;
      ++op.wrsInFlight;
      ++op.markersPosted;
    }
  }
  return true;
}

bool EndpointImpl::postMessageLocked(OpState& op, const std::shared_ptr<OpState>& ref) {
  EndpointQp& qp = *qps_[op.messageSeq % qps_.size()];
  const uint64_t fragment = peerRecvBufferSize_;
  bool first = op.movedBytes == 0 && op.wrsInFlight == 0;
  while (first || op.movedBytes < op.totalBytes) {
    first = false;
    if (qp.outstanding >= options_.sendDepth) return false;
    v::Sge list[kMaxSendSge];
    uint32_t count = 0;
    uint64_t bytes = 0;
    while (op.nextPiece < op.pieces.size() && bytes < fragment && count < maxSendSge_) {
      const MessagePiece& p = op.pieces[op.nextPiece];
      uint64_t take = std::min(p.length - op.pieceOffset, fragment - bytes);
      list[count++] =
          v::Sge{.addr = p.addr + op.pieceOffset, .length = static_cast<uint32_t>(take), .lkey = p.lkey};
      bytes += take;
      op.pieceOffset += take;
      if (op.pieceOffset == p.length) {
        ++op.nextPiece;
        op.pieceOffset = 0;
      }
    }
    op.movedBytes += bytes;
    const bool last = op.movedBytes == op.totalBytes;
    v::SendWr wr;
    wr.wrId = qp.nextSeq;
    wr.opcode = v::WrOpcode::kSendWithImm;
    wr.immData = static_cast<uint32_t>(op.messageSeq & kMessageSeqMask) | (last ? kLastFragment : 0);
    qp.append(wr, std::span<const v::Sge>(list, count));
    qp.inflight.push_back({qp.nextSeq++, ref});
    ++qp.outstanding;
    ++op.wrsInFlight;
    qp.bytes += bytes;
    if (last) break;
  }
  return true;
}

void EndpointImpl::pumpLocked() {
  while (!queue_.empty() && state_ == State::kConnected) {
    std::shared_ptr<OpState> op = queue_.front();
    bool finished = op->kind() == OpKind::kSend ? postMessageLocked(*op, op) : postTransfersLocked(*op, op);
    if (!finished) break;
    op->allPosted = true;
    // The resolved ranges are not needed any more: a large batch gives its memory back now.
    std::vector<Transfer>().swap(op->transfers);
    std::vector<MessagePiece>().swap(op->pieces);
    queue_.pop_front();
    finishIfDoneLocked(op);
  }
  flushLocked();
}

void EndpointImpl::flushLocked() {
  for (auto& qpPtr : qps_) {
    EndpointQp& qp = *qpPtr;
    if (qp.batch.empty()) continue;
    for (size_t i = 0; i < qp.batch.size(); ++i) {
      if (++qp.sinceSignal >= kSignalEvery || i + 1 == qp.batch.size()) {
        qp.batch[i].sendFlags |= v::send_flags::kSignaled;
        qp.sinceSignal = 0;
      }
    }
    qp.maxOutstanding = std::max(qp.maxOutstanding, qp.outstanding);
    size_t bad = qp.batch.size();
    Status st = qp.queuePair.postSend(qp.batch, &bad);
    if (st.isOk()) {
      qp.workRequests += qp.batch.size();
    } else {
      // What was not posted will never complete: take it back and fail its operations. What was
      // posted completes (flushed) once failLocked() moved the queue pairs to ERR.
      size_t posted = std::min(bad, qp.batch.size());
      qp.workRequests += posted;
      Status why(st.code(), "posting to queue pair " + std::to_string(qp.index) + " failed: " + st.message(),
                 st.cause());
      std::vector<std::shared_ptr<OpState>> touched;
      for (size_t k = posted; k < qp.batch.size(); ++k) {
        EndpointQp::Record rec = std::move(qp.inflight.back());
        qp.inflight.pop_back();
        --qp.outstanding;
        if (rec.op) {
          --rec.op->wrsInFlight;
          if (rec.op->firstError.isOk()) rec.op->firstError = why;
          touched.push_back(std::move(rec.op));
        }
      }
      qp.batch.clear();
      qp.sges.clear();
      failLocked(why);
      for (auto& op : touched) finishIfDoneLocked(op);
      continue;
    }
    qp.batch.clear();
    qp.sges.clear();
  }
}

void EndpointImpl::finishIfDoneLocked(const std::shared_ptr<OpState>& op) {
  if (!op->allPosted || op->wrsInFlight != 0 || op->done()) return;
  op->complete(op->firstError, 0, op->firstError.isOk() ? op->totalBytes : 0);
}

}  // namespace ferry::endpoint
