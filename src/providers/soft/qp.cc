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

#include "ferry/common/config.h"
#include "common/device_access.h"
#include "common/log.h"
#include "verbs/qp_state.h"

namespace ferry::soft {
namespace {

using verbs::QpState;
using verbs::WcOpcode;
using verbs::WcStatus;
using verbs::WrOpcode;

constexpr uint32_t kMaxInline = 512;
// The most requests (and their local pieces) one same-host system call carries.
constexpr size_t kMaxFastBatch = 256;
constexpr size_t kMaxFastPieces = 1024;
// Same-host requests from this size are copied by two threads (SoftQp::copyInTwo).
constexpr uint64_t kStripeBytes = uint64_t{4} << 20;

bool seqLe(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) <= 0; }

bool isReadOrAtomic(WrOpcode op) {
  return op == WrOpcode::kRdmaRead || op == WrOpcode::kAtomicCmpAndSwp || op == WrOpcode::kAtomicFetchAndAdd;
}

WcOpcode wcOpcodeFor(WrOpcode op) {
  switch (op) {
    case WrOpcode::kRdmaWrite:
    case WrOpcode::kRdmaWriteWithImm: return WcOpcode::kRdmaWrite;
    case WrOpcode::kSend:
    case WrOpcode::kSendWithImm: return WcOpcode::kSend;
    case WrOpcode::kRdmaRead: return WcOpcode::kRdmaRead;
    case WrOpcode::kAtomicCmpAndSwp: return WcOpcode::kCompSwap;
    case WrOpcode::kAtomicFetchAndAdd: return WcOpcode::kFetchAdd;
  }
  return WcOpcode::kSend;
}

WcStatus statusForSyndrome(wire::Syndrome s) {
  switch (s) {
    case wire::Syndrome::kRemAccess: return WcStatus::kRemAccessErr;
    case wire::Syndrome::kRemInvReq: return WcStatus::kRemInvReqErr;
    case wire::Syndrome::kRemOp: return WcStatus::kRemOpErr;
    case wire::Syndrome::kRnr: return WcStatus::kRnrRetryExcErr;
    case wire::Syndrome::kOk: break;
  }
  return WcStatus::kGeneralErr;
}

Status refusePost(const std::string& why) { return invalidArgument("post: " + why); }

}  // namespace

SoftQp::SoftQp(std::shared_ptr<SoftContext> ctx, std::shared_ptr<SoftPd> pd, const verbs::QpInitImpl& init)
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

Status SoftQp::postSend(std::span<const verbs::SendWr> wrs, size_t* badIndex) {
  size_t posted = 0;
  Status status;
  bool queued = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (; posted < wrs.size(); ++posted) {
      const verbs::SendWr& wr = wrs[posted];
      QpState state = state_.load();
      if (closed_) {
        status = closedError("post send: the QP is closed");
        break;
      }
      if (sendCq_->closed()) {
        status = closedError("post send: the QP's send CQ is closed");
        break;
      }
      if (state == QpState::kReset || state == QpState::kInit || state == QpState::kRtr) {
        status = refusePost(std::string("send queue not ready (QP in ") + verbs::qpStateName(state) + ")");
        break;
      }
      if (static_cast<uint8_t>(wr.opcode) > static_cast<uint8_t>(WrOpcode::kAtomicFetchAndAdd)) {
        status = refusePost("unknown opcode");
        break;
      }
      if (wr.sgList.size() > cap_.maxSendSge) {
        status = refusePost("more SGEs than the QP's max_send_sge");
        break;
      }
      uint64_t total = 0;
      for (const auto& sge : wr.sgList) total += sge.length;
      bool inlined = (wr.sendFlags & verbs::send_flags::kInline) != 0;
      if (inlined && (isReadOrAtomic(wr.opcode) || total > cap_.maxInlineData)) {
        status = refusePost(isReadOrAtomic(wr.opcode) ? "inline READ/atomic" : "inline data above max_inline_data");
        break;
      }
      if (total > wire::kMaxMessage) {
        status = refusePost("message above the 2 GiB limit");
        break;
      }
      if (wr.opcode == WrOpcode::kAtomicCmpAndSwp || wr.opcode == WrOpcode::kAtomicFetchAndAdd) {
        if (wr.sgList.size() != 1 || total != 8) {
          status = refusePost("an atomic needs one 8-byte SGE");
          break;
        }
        if (wr.atomic.remoteAddr % 8 != 0) {  // refused here, as the kernel's rxe does
          status = refusePost("atomic remote address not 8-byte aligned");
          break;
        }
      }
      if (sqOutstanding_.load() >= cap_.maxSendWr) {
        if (badIndex) *badIndex = posted;
        status = resourceExhausted("post send: send queue full");
        break;
      }
      const bool signaled = sqSigAll_ || (wr.sendFlags & verbs::send_flags::kSignaled);
      bool placed = false;
      ++sqOutstanding_;
      std::shared_ptr<FastPath> fp = fastPathForLocked(wr.opcode, total);
      bool fastDone = false;
      if (fp && (wr.opcode == WrOpcode::kRdmaWrite || wr.opcode == WrOpcode::kRdmaRead)) {
        // A run of WRITEs (or READs) to one region posted together moves in one system call.
        size_t run = 1;
        size_t pieces = wr.sgList.size();
        while (posted + run < wrs.size() && run < kMaxFastBatch &&
               sqOutstanding_.load() + run < cap_.maxSendWr) {
          const verbs::SendWr& next = wrs[posted + run];
          uint64_t len = 0;
          for (const auto& sge : next.sgList) len += sge.length;
          const bool nextInline = (next.sendFlags & verbs::send_flags::kInline) != 0;
          if (next.opcode != wr.opcode || next.rdma.rkey != wr.rdma.rkey || len == 0 || len > wire::kMaxMessage ||
              next.sgList.size() > cap_.maxSendSge || pieces + next.sgList.size() > kMaxFastPieces ||
              (nextInline && (wr.opcode == WrOpcode::kRdmaRead || len > cap_.maxInlineData))) {
            break;
          }
          pieces += next.sgList.size();
          ++run;
        }
        if (run > 1) {
          sqOutstanding_ += static_cast<uint32_t>(run - 1);
          fastBusy_ = true;
          lock.unlock();
          auto batch = wrs.subspan(posted, run);
          const bool done = runFastPathBatch(*fp, batch);
          if (done) {
            for (const auto& w : batch) {
              uint64_t len = 0;
              for (const auto& sge : w.sgList) len += sge.length;
              pushSendCompletion(w.wrId, w.opcode, len, sqSigAll_ || (w.sendFlags & verbs::send_flags::kSignaled),
                                 WcStatus::kSuccess);
            }
          }
          lock.lock();
          fastBusy_ = false;
          queued = queued || !posted_.empty() || state_.load() == QpState::kErr;
          if (done) {
            posted += run - 1;
            continue;
          }
          sqOutstanding_ -= static_cast<uint32_t>(run - 1);
        }
      }
      if (fp) {
        // Carried out here, before anything posted after it (which waits in posted_).
        fastBusy_ = true;
        lock.unlock();
        fastDone = runFastPath(*fp, wr, total);
        // A WRITE_WITH_IMM's data is in place; its immediate still goes to the peer below.
        placed = fastDone && wr.opcode == WrOpcode::kRdmaWriteWithImm;
        if (fastDone && !placed) pushSendCompletion(wr.wrId, wr.opcode, total, signaled, WcStatus::kSuccess);
        lock.lock();
        fastBusy_ = false;
        queued = queued || !posted_.empty() || state_.load() == QpState::kErr;
        if (fastDone && !placed) continue;
      }
      SendWqe wqe;
      wqe.wrId = wr.wrId;
      wqe.opcode = wr.opcode;
      wqe.flags = wr.sendFlags;
      wqe.signaled = signaled;
      wqe.length = total;
      wqe.immData = wr.immData;
      wqe.placed = placed;
      if (isReadOrAtomic(wr.opcode) && wr.opcode != WrOpcode::kRdmaRead) {
        wqe.remoteAddr = wr.atomic.remoteAddr;
        wqe.rkey = wr.atomic.rkey;
        wqe.compareAdd = wr.atomic.compareAdd;
        wqe.swap = wr.atomic.swap;
      } else {
        wqe.remoteAddr = wr.rdma.remoteAddr;
        wqe.rkey = wr.rdma.rkey;
      }
      if (placed) {
        // Nothing of the caller's memory is needed any more.
      } else if (inlined) {
        // Inline data is copied now: the caller may reuse its buffer as soon as we return.
        wqe.inlineData.resize(total);
        size_t off = 0;
        for (const auto& sge : wr.sgList) {
          if (sge.length) std::memcpy(wqe.inlineData.data() + off, reinterpret_cast<const void*>(sge.addr), sge.length);
          off += sge.length;
        }
      } else {
        wqe.sges.assign(wr.sgList.begin(), wr.sgList.end());
      }
      if (fp) {
        posted_.push_front(std::move(wqe));  // refused by the same-host path, or placed: first in line
        queued = true;
        continue;
      }
      posted_.push_back(std::move(wqe));
      queued = true;
    }
  }
  if (queued) schedulePump();
  if (!status.isOk() && badIndex) *badIndex = posted;
  return status;
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
      if (wr.sgList.size() > cap_.maxRecvSge) {
        status = refusePost("more SGEs than the QP's max_recv_sge");
        break;
      }
      if (rq_.size() >= cap_.maxRecvWr) {
        status = resourceExhausted("post recv: receive queue full");
        break;
      }
      rq_.push_back(RecvWqe{wr.wrId, std::vector<verbs::Sge>(wr.sgList.begin(), wr.sgList.end())});
    }
    flush = state_.load() == QpState::kErr && posted > 0;
  }
  if (flush) schedulePump();
  if (!status.isOk() && badIndex) *badIndex = posted;
  return status;
}

void SoftQp::close() {
  if (closed_.exchange(true)) return;
  auto self = shared_from_this();
  (void)ctx_->reactor().runSync([self] {
    self->resetFromLoop();
    self->state_ = QpState::kErr;
  });
  if (auto* table = ctx_->share()) table->retractQp(qpn_);
  ctx_->removeQp(qpn_);
}

void SoftQp::schedulePump() {
  if (pumpScheduled_.exchange(true)) return;
  // Progress where the application is: when the progress thread is not running the device's loop
  // (it sleeps), the posting thread sends the requests itself instead of waking it.
  static const bool callerProgress = config::softCallerProgress();
  if (callerProgress && ctx_->reactor().runHere([this] { pumpFromLoop(); })) return;
  std::weak_ptr<SoftQp> weak = weak_from_this();
  ctx_->reactor().post([weak] {
    if (auto self = weak.lock()) self->pumpFromLoop();
  });
}

// ---------------------------------------------------------------------------------------------
// State changes (reactor thread).

Status SoftQp::modifyFromLoop(const verbs::QpAttr& attr, uint32_t mask) {
  namespace m = verbs::qp_attr_mask;
  if (closed_) return closedError("modify: the QP is closed");
  if (type_ != verbs::QpType::kRc && type_ != verbs::QpType::kUc) {
    return notSupported("modify: this QP type is not offered by the soft provider");
  }
  QpState current = state_.load();
  auto next = verbs::checkQpTransition(type_, current, attr, mask);
  if (!next.isOk()) return next.status();
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
  if ((mask & m::kMaxQpRdAtomic) && attr.maxRdAtomic > 16) {
    return invalidArgument("modify QP: max_rd_atomic above the device limit (16)");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  QpState to = *next;
  if (to == QpState::kReset) {
    resetFromLoop();
    return Status::ok();
  }
  if (to == QpState::kErr) {
    enterErrorFromLoop(std::nullopt);
    return Status::ok();
  }
  // Published before the QP acts on its new state, so a same-host peer never sees it stale-ready.
  state_ = to;
  publishShareFromLoop();
  if (current == QpState::kInit && to == QpState::kRtr) {
    expectedSeq_ = attr_.rqPsn;
    respNakPending_ = false;
  }
  if (current == QpState::kRtr && to == QpState::kRts) {
    nextSeq_ = attr_.sqPsn;
    ackedThrough_ = attr_.sqPsn - 1;
    connectStarted_ = Clock::now();
    reconnectDelayMs_ = 1;
    startConnectFromLoop();
    pumpFromLoop();
  }
  return Status::ok();
}

void SoftQp::resetFromLoop() {
  if (reqConn_) reqConn_->close(Status::ok(), true);
  if (respConn_) respConn_->close(Status::ok(), true);
  reqConn_.reset();
  respConn_.reset();
  reqReady_ = false;
  peerReached_ = false;
  listenerReached_ = false;
  peerGone_ = false;
  for (auto* timer : {&rnrTimer_, &timeoutTimer_, &reconnectTimer_}) {
    if (*timer) ctx_->reactor().cancelTimer(*timer);
    *timer = 0;
  }
  sq_.clear();
  nextToSend_ = 0;
  rdInFlight_ = 0;
  localErrorPending_ = false;
  rnrWaiting_ = false;
  respNakPending_ = false;
  respSkip_ = false;
  ackNeeded_ = false;
  curRecv_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  posted_.clear();
  rq_.clear();
  sqOutstanding_ = 0;
  verbs::QpAttr fresh;
  fresh.cap = cap_;
  attr_ = fresh;
  state_ = QpState::kReset;
  fast_.reset();
  publishShareFromLoop();
}

void SoftQp::enterErrorFromLoop(std::optional<WcStatus> status) {
  bool wasErr = state_.load() == QpState::kErr;
  state_ = QpState::kErr;
  if (status && !sq_.empty()) {
    SendWqe wqe = std::move(sq_.front());
    sq_.pop_front();
    if (nextToSend_ > 0) --nextToSend_;
    pushSendCompletion(wqe, *status);
  }
  if (!wasErr) {
    FERRY_LOG(kDebug, "QP %u moves to ERR", qpn_);
    publishShareFromLoop();
    dropFastPath();
    if (reqConn_) reqConn_->close(Status::ok(), true);
    reqConn_.reset();
    reqReady_ = false;
    if (respConn_) respConn_->closeAfterFlush(/*drain=*/true);  // a queued NAK still reaches the peer
    for (auto* timer : {&rnrTimer_, &timeoutTimer_, &reconnectTimer_}) {
      if (*timer) ctx_->reactor().cancelTimer(*timer);
      *timer = 0;
    }
    rnrWaiting_ = false;
    if (srq_) ctx_->raiseAsync({.type = verbs::AsyncEventType::kQpLastWqeReached, .qpNum = qpn_});
  }
  flushFromLoop();
}

void SoftQp::flushFromLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A post copying on the same-host path completes first; it then has the rest flushed.
    while (!fastBusy_ && !posted_.empty()) {
      sq_.push_back(std::move(posted_.front()));
      posted_.pop_front();
    }
  }
  completeSendQueueFromLoop(WcStatus::kWrFlushErr);
  std::deque<RecvWqe> flushed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    flushed.swap(rq_);
  }
  if (curRecv_) {
    flushed.push_front(std::move(*curRecv_));
    curRecv_.reset();
  }
  for (auto& r : flushed) pushRecvCompletion(r, WcStatus::kWrFlushErr, WcOpcode::kRecv, 0, std::nullopt, false);
}

// ---------------------------------------------------------------------------------------------
// Completions.

void SoftQp::pushSendCompletion(const SendWqe& wqe, WcStatus status) {
  pushSendCompletion(wqe.wrId, wqe.opcode, wqe.length, wqe.signaled, status);
}

void SoftQp::pushSendCompletion(uint64_t wrId, WrOpcode opcode, uint64_t length, bool signaled, WcStatus status) {
  if (sqOutstanding_ > 0) --sqOutstanding_;
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

void SoftQp::pushRecvCompletion(const RecvWqe& wqe, WcStatus status, WcOpcode opcode, uint32_t byteLen,
                                std::optional<uint32_t> imm, bool solicited) {
  verbs::WorkCompletion wc;
  wc.wrId = wqe.wrId;
  wc.status = status;
  wc.opcode = opcode;
  wc.byteLen = byteLen;
  wc.qpNum = qpn_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wc.srcQp = attr_.destQpNum;
  }
  if (imm) {
    wc.immData = *imm;
    wc.wcFlags |= verbs::wc_flags::kWithImm;
  }
  wc.vendorErr = status == WcStatus::kSuccess ? 0 : static_cast<uint32_t>(status);
  recvCq_->push(wc, solicited);
}

bool SoftQp::takeRecv(RecvWqe* out) {
  if (srq_) return srq_->take(out);
  std::lock_guard<std::mutex> lock(mu_);
  if (rq_.empty()) return false;
  *out = std::move(rq_.front());
  rq_.pop_front();
  return true;
}

void SoftQp::giveBackRecv(RecvWqe wqe) {
  if (srq_) {
    srq_->giveBack(std::move(wqe));
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  rq_.push_front(std::move(wqe));
}

// ---------------------------------------------------------------------------------------------
// Requester (reactor thread).

WcStatus SoftQp::resolveLocalFromLoop(SendWqe& wqe) {
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

OutFrame SoftQp::buildRequestFrame(const SendWqe& wqe) {
  wire::FrameHeader h;
  h.seq = wqe.seq;
  h.qpn = attr_.destQpNum;
  h.remoteAddr = wqe.remoteAddr;
  h.rkey = wqe.rkey;
  switch (wqe.opcode) {
    case WrOpcode::kSend: h.type = wire::FrameType::kSend; break;
    case WrOpcode::kSendWithImm: h.type = wire::FrameType::kSendImm; h.aux = wqe.immData; break;
    case WrOpcode::kRdmaWrite: h.type = wire::FrameType::kWrite; break;
    case WrOpcode::kRdmaWriteWithImm: h.type = wire::FrameType::kWriteImm; h.aux = wqe.immData; break;
    case WrOpcode::kRdmaRead:
      h.type = wire::FrameType::kReadReq;
      h.length = static_cast<uint32_t>(wqe.length);
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

void SoftQp::pumpFromLoop() {
  pumpScheduled_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fastBusy_) return;  // the post copying on the same-host path schedules us when it ends
    if (sq_.empty() && !posted_.empty()) lastProgress_ = Clock::now();
    while (!posted_.empty()) {
      sq_.push_back(std::move(posted_.front()));
      posted_.pop_front();
    }
  }
  QpState state = state_.load();
  if (state == QpState::kErr) {
    flushFromLoop();
    return;
  }
  if (state != QpState::kRts || sq_.empty()) return;
  if (!reqConn_ || !reqReady_) {
    if (!reqConn_ && !reconnectTimer_) startConnectFromLoop();
    armTimeoutFromLoop();
    return;
  }
  if (rnrWaiting_ || localErrorPending_) return;
  uint32_t maxRd = std::max<uint32_t>(1, attr_.maxRdAtomic);
  // The requests of one pump leave in one write (see Conn::cork).
  struct Corked {
    std::shared_ptr<Conn> conn;
    explicit Corked(std::shared_ptr<Conn> c) : conn(std::move(c)) { conn->cork(); }
    ~Corked() {
      if (!conn->closed()) conn->uncork();
    }
  } corked(reqConn_);
  while (nextToSend_ < sq_.size()) {
    SendWqe& wqe = sq_[nextToSend_];
    bool rdAtomic = isReadOrAtomic(wqe.opcode);
    if (rdAtomic && rdInFlight_ >= maxRd) break;
    if ((wqe.flags & verbs::send_flags::kFence) && rdInFlight_ > 0) break;
    wqe.seq = nextSeq_++;
    ++nextToSend_;
    if (wqe.rnrLeft < 0) wqe.rnrLeft = attr_.rnrRetry;
    if (WcStatus local = resolveLocalFromLoop(wqe); local != WcStatus::kSuccess) {
      wqe.error = local;
      localErrorPending_ = true;
      completeFromLoop();
      return;
    }
    if (rdAtomic) ++rdInFlight_;
    reqConn_->send(buildRequestFrame(wqe));
    if (state_.load() != QpState::kRts || !reqConn_) return;  // the send failed and closed things
  }
  armTimeoutFromLoop();
}

void SoftQp::completeFromLoop() {
  while (!sq_.empty() && nextToSend_ > 0) {
    SendWqe& wqe = sq_.front();
    if (wqe.error != WcStatus::kSuccess) {
      enterErrorFromLoop(wqe.error);
      return;
    }
    if (!seqLe(wqe.seq, ackedThrough_)) break;
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
    lastProgress_ = Clock::now();
  }
  if (sq_.empty() && timeoutTimer_) {
    ctx_->reactor().cancelTimer(timeoutTimer_);
    timeoutTimer_ = 0;
  }
  if (state_.load() == QpState::kRts && nextToSend_ < sq_.size()) pumpFromLoop();
}

SoftQp::Clock::duration SoftQp::transportBudget() const {
  // 4.096 us * 2^timeout per try, at least 1 ms; retry_cnt retries after the first try.
  double perTryUs = 4.096 * static_cast<double>(1ull << attr_.timeout);
  perTryUs = std::max(perTryUs, 1000.0);
  return std::chrono::microseconds(static_cast<int64_t>(perTryUs * (attr_.retryCnt + 1)));
}

void SoftQp::armTimeoutFromLoop() {
  if (timeoutTimer_ || attr_.timeout == 0 || sq_.empty()) return;
  std::weak_ptr<SoftQp> weak = weak_from_this();
  timeoutTimer_ = ctx_->reactor().addTimer(lastProgress_ + transportBudget(), [weak] {
    if (auto self = weak.lock()) self->onTimeoutFromLoop();
  });
}

void SoftQp::onTimeoutFromLoop() {
  timeoutTimer_ = 0;
  if (sq_.empty() || state_.load() != QpState::kRts) return;
  auto now = Clock::now();
  if (rnrWaiting_) lastProgress_ = now;
  if (now - lastProgress_ >= transportBudget()) {
    FERRY_LOG(kInfo, "QP %u: no progress within the transport timeout; retries exhausted", qpn_);
    enterErrorFromLoop(WcStatus::kRetryExcErr);
    return;
  }
  armTimeoutFromLoop();
}

void SoftQp::startConnectFromLoop() {
  if (reqConn_ || state_.load() != QpState::kRts) return;
  in_addr_t ip;
  uint16_t port;
  if (!parseSoftGid(attr_.ahAttr.dgid, &ip, &port)) return;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    FERRY_LOG(kWarn, "QP %u: socket failed: %s", qpn_, std::strerror(errno));
    scheduleReconnectFromLoop();
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = ctx_->ipv4();
  (void)::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local);
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_addr.s_addr = ip;
  peer.sin_port = htons(port);
  int r = ::connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof peer);
  if (r != 0 && errno != EINPROGRESS) {
    ::close(fd);
    scheduleReconnectFromLoop();
    return;
  }
  reqConn_ = std::make_shared<Conn>(ctx_.get(), fd, this, true);
  reqReady_ = false;
  if (!reqConn_->attach().isOk()) {
    reqConn_.reset();
    scheduleReconnectFromLoop();
  }
}

void SoftQp::completeSendQueueFromLoop(WcStatus status) {
  while (!sq_.empty()) {
    SendWqe wqe = std::move(sq_.front());
    sq_.pop_front();
    pushSendCompletion(wqe, status);
  }
  nextToSend_ = 0;
  rdInFlight_ = 0;
}

void SoftQp::peerGoneFromLoop(const char* why) {
  if (!peerGone_) FERRY_LOG(kInfo, "QP %u: the peer is gone: %s", qpn_, why);
  peerGone_ = true;
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
  if (reconnectTimer_ || state_.load() != QpState::kRts) return;
  if (peerGone_ && sq_.empty()) return;
  // Keep trying while work waits, or for a while after RTS (the peer may not be at RTR yet).
  auto window = std::max<Clock::duration>(transportBudget(), std::chrono::seconds(2));
  if (sq_.empty() && Clock::now() - connectStarted_ > window) return;
  std::weak_ptr<SoftQp> weak = weak_from_this();
  reconnectTimer_ = ctx_->reactor().addTimer(Clock::now() + std::chrono::milliseconds(reconnectDelayMs_), [weak] {
    if (auto self = weak.lock()) {
      self->reconnectTimer_ = 0;
      self->startConnectFromLoop();
    }
  });
  reconnectDelayMs_ = std::min(reconnectDelayMs_ * 2, 100);
}

void SoftQp::onConnected(Conn& conn) {
  if (&conn != reqConn_.get()) return;
  listenerReached_ = true;
  wire::FrameHeader hello;
  hello.type = wire::FrameType::kHello;
  hello.qpn = attr_.destQpNum;
  hello.srcQpn = qpn_;
  hello.psn = nextSeq_ & 0xffffff;
  hello.maxRdAtomic = attr_.maxRdAtomic;
  hello.srcGid = ctx_->gid().raw;
  if (!conn.overRing() && !ringRefused_ && sameHostRingsAllowed()) hello.flags |= wire::kFlagRingOffer;
  conn.sendHeader(hello);
}

bool SoftQp::startRingConnectFromLoop(uint32_t pid, uint64_t nonce, uint64_t ticket) {
  auto fail = [&](const std::string& why) {
    FERRY_LOG(kInfo, "QP %u: no shared-memory rings to its peer (TCP instead): %s", qpn_, why.c_str());
    return false;
  };
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(std::string("socket: ") + std::strerror(errno));
  sockaddr_un un;
  socklen_t unLen = ringListenerAddress(pid, nonce, &un);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&un), unLen) != 0) {
    int err = errno;
    ::close(fd);
    return fail(std::string("connect to the peer's ring listener: ") + std::strerror(err));
  }
  // The listener's name came from the peer's hello reply; its owner must be the process named there.
  ucred cred{};
  socklen_t credLen = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &credLen) != 0 || static_cast<uint32_t>(cred.pid) != pid) {
    ::close(fd);
    return fail("the ring listener belongs to another process");
  }
  auto link = RingLink::create(RingLink::defaultRingBytes());
  if (!link.isOk()) {
    ::close(fd);
    return fail(link.status().toString());
  }
  if (Status sent = sendRingSetup(fd, **link, ticket); !sent.isOk()) {
    ::close(fd);
    return fail(sent.toString());
  }
  reqConn_ = std::make_shared<Conn>(ctx_.get(), fd, std::move(*link), this);
  reqReady_ = false;
  if (!reqConn_->attach().isOk()) {
    reqConn_.reset();
    return fail("could not watch the ring");
  }
  onConnected(*reqConn_);
  return true;
}

void SoftQp::onProgress(Conn& conn) {
  if (&conn == reqConn_.get() && reqReady_) lastProgress_ = Clock::now();
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
    return;
  }
  if (&conn != reqConn_.get()) return;
  bool wasReady = reqReady_;
  reqConn_.reset();
  reqReady_ = false;
  dropFastPath();
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
  // connection has no listener any more: its process (or its context) is gone.
  if (listenerReached_ && !wasReady && why.cause() == ECONNREFUSED) {
    peerGoneFromLoop("its connections are refused");
    return;
  }
  scheduleReconnectFromLoop();
}

Status SoftQp::onHeader(Conn& conn, const wire::FrameHeader& h, PayloadPlan* plan) {
  if (&conn == reqConn_.get()) return onResponseHeader(h, plan);
  if (&conn == respConn_.get()) return onRequestHeader(h, plan);
  return Status(StatusCode::kProtocolError, "frame on a connection the QP no longer uses");
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
    case FrameType::kAtomicResp:
      return Status::ok();
    case FrameType::kReadResp: {
      // The response belongs to the oldest READ not answered yet.
      for (size_t i = 0; i < nextToSend_; ++i) {
        SendWqe& wqe = sq_[i];
        if (wqe.opcode != WrOpcode::kRdmaRead || wqe.responded) continue;
        if (wqe.seq != h.seq || h.payloadLen != wqe.length) {
          return Status(StatusCode::kProtocolError, "READ response does not match the oldest READ");
        }
        plan->segments = wqe.local;
        return Status::ok();
      }
      return Status(StatusCode::kProtocolError, "READ response with no READ outstanding");
    }
    default:
      return Status(StatusCode::kProtocolError, "request frame on a requester connection");
  }
}

void SoftQp::onResponseFrame(const wire::FrameHeader& h, const PayloadPlan& plan, uint32_t trailer) {
  using wire::FrameType;
  if (h.type == FrameType::kHelloReply) {
    if (static_cast<wire::HelloResult>(h.aux) == wire::HelloResult::kUseRing) {
      // The peer is on this host: the same conversation again, over shared-memory rings.
      reqConn_->close(Status::ok(), true);
      reqConn_.reset();
      if (h.sharePid == 0 || h.ringTicket == 0 || !startRingConnectFromLoop(h.sharePid, h.shareCookie, h.ringTicket)) {
        ringRefused_ = true;
        scheduleReconnectFromLoop();
        armTimeoutFromLoop();
      }
      return;
    }
    if (static_cast<wire::HelloResult>(h.aux) == wire::HelloResult::kAccepted) {
      reqReady_ = true;
      peerReached_ = true;
      setupFastPathFromLoop(h);
      reconnectDelayMs_ = 1;
      lastProgress_ = Clock::now();
      pumpFromLoop();
    } else {
      // The peer QP is not ready yet (or refuses us): try again until the transport timeout. A QP
      // that was reached before and now is not there was destroyed: the peer is gone.
      reqConn_->close(Status::ok(), true);
      reqConn_.reset();
      if (peerReached_ && static_cast<wire::HelloResult>(h.aux) == wire::HelloResult::kNoSuchQp) {
        peerGoneFromLoop("its queue pair no longer exists");
        return;
      }
      scheduleReconnectFromLoop();
      armTimeoutFromLoop();
    }
    return;
  }
  auto findSent = [&](uint32_t seq) -> SendWqe* {
    for (size_t i = 0; i < nextToSend_; ++i) {
      if (sq_[i].seq == seq) return &sq_[i];
    }
    return nullptr;
  };
  switch (h.type) {
    case FrameType::kAck:
      if (seqLe(ackedThrough_, h.seq)) ackedThrough_ = h.seq;
      completeFromLoop();
      break;
    case FrameType::kReadResp: {
      SendWqe* wqe = findSent(h.seq);
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
      break;
    }
    case FrameType::kAtomicResp: {
      SendWqe* wqe = findSent(h.seq);
      if (!wqe || !isReadOrAtomic(wqe->opcode) || wqe->opcode == WrOpcode::kRdmaRead) {
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
      break;
    }
    case FrameType::kNak: {
      SendWqe* wqe = findSent(h.seq);
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
      SendWqe& front = sq_.front();
      if (attr_.rnrRetry != 7) {
        if (front.rnrLeft <= 0) {
          enterErrorFromLoop(WcStatus::kRnrRetryExcErr);
          return;
        }
        --front.rnrLeft;
      }
      if (reqConn_) reqConn_->dropUnsentFrames();
      nextSeq_ = front.seq;
      nextToSend_ = 0;
      rdInFlight_ = 0;
      for (auto& w : sq_) w.responded = false;
      rnrWaiting_ = true;
      std::weak_ptr<SoftQp> weak = weak_from_this();
      auto wait = std::chrono::microseconds(verbs::rnrTimerMicros(static_cast<uint8_t>(h.flags & 31)));
      rnrTimer_ = ctx_->reactor().addTimer(Clock::now() + wait, [weak] {
        if (auto self = weak.lock()) {
          self->rnrTimer_ = 0;
          self->rnrWaiting_ = false;
          self->lastProgress_ = Clock::now();
          self->pumpFromLoop();
        }
      });
      break;
    }
    default:
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Same-host path.

std::shared_ptr<SoftQp::FastPath> SoftQp::fastPathForLocked(WrOpcode opcode, uint64_t length) const {
  if (!fast_ || fastBusy_ || closed_ || state_.load() != QpState::kRts) return nullptr;
  if (opcode != WrOpcode::kRdmaWrite && opcode != WrOpcode::kRdmaWriteWithImm && opcode != WrOpcode::kRdmaRead &&
      opcode != WrOpcode::kAtomicCmpAndSwp && opcode != WrOpcode::kAtomicFetchAndAdd) {
    return nullptr;
  }
  // Only with nothing else outstanding (this request is counted): it must not overtake one.
  if (length == 0 || sqOutstanding_.load() != 1) return nullptr;
  return fast_;
}

bool SoftQp::copyInTwo(const FastPath& fp, bool write, std::span<const iovec> local, uint64_t remote,
                       uint64_t length) {
  // The second half (from a page boundary) goes to the context's helper thread, the first is
  // copied here; both before the request completes, under the same accessor mark and memory lock.
  const uint64_t half = (length / 2) & ~uint64_t{4095};
  std::vector<iovec> first, second;
  uint64_t at = 0;
  for (const iovec& v : local) {
    uint64_t end = at + v.iov_len;
    if (end <= half) {
      first.push_back(v);
    } else if (at >= half) {
      second.push_back(v);
    } else {
      first.push_back(iovec{v.iov_base, static_cast<size_t>(half - at)});
      second.push_back(iovec{static_cast<uint8_t*>(v.iov_base) + (half - at), static_cast<size_t>(end - half)});
    }
    at = end;
  }
  const SharePeer::Slot* slot = fp.slot.get();
  CopyHelper& helper = ctx_->copyHelper();
  if (!helper.tryStart([slot, write, &second, remote, half, length] {
        return slot->copy(write, second, remote + half, length - half);
      })) {
    return fp.slot->copy(write, local, remote, length);  // the helper is busy with another request
  }
  bool a = fp.slot->copy(write, first, remote, half);
  bool b = helper.wait();
  return a && b;
}

bool SoftQp::runFastPathBatch(const FastPath& fp, std::span<const verbs::SendWr> wrs) {
  const bool write = wrs.front().opcode != WrOpcode::kRdmaRead;
  if (!fp.peer->aliveRecently()) return false;
  std::array<iovec, kMaxFastPieces> local;
  std::array<iovec, kMaxFastBatch> remote;
  size_t nl = 0;
  uint64_t lo = ~uint64_t{0}, hi = 0;
  std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
  const uint32_t need = write ? 0 : verbs::access::kLocalWrite;
  std::array<size_t, kMaxFastBatch + 1> localAt;  // where each request's local pieces start
  uint64_t total = 0;
  for (size_t i = 0; i < wrs.size(); ++i) {
    const verbs::SendWr& wr = wrs[i];
    const bool inlined = (wr.sendFlags & verbs::send_flags::kInline) != 0;
    localAt[i] = nl;
    uint64_t len = 0;
    for (const auto& sge : wr.sgList) {
      if (sge.length == 0) continue;
      if (!inlined && !ctx_->findMrLocked(sge.lkey, pd_.get(), sge.addr, sge.length, need)) return false;
      local[nl++] = iovec{reinterpret_cast<void*>(sge.addr), sge.length};
      len += sge.length;
    }
    if (wr.rdma.remoteAddr + len < wr.rdma.remoteAddr) return false;
    remote[i] = iovec{reinterpret_cast<void*>(static_cast<uintptr_t>(wr.rdma.remoteAddr)), len};
    total += len;
    lo = std::min(lo, wr.rdma.remoteAddr);
    hi = std::max(hi, wr.rdma.remoteAddr + len);
  }
  // The owner's records are checked once for the span all of them touch: inside one region, each
  // one is.
  const uint32_t remoteNeed = write ? verbs::access::kRemoteWrite : verbs::access::kRemoteRead;
  if (!fp.slot->begin(fp.destQpn, qpn_, wrs.front().rdma.rkey, lo, hi - lo, remoteNeed)) return false;
  bool copied;
  const size_t split = wrs.size() / 2;
  if (total >= kStripeBytes) {
    // Large: the helper thread copies the second half of the requests while this one copies the
    // first (under the same accessor mark and memory lock; both end before anything completes).
    const SharePeer::Slot* slot = fp.slot.get();
    std::span<const iovec> localTail(local.data() + localAt[split], nl - localAt[split]);
    std::span<const iovec> remoteTail(remote.data() + split, wrs.size() - split);
    if (ctx_->copyHelper().tryStart([slot, write, localTail, remoteTail] { return slot->copyv(write, localTail, remoteTail); })) {
      bool a = fp.slot->copyv(write, std::span<const iovec>(local.data(), localAt[split]),
                              std::span<const iovec>(remote.data(), split));
      bool b = ctx_->copyHelper().wait();
      copied = a && b;
    } else {
      copied = fp.slot->copyv(write, std::span<const iovec>(local.data(), nl),
                              std::span<const iovec>(remote.data(), wrs.size()));
    }
  } else {
    copied = fp.slot->copyv(write, std::span<const iovec>(local.data(), nl),
                            std::span<const iovec>(remote.data(), wrs.size()));
  }
  const bool mapped = fp.slot->mapped();
  fp.slot->end();
  if (copied) {
    for (size_t i = 0; i < wrs.size(); ++i) {
      countSameHostOp();
      if (mapped) countSameHostMappedOp();
    }
  }
  return copied;
}

bool SoftQp::runFastAtomic(const FastPath& fp, const verbs::SendWr& wr) {
  if (!fp.peer->aliveRecently()) return false;
  std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
  const verbs::Sge& sge = wr.sgList.front();  // one 8-byte SGE (checked at post)
  if (!ctx_->findMrLocked(sge.lkey, pd_.get(), sge.addr, 8, verbs::access::kLocalWrite)) return false;
  if (!fp.slot->begin(fp.destQpn, qpn_, wr.atomic.rkey, wr.atomic.remoteAddr, 8, verbs::access::kRemoteAtomic)) {
    return false;
  }
  // Only memory both sides map: the owner's atomics are instructions on that memory, so ours are
  // too. Any other memory goes to the owner's responder, which applies it there.
  if (!fp.slot->mapped()) {
    fp.slot->end();
    return false;
  }
  const uint64_t original = fp.slot->atomic(wr.opcode == WrOpcode::kAtomicCmpAndSwp, wr.atomic.remoteAddr,
                                            wr.atomic.compareAdd, wr.atomic.swap);
  fp.slot->end();
  {
    DeviceAccess device;
    std::memcpy(reinterpret_cast<void*>(sge.addr), &original, sizeof original);
  }
  countSameHostOp();
  countSameHostMappedOp();
  return true;
}

bool SoftQp::runFastPath(const FastPath& fp, const verbs::SendWr& wr, uint64_t length) {
  if (wr.opcode == WrOpcode::kAtomicCmpAndSwp || wr.opcode == WrOpcode::kAtomicFetchAndAdd) {
    return runFastAtomic(fp, wr);
  }
  const bool write = wr.opcode != WrOpcode::kRdmaRead;
  if (!fp.peer->aliveRecently()) return false;
  std::array<iovec, 64> iov;
  size_t n = 0;
  // Our own memory stays registered while the lock is held (deregistration takes it exclusively).
  // Inline data needs no key: it is read from the caller's buffer before the post returns.
  std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
  const bool inlined = (wr.sendFlags & verbs::send_flags::kInline) != 0;
  const uint32_t need = write ? 0 : verbs::access::kLocalWrite;
  for (const auto& sge : wr.sgList) {
    if (sge.length == 0) continue;
    if (n == iov.size()) return false;
    if (!inlined && !ctx_->findMrLocked(sge.lkey, pd_.get(), sge.addr, sge.length, need)) return false;
    iov[n++] = iovec{reinterpret_cast<void*>(sge.addr), sge.length};
  }
  const uint32_t remoteNeed = write ? verbs::access::kRemoteWrite : verbs::access::kRemoteRead;
  if (!fp.slot->begin(fp.destQpn, qpn_, wr.rdma.rkey, wr.rdma.remoteAddr, length, remoteNeed)) return false;
  bool copied;
  if (length >= kStripeBytes) {
    copied = copyInTwo(fp, write, std::span<const iovec>(iov.data(), n), wr.rdma.remoteAddr, length);
  } else {
    copied = fp.slot->copy(write, std::span<const iovec>(iov.data(), n), wr.rdma.remoteAddr, length);
  }
  const bool mapped = fp.slot->mapped();
  fp.slot->end();
  if (copied) {
    countSameHostOp();
    if (mapped) countSameHostMappedOp();
  }
  return copied;
}

void SoftQp::setupFastPathFromLoop(const wire::FrameHeader& reply) {
  if (!ctx_->share() || reply.sharePid == 0) return;
  auto peer = ctx_->sharePeer(ShareInfo{reply.sharePid, reply.shareFd, reply.shareCookie});
  if (!peer.isOk()) {
    FERRY_LOG(kDebug, "QP %u: no same-host path to its peer: %s", qpn_, peer.status().toString().c_str());
    return;
  }
  auto slot = SharePeer::claim(*peer);
  if (!slot.isOk()) {
    FERRY_LOG(kInfo, "QP %u: no same-host path to its peer: %s", qpn_, slot.status().toString().c_str());
    return;
  }
  auto fp = std::make_shared<FastPath>();
  fp->peer = std::move(*peer);
  fp->slot = std::move(*slot);
  fp->destQpn = attr_.destQpNum;
  FERRY_LOG(kDebug, "QP %u: same-host path to process %u", qpn_, reply.sharePid);
  std::lock_guard<std::mutex> lock(mu_);
  fast_ = std::move(fp);
}

void SoftQp::dropFastPath() {
  std::lock_guard<std::mutex> lock(mu_);
  fast_.reset();
}

void SoftQp::publishShareFromLoop() {
  if (auto* table = ctx_->share()) {
    table->publishQp(qpn_, state_.load(), attr_.qpAccessFlags, pd_.get(), attr_.destQpNum);
  }
}

void SoftQp::onPayloadRevoked(Conn& conn, const OutFrame& frame) {
  if (&conn != reqConn_.get()) return;  // the responder reports it in the READ_RESP trailer
  // The application deregistered a source region while its message was being sent.
  for (size_t i = 0; i < nextToSend_; ++i) {
    if (sq_[i].seq == frame.seq) {
      sq_[i].error = WcStatus::kLocProtErr;
      localErrorPending_ = true;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Responder (reactor thread).

wire::HelloResult SoftQp::acceptFromLoop(const std::shared_ptr<Conn>& conn, const wire::FrameHeader& hello,
                                         in_addr_t peerIp, bool adopt) {
  QpState state = state_.load();
  if (closed_ || (state != QpState::kRtr && state != QpState::kRts)) return wire::HelloResult::kNoSuchQp;
  in_addr_t ip;
  uint16_t port;
  verbs::Gid src;
  src.raw = hello.srcGid;
  if (!parseSoftGid(src, &ip, &port) || ip != peerIp) return wire::HelloResult::kMismatch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (attr_.destQpNum != hello.srcQpn || !(attr_.ahAttr.dgid == src)) return wire::HelloResult::kMismatch;
  }
  if ((expectedSeq_ & 0xffffff) != hello.psn) return wire::HelloResult::kMismatch;
  if (respConn_ && !respConn_->closed()) return wire::HelloResult::kBusy;
  if (!adopt) return wire::HelloResult::kAccepted;
  respConn_ = conn;
  conn->setDelegate(this);
  respNakPending_ = false;
  respSkip_ = false;
  return wire::HelloResult::kAccepted;
}

void SoftQp::sendNakFromLoop(uint32_t seq, wire::Syndrome syndrome) {
  if (!respConn_) return;
  wire::FrameHeader nak;
  nak.type = wire::FrameType::kNak;
  nak.seq = seq;
  nak.qpn = attr_.destQpNum;
  nak.aux = static_cast<uint32_t>(syndrome);
  if (syndrome == wire::Syndrome::kRnr) nak.flags = attr_.minRnrTimer & 31;
  respConn_->sendHeader(nak);
}

void SoftQp::dropMessageFromLoop() {
  // UC: a message the responder cannot take is dropped without a word (no NAK, no error state);
  // the requester's send completed when it left. Its sequence number is used up.
  ++expectedSeq_;
  ackNeeded_ = true;
  respSkip_ = true;
}

void SoftQp::responderErrorFromLoop(uint32_t seq, wire::Syndrome syndrome, verbs::AsyncEventType event) {
  if (type_ == verbs::QpType::kUc) {
    if (curRecv_) {
      giveBackRecv(std::move(*curRecv_));
      curRecv_.reset();
    }
    dropMessageFromLoop();
    return;
  }
  if (ackNeeded_ && respConn_) {
    // Acknowledge what succeeded before the refused request.
    wire::FrameHeader ack;
    ack.type = wire::FrameType::kAck;
    ack.seq = seq - 1;
    ack.qpn = attr_.destQpNum;
    respConn_->sendHeader(ack);
    ackNeeded_ = false;
  }
  sendNakFromLoop(seq, syndrome);
  ctx_->raiseAsync({.type = event, .qpNum = qpn_});
  respSkip_ = true;
  enterErrorFromLoop(std::nullopt);
}

Status SoftQp::onRequestHeader(const wire::FrameHeader& h, PayloadPlan* plan) {
  using wire::FrameType;
  respSkip_ = false;
  QpState state = state_.load();
  if (state != QpState::kRtr && state != QpState::kRts) {
    respSkip_ = true;
    return Status::ok();
  }
  if (respNakPending_) {
    if (h.seq != expectedSeq_) {
      respSkip_ = true;  // sent before the requester saw our RNR NAK; it comes again
      return Status::ok();
    }
    respNakPending_ = false;
  }
  if (h.seq != expectedSeq_) return Status(StatusCode::kProtocolError, "request out of sequence");
  const uint32_t qpAccess = attr_.qpAccessFlags;
  auto checkRemote = [&](uint64_t addr, uint64_t len, uint32_t need) -> std::shared_ptr<MrEntry> {
    std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
    return ctx_->findMrLocked(h.rkey, pd_.get(), addr, len, need);
  };
  // A QP whose access flags do not allow the operation refuses it as an invalid request (as the
  // kernel's rxe); a region that does not allow it, as a remote access error.
  auto qpAllows = [&](uint32_t need) {
    if (qpAccess & need) return true;
    responderErrorFromLoop(h.seq, wire::Syndrome::kRemInvReq, verbs::AsyncEventType::kQpReqErr);
    return false;
  };
  switch (h.type) {
    case FrameType::kSend:
    case FrameType::kSendImm: {
      RecvWqe rwqe;
      if (!takeRecv(&rwqe)) {
        if (type_ == verbs::QpType::kUc) {
          dropMessageFromLoop();  // no receive posted: UC drops the message
          return Status::ok();
        }
        if (ackNeeded_) onInputDrained(*respConn_);
        sendNakFromLoop(h.seq, wire::Syndrome::kRnr);
        respNakPending_ = true;
        respSkip_ = true;
        return Status::ok();
      }
      uint64_t room = 0;
      std::vector<Segment> segs;
      bool bad = false;
      {
        std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
        for (const auto& sge : rwqe.sges) {
          room += sge.length;
          if (sge.length == 0) continue;
          auto entry = ctx_->findMrLocked(sge.lkey, pd_.get(), sge.addr, sge.length, verbs::access::kLocalWrite);
          if (!entry) {
            bad = true;
            break;
          }
          segs.push_back(Segment{reinterpret_cast<uint8_t*>(sge.addr), sge.length, std::move(entry)});
        }
      }
      if (bad || room < h.payloadLen) {
        // The receive cannot hold the message (a bad key or range, or too short): as the kernel's
        // rxe, a malformed receive — LOC_QP_OP_ERR here, REM_OP_ERR at the requester.
        pushRecvCompletion(rwqe, WcStatus::kLocQpOpErr, WcOpcode::kRecv, 0, std::nullopt, false);
        responderErrorFromLoop(h.seq, wire::Syndrome::kRemOp, verbs::AsyncEventType::kQpFatal);
        return Status::ok();
      }
      plan->segments = std::move(segs);
      curRecv_ = std::move(rwqe);
      return Status::ok();
    }
    case FrameType::kWrite:
    case FrameType::kWriteImm: {
      if (h.payloadLen > 0) {
        if (!qpAllows(verbs::access::kRemoteWrite)) return Status::ok();
        auto entry = checkRemote(h.remoteAddr, h.payloadLen, verbs::access::kRemoteWrite);
        if (!entry) {
          responderErrorFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
          return Status::ok();
        }
        plan->segments.push_back(Segment{reinterpret_cast<uint8_t*>(h.remoteAddr), h.payloadLen, std::move(entry)});
      }
      if (h.type == FrameType::kWriteImm) {
        RecvWqe rwqe;
        if (!takeRecv(&rwqe)) {
          plan->segments.clear();
          if (type_ == verbs::QpType::kUc) {
            dropMessageFromLoop();
            return Status::ok();
          }
          if (ackNeeded_) onInputDrained(*respConn_);
          sendNakFromLoop(h.seq, wire::Syndrome::kRnr);
          respNakPending_ = true;
          respSkip_ = true;
          return Status::ok();
        }
        curRecv_ = std::move(rwqe);
      }
      return Status::ok();
    }
    case FrameType::kReadReq:
      if (h.length > 0 && !qpAllows(verbs::access::kRemoteRead)) return Status::ok();
      if (h.length > 0 && !checkRemote(h.remoteAddr, h.length, verbs::access::kRemoteRead)) {
        responderErrorFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
      }
      return Status::ok();
    case FrameType::kCmpSwap:
    case FrameType::kFetchAdd:
      if (h.remoteAddr % 8 != 0) {
        responderErrorFromLoop(h.seq, wire::Syndrome::kRemInvReq, verbs::AsyncEventType::kQpReqErr);
      } else if (!qpAllows(verbs::access::kRemoteAtomic)) {
        return Status::ok();
      } else if (!checkRemote(h.remoteAddr, 8, verbs::access::kRemoteAtomic)) {
        responderErrorFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
      }
      return Status::ok();
    default:
      return Status(StatusCode::kProtocolError, "response frame on a responder connection");
  }
}

void SoftQp::onRequestFrame(const wire::FrameHeader& h, const PayloadPlan& plan) {
  using wire::FrameType;
  if (respSkip_) {
    respSkip_ = false;
    return;
  }
  switch (h.type) {
    case FrameType::kSend:
    case FrameType::kSendImm: {
      RecvWqe rwqe = std::move(*curRecv_);
      curRecv_.reset();
      if (plan.revoked) {
        pushRecvCompletion(rwqe, WcStatus::kLocQpOpErr, WcOpcode::kRecv, 0, std::nullopt, false);
        responderErrorFromLoop(h.seq, wire::Syndrome::kRemOp, verbs::AsyncEventType::kQpFatal);
        return;
      }
      std::optional<uint32_t> imm;
      if (h.type == FrameType::kSendImm) imm = h.aux;
      ++expectedSeq_;
      ackNeeded_ = true;
      pushRecvCompletion(rwqe, WcStatus::kSuccess, WcOpcode::kRecv, h.payloadLen, imm,
                         (h.flags & wire::kFlagSolicited) != 0);
      return;
    }
    case FrameType::kWrite:
    case FrameType::kWriteImm: {
      if (plan.revoked) {
        if (curRecv_) {
          giveBackRecv(std::move(*curRecv_));
          curRecv_.reset();
        }
        responderErrorFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
        return;
      }
      ++expectedSeq_;
      ackNeeded_ = true;
      if (h.type == FrameType::kWriteImm) {
        RecvWqe rwqe = std::move(*curRecv_);
        curRecv_.reset();
        const uint32_t byteLen = (h.flags & wire::kFlagPlaced) ? h.length : h.payloadLen;
        pushRecvCompletion(rwqe, WcStatus::kSuccess, WcOpcode::kRecvRdmaWithImm, byteLen, h.aux,
                           (h.flags & wire::kFlagSolicited) != 0);
      }
      return;
    }
    case FrameType::kReadReq: {
      OutFrame frame;
      wire::FrameHeader resp;
      resp.type = FrameType::kReadResp;
      resp.seq = h.seq;
      resp.qpn = attr_.destQpNum;
      resp.payloadLen = h.length;
      if (h.length > 0) {
        std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
        auto entry = ctx_->findMrLocked(h.rkey, pd_.get(), h.remoteAddr, h.length, verbs::access::kRemoteRead);
        if (entry) {
          frame.payload.push_back(Segment{reinterpret_cast<uint8_t*>(h.remoteAddr), h.length, std::move(entry)});
        } else {
          // Deregistered between the check and now: zeros, and the trailer says so.
          auto gone = std::make_shared<MrEntry>();
          gone->revoked = true;
          frame.payload.push_back(Segment{nullptr, h.length, std::move(gone)});
        }
      }
      frame.headerLen = static_cast<uint16_t>(wire::encodeHeader(resp, frame.header));
      frame.hasTrailer = true;
      frame.seq = h.seq;
      ++expectedSeq_;
      ackNeeded_ = false;  // the response acknowledges everything before it
      respConn_->send(std::move(frame));
      return;
    }
    case FrameType::kCmpSwap:
    case FrameType::kFetchAdd: {
      uint64_t original = 0;
      bool ok = false;
      {
        std::shared_lock<std::shared_mutex> memLock(ctx_->memMu());
        auto entry = ctx_->findMrLocked(h.rkey, pd_.get(), h.remoteAddr, 8, verbs::access::kRemoteAtomic);
        if (entry) {
          auto* target = reinterpret_cast<uint64_t*>(h.remoteAddr);
          DeviceAccess device;
          if (h.type == FrameType::kCmpSwap) {
            uint64_t expected = h.compareAdd;
            __atomic_compare_exchange_n(target, &expected, h.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
            original = expected;
          } else {
            original = __atomic_fetch_add(target, h.compareAdd, __ATOMIC_SEQ_CST);
          }
          ok = true;
        }
      }
      if (!ok) {
        responderErrorFromLoop(h.seq, wire::Syndrome::kRemAccess, verbs::AsyncEventType::kQpAccessErr);
        return;
      }
      wire::FrameHeader resp;
      resp.type = FrameType::kAtomicResp;
      resp.seq = h.seq;
      resp.qpn = attr_.destQpNum;
      resp.atomicResult = original;
      ++expectedSeq_;
      ackNeeded_ = false;
      respConn_->sendHeader(resp);
      return;
    }
    default:
      return;
  }
}

void SoftQp::onInputDrained(Conn& conn) {
  if (&conn != respConn_.get() || !ackNeeded_) return;
  wire::FrameHeader ack;
  ack.type = wire::FrameType::kAck;
  ack.seq = expectedSeq_ - 1;
  ack.qpn = attr_.destQpNum;
  ackNeeded_ = false;
  conn.sendHeader(ack);
}

}  // namespace ferry::soft
