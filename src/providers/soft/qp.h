// SoftQp: a connected queue pair (RC or UC) of the soft provider, as the verbs layer sees it.
//
// It is the façade over parts that each own one job (qp_core.h says what they share):
// - RcRequester (rc_requester.h): the send queue on the wire, reaching the peer, the transport
//   and RNR timers;
// - RcResponder (rc_responder.h): what the peer's requester sends, checked and carried out;
// - SameHostChannel (same_host/channel.h): a post carried out through a same-host peer's memory.
// SoftQp itself takes the verbs calls: modify (the state machine, and what entering a state asks
// of each part), query, the posts (asking the same-host channel once per request whether it
// carries it, else queueing it for the requester), and close.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include "providers/soft/qp_core.h"
#include "providers/soft/rc_requester.h"
#include "providers/soft/rc_responder.h"

namespace ferry::soft {

class SameHostChannel;

class SoftQp final : public verbs::QpImpl, public QpCore {
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
  // Gives the requester and the responder their weak pointers (bindSelf): once, right after the QP
  // is made by make_shared, before anything else uses it.
  void bindParts() {
    requester_.bindSelf(weakPart(&requester_));
    responder_.bindSelf(weakPart(&responder_));
  }
  // The context's listener hands the responder what comes for this QP (rc_responder.h).
  RcResponder& responder() { return responder_; }

  void enterErrorFromLoop(std::optional<verbs::WcStatus> status) override;
  void flushFromLoop() override;

 private:
  Status modifyFromLoop(const verbs::QpAttr& attr, uint32_t mask);
  // modifyFromLoop's steps: the device's limits on the new attributes, the attributes the mask
  // names taken (under mu_), and what entering the new state does.
  Status checkDeviceLimits(const verbs::QpAttr& attr, uint32_t mask);
  void applyAttrLocked(const verbs::QpAttr& attr, uint32_t mask);
  void enterStateFromLoop(verbs::QpState current, verbs::QpState to);
  void resetFromLoop();

  // Under mu_: the same-host channel when a request of this opcode and length may take it now
  // (valid while mu_ is held), or null.
  SameHostChannel* sameHostForLocked(verbs::WrOpcode opcode, uint64_t length) const;
  // Runs run(channel) for a post of `bytes` on the same-host channel (under lock; false when the
  // QP has none). Up to kHoldLockBytes it runs under mu_; a longer copy runs without it, marked by
  // sameHostBusy_, and sets *queued when requests posted meanwhile or an error need the pump. What
  // run returns: whether the request was carried out.
  template <typename Run>
  bool runSameHostLocked(std::unique_lock<std::mutex>& lock, uint64_t bytes, bool* queued, Run&& run);
  // Under mu_: whether a send of `total` bytes may be posted in `state` (the QP's, read once for
  // both), and when it may not, why: a check on every post, so the error is made only when there
  // is one (closed_ and the CQ's closing never go back, so the second call finds what the first did).
  bool postableLocked(verbs::QpState state, uint64_t total) const;
  Status postRefusalLocked(verbs::QpState state, uint64_t total) const;
  // Under mu_: wrs[first] and the WRITEs (or READs) after it to the same region, carried out as one
  // copy on the same-host channel. kNone: no such run (wrs[first] goes alone); kDone: *run requests
  // completed; kRefused: the channel refused the run (it may be gone: ask for it again).
  enum class SameHostRun { kNone, kDone, kRefused };
  SameHostRun postSameHostRunLocked(std::unique_lock<std::mutex>& lock, std::span<const verbs::SendWr> wrs,
                                    size_t first, uint64_t firstBytes, bool* queued, size_t* run);
  // The queue entry of a send request (inline data copied; a placed WRITE_WITH_IMM keeps no memory).
  static SendWqe sendWqeOf(const verbs::SendWr& wr, uint64_t total, bool signaled, bool placed);

  RcRequester requester_{*this};
  RcResponder responder_{*this};
};

}  // namespace ferry::soft
