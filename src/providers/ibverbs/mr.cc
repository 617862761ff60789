// Memory regions of the ibverbs provider.
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "common/log.h"
#include "providers/ibverbs/ibverbs.h"

namespace ferry::ibverbs {

void* IbvMr::addr() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mr_ ? addr_ : nullptr;
}
size_t IbvMr::length() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mr_ ? length_ : 0;
}
uint32_t IbvMr::lkey() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mr_ ? mr_->lkey : 0;
}
uint32_t IbvMr::rkey() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mr_ ? mr_->rkey : 0;
}
uint32_t IbvMr::access() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mr_ ? access_ : 0;
}

Status IbvMr::reregister(uint32_t flags, const std::shared_ptr<verbs::PdImpl>& pd, void* addr, size_t length,
                         uint32_t access) {
  std::lock_guard<std::mutex> lock(mu_);
  if (mr_ == nullptr) return closedError("reregister: the MR is closed");
  std::shared_ptr<IbvPd> target = pd_;
  if (flags & verbs::rereg::kChangePd) {
    target = std::dynamic_pointer_cast<IbvPd>(pd);
    if (!target || target->ctx() != pd_->ctx()) return invalidArgument("reregister: PD of another context");
    if (target->closed()) return closedError("reregister: the PD is closed");
  }
  void* newAddr = (flags & verbs::rereg::kChangeTranslation) ? addr : addr_;
  const size_t newLength = (flags & verbs::rereg::kChangeTranslation) ? length : length_;
  const uint32_t newAccess = (flags & verbs::rereg::kChangeAccess) ? access : access_;
  // ferry's re-registration issues new keys and revokes the old ones from the next remote access
  // on. ibv_rereg_mr may keep the keys (rxe does) or refuse a new translation (rxe: EOPNOTSUPP), so
  // the region is registered anew and the old registration released; if the new one is refused,
  // the old one stays as it was.
  Result<ibv_mr*> registered = where_.onDevice() ? target->regDevice(newAddr, newLength, newAccess, where_)
                                                 : target->reg(newAddr, newLength, newAccess);
  FERRY_ASSIGN_OR_RETURN(ibv_mr * fresh, std::move(registered));
  const auto& ctx = pd_->ctx();
  if (int rc = ctx->destroyWhileOpen([&] { return ctx->api().deregMr(mr_); }); rc != 0) {
    FERRY_LOG(kWarn, "%s: ibv_dereg_mr failed: %s", ctx->info().name.c_str(), std::strerror(errnoOf(rc)));
  }
  mr_ = fresh;
  addr_ = newAddr;
  length_ = newLength;
  access_ = newAccess;
  if (target != pd_) {
    target->adopt(shared_from_this());
    pd_ = std::move(target);
  }
  return Status::ok();
}

void IbvMr::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (mr_ == nullptr) return;
  const auto& ctx = pd_->ctx();
  if (int rc = ctx->destroyWhileOpen([&] { return ctx->api().deregMr(mr_); }); rc != 0) {
    FERRY_LOG(kWarn, "%s: ibv_dereg_mr failed: %s", ctx->info().name.c_str(), std::strerror(errnoOf(rc)));
  }
  mr_ = nullptr;
}

}  // namespace ferry::ibverbs
