// QpCore: what the parts of a connected queue pair (RC or UC) share, and the one thing they ask of
// the whole.
//
// SoftQp (qp.h) is the queue pair the verbs layer sees. It is built of parts that each own one
// job: the requester (rc_requester.h) sends the send queue to the peer and completes it, the
// responder (rc_responder.h) carries out what the peer sends, and the same-host channel
// (same_host/channel.h) carries a post through the peer's memory on this host. The parts see the
// queue pair only through this class: who it is (context, protection domain, number, type), its
// state and attributes, the posted sends and the receive queue, its completion queues, and
// enterErrorFromLoop, which moves the whole queue pair to ERR.
//
// Threads: the attributes and the queues are guarded by mu(); the reactor thread is the only one
// that changes the attributes, so it reads them without the lock (attrOnLoop). State and the send
// queue's occupancy are atomics any thread reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "common/ring_deque.h"
#include "providers/soft/soft.h"

namespace ferry::soft {

class SameHostChannel;

class QpCore : public std::enable_shared_from_this<QpCore> {
 public:
  QpCore(std::shared_ptr<SoftContext> ctx, std::shared_ptr<SoftPd> pd, const verbs::QpInitImpl& init);
  virtual ~QpCore();
  QpCore(const QpCore&) = delete;
  QpCore& operator=(const QpCore&) = delete;

  SoftContext& ctx() const { return *ctx_; }
  Reactor& loop() const { return ctx_->reactor(); }
  // The protection domain, as the context's memory lookups name it.
  const void* pdId() const { return pd_.get(); }
  verbs::QpType type() const { return type_; }
  // Set once the context numbered the QP (before any part runs); a reference for those that log it.
  const uint32_t& qpnRef() const { return qpn_; }
  uint32_t qpn() const { return qpn_; }
  verbs::QpState state() const { return state_.load(); }
  bool closed() const { return closed_.load(); }
  bool hasSrq() const { return srq_ != nullptr; }

  // The attributes, read on the reactor thread (the only writer) without the lock.
  const verbs::QpAttr& attrOnLoop() const { return attr_; }

  // Moves the QP to ERR: the oldest send request gets `status` (when given), everything else
  // outstanding or posted is flushed, connections close (reactor thread).
  virtual void enterErrorFromLoop(std::optional<verbs::WcStatus> status) = 0;
  // A QP in ERR: everything outstanding or posted, sends and receives, completes with
  // WR_FLUSH_ERR (reactor thread).
  virtual void flushFromLoop() = 0;

  // A pointer to `part` (a member of this QP) that keeps the whole QP alive while held: what a
  // timer or another thread's callback captures, weakly, to reach a part that may be gone. Empty
  // (the callback never runs) once the QP is being destroyed.
  template <typename Part>
  std::weak_ptr<Part> weakPart(Part* part) {
    std::shared_ptr<QpCore> self = weak_from_this().lock();
    if (!self) return {};
    return std::shared_ptr<Part>(std::move(self), part);
  }

  // ---- the send queue ----
  // Moves the posted sends to the end of sq (reactor thread). False while a post is copying on
  // the same-host channel: what was posted after it waits, and that post schedules the pump.
  bool takePosted(RingDeque<SendWqe>& sq);
  // n send requests ended: their slots are free again (one atomic step for them all).
  void releaseSendSlots(uint32_t n);
  // A send request ended: its slot is freed and its completion pushed (when it has one).
  void completeSend(const SendWqe& wqe, verbs::WcStatus status);
  void completeSend(uint64_t wrId, verbs::WrOpcode opcode, uint64_t length, bool signaled,
                    verbs::WcStatus status);
  // The completion of a send request whose slot was released already (when it has one).
  void pushSendWc(uint64_t wrId, verbs::WrOpcode opcode, uint64_t length, bool signaled,
                  verbs::WcStatus status);

  // ---- the receive queue (or the SRQ) ----
  bool takeRecv(RecvWqe* out);
  void giveBackRecv(RecvWqe wqe);
  // The receive requests not taken yet, removed (a flush).
  std::deque<RecvWqe> takeAllRecvs();
  // Reactor thread (every receive completes there, flushes too).
  void pushRecvCompletion(const RecvWqe& wqe, verbs::WcStatus status, verbs::WcOpcode opcode,
                          uint32_t byteLen, std::optional<uint32_t> imm, bool solicited);

  // ---- the same-host channel ----
  // Opens the channel to the peer process the hello reply names, when it offers its memory and
  // this process can reach it; else the QP goes on without one (reactor thread).
  void openSameHostFromLoop(const wire::FrameHeader& reply);
  void closeSameHost();
  // Shows the QP's state to same-host requesters (the context's share table).
  void publishShareFromLoop();

 protected:
  const std::shared_ptr<SoftContext> ctx_;
  const std::shared_ptr<SoftPd> pd_;
  const verbs::QpType type_;
  const std::shared_ptr<SoftCq> sendCq_;
  const std::shared_ptr<SoftCq> recvCq_;
  const std::shared_ptr<SoftSrq> srq_;
  const verbs::QpCap cap_;
  const bool sqSigAll_;
  uint32_t qpn_ = 0;

  std::atomic<verbs::QpState> state_{verbs::QpState::kReset};
  std::atomic<bool> closed_{false};
  std::atomic<uint32_t> sqOutstanding_{0};  // send requests posted and not completed

  // Guarded by mu_: the attributes, the posted sends the requester has not taken yet, the receive
  // queue, and the same-host channel.
  mutable std::mutex mu_;
  verbs::QpAttr attr_;
  RingDeque<SendWqe> posted_;
  std::deque<RecvWqe> rq_;
  std::shared_ptr<SameHostChannel> sameHost_;
  bool sameHostBusy_ = false;  // a post is copying on the channel: posted_ waits behind it
};

}  // namespace ferry::soft
