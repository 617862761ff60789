// The protection domain of the soft provider: it registers memory and creates the QPs, SRQs and
// address handles of its context, each checked against the device's limits (soft.h).
#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>

#include "providers/soft/mcast.h"
#include "providers/soft/qp.h"
#include "providers/soft/soft.h"
#include "providers/soft/ud_qp.h"

namespace ferry::soft {

Result<std::shared_ptr<verbs::MrImpl>> SoftPd::registerMemory(void* addr, size_t length, uint32_t access) {
  return registerAt(addr, length, access, MemoryLocation{});
}

Result<std::shared_ptr<verbs::MrImpl>> SoftPd::registerDeviceMemory(void* addr, size_t length,
                                                                    uint32_t access, MemoryLocation where) {
  return registerAt(addr, length, access, where);
}

Result<std::shared_ptr<verbs::MrImpl>> SoftPd::registerAt(void* addr, size_t length, uint32_t access,
                                                          MemoryLocation where) {
  if (closed_ || ctx_->closed()) return closedError("register memory: the PD is closed");
  if (length > (uint64_t{1} << 46))
    return invalidArgument("register memory: length above the device's max_mr_size");
  auto entry = std::make_shared<MrEntry>();
  entry->addr = static_cast<uint8_t*>(addr);
  entry->length = length;
  entry->access = access;
  entry->pd = this;
  entry->location = where;
  // Device memory's IPC handle, asked of the driver before the memory lock (only where a same-host
  // table publishes it).
  const std::optional<cuda::IpcHandle> ipc =
      ctx_->share() ? shareableDevice(entry->addr, where) : std::nullopt;
  {
    std::unique_lock<std::shared_mutex> lock(ctx_->memMu());
    entry->key = ctx_->newKeyLocked();
    ctx_->addMrLocked(entry);
    if (auto* table = ctx_->share())
      table->publishMr(entry->key, entry->addr, entry->length, entry->access, this, where,
                       ipc ? &*ipc : nullptr);
  }
  auto mr = std::make_shared<SoftMr>(ctx_, std::move(entry));
  children_.add(mr);
  return std::shared_ptr<verbs::MrImpl>(mr);
}

Result<std::shared_ptr<verbs::QpImpl>> SoftPd::createQp(const verbs::QpInitImpl& init) {
  if (closed_ || ctx_->closed()) return closedError("create QP: the PD is closed");
  if (init.type != verbs::QpType::kRc && init.type != verbs::QpType::kUc && init.type != verbs::QpType::kUd) {
    return notSupported("create QP: the soft provider offers RC, UC and UD QPs");
  }
  const auto& c = init.cap;
  if (c.maxSendWr > static_cast<uint32_t>(kMaxWr) || c.maxRecvWr > static_cast<uint32_t>(kMaxWr) ||
      c.maxSendSge > static_cast<uint32_t>(kMaxSge) || c.maxRecvSge > static_cast<uint32_t>(kMaxSge) ||
      c.maxInlineData > kMaxInline) {
    return invalidArgument("create QP: capabilities above the device limits");
  }
  auto sendCq = std::dynamic_pointer_cast<SoftCq>(init.sendCq);
  auto recvCq = std::dynamic_pointer_cast<SoftCq>(init.recvCq);
  if (!sendCq || !recvCq) return invalidArgument("create QP: CQs of another provider");
  if (sendCq->closed() || recvCq->closed()) return closedError("create QP: a CQ is closed");
  if (sendCq->context() != ctx_.get() || recvCq->context() != ctx_.get()) {
    return invalidArgument("create QP: a CQ belongs to another context");
  }
  if (init.srq) {
    auto srq = std::dynamic_pointer_cast<SoftSrq>(init.srq);
    if (!srq) return invalidArgument("create QP: SRQ of another provider");
    if (srq->pd() != this) return invalidArgument("create QP: the SRQ belongs to another protection domain");
  }
  if (init.type == verbs::QpType::kUd) {
    auto ud = std::make_shared<SoftUdQp>(ctx_, shared_from_this(), init);
    FERRY_ASSIGN_OR_RETURN(uint32_t udQpn, ctx_->addUdQp(ud));
    ud->setQpn(udQpn);
    children_.add(ud);
    return std::shared_ptr<verbs::QpImpl>(ud);
  }
  auto qp = std::make_shared<SoftQp>(ctx_, shared_from_this(), init);
  qp->bindParts();
  FERRY_ASSIGN_OR_RETURN(uint32_t qpn, ctx_->addQp(qp));
  qp->setQpn(qpn);
  children_.add(qp);
  return std::shared_ptr<verbs::QpImpl>(qp);
}

Result<std::shared_ptr<verbs::SrqImpl>> SoftPd::createSrq(const verbs::SrqInit& init) {
  if (closed_ || ctx_->closed()) return closedError("create SRQ: the PD is closed");
  if (init.maxWr < 1 || init.maxWr > static_cast<uint32_t>(kMaxWr) ||
      init.maxSge > static_cast<uint32_t>(kMaxSge)) {
    return invalidArgument("create SRQ: capabilities outside the device limits");
  }
  if (init.srqLimit > init.maxWr) return invalidArgument("create SRQ: srq_limit above max_wr");
  auto srq = std::make_shared<SoftSrq>(ctx_, this, init);
  if (init.srqLimit > 0) (void)srq->armLimit(init.srqLimit);
  children_.add(srq);
  return std::shared_ptr<verbs::SrqImpl>(srq);
}

Result<std::shared_ptr<verbs::AhImpl>> SoftPd::createAh(const verbs::AhAttr& attr) {
  if (closed_ || ctx_->closed()) return closedError("create AH: the PD is closed");
  in_addr_t ip = 0;
  uint16_t port = 0;
  const bool multicast = attr.isGlobal && mcast::isMulticastGid(attr.dgid);
  if (attr.portNum != 1) return invalidArgument("create AH: port_num must be 1");
  if (!attr.isGlobal) {
    // A path without a GRH is routed by LID. A software port's LID is 0 and it is its own subnet
    // manager (sm_lid 0), so the one LID it can address is its own: a send through such an AH
    // reaches a QP of this device, and arrives without a GRH.
    if (attr.dlid != 0) {
      return invalidArgument(
          "create AH: LID " + std::to_string(attr.dlid) +
          " is not reachable: a software device routes by GID (is_global, dgid); the only LID it "
          "addresses is its own (0)");
    }
    (void)parseSoftGid(ctx_->gid(), &ip, &port);
  } else if (!multicast && !parseSoftGid(attr.dgid, &ip, &port)) {
    return invalidArgument(
        "create AH: the destination must be a GID of a software device or a multicast group (is_global, "
        "dgid)");
  }
  auto ah = std::make_shared<SoftAh>(this, attr, ip, port, multicast);
  children_.add(ah);
  std::lock_guard<std::mutex> lock(ahMu_);
  for (auto it = ahs_.begin(); it != ahs_.end();) it = it->second.expired() ? ahs_.erase(it) : std::next(it);
  ahs_[ah.get()] = ah;
  return std::shared_ptr<verbs::AhImpl>(ah);
}

std::shared_ptr<SoftAh> SoftPd::findAh(const void* id) {
  std::lock_guard<std::mutex> lock(ahMu_);
  auto it = ahs_.find(id);
  if (it == ahs_.end()) return nullptr;
  auto ah = it->second.lock();
  return ah && !ah->closed() ? ah : nullptr;
}

void SoftPd::close() {
  if (closed_.exchange(true)) return;
  children_.closeAll();
}

}  // namespace ferry::soft
