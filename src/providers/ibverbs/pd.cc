// Protection domains and address handles of the ibverbs provider.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "common/cuda_driver.h"
#include "common/log.h"
#include "providers/ibverbs/ibverbs.h"

namespace ferry::ibverbs {

IbvPd::~IbvPd() { close(); }

void IbvPd::close() {
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  // QPs first (they use SRQs, MRs and AHs), newest first within each kind.
  children_.closeAll();
  std::unique_lock<std::shared_mutex> lock(mu_);
  destroy();
}

void IbvPd::destroy() {
  if (pd_ == nullptr) return;
  const int rc = ctx_->destroyWhileOpen([&] { return ctx_->api().deallocPd(pd_); });
  if (rc != 0) {
    FERRY_LOG(kWarn, "%s: ibv_dealloc_pd failed: %s", ctx_->info().name.c_str(), std::strerror(errnoOf(rc)));
  }
  pd_ = nullptr;
}

Result<ibv_mr*> IbvPd::reg(void* addr, size_t length, uint32_t access) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("register memory: the PD is closed");
  ibv_mr* mr = ctx_->api().regMr(pd_, addr, length, static_cast<int>(access));
  if (mr == nullptr) return verbsError("ibv_reg_mr(" + std::to_string(length) + " bytes)", errnoOf(-1));
  return mr;
}

Result<std::shared_ptr<verbs::MrImpl>> IbvPd::registerMemory(void* addr, size_t length, uint32_t access) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("register memory: the PD is closed");
  ibv_mr* raw = ctx_->api().regMr(pd_, addr, length, static_cast<int>(access));
  if (raw == nullptr) return verbsError("ibv_reg_mr(" + std::to_string(length) + " bytes)", errnoOf(-1));
  auto mr = std::make_shared<IbvMr>(shared_from_this(), raw, addr, length, access);
  children_.add(mr);
  return std::shared_ptr<verbs::MrImpl>(mr);
}

Result<ibv_mr*> IbvPd::regDevice(void* addr, size_t length, uint32_t access, MemoryLocation where) {
  const std::string what = "register " + std::to_string(length) + " bytes of " + where.toString() + ": ";
  if (!ctx_->dmaBufRefusal().empty() && !ctx_->peerMemory().empty()) {
    // The peer memory module resolves the device pointer when ibv_reg_mr pins it.
    Result<ibv_mr*> mr = reg(addr, length, access);
    if (mr.isOk()) return mr;
    return Status(mr.status().code(), what + ctx_->dmaBufRefusal() + ", and through " + ctx_->peerMemory() +
                                          ": " + mr.status().message());
  }
  if (!ctx_->dmaBufRefusal().empty()) {
    return notSupported(
        what + ctx_->dmaBufRefusal() +
        " and no peer memory module (nvidia_peermem) is loaded, and GPUDirect RDMA needs one of them");
  }
  Result<cuda::DmaBuf> exported = cuda::exportDmaBuf(addr, length, where);
  if (!exported.isOk()) return Status(exported.status().code(), what + exported.status().message());
  ibv_mr* mr = nullptr;
  int err = 0;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (closed_) {
      ::close(exported->fd);
      return closedError("register memory: the PD is closed");
    }
    mr = ctx_->api().regDmabufMr(pd_, exported->offset, length, reinterpret_cast<uint64_t>(addr),
                                 exported->fd, static_cast<int>(access));
    err = errnoOf(-1);
  }
  ::close(exported->fd);  // the region holds the dma-buf now
  if (mr != nullptr) return mr;
  if (err == EOPNOTSUPP || err == EPROTONOSUPPORT || err == ENOSYS) {
    return notSupported(what + ctx_->info().name + " does not register dma-bufs (ibv_reg_dmabuf_mr: " +
                        std::strerror(err) + "), so it cannot read or write device memory in place");
  }
  return verbsError(what + "ibv_reg_dmabuf_mr", err);
}

Result<std::shared_ptr<verbs::MrImpl>> IbvPd::registerDeviceMemory(void* addr, size_t length, uint32_t access,
                                                                   MemoryLocation where) {
  FERRY_ASSIGN_OR_RETURN(ibv_mr * raw, regDevice(addr, length, access, where));
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) {  // closed while the dma-buf registered: the region goes with it
    (void)ctx_->api().deregMr(raw);
    return closedError("register memory: the PD is closed");
  }
  auto mr = std::make_shared<IbvMr>(shared_from_this(), raw, addr, length, access, where);
  children_.add(mr);
  return std::shared_ptr<verbs::MrImpl>(mr);
}

Result<std::shared_ptr<verbs::SrqImpl>> IbvPd::createSrq(const verbs::SrqInit& init) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("create SRQ: the PD is closed");
  ibv_srq_init_attr attr{};
  attr.attr.max_wr = init.maxWr;
  attr.attr.max_sge = init.maxSge;
  attr.attr.srq_limit = init.srqLimit;
  ibv_srq* raw = ctx_->api().createSrq(pd_, &attr);
  if (raw == nullptr) return verbsError("ibv_create_srq", errnoOf(-1));
  auto srq = std::make_shared<IbvSrq>(shared_from_this(), raw, attr.attr.max_sge);
  ctx_->addSrq(raw, static_cast<const verbs::SrqImpl*>(srq.get()));
  children_.add(srq);
  // ibv_create_srq ignores srq_limit on many devices: arm it explicitly.
  if (init.srqLimit > 0) {
    if (Status armed = srq->armLimit(init.srqLimit); !armed.isOk()) {
      srq->close();
      return armed;
    }
  }
  return std::shared_ptr<verbs::SrqImpl>(srq);
}

Result<std::shared_ptr<verbs::AhImpl>> IbvPd::createAh(const verbs::AhAttr& attr) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (closed_) return closedError("create AH: the PD is closed");
  ibv_ah_attr raw = toIbvAh(attr);
  ibv_ah* created = ctx_->api().createAh(pd_, &raw);
  if (created == nullptr) return verbsError("ibv_create_ah(" + attr.dgid.toString() + ")", errnoOf(-1));
  auto ah = std::make_shared<IbvAh>(shared_from_this(), created, attr);
  children_.add(ah);
  std::lock_guard<std::mutex> ahLock(ahMu_);
  for (auto it = ahs_.begin(); it != ahs_.end();) it = it->second.expired() ? ahs_.erase(it) : std::next(it);
  ahs_[static_cast<const verbs::AhImpl*>(ah.get())] = ah;
  return std::shared_ptr<verbs::AhImpl>(ah);
}

void IbvPd::adopt(const std::shared_ptr<IbvMr>& mr) {
  children_.add(std::static_pointer_cast<verbs::MrImpl>(mr));
}

std::shared_ptr<IbvAh> IbvPd::findAh(const void* id) {
  std::lock_guard<std::mutex> lock(ahMu_);
  auto it = ahs_.find(id);
  return it == ahs_.end() ? nullptr : it->second.lock();
}

ibv_ah_attr toIbvAh(const verbs::AhAttr& attr) {
  ibv_ah_attr raw{};
  std::memcpy(raw.grh.dgid.raw, attr.dgid.raw.data(), sizeof raw.grh.dgid.raw);
  raw.grh.flow_label = attr.flowLabel;
  raw.grh.sgid_index = attr.sgidIndex;
  raw.grh.hop_limit = attr.hopLimit;
  raw.grh.traffic_class = attr.trafficClass;
  raw.dlid = attr.dlid;
  raw.sl = attr.sl;
  raw.src_path_bits = attr.srcPathBits;
  raw.static_rate = attr.staticRate;
  raw.is_global = attr.isGlobal ? 1 : 0;
  raw.port_num = attr.portNum;
  return raw;
}

verbs::AhAttr fromIbvAh(const ibv_ah_attr& raw) {
  verbs::AhAttr attr;
  std::memcpy(attr.dgid.raw.data(), raw.grh.dgid.raw, attr.dgid.raw.size());
  attr.flowLabel = raw.grh.flow_label;
  attr.sgidIndex = raw.grh.sgid_index;
  attr.hopLimit = raw.grh.hop_limit;
  attr.trafficClass = raw.grh.traffic_class;
  attr.dlid = raw.dlid;
  attr.sl = raw.sl;
  attr.srcPathBits = raw.src_path_bits;
  attr.staticRate = raw.static_rate;
  attr.isGlobal = raw.is_global != 0;
  attr.portNum = raw.port_num;
  return attr;
}

// ---------------------------------------------------------------------------------------------
// Address handles.

void IbvAh::close() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (ah_ == nullptr) return;
  const auto& ctx = pd_->ctx();
  if (int rc = ctx->destroyWhileOpen([&] { return ctx->api().destroyAh(ah_); }); rc != 0) {
    FERRY_LOG(kWarn, "%s: ibv_destroy_ah failed: %s", ctx->info().name.c_str(), std::strerror(errnoOf(rc)));
  }
  ah_ = nullptr;
}

std::shared_lock<std::shared_mutex> IbvAh::use(ibv_ah** out) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  *out = ah_;
  return lock;
}

}  // namespace ferry::ibverbs
