// RcResponder: the responder half of a connected queue pair (RC, and UC, which drops what it
// cannot take instead of refusing it).
//
// Requests from the peer arrive in order on the responder's connection (the one the peer's
// requester dialed, adopted when its hello names this QP's peer). Each is checked at access time
// (keys, protection domain, access flags, range) and carried out by the reactor thread, without
// the application's help; it is acknowledged (coalesced: one ACK when the input is drained),
// answered (READ, atomics), or refused with a NAK that moves the QP to ERR. A SEND with no receive
// posted gets an RNR NAK, and what follows is dropped until the requester resends it.
//
// The peer's stripe (stripe.h: StripeIn, read on the stripe thread) brings the second halves of
// its large WRITEs and takes the second parts of large READ responses. What the stripe owes, and
// what waits for it, is the InboundStripe's to keep (inbound_stripe.h); the responder asks it
// whether a request may pass, and how far an ACK may go. Reactor thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "providers/soft/conn.h"
#include "providers/soft/inbound_stripe.h"
#include "providers/soft/qp_core.h"
#include "providers/soft/stripe.h"

namespace ferry::soft {

class RcResponder final : public Conn::Delegate {
 public:
  explicit RcResponder(QpCore& qp);
  RcResponder(const RcResponder&) = delete;
  RcResponder& operator=(const RcResponder&) = delete;

  // This part as a timer or another thread's callback captures it (QpCore::weakPart), made once
  // right after the QP is (SoftQp::bindParts): copying it is one atomic step, making it five.
  void bindSelf(std::weak_ptr<RcResponder> self) { self_ = std::move(self); }

  // The QP entered RTR: the first request expected is the QP's rq_psn.
  void startFromLoop();
  // A hello from a peer for this QP. On kAccepted the responder adopts conn, unless adopt is false
  // (the peer is only told to connect again over shared-memory rings).
  wire::HelloResult acceptFromLoop(const std::shared_ptr<Conn>& conn, const wire::FrameHeader& hello,
                                   in_addr_t peerIp, bool adopt);
  // A one-time secret for the hello reply of the TCP connection just accepted: a stripe of it shows
  // it in its own hello (0: none to give).
  uint64_t issueStripeTicketFromLoop();
  // A stripe's hello (kFlagStripe) from peerIp: adopted when it names our peer and shows the ticket of
  // our current connection.
  wire::HelloResult acceptStripeFromLoop(const std::shared_ptr<Conn>& conn, const wire::FrameHeader& hello,
                                         in_addr_t peerIp);
  // The ACK onInputDrained left to the next run (SoftContext::deferAckFromLoop), when one is due.
  void sendDeferredAckFromLoop();
  // The QP entered ERR (once): a NAK queued still reaches the peer, and so do the READ parts on
  // the stripe; then the connection and the stripe close.
  void stopAfterErrorFromLoop();
  // Flushes the receive being filled and those posted (WR_FLUSH_ERR).
  void flushRecvsFromLoop();
  // Back to RESET.
  void resetFromLoop();

  // Conn::Delegate (the responder's connection).
  Status onHeader(Conn& conn, const wire::FrameHeader& header, PayloadPlan* plan) override;
  void onFrame(Conn& conn, const wire::FrameHeader& header, const PayloadPlan& plan,
               uint32_t trailer) override;
  void onInputDrained(Conn& conn) override;
  void onClosed(Conn& conn, const Status& why) override;

 private:
  std::weak_ptr<RcResponder> self_;  // bindSelf
  const verbs::QpAttr& attr() const { return qp_.attrOnLoop(); }
  // Whether a hello names our peer (its QP number and GID, from that GID's address) to a QP that
  // is ready (RTR/RTS): kAccepted, or the result to refuse it with.
  wire::HelloResult helloFromOurPeer(const wire::FrameHeader& hello, in_addr_t peerIp);
  // UC: the responder drops the current message silently.
  void dropMessageFromLoop();
  // A SEND or WRITE_WITH_IMM (sequence number seq) found no receive posted: UC drops the
  // message; RC refuses it with an RNR NAK and drops what follows until the requester resends it.
  void noReceiveFromLoop(uint32_t seq);
  void sendNakFromLoop(uint32_t seq, wire::Syndrome syndrome);
  // Refuses the current request: NAK it, record the error, move the QP to ERR.
  void refuseFromLoop(uint32_t seq, wire::Syndrome syndrome, verbs::AsyncEventType event);
  // The request's checks and where its payload lands (onHeader); a refusal answers the NAK.
  Status onRequestHeader(const wire::FrameHeader& h, PayloadPlan* plan);
  void planSendFromLoop(const wire::FrameHeader& h, PayloadPlan* plan);
  void planWriteFromLoop(const wire::FrameHeader& h, PayloadPlan* plan);
  std::shared_ptr<MrEntry> remoteEntry(const wire::FrameHeader& h, uint64_t addr, uint64_t len,
                                       uint32_t need);
  bool qpAllowsFromLoop(const wire::FrameHeader& h, uint32_t need);
  // The request once its payload landed (onFrame): completions, and the answers.
  void receivedSendFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan);
  void receivedWriteFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan);
  void answerReadFromLoop(const wire::FrameHeader& h);
  void answerAtomicFromLoop(const wire::FrameHeader& h);
  // The atomic of h on a region of device memory (the memory lock held): false when the driver
  // refused a copy.
  static bool atomicOnDeviceLocked(const MrEntry& entry, const wire::FrameHeader& h, uint64_t* original);
  // Acknowledges what is done and landed (onInputDrained, and when a stripe piece lands).
  void sendAckFromLoop(Conn& conn);

  // The stripe tells (on this loop) of a piece placed, or of its end.
  void onStripeEventFromLoop(uint64_t gen, StripeIn::Event event, uint32_t seq, bool revoked,
                             const Status& why);
  // Whether the connection may take request h now, with stripe pieces pending.
  bool mayPassPendingStripes(const wire::FrameHeader& h);

  QpCore& qp_;
  SoftContext& ctx_;

  std::shared_ptr<Conn> conn_;
  uint32_t expectedSeq_ = 0;
  bool nakPending_ = false;  // after an RNR NAK: drop requests until the refused one returns
  bool skip_ = false;        // the frame being received is dropped
  bool ackNeeded_ = false;
  bool ackDeferred_ = false;         // an ACK waits in SoftContext's list for the next run
  std::optional<uint32_t> lastAck_;  // the last ACK sendAckFromLoop sent on conn_
  std::optional<RecvWqe> curRecv_;   // the receive a SEND / WRITE_WITH_IMM being received consumes

  // The connection's stripe: the pieces it owes, and what waits for them (inbound_stripe.h).
  InboundStripe stripe_;
};

}  // namespace ferry::soft
