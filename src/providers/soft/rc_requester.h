// RcRequester: the requester half of a connected queue pair (RC, and UC without its answers).
//
// Send work requests get a sequence number each and go out on the requester's connection in
// order; they complete in order when acknowledged (WRITE, SEND), answered (READ, atomics) or
// failed. A receiver-not-ready NAK rewinds to the refused request and resends it and everything
// after it once the RNR timer has run (go-back-N). No progress for the transport timeout
// (4.096 us * 2^timeout * (retry_cnt + 1)), or a connection lost with requests in flight, fails the
// oldest request with RETRY_EXC_ERR.
//
// It reaches the peer through its Dialer (TCP, or shared-memory rings to a peer on this host), and
// opens the QP's same-host channel when the peer's hello reply offers one. On TCP, its connection's
// stripe (stripe.h; its state in OutboundStripe) carries the second half of each large WRITE and of
// each large READ's response.
// Reactor thread, except schedulePump.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "common/ring_deque.h"
#include "providers/soft/conn.h"
#include "providers/soft/dialer.h"
#include "providers/soft/outbound_stripe.h"
#include "providers/soft/qp_core.h"
#include "providers/soft/stripe.h"

namespace ferry::soft {

class RcRequester final : public Conn::Delegate {
 public:
  explicit RcRequester(QpCore& qp);
  RcRequester(const RcRequester&) = delete;
  RcRequester& operator=(const RcRequester&) = delete;

  // This part as a timer or another thread's callback captures it (QpCore::weakPart), made once
  // right after the QP is (SoftQp::bindParts): copying it is one atomic step, making it five.
  void bindSelf(std::weak_ptr<RcRequester> self) { self_ = std::move(self); }

  // The QP entered RTS: sequence numbers start at the QP's sq_psn, and the dialing starts.
  void startFromLoop();
  // Sends what was posted, from any thread: on the loop, or here when the caller may run it.
  void schedulePump();
  void pumpFromLoop();
  // The QP entered ERR (once): the connection and the timers go, and no dial is tried again. With
  // status, the oldest request fails with it first.
  void stopFromLoop();
  void failOldestFromLoop(verbs::WcStatus status);
  // The stripe goes first when the QP fails: a READ part it is placing lands before the READ fails.
  void dropStripeFromLoop();
  // Completes every request of the send queue (the posted ones too, unless a post is copying on
  // the same-host channel: it completes first, then has the rest flushed) with WR_FLUSH_ERR.
  void flushSendsFromLoop();
  // Back to RESET: everything sent, learned and connected is forgotten.
  void resetFromLoop();

  // Conn::Delegate (the requester's connection).
  Status onHeader(Conn& conn, const wire::FrameHeader& header, PayloadPlan* plan) override;
  void onFrame(Conn& conn, const wire::FrameHeader& header, const PayloadPlan& plan,
               uint32_t trailer) override;
  void onPayloadRevoked(Conn& conn, const OutFrame& frame) override;
  void onProgress(Conn& conn) override;
  void onConnected(Conn& conn) override;
  void onClosed(Conn& conn, const Status& why) override;

 private:
  std::weak_ptr<RcRequester> self_;  // bindSelf
  using Clock = std::chrono::steady_clock;

  const verbs::QpAttr& attr() const { return qp_.attrOnLoop(); }
  void completeFromLoop();
  // Completes every request of the send queue with status, in order.
  void completeSendQueueFromLoop(verbs::WcStatus status);
  // Dials the peer (dialer_) and adopts the link as the requester's connection.
  void startConnectFromLoop();
  // Connects to the peer's ring listener (a kUseRing hello reply); false when that cannot be done
  // (the QP then connects over TCP without offering rings).
  bool startRingConnectFromLoop(uint32_t pid, uint64_t nonce, uint64_t ticket);
  // Adopts a dialed link as conn_; false when the reactor cannot watch it.
  bool adoptLinkFromLoop(std::unique_ptr<Link> link);
  void scheduleReconnectFromLoop();
  // The peer we had reached is gone (why, for the log): pending work fails with RETRY_EXC_ERR.
  void peerGoneFromLoop(const char* why);
  void armTimeoutFromLoop();
  void onTimeoutFromLoop();
  Clock::duration transportBudget() const;
  // The frame of a request. With stripePart, a WRITE that the stripe should share is split: the frame
  // carries its first half (kFlagStriped) and *stripePart the rest (a kStripeData frame); otherwise
  // stripePart is left empty (headerLen 0).
  OutFrame buildRequestFrame(const SendWqe& wqe, OutFrame* stripePart = nullptr);
  // Resolves the local SGEs of wqe; the completion status a bad one fails it with, else kSuccess.
  verbs::WcStatus resolveLocalFromLoop(SendWqe& wqe);

  // The stripe (stripe.h).
  void startStripeFromLoop(uint64_t ticket);
  void sourceRevokedFromLoop(uint32_t seq);      // fails the sent request `seq` (LOC_PROT_ERR)
  bool sourceRevoked(const SendWqe& wqe) const;  // a source region of wqe was deregistered
  void onStripeEventFromLoop(uint64_t gen, StripeOut::Event event, uint32_t seq, uint32_t syndrome,
                             const Status& why);
  // A sent striped READ whose second part has not landed yet.
  bool readPartsDueFromLoop() const;
  // The QP's connection is gone (its stripe too, now): what is in flight fails, or it reconnects.
  void connectionLostFromLoop();

  // pumpFromLoop's steps: posted requests moved to sq_ (false while a same-host post copies),
  // whether the QP can send now (else what it waits for is arranged), and one request sent (its
  // stripe part, if any, added to stripeParts); false: stop, the QP failed or closed.
  bool takePostedFromLoop();
  bool readyToSendFromLoop();
  bool sendRequestFromLoop(SendWqe& wqe, std::vector<OutFrame>* stripeParts);
  // Frames from the responder.
  Status onResponseHeader(const wire::FrameHeader& h, PayloadPlan* plan);
  void onHelloReplyFromLoop(const wire::FrameHeader& h);  // the dial's answer: ready, ring, or again
  void onReadResponseFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t trailer);
  void onAtomicResponseFromLoop(const wire::FrameHeader& h);
  void onNakFromLoop(const wire::FrameHeader& h);
  // After an RNR NAK of sq_[refused]: resend from it once the peer's RNR timer (IBA code) ran out.
  void rewindForRnrFromLoop(size_t refused, uint8_t rnrTimerCode);
  SendWqe* sentWqe(uint32_t seq);  // the sent request `seq`, or nullptr

  QpCore& qp_;
  SoftContext& ctx_;
  std::atomic<bool> pumpScheduled_{false};

  RingDeque<SendWqe> sq_;  // [0, nextToSend_) sent and waiting; the rest not sent yet
  size_t nextToSend_ = 0;
  uint32_t nextSeq_ = 0;
  uint32_t ackedThrough_ = 0;  // every request up to here is done at the responder
  uint32_t rdInFlight_ = 0;
  bool localErrorPending_ = false;
  bool rnrWaiting_ = false;
  Reactor::TimerId rnrTimer_ = 0;
  Reactor::TimerId timeoutTimer_ = 0;
  Clock::time_point lastProgress_{};
  Dialer dialer_;  // reaching the peer, and what was learned of it
  std::shared_ptr<Conn> conn_;
  bool ready_ = false;  // the peer accepted conn_'s hello

  OutboundStripe stripe_;  // the connection's stripe (outbound_stripe.h)
};

}  // namespace ferry::soft
