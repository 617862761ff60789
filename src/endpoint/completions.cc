// Taking the completion queue: by the worker thread (woken by the completion channel) or by
// waiters that poll, with the CQ left unarmed while they do; send completions finishing their
// operations in order; a failed completion failing the endpoint; the liveness probe that finds a
// dead peer while receives wait. Receive completions go to receives.cc.
#include <algorithm>

#include "common/clock.h"
#include "endpoint/endpoint_internal.h"
#include "endpoint/endpoint_qp.h"
#include "ferry/common/config.h"

namespace ferry::endpoint {
namespace {

namespace v = ferry::verbs;

}  // namespace

Status workCompletionStatus(const v::WorkCompletion& wc, size_t qpIndex, const Status& failure,
                            bool peerGone) {
  std::string what = std::string(v::wcStatusName(wc.status));
  std::string text;
  switch (wc.status) {
    case v::WcStatus::kRetryExcErr:
      text = "the peer is gone or unreachable (" + what + " on queue pair " + std::to_string(qpIndex) + ")";
      break;
    case v::WcStatus::kWrFlushErr:
      text = "work flushed (" + what + ")" + (failure.isOk() ? std::string() : ": " + failure.message());
      break;
    case v::WcStatus::kRemAccessErr:
      text = "the peer refused the access (" + what + " on queue pair " + std::to_string(qpIndex) +
             "): its region was unregistered or its metadata is stale";
      break;
    default: text = "work request failed: " + what + " on queue pair " + std::to_string(qpIndex);
  }
  bool gone =
      peerGone && (wc.status == v::WcStatus::kRetryExcErr ||
                   (wc.status == v::WcStatus::kWrFlushErr && failure.code() == StatusCode::kPeerGone));
  return Status(gone ? StatusCode::kPeerGone : StatusCode::kWorkCompletionError, text,
                static_cast<int>(wc.status));
}

// ---------------------------------------------------------------------------------------------
// Completions
bool EndpointImpl::drainCompletionsLocked(Drain mode) {
  v::WorkCompletion wcs[64];
  bool armed = false;
  // A shutdown takes what is there in a bounded number of rounds: a peer that keeps sending
  // cannot hold it.
  int rounds = mode == Drain::kSuccessesBeforeShutdown ? 64 : -1;
  for (;;) {
    auto n = cq_.poll(wcs);
    if (!n.isOk()) {
      if (mode == Drain::kSuccessesBeforeShutdown) return true;  // the shutdown's status is the one
      failLocked(Status(n.status().code(), "polling the completion queue failed: " + n.status().message(),
                        n.status().cause()));
      return true;
    }
    for (int i = 0; i < *n; ++i) {
      if (mode == Drain::kSuccessesBeforeShutdown && wcs[i].status != v::WcStatus::kSuccess) continue;
      handleCompletionLocked(wcs[i]);
      if (state_ != State::kConnected && mode == Drain::kSuccessesBeforeShutdown) return false;
    }
    if (state_ == State::kShutdown) return false;
    if (rounds > 0 && --rounds == 0) return true;
    // A full batch: there may be more. A short one emptied the queue (no further, empty poll: on a
    // software device that one would run the device's progress loop for nothing).
    if (*n == static_cast<int>(std::size(wcs))) continue;
    if (mode != Drain::kTakeAndArm || armed) return true;
    // Arm, then poll once more: a completion that came in between is not missed.
    Status st = cq_.reqNotify();
    if (!st.isOk()) {
      failLocked(st);
      return true;
    }
    armed = true;
  }
}

void EndpointImpl::progressOnce() {
  // The worker (or another waiter) holds the lock: it is taking the completions already.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || state_ == State::kShutdown) return;
  // A CQ the worker left unarmed is armed again as soon as someone needs the worker.
  if (unarmed_.load(std::memory_order_relaxed) && watchers_.load(std::memory_order_acquire) > 0) {
    rearmLocked();
    return;
  }
  // An armed CQ stays armed for the worker: a completion taken here may still wake it once, to
  // find nothing.
  if (!drainCompletionsLocked(Drain::kTake)) return;
  pumpLocked();
  updateProbeLocked();  // completions only satisfy waits: a probe can become unneeded, never needed
}

namespace {
int64_t waitLeaseNs() {
  static const int64_t ns = config::waitLeaseUs() * 1000;
  return ns;
}
}  // namespace

// Waiters that poll take the completions themselves (progressOnce()). An armed CQ would still wake
// the worker for each of them, and on a machine of few cores the woken worker takes a core from
// the waiter. So while waiters poll, and for a lease after one of them got its operation (the
// next operation's waiter is likely to poll too), the worker leaves the CQ unarmed. Anyone who
// needs the worker ends that at once: a waiter about to sleep, a callback waiting for an
// operation (watchBegins()). Otherwise the worker looks again when the lease ends.
void EndpointImpl::pollBegins() { pollers_.fetch_add(1, std::memory_order_acq_rel); }

void EndpointImpl::pollEnds(bool operationDone) {
  if (operationDone && waitLeaseNs() > 0) {
    leaseUntilNs_.store(steadyNs() + waitLeaseNs(), std::memory_order_release);
  }
  pollers_.fetch_sub(1, std::memory_order_acq_rel);
}

void EndpointImpl::watchBegins(bool mayBlock) {
  watchers_.fetch_add(1, std::memory_order_acq_rel);
  // A caller that may hold locks of its own (onDone(), even from a callback running under mu_)
  // leaves the arming to the threads that take mu_ anyway: the pollers' next progressOnce(), or
  // the worker at the lease's end at the latest (unarmedDueNs()).
  if (!mayBlock || !unarmed_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  rearmLocked();
}

void EndpointImpl::watchEnds() { watchers_.fetch_sub(1, std::memory_order_acq_rel); }

void EndpointImpl::rearmLocked() {
  if (state_ == State::kShutdown || !unarmed_.load(std::memory_order_relaxed)) return;
  if (!drainCompletionsLocked(Drain::kTakeAndArm)) return;
  unarmed_.store(false, std::memory_order_release);
  pumpLocked();
  updateProbeLocked();
}

bool EndpointImpl::pollersAttend(int64_t nowNs) const {
  if (waitLeaseNs() == 0 || watchers_.load(std::memory_order_acquire) > 0) return false;
  return pollers_.load(std::memory_order_acquire) > 0 ||
         nowNs < leaseUntilNs_.load(std::memory_order_acquire);
}

std::optional<int64_t> EndpointImpl::unarmedDueNs(int64_t nowNs) const {
  if (!unarmed_.load(std::memory_order_acquire)) return std::nullopt;
  if (!pollersAttend(nowNs)) return nowNs;
  // While a waiter polls, its lease (set when it stops) is not known yet: look again a lease on.
  int64_t due = leaseUntilNs_.load(std::memory_order_acquire);
  if (pollers_.load(std::memory_order_acquire) > 0) due = std::max(due, nowNs + waitLeaseNs());
  return due;
}

void EndpointImpl::progressFromWorker() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kShutdown) {
    unarmed_.store(false, std::memory_order_release);  // nothing left for the worker to look at
    return;
  }
  ++workerWakeups_;
  // Consume the channel's events; the CQ is polled below either way.
  while (channel_.getEvent(0).isOk()) {
  }
  // Leave the CQ unarmed while pollers attend to it; the worker looks again when they stop
  // (unarmedDueNs()).
  const bool leave = pollersAttend(steadyNs());
  const bool running = drainCompletionsLocked(leave ? Drain::kTake : Drain::kTakeAndArm);
  unarmed_.store(running && leave, std::memory_order_release);
  if (!running) return;
  pumpLocked();
  updateProbeLocked();
}

void EndpointImpl::handleCompletionLocked(const v::WorkCompletion& wc) {
  EndpointQp* qp = nullptr;
  for (auto& candidate : qps_) {
    if (candidate->qpNum == wc.qpNum) qp = candidate.get();
  }
  if (qp == nullptr) return;
  if (wc.wrId & kRecvWrFlag) {
    handleRecvCompletionLocked(*qp, wc);
  } else {
    handleSendCompletionLocked(*qp, wc);
  }
}

void EndpointImpl::handleSendCompletionLocked(EndpointQp& qp, const v::WorkCompletion& wc) {
  Status error;
  if (wc.status != v::WcStatus::kSuccess) {
    error = workCompletionStatus(wc, qp.index, failure_, options_.transportFailureIsPeerGone);
  } else {
    peerSeen_ = true;
  }
  // Work requests complete in order: this completion covers every earlier (unsignaled) one.
  while (!qp.inflight.empty() && qp.inflight.front().seq <= wc.wrId) {
    EndpointQp::Record rec = std::move(qp.inflight.front());
    qp.inflight.pop_front();
    --qp.outstanding;
    if (!rec.op) continue;
    --rec.op->wrsInFlight;
    if (rec.seq == wc.wrId && !error.isOk() && rec.op->firstError.isOk()) rec.op->firstError = error;
    finishIfDoneLocked(rec.op);
  }
  if (!error.isOk()) failLocked(error);
}

void EndpointImpl::updateProbeLocked() {
  wantsProbe_.store(
      state_ == State::kConnected && peerSeen_ && (!recvWaiting_.empty() || !immWaiting_.empty()),
      std::memory_order_relaxed);
}

void EndpointImpl::probeFromWorker() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kConnected) return;
  // A zero-length WRITE on each idle queue pair: it touches no memory, and fails (RETRY_EXC_ERR)
  // when the peer is gone, which fails the receives waiting for it.
  for (auto& qpPtr : qps_) {
    EndpointQp& qp = *qpPtr;
    if (qp.outstanding != 0) continue;
    v::SendWr wr;
    wr.wrId = qp.nextSeq;
    wr.opcode = v::WrOpcode::kRdmaWrite;
    qp.append(wr, {});
    qp.inflight.push_back({qp.nextSeq++, nullptr});
    ++qp.outstanding;
  }
  flushLocked();
}

}  // namespace ferry::endpoint
