// SoftQp: the verbs object (modify, query, post, close) and its state changes. The requester, the
// responder and the same-host channel are rc_requester.cc, rc_responder.cc and
// same_host/channel.cc.
#include "providers/soft/qp.h"

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
#include "providers/soft/qp_internal.h"
#include "providers/soft/same_host/channel.h"
#include "verbs/qp_state.h"

namespace ferry::soft {

using namespace qp_detail;

SoftQp::SoftQp(std::shared_ptr<SoftContext> ctx, std::shared_ptr<SoftPd> pd, const verbs::QpInitImpl& init)
    : QpCore(std::move(ctx), std::move(pd), init) {}

SoftQp::~SoftQp() = default;

// ---------------------------------------------------------------------------------------------
// Application-side calls.

Status SoftQp::modify(const verbs::QpAttr& attr, uint32_t mask) {
  if (closed_) return closedError("modify: the QP is closed");
  Status result;
  Status ran = ctx_->reactor().runSync([&] { result = modifyFromLoop(attr, mask); });
  if (!ran.isOk()) return ran;
  return result;
}

Result<verbs::QpAttr> SoftQp::query() {
  if (closed_) return closedError("query: the QP is closed");
  std::lock_guard<std::mutex> lock(mu_);
  verbs::QpAttr attr = attr_;
  attr.state = state_.load();
  attr.curState = attr.state;
  attr.cap = cap_;
  return attr;
}

namespace {

// A same-host post of up to this many bytes is copied under the QP's lock: a short hold costs the
// reactor less than a second lock and a busy mark cost the post (about 1 us of copying at most).
constexpr uint64_t kHoldLockBytes = 16 * 1024;

uint64_t bytesOf(const verbs::SendWr& wr) {
  uint64_t total = 0;
  for (const auto& sge : wr.sgList) total += sge.length;
  return total;
}

}  // namespace

bool SoftQp::postableLocked(QpState state, uint64_t total) const {
  return !closed_ && !sendCq_->closed() && state != QpState::kReset && state != QpState::kInit &&
         state != QpState::kRtr && total <= wire::kMaxMessage;
}

Status SoftQp::postSend(std::span<const verbs::SendWr> wrs, size_t* badIndex) {
  size_t posted = 0;
  Status status;
  bool queued = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (; posted < wrs.size(); ++posted) {
      const verbs::SendWr& wr = wrs[posted];
      // The verbs layer checked every request against the QP's capabilities (verbs/posting.h).
      const uint64_t total = bytesOf(wr);
      if (const QpState state = state_.load(); !postableLocked(state, total)) {
        status = postRefusalLocked(state, total);
        break;
      }
      if (sqOutstanding_.load() >= cap_.maxSendWr) {
        if (badIndex) *badIndex = posted;
        status = resourceExhausted("post send: send queue full");
        break;
      }
      const bool signaled = sqSigAll_ || (wr.sendFlags & verbs::send_flags::kSignaled);
      bool placed = false;
      ++sqOutstanding_;
      SameHostChannel* channel = sameHostForLocked(wr.opcode, total);
      if (channel && (wr.opcode == WrOpcode::kRdmaWrite || wr.opcode == WrOpcode::kRdmaRead)) {
        size_t run = 1;
        const SameHostRun ran = postSameHostRunLocked(lock, wrs, posted, total, &queued, &run);
        if (ran == SameHostRun::kDone) {
          posted += run - 1;
          continue;
        }
        // A long batch ran without the lock, which let the path go meanwhile (its peer died):
        // ask again rather than use the one from before.
        if (ran == SameHostRun::kRefused) channel = sameHostForLocked(wr.opcode, total);
      }
      if (channel) {
        // Carried out here, before anything posted after it (which waits in posted_).
        const bool carried = runSameHostLocked(lock, total, &queued, [&](SameHostChannel& ch) {
          if (!ch.run(wr, total)) return false;
          // A WRITE_WITH_IMM's data is in place; its immediate still goes to the peer below.
          if (wr.opcode != WrOpcode::kRdmaWriteWithImm) {
            completeSend(wr.wrId, wr.opcode, total, signaled, WcStatus::kSuccess);
          }
          return true;
        });
        placed = carried && wr.opcode == WrOpcode::kRdmaWriteWithImm;
        if (carried && !placed) continue;
      }
      SendWqe wqe = sendWqeOf(wr, total, signaled, placed);
      if (channel) {
        posted_.push_front(std::move(wqe));  // refused by the same-host channel, or placed: first in line
      } else {
        posted_.push_back(std::move(wqe));
      }
      queued = true;
    }
  }
  if (queued) requester_.schedulePump();
  if (!status.isOk() && badIndex) *badIndex = posted;
  return status;
}

Status SoftQp::postRefusalLocked(QpState state, uint64_t total) const {
  if (closed_) return closedError("post send: the QP is closed");
  if (sendCq_->closed()) return closedError("post send: the QP's send CQ is closed");
  if (state == QpState::kReset || state == QpState::kInit || state == QpState::kRtr) {
    return refusePost(std::string("send queue not ready (QP in ") + verbs::qpStateName(state) + ")");
  }
  return refusePost("message above the 2 GiB limit");  // what is left when postableLocked said no
}

SoftQp::SameHostRun SoftQp::postSameHostRunLocked(std::unique_lock<std::mutex>& lock,
                                                  std::span<const verbs::SendWr> wrs, size_t first,
                                                  uint64_t firstBytes, bool* queued, size_t* run) {
  // A run of WRITEs (or READs) to one region posted together moves in one copy.
  const verbs::SendWr& wr = wrs[first];
  size_t n = 1;
  size_t pieces = wr.sgList.size();
  uint64_t runBytes = firstBytes;
  while (first + n < wrs.size() && n < SameHostChannel::kMaxBatch &&
         sqOutstanding_.load() + n < cap_.maxSendWr) {
    const verbs::SendWr& next = wrs[first + n];
    const uint64_t len = bytesOf(next);
    if (next.opcode != wr.opcode || next.rdma.rkey != wr.rdma.rkey || len == 0 || len > wire::kMaxMessage ||
        pieces + next.sgList.size() > SameHostChannel::kMaxPieces) {
      break;
    }
    pieces += next.sgList.size();
    runBytes += len;
    ++n;
  }
  if (n == 1) return SameHostRun::kNone;
  sqOutstanding_ += static_cast<uint32_t>(n - 1);
  auto batch = wrs.subspan(first, n);
  const bool done = runSameHostLocked(lock, runBytes, queued, [&](SameHostChannel& ch) {
    if (!ch.runBatch(batch)) return false;
    // One step for the batch's slots (an atomic step per request cost more than the copy of a
    // small WRITE), then the completions of the signaled ones.
    releaseSendSlots(static_cast<uint32_t>(n));
    for (const auto& w : batch) {
      if (!sqSigAll_ && !(w.sendFlags & verbs::send_flags::kSignaled)) continue;
      pushSendWc(w.wrId, w.opcode, bytesOf(w), true, WcStatus::kSuccess);
    }
    return true;
  });
  if (done) {
    *run = n;
    return SameHostRun::kDone;
  }
  sqOutstanding_ -= static_cast<uint32_t>(n - 1);
  return SameHostRun::kRefused;
}

SendWqe SoftQp::sendWqeOf(const verbs::SendWr& wr, uint64_t total, bool signaled, bool placed) {
  SendWqe wqe;
  wqe.wrId = wr.wrId;
  wqe.opcode = wr.opcode;
  wqe.flags = wr.sendFlags;
  wqe.signaled = signaled;
  wqe.length = total;
  wqe.immData = wr.immData;
  wqe.placed = placed;
  if (isAtomic(wr.opcode)) {
    wqe.remoteAddr = wr.atomic.remoteAddr;
    wqe.rkey = wr.atomic.rkey;
    wqe.compareAdd = wr.atomic.compareAdd;
    wqe.swap = wr.atomic.swap;
  } else {
    wqe.remoteAddr = wr.rdma.remoteAddr;
    wqe.rkey = wr.rdma.rkey;
  }
  if (placed) return wqe;  // nothing of the caller's memory is needed any more
  if ((wr.sendFlags & verbs::send_flags::kInline) != 0) {
    // Inline data is copied now: the caller may reuse its buffer as soon as we return.
    wqe.inlineData.resize(total);
    size_t off = 0;
    for (const auto& sge : wr.sgList) {
      if (sge.length)
        std::memcpy(wqe.inlineData.data() + off, reinterpret_cast<const void*>(sge.addr), sge.length);
      off += sge.length;
    }
  } else {
    wqe.sges.assign(wr.sgList.begin(), wr.sgList.end());
  }
  return wqe;
}

SameHostChannel* SoftQp::sameHostForLocked(WrOpcode opcode, uint64_t length) const {
  if (!sameHost_ || sameHostBusy_ || closed_ || state_.load() != QpState::kRts) return nullptr;
  if (!SameHostChannel::carries(opcode)) return nullptr;
  // Only with nothing else outstanding (this request is counted): it must not overtake one.
  if (length == 0 || sqOutstanding_.load() != 1) return nullptr;
  return sameHost_.get();
}

template <typename Run>
bool SoftQp::runSameHostLocked(std::unique_lock<std::mutex>& lock, uint64_t bytes, bool* queued, Run&& run) {
  SameHostChannel* channel = sameHost_.get();
  if (!channel) return false;                         // none (it went with its peer): over the connection
  if (bytes <= kHoldLockBytes) return run(*channel);  // a short copy: the lock stays, nothing waits behind it
  // A long one lets the reactor go on meanwhile; what is posted meanwhile waits behind it
  // (sameHostBusy_).
  std::shared_ptr<SameHostChannel> keep = sameHost_;  // the lock no longer keeps it
  sameHostBusy_ = true;
  lock.unlock();
  const bool done = run(*keep);
  lock.lock();
  sameHostBusy_ = false;
  *queued = *queued || !posted_.empty() || state_.load() == QpState::kErr;
  return done;
}

Status SoftQp::postRecv(std::span<const verbs::RecvWr> wrs, size_t* badIndex) {
  size_t posted = 0;
  Status status;
  bool flush = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (; posted < wrs.size(); ++posted) {
      const verbs::RecvWr& wr = wrs[posted];
      if (closed_) {
        status = closedError("post recv: the QP is closed");
        break;
      }
      if (srq_) {
        status = refusePost("the QP takes its receives from an SRQ");
        break;
      }
      if (state_.load() == QpState::kReset) {
        status = refusePost("receive queue not ready (QP in RESET)");
        break;
      }
      if (rq_.size() >= cap_.maxRecvWr) {
        status = resourceExhausted("post recv: receive queue full");
        break;
      }
      rq_.push_back(RecvWqe{wr.wrId, Sges(wr.sgList.begin(), wr.sgList.end())});
    }
    flush = state_.load() == QpState::kErr && posted > 0;
  }
  if (flush) requester_.schedulePump();
  if (!status.isOk() && badIndex) *badIndex = posted;
  return status;
}

void SoftQp::close() {
  if (closed_.exchange(true)) return;
  auto self = std::static_pointer_cast<SoftQp>(shared_from_this());
  (void)ctx_->reactor().runSync([self] {
    self->resetFromLoop();
    self->state_ = QpState::kErr;
  });
  if (auto* table = ctx_->share()) table->retractQp(qpn_);
  ctx_->removeQp(qpn_);
}

// ---------------------------------------------------------------------------------------------
// State changes (reactor thread).

Status SoftQp::modifyFromLoop(const verbs::QpAttr& attr, uint32_t mask) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (closed_) return closedError("modify: the QP is closed");
  if (type_ != verbs::QpType::kRc && type_ != verbs::QpType::kUc) {
    return notSupported("modify: this QP type is not offered by the soft provider");
  }
  const QpState current = state_.load();
  auto next = verbs::checkQpTransition(type_, current, attr, mask);
  if (!next.isOk()) return next.status();
  FERRY_RETURN_IF_ERROR(checkDeviceLimits(attr, mask));
  {
    std::lock_guard<std::mutex> lock(mu_);
    applyAttrLocked(attr, mask);
  }
  enterStateFromLoop(current, *next);
  return Status::ok();
}

Status SoftQp::checkDeviceLimits(const verbs::QpAttr& attr, uint32_t mask) {
  namespace m = verbs::qp_attr_mask;
  if (mask & m::kAv) {
    in_addr_t ip;
    uint16_t port;
    if (!parseSoftGid(attr.ahAttr.dgid, &ip, &port)) {
      return invalidArgument("modify QP: the address vector's dgid is not a GID of a software device");
    }
  }
  if ((mask & m::kMaxDestRdAtomic) && attr.maxDestRdAtomic > 16) {
    return invalidArgument("modify QP: max_dest_rd_atomic above the device limit (16)");
  }
  if ((mask & m::kMaxQpRdAtomic) && attr.maxRdAtomic > kMaxRdAtomic) {
    return invalidArgument("modify QP: max_rd_atomic above the device limit (16)");
  }
  return Status::ok();
}

void SoftQp::applyAttrLocked(const verbs::QpAttr& attr, uint32_t mask) {
  namespace m = verbs::qp_attr_mask;
  if (mask & m::kAccessFlags) attr_.qpAccessFlags = attr.qpAccessFlags;
  if (mask & m::kPkeyIndex) attr_.pkeyIndex = attr.pkeyIndex;
  if (mask & m::kPort) attr_.portNum = attr.portNum;
  if (mask & m::kQkey) attr_.qkey = attr.qkey;
  if (mask & m::kAv) attr_.ahAttr = attr.ahAttr;
  if (mask & m::kPathMtu) attr_.pathMtu = attr.pathMtu;
  if (mask & m::kTimeout) attr_.timeout = attr.timeout;
  if (mask & m::kRetryCnt) attr_.retryCnt = attr.retryCnt;
  if (mask & m::kRnrRetry) attr_.rnrRetry = attr.rnrRetry;
  if (mask & m::kRqPsn) attr_.rqPsn = attr.rqPsn;
  if (mask & m::kSqPsn) attr_.sqPsn = attr.sqPsn;
  if (mask & m::kMaxQpRdAtomic) attr_.maxRdAtomic = attr.maxRdAtomic;
  if (mask & m::kMaxDestRdAtomic) attr_.maxDestRdAtomic = attr.maxDestRdAtomic;
  if (mask & m::kMinRnrTimer) attr_.minRnrTimer = attr.minRnrTimer;
  if (mask & m::kDestQpn) attr_.destQpNum = attr.destQpNum;
}

void SoftQp::enterStateFromLoop(QpState current, QpState to) {
  FERRY_ON_LOOP(ctx_->reactor());
  if (to == QpState::kReset) return resetFromLoop();
  if (to == QpState::kErr) return enterErrorFromLoop(std::nullopt);
  // Published before the QP acts on its new state, so a same-host peer never sees it stale-ready.
  state_ = to;
  publishShareFromLoop();
  if (current == QpState::kInit && to == QpState::kRtr) responder_.startFromLoop();
  if (current == QpState::kRtr && to == QpState::kRts) requester_.startFromLoop();
}

void SoftQp::resetFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  requester_.resetFromLoop();
  responder_.resetFromLoop();
  std::lock_guard<std::mutex> lock(mu_);
  posted_.clear();
  rq_.clear();
  sqOutstanding_ = 0;
  verbs::QpAttr fresh;
  fresh.cap = cap_;
  attr_ = fresh;
  state_ = QpState::kReset;
  sameHost_.reset();
  publishShareFromLoop();
}

void SoftQp::enterErrorFromLoop(std::optional<WcStatus> status) {
  FERRY_ON_LOOP(ctx_->reactor());
  bool wasErr = state_.load() == QpState::kErr;
  state_ = QpState::kErr;
  // The stripe goes before any completion: a READ part it is placing lands before the READ fails.
  requester_.dropStripeFromLoop();
  if (status) requester_.failOldestFromLoop(*status);
  if (!wasErr) {
    FERRY_LOG(kDebug, "QP %u moves to ERR", qpn_);
    publishShareFromLoop();
    closeSameHost();
    requester_.stopFromLoop();
    responder_.stopAfterErrorFromLoop();
    if (srq_) ctx_->raiseAsync({.type = verbs::AsyncEventType::kQpLastWqeReached, .qpNum = qpn_});
  }
  flushFromLoop();
}

void SoftQp::flushFromLoop() {
  FERRY_ON_LOOP(ctx_->reactor());
  requester_.flushSendsFromLoop();
  responder_.flushRecvsFromLoop();
}

}  // namespace ferry::soft
