// SoftQp: a reliable-connected queue pair of the soft provider.
//
// Requester half: send work requests get a sequence number each and go out on the requester
// connection in order; they complete in order when acknowledged (WRITE, SEND), answered (READ,
// atomics) or failed. A receiver-not-ready NAK rewinds to the refused request and resends it and
// everything after it once the RNR timer has run (go-back-N). No progress for the transport
// timeout (4.096 us * 2^timeout * (retry_cnt + 1)), or a connection lost with requests in flight,
// fails the oldest request with RETRY_EXC_ERR.
//
// Responder half: requests from the peer arrive in order on the responder connection; each is
// checked at access time (keys, protection domain, access flags, range) and carried out by the
// reactor thread, without the application's help.
//
// Same-host path (share.h): when the peer's hello reply offers its table and we can reach its
// memory, a WRITE or READ posted while nothing else is outstanding on the QP is carried out by the
// posting thread itself — checked against the peer's records, one process_vm_writev/readv, and its
// completion — before ibv_post_send returns. A WRITE_WITH_IMM's data moves the same way and only
// its immediate goes over TCP (a WRITE_IMM frame with kFlagPlaced). On memory both sides map
// (ferry/common/shared_memory.h) the copy is a memcpy into the requester's mapping of it, and
// atomics are carried out there too. Anything else, or anything the records refuse, goes over TCP
// in order behind it.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "common/ring_deque.h"
#include "providers/soft/conn.h"
#include "providers/soft/dialer.h"
#include "providers/soft/lane.h"
#include "providers/soft/soft.h"

namespace ferry::soft {

class SoftQp final : public verbs::QpImpl,
                     public Conn::Delegate,
                     public std::enable_shared_from_this<SoftQp> {
 public:
  SoftQp(std::shared_ptr<SoftContext> ctx, std::shared_ptr<SoftPd> pd, const verbs::QpInitImpl& init);
  ~SoftQp() override;

  uint32_t qpNum() const override { return qpn_; }
  verbs::QpType type() const override { return type_; }
  Status modify(const verbs::QpAttr& attr, uint32_t mask) override;
  Result<verbs::QpAttr> query() override;
  verbs::QpCap cap() const override { return cap_; }
  Status postSend(std::span<const verbs::SendWr> wrs, size_t* badIndex) override;
  Status postRecv(std::span<const verbs::RecvWr> wrs, size_t* badIndex) override;
  void close() override;

  void setQpn(uint32_t qpn) { qpn_ = qpn; }
  const void* pdId() const { return pd_.get(); }
  // A hello from a peer for this QP (reactor thread). On kAccepted the QP adopts conn, unless
  // adopt is false (the peer is only told to connect again over shared-memory rings).
  wire::HelloResult acceptFromLoop(const std::shared_ptr<Conn>& conn, const wire::FrameHeader& hello,
                                   in_addr_t peerIp, bool adopt = true);
  // A one-time secret for the hello reply of the TCP connection just accepted: a lane of it
  // (lane.h) shows it in its own hello (0: none to give).
  uint64_t issueLaneTicketFromLoop();
  // A lane's hello (kFlagLane) from peerIp: adopted when it names our peer and shows the ticket
  // of our current responder connection.
  wire::HelloResult acceptLaneFromLoop(const std::shared_ptr<Conn>& conn, const wire::FrameHeader& hello,
                                       in_addr_t peerIp);

  // Conn::Delegate
  Status onHeader(Conn& conn, const wire::FrameHeader& header, PayloadPlan* plan) override;
  void onFrame(Conn& conn, const wire::FrameHeader& header, const PayloadPlan& plan,
               uint32_t trailer) override;
  void onInputDrained(Conn& conn) override;
  // The ACK onInputDrained left to the next run (SoftContext::deferAckFromLoop), when one is due.
  void sendDeferredAckFromLoop();
  void onPayloadRevoked(Conn& conn, const OutFrame& frame) override;
  void onProgress(Conn& conn) override;
  void onConnected(Conn& conn) override;
  void onClosed(Conn& conn, const Status& why) override;

 private:
  using Clock = std::chrono::steady_clock;

  Status modifyFromLoop(const verbs::QpAttr& attr, uint32_t mask);
  // modifyFromLoop's steps: the device's limits on the new attributes, the attributes the mask
  // names taken (under mu_), and what entering the new state does.
  Status checkDeviceLimits(const verbs::QpAttr& attr, uint32_t mask);
  void applyAttrLocked(const verbs::QpAttr& attr, uint32_t mask);
  void enterStateFromLoop(verbs::QpState current, verbs::QpState to);
  // Whether a hello names our peer (its QP number and GID, from that GID's address) to a QP that
  // is ready (RTR/RTS): kAccepted, or the result to refuse it with.
  wire::HelloResult helloFromOurPeer(const wire::FrameHeader& hello, in_addr_t peerIp);
  void schedulePump();
  void pumpFromLoop();
  void completeFromLoop();
  void pushSendCompletion(const SendWqe& wqe, verbs::WcStatus status);
  void pushSendCompletion(uint64_t wrId, verbs::WrOpcode opcode, uint64_t length, bool signaled,
                          verbs::WcStatus status);
  // n send requests ended: their send queue slots are free again (one atomic step for them all).
  void releaseSendSlots(uint32_t n);
  // The completion of a send request that ended (its slot released), when it has one.
  void pushSendWc(uint64_t wrId, verbs::WrOpcode opcode, uint64_t length, bool signaled,
                  verbs::WcStatus status);
  void pushRecvCompletion(const RecvWqe& wqe, verbs::WcStatus status, verbs::WcOpcode opcode,
                          uint32_t byteLen, std::optional<uint32_t> imm, bool solicited);
  // Moves the QP to ERR: the oldest send request gets `status` (when given), everything else
  // outstanding or posted is flushed, connections close.
  void enterErrorFromLoop(std::optional<verbs::WcStatus> status);
  void flushFromLoop();
  void resetFromLoop();
  // Dials the peer (dialer_) and adopts the link as the requester's connection.
  void startConnectFromLoop();
  // Connects to the peer's ring listener (a kUseRing hello reply); false when that cannot be done
  // (the QP then connects over TCP without offering rings).
  bool startRingConnectFromLoop(uint32_t pid, uint64_t nonce, uint64_t ticket);
  // Adopts a dialed link as reqConn_; false when the reactor cannot watch it.
  bool adoptRequesterLinkFromLoop(std::unique_ptr<Link> link);
  void scheduleReconnectFromLoop();
  // UC: the responder drops the current message silently.
  void dropMessageFromLoop();
  // A SEND or WRITE_WITH_IMM (sequence number seq) found no receive posted: UC drops the
  // message; RC refuses it with an RNR NAK and drops what follows until the requester resends it.
  void noReceiveFromLoop(uint32_t seq);
  // The peer we had reached is gone (why, for the log): pending work fails with RETRY_EXC_ERR.
  void peerGoneFromLoop(const char* why);
  // Completes every request of the send queue with status, in order.
  void completeSendQueueFromLoop(verbs::WcStatus status);
  void armTimeoutFromLoop();
  void onTimeoutFromLoop();
  Clock::duration transportBudget() const;
  bool takeRecv(RecvWqe* out);
  void giveBackRecv(RecvWqe wqe);
  void sendNakFromLoop(uint32_t seq, wire::Syndrome syndrome);
  // Responder refused the current request: NAK it, record the error, move to ERR.
  void responderErrorFromLoop(uint32_t seq, wire::Syndrome syndrome, verbs::AsyncEventType event);
  // The frame of a request. With lanePart, a WRITE that the lane should share is split: the frame
  // carries its first half (kFlagLaned) and *lanePart the rest (a kLaneData frame); otherwise
  // lanePart is left empty (headerLen 0).
  OutFrame buildRequestFrame(const SendWqe& wqe, OutFrame* lanePart = nullptr);

  // The requester's lane (lane.h).
  void startLaneFromLoop(uint64_t ticket);
  void sourceRevokedFromLoop(uint32_t seq);      // fails the sent request `seq` (LOC_PROT_ERR)
  bool sourceRevoked(const SendWqe& wqe) const;  // a source region of wqe was deregistered
  void onLaneEventFromLoop(uint64_t gen, LaneOut::Event event, uint32_t seq, uint32_t syndrome,
                           const Status& why);
  void dropLaneOutFromLoop();
  // A sent laned READ whose second part has not landed yet.
  bool readPartsDueFromLoop() const;
  // The QP's connection is gone (its lane too, now): what is in flight fails, or it reconnects.
  void connectionLostFromLoop();
  // The responder's lane (LaneIn, on the lane thread) tells of a piece placed, or of its end.
  void onLaneInEventFromLoop(uint64_t gen, LaneIn::Event event, uint32_t seq, bool revoked,
                             const Status& why);
  // Ends the responder's lane: at once, or (afterFlush, in ERR) once the READ parts on it have gone.
  void dropLaneInFromLoop(bool afterFlush = false);
  // Lets the READ parts held for laneIn_ go (laneReadParts_).
  void uncorkLaneFromLoop();
  // A laned WRITE's second half, as the responder expects it on the lane (empty: discard it).
  void expectLanePieceFromLoop(uint32_t seq, uint64_t addr, uint64_t length, Segments segments);
  // Resolves the local SGEs of wqe; the completion status a bad one fails it with, else kSuccess.
  verbs::WcStatus resolveLocalFromLoop(SendWqe& wqe);

  // The same-host path.
  struct FastPath {
    std::shared_ptr<SharePeer> peer;
    std::unique_ptr<SharePeer::Slot> slot;
    uint32_t destQpn = 0;
  };
  // Under mu_: the same-host path when a request of this opcode and length may take it now (valid
  // while mu_ is held), or null.
  const FastPath* fastPathForLocked(verbs::WrOpcode opcode, uint64_t length) const;
  // Runs run(path) for a post of `bytes` on the same-host path the QP holds (under lock; false when
  // it holds none). Up to kHoldLockBytes it runs under mu_; a longer copy runs without it, marked by
  // fastBusy_, and sets *queued when requests posted meanwhile or an error need the pump. What run
  // returns: whether the request was carried out.
  template <typename Run>
  bool runFastLocked(std::unique_lock<std::mutex>& lock, uint64_t bytes, bool* queued, Run&& run);
  // Under mu_: whether a send of `total` bytes may be posted now (the QP's state and CQ, the size).
  Status checkPostLocked(uint64_t total) const;
  // Under mu_: wrs[first] and the WRITEs (or READs) after it to the same region, carried out as one
  // copy on the same-host path. kNone: no such run (wrs[first] goes alone); kDone: *run requests
  // completed; kRefused: the path refused the run (it may be gone: ask for it again).
  enum class FastRun { kNone, kDone, kRefused };
  FastRun postFastRunLocked(std::unique_lock<std::mutex>& lock, std::span<const verbs::SendWr> wrs,
                            size_t first, uint64_t firstBytes, bool* queued, size_t* run);
  // The queue entry of a send request (inline data copied; a placed WRITE_WITH_IMM keeps no memory).
  static SendWqe sendWqeOf(const verbs::SendWr& wr, uint64_t total, bool signaled, bool placed);
  // Carries out wr on the same-host path; false: it must go over TCP.
  bool runFastPath(const FastPath& fp, const verbs::SendWr& wr, uint64_t length);
  // An atomic on memory both sides map, as loads and stores; false: it must go to the peer.
  bool runFastAtomic(const FastPath& fp, const verbs::SendWr& wr);
  // Several WRITEs (or READs) with one remote key in one system call; false: none was done.
  bool runFastPathBatch(const FastPath& fp, std::span<const verbs::SendWr> wrs);
  // Copies local against remote (each remote piece takes the next local bytes, as copyv) with
  // this thread and the context's helper thread, about half each, split by where bytes land.
  bool copyInTwo(const FastPath& fp, bool write, std::span<const iovec> local, std::span<const iovec> remote);
  void setupFastPathFromLoop(const wire::FrameHeader& reply);
  void dropFastPath();
  // Shows the QP's state to same-host requesters (the context's share table).
  void publishShareFromLoop();

  // Requester frames (arrive on reqConn_).
  Status onResponseHeader(const wire::FrameHeader& h, PayloadPlan* plan);
  void onResponseFrame(const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t trailer);
  // pumpFromLoop's steps: posted_ moved to sq_ (false while a same-host post copies), whether the
  // QP can send now (else what it waits for is arranged), and one request sent (its lane part, if
  // any, added to laneParts); false: stop, the QP failed or closed.
  bool takePostedFromLoop();
  bool readyToSendFromLoop();
  bool sendRequestFromLoop(SendWqe& wqe, std::vector<OutFrame>* laneParts);
  void onHelloReplyFromLoop(const wire::FrameHeader& h);  // the dial's answer: ready, ring, or again
  void onReadResponseFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t trailer);
  void onAtomicResponseFromLoop(const wire::FrameHeader& h);
  void onNakFromLoop(const wire::FrameHeader& h);
  // After an RNR NAK of sq_[refused]: resend from it once the peer's RNR timer (IBA code) ran out.
  void rewindForRnrFromLoop(size_t refused, uint8_t rnrTimerCode);
  SendWqe* sentWqe(uint32_t seq);  // the sent request `seq`, or nullptr
  // Responder frames (arrive on respConn_).
  Status onRequestHeader(const wire::FrameHeader& h, PayloadPlan* plan);
  void onRequestFrame(const wire::FrameHeader& h, const PayloadPlan& plan);
  // The request's checks and where its payload lands (onRequestHeader); a refusal answers the NAK.
  void planSendFromLoop(const wire::FrameHeader& h, PayloadPlan* plan);
  void planWriteFromLoop(const wire::FrameHeader& h, PayloadPlan* plan);
  std::shared_ptr<MrEntry> remoteEntry(const wire::FrameHeader& h, uint64_t addr, uint64_t len,
                                       uint32_t need);
  bool qpAllowsFromLoop(const wire::FrameHeader& h, uint32_t need);
  // The request once its payload landed (onRequestFrame): completions, and the answers.
  void receivedSendFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan);
  void receivedWriteFromLoop(const wire::FrameHeader& h, const PayloadPlan& plan);
  void answerReadFromLoop(const wire::FrameHeader& h);
  void answerAtomicFromLoop(const wire::FrameHeader& h);

  std::shared_ptr<SoftContext> ctx_;
  std::shared_ptr<SoftPd> pd_;
  const verbs::QpType type_;
  std::shared_ptr<SoftCq> sendCq_;
  std::shared_ptr<SoftCq> recvCq_;
  std::shared_ptr<SoftSrq> srq_;
  const verbs::QpCap cap_;
  const bool sqSigAll_;
  uint32_t qpn_ = 0;

  std::atomic<verbs::QpState> state_{verbs::QpState::kReset};
  std::atomic<bool> closed_{false};
  std::atomic<bool> pumpScheduled_{false};
  std::atomic<uint32_t> sqOutstanding_{0};

  // Guarded by mu_: attributes, posted sends not yet taken by the reactor, the receive queue.
  mutable std::mutex mu_;
  verbs::QpAttr attr_;
  RingDeque<SendWqe> posted_;
  std::deque<RecvWqe> rq_;
  std::shared_ptr<FastPath> fast_;
  bool fastBusy_ = false;  // a post is copying on the same-host path: posted_ waits behind it

  // Reactor thread only.
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
  Dialer dialer_{ctx_->reactor(), qpn_};  // reaching the peer, and what was learned of it
  std::shared_ptr<Conn> reqConn_;
  bool reqReady_ = false;

  std::shared_ptr<Conn> respConn_;
  uint32_t expectedSeq_ = 0;
  bool respNakPending_ = false;  // after an RNR NAK: drop requests until the refused one returns
  bool respSkip_ = false;        // the frame being received is dropped
  bool ackNeeded_ = false;
  std::optional<RecvWqe> curRecv_;  // the receive a SEND / WRITE_WITH_IMM being received consumes

  // Requester's lane (reactor thread): the lane, its generation (events of older ones are
  // ignored), whether it took the peer's accept, and whether a laned WRITE went on reqConn_ (for
  // as long as reqConn_ lives, whatever becomes of the lane).
  std::shared_ptr<LaneOut> laneOut_;
  uint64_t laneGen_ = 0;
  bool laneReady_ = false;
  bool laneUsed_ = false;
  uint64_t laneTicketHeld_ = 0;    // the hello reply's lane ticket, until a WRITE opens the lane
  bool laneOutlivesConn_ = false;  // reqConn_ closed with READ parts due on the lane: wait for it
  const uint64_t laneMinBytes_ = config::softTcpLaneMinBytes();  // 0: no lane

  // Responder's lane (reactor thread; LaneIn reads it on the lane thread). Each laned WRITE on
  // respConn_ adds the piece the lane must carry next, in the order of the WRITEs (a piece not
  // placed is discarded: its WRITE was refused or dropped), here and at laneIn_; a piece leaves
  // lanePieces_ when laneIn_ tells it landed. While placed pieces are pending, respConn_ goes on
  // only with WRITEs that are valid and land clear of every pending piece; anything else waits
  // (respConn_ paused at its header) until they have landed, a refusal too (laneRefusal_), and
  // acknowledgements stop short of the oldest pending one. The lane pauses when it is ahead of
  // every WRITE.
  struct LanePiece {
    uint32_t seq = 0;
    uint64_t addr = 0;
    uint64_t length = 0;
    bool placed = false;  // false: the bytes are discarded
  };
  // Whether respConn_ may take request h now, with lane pieces pending.
  bool mayPassPendingLanes(const wire::FrameHeader& h);
  // Acknowledges what is done and landed (onInputDrained, and when a lane piece lands).
  void sendAckFromLoop(Conn& conn);
  std::shared_ptr<LaneIn> laneIn_;
  uint64_t laneInGen_ = 0;  // events of lanes since dropped are ignored
  uint64_t laneTicket_ = 0;
  std::deque<LanePiece> lanePieces_;
  size_t lanePending_ = 0;    // pieces in lanePieces_ to be placed
  bool lanePlanned_ = false;  // the laned header being checked has its piece
  // A refusal that waits for the pieces pending before it (a NAK acknowledges everything earlier).
  struct LaneRefusal {
    uint32_t seq = 0;
    wire::Syndrome syndrome = wire::Syndrome::kRemAccess;
    verbs::AsyncEventType event = verbs::AsyncEventType::kQpAccessErr;
  };
  std::optional<LaneRefusal> laneRefusal_;
  bool ackDeferred_ = false;         // an ACK waits in SoftContext's list for the next run
  std::optional<uint32_t> lastAck_;  // the last ACK sendAckFromLoop sent on respConn_
  // The second parts of the READ responses respConn_'s input asked for: they go to laneIn_
  // together, once the input is drained or pauses (onInputDrained).
  std::vector<OutFrame> laneReadParts_;
};

}  // namespace ferry::soft
