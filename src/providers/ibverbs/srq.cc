// Shared receive queues of the ibverbs provider.
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "common/log.h"
#include "providers/ibverbs/ibverbs.h"

namespace ferry::ibverbs {

IbvSrq::~IbvSrq() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  closed_ = true;
  tryDestroyLocked();
  if (srq_ != nullptr) FERRY_LOG(kWarn, "%s: an SRQ could not be destroyed", pd_->ctx()->info().name.c_str());
}

void IbvSrq::close() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  closed_ = true;
  tryDestroyLocked();
}

void IbvSrq::tryDestroyLocked() {
  if (srq_ == nullptr) return;
  const auto& ctx = pd_->ctx();
  const int rc = ctx->destroyWhileOpen([&] { return ctx->api().destroySrq(srq_); });
  // EBUSY: a QP still uses it; the QP releases the SRQ when it is destroyed.
  if (rc != 0 && errnoOf(rc) == EBUSY) return;
  if (rc != 0) {
    FERRY_LOG(kWarn, "%s: ibv_destroy_srq failed: %s", ctx->info().name.c_str(), std::strerror(errnoOf(rc)));
  }
  ctx->removeSrq(srq_);
  srq_ = nullptr;
}

Status IbvSrq::postRecv(std::span<const verbs::RecvWr> wrs, size_t* badIndex) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) {
    if (badIndex) *badIndex = 0;
    return closedError("post SRQ recv: the SRQ is closed");
  }
  if (wrs.empty()) return Status::ok();
  ibv_recv_wr* chain = buildRecvChain(wrs);
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_srq_recv(srq_, chain, &bad); rc != 0) {
    if (badIndex) *badIndex = bad != nullptr ? static_cast<size_t>(bad - chain) : 0;
    return verbsError("ibv_post_srq_recv", errnoOf(rc));
  }
  return Status::ok();
}

Status IbvSrq::armLimit(uint32_t limit) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("arm SRQ limit: the SRQ is closed");
  ibv_srq_attr attr{};
  attr.srq_limit = limit;
  if (int rc = pd_->ctx()->api().modifySrq(srq_, &attr, IBV_SRQ_LIMIT); rc != 0) {
    return verbsError("ibv_modify_srq(srq_limit " + std::to_string(limit) + ")", errnoOf(rc));
  }
  return Status::ok();
}

Result<verbs::SrqInit> IbvSrq::query() {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("query SRQ: the SRQ is closed");
  ibv_srq_attr attr{};
  if (int rc = pd_->ctx()->api().querySrq(srq_, &attr); rc != 0)
    return verbsError("ibv_query_srq", errnoOf(rc));
  return verbs::SrqInit{.maxWr = attr.max_wr, .maxSge = attr.max_sge, .srqLimit = attr.srq_limit};
}

}  // namespace ferry::ibverbs
