// Memory regions of the soft provider: an entry in the context's key table (and in the same-host
// share table); reregistration and deregistration wait for every access in progress.
#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>

#include "providers/soft/soft.h"

namespace ferry::soft {

void* SoftMr::addr() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entry_ ? entry_->addr : nullptr;
}
size_t SoftMr::length() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entry_ ? entry_->length : 0;
}
uint32_t SoftMr::lkey() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entry_ ? entry_->key : 0;
}
uint32_t SoftMr::rkey() const { return lkey(); }
uint32_t SoftMr::access() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entry_ ? entry_->access : 0;
}

MemoryLocation SoftMr::location() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entry_ ? entry_->location : MemoryLocation{};
}

Status SoftMr::reregister(uint32_t flags, const std::shared_ptr<verbs::PdImpl>& pd, void* addr, size_t length,
                          uint32_t access) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!entry_) return closedError("reregister: the MR is closed");
  auto next = std::make_shared<MrEntry>(*entry_);
  next->revoked = false;
  if (flags & verbs::rereg::kChangePd) {
    auto softPd = std::dynamic_pointer_cast<SoftPd>(pd);
    if (!softPd || softPd->ctx() != ctx_) return invalidArgument("reregister: PD of another context");
    if (softPd->closed()) return closedError("reregister: the PD is closed");
    next->pd = softPd.get();
  }
  if (flags & verbs::rereg::kChangeTranslation) {
    next->addr = static_cast<uint8_t*>(addr);
    next->length = length;
  }
  if (flags & verbs::rereg::kChangeAccess) next->access = access;
  const uint32_t oldKey = entry_->key;
  const std::optional<cuda::IpcHandle> ipc =
      ctx_->share() ? shareableDevice(next->addr, next->location) : std::nullopt;
  {
    std::unique_lock<std::shared_mutex> memLock(ctx_->memMu());
    entry_->revoked = true;
    ctx_->removeMrLocked(oldKey);
    if (auto* table = ctx_->share()) table->withdrawMr(oldKey);
    next->key = ctx_->newKeyLocked();
    ctx_->addMrLocked(next);
    if (auto* table = ctx_->share()) {
      table->publishMr(next->key, next->addr, next->length, next->access, next->pd, next->location,
                       ipc ? &*ipc : nullptr);
    }
    entry_ = std::move(next);
  }
  // Returns once no same-host peer is still copying under the old key.
  if (auto* table = ctx_->share()) table->waitForAccessors(oldKey);
  return Status::ok();
}

void SoftMr::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!entry_) return;
  {
    // Waits for any access in progress; none starts after this.
    std::unique_lock<std::shared_mutex> memLock(ctx_->memMu());
    entry_->revoked = true;
    ctx_->removeMrLocked(entry_->key);
    if (auto* table = ctx_->share()) table->withdrawMr(entry_->key);
  }
  // Nor does any same-host peer's copy: this waits for one in progress to end.
  if (auto* table = ctx_->share()) table->waitForAccessors(entry_->key);
  entry_.reset();
}

}  // namespace ferry::soft
