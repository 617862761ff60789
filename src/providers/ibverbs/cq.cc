// Completion channels and queues of the ibverbs provider.
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "common/log.h"
#include "providers/ibverbs/ibverbs.h"
#include "providers/ibverbs/wait.h"

namespace ferry::ibverbs {

IbvCompChannel::IbvCompChannel(std::shared_ptr<IbvContext> ctx, ibv_comp_channel* channel)
    : ctx_(std::move(ctx)), channel_(channel), fd_(channel->fd) {
  if (int err = setNonBlocking(fd_); err != 0) {
    FERRY_LOG(kWarn, "%s: cannot make a completion channel non-blocking: %s", ctx_->info().name.c_str(),
              std::strerror(err));
  }
}

IbvCompChannel::~IbvCompChannel() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  closed_ = true;
  tryDestroyLocked();
  if (channel_ != nullptr) {
    FERRY_LOG(kWarn, "%s: a completion channel could not be destroyed", ctx_->info().name.c_str());
  }
}

void IbvCompChannel::close() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  closed_ = true;
  tryDestroyLocked();
}

void IbvCompChannel::tryDestroyLocked() {
  if (channel_ == nullptr) return;
  const int rc = ctx_->destroyWhileOpen([&] { return ctx_->api().destroyCompChannel(channel_); });
  // EBUSY: a CQ still uses it; the last CQ to go releases the channel.
  if (rc != 0 && errnoOf(rc) == EBUSY) return;
  if (rc != 0) {
    FERRY_LOG(kWarn, "%s: ibv_destroy_comp_channel failed: %s", ctx_->info().name.c_str(),
              std::strerror(errnoOf(rc)));
  }
  channel_ = nullptr;
}

Result<verbs::CqEvent> IbvCompChannel::getEvent(int timeoutMs) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (closed_) return closedError("get CQ event: the completion channel is closed");
      ibv_cq* cq = nullptr;
      void* cqContext = nullptr;
      while (ctx_->api().getCqEvent(channel_, &cq, &cqContext) == 0) {
        // Acknowledged at once, so that destroying the CQ never waits for this event.
        ctx_->api().ackCqEvents(cq, 1);
        if (auto owner = ctx_->findCq(cq))
          return verbs::CqEvent{.cqId = owner->id(), .cqContext = owner->userContext()};
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return verbsError("ibv_get_cq_event", errnoOf(-1));
      }
    }
    const int left = msLeft(deadline);
    if (left == 0) return Status(StatusCode::kTimedOut, "no CQ event within the timeout", ETIMEDOUT);
    waitReadable(fd_, left);
  }
}

IbvCq::~IbvCq() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  closed_ = true;
  tryDestroyLocked();
  if (cq_ != nullptr) FERRY_LOG(kWarn, "%s: a CQ could not be destroyed", ctx_->info().name.c_str());
}

void IbvCq::close() {
  std::shared_ptr<IbvCompChannel> channel;
  std::unique_lock<std::shared_mutex> lock(mu_);
  closed_ = true;
  tryDestroyLocked();
  if (cq_ == nullptr) channel = std::move(channel_);
  lock.unlock();
  // Releasing the channel may destroy it (its last CQ is gone): outside this CQ's lock.
  channel.reset();
}

void IbvCq::tryDestroyLocked() {
  if (cq_ == nullptr) return;
  const int rc = ctx_->destroyWhileOpen([&] { return ctx_->api().destroyCq(cq_); });
  // EBUSY: a QP still uses it; the QP releases the CQ when it is destroyed.
  if (rc != 0 && errnoOf(rc) == EBUSY) return;
  if (rc != 0) {
    FERRY_LOG(kWarn, "%s: ibv_destroy_cq failed: %s", ctx_->info().name.c_str(), std::strerror(errnoOf(rc)));
  }
  ctx_->removeCq(cq_);
  cq_ = nullptr;
}

Result<int> IbvCq::poll(std::span<verbs::WorkCompletion> out) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("poll CQ: the CQ is closed");
  if (overflowed_) return Status(StatusCode::kIoError, "poll CQ: the CQ overflowed", EOVERFLOW);
  constexpr int kBatch = 32;
  ibv_wc wcs[kBatch];
  size_t done = 0;
  while (done < out.size()) {
    const int want = static_cast<int>(std::min<size_t>(out.size() - done, kBatch));
    const int n = ibv_poll_cq(cq_, want, wcs);
    if (n < 0) return verbsError("ibv_poll_cq", errnoOf(n));
    for (int i = 0; i < n; ++i) {
      const ibv_wc& w = wcs[i];
      verbs::WorkCompletion& wc = out[done + static_cast<size_t>(i)];
      wc.wrId = w.wr_id;
      wc.status = static_cast<verbs::WcStatus>(w.status);
      wc.opcode = static_cast<verbs::WcOpcode>(w.opcode);
      wc.vendorErr = w.vendor_err;
      wc.byteLen = w.byte_len;
      // Carried as the sender's 32 bits, unchanged (both sides read the same bytes).
      wc.immData = w.imm_data;
      wc.qpNum = w.qp_num;
      wc.srcQp = w.src_qp;
      wc.wcFlags = w.wc_flags;
      wc.pkeyIndex = w.pkey_index;
      wc.slid = w.slid;
      wc.sl = w.sl;
      wc.dlidPathBits = w.dlid_path_bits;
    }
    done += static_cast<size_t>(n);
    if (n < want) break;
  }
  return static_cast<int>(done);
}

Status IbvCq::reqNotify(bool solicitedOnly) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("request notification: the CQ is closed");
  if (int rc = ibv_req_notify_cq(cq_, solicitedOnly ? 1 : 0); rc != 0) {
    return verbsError("ibv_req_notify_cq", errnoOf(rc));
  }
  return Status::ok();
}

Status IbvCq::resize(int cqe) {
  // Exclusive: libibverbs rebuilds the queue, which must not be polled meanwhile.
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("resize CQ: the CQ is closed");
  if (int rc = ctx_->api().resizeCq(cq_, cqe); rc != 0) {
    return verbsError("ibv_resize_cq(" + std::to_string(cqe) + ")", errnoOf(rc));
  }
  return Status::ok();
}

int IbvCq::cqe() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return closed_ || cq_ == nullptr ? 0 : cq_->cqe;
}

}  // namespace ferry::ibverbs
