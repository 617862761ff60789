// The ibverbs provider ("ibverbs"): ferry's verbs layer over libibverbs (rdma-core), for real RDMA
// NICs (InfiniBand, RoCE, iWARP) and the kernel's soft-RoCE (rdma_rxe).
//
// Each ferry object wraps one libibverbs object and passes calls, numbers and work-completion
// statuses through unchanged; a refused call's errno becomes the Status cause. libibverbs is
// loaded with dlopen (loader.h), so ferry runs where rdma-core is missing; the provider is then
// unavailable and says why. The device does the work: there is no progress thread, and an idle
// connection costs nothing.
//
// Lifetime: every object holds its parent (context, PD) alive and enrolls with it. A call holds the
// object's lock shared while it uses the libibverbs object; close() takes it exclusively, marks the
// object closed and destroys the libibverbs object, so close() may race with calls (they then
// return kClosed) and a destroy never runs under a call in progress. libibverbs refuses to destroy
// a CQ, SRQ or completion channel that a QP or CQ still uses (EBUSY): such an object is closed for
// its users at once and destroyed when its last user goes. Closing a context closes its PDs (with
// their QPs, SRQs, MRs and AHs) before its CQs and those before its completion channels, then
// closes the device. Nothing waits without a bound: completion and async events are acknowledged
// as soon as they are read, so libibverbs' destroy calls never wait for them.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/verbs/provider.h"
#include "providers/ibverbs/loader.h"

namespace ferry::ibverbs {

class IbvContext;
class IbvPd;
class IbvMr;
class IbvCq;
class IbvCompChannel;
class IbvQp;
class IbvSrq;
class IbvAh;

// ---- devices ----
// Every device libibverbs lists: name as libibverbs names it (mlx5_0, rxe0), transport from the
// port's link layer ("InfiniBand", "RoCE", "iWARP"), the netdev of port 1 and its IPv4 address.
std::vector<verbs::DeviceInfo> listIbvDevices();
// Whether the provider works here: libibverbs loads, lists a device, and a device opens and
// creates a PD, a CQ and an RC QP. Decided once per process; *reason says why not.
bool probeIbverbs(std::string* reason);
Result<std::shared_ptr<verbs::ContextImpl>> openIbvDevice(const std::string& name);

// ---- objects ----
class IbvContext final : public verbs::ContextImpl, public std::enable_shared_from_this<IbvContext> {
 public:
  IbvContext(const Api& api, ibv_context* context, verbs::DeviceInfo info);
  ~IbvContext() override;

  const verbs::DeviceInfo& info() const override { return info_; }
  Result<verbs::DeviceAttr> queryDevice() override;
  Result<verbs::PortAttr> queryPort(uint8_t portNum) override;
  Result<verbs::Gid> queryGid(uint8_t portNum, int index) override;
  int defaultGidIndex(uint8_t portNum) override;
  Result<std::shared_ptr<verbs::PdImpl>> allocPd() override;
  Result<std::shared_ptr<verbs::CompChannelImpl>> createCompChannel() override;
  Result<std::shared_ptr<verbs::CqImpl>> createCq(int cqe, std::shared_ptr<verbs::CompChannelImpl> channel,
                                                  void* userContext) override;
  Result<verbs::AsyncEvent> getAsyncEvent(int timeoutMs) override;
  int asyncFd() const override { return asyncFd_; }
  void close() override;

  const Api& api() const { return api_; }
  ibv_context* raw() const { return context_; }
  bool closed() const { return closed_.load(); }
  // Runs a libibverbs destroy call unless the device is closed already (the kernel released every
  // object with it). Returns the call's result, 0 when it was not needed.
  template <typename Destroy>
  int destroyWhileOpen(Destroy&& destroy) {
    std::shared_lock<std::shared_mutex> lock(deviceMu_);
    return deviceOpen_ ? destroy() : 0;
  }

  // Where events name a libibverbs CQ or SRQ, the ferry identities they map to.
  void addCq(ibv_cq* cq, const std::shared_ptr<IbvCq>& owner);
  void removeCq(ibv_cq* cq);
  std::shared_ptr<IbvCq> findCq(ibv_cq* cq);
  void addSrq(ibv_srq* srq, const void* id);
  void removeSrq(ibv_srq* srq);
  // The largest inline payload a send WR may carry (found by creating QPs once per device).
  uint32_t maxInlineData();
  // The active MTU of a port in bytes, for UD sends (cached; 0 when the port cannot be queried).
  uint32_t activeMtuBytes(uint8_t portNum);
  // Why the device registers no dma-bufs ("" where it takes them).
  const std::string& dmaBufRefusal() const { return dmaBufRefusal_; }
  // The peer memory module through which ibv_reg_mr takes device pointers, where the device
  // registers no dma-bufs and the module is loaded ("" otherwise).
  const std::string& peerMemory() const { return peerMemory_; }

 private:
  Result<verbs::DeviceAttr> queryDeviceLocked();
  // How the device registers device memory: dma-bufs, else the peer memory module; sets
  // info_.deviceMemory ("dma-buf", "peer-memory" or "" with dmaBufRefusal_ saying why).
  void probeDeviceMemory();
  // An async event as verbs::AsyncEvent (a CQ error marks the CQ, which *cq then holds until the
  // event is acknowledged); false for an event type ferry has no name for.
  bool describeAsyncEvent(const ibv_async_event& event, verbs::AsyncEvent* out, std::shared_ptr<IbvCq>* cq);
  void probeDmaBuf();
  std::string gidTypeOf(uint8_t portNum, int index) const;

  const Api& api_;
  ibv_context* context_;
  verbs::DeviceInfo info_;
  std::string dmaBufRefusal_;
  std::string peerMemory_;
  int asyncFd_ = -1;
  mutable std::shared_mutex mu_;
  std::atomic<bool> closed_{false};
  verbs::ChildList children_;
  std::shared_mutex deviceMu_;
  bool deviceOpen_ = true;

  std::mutex cacheMu_;
  uint8_t portCount_ = 0;
  std::map<uint8_t, int> defaultGid_;
  std::map<uint8_t, uint32_t> mtuBytes_;
  std::map<uint8_t, int> gidTblLen_;
  int maxInline_ = -1;

  std::mutex registryMu_;
  std::unordered_map<ibv_cq*, std::weak_ptr<IbvCq>> cqs_;
  std::unordered_map<ibv_srq*, const void*> srqs_;
};

class IbvPd final : public verbs::PdImpl, public std::enable_shared_from_this<IbvPd> {
 public:
  IbvPd(std::shared_ptr<IbvContext> ctx, ibv_pd* pd) : ctx_(std::move(ctx)), pd_(pd) {}
  ~IbvPd() override;
  Result<std::shared_ptr<verbs::MrImpl>> registerMemory(void* addr, size_t length, uint32_t access) override;
  // GPUDirect RDMA: the device memory exported as a dma-buf (cuda::exportDmaBuf) and registered
  // with ibv_reg_dmabuf_mr, so the NIC reads and writes it in place. Refused, naming why, where
  // libibverbs, the device, the CUDA driver or its kernel module cannot.
  Result<std::shared_ptr<verbs::MrImpl>> registerDeviceMemory(void* addr, size_t length, uint32_t access,
                                                              MemoryLocation where) override;
  Result<std::shared_ptr<verbs::QpImpl>> createQp(const verbs::QpInitImpl& init) override;
  Result<std::shared_ptr<verbs::SrqImpl>> createSrq(const verbs::SrqInit& init) override;
  Result<std::shared_ptr<verbs::AhImpl>> createAh(const verbs::AhAttr& attr) override;
  // PDs close before the CQs their QPs use (siblings under the context).
  int closeOrder() const override { return 0; }
  void close() override;

  bool closed() const { return closed_.load(); }
  const std::shared_ptr<IbvContext>& ctx() const { return ctx_; }
  // Registers mr with this PD's children (a region re-registered into this PD).
  void adopt(const std::shared_ptr<IbvMr>& mr);
  // A new registration in this PD; the caller holds nothing of this PD's locks.
  Result<ibv_mr*> reg(void* addr, size_t length, uint32_t access);
  // The same for device memory, through a dma-buf.
  Result<ibv_mr*> regDevice(void* addr, size_t length, uint32_t access, MemoryLocation where);
  // The live address handle of this PD with that id (AddressHandle::id()), or nullptr.
  std::shared_ptr<IbvAh> findAh(const void* id);

 private:
  void destroy();

  std::shared_ptr<IbvContext> ctx_;
  ibv_pd* pd_;
  mutable std::shared_mutex mu_;
  std::atomic<bool> closed_{false};
  verbs::ChildList children_;
  std::mutex ahMu_;
  std::unordered_map<const void*, std::weak_ptr<IbvAh>> ahs_;
};

class IbvMr final : public verbs::MrImpl, public std::enable_shared_from_this<IbvMr> {
 public:
  IbvMr(std::shared_ptr<IbvPd> pd, ibv_mr* mr, void* addr, size_t length, uint32_t access,
        MemoryLocation where = {})
      : pd_(std::move(pd)), mr_(mr), addr_(addr), length_(length), access_(access), where_(where) {}
  ~IbvMr() override { close(); }
  void* addr() const override;
  size_t length() const override;
  uint32_t lkey() const override;
  uint32_t rkey() const override;
  uint32_t access() const override;
  MemoryLocation location() const override { return where_; }
  Status reregister(uint32_t flags, const std::shared_ptr<verbs::PdImpl>& pd, void* addr, size_t length,
                    uint32_t access) override;
  void close() override;

 private:
  mutable std::mutex mu_;
  std::shared_ptr<IbvPd> pd_;
  ibv_mr* mr_;  // nullptr once closed
  void* addr_;
  size_t length_;
  uint32_t access_;
  const MemoryLocation where_;  // device memory: registered through a dma-buf (GPUDirect RDMA)
};

class IbvCompChannel final : public verbs::CompChannelImpl {
 public:
  IbvCompChannel(std::shared_ptr<IbvContext> ctx, ibv_comp_channel* channel);
  ~IbvCompChannel() override;
  int fd() const override { return fd_; }
  Result<verbs::CqEvent> getEvent(int timeoutMs) override;
  // After the CQs that use it.
  int closeOrder() const override { return 2; }
  void close() override;

  bool closed() const { return closed_.load(); }
  const IbvContext* context() const { return ctx_.get(); }
  ibv_comp_channel* raw() const { return channel_; }
  // Holds the channel open while a CQ is created on it.
  std::shared_lock<std::shared_mutex> use() const { return std::shared_lock<std::shared_mutex>(mu_); }

 private:
  void tryDestroyLocked();

  std::shared_ptr<IbvContext> ctx_;
  ibv_comp_channel* channel_;
  int fd_;
  mutable std::shared_mutex mu_;
  std::atomic<bool> closed_{false};
};

class IbvCq final : public verbs::CqImpl {
 public:
  IbvCq(std::shared_ptr<IbvContext> ctx, std::shared_ptr<IbvCompChannel> channel, void* userContext)
      : ctx_(std::move(ctx)), channel_(std::move(channel)), userContext_(userContext) {}
  ~IbvCq() override;
  Result<int> poll(std::span<verbs::WorkCompletion> out) override;
  Status reqNotify(bool solicitedOnly) override;
  Status resize(int cqe) override;
  int cqe() const override;
  void* userContext() const override { return userContext_; }
  // After the PDs (and so the QPs) that use it.
  int closeOrder() const override { return 1; }
  void close() override;

  // Set once, before the CQ is shared.
  void attach(ibv_cq* cq) { cq_ = cq; }
  // Holds the CQ open while a QP is created on it.
  std::shared_lock<std::shared_mutex> use() const { return std::shared_lock<std::shared_mutex>(mu_); }
  bool closed() const { return closed_.load(); }
  const IbvContext* context() const { return ctx_.get(); }
  ibv_cq* raw() const { return cq_; }
  const void* id() const { return static_cast<const verbs::CqImpl*>(this); }
  // The device reported an overflow (IBV_EVENT_CQ_ERR): polls fail from now on.
  void markOverflowed() { overflowed_ = true; }

 private:
  void tryDestroyLocked();

  std::shared_ptr<IbvContext> ctx_;
  std::shared_ptr<IbvCompChannel> channel_;  // released once the CQ is destroyed
  void* userContext_;
  ibv_cq* cq_ = nullptr;
  mutable std::shared_mutex mu_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> overflowed_{false};
};

class IbvSrq final : public verbs::SrqImpl {
 public:
  // maxSge: what ibv_create_srq granted.
  IbvSrq(std::shared_ptr<IbvPd> pd, ibv_srq* srq, uint32_t maxSge)
      : pd_(std::move(pd)), srq_(srq), maxSge_(maxSge) {}
  ~IbvSrq() override;
  uint32_t maxSge() const override { return maxSge_; }
  Status postRecv(std::span<const verbs::RecvWr> wrs, size_t* badIndex) override;
  Status armLimit(uint32_t limit) override;
  Result<verbs::SrqInit> query() override;
  void close() override;

  bool closed() const { return closed_.load(); }
  const IbvPd* pd() const { return pd_.get(); }
  ibv_srq* raw() const { return srq_; }
  // Holds the SRQ open while a QP is created on it.
  std::shared_lock<std::shared_mutex> use() const { return std::shared_lock<std::shared_mutex>(mu_); }

 private:
  void tryDestroyLocked();

  std::shared_ptr<IbvPd> pd_;
  ibv_srq* srq_;
  const uint32_t maxSge_;
  mutable std::shared_mutex mu_;
  std::atomic<bool> closed_{false};
};

class IbvAh final : public verbs::AhImpl {
 public:
  IbvAh(std::shared_ptr<IbvPd> pd, ibv_ah* ah, verbs::AhAttr attr)
      : pd_(std::move(pd)), ah_(ah), attr_(attr) {}
  ~IbvAh() override { close(); }
  verbs::AhAttr attr() const override { return attr_; }
  void close() override;

  // The address handle to post with, held shared by the caller while it posts.
  std::shared_lock<std::shared_mutex> use(ibv_ah** out) const;

 private:
  std::shared_ptr<IbvPd> pd_;
  ibv_ah* ah_;
  verbs::AhAttr attr_;
  mutable std::shared_mutex mu_;
};

class IbvQp final : public verbs::QpImpl {
 public:
  IbvQp(std::shared_ptr<IbvPd> pd, std::shared_ptr<IbvCq> sendCq, std::shared_ptr<IbvCq> recvCq,
        std::shared_ptr<IbvSrq> srq, ibv_qp* qp, verbs::QpType type, verbs::QpCap cap);
  ~IbvQp() override { close(); }
  uint32_t qpNum() const override { return qpn_; }
  verbs::QpType type() const override { return type_; }
  Status modify(const verbs::QpAttr& attr, uint32_t mask) override;
  Result<verbs::QpAttr> query() override;
  verbs::QpCap cap() const override { return cap_; }
  Status postSend(std::span<const verbs::SendWr> wrs, size_t* badIndex) override;
  Status postRecv(std::span<const verbs::RecvWr> wrs, size_t* badIndex) override;
  Status attachMcast(const verbs::Gid& gid, uint16_t lid) override;
  Status detachMcast(const verbs::Gid& gid, uint16_t lid) override;
  void close() override;

 private:
  Status mcast(const verbs::Gid& gid, uint16_t lid, bool join);  // ibv_attach_mcast or ibv_detach_mcast
  // The address handles a post's UD requests use, each held until the post is done.
  using HeldAhs = std::vector<std::pair<std::shared_ptr<IbvAh>, std::shared_lock<std::shared_mutex>>>;
  // wr as libibverbs' request (its scatter list into sges; a UD request's handle added to held);
  // kInvalidArgument for what ferry refuses before the device sees it.
  Status translate(const verbs::SendWr& wr, ibv_send_wr* w, ibv_sge* sges, uint32_t mtu, HeldAhs* held);
  std::shared_ptr<IbvPd> pd_;
  std::shared_ptr<IbvCq> sendCq_;
  std::shared_ptr<IbvCq> recvCq_;
  std::shared_ptr<IbvSrq> srq_;
  ibv_qp* qp_;
  const uint32_t qpn_;
  const verbs::QpType type_;
  const verbs::QpCap cap_;  // what ibv_create_qp granted
  std::atomic<uint8_t> port_{1};
  // The state the last successful modify moved the QP to; the device may move it on to ERR.
  std::atomic<verbs::QpState> state_{verbs::QpState::kReset};
  mutable std::shared_mutex mu_;
  // Multicast groups attached (GID bytes, LID): detached before the QP is destroyed, which
  // libibverbs refuses (EBUSY) while any is attached.
  std::vector<std::pair<std::array<uint8_t, 16>, uint16_t>> groups_;
  std::atomic<bool> closed_{false};
};

// ---- conversions (numbers are libibverbs'; see the static_asserts in context.cc) ----
ibv_ah_attr toIbvAh(const verbs::AhAttr& attr);
// The libibverbs receive chain for wrs, in this thread's scratch storage (valid until the next call
// on the same thread); nullptr for an empty list.
ibv_recv_wr* buildRecvChain(std::span<const verbs::RecvWr> wrs);
verbs::AhAttr fromIbvAh(const ibv_ah_attr& attr);

}  // namespace ferry::ibverbs
