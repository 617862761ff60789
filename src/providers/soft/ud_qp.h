// SoftUdQp: an unreliable-datagram queue pair of the soft provider, over the context's UDP socket.
//
// A send is one UDP datagram (a kDatagram frame) to the address and port in the address handle's
// GID; it completes as soon as the kernel took it — delivery is not guaranteed, as on UD. At the
// target, the context's progress thread hands the datagram to the QP it names: the Q_Key must
// match, a receive must be posted (else the datagram is dropped), and the receive gets a 40-byte
// GRH as a NIC writes it (sender's GID at bytes 8-23, the destination GID the sender's AH named —
// a multicast group's for a group send — at 24-39, the AH's traffic class, flow label and hop
// limit) followed by the message. A send through an AH without a GRH (a LID-routed path to this
// port) arrives without one: no IBV_WC_GRH, and the first 40 bytes of the receive untouched.
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <set>

#include "providers/soft/soft.h"
#include "providers/soft/wire.h"

namespace ferry::soft {

inline constexpr size_t kGrhBytes = 40;

class SoftUdQp final : public verbs::QpImpl, public std::enable_shared_from_this<SoftUdQp> {
 public:
  SoftUdQp(std::shared_ptr<SoftContext> ctx, std::shared_ptr<SoftPd> pd, const verbs::QpInitImpl& init);

  uint32_t qpNum() const override { return qpn_; }
  verbs::QpType type() const override { return verbs::QpType::kUd; }
  Status modify(const verbs::QpAttr& attr, uint32_t mask) override;
  Result<verbs::QpAttr> query() override;
  verbs::QpCap cap() const override { return cap_; }
  // Sends at once from the caller's thread (a datagram needs no progress thread).
  Status postSend(std::span<const verbs::SendWr> wrs, size_t* badIndex) override;
  Status postRecv(std::span<const verbs::RecvWr> wrs, size_t* badIndex) override;
  void close() override;
  // Joins or leaves a multicast group: every QP of the host attached to it receives a send to it
  // (destination QP 0xffffff), across processes of the same user (mcast.h).
  Status attachMcast(const verbs::Gid& gid, uint16_t lid) override;
  Status detachMcast(const verbs::Gid& gid, uint16_t lid) override;

  void setQpn(uint32_t qpn) { qpn_ = qpn; }
  // A datagram for this QP arrived (reactor thread).
  void onDatagramFromLoop(const wire::FrameHeader& h, const uint8_t* payload);

 private:
  // Whether wr can be posted (the refusals a NIC gives at post; mu_ held); *ah: its AH.
  Status checkSendLocked(const verbs::SendWr& wr, std::shared_ptr<SoftAh>* ah);
  // Sends wr's datagram (to each member of a multicast group) and returns its completion's status:
  // kLocProtErr when an entry is outside its memory region, kLocLenErr above the MTU (mu_ held).
  verbs::WcStatus sendLocked(const verbs::SendWr& wr, const SoftAh& ah);
  // A send's message as sendmsg takes it: iov[0] left for the header, then its pieces (device
  // memory's copied out into fromDevice first, region_copy.h).
  struct Gathered {
    iovec iov[1 + kMaxSge];
    int count = 1;
    uint64_t total = 0;
    uint8_t fromDevice[wire::kMaxDatagram];
  };
  verbs::WcStatus gatherLocked(const verbs::SendWr& wr, Gathered* out) const;
  // The 40-byte GRH of a received datagram: the sender's GID and route (wire::DatagramRoute).
  void writeGrh(const wire::FrameHeader& h, uint8_t* grh) const;
  bool takeRecv(RecvWqe* out);
  verbs::WcStatus placeDatagramLocked(const RecvWqe& rwqe, const uint8_t* grh, bool withGrh,
                                      const uint8_t* payload, size_t need);
  void flushRecvs();
  void complete(const std::shared_ptr<SoftCq>& cq, const verbs::WorkCompletion& wc, bool solicited);
  // A send's completion: a signaled one goes to the send CQ carrying its slot and those of the
  // unsignaled sends before it, which are freed when it is polled (mu_ held).
  void completeSendLocked(const verbs::WorkCompletion& wc, bool signaled);

  std::shared_ptr<SoftContext> ctx_;
  std::shared_ptr<SoftPd> pd_;
  std::shared_ptr<SoftCq> sendCq_;
  std::shared_ptr<SoftCq> recvCq_;
  std::shared_ptr<SoftSrq> srq_;
  const verbs::QpCap cap_;
  const bool sqSigAll_;
  uint32_t qpn_ = 0;
  uint16_t ownPort_ = 0;  // the context's UDP port (in its GID): where this QP's datagrams arrive
  std::atomic<bool> closed_{false};

  mutable std::mutex mu_;
  verbs::QpState state_ = verbs::QpState::kReset;
  verbs::QpAttr attr_;
  std::deque<RecvWqe> rq_;
  // Send-queue slots held: a send holds its slot from its post until its completion (or the next
  // signaled one, when it is unsignaled) is polled, as on a NIC; a post past max_send_wr fails.
  std::shared_ptr<std::atomic<uint32_t>> sqHeld_ = std::make_shared<std::atomic<uint32_t>>(0);
  uint32_t unsignaledRun_ = 0;                // unsignaled sends since the last signaled one
  std::set<std::array<uint8_t, 16>> groups_;  // multicast groups attached (their GIDs)
};

}  // namespace ferry::soft
