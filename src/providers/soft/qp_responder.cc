// SoftQp, responder half: hellos, requests from the peer checked at access time and carried
// out, acknowledgements and NAKs (reactor thread).
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <shared_mutex>

#include "common/device_access.h"
#include "common/log.h"
#include "ferry/common/config.h"
#include "providers/soft/qp.h"
#include "providers/soft/qp_internal.h"
#include "verbs/qp_state.h"

namespace ferry::soft {

using namespace qp_detail;

// ---------------------------------------------------------------------------------------------
// Responder (reactor thread).

wire::HelloResult SoftQp::helloFromOurPeer(const wire::FrameHeader& hello, in_addr_t peerIp) {
  QpState state = state_.load();
  // A QP on its way to RTR is not ready yet (its owner may still be setting it up: the peer tries
  // again, as a NIC retries one that drops its packets); a closed one, or one in ERR, is gone.
  if (!closed_ && (state == QpState::kReset || state == QpState::kInit)) return wire::HelloResult::kNotReady;
  if (closed_ || (state != QpState::kRtr && state != QpState::kRts)) return wire::HelloResult::kNoSuchQp;
  in_addr_t ip;
  uint16_t port;
  verbs::Gid src;
  src.raw = hello.srcGid;
  if (!parseSoftGid(src, &ip, &port) || ip != peerIp) return wire::HelloResult::kMismatch;
  std::lock_guard<std::mutex> lock(mu_);
  if (attr_.destQpNum != hello.srcQpn || !(attr_.ahAttr.dgid == src)) return wire::HelloResult::kMismatch;
  return wire::HelloResult::kAccepted;
}

wire::HelloResult SoftQp::acceptFromLoop(const std::shared_ptr<Conn>& conn, const wire::FrameHeader& hello,
                                         in_addr_t peerIp, bool adopt) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (auto result = helloFromOurPeer(hello, peerIp); result != wire::HelloResult::kAccepted) return result;
  if ((expectedSeq_ & 0xffffff) != hello.psn) return wire::HelloResult::kMismatch;
  if (respConn_ && !respConn_->closed()) return wire::HelloResult::kBusy;
  if (!adopt) return wire::HelloResult::kAccepted;
  dropLaneInFromLoop();  // a lane belongs to the connection it came with
  lastAck_.reset();
  respConn_ = conn;
  conn->setDelegate(this);
  respNakPending_ = false;
  respSkip_ = false;
  return wire::HelloResult::kAccepted;
}

uint64_t SoftQp::issueLaneTicketFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  laneTicket_ = randomTicket();
  return laneTicket_;
}

wire::HelloResult SoftQp::acceptLaneFromLoop(const std::shared_ptr<Conn>& conn,
                                             const wire::FrameHeader& hello, in_addr_t peerIp) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (type_ != verbs::QpType::kRc) return wire::HelloResult::kNoSuchQp;
  if (auto result = helloFromOurPeer(hello, peerIp); result != wire::HelloResult::kAccepted) return result;
  // The ticket went only over our current responder connection: whoever shows it is its peer.
  if (laneTicket_ == 0 || hello.nonce != laneTicket_ || !respConn_ || respConn_->closed()) {
    return wire::HelloResult::kMismatch;
  }
  if (laneIn_ && !laneIn_->closing()) return wire::HelloResult::kBusy;
  laneTicket_ = 0;  // one lane per connection
  // Read on the lane thread (where this process's lanes are written too); on this loop when there
  // is none.
  Reactor* laneReactor = ctx_->laneReactorFromLoop();
  const uint64_t gen = ++laneInGen_;
  std::weak_ptr<SoftQp> weak = weak_from_this();
  Reactor* loop = &ctx_->reactor();
  laneIn_ =
      LaneIn::adopt(ctx_.get(), conn, laneReactor ? laneReactor : loop,
                    [weak, loop, gen](LaneIn::Event event, uint32_t seq, bool revoked, const Status& why) {
                      loop->post([weak, gen, event, seq, revoked, why] {
                        if (auto self = weak.lock()) {
                          self->onLaneInEventFromLoop(gen, event, seq, revoked, why);
                        }
                      });
                    });
  return wire::HelloResult::kAccepted;
}

void SoftQp::expectLanePieceFromLoop(uint32_t seq, uint64_t addr, uint64_t length, Segments segments) {
  FERRY_ON_LOOP(ctx_->reactor());
  const bool placed = !segments.empty();
  if (placed) ++lanePending_;
  lanePieces_.push_back(LanePiece{seq, addr, length, placed});
  if (laneIn_) laneIn_->expect(seq, length, std::move(segments));
}

bool SoftQp::mayPassPendingLanes(const wire::FrameHeader& h) {
  // Only a WRITE that will be carried out (so nothing is refused, and nothing acknowledged, ahead
  // of a pending piece) and lands clear of every pending piece: its bytes and theirs cannot meet,
  // and the order of what lands on the same bytes is kept.
  QpState state = state_.load();
  if (h.type != wire::FrameType::kWrite || respNakPending_ || h.seq != expectedSeq_ ||
      (state != QpState::kRtr && state != QpState::kRts) ||
      !(attr_.qpAccessFlags & verbs::access::kRemoteWrite)) {
    return false;
  }
  const uint64_t total = (h.flags & wire::kFlagLaned) ? h.length : h.payloadLen;
  if (total > 0) {
    std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
    if (!ctx_->findMrLocked(h.rkey, pd_.get(), h.remoteAddr, total, verbs::access::kRemoteWrite))
      return false;
  }
  const uint64_t lo = h.remoteAddr;
  const uint64_t hi = h.remoteAddr + h.payloadLen;  // its own piece, if any, lands after theirs
  for (const LanePiece& piece : lanePieces_) {
    if (piece.placed && lo < piece.addr + piece.length && piece.addr < hi) return false;
  }
  return true;
}

void SoftQp::sendAckFromLoop(Conn& conn) {
  FERRY_ON_LOOP(ctx_->reactor());
  uint32_t through = expectedSeq_ - 1;
  for (const LanePiece& piece : lanePieces_) {
    if (!piece.placed) continue;
    if (seqLe(piece.seq, through)) through = piece.seq - 1;  // done, but not all of it landed yet
    break;
  }
  ackNeeded_ = through != expectedSeq_ - 1;
  if (lastAck_ == through) return;  // said already: what is left waits for the lane
  lastAck_ = through;
  wire::FrameHeader ack;
  ack.type = wire::FrameType::kAck;
  ack.seq = through;
  ack.qpn = attr_.destQpNum;
  conn.sendHeader(ack);
}

void SoftQp::onLaneInEventFromLoop(uint64_t gen, LaneIn::Event event, uint32_t seq, bool revoked,
                                   const Status& why) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (gen != laneInGen_ || !laneIn_) return;  // a lane since dropped
  if (event == LaneIn::Event::kClosed) {
    // The lane of our responder connection: the WRITEs and READs it shares with that connection
    // cannot finish, so the connection ends as well (the requester sees a lost connection). In
    // ERR the connection is already closing once its NAK is out.
    dropLaneInFromLoop();
    if (respConn_ && state_.load() != QpState::kErr) {
      respConn_->close(Status(StatusCode::kUnavailable, "its lane closed: " + why.message()));
    }
    return;
  }
  // Pieces land in the order they were expected.
  if (lanePieces_.empty() || lanePieces_.front().seq != seq) return;
  const LanePiece piece = lanePieces_.front();
  lanePieces_.pop_front();
  if (!piece.placed) return;  // discarded: its WRITE was refused or dropped
  --lanePending_;
  if (revoked) {
    // The region went while its bytes arrived: the WRITE fails, as one whose own frame lost them.
    responderErrorFromLoop(piece.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
    if (state_.load() == QpState::kErr) return;
  }
  if (lanePending_ == 0 && laneRefusal_) {
    const LaneRefusal refusal = *laneRefusal_;
    laneRefusal_.reset();
    responderErrorFromLoop(refusal.seq, refusal.syndrome, refusal.event);
    return;
  }
  if (lanePending_ == 0 && respConn_) respConn_->resumeInput();  // what waited for the lane goes on
  if (ackNeeded_ && respConn_ && !respConn_->closed()) sendAckFromLoop(*respConn_);
}

void SoftQp::dropLaneInFromLoop(bool afterFlush) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (afterFlush) {
    // The READ parts already on the lane still go, as a NAK queued on the connection does (it
    // acknowledges their READs); the lane closes after them, and laneIn_ holds it until then.
    uncorkLaneFromLoop();
    if (laneIn_) laneIn_->closeAfterFlush();
  } else {
    // With pieces pending, the lane thread may be placing one: wait until it has stopped, so that
    // nothing lands after the QP has let the WRITE go.
    if (laneIn_) laneIn_->close(/*wait=*/lanePending_ > 0);
    laneIn_.reset();
    ++laneInGen_;
  }
  laneTicket_ = 0;
  lanePieces_.clear();
  lanePending_ = 0;
  laneRefusal_.reset();
  laneReadParts_.clear();
}

void SoftQp::sendNakFromLoop(uint32_t seq, wire::Syndrome syndrome) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (!respConn_) return;
  wire::FrameHeader nak;
  nak.type = wire::FrameType::kNak;
  nak.seq = seq;
  nak.qpn = attr_.destQpNum;
  nak.aux = static_cast<uint32_t>(syndrome);
  if (syndrome == wire::Syndrome::kRnr) nak.flags = attr_.minRnrTimer & 31;
  respConn_->sendHeader(nak);
}

void SoftQp::noReceiveFromLoop(uint32_t seq) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (type_ == verbs::QpType::kUc) {
    dropMessageFromLoop();  // UC drops the message
    return;
  }
  if (ackNeeded_) {
    // Now, before the NAK, which stands for everything before the refused request.
    uncorkLaneFromLoop();
    sendAckFromLoop(*respConn_);
  }
  sendNakFromLoop(seq, wire::Syndrome::kRnr);
  respNakPending_ = true;
  respSkip_ = true;
}

void SoftQp::dropMessageFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  // UC: a message the responder cannot take is dropped without a word (no NAK, no error state);
  // the requester's send completed when it left. Its sequence number is used up.
  ++expectedSeq_;
  ackNeeded_ = true;
  respSkip_ = true;
}

void SoftQp::responderErrorFromLoop(uint32_t seq, wire::Syndrome syndrome, verbs::AsyncEventType event) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (lanePending_ > 0 && type_ == verbs::QpType::kRc) {
    // Earlier WRITEs still have bytes on the lane, and the NAK would acknowledge them: the request
    // is dropped now (its frame and what follows wait) and refused once they have landed.
    if (!laneRefusal_) laneRefusal_ = LaneRefusal{seq, syndrome, event};
    respSkip_ = true;
    if (respConn_) respConn_->pauseInput();
    return;
  }
  if (type_ == verbs::QpType::kUc) {
    if (curRecv_) {
      giveBackRecv(std::move(*curRecv_));
      curRecv_.reset();
    }
    dropMessageFromLoop();
    return;
  }
  if (ackNeeded_ && respConn_) {
    // Acknowledge what succeeded before the refused request.
    wire::FrameHeader ack;
    ack.type = wire::FrameType::kAck;
    ack.seq = seq - 1;
    ack.qpn = attr_.destQpNum;
    respConn_->sendHeader(ack);
    ackNeeded_ = false;
  }
  sendNakFromLoop(seq, syndrome);
  ctx_->raiseAsync({.type = event, .qpNum = qpn_});
  respSkip_ = true;
  enterErrorFromLoop(std::nullopt);
}

Status SoftQp::onRequestHeader(const wire::FrameHeader& h, PayloadPlan* plan) {
  using wire::FrameType;
  respSkip_ = false;
  QpState state = state_.load();
  if (state != QpState::kRtr && state != QpState::kRts) {
    respSkip_ = true;
    return Status::ok();
  }
  if (respNakPending_) {
    if (h.seq != expectedSeq_) {
      respSkip_ = true;  // sent before the requester saw our RNR NAK; it comes again
      return Status::ok();
    }
    respNakPending_ = false;
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
        responderErrorFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
      }
      return Status::ok();
    case FrameType::kCmpSwap:
    case FrameType::kFetchAdd:
      if (h.remoteAddr % 8 != 0) {
        responderErrorFromLoop(h.seq, wire::Syndrome::kRemInvReq, verbs::AsyncEventType::kQpReqErr);
      } else if (!qpAllowsFromLoop(h, verbs::access::kRemoteAtomic)) {
        return Status::ok();
      } else if (!remoteEntry(h, h.remoteAddr, 8, verbs::access::kRemoteAtomic)) {
        responderErrorFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
      }
      return Status::ok();
    default: return Status(StatusCode::kProtocolError, "response frame on a responder connection");
  }
}

std::shared_ptr<MrEntry> SoftQp::remoteEntry(const wire::FrameHeader& h, uint64_t addr, uint64_t len,
                                             uint32_t need) {
  std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
  return ctx_->findMrLocked(h.rkey, pd_.get(), addr, len, need);
}

bool SoftQp::qpAllowsFromLoop(const wire::FrameHeader& h, uint32_t need) {
  FERRY_ON_LOOP(ctx_->reactor());
  // A QP whose access flags do not allow the operation refuses it as an invalid request (as the
  // kernel's rxe); a region that does not allow it, as a remote access error.
  if (attr_.qpAccessFlags & need) return true;
  responderErrorFromLoop(h.seq, wire::Syndrome::kRemInvReq, verbs::AsyncEventType::kQpReqErr);
  return false;
}

void SoftQp::planSendFromLoop(const wire::FrameHeader& h, PayloadPlan* plan) {
  FERRY_ON_LOOP(ctx_->reactor());
  RecvWqe rwqe;
  if (!takeRecv(&rwqe)) {
    noReceiveFromLoop(h.seq);
    return;
  }
  uint64_t room = 0;
  Segments segs;
  bool bad = false;
  {
    std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
    for (const auto& sge : rwqe.sges) {
      room += sge.length;
      if (sge.length == 0) continue;
      auto entry = ctx_->findMrLocked(sge.lkey, pd_.get(), sge.addr, sge.length, verbs::access::kLocalWrite);
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
    pushRecvCompletion(rwqe, WcStatus::kLocQpOpErr, WcOpcode::kRecv, 0, std::nullopt, false);
    responderErrorFromLoop(h.seq, wire::Syndrome::kRemOp, verbs::AsyncEventType::kQpFatal);
    return;
  }
  plan->segments = std::move(segs);
  curRecv_ = std::move(rwqe);
}

void SoftQp::planWriteFromLoop(const wire::FrameHeader& h, PayloadPlan* plan) {
  FERRY_ON_LOOP(ctx_->reactor());
  const bool laned = h.flags & wire::kFlagLaned;
  const uint64_t total = laned ? h.length : h.payloadLen;  // a laned WRITE is checked whole
  if (total > 0) {
    if (!qpAllowsFromLoop(h, verbs::access::kRemoteWrite)) return;
    auto entry = remoteEntry(h, h.remoteAddr, total, verbs::access::kRemoteWrite);
    if (!entry) {
      responderErrorFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
      return;
    }
    if (laned) {
      const uint64_t second = h.remoteAddr + h.payloadLen;
      expectLanePieceFromLoop(h.seq, second, total - h.payloadLen,
                              {Segment{reinterpret_cast<uint8_t*>(second), total - h.payloadLen, entry}});
      lanePlanned_ = true;
    }
    if (h.payloadLen > 0) {
      plan->segments.push_back(
          Segment{reinterpret_cast<uint8_t*>(h.remoteAddr), h.payloadLen, std::move(entry)});
    }
  }
  if (h.type == wire::FrameType::kWriteImm) {
    RecvWqe rwqe;
    if (!takeRecv(&rwqe)) {
      plan->segments.clear();
      noReceiveFromLoop(h.seq);
      return;
    }
    curRecv_ = std::move(rwqe);
  }
}

void SoftQp::onRequestFrame(const wire::FrameHeader& h, const PayloadPlan& plan) {
  using wire::FrameType;
  if (respSkip_) {
    respSkip_ = false;
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

void SoftQp::receivedSendFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan) {
  FERRY_ON_LOOP(ctx_->reactor());
  RecvWqe rwqe = std::move(*curRecv_);
  curRecv_.reset();
  if (plan.revoked) {
    pushRecvCompletion(rwqe, WcStatus::kLocQpOpErr, WcOpcode::kRecv, 0, std::nullopt, false);
    responderErrorFromLoop(h.seq, wire::Syndrome::kRemOp, verbs::AsyncEventType::kQpFatal);
    return;
  }
  std::optional<uint32_t> imm;
  if (h.type == wire::FrameType::kSendImm) imm = h.aux;
  ++expectedSeq_;
  ackNeeded_ = true;
  pushRecvCompletion(rwqe, WcStatus::kSuccess, WcOpcode::kRecv, h.payloadLen, imm,
                     (h.flags & wire::kFlagSolicited) != 0);
}

void SoftQp::receivedWriteFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (plan.revoked) {
    if (curRecv_) {
      giveBackRecv(std::move(*curRecv_));
      curRecv_.reset();
    }
    responderErrorFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
    return;
  }
  ++expectedSeq_;
  ackNeeded_ = true;
  if (h.type == wire::FrameType::kWriteImm) {
    RecvWqe rwqe = std::move(*curRecv_);
    curRecv_.reset();
    const uint32_t byteLen = (h.flags & wire::kFlagPlaced) ? h.length : h.payloadLen;
    pushRecvCompletion(rwqe, WcStatus::kSuccess, WcOpcode::kRecvRdmaWithImm, byteLen, h.aux,
                       (h.flags & wire::kFlagSolicited) != 0);
  }
}

void SoftQp::answerReadFromLoop(const wire::FrameHeader& h) {
  FERRY_ON_LOOP(ctx_->reactor());
  using wire::FrameType;
  OutFrame frame;
  wire::FrameHeader resp;
  resp.type = FrameType::kReadResp;
  resp.seq = h.seq;
  resp.qpn = attr_.destQpNum;
  resp.payloadLen = h.length;
  if (h.length > 0) {
    std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
    auto entry = ctx_->findMrLocked(h.rkey, pd_.get(), h.remoteAddr, h.length, verbs::access::kRemoteRead);
    if (entry) {
      frame.payload.push_back(Segment{reinterpret_cast<uint8_t*>(h.remoteAddr), h.length, std::move(entry)});
    } else {
      // Deregistered between the check and now: zeros, and the trailer says so.
      auto gone = std::make_shared<MrEntry>();
      gone->revoked = true;
      frame.payload.push_back(Segment{nullptr, h.length, std::move(gone)});
    }
  }
  OutFrame lanePart;
  if ((h.flags & wire::kFlagLaned) && laneIn_) {
    // The requester asked for it in two parts: the second goes back on the lane.
    const uint64_t first = laneSplitAt(h.length);
    Segments whole = std::move(frame.payload);
    frame.payload.clear();
    splitSegments(whole, first, &frame.payload, &lanePart.payload);
    resp.payloadLen = static_cast<uint32_t>(first);
    wire::FrameHeader part;
    part.type = FrameType::kLaneReadResp;
    part.seq = h.seq;
    part.qpn = attr_.destQpNum;
    part.payloadLen = h.length - static_cast<uint32_t>(first);
    lanePart.headerLen = static_cast<uint16_t>(wire::encodeHeader(part, lanePart.header));
    lanePart.hasTrailer = true;
    lanePart.seq = h.seq;
  }
  frame.headerLen = static_cast<uint16_t>(wire::encodeHeader(resp, frame.header));
  frame.hasTrailer = true;
  frame.seq = h.seq;
  ++expectedSeq_;
  ackNeeded_ = false;  // the response acknowledges everything before it
  respConn_->send(std::move(frame));
  // (A send that fails closes the connection, and the lane with it.) The READ parts this input
  // asks for leave together, as the connection's own responses do: when the input is drained
  // or pauses (onInputDrained).
  if (lanePart.headerLen != 0 && laneIn_) laneReadParts_.push_back(std::move(lanePart));
}

void SoftQp::answerAtomicFromLoop(const wire::FrameHeader& h) {
  FERRY_ON_LOOP(ctx_->reactor());
  uint64_t original = 0;
  bool ok = false;
  {
    std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
    auto entry = ctx_->findMrLocked(h.rkey, pd_.get(), h.remoteAddr, 8, verbs::access::kRemoteAtomic);
    if (entry) {
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
    responderErrorFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
    return;
  }
  wire::FrameHeader resp;
  resp.type = wire::FrameType::kAtomicResp;
  resp.seq = h.seq;
  resp.qpn = attr_.destQpNum;
  resp.atomicResult = original;
  ++expectedSeq_;
  ackNeeded_ = false;
  respConn_->sendHeader(resp);
}

void SoftQp::onInputDrained(Conn& conn) {
  if (&conn != respConn_.get()) return;
  uncorkLaneFromLoop();
  if (!ackNeeded_) return;
  // In an application's poll, the ACK goes at the start of the next run: the poll that took a
  // request returns its completion without writing the ACK first (on TCP a system call), and the
  // application's next call, or the thread once the lease ends, sends it.
  if (ackDeferred_) return;
  if (ctx_->deferAckFromLoop(weak_from_this())) {
    ackDeferred_ = true;
    return;
  }
  sendAckFromLoop(conn);
}

void SoftQp::sendDeferredAckFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  ackDeferred_ = false;
  if (ackNeeded_ && respConn_ && !respConn_->closed()) sendAckFromLoop(*respConn_);
}

void SoftQp::uncorkLaneFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  if (laneReadParts_.empty()) return;
  if (laneIn_) laneIn_->send(std::exchange(laneReadParts_, {}));
  laneReadParts_.clear();
}

}  // namespace ferry::soft
