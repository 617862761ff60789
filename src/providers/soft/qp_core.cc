// QpCore: the state, queues and completions the parts of a connected QP share.
#include "providers/soft/qp_core.h"

#include <algorithm>

#include "common/log.h"
#include "providers/soft/qp_internal.h"
#include "providers/soft/same_host/channel.h"

namespace ferry::soft {

using namespace qp_detail;

QpCore::QpCore(std::shared_ptr<SoftContext> ctx, std::shared_ptr<SoftPd> pd, const verbs::QpInitImpl& init)
    : ctx_(std::move(ctx)),
      pd_(std::move(pd)),
      type_(init.type),
      sendCq_(std::static_pointer_cast<SoftCq>(init.sendCq)),
      recvCq_(std::static_pointer_cast<SoftCq>(init.recvCq)),
      srq_(std::static_pointer_cast<SoftSrq>(init.srq)),
      cap_(init.cap),
      sqSigAll_(init.sqSigAll) {
  attr_.cap = cap_;
}

QpCore::~QpCore() = default;

// ---------------------------------------------------------------------------------------------
// The send queue.

bool QpCore::takePosted(RingDeque<SendWqe>& sq) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sameHostBusy_) return false;
  if (sq.empty()) {
    sq.swap(posted_);  // the whole list at once, no request moved
    return true;
  }
  while (!posted_.empty()) {
    sq.push_back(std::move(posted_.front()));
    posted_.pop_front();
  }
  return true;
}

void QpCore::releaseSendSlots(uint32_t n) {
  // Never below zero: a flush may have emptied the queue meanwhile.
  uint32_t cur = sqOutstanding_.load(std::memory_order_relaxed);
  while (cur > 0 && !sqOutstanding_.compare_exchange_weak(cur, cur - std::min(cur, n))) {
  }
}

void QpCore::completeSend(const SendWqe& wqe, WcStatus status) {
  completeSend(wqe.wrId, wqe.opcode, wqe.length, wqe.signaled, status);
}

void QpCore::completeSend(uint64_t wrId, WrOpcode opcode, uint64_t length, bool signaled, WcStatus status) {
  releaseSendSlots(1);
  pushSendWc(wrId, opcode, length, signaled, status);
}

void QpCore::pushSendWc(uint64_t wrId, WrOpcode opcode, uint64_t length, bool signaled, WcStatus status) {
  if (status == WcStatus::kSuccess && !signaled) return;
  verbs::WorkCompletion wc;
  wc.wrId = wrId;
  wc.status = status;
  wc.opcode = wcOpcodeFor(opcode);
  wc.byteLen = static_cast<uint32_t>(length);
  wc.qpNum = qpn_;
  wc.vendorErr = status == WcStatus::kSuccess ? 0 : static_cast<uint32_t>(status);
  sendCq_->push(wc, false);
}

// ---------------------------------------------------------------------------------------------
// The receive queue.

bool QpCore::takeRecv(RecvWqe* out) {
  if (srq_) return srq_->take(out);
  std::lock_guard<std::mutex> lock(mu_);
  if (rq_.empty()) return false;
  *out = std::move(rq_.front());
  rq_.pop_front();
  return true;
}

void QpCore::giveBackRecv(RecvWqe wqe) {
  if (srq_) {
    srq_->giveBack(std::move(wqe));
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  rq_.push_front(std::move(wqe));
}

std::deque<RecvWqe> QpCore::takeAllRecvs() {
  std::deque<RecvWqe> all;
  std::lock_guard<std::mutex> lock(mu_);
  all.swap(rq_);
  return all;
}

void QpCore::pushRecvCompletion(const RecvWqe& wqe, WcStatus status, WcOpcode opcode, uint32_t byteLen,
                                std::optional<uint32_t> imm, bool solicited) {
  FERRY_ON_LOOP(loop());  // so the attributes are read without the lock (the loop writes them)
  verbs::WorkCompletion wc;
  wc.wrId = wqe.wrId;
  wc.status = status;
  wc.opcode = opcode;
  wc.byteLen = byteLen;
  wc.qpNum = qpn_;
  wc.srcQp = attr_.destQpNum;
  if (imm) {
    wc.immData = *imm;
    wc.wcFlags |= verbs::wc_flags::kWithImm;
  }
  wc.vendorErr = status == WcStatus::kSuccess ? 0 : static_cast<uint32_t>(status);
  recvCq_->push(wc, solicited);
}

// ---------------------------------------------------------------------------------------------
// The same-host channel.

void QpCore::openSameHostFromLoop(const wire::FrameHeader& reply) {
  FERRY_ON_LOOP(loop());
  if (!ctx_->share() || reply.sharePid == 0) return;  // neither side offers one: nothing to say
  auto channel = SameHostChannel::open(*ctx_, pd_.get(), qpn_, attr_.destQpNum, reply);
  if (!channel.isOk()) {
    FERRY_LOG(kDebug, "QP %u: no same-host path to its peer: %s", qpn_, channel.status().toString().c_str());
    return;
  }
  FERRY_LOG(kDebug, "QP %u: same-host path to process %u", qpn_, reply.sharePid);
  std::lock_guard<std::mutex> lock(mu_);
  sameHost_ = std::move(*channel);
}

void QpCore::closeSameHost() {
  std::lock_guard<std::mutex> lock(mu_);
  sameHost_.reset();
}

void QpCore::publishShareFromLoop() {
  FERRY_ON_LOOP(loop());
  if (auto* table = ctx_->share()) {
    table->publishQp(qpn_, state_.load(), attr_.qpAccessFlags, pd_.get(), attr_.destQpNum);
  }
}

}  // namespace ferry::soft
