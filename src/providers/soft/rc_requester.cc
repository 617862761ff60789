// RcRequester: sending the send queue, connecting to the peer, responses and acknowledgements,
// the transport timer, the stripe (reactor thread).
#include "providers/soft/rc_requester.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <shared_mutex>
#include <utility>

#include "common/device_access.h"
#include "common/log.h"
#include "ferry/common/config.h"
#include "providers/soft/qp_internal.h"
#include "providers/soft/region_copy.h"
#include "verbs/qp_state.h"

namespace ferry::soft {

using namespace qp_detail;

RcRequester::RcRequester(QpCore& qp)
    : qp_(qp), ctx_(qp.ctx()), dialer_(qp.loop(), qp.qpnRef()), stripe_(config::softTcpStripeMinBytes()) {}

// ---------------------------------------------------------------------------------------------
// The QP's state changes.

void RcRequester::startFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  nextSeq_ = attr().sqPsn;
  ackedThrough_ = attr().sqPsn - 1;
  dialer_.begin();
  startConnectFromLoop();
  pumpFromLoop();
}

void RcRequester::schedulePump() {
  if (pumpScheduled_.exchange(true)) return;
  // Progress where the application is: when the progress thread is not running the device's loop
  // (it sleeps), the posting thread sends the requests itself instead of waking it.
  if (ctx_.callerProgress() && ctx_.reactor().runHere([this] { pumpFromLoop(); })) return;
  std::weak_ptr<RcRequester> weak = self_;
  ctx_.reactor().post([weak] {
    if (auto self = weak.lock()) self->pumpFromLoop();
  });
}

void RcRequester::stopFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  if (conn_) conn_->close(Status::ok(), true);
  conn_.reset();
  ready_ = false;
  for (auto* timer : {&rnrTimer_, &timeoutTimer_}) {
    if (*timer) ctx_.reactor().cancelTimer(*timer);
    *timer = 0;
  }
  dialer_.cancelRetry();
  rnrWaiting_ = false;
}

void RcRequester::failOldestFromLoop(WcStatus status) {
  FERRY_ON_LOOP(ctx_.reactor());
  if (sq_.empty()) return;
  SendWqe wqe = std::move(sq_.front());
  sq_.pop_front();
  if (nextToSend_ > 0) --nextToSend_;
  qp_.completeSend(wqe, status);
}

void RcRequester::flushSendsFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  // A post copying on the same-host channel completes first; it then has the rest flushed.
  (void)qp_.takePosted(sq_);
  completeSendQueueFromLoop(WcStatus::kWrFlushErr);
}

void RcRequester::resetFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  stopFromLoop();
  dropStripeFromLoop();
  dialer_.reset();
  sq_.clear();
  nextToSend_ = 0;
  rdInFlight_ = 0;
  localErrorPending_ = false;
}

// ---------------------------------------------------------------------------------------------
// Sending.

WcStatus RcRequester::resolveLocalFromLoop(SendWqe& wqe) {
  FERRY_ON_LOOP(ctx_.reactor());
  wqe.local.clear();
  if (wqe.placed || !wqe.inlineData.empty() || wqe.sges.empty()) return WcStatus::kSuccess;
  const bool intoLocal = isReadOrAtomic(wqe.opcode);
  uint32_t need = intoLocal ? verbs::access::kLocalWrite : 0;
  std::shared_lock<std::shared_mutex> memLock(ctx_.memMu());
  for (const auto& sge : wqe.sges) {
    if (sge.length == 0) continue;
    auto entry = ctx_.findMrLocked(sge.lkey, qp_.pdId(), sge.addr, sge.length, need);
    if (!entry) {
      // As the kernel's rxe: a source key naming no region is a local QP operation error; a
      // range or permission the region refuses (and any bad destination) a protection error.
      bool keyKnown = ctx_.findMrLocked(sge.lkey, qp_.pdId(), 0, 0, 0, /*anyRange=*/true) != nullptr;
      return (!intoLocal && !keyKnown) ? WcStatus::kLocQpOpErr : WcStatus::kLocProtErr;
    }
    wqe.local.push_back(Segment{reinterpret_cast<uint8_t*>(sge.addr), sge.length, std::move(entry)});
  }
  return WcStatus::kSuccess;
}

OutFrame RcRequester::buildRequestFrame(const SendWqe& wqe, OutFrame* stripePart) {
  wire::FrameHeader h;
  h.seq = wqe.seq;
  h.qpn = attr().destQpNum;
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
      if (wqe.striped) h.flags |= wire::kFlagStriped;  // the response's second part comes on the stripe
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
  } else if (stripePart && stripe_.sharesWrite(wqe)) {
    // Half on this connection, half on the stripe (at a 4 KiB boundary): two threads copy it.
    const uint64_t first = stripeSplitAt(wqe.length);
    h.flags |= wire::kFlagStriped;
    h.length = static_cast<uint32_t>(wqe.length);
    h.payloadLen = static_cast<uint32_t>(first);
    splitSegments(wqe.local, first, &frame.payload, &stripePart->payload);
    wire::FrameHeader stripe;
    stripe.type = wire::FrameType::kStripeData;
    stripe.seq = wqe.seq;
    stripe.qpn = attr().destQpNum;
    stripe.payloadLen = static_cast<uint32_t>(wqe.length - first);
    stripePart->seq = wqe.seq;
    stripePart->headerLen = static_cast<uint16_t>(wire::encodeHeader(stripe, stripePart->header));
    stripe_.noteWriteShared();
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
// The requester's stripe (stripe.h).

void RcRequester::startStripeFromLoop(uint64_t ticket) {
  FERRY_ON_LOOP(ctx_.reactor());
  if (stripe_.out() || ticket == 0 || qp_.type() != verbs::QpType::kRc) return;
  Reactor* stripeReactor = ctx_.stripeReactorFromLoop();
  in_addr_t ip;
  uint16_t port;
  if (!stripeReactor || !parseSoftGid(attr().ahAttr.dgid, &ip, &port)) return;
  wire::FrameHeader hello;
  hello.type = wire::FrameType::kHello;
  hello.flags = wire::kFlagStripe;
  hello.qpn = attr().destQpNum;
  hello.srcQpn = qp_.qpn();
  hello.srcGid = ctx_.gid().raw;
  hello.nonce = ticket;
  std::weak_ptr<RcRequester> weak = self_;
  Reactor* loop = &ctx_.reactor();
  stripe_.open(
      &ctx_, stripeReactor, ip, port, hello,
      [weak, loop](uint64_t gen, StripeOut::Event event, uint32_t seq, uint32_t syndrome, const Status& why) {
        loop->post([weak, gen, event, seq, syndrome, why] {
          if (auto self = weak.lock()) self->onStripeEventFromLoop(gen, event, seq, syndrome, why);
        });
      });
}

void RcRequester::onStripeEventFromLoop(uint64_t gen, StripeOut::Event event, uint32_t seq, uint32_t syndrome,
                                        const Status& why) {
  FERRY_ON_LOOP(ctx_.reactor());
  if (!stripe_.current(gen)) return;  // a stripe since dropped
  switch (event) {
    case StripeOut::Event::kReadLanded:
      for (size_t i = 0; i < nextToSend_; ++i) {
        SendWqe& wqe = sq_[i];
        if (wqe.seq != seq || !wqe.striped || wqe.opcode != WrOpcode::kRdmaRead || wqe.stripeLanded) continue;
        wqe.stripeLanded = true;
        if (syndrome != 0) {
          wqe.error = statusForSyndrome(static_cast<wire::Syndrome>(syndrome));
        } else if (!why.isOk()) {
          wqe.error = WcStatus::kLocProtErr;  // a destination region went while the part arrived
        }
        completeFromLoop();
        break;
      }
      if (stripe_.outlivesConnection() && !readPartsDueFromLoop()) connectionLostFromLoop();  // heard out
      break;
    case StripeOut::Event::kReady: stripe_.markReady(); break;
    case StripeOut::Event::kRevoked: sourceRevokedFromLoop(seq); break;
    case StripeOut::Event::kClosed: {
      // WRITEs and READs go unlaned from now on. The connection itself stays: a responder that
      // loses a stripe ends the connection it belongs to (its striped WRITEs and READs could never
      // finish), and one that closed it on an error (ERR) still has its NAK on the way there.
      FERRY_LOG(kDebug, "QP %u: its stripe closed: %s", qp_.qpn(), why.toString().c_str());
      if (stripe_.outlivesConnection()) {
        connectionLostFromLoop();  // the connection went before the stripe: both are gone now
        break;
      }
      dropStripeFromLoop();  // what went striped stays so: halves are on their way, unsent frames still go
      if (qp_.state() == QpState::kRts && readPartsDueFromLoop()) {
        // Stripe events come in order, so every part that landed was told before this: the rest
        // never will. A responder that closed the stripe on a refusal has its NAK on the way on the
        // connection, and closes that too; short of that, the READs fail after the transport
        // timeout (whatever else the connection brings meanwhile).
        const uint64_t gen = stripe_.generation();
        const auto grace = attr().timeout == 0
                               ? std::chrono::seconds(2)
                               : std::max<Clock::duration>(transportBudget(), std::chrono::milliseconds(100));
        std::weak_ptr<RcRequester> weak = self_;
        ctx_.reactor().addTimer(Clock::now() + grace, [weak, gen] {
          auto self = weak.lock();
          if (!self || gen != self->stripe_.generation() || self->qp_.state() != QpState::kRts ||
              !self->readPartsDueFromLoop()) {
            return;
          }
          FERRY_LOG(kInfo, "QP %u: its stripe closed with READ parts due", self->qp_.qpn());
          self->qp_.enterErrorFromLoop(WcStatus::kRetryExcErr);
        });
      }
      break;
    }
  }
}

bool RcRequester::readPartsDueFromLoop() const {
  FERRY_ON_LOOP(ctx_.reactor());
  return std::any_of(
      sq_.begin(), sq_.begin() + static_cast<std::ptrdiff_t>(nextToSend_),
      [](const SendWqe& w) { return w.striped && w.opcode == WrOpcode::kRdmaRead && !w.stripeLanded; });
}

void RcRequester::connectionLostFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  dropStripeFromLoop();
  if (qp_.state() != QpState::kRts) return;
  if (nextToSend_ > 0) {
    FERRY_LOG(kInfo, "QP %u: connection to the peer lost with requests in flight", qp_.qpn());
    qp_.enterErrorFromLoop(WcStatus::kRetryExcErr);
    return;
  }
  scheduleReconnectFromLoop();
}

void RcRequester::dropStripeFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  stripe_.drop();
}

void RcRequester::pumpFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  pumpScheduled_ = false;
  if (!takePostedFromLoop() || !readyToSendFromLoop()) return;
  const uint32_t maxRd = std::max<uint32_t>(1, attr().maxRdAtomic);
  // The requests of one pump leave in one write (see Conn::cork).
  struct Corked {
    std::shared_ptr<Conn> conn;
    explicit Corked(std::shared_ptr<Conn> c) : conn(std::move(c)) { conn->cork(); }
    ~Corked() {
      if (!conn->closed()) conn->uncork();
    }
  } corked(conn_);
  // The stripe parts of this pump go to the stripe thread together, on leaving (one post, one write).
  struct StripeBatch {
    std::shared_ptr<StripeOut> stripe;
    std::vector<OutFrame> frames;
    ~StripeBatch() {
      if (stripe && !frames.empty()) stripe->send(std::move(frames));
    }
  } stripeBatch{stripe_.out(), {}};
  while (nextToSend_ < sq_.size()) {
    SendWqe& wqe = sq_[nextToSend_];
    const bool rdAtomic = isReadOrAtomic(wqe.opcode);
    if (rdAtomic && rdInFlight_ >= maxRd) break;
    if ((wqe.flags & verbs::send_flags::kFence) && rdInFlight_ > 0) break;
    const size_t stripeParts = stripeBatch.frames.size();
    const bool more = sendRequestFromLoop(wqe, &stripeBatch.frames);
    if (stripeBatch.frames.size() != stripeParts) stripeBatch.stripe = stripe_.out();
    if (!more) return;
  }
  armTimeoutFromLoop();
}

bool RcRequester::takePostedFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  const bool idle = sq_.empty();
  // A post copying on the same-host channel schedules the pump when it ends.
  if (!qp_.takePosted(sq_)) return false;
  if (idle && !sq_.empty()) lastProgress_ = ctx_.reactor().runNow();
  return true;
}

bool RcRequester::readyToSendFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  const QpState state = qp_.state();
  if (state == QpState::kErr) {
    qp_.flushFromLoop();  // a receive posted in ERR is flushed this way too
    return false;
  }
  if (state != QpState::kRts || sq_.empty()) return false;
  if (stripe_.outlivesConnection()) {  // the connection is gone; its stripe is heard out first
    armTimeoutFromLoop();
    return false;
  }
  if (!conn_ || !ready_) {
    if (!conn_ && !dialer_.retryPending()) startConnectFromLoop();
    armTimeoutFromLoop();
    return false;
  }
  return !rnrWaiting_ && !localErrorPending_;
}

bool RcRequester::sendRequestFromLoop(SendWqe& wqe, std::vector<OutFrame>* stripeParts) {
  FERRY_ON_LOOP(ctx_.reactor());
  const bool rdAtomic = isReadOrAtomic(wqe.opcode);
  wqe.seq = nextSeq_++;
  ++nextToSend_;
  if (wqe.rnrLeft < 0) wqe.rnrLeft = attr().rnrRetry;
  if (WcStatus local = resolveLocalFromLoop(wqe); local != WcStatus::kSuccess) {
    wqe.error = local;
    localErrorPending_ = true;
    completeFromLoop();
    return false;
  }
  if (rdAtomic) ++rdInFlight_;
  if (uint64_t ticket = 0; stripe_.openBefore(wqe, &ticket)) {
    startStripeFromLoop(ticket);  // this one goes whole; later ones share
  }
  wqe.striped = false;
  wqe.stripeLanded = false;
  if (stripe_.sharesRead(wqe)) {
    // The response's second part comes back on the stripe, placed by the stripe thread: it knows
    // where before the request leaves.
    Segments tail;
    const uint64_t first = stripeSplitAt(wqe.length);
    splitSegments(wqe.local, first, nullptr, &tail);
    stripe_.out()->expectRead(wqe.seq, wqe.length - first, std::move(tail));
    wqe.striped = true;
  }
  OutFrame stripePart;
  OutFrame frame = buildRequestFrame(wqe, &stripePart);
  if (stripePart.headerLen != 0) {
    wqe.striped = true;
    stripeParts->push_back(std::move(stripePart));
  }
  conn_->send(std::move(frame));
  return qp_.state() == QpState::kRts && conn_;  // else the send failed and closed things
}

void RcRequester::completeFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  while (!sq_.empty() && nextToSend_ > 0) {
    SendWqe& wqe = sq_.front();
    if (wqe.error != WcStatus::kSuccess) {
      qp_.enterErrorFromLoop(wqe.error);
      return;
    }
    if (!seqLe(wqe.seq, ackedThrough_)) break;
    if (wqe.striped && wqe.opcode == WrOpcode::kRdmaWrite && sourceRevoked(wqe)) {
      // The stripe thread reports a source region that went while it sent its half, but that report
      // can reach this loop after the ACK. A region that went before the completion fails the WRITE
      // here (zeros may have gone in its place); revocation is for good, so none is missed.
      qp_.enterErrorFromLoop(WcStatus::kLocProtErr);
      return;
    }
    if (wqe.striped && wqe.opcode == WrOpcode::kRdmaRead && !wqe.stripeLanded)
      break;  // its stripe part is due
    if (isReadOrAtomic(wqe.opcode)) {
      if (!wqe.responded) {
        FERRY_LOG(kWarn, "QP %u: acknowledgement skipped a READ/atomic response", qp_.qpn());
        qp_.enterErrorFromLoop(WcStatus::kBadRespErr);
        return;
      }
      if (rdInFlight_ > 0) --rdInFlight_;
    }
    SendWqe done = std::move(wqe);
    sq_.pop_front();
    --nextToSend_;
    qp_.completeSend(done, WcStatus::kSuccess);
  }
  // No progress stamp here: the frames that complete requests (ACKs, responses) came on conn_,
  // whose every read stamped it (onProgress) just before; a striped READ's part is the stripe's
  // progress, which the transport timer asks the stripe for.
  // The transport timer stays when the queue empties: it lapses when it fires with nothing sent,
  // and one that fires after the queue filled again re-arms from the progress made since. So a
  // message costs no timer of its own, which a caller's post would have to wake the progress thread
  // for (it may be due before the thread's own wake-up).
  if (qp_.state() == QpState::kRts && nextToSend_ < sq_.size()) pumpFromLoop();
}

RcRequester::Clock::duration RcRequester::transportBudget() const {
  // 4.096 us * 2^timeout per try, at least 1 ms; retry_cnt retries after the first try.
  double perTryUs = 4.096 * static_cast<double>(1ull << attr().timeout);
  perTryUs = std::max(perTryUs, 1000.0);
  return std::chrono::microseconds(static_cast<int64_t>(perTryUs * (attr().retryCnt + 1)));
}

void RcRequester::armTimeoutFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  if (timeoutTimer_ || attr().timeout == 0 || sq_.empty()) return;
  std::weak_ptr<RcRequester> weak = self_;
  timeoutTimer_ = ctx_.reactor().addTimer(lastProgress_ + transportBudget(), [weak] {
    if (auto self = weak.lock()) self->onTimeoutFromLoop();
  });
}

void RcRequester::onTimeoutFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  timeoutTimer_ = 0;
  if (sq_.empty() || qp_.state() != QpState::kRts) return;
  auto now = Clock::now();
  if (rnrWaiting_) lastProgress_ = now;
  if (stripe_.out()) {
    // Bytes the stripe moved are progress too (a striped WRITE's ACK waits for both halves).
    const auto stripeProgress = Clock::time_point(std::chrono::nanoseconds(stripe_.lastProgressNs()));
    lastProgress_ = std::max(lastProgress_, std::min(stripeProgress, now));
  }
  if (now - lastProgress_ >= transportBudget()) {
    FERRY_LOG(kInfo, "QP %u: no progress within the transport timeout; retries exhausted", qp_.qpn());
    qp_.enterErrorFromLoop(WcStatus::kRetryExcErr);
    return;
  }
  armTimeoutFromLoop();
}

void RcRequester::startConnectFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  if (conn_ || qp_.state() != QpState::kRts) return;
  auto link = dialer_.dialTcp(ctx_.ipv4(), attr().ahAttr.dgid);
  if (!link.isOk()) {
    // A GID that names no soft device is never dialed; anything else is tried again.
    if (link.status().code() != StatusCode::kInvalidArgument) scheduleReconnectFromLoop();
    return;
  }
  if (!adoptLinkFromLoop(std::move(*link))) scheduleReconnectFromLoop();
}

bool RcRequester::adoptLinkFromLoop(std::unique_ptr<Link> link) {
  FERRY_ON_LOOP(ctx_.reactor());
  conn_ = std::make_shared<Conn>(&ctx_, std::move(link), this);
  ready_ = false;
  stripe_.newConnection();
  if (conn_->attach().isOk()) return true;
  conn_.reset();
  return false;
}

void RcRequester::completeSendQueueFromLoop(WcStatus status) {
  FERRY_ON_LOOP(ctx_.reactor());
  while (!sq_.empty()) {
    SendWqe wqe = std::move(sq_.front());
    sq_.pop_front();
    qp_.completeSend(wqe, status);
  }
  nextToSend_ = 0;
  rdInFlight_ = 0;
}

void RcRequester::peerGoneFromLoop(const char* why) {
  FERRY_ON_LOOP(ctx_.reactor());
  dialer_.markPeerGone(why);
  if (qp_.type() == verbs::QpType::kUc) {
    // UC has no retries and no acknowledgements: a NIC sends into the void and completes. So do we.
    completeSendQueueFromLoop(WcStatus::kSuccess);
    return;
  }
  // Work waiting for it fails now, as a NIC's would once its retries ran out; later work fails
  // as soon as it is posted (its connection attempt is refused the same way).
  if (!sq_.empty()) qp_.enterErrorFromLoop(WcStatus::kRetryExcErr);
}

void RcRequester::scheduleReconnectFromLoop() {
  FERRY_ON_LOOP(ctx_.reactor());
  if (qp_.state() != QpState::kRts) return;
  std::weak_ptr<RcRequester> weak = self_;
  dialer_.scheduleRetry(!sq_.empty(), transportBudget(), [weak] {
    if (auto self = weak.lock()) {
      self->dialer_.retryDue();
      self->startConnectFromLoop();
    }
  });
}

void RcRequester::onConnected(Conn& conn) {
  if (&conn != conn_.get()) return;
  dialer_.listenerReached();
  wire::FrameHeader hello;
  hello.type = wire::FrameType::kHello;
  hello.qpn = attr().destQpNum;
  hello.srcQpn = qp_.qpn();
  hello.psn = nextSeq_ & 0xffffff;
  hello.maxRdAtomic = attr().maxRdAtomic;
  hello.srcGid = ctx_.gid().raw;
  if (!conn.link().sameHost() && !dialer_.ringsRefused() && sameHostRingsAllowed())
    hello.flags |= wire::kFlagRingOffer;
  conn.sendHeader(hello);
}

bool RcRequester::startRingConnectFromLoop(uint32_t pid, uint64_t nonce, uint64_t ticket) {
  FERRY_ON_LOOP(ctx_.reactor());
  auto link = dialer_.dialRing(pid, nonce, ticket);
  if (!link.isOk()) return false;
  if (!adoptLinkFromLoop(std::move(*link))) {
    dialer_.stayOnTcp("could not watch the ring");
    return false;
  }
  onConnected(*conn_);
  return true;
}

void RcRequester::onProgress(Conn& conn) {
  if (&conn == conn_.get() && ready_) {
    // The run's clock: the connection told the loop of the bytes it moved (Reactor::noteWork), so
    // the reading is close enough for the transport timer.
    lastProgress_ = ctx_.reactor().runNow();
  }
}

void RcRequester::onClosed(Conn& conn, const Status& why) {
  if (&conn != conn_.get()) return;
  bool wasReady = ready_;
  if (!wasReady && conn.link().sameHost() && !dialer_.ringsRefused()) {
    // The peer's ring listener dropped our rings before they carried a hello (too many others
    // waiting on it, a ticket it no longer honours): the next connection stays on TCP, which a
    // crowd on that listener cannot block.
    dialer_.stayOnTcp("the peer dropped them before the hello: " + why.toString());
  }
  conn_.reset();
  ready_ = false;
  qp_.closeSameHost();
  if (qp_.state() == QpState::kRts && wasReady && qp_.type() == verbs::QpType::kRc && stripe_.out() &&
      readPartsDueFromLoop()) {
    // The second parts of READs the responder answered on this connection may still be on the
    // stripe (a responder that refused a request closes both once they are out): hear the stripe out
    // first, up to its close or the transport timeout (onStripeEventFromLoop).
    stripe_.outliveConnection();
    armTimeoutFromLoop();
    return;
  }
  dropStripeFromLoop();
  if (qp_.state() != QpState::kRts) return;
  if (wasReady && nextToSend_ > 0 && qp_.type() == verbs::QpType::kUc) {
    // UC: what was sent is gone with the connection, as packets are lost on a NIC; those sends
    // completed when they left. The rest goes on the next connection.
    ackedThrough_ = nextSeq_ - 1;
    completeFromLoop();
  } else if (wasReady && nextToSend_ > 0) {
    FERRY_LOG(kInfo, "QP %u: connection to the peer lost with requests in flight: %s", qp_.qpn(),
              why.toString().c_str());
    qp_.enterErrorFromLoop(WcStatus::kRetryExcErr);
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

Status RcRequester::onHeader(Conn& conn, const wire::FrameHeader& h, PayloadPlan* plan) {
  if (&conn != conn_.get())
    return Status(StatusCode::kProtocolError, "frame on a connection the QP no longer uses");
  return onResponseHeader(h, plan);
}

Status RcRequester::onResponseHeader(const wire::FrameHeader& h, PayloadPlan* plan) {
  using wire::FrameType;
  if (!ready_) {
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
        // A striped READ's response carries its first part here; the rest comes on the stripe.
        const uint64_t here = wqe.striped ? stripeSplitAt(wqe.length) : wqe.length;
        if (wqe.seq != h.seq || h.payloadLen != here) {
          return Status(StatusCode::kProtocolError, "READ response does not match the oldest READ");
        }
        if (wqe.striped) {
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

void RcRequester::onFrame(Conn& conn, const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t trailer) {
  if (&conn != conn_.get()) return;
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

void RcRequester::onHelloReplyFromLoop(const wire::FrameHeader& h) {
  FERRY_ON_LOOP(ctx_.reactor());
  if (static_cast<wire::HelloResult>(h.aux) == wire::HelloResult::kUseRing) {
    // The peer is on this host: the same conversation again, over shared-memory rings.
    conn_->close(Status::ok(), true);
    conn_.reset();
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
    ready_ = true;
    dialer_.helloAccepted();
    qp_.openSameHostFromLoop(h);
    // The stripe opens with the first WRITE large enough to share: a QP that never sends one
    // keeps a single connection.
    stripe_.offer(conn_->link().sameHost() ? 0 : h.stripeTicket);
    lastProgress_ = Clock::now();
    pumpFromLoop();
    return;
  }
  // The peer QP is not ready yet (kNotReady: its owner has not moved it to RTR), or refuses us
  // for now: try again until the transport timeout. A QP that was reached before and now is
  // not there (destroyed, or in ERR) is gone.
  conn_->close(Status::ok(), true);
  conn_.reset();
  if (dialer_.wasPeerReached() && static_cast<wire::HelloResult>(h.aux) == wire::HelloResult::kNoSuchQp) {
    peerGoneFromLoop("its queue pair no longer exists");
    return;
  }
  scheduleReconnectFromLoop();
  armTimeoutFromLoop();
}

SendWqe* RcRequester::sentWqe(uint32_t seq) {
  for (size_t i = 0; i < nextToSend_; ++i) {
    if (sq_[i].seq == seq) return &sq_[i];
  }
  return nullptr;
}

void RcRequester::onReadResponseFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan,
                                         uint32_t trailer) {
  FERRY_ON_LOOP(ctx_.reactor());
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

void RcRequester::onAtomicResponseFromLoop(const wire::FrameHeader& h) {
  FERRY_ON_LOOP(ctx_.reactor());
  SendWqe* wqe = sentWqe(h.seq);
  if (!wqe || !isAtomic(wqe->opcode)) {
    qp_.enterErrorFromLoop(WcStatus::kBadRespErr);
    return;
  }
  wqe->responded = true;
  {
    std::shared_lock<std::shared_mutex> memLock(ctx_.memMu());
    if (wqe->local.empty() || wqe->local[0].entry->revoked ||
        !writeRegion(*wqe->local[0].entry, wqe->local[0].ptr, &h.atomicResult, 8)) {
      wqe->error = WcStatus::kLocProtErr;
    }
  }
  ackedThrough_ = wqe->error == WcStatus::kSuccess ? h.seq : h.seq - 1;
  completeFromLoop();
}

void RcRequester::onNakFromLoop(const wire::FrameHeader& h) {
  FERRY_ON_LOOP(ctx_.reactor());
  SendWqe* wqe = sentWqe(h.seq);
  if (!wqe) {
    qp_.enterErrorFromLoop(WcStatus::kBadRespErr);
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
  if (qp_.state() != QpState::kRts || sq_.empty()) {
    rnrWaiting_ = false;
    return;
  }
  // What came before is done at the responder, yet a striped READ among it may still wait for
  // its second part: it stays sent, and the resend starts at the refused request.
  size_t refused = 0;
  while (refused < nextToSend_ && sq_[refused].seq != h.seq) ++refused;
  if (refused == nextToSend_) {
    qp_.enterErrorFromLoop(WcStatus::kBadRespErr);
    return;
  }
  SendWqe& front = sq_[refused];
  if (attr().rnrRetry != 7) {
    if (front.rnrLeft <= 0) {
      qp_.enterErrorFromLoop(WcStatus::kRnrRetryExcErr);
      return;
    }
    --front.rnrLeft;
  }
  rewindForRnrFromLoop(refused, static_cast<uint8_t>(h.flags & 31));
}

void RcRequester::rewindForRnrFromLoop(size_t refused, uint8_t rnrTimerCode) {
  FERRY_ON_LOOP(ctx_.reactor());
  SendWqe& front = sq_[refused];
  // Frames not yet out are dropped, except on a connection that striped: each striped WRITE's
  // second half is on the stripe already, and the responder matches halves in order, so every
  // frame goes (the responder drops those after the refused one, halves too).
  if (conn_ && !stripe_.usedOnConnection()) conn_->dropUnsentFrames();
  // The responder answers none of the READs from the refused request on: their parts will
  // not come, and the resend expects them anew.
  if (stripe_.out()) stripe_.out()->forgetReadsFrom(front.seq);
  nextSeq_ = front.seq;
  nextToSend_ = refused;
  rdInFlight_ =
      static_cast<uint32_t>(std::count_if(sq_.begin(), sq_.begin() + static_cast<std::ptrdiff_t>(refused),
                                          [](const SendWqe& w) { return isReadOrAtomic(w.opcode); }));
  for (size_t i = refused; i < sq_.size(); ++i) sq_[i].responded = false;
  rnrWaiting_ = true;
  std::weak_ptr<RcRequester> weak = self_;
  auto wait = std::chrono::microseconds(verbs::rnrTimerMicros(rnrTimerCode));
  rnrTimer_ = ctx_.reactor().addTimer(Clock::now() + wait, [weak] {
    if (auto self = weak.lock()) {
      self->rnrTimer_ = 0;
      self->rnrWaiting_ = false;
      self->lastProgress_ = Clock::now();
      self->pumpFromLoop();
    }
  });
}

void RcRequester::onPayloadRevoked(Conn& conn, const OutFrame& frame) {
  if (&conn != conn_.get()) return;  // the responder reports it in the READ_RESP trailer
  sourceRevokedFromLoop(frame.seq);
}

bool RcRequester::sourceRevoked(const SendWqe& wqe) const {
  std::shared_lock<std::shared_mutex> memLock(ctx_.memMu());
  return std::any_of(wqe.local.begin(), wqe.local.end(),
                     [](const Segment& seg) { return seg.entry && seg.entry->revoked; });
}

void RcRequester::sourceRevokedFromLoop(uint32_t seq) {
  FERRY_ON_LOOP(ctx_.reactor());
  // The application deregistered a source region while the request's bytes were being sent (on
  // the QP's connection or its stripe): zeros went in their place, and the request fails.
  for (size_t i = 0; i < nextToSend_; ++i) {
    if (sq_[i].seq == seq) {
      sq_[i].error = WcStatus::kLocProtErr;
      localErrorPending_ = true;
    }
  }
}

}  // namespace ferry::soft
