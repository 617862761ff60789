// RcResponder: hellos, requests from the peer checked at access time and carried out,
// acknowledgements and NAKs, the stripe's pieces (reactor thread).
#include "providers/soft/rc_responder.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "common/device_access.h"
#include "common/log.h"
#include "ferry/common/config.h"
#include "providers/soft/qp_internal.h"
#include "providers/soft/region_copy.h"
#include "verbs/qp_state.h"

namespace ferry::soft {

using namespace qp_detail;

RcResponder::RcResponder(QpCore& qp) : qp_(qp), ctx_(qp.ctx()) {}

// ---------------------------------------------------------------------------------------------
// The QP's state changes.

void RcResponder::startFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  expectedSeq_ = attr().rqPsn;
  nakPending_ = false;
}

void RcResponder::stopAfterErrorFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  stripe_.drop(/*afterFlush=*/true);
  if (conn_) conn_->closeAfterFlush(/*drain=*/true);  // a queued NAK still reaches the peer
}

void RcResponder::flushRecvsFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  std::deque<RecvWqe> flushed = qp_.takeAllRecvs();
  if (curRecv_) {
    flushed.push_front(std::move(*curRecv_));
    curRecv_.reset();
  }
  for (auto& r : flushed)
    qp_.pushRecvCompletion(r, WcStatus::kWrFlushErr, WcOpcode::kRecv, 0, std::nullopt, false);
}

void RcResponder::resetFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  if (conn_) conn_->close(Status::ok(), true);
  stripe_.drop(/*afterFlush=*/false);
  conn_.reset();
  nakPending_ = false;
  skip_ = false;
  ackNeeded_ = false;
  curRecv_.reset();
}

// ---------------------------------------------------------------------------------------------
// Hellos, and the connection's frames.

wire::HelloResult RcResponder::helloFromOurPeer(const wire::FrameHeader& hello, in_addr_t peerIp) {
  QpState state = qp_.state();
  // A QP on its way to RTR is not ready yet (its owner may still be setting it up: the peer tries
  // again, as a NIC retries one that drops its packets); a closed one, or one in ERR, is gone.
  if (!qp_.closed() && (state == QpState::kReset || state == QpState::kInit))
    return wire::HelloResult::kNotReady;
  if (qp_.closed() || (state != QpState::kRtr && state != QpState::kRts)) return wire::HelloResult::kNoSuchQp;
  in_addr_t ip;
  uint16_t port;
  verbs::Gid src;
  src.raw = hello.srcGid;
  if (!parseSoftGid(src, &ip, &port) || ip != peerIp) return wire::HelloResult::kMismatch;
  if (attr().destQpNum != hello.srcQpn || !(attr().ahAttr.dgid == src)) return wire::HelloResult::kMismatch;
  return wire::HelloResult::kAccepted;
}

wire::HelloResult RcResponder::acceptFromLoop(const std::shared_ptr<Conn>& conn,
                                              const wire::FrameHeader& hello, in_addr_t peerIp, bool adopt) {
  FERRY_ON_LOOP(ctx_.reactor());
  if (auto result = helloFromOurPeer(hello, peerIp); result != wire::HelloResult::kAccepted) return result;
  if ((expectedSeq_ & 0xffffff) != hello.psn) return wire::HelloResult::kMismatch;
  if (conn_ && !conn_->closed()) return wire::HelloResult::kBusy;
  if (!adopt) return wire::HelloResult::kAccepted;
  stripe_.drop(/*afterFlush=*/false);  // a stripe belongs to the connection it came with
  lastAck_.reset();
  conn_ = conn;
  conn->setDelegate(this);
  nakPending_ = false;
  skip_ = false;
  return wire::HelloResult::kAccepted;
}

uint64_t RcResponder::issueStripeTicketFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  return stripe_.issueTicket();
}

wire::HelloResult RcResponder::acceptStripeFromLoop(const std::shared_ptr<Conn>& conn,
                                                    const wire::FrameHeader& hello, in_addr_t peerIp) {
  FERRY_ON_LOOP(ctx_.reactor());
  if (qp_.type() != verbs::QpType::kRc) return wire::HelloResult::kNoSuchQp;
  if (auto result = helloFromOurPeer(hello, peerIp); result != wire::HelloResult::kAccepted) return result;
  if (!conn_ || conn_->closed()) return wire::HelloResult::kMismatch;  // a stripe needs its connection
  std::weak_ptr<RcResponder> weak = self_;
  Reactor* loop = &ctx_.reactor();
  return stripe_.adopt(
      ctx_, conn, hello.nonce,
      [weak, loop](uint64_t gen, StripeIn::Event event, uint32_t seq, bool revoked, const Status& why) {
        loop->post([weak, gen, event, seq, revoked, why] {
          if (auto self = weak.lock()) self->onStripeEventFromLoop(gen, event, seq, revoked, why);
        });
      });
}

bool RcResponder::mayPassPendingStripes(const wire::FrameHeader& h) {
  // Only a WRITE that will be carried out (so nothing is refused, and nothing acknowledged, ahead
  // of a pending piece) and lands clear of every pending piece: its bytes and theirs cannot meet,
  // and the order of what lands on the same bytes is kept.
  QpState state = qp_.state();
  if (h.type != wire::FrameType::kWrite || nakPending_ || h.seq != expectedSeq_ ||
      (state != QpState::kRtr && state != QpState::kRts) ||
      !(attr().qpAccessFlags & verbs::access::kRemoteWrite)) {
    return false;
  }
  const uint64_t total = (h.flags & wire::kFlagStriped) ? h.length : h.payloadLen;
  if (total > 0) {
    std::shared_lock<std::shared_mutex> memLock(ctx_.memMu());
    if (!ctx_.findMrLocked(h.rkey, qp_.pdId(), h.remoteAddr, total, verbs::access::kRemoteWrite))
      return false;
  }
  const uint64_t lo = h.remoteAddr;
  const uint64_t hi = h.remoteAddr + h.payloadLen;  // its own piece, if any, lands after theirs
  return stripe_.clearOf(lo, hi);
}

void RcResponder::sendAckFromLoop(Conn& conn) {
  FERRY_ON_LOOP(ctx_.reactor());
  const uint32_t through = stripe_.ackThrough(expectedSeq_ - 1);
  ackNeeded_ = through != expectedSeq_ - 1;
  if (lastAck_ == through) return;  // said already: what is left waits for the stripe
  lastAck_ = through;
  wire::FrameHeader ack;
  ack.type = wire::FrameType::kAck;
  ack.seq = through;
  ack.qpn = attr().destQpNum;
  conn.sendHeader(ack);
}

void RcResponder::onStripeEventFromLoop(uint64_t gen, StripeIn::Event event, uint32_t seq, bool revoked,
                                        const Status& why) {
  FERRY_ON_LOOP(ctx_.reactor());
  if (!stripe_.current(gen)) return;  // a stripe since dropped
  if (event == StripeIn::Event::kClosed) {
    // The stripe of our responder connection: the WRITEs and READs it shares with that connection
    // cannot finish, so the connection ends as well (the requester sees a lost connection). In
    // ERR the connection is already closing once its NAK is out.
    stripe_.drop(/*afterFlush=*/false);
    if (conn_ && qp_.state() != QpState::kErr) {
      conn_->close(Status(StatusCode::kUnavailable, "its stripe closed: " + why.message()));
    }
    return;
  }
  const std::optional<InboundStripe::Piece> piece = stripe_.landed(seq);
  if (!piece || !piece->placed) return;  // not the piece due, or discarded: its WRITE was refused or dropped
  if (revoked) {
    // The region went while its bytes arrived: the WRITE fails, as one whose own frame lost them.
    refuseFromLoop(piece->seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
    if (qp_.state() == QpState::kErr) return;
  }
  if (const auto refusal = stripe_.refusalDue()) {
    refuseFromLoop(refusal->seq, refusal->syndrome, refusal->event);
    return;
  }
  if (stripe_.pending() == 0 && conn_) conn_->resumeInput();  // what waited for the stripe goes on
  if (ackNeeded_ && conn_ && !conn_->closed()) sendAckFromLoop(*conn_);
}

void RcResponder::sendNakFromLoop(uint32_t seq, wire::Syndrome syndrome) {
  FERRY_ON_LOOP(ctx_.reactor());
  if (!conn_) return;
  wire::FrameHeader nak;
  nak.type = wire::FrameType::kNak;
  nak.seq = seq;
  nak.qpn = attr().destQpNum;
  nak.aux = static_cast<uint32_t>(syndrome);
  if (syndrome == wire::Syndrome::kRnr) nak.flags = attr().minRnrTimer & 31;
  conn_->sendHeader(nak);
}

void RcResponder::noReceiveFromLoop(uint32_t seq) {
  FERRY_ON_LOOP(ctx_.reactor());
  if (qp_.type() == verbs::QpType::kUc) {
    dropMessageFromLoop();  // UC drops the message
    return;
  }
  if (ackNeeded_) {
    // Now, before the NAK, which stands for everything before the refused request.
    stripe_.uncork();
    sendAckFromLoop(*conn_);
  }
  sendNakFromLoop(seq, wire::Syndrome::kRnr);
  nakPending_ = true;
  skip_ = true;
}

void RcResponder::dropMessageFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  // UC: a message the responder cannot take is dropped without a word (no NAK, no error state);
  // the requester's send completed when it left. Its sequence number is used up.
  ++expectedSeq_;
  ackNeeded_ = true;
  skip_ = true;
}

void RcResponder::refuseFromLoop(uint32_t seq, wire::Syndrome syndrome, verbs::AsyncEventType event) {
  FERRY_ON_LOOP(ctx_.reactor());
  if (stripe_.pending() > 0 && qp_.type() == verbs::QpType::kRc) {
    // Earlier WRITEs still have bytes on the stripe, and the NAK would acknowledge them: the request
    // is dropped now (its frame and what follows wait) and refused once they have landed.
    stripe_.deferRefusal({seq, syndrome, event});
    skip_ = true;
    if (conn_) conn_->pauseInput();
    return;
  }
  if (qp_.type() == verbs::QpType::kUc) {
    if (curRecv_) {
      qp_.giveBackRecv(std::move(*curRecv_));
      curRecv_.reset();
    }
    dropMessageFromLoop();
    return;
  }
  if (ackNeeded_ && conn_) {
    // Acknowledge what succeeded before the refused request.
    wire::FrameHeader ack;
    ack.type = wire::FrameType::kAck;
    ack.seq = seq - 1;
    ack.qpn = attr().destQpNum;
    conn_->sendHeader(ack);
    ackNeeded_ = false;
  }
  sendNakFromLoop(seq, syndrome);
  ctx_.raiseAsync({.type = event, .qpNum = qp_.qpn()});
  skip_ = true;
  qp_.enterErrorFromLoop(std::nullopt);
}

Status RcResponder::onHeader(Conn& conn, const wire::FrameHeader& h, PayloadPlan* plan) {
  if (&conn != conn_.get())
    return Status(StatusCode::kProtocolError, "frame on a connection the QP no longer uses");
  if (stripe_.pending() > 0 && !mayPassPendingStripes(h)) {
    conn.pauseInput();  // this request waits for the stripe's pending pieces (asked again then)
    return Status::ok();
  }
  const QpState state = qp_.state();
  if (h.type == wire::FrameType::kReadReq && (h.flags & wire::kFlagStriped) && !stripe_.open() &&
      (state == QpState::kRtr || state == QpState::kRts)) {
    return Status(StatusCode::kProtocolError, "a striped READ on a connection with no stripe");
  }
  const bool striped = h.type == wire::FrameType::kWrite && (h.flags & wire::kFlagStriped);
  // A QP that left RTR/RTS drops what still comes (its stripe went with the error).
  if (!striped || (state != QpState::kRtr && state != QpState::kRts)) return onRequestHeader(h, plan);
  if (!stripe_.open())
    return Status(StatusCode::kProtocolError, "a striped WRITE on a connection with no stripe");
  // Every striped WRITE the connection carries has its second half on the stripe, in order: one the
  // responder refuses or drops has it discarded there.
  stripe_.beginHeader();
  Status st = onRequestHeader(h, plan);
  if (st.isOk() && !stripe_.planned()) stripe_.expect(h.seq, 0, h.length - h.payloadLen, {});
  return st;
}

void RcResponder::onClosed(Conn& conn, const Status& why) {
  if (&conn != conn_.get()) return;
  // The peer's requester went away; a partly received message gives its receive back.
  if (curRecv_) {
    qp_.giveBackRecv(std::move(*curRecv_));
    curRecv_.reset();
  }
  conn_.reset();
  skip_ = false;
  stripe_.drop(/*afterFlush=*/false);
}

Status RcResponder::onRequestHeader(const wire::FrameHeader& h, PayloadPlan* plan) {
  using wire::FrameType;
  skip_ = false;
  QpState state = qp_.state();
  if (state != QpState::kRtr && state != QpState::kRts) {
    skip_ = true;
    return Status::ok();
  }
  if (nakPending_) {
    if (h.seq != expectedSeq_) {
      skip_ = true;  // sent before the requester saw our RNR NAK; it comes again
      return Status::ok();
    }
    nakPending_ = false;
  }
  if (h.seq != expectedSeq_) return Status(StatusCode::kProtocolError, "request out of sequence");
  switch (h.type) {
    case FrameType::kSend:
    case FrameType::kSendImm: planSendFromLoop(h, plan); return Status::ok();
    case FrameType::kWrite:
    case FrameType::kWriteImm: planWriteFromLoop(h, plan); return Status::ok();
    case FrameType::kReadReq:
      if (h.length > 0 && !qpAllowsFromLoop(h, verbs::access::kRemoteRead)) return Status::ok();
      if (h.length > 0 && !remoteEntry(h, h.remoteAddr, h.length, verbs::access::kRemoteRead)) {
        refuseFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
      }
      return Status::ok();
    case FrameType::kCmpSwap:
    case FrameType::kFetchAdd:
      if (h.remoteAddr % 8 != 0) {
        refuseFromLoop(h.seq, wire::Syndrome::kRemInvReq, verbs::AsyncEventType::kQpReqErr);
      } else if (!qpAllowsFromLoop(h, verbs::access::kRemoteAtomic)) {
        return Status::ok();
      } else if (!remoteEntry(h, h.remoteAddr, 8, verbs::access::kRemoteAtomic)) {
        refuseFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
      }
      return Status::ok();
    default: return Status(StatusCode::kProtocolError, "response frame on a responder connection");
  }
}

std::shared_ptr<MrEntry> RcResponder::remoteEntry(const wire::FrameHeader& h, uint64_t addr, uint64_t len,
                                                  uint32_t need) {
  std::shared_lock<std::shared_mutex> memLock(ctx_.memMu());
  return ctx_.findMrLocked(h.rkey, qp_.pdId(), addr, len, need);
}

bool RcResponder::qpAllowsFromLoop(const wire::FrameHeader& h, uint32_t need) {
  FERRY_ON_LOOP(ctx_.reactor());
  // A QP whose access flags do not allow the operation refuses it as an invalid request (as the
  // kernel's rxe); a region that does not allow it, as a remote access error.
  if (attr().qpAccessFlags & need) return true;
  refuseFromLoop(h.seq, wire::Syndrome::kRemInvReq, verbs::AsyncEventType::kQpReqErr);
  return false;
}

void RcResponder::planSendFromLoop(const wire::FrameHeader& h, PayloadPlan* plan) {
  FERRY_ON_LOOP(ctx_.reactor());
  RecvWqe rwqe;
  if (!qp_.takeRecv(&rwqe)) {
    noReceiveFromLoop(h.seq);
    return;
  }
  uint64_t room = 0;
  Segments segs;
  bool bad = false;
  {
    std::shared_lock<std::shared_mutex> memLock(ctx_.memMu());
    for (const auto& sge : rwqe.sges) {
      room += sge.length;
      if (sge.length == 0) continue;
      auto entry = ctx_.findMrLocked(sge.lkey, qp_.pdId(), sge.addr, sge.length, verbs::access::kLocalWrite);
      if (!entry) {
        bad = true;
        break;
      }
      segs.push_back(Segment{reinterpret_cast<uint8_t*>(sge.addr), sge.length, std::move(entry)});
    }
  }
  if (bad || room < h.payloadLen) {
    // The receive cannot hold the message (a bad key or range, or too short): as the kernel's
    // rxe, a malformed receive — LOC_QP_OP_ERR here, REM_OP_ERR at the requester.
    qp_.pushRecvCompletion(rwqe, WcStatus::kLocQpOpErr, WcOpcode::kRecv, 0, std::nullopt, false);
    refuseFromLoop(h.seq, wire::Syndrome::kRemOp, verbs::AsyncEventType::kQpFatal);
    return;
  }
  plan->segments = std::move(segs);
  curRecv_ = std::move(rwqe);
}

void RcResponder::planWriteFromLoop(const wire::FrameHeader& h, PayloadPlan* plan) {
  FERRY_ON_LOOP(ctx_.reactor());
  const bool striped = h.flags & wire::kFlagStriped;
  const uint64_t total = striped ? h.length : h.payloadLen;  // a striped WRITE is checked whole
  if (total > 0) {
    if (!qpAllowsFromLoop(h, verbs::access::kRemoteWrite)) return;
    auto entry = remoteEntry(h, h.remoteAddr, total, verbs::access::kRemoteWrite);
    if (!entry) {
      refuseFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
      return;
    }
    if (striped) {
      const uint64_t second = h.remoteAddr + h.payloadLen;
      stripe_.expect(h.seq, second, total - h.payloadLen,
                     {Segment{reinterpret_cast<uint8_t*>(second), total - h.payloadLen, entry}});
    }
    if (h.payloadLen > 0) {
      plan->segments.push_back(
          Segment{reinterpret_cast<uint8_t*>(h.remoteAddr), h.payloadLen, std::move(entry)});
    }
  }
  if (h.type == wire::FrameType::kWriteImm) {
    RecvWqe rwqe;
    if (!qp_.takeRecv(&rwqe)) {
      plan->segments.clear();
      noReceiveFromLoop(h.seq);
      return;
    }
    curRecv_ = std::move(rwqe);
  }
}

void RcResponder::onFrame(Conn& conn, const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t) {
  using wire::FrameType;
  if (&conn != conn_.get()) return;
  if (skip_) {
    skip_ = false;
    return;
  }
  switch (h.type) {
    case FrameType::kSend:
    case FrameType::kSendImm: return receivedSendFromLoop(h, plan);
    case FrameType::kWrite:
    case FrameType::kWriteImm: return receivedWriteFromLoop(h, plan);
    case FrameType::kReadReq: return answerReadFromLoop(h);
    case FrameType::kCmpSwap:
    case FrameType::kFetchAdd: return answerAtomicFromLoop(h);
    default: return;
  }
}

void RcResponder::receivedSendFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan) {
  FERRY_ON_LOOP(ctx_.reactor());
  RecvWqe rwqe = std::move(*curRecv_);
  curRecv_.reset();
  if (plan.revoked) {
    qp_.pushRecvCompletion(rwqe, WcStatus::kLocQpOpErr, WcOpcode::kRecv, 0, std::nullopt, false);
    refuseFromLoop(h.seq, wire::Syndrome::kRemOp, verbs::AsyncEventType::kQpFatal);
    return;
  }
  std::optional<uint32_t> imm;
  if (h.type == wire::FrameType::kSendImm) imm = h.aux;
  ++expectedSeq_;
  ackNeeded_ = true;
  qp_.pushRecvCompletion(rwqe, WcStatus::kSuccess, WcOpcode::kRecv, h.payloadLen, imm,
                         (h.flags & wire::kFlagSolicited) != 0);
}

void RcResponder::receivedWriteFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan) {
  FERRY_ON_LOOP(ctx_.reactor());
  if (plan.revoked) {
    if (curRecv_) {
      qp_.giveBackRecv(std::move(*curRecv_));
      curRecv_.reset();
    }
    refuseFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
    return;
  }
  ++expectedSeq_;
  ackNeeded_ = true;
  if (h.type == wire::FrameType::kWriteImm) {
    RecvWqe rwqe = std::move(*curRecv_);
    curRecv_.reset();
    const uint32_t byteLen = (h.flags & wire::kFlagPlaced) ? h.length : h.payloadLen;
    qp_.pushRecvCompletion(rwqe, WcStatus::kSuccess, WcOpcode::kRecvRdmaWithImm, byteLen, h.aux,
                           (h.flags & wire::kFlagSolicited) != 0);
  }
}

void RcResponder::answerReadFromLoop(const wire::FrameHeader& h) {
  FERRY_ON_LOOP(ctx_.reactor());
  using wire::FrameType;
  OutFrame frame;
  wire::FrameHeader resp;
  resp.type = FrameType::kReadResp;
  resp.seq = h.seq;
  resp.qpn = attr().destQpNum;
  resp.payloadLen = h.length;
  if (h.length > 0) {
    std::shared_lock<std::shared_mutex> memLock(ctx_.memMu());
    auto entry = ctx_.findMrLocked(h.rkey, qp_.pdId(), h.remoteAddr, h.length, verbs::access::kRemoteRead);
    if (entry) {
      frame.payload.push_back(Segment{reinterpret_cast<uint8_t*>(h.remoteAddr), h.length, std::move(entry)});
    } else {
      // Deregistered between the check and now: zeros, and the trailer says so.
      auto gone = std::make_shared<MrEntry>();
      gone->revoked = true;
      frame.payload.push_back(Segment{nullptr, h.length, std::move(gone)});
    }
  }
  OutFrame stripePart;
  if ((h.flags & wire::kFlagStriped) && stripe_.open()) {
    // The requester asked for it in two parts: the second goes back on the stripe.
    const uint64_t first = stripeSplitAt(h.length);
    Segments whole = std::move(frame.payload);
    frame.payload.clear();
    splitSegments(whole, first, &frame.payload, &stripePart.payload);
    resp.payloadLen = static_cast<uint32_t>(first);
    wire::FrameHeader part;
    part.type = FrameType::kStripeReadResp;
    part.seq = h.seq;
    part.qpn = attr().destQpNum;
    part.payloadLen = h.length - static_cast<uint32_t>(first);
    stripePart.headerLen = static_cast<uint16_t>(wire::encodeHeader(part, stripePart.header));
    stripePart.hasTrailer = true;
    stripePart.seq = h.seq;
  }
  frame.headerLen = static_cast<uint16_t>(wire::encodeHeader(resp, frame.header));
  frame.hasTrailer = true;
  frame.seq = h.seq;
  ++expectedSeq_;
  ackNeeded_ = false;  // the response acknowledges everything before it
  conn_->send(std::move(frame));
  // (A send that fails closes the connection, and the stripe with it.) The READ parts this input
  // asks for leave together, as the connection's own responses do: when the input is drained
  // or pauses (onInputDrained).
  if (stripePart.headerLen != 0) stripe_.holdReadPart(std::move(stripePart));
}

namespace {
// Atomics on device memory of this process: one at a time (the loop runs them all; this orders
// them against other contexts' loops too).
std::mutex deviceAtomicMu;
}  // namespace

bool RcResponder::atomicOnDeviceLocked(const MrEntry& entry, const wire::FrameHeader& h, uint64_t* original) {
  // Read, change and write back through host memory: atomic against every other atomic ferry
  // carries out on the region (as a NIC's atomics are against each other), not against kernels
  // running on the device meanwhile.
  std::lock_guard<std::mutex> lock(deviceAtomicMu);
  auto* target = reinterpret_cast<uint8_t*>(h.remoteAddr);
  if (!readRegion(entry, original, target, 8)) return false;
  uint64_t next = *original;
  if (h.type == wire::FrameType::kCmpSwap) {
    if (*original == h.compareAdd) next = h.swap;
  } else {
    next = *original + h.compareAdd;
  }
  return next == *original || writeRegion(entry, target, &next, 8);
}

void RcResponder::answerAtomicFromLoop(const wire::FrameHeader& h) {
  FERRY_ON_LOOP(ctx_.reactor());
  uint64_t original = 0;
  bool ok = false;
  {
    std::shared_lock<std::shared_mutex> memLock(ctx_.memMu());
    auto entry = ctx_.findMrLocked(h.rkey, qp_.pdId(), h.remoteAddr, 8, verbs::access::kRemoteAtomic);
    if (entry && onDevice(entry.get())) {
      ok = atomicOnDeviceLocked(*entry, h, &original);
    } else if (entry) {
      auto* target = reinterpret_cast<uint64_t*>(h.remoteAddr);
      DeviceAccess device;
      if (h.type == wire::FrameType::kCmpSwap) {
        uint64_t expected = h.compareAdd;
        __atomic_compare_exchange_n(target, &expected, h.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        original = expected;
      } else {
        original = __atomic_fetch_add(target, h.compareAdd, __ATOMIC_SEQ_CST);
      }
      ok = true;
    }
  }
  if (!ok) {
    refuseFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
    return;
  }
  wire::FrameHeader resp;
  resp.type = wire::FrameType::kAtomicResp;
  resp.seq = h.seq;
  resp.qpn = attr().destQpNum;
  resp.atomicResult = original;
  ++expectedSeq_;
  ackNeeded_ = false;
  conn_->sendHeader(resp);
}

void RcResponder::onInputDrained(Conn& conn) {
  if (&conn != conn_.get()) return;
  stripe_.uncork();
  if (!ackNeeded_) return;
  // In an application's poll, the ACK goes at the start of the next run: the poll that took a
  // request returns its completion without writing the ACK first (on TCP a system call), and the
  // application's next call, or the thread once the lease ends, sends it.
  if (ackDeferred_) return;
  if (ctx_.deferAckFromLoop(self_)) {
    ackDeferred_ = true;
    return;
  }
  sendAckFromLoop(conn);
}

void RcResponder::sendDeferredAckFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  ackDeferred_ = false;
  if (ackNeeded_ && conn_ && !conn_->closed()) sendAckFromLoop(*conn_);
}

}  // namespace ferry::soft
