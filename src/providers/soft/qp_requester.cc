// SoftQp, requester half: sending the send queue, connecting to the peer, responses and
// acknowledgements, the transport timer (reactor thread).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <shared_mutex>
#include <utility>

#include "common/device_access.h"
#include "common/log.h"
#include "ferry/common/config.h"
#include "providers/soft/qp.h"
#include "providers/soft/qp_internal.h"
#include "verbs/qp_state.h"

namespace ferry::soft {

using namespace qp_detail;

// ---------------------------------------------------------------------------------------------
// Requester (reactor thread).

WcStatus SoftQp::resolveLocalFromLoop(SendWqe& wqe) {
  FERRY_ON_LOOP(ctx_->reactor());
  wqe.local.clear();
  if (wqe.placed || !wqe.inlineData.empty() || wqe.sges.empty()) return WcStatus::kSuccess;
  const bool intoLocal = isReadOrAtomic(wqe.opcode);
  uint32_t need = intoLocal ? verbs::access::kLocalWrite : 0;
  std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
  for (const auto& sge : wqe.sges) {
    if (sge.length == 0) continue;
    auto entry = ctx_->findMrLocked(sge.lkey, pd_.get(), sge.addr, sge.length, need);
    if (!entry) {
      // As the kernel's rxe: a source key naming no region is a local QP operation error; a
      // range or permission the region refuses (and any bad destination) a protection error.
      bool keyKnown = ctx_->findMrLocked(sge.lkey, pd_.get(), 0, 0, 0, /*anyRange=*/true) != nullptr;
      return (!intoLocal && !keyKnown) ? WcStatus::kLocQpOpErr : WcStatus::kLocProtErr;
    }
    wqe.local.push_back(Segment{reinterpret_cast<uint8_t*>(sge.addr), sge.length, std::move(entry)});
  }
  return WcStatus::kSuccess;
}

OutFrame SoftQp::buildRequestFrame(const SendWqe& wqe, OutFrame* lanePart) {
  wire::FrameHeader h;
  h.seq = wqe.seq;
  h.qpn = attr_.destQpNum;
  h.remoteAddr = wqe.remoteAddr;
  h.rkey = wqe.rkey;
  switch (wqe.opcode) {
    case WrOpcode::kSend: h.type = wire::FrameType::kSend; break;
    case WrOpcode::kSendWithImm:
      h.type = wire::FrameType::kSendImm;
      h.aux = wqe.immData;
      break;
    case WrOpcode::kRdmaWrite: h.type = wire::FrameType::kWrite; break;
    case WrOpcode::kRdmaWriteWithImm:
      h.type = wire::FrameType::kWriteImm;
      h.aux = wqe.immData;
      break;
    case WrOpcode::kRdmaRead:
      h.type = wire::FrameType::kReadReq;
      h.length = static_cast<uint32_t>(wqe.length);
      if (wqe.laned) h.flags |= wire::kFlagLaned;  // the response's second part comes on the lane
      break;
    case WrOpcode::kAtomicCmpAndSwp:
      h.type = wire::FrameType::kCmpSwap;
      h.compareAdd = wqe.compareAdd;
      h.swap = wqe.swap;
      break;
    case WrOpcode::kAtomicFetchAndAdd:
      h.type = wire::FrameType::kFetchAdd;
      h.compareAdd = wqe.compareAdd;
      break;
  }
  if (wqe.flags & verbs::send_flags::kSolicited) h.flags |= wire::kFlagSolicited;
  OutFrame frame;
  frame.seq = wqe.seq;
  if (wqe.placed) {
    h.flags |= wire::kFlagPlaced;
    h.length = static_cast<uint32_t>(wqe.length);
  } else if (lanePart && laneReady_ && wqe.opcode == WrOpcode::kRdmaWrite && wqe.inlineData.empty() &&
             wqe.length >= laneMinBytes_) {
    // Half on this connection, half on the lane (at a 4 KiB boundary): two threads copy it.
    const uint64_t first = laneSplitAt(wqe.length);
    h.flags |= wire::kFlagLaned;
    h.length = static_cast<uint32_t>(wqe.length);
    h.payloadLen = static_cast<uint32_t>(first);
    splitSegments(wqe.local, first, &frame.payload, &lanePart->payload);
    wire::FrameHeader lane;
    lane.type = wire::FrameType::kLaneData;
    lane.seq = wqe.seq;
    lane.qpn = attr_.destQpNum;
    lane.payloadLen = static_cast<uint32_t>(wqe.length - first);
    lanePart->seq = wqe.seq;
    lanePart->headerLen = static_cast<uint16_t>(wire::encodeHeader(lane, lanePart->header));
    laneUsed_ = true;
  } else if (wire::carriesPayload(h.type)) {
    h.payloadLen = static_cast<uint32_t>(wqe.length);
    if (!wqe.inlineData.empty()) {
      frame.ownedPayload = wqe.inlineData;
    } else {
      frame.payload = wqe.local;
    }
  }
  frame.headerLen = static_cast<uint16_t>(wire::encodeHeader(h, frame.header));
  return frame;
}

// ---------------------------------------------------------------------------------------------
// The requester's lane (lane.h).

void SoftQp::startLaneFromLoop(uint64_t ticket) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (laneOut_ || ticket == 0 || type_ != verbs::QpType::kRc) return;
  Reactor* laneReactor = ctx_->laneReactorFromLoop();
  in_addr_t ip;
  uint16_t port;
  if (!laneReactor || !parseSoftGid(attr_.ahAttr.dgid, &ip, &port)) return;
  wire::FrameHeader hello;
  hello.type = wire::FrameType::kHello;
  hello.flags = wire::kFlagLane;
  hello.qpn = attr_.destQpNum;
  hello.srcQpn = qpn_;
  hello.srcGid = ctx_->gid().raw;
  hello.nonce = ticket;
  const uint64_t gen = ++laneGen_;
  std::weak_ptr<SoftQp> weak = weak_from_this();
  Reactor* loop = &ctx_->reactor();
  laneOut_ = LaneOut::start(
      ctx_.get(), laneReactor, ip, port, hello,
      [weak, loop, gen](LaneOut::Event event, uint32_t seq, uint32_t syndrome, const Status& why) {
        loop->post([weak, gen, event, seq, syndrome, why] {
          if (auto self = weak.lock()) self->onLaneEventFromLoop(gen, event, seq, syndrome, why);
        });
      });
}

void SoftQp::onLaneEventFromLoop(uint64_t gen, LaneOut::Event event, uint32_t seq, uint32_t syndrome,
                                 const Status& why) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (gen != laneGen_ || !laneOut_) return;  // a lane since dropped
  switch (event) {
    case LaneOut::Event::kReadLanded:
      for (size_t i = 0; i < nextToSend_; ++i) {
        SendWqe& wqe = sq_[i];
        if (wqe.seq != seq || !wqe.laned || wqe.opcode != WrOpcode::kRdmaRead || wqe.laneLanded) continue;
        wqe.laneLanded = true;
        if (syndrome != 0) {
          wqe.error = statusForSyndrome(static_cast<wire::Syndrome>(syndrome));
        } else if (!why.isOk()) {
          wqe.error = WcStatus::kLocProtErr;  // a destination region went while the part arrived
        }
        completeFromLoop();
        break;
      }
      if (laneOutlivesConn_ && !readPartsDueFromLoop()) connectionLostFromLoop();  // heard out
      break;
    case LaneOut::Event::kReady: laneReady_ = true; break;
    case LaneOut::Event::kRevoked: sourceRevokedFromLoop(seq); break;
    case LaneOut::Event::kClosed: {
      // WRITEs and READs go unlaned from now on. The connection itself stays: a responder that
      // loses a lane ends the connection it belongs to (its laned WRITEs and READs could never
      // finish), and one that closed it on an error (ERR) still has its NAK on the way there.
      FERRY_LOG(kDebug, "QP %u: its lane closed: %s", qpn_, why.toString().c_str());
      if (laneOutlivesConn_) {
        connectionLostFromLoop();  // the connection went before the lane: both are gone now
        break;
      }
      dropLaneOutFromLoop();  // laneUsed_ stays: halves are on their way, unsent frames still go
      if (state_.load() == QpState::kRts && readPartsDueFromLoop()) {
        // Lane events come in order, so every part that landed was told before this: the rest
        // never will. A responder that closed the lane on a refusal has its NAK on the way on the
        // connection, and closes that too; short of that, the READs fail after the transport
        // timeout (whatever else the connection brings meanwhile).
        const uint64_t gen = laneGen_;
        const auto grace = attr_.timeout == 0
                               ? std::chrono::seconds(2)
                               : std::max<Clock::duration>(transportBudget(), std::chrono::milliseconds(100));
        std::weak_ptr<SoftQp> weak = weak_from_this();
        ctx_->reactor().addTimer(Clock::now() + grace, [weak, gen] {
          auto self = weak.lock();
          if (!self || gen != self->laneGen_ || self->state_.load() != QpState::kRts ||
              !self->readPartsDueFromLoop()) {
            return;
          }
          FERRY_LOG(kInfo, "QP %u: its lane closed with READ parts due", self->qpn_);
          self->enterErrorFromLoop(WcStatus::kRetryExcErr);
        });
      }
      break;
    }
  }
}

bool SoftQp::readPartsDueFromLoop() const {
  FERRY_ON_LOOP(ctx_->reactor());
  return std::any_of(
      sq_.begin(), sq_.begin() + static_cast<std::ptrdiff_t>(nextToSend_),
      [](const SendWqe& w) { return w.laned && w.opcode == WrOpcode::kRdmaRead && !w.laneLanded; });
}

void SoftQp::connectionLostFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  dropLaneOutFromLoop();
  if (state_.load() != QpState::kRts) return;
  if (nextToSend_ > 0) {
    FERRY_LOG(kInfo, "QP %u: connection to the peer lost with requests in flight", qpn_);
    enterErrorFromLoop(WcStatus::kRetryExcErr);
    return;
  }
  scheduleReconnectFromLoop();
}

void SoftQp::dropLaneOutFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  // With READ parts still due, the lane thread may be placing one: wait until it has stopped, so
  // that nothing lands in a READ's memory after the READ has completed (with an error).
  if (laneOut_) laneOut_->close(/*wait=*/laneOut_->readsPending());
  laneOut_.reset();
  laneOutlivesConn_ = false;
  ++laneGen_;
  laneReady_ = false;
}

void SoftQp::pumpFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  pumpScheduled_ = false;
  if (!takePostedFromLoop() || !readyToSendFromLoop()) return;
  const uint32_t maxRd = std::max<uint32_t>(1, attr_.maxRdAtomic);
  // The requests of one pump leave in one write (see Conn::cork).
  struct Corked {
    std::shared_ptr<Conn> conn;
    explicit Corked(std::shared_ptr<Conn> c) : conn(std::move(c)) { conn->cork(); }
    ~Corked() {
      if (!conn->closed()) conn->uncork();
    }
  } corked(reqConn_);
  // The lane parts of this pump go to the lane thread together, on leaving (one post, one write).
  struct LaneBatch {
    std::shared_ptr<LaneOut> lane;
    std::vector<OutFrame> frames;
    ~LaneBatch() {
      if (lane && !frames.empty()) lane->send(std::move(frames));
    }
  } laneBatch{laneOut_, {}};
  while (nextToSend_ < sq_.size()) {
    SendWqe& wqe = sq_[nextToSend_];
    const bool rdAtomic = isReadOrAtomic(wqe.opcode);
    if (rdAtomic && rdInFlight_ >= maxRd) break;
    if ((wqe.flags & verbs::send_flags::kFence) && rdInFlight_ > 0) break;
    const size_t laneParts = laneBatch.frames.size();
    const bool more = sendRequestFromLoop(wqe, &laneBatch.frames);
    if (laneBatch.frames.size() != laneParts) laneBatch.lane = laneOut_;
    if (!more) return;
  }
  armTimeoutFromLoop();
}

bool SoftQp::takePostedFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  std::lock_guard<std::mutex> lock(mu_);
  if (fastBusy_) return false;  // the post copying on the same-host path schedules us when it ends
  if (sq_.empty() && !posted_.empty()) lastProgress_ = ctx_->reactor().runNow();
  if (sq_.empty()) {
    sq_.swap(posted_);  // the whole list at once, no request moved
  } else {
    while (!posted_.empty()) {
      sq_.push_back(std::move(posted_.front()));
      posted_.pop_front();
    }
  }
  return true;
}

bool SoftQp::readyToSendFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  const QpState state = state_.load();
  if (state == QpState::kErr) {
    flushFromLoop();
    return false;
  }
  if (state != QpState::kRts || sq_.empty()) return false;
  if (laneOutlivesConn_) {  // the connection is gone; its lane is heard out first
    armTimeoutFromLoop();
    return false;
  }
  if (!reqConn_ || !reqReady_) {
    if (!reqConn_ && !dialer_.retryPending()) startConnectFromLoop();
    armTimeoutFromLoop();
    return false;
  }
  return !rnrWaiting_ && !localErrorPending_;
}

bool SoftQp::sendRequestFromLoop(SendWqe& wqe, std::vector<OutFrame>* laneParts) {
  FERRY_ON_LOOP(ctx_->reactor());
  const bool rdAtomic = isReadOrAtomic(wqe.opcode);
  wqe.seq = nextSeq_++;
  ++nextToSend_;
  if (wqe.rnrLeft < 0) wqe.rnrLeft = attr_.rnrRetry;
  if (WcStatus local = resolveLocalFromLoop(wqe); local != WcStatus::kSuccess) {
    wqe.error = local;
    localErrorPending_ = true;
    completeFromLoop();
    return false;
  }
  if (rdAtomic) ++rdInFlight_;
  const bool laneable = (wqe.opcode == WrOpcode::kRdmaWrite || wqe.opcode == WrOpcode::kRdmaRead) &&
                        wqe.length >= laneMinBytes_;
  if (laneTicketHeld_ != 0 && laneable) {
    startLaneFromLoop(std::exchange(laneTicketHeld_, 0));  // this one goes whole; later ones share
  }
  wqe.laned = false;
  wqe.laneLanded = false;
  if (laneReady_ && laneable && wqe.opcode == WrOpcode::kRdmaRead) {
    // The response's second part comes back on the lane, placed by the lane thread: it knows
    // where before the request leaves.
    Segments tail;
    const uint64_t first = laneSplitAt(wqe.length);
    splitSegments(wqe.local, first, nullptr, &tail);
    laneOut_->expectRead(wqe.seq, wqe.length - first, std::move(tail));
    wqe.laned = true;
  }
  OutFrame lanePart;
  OutFrame frame = buildRequestFrame(wqe, &lanePart);
  if (lanePart.headerLen != 0) {
    wqe.laned = true;
    laneParts->push_back(std::move(lanePart));
  }
  reqConn_->send(std::move(frame));
  return state_.load() == QpState::kRts && reqConn_;  // else the send failed and closed things
}

void SoftQp::completeFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  while (!sq_.empty() && nextToSend_ > 0) {
    SendWqe& wqe = sq_.front();
    if (wqe.error != WcStatus::kSuccess) {
      enterErrorFromLoop(wqe.error);
      return;
    }
    if (!seqLe(wqe.seq, ackedThrough_)) break;
    if (wqe.laned && wqe.opcode == WrOpcode::kRdmaWrite && sourceRevoked(wqe)) {
      // The lane thread reports a source region that went while it sent its half, but that report
      // can reach this loop after the ACK. A region that went before the completion fails the WRITE
      // here (zeros may have gone in its place); revocation is for good, so none is missed.
      enterErrorFromLoop(WcStatus::kLocProtErr);
      return;
    }
    if (wqe.laned && wqe.opcode == WrOpcode::kRdmaRead && !wqe.laneLanded) break;  // its lane part is due
    if (isReadOrAtomic(wqe.opcode)) {
      if (!wqe.responded) {
        FERRY_LOG(kWarn, "QP %u: acknowledgement skipped a READ/atomic response", qpn_);
        enterErrorFromLoop(WcStatus::kBadRespErr);
        return;
      }
      if (rdInFlight_ > 0) --rdInFlight_;
    }
    SendWqe done = std::move(wqe);
    sq_.pop_front();
    --nextToSend_;
    pushSendCompletion(done, WcStatus::kSuccess);
  }
  // No progress stamp here: the frames that complete requests (ACKs, responses) came on reqConn_,
  // whose every read stamped it (onProgress) just before; a laned READ's part is the lane's
  // progress, which the transport timer asks the lane for.
  // The transport timer stays when the queue empties: it lapses when it fires with nothing sent,
  // and one that fires after the queue filled again re-arms from the progress made since. So a
  // message costs no timer of its own, which a caller's post would have to wake the progress thread
  // for (it may be due before the thread's own wake-up).
  if (state_.load() == QpState::kRts && nextToSend_ < sq_.size()) pumpFromLoop();
}

SoftQp::Clock::duration SoftQp::transportBudget() const {
  // 4.096 us * 2^timeout per try, at least 1 ms; retry_cnt retries after the first try.
  double perTryUs = 4.096 * static_cast<double>(1ull << attr_.timeout);
  perTryUs = std::max(perTryUs, 1000.0);
  return std::chrono::microseconds(static_cast<int64_t>(perTryUs * (attr_.retryCnt + 1)));
}

void SoftQp::armTimeoutFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  if (timeoutTimer_ || attr_.timeout == 0 || sq_.empty()) return;
  std::weak_ptr<SoftQp> weak = weak_from_this();
  timeoutTimer_ = ctx_->reactor().addTimer(lastProgress_ + transportBudget(), [weak] {
    if (auto self = weak.lock()) self->onTimeoutFromLoop();
  });
}

void SoftQp::onTimeoutFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  timeoutTimer_ = 0;
  if (sq_.empty() || state_.load() != QpState::kRts) return;
  auto now = Clock::now();
  if (rnrWaiting_) lastProgress_ = now;
  if (laneOut_) {
    // Bytes the lane moved are progress too (a laned WRITE's ACK waits for both halves).
    const auto laneProgress = Clock::time_point(std::chrono::nanoseconds(laneOut_->lastProgressNs()));
    lastProgress_ = std::max(lastProgress_, std::min(laneProgress, now));
  }
  if (now - lastProgress_ >= transportBudget()) {
    FERRY_LOG(kInfo, "QP %u: no progress within the transport timeout; retries exhausted", qpn_);
    enterErrorFromLoop(WcStatus::kRetryExcErr);
    return;
  }
  armTimeoutFromLoop();
}

void SoftQp::startConnectFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  if (reqConn_ || state_.load() != QpState::kRts) return;
  auto link = dialer_.dialTcp(ctx_->ipv4(), attr_.ahAttr.dgid);
  if (!link.isOk()) {
    // A GID that names no soft device is never dialed; anything else is tried again.
    if (link.status().code() != StatusCode::kInvalidArgument) scheduleReconnectFromLoop();
    return;
  }
  if (!adoptRequesterLinkFromLoop(std::move(*link))) scheduleReconnectFromLoop();
}

bool SoftQp::adoptRequesterLinkFromLoop(std::unique_ptr<Link> link) {
  FERRY_ON_LOOP(ctx_->reactor());
  reqConn_ = std::make_shared<Conn>(ctx_.get(), std::move(link), this);
  reqReady_ = false;
  laneUsed_ = false;  // a new connection: no laned WRITE on it yet
  laneTicketHeld_ = 0;
  if (reqConn_->attach().isOk()) return true;
  reqConn_.reset();
  return false;
}

void SoftQp::completeSendQueueFromLoop(WcStatus status) {
  FERRY_ON_LOOP(ctx_->reactor());
  while (!sq_.empty()) {
    SendWqe wqe = std::move(sq_.front());
    sq_.pop_front();
    pushSendCompletion(wqe, status);
  }
  nextToSend_ = 0;
  rdInFlight_ = 0;
}

void SoftQp::peerGoneFromLoop(const char* why) {
  FERRY_ON_LOOP(ctx_->reactor());
  dialer_.markPeerGone(why);
  if (type_ == verbs::QpType::kUc) {
    // UC has no retries and no acknowledgements: a NIC sends into the void and completes. So do we.
    completeSendQueueFromLoop(WcStatus::kSuccess);
    return;
  }
  // Work waiting for it fails now, as a NIC's would once its retries ran out; later work fails
  // as soon as it is posted (its connection attempt is refused the same way).
  if (!sq_.empty()) enterErrorFromLoop(WcStatus::kRetryExcErr);
}

void SoftQp::scheduleReconnectFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  if (state_.load() != QpState::kRts) return;
  std::weak_ptr<SoftQp> weak = weak_from_this();
  dialer_.scheduleRetry(!sq_.empty(), transportBudget(), [weak] {
    if (auto self = weak.lock()) {
      self->dialer_.retryDue();
      self->startConnectFromLoop();
    }
  });
}

void SoftQp::onConnected(Conn& conn) {
  if (&conn != reqConn_.get()) return;
  dialer_.listenerReached();
  wire::FrameHeader hello;
  hello.type = wire::FrameType::kHello;
  hello.qpn = attr_.destQpNum;
  hello.srcQpn = qpn_;
  hello.psn = nextSeq_ & 0xffffff;
  hello.maxRdAtomic = attr_.maxRdAtomic;
  hello.srcGid = ctx_->gid().raw;
  if (!conn.link().sameHost() && !dialer_.ringsRefused() && sameHostRingsAllowed())
    hello.flags |= wire::kFlagRingOffer;
  conn.sendHeader(hello);
}

bool SoftQp::startRingConnectFromLoop(uint32_t pid, uint64_t nonce, uint64_t ticket) {
  FERRY_ON_LOOP(ctx_->reactor());
  auto link = dialer_.dialRing(pid, nonce, ticket);
  if (!link.isOk()) return false;
  if (!adoptRequesterLinkFromLoop(std::move(*link))) {
    dialer_.stayOnTcp("could not watch the ring");
    return false;
  }
  onConnected(*reqConn_);
  return true;
}

void SoftQp::onProgress(Conn& conn) {
  if (&conn == reqConn_.get() && reqReady_) {
    // The run's clock: the connection told the loop of the bytes it moved (Reactor::noteWork), so
    // the reading is close enough for the transport timer.
    lastProgress_ = ctx_->reactor().runNow();
  }
}

void SoftQp::onClosed(Conn& conn, const Status& why) {
  if (&conn == respConn_.get()) {
    // The peer's requester went away; a partly received message gives its receive back.
    if (curRecv_) {
      giveBackRecv(std::move(*curRecv_));
      curRecv_.reset();
    }
    respConn_.reset();
    respSkip_ = false;
    dropLaneInFromLoop();
    return;
  }
  if (&conn != reqConn_.get()) return;
  bool wasReady = reqReady_;
  if (!wasReady && conn.link().sameHost() && !dialer_.ringsRefused()) {
    // The peer's ring listener dropped our rings before they carried a hello (too many others
    // waiting on it, a ticket it no longer honours): the next connection stays on TCP, which a
    // crowd on that listener cannot block.
    dialer_.stayOnTcp("the peer dropped them before the hello: " + why.toString());
  }
  reqConn_.reset();
  reqReady_ = false;
  dropFastPath();
  if (state_.load() == QpState::kRts && wasReady && type_ == verbs::QpType::kRc && laneOut_ &&
      readPartsDueFromLoop()) {
    // The second parts of READs the responder answered on this connection may still be on the
    // lane (a responder that refused a request closes both once they are out): hear the lane out
    // first, up to its close or the transport timeout (onLaneEventFromLoop).
    laneOutlivesConn_ = true;
    armTimeoutFromLoop();
    return;
  }
  dropLaneOutFromLoop();
  if (state_.load() != QpState::kRts) return;
  if (wasReady && nextToSend_ > 0 && type_ == verbs::QpType::kUc) {
    // UC: what was sent is gone with the connection, as packets are lost on a NIC; those sends
    // completed when they left. The rest goes on the next connection.
    ackedThrough_ = nextSeq_ - 1;
    completeFromLoop();
  } else if (wasReady && nextToSend_ > 0) {
    FERRY_LOG(kInfo, "QP %u: connection to the peer lost with requests in flight: %s", qpn_,
              why.toString().c_str());
    enterErrorFromLoop(WcStatus::kRetryExcErr);
    return;
  }
  // A paused peer keeps its sockets; one whose listener we had reached and that now refuses a
  // connection has no listener any more: its process (or its context) is gone. A refusal before
  // the listener was ever reached may be a process still starting: that is tried again until the
  // transport timeout. Only a real refusal counts (TcpLink reports a connection the listener took
  // and then dropped as reset, not refused).
  if (dialer_.wasListenerReached() && !wasReady && why.cause() == ECONNREFUSED) {
    peerGoneFromLoop("its connections are refused");
    return;
  }
  scheduleReconnectFromLoop();
}

Status SoftQp::onHeader(Conn& conn, const wire::FrameHeader& h, PayloadPlan* plan) {
  if (&conn == reqConn_.get()) return onResponseHeader(h, plan);
  if (&conn != respConn_.get())
    return Status(StatusCode::kProtocolError, "frame on a connection the QP no longer uses");
  if (lanePending_ > 0 && !mayPassPendingLanes(h)) {
    conn.pauseInput();  // this request waits for the lane's pending pieces (asked again then)
    return Status::ok();
  }
  const QpState state = state_.load();
  if (h.type == wire::FrameType::kReadReq && (h.flags & wire::kFlagLaned) && !laneIn_ &&
      (state == QpState::kRtr || state == QpState::kRts)) {
    return Status(StatusCode::kProtocolError, "a laned READ on a connection with no lane");
  }
  const bool laned = h.type == wire::FrameType::kWrite && (h.flags & wire::kFlagLaned);
  // A QP that left RTR/RTS drops what still comes (its lane went with the error).
  if (!laned || (state != QpState::kRtr && state != QpState::kRts)) return onRequestHeader(h, plan);
  if (!laneIn_) return Status(StatusCode::kProtocolError, "a laned WRITE on a connection with no lane");
  // Every laned WRITE the connection carries has its second half on the lane, in order: one the
  // responder refuses or drops has it discarded there.
  lanePlanned_ = false;
  Status st = onRequestHeader(h, plan);
  if (st.isOk() && !lanePlanned_) expectLanePieceFromLoop(h.seq, 0, h.length - h.payloadLen, {});
  return st;
}

void SoftQp::onFrame(Conn& conn, const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t trailer) {
  if (&conn == reqConn_.get()) {
    onResponseFrame(h, plan, trailer);
  } else if (&conn == respConn_.get()) {
    onRequestFrame(h, plan);
  }
}

Status SoftQp::onResponseHeader(const wire::FrameHeader& h, PayloadPlan* plan) {
  using wire::FrameType;
  if (!reqReady_) {
    if (h.type != FrameType::kHelloReply) return Status(StatusCode::kProtocolError, "expected a hello reply");
    return Status::ok();
  }
  switch (h.type) {
    case FrameType::kAck:
    case FrameType::kNak:
    case FrameType::kAtomicResp: return Status::ok();
    case FrameType::kReadResp: {
      // The response belongs to the oldest READ not answered yet.
      for (size_t i = 0; i < nextToSend_; ++i) {
        SendWqe& wqe = sq_[i];
        if (wqe.opcode != WrOpcode::kRdmaRead || wqe.responded) continue;
        // A laned READ's response carries its first part here; the rest comes on the lane.
        const uint64_t here = wqe.laned ? laneSplitAt(wqe.length) : wqe.length;
        if (wqe.seq != h.seq || h.payloadLen != here) {
          return Status(StatusCode::kProtocolError, "READ response does not match the oldest READ");
        }
        if (wqe.laned) {
          splitSegments(wqe.local, here, &plan->segments, nullptr);
        } else {
          plan->segments = wqe.local;
        }
        return Status::ok();
      }
      return Status(StatusCode::kProtocolError, "READ response with no READ outstanding");
    }
    default: return Status(StatusCode::kProtocolError, "request frame on a requester connection");
  }
}

void SoftQp::onResponseFrame(const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t trailer) {
  using wire::FrameType;
  switch (h.type) {
    case FrameType::kHelloReply: return onHelloReplyFromLoop(h);
    case FrameType::kAck:
      if (seqLe(ackedThrough_, h.seq)) ackedThrough_ = h.seq;
      completeFromLoop();
      return;
    case FrameType::kReadResp: return onReadResponseFromLoop(h, plan, trailer);
    case FrameType::kAtomicResp: return onAtomicResponseFromLoop(h);
    case FrameType::kNak: return onNakFromLoop(h);
    default: return;
  }
}

void SoftQp::onHelloReplyFromLoop(const wire::FrameHeader& h) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (static_cast<wire::HelloResult>(h.aux) == wire::HelloResult::kUseRing) {
    // The peer is on this host: the same conversation again, over shared-memory rings.
    reqConn_->close(Status::ok(), true);
    reqConn_.reset();
    bool started = false;
    if (h.sharePid == 0 || h.ringTicket == 0) {
      dialer_.stayOnTcp("the peer's reply named no ring listener");
    } else {
      started = startRingConnectFromLoop(h.sharePid, h.shareCookie, h.ringTicket);
    }
    if (!started) {
      scheduleReconnectFromLoop();
      armTimeoutFromLoop();
    }
    return;
  }
  if (static_cast<wire::HelloResult>(h.aux) == wire::HelloResult::kAccepted) {
    reqReady_ = true;
    dialer_.helloAccepted();
    setupFastPathFromLoop(h);
    // The lane opens with the first WRITE large enough to share: a QP that never sends one
    // keeps a single connection.
    laneTicketHeld_ = laneMinBytes_ > 0 && !reqConn_->link().sameHost() ? h.laneTicket : 0;
    lastProgress_ = Clock::now();
    pumpFromLoop();
    return;
  }
  // The peer QP is not ready yet (kNotReady: its owner has not moved it to RTR), or refuses us
  // for now: try again until the transport timeout. A QP that was reached before and now is
  // not there (destroyed, or in ERR) is gone.
  reqConn_->close(Status::ok(), true);
  reqConn_.reset();
  if (dialer_.wasPeerReached() && static_cast<wire::HelloResult>(h.aux) == wire::HelloResult::kNoSuchQp) {
    peerGoneFromLoop("its queue pair no longer exists");
    return;
  }
  scheduleReconnectFromLoop();
  armTimeoutFromLoop();
}

SendWqe* SoftQp::sentWqe(uint32_t seq) {
  for (size_t i = 0; i < nextToSend_; ++i) {
    if (sq_[i].seq == seq) return &sq_[i];
  }
  return nullptr;
}

void SoftQp::onReadResponseFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t trailer) {
  FERRY_ON_LOOP(ctx_->reactor());
  SendWqe* wqe = sentWqe(h.seq);
  if (!wqe) return;
  wqe->responded = true;
  if (trailer != 0) {
    wqe->error = statusForSyndrome(static_cast<wire::Syndrome>(trailer));
    ackedThrough_ = h.seq - 1;
  } else if (plan.revoked) {
    wqe->error = WcStatus::kLocProtErr;
    ackedThrough_ = h.seq - 1;
  } else {
    ackedThrough_ = h.seq;
  }
  completeFromLoop();
}

void SoftQp::onAtomicResponseFromLoop(const wire::FrameHeader& h) {
  FERRY_ON_LOOP(ctx_->reactor());
  SendWqe* wqe = sentWqe(h.seq);
  if (!wqe || !isAtomic(wqe->opcode)) {
    enterErrorFromLoop(WcStatus::kBadRespErr);
    return;
  }
  wqe->responded = true;
  {
    std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
    if (wqe->local.empty() || wqe->local[0].entry->revoked) {
      wqe->error = WcStatus::kLocProtErr;
    } else {
      DeviceAccess device;
      std::memcpy(wqe->local[0].ptr, &h.atomicResult, 8);
    }
  }
  ackedThrough_ = wqe->error == WcStatus::kSuccess ? h.seq : h.seq - 1;
  completeFromLoop();
}

void SoftQp::onNakFromLoop(const wire::FrameHeader& h) {
  FERRY_ON_LOOP(ctx_->reactor());
  SendWqe* wqe = sentWqe(h.seq);
  if (!wqe) {
    enterErrorFromLoop(WcStatus::kBadRespErr);
    return;
  }
  ackedThrough_ = h.seq - 1;
  auto syndrome = static_cast<wire::Syndrome>(h.aux);
  if (syndrome != wire::Syndrome::kRnr) {
    wqe->error = statusForSyndrome(syndrome);
    completeFromLoop();
    return;
  }
  // Receiver not ready: complete what came before, then resend from the refused request.
  rnrWaiting_ = true;
  completeFromLoop();
  if (state_.load() != QpState::kRts || sq_.empty()) {
    rnrWaiting_ = false;
    return;
  }
  // What came before is done at the responder, yet a laned READ among it may still wait for
  // its second part: it stays sent, and the resend starts at the refused request.
  size_t refused = 0;
  while (refused < nextToSend_ && sq_[refused].seq != h.seq) ++refused;
  if (refused == nextToSend_) {
    enterErrorFromLoop(WcStatus::kBadRespErr);
    return;
  }
  SendWqe& front = sq_[refused];
  if (attr_.rnrRetry != 7) {
    if (front.rnrLeft <= 0) {
      enterErrorFromLoop(WcStatus::kRnrRetryExcErr);
      return;
    }
    --front.rnrLeft;
  }
  rewindForRnrFromLoop(refused, static_cast<uint8_t>(h.flags & 31));
}

void SoftQp::rewindForRnrFromLoop(size_t refused, uint8_t rnrTimerCode) {
  FERRY_ON_LOOP(ctx_->reactor());
  SendWqe& front = sq_[refused];
  // Frames not yet out are dropped, except on a connection that laned: each laned WRITE's
  // second half is on the lane already, and the responder matches halves in order, so every
  // frame goes (the responder drops those after the refused one, halves too).
  if (reqConn_ && !laneUsed_) reqConn_->dropUnsentFrames();
  // The responder answers none of the READs from the refused request on: their parts will
  // not come, and the resend expects them anew.
  if (laneOut_) laneOut_->forgetReadsFrom(front.seq);
  nextSeq_ = front.seq;
  nextToSend_ = refused;
  rdInFlight_ =
      static_cast<uint32_t>(std::count_if(sq_.begin(), sq_.begin() + static_cast<std::ptrdiff_t>(refused),
                                          [](const SendWqe& w) { return isReadOrAtomic(w.opcode); }));
  for (size_t i = refused; i < sq_.size(); ++i) sq_[i].responded = false;
  rnrWaiting_ = true;
  std::weak_ptr<SoftQp> weak = weak_from_this();
  auto wait = std::chrono::microseconds(verbs::rnrTimerMicros(rnrTimerCode));
  rnrTimer_ = ctx_->reactor().addTimer(Clock::now() + wait, [weak] {
    if (auto self = weak.lock()) {
      self->rnrTimer_ = 0;
      self->rnrWaiting_ = false;
      self->lastProgress_ = Clock::now();
      self->pumpFromLoop();
    }
  });
}

void SoftQp::onPayloadRevoked(Conn& conn, const OutFrame& frame) {
  if (&conn != reqConn_.get()) return;  // the responder reports it in the READ_RESP trailer
  sourceRevokedFromLoop(frame.seq);
}

bool SoftQp::sourceRevoked(const SendWqe& wqe) const {
  std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
  return std::any_of(wqe.local.begin(), wqe.local.end(),
                     [](const Segment& seg) { return seg.entry && seg.entry->revoked; });
}

void SoftQp::sourceRevokedFromLoop(uint32_t seq) {
  FERRY_ON_LOOP(ctx_->reactor());
  // The application deregistered a source region while the request's bytes were being sent (on
  // the QP's connection or its lane): zeros went in their place, and the request fails.
  for (size_t i = 0; i < nextToSend_; ++i) {
    if (sq_[i].seq == seq) {
      sq_[i].error = WcStatus::kLocProtErr;
      localErrorPending_ = true;
    }
  }
}

}  // namespace ferry::soft
